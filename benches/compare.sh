#!/usr/bin/env bash
# The whole speed comparison on this machine, back to back (README "Benchmarks"):
#   1. forward pass: PyTorch (benches/compare.py) vs ours (cargo bench --bench forward);
#   2. end to end: our release server under the load generator on a mixed 8–300-token corpus
#      (concurrency 32, one input per request) vs sentence-transformers `encode` on the same
#      texts (benches/compare_server.py); peak RSS of the server;
#   3. a single 16-token request on the idle server (concurrency 1), p50/p99;
#   4. the int8 option: forward and end to end with --quantization int8.
# Needs a Python with torch, transformers and sentence-transformers (PYTHON, default python3) and
# models/all-MiniLM-L6-v2 (scripts/fetch-minilm.sh models).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MODEL=models/all-MiniLM-L6-v2
mkdir -p target/compare
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -o -m1 -w 'avx512f' /proc/cpuinfo || echo 'no avx512')"

"$PYTHON" benches/compare.py "$MODEL" 2>/dev/null | tee target/compare/torch.txt
cargo bench --bench forward 2>/dev/null | tee target/compare/forward.txt
POOLSERVE_QUANTIZATION=int8 cargo bench --bench forward 2>/dev/null | tee target/compare/forward-int8.txt
cargo build --release --quiet
cargo bench --bench loadgen --no-run 2>/dev/null

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# serve LOG [FLAGS...]: starts the release server in the background ($server) and waits until ready.
serve() {
  local log=$1; shift
  ./target/release/poolserve serve "$MODEL" --host 127.0.0.1 --port "$port" "$@" > "target/compare/$log" 2>&1 &
  server=$!
  until curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; do sleep 0.2; done
}
trap 'kill $server 2>/dev/null || true' EXIT
serve server.log
loadgen() { cargo bench --bench loadgen -- --url "http://127.0.0.1:$port" --server-pid "$server" "$@" 2>/dev/null; }
loadgen --concurrency 1 --requests 300 --min-tokens 16 --max-tokens 16 | tee target/compare/single.txt
loadgen --concurrency 32 --requests 2000 --dump-corpus target/compare/corpus.json | tee target/compare/load.txt
"$PYTHON" benches/compare_server.py target/compare/corpus.json "$MODEL" 2>/dev/null | tee target/compare/st.txt
kill $server; wait $server 2>/dev/null || true

# The same corpus against the int8 server (--quantization int8).
serve server-int8.log --quantization int8
loadgen --concurrency 32 --requests 2000 | tee target/compare/load-int8.txt
python3 benches/compare_table.py target/compare "$(du -m "$MODEL/model.safetensors" | cut -f1)"
