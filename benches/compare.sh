#!/usr/bin/env bash
# Runs the PyTorch reference and our forward benchmark back to back on the same shapes, so the
# ratio is taken under the same machine conditions. Needs a Python with torch, transformers and
# sentence-transformers (PYTHON, default python3) and models/all-MiniLM-L6-v2
# (scripts/fetch-minilm.sh models).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" benches/compare.py models/all-MiniLM-L6-v2 2>/dev/null | tee target/bench-torch.txt
cargo bench --bench forward 2>/dev/null | tee target/bench-poolserve.txt
python3 - <<'PY'
import re
def rates(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s*(\d+x\d+)\s+median\s+([\d.]+) ms.*?([\d.]+) tokens/s", line)
        if m:
            out[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return out
torch, ours = rates("target/bench-torch.txt"), rates("target/bench-poolserve.txt")
for shape in ours:
    if shape in torch:
        print(f"{shape}: poolserve {ours[shape][1]:.0f} tokens/s ({ours[shape][0]:.2f} ms), "
              f"PyTorch {torch[shape][1]:.0f} tokens/s ({torch[shape][0]:.2f} ms), ratio {ours[shape][1] / torch[shape][1]:.2f}x")
PY
