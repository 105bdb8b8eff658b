#!/usr/bin/env bash
# The GPU check, run on the GPU machine from the repository root:
#
#   scripts/gpu-bundle.sh                 # here (CPU machine): builds target/gpu-bundle/ (~40 MB)
#   scripts/gpu-check.sh                  # there, with target/gpu-bundle carried
#   DEVICE=cpu scripts/gpu-check.sh       # dry run on a CPU machine (CPU binary, small runs)
#   PARITY_ONLY=1 ...                     # step 1 only (the test command's dry run does this)
#   SIZES="minilm base" DTYPES=float32 ...  # fewer speed shapes / parity dtypes
#
# 1. Parity: every fixture model in tests/fixtures through the real server (`--device cuda`),
#    in float32, float16 and bfloat16 (the dry run: float32 and float16), against the committed reference outputs
#    (scripts/gpu_check.py parity, PARITY_JOBS servers at once): float32 cosine >= 0.9999 and
#    scores <= 1e-4; half precision cosine >= 0.999 and scores <= 1e-2 (the reward fixtures in
#    bfloat16: <= 8e-2, three times transformers' own bfloat16 distance). A server whose CUDA
#    kernels failed their load-time self-check counts as a failure.
#    Then transformers' own float16/bfloat16 distance from float32 on the reward fixtures
#    (gpu_check.py torch-half), the fair bar for ours on raw logits.
# 2. Speed (float16 on CUDA): a MiniLM-sized, a BERT-base-sized and a Qwen3-0.6B-sized
#    random-weight model made here with transformers (benches/make_base_model.py); our server
#    (float16, --max-batch-tokens default 16384) under our load generator (64 concurrent 1-input
#    requests, and 8 concurrent 32-input requests of the same texts) vs sentence-transformers
#    `encode` in float16 on the same GPU and the same corpus (batch 32, its default, and 256),
#    plus single-request latency (16 tokens, concurrency 1); the server's /metrics after load.
# 3. Memory: peak device memory at --max-batch-tokens 16384 and 65536 under full batches of
#    512-token inputs, and oversized requests (too many inputs, too long an input, 1024 full
#    inputs at once) answered without the server dying (scripts/gpu_check.py memory).
# 4. One table (scripts/gpu_check.py table, also written to target/gpu-check/table.md).
#    Exit 1 if parity failed or the server died.
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
  PARITY_JOBS=${PARITY_JOBS:-8} MEMORY_TOKENS=${MEMORY_TOKENS:-16384 65536}
  DTYPES=${DTYPES:-float32 float16 bfloat16}
  # cuBLAS and cuRAND from PyTorch's CUDA 13 wheels; the driver (libcuda.so.1) from the system.
  lib=$("$PYTHON" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
else
  # Dry run: the CPU binary (parity in every dtype through candle's composite ops for half
  # precision), the speed part in float32 (half precision on a CPU measures nothing), few requests.
  BIN=${POOLSERVE_BIN:-target/release/poolserve}
  SPEED_DTYPE=float32
  REQUESTS=${REQUESTS:-200} CONCURRENCY=${CONCURRENCY:-8} SINGLE=${SINGLE:-50}
  PARITY_JOBS=${PARITY_JOBS:-1} MEMORY_TOKENS=${MEMORY_TOKENS:-2048}
  # The dry run checks the script and the binary: two dtypes are enough, and keep the test
  # command short (DTYPES=bfloat16 runs the third).
  DTYPES=${DTYPES:-float32 float16}
  echo "DRY RUN on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs): numbers below are CPU numbers" | tee "$OUT/device.txt"
fi
export PARITY_JOBS
SIZES=${SIZES:-minilm base qwen3}
LOADGEN=${LOADGEN_BIN:-$BUNDLE/loadgen}
TOKENIZER=${TOKENIZER_DIR:-$BUNDLE/tokenizer}
needed=("$BIN")
[ -n "${PARITY_ONLY:-}" ] || needed+=("$LOADGEN" "$TOKENIZER/tokenizer.json")
for f in "${needed[@]}"; do
  [ -e "$f" ] || { echo "gpu-check: $f is missing (run scripts/gpu-bundle.sh, or set POOLSERVE_BIN / LOADGEN_BIN / TOKENIZER_DIR)" >&2; exit 1; }
done

# 1. Parity.
parity_ok=1
for dtype in $DTYPES; do
  "$PYTHON" scripts/gpu_check.py parity "$BIN" "$DEVICE" "$dtype" | tee "$OUT/parity-$dtype.txt" || parity_ok=0
done
if [ -n "${PARITY_ONLY:-}" ]; then
  [ "$parity_ok" = 1 ] || { echo "gpu-check: parity FAILED" >&2; exit 1; }
  exit 0
fi
# transformers' own half precision on the reward fixtures (raw logits): the fair bar for ours.
"$PYTHON" scripts/gpu_check.py torch-half "$DEVICE" | tee "$OUT/torch-half.txt" || true

# 2. Speed.
port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
server=""
trap '[ -n "$server" ] && kill $server 2>/dev/null || true' EXIT
for size in $SIZES; do
  model="$OUT/$size-random"
  if [ ! -f "$model/model.safetensors" ]; then
    "$PYTHON" benches/make_base_model.py "$model" "$TOKENIZER" "$size" > "$OUT/make-$size.log" 2>&1 ||
      { cat "$OUT/make-$size.log" >&2; exit 1; }
  fi
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
  curl -fs "http://127.0.0.1:$port/metrics" > "$OUT/metrics-$size.txt" || true
  kill $server; wait $server 2>/dev/null || true; server=""
  for batch in 32 256; do
    ST_BATCH=$batch "$PYTHON" scripts/gpu_check.py st "$OUT/corpus-$size.json" "$model" "$DEVICE" "$SPEED_DTYPE" 2> "$OUT/st-$size-$batch.log" | tee "$OUT/st-$size-$batch.txt"
  done
done

# 3. Memory, and oversized requests (the BERT-base and Qwen3 shapes).
memory_ok=1
for size in $SIZES; do
  [ "$size" = minilm ] && continue
  for tokens in $MEMORY_TOKENS; do
    "$PYTHON" scripts/gpu_check.py memory "$BIN" "$OUT/$size-random" "$DEVICE" "$SPEED_DTYPE" "$tokens" | tee "$OUT/memory-$size-$tokens.txt" || memory_ok=0
  done
done

# 4. The table.
"$PYTHON" scripts/gpu_check.py table "$OUT" "$SPEED_DTYPE" "$CONCURRENCY" "$SIZES" | tee "$OUT/table.md"
[ "$parity_ok" = 1 ] || { echo "gpu-check: parity FAILED (see above)" >&2; exit 1; }
[ "$memory_ok" = 1 ] || { echo "gpu-check: the server died under an oversized request (see above)" >&2; exit 1; }
