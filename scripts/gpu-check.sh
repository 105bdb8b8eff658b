#!/usr/bin/env bash
# The GPU check, run on the GPU machine from the repository root:
#
#   scripts/gpu-bundle.sh                 # here (CPU machine): builds target/gpu-bundle/ (~40 MB)
#   scripts/gpu-check.sh                  # there, with target/gpu-bundle carried
#   DEVICE=cpu scripts/gpu-check.sh       # dry run on a CPU machine (CPU binary, small runs)
#   PARITY_ONLY=1 ...                     # step 1 only (the test command's dry run does this)
#
# 1. Parity: every fixture model in tests/fixtures through the real server (`--device cuda`),
#    float32 and float16, against the committed reference outputs (scripts/gpu_check.py parity):
#    float32 cosine >= 0.9999 and scores <= 1e-4; float16 cosine >= 0.999 and scores <= 1e-2. A
#    server whose CUDA kernels failed their load-time self-check counts as a failure.
# 2. Speed (float16 on CUDA): a MiniLM-sized and a BERT-base-sized random-weight model made here with transformers
#    (benches/make_base_model.py); our server (float16, --max-batch-tokens default 16384) under
#    our load generator (64 concurrent 1-input requests, and 8 concurrent 32-input requests of the
#    same texts) vs sentence-transformers `encode` in float16 on the same
#    GPU and the same corpus (batch 32, its default, and 256), plus single-request latency
#    (16 tokens, concurrency 1).
# 3. One table (also written to target/gpu-check/table.md), and exit 1 if parity failed.
#
# Needs: python3 with torch, transformers, sentence-transformers (the GPU machine has them) and,
# for CUDA, the CUDA 13 runtime libraries in its site-packages (nvidia/cu13/lib: cuBLAS, cuRAND).
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
BUNDLE=${BUNDLE:-target/gpu-bundle}
OUT=target/gpu-check
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  BIN=${POOLSERVE_BIN:-$BUNDLE/poolserve}
  SPEED_DTYPE=float16
  REQUESTS=${REQUESTS:-4000} CONCURRENCY=${CONCURRENCY:-64} SINGLE=${SINGLE:-500}
  # cuBLAS and cuRAND from PyTorch's CUDA 13 wheels; the driver (libcuda.so.1) from the system.
  lib=$("$PYTHON" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
else
  # Dry run: the CPU binary (parity in both dtypes through candle's composite ops for float16),
  # the speed part in float32 (half precision on a CPU measures nothing) with few requests.
  BIN=${POOLSERVE_BIN:-target/release/poolserve}
  SPEED_DTYPE=float32
  REQUESTS=${REQUESTS:-200} CONCURRENCY=${CONCURRENCY:-8} SINGLE=${SINGLE:-50}
  echo "DRY RUN on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs): numbers below are CPU numbers" | tee "$OUT/device.txt"
fi
LOADGEN=${LOADGEN_BIN:-$BUNDLE/loadgen}
TOKENIZER=${TOKENIZER_DIR:-$BUNDLE/tokenizer}
needed=("$BIN")
[ -n "${PARITY_ONLY:-}" ] || needed+=("$LOADGEN" "$TOKENIZER/tokenizer.json")
for f in "${needed[@]}"; do
  [ -e "$f" ] || { echo "gpu-check: $f is missing (run scripts/gpu-bundle.sh, or set POOLSERVE_BIN / LOADGEN_BIN / TOKENIZER_DIR)" >&2; exit 1; }
done

# 1. Parity.
parity_ok=1
for dtype in float32 float16; do
  "$PYTHON" scripts/gpu_check.py parity "$BIN" "$DEVICE" "$dtype" | tee "$OUT/parity-$dtype.txt" || parity_ok=0
done
if [ -n "${PARITY_ONLY:-}" ]; then
  [ "$parity_ok" = 1 ] || { echo "gpu-check: parity FAILED" >&2; exit 1; }
  exit 0
fi

# 2. Speed.
port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
server=""
trap '[ -n "$server" ] && kill $server 2>/dev/null || true' EXIT
for size in minilm base; do
  model="$OUT/$size-random"
  [ -f "$model/model.safetensors" ] || "$PYTHON" benches/make_base_model.py "$model" "$TOKENIZER" "$size" > /dev/null 2>&1
  "$BIN" serve "$model" --host 127.0.0.1 --port "$port" --device "$DEVICE" --dtype "$SPEED_DTYPE" > "$OUT/server-$size.log" 2>&1 &
  server=$!
  until curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1; do
    kill -0 $server 2>/dev/null || { cat "$OUT/server-$size.log" >&2; exit 1; }
    sleep 0.2
  done
  if grep -q "self-check failed" "$OUT/server-$size.log"; then parity_ok=0; grep "self-check failed" "$OUT/server-$size.log"; fi
  lg() { "$LOADGEN" --url "http://127.0.0.1:$port" --server-pid "$server" "$@"; }
  lg --concurrency 1 --requests 50 --min-tokens 16 --max-tokens 16 > /dev/null  # warm-up
  lg --concurrency 1 --requests "$SINGLE" --min-tokens 16 --max-tokens 16 | tee "$OUT/single-$size.txt"
  lg --concurrency "$CONCURRENCY" --requests "$REQUESTS" --dump-corpus "$OUT/corpus-$size.json" | tee "$OUT/load-$size.txt"
  # The same texts as 32-input requests (how ingestion pipelines call an embedding server).
  lg --concurrency 8 --requests $((REQUESTS / 32)) --batch 32 | tee "$OUT/load32-$size.txt"
  kill $server; wait $server 2>/dev/null || true; server=""
  for batch in 32 256; do
    ST_BATCH=$batch "$PYTHON" scripts/gpu_check.py st "$OUT/corpus-$size.json" "$model" "$DEVICE" "$SPEED_DTYPE" 2> "$OUT/st-$size-$batch.log" | tee "$OUT/st-$size-$batch.txt"
  done
done

# 3. The table.
"$PYTHON" - "$OUT" "$SPEED_DTYPE" "$CONCURRENCY" <<'EOF' | tee "$OUT/table.md"
import re, sys
out, dtype, concurrency = sys.argv[1:4]
def grab(path, pattern):
    m = re.search(pattern, open(path).read())
    return float(m.group(1)) if m else float("nan")
device = open(f"{out}/device.txt").read().strip()
print(f"GPU check on {device}; speed in {dtype}\n")
print(f"| model | poolserve seq/s: {concurrency} × 1 input / 8 × 32 inputs | ST encode seq/s: batch 32 / 256 | best to best | single 16-token request p50 |")
print("|---|---|---|---|---|")
for size, label in [("minilm", "MiniLM-L6 shape (22M)"), ("base", "BERT-base shape (110M)")]:
    ours = [grab(f"{out}/{kind}-{size}.txt", r"throughput ([\d.]+) sequences/s") for kind in ("load", "load32")]
    st = [grab(f"{out}/st-{size}-{b}.txt", r"throughput ([\d.]+) sequences/s") for b in (32, 256)]
    p50 = grab(f"{out}/single-{size}.txt", r"latency p50 ([\d.]+) ms")
    print(f"| {label} | {ours[0]:.0f} / {ours[1]:.0f} | {st[0]:.0f} / {st[1]:.0f} | {max(ours) / max(st):.2f}× | {p50:.2f} ms |")
for dtype_file in ["parity-float32.txt", "parity-float16.txt"]:
    for line in open(f"{out}/{dtype_file}"):
        if line.startswith("parity"):
            print(f"\n{line.strip()}")
EOF
[ "$parity_ok" = 1 ] || { echo "gpu-check: parity FAILED (see above)" >&2; exit 1; }
