#!/usr/bin/env bash
# The whole speed comparison on this machine, back to back (docs/performance.md):
#   1. forward pass: PyTorch (benches/compare.py) vs ours (cargo bench --bench forward);
#   2. end to end: our release server under the load generator on a mixed 8–300-token corpus
#      (concurrency 32, one input per request) vs sentence-transformers `encode` on the same
#      texts (benches/compare_server.py); peak RSS of the server;
#   3. a single 16-token request on the idle server (concurrency 1), p50/p99 (float32 and int8);
#   4. the int8 option: forward and end to end with --quantization int8;
#   5. ONNX Runtime (benches/compare_ort.py), float32 optimized graph and int8 dynamic
#      quantization: the forward pass (in the rounds of step 1) and the end-to-end pipeline on
#      the same corpus;
#   6. base size: a random-weight BERT-base (benches/make_base_model.py, made once into
#      target/compare/bert-base-random), forward pass of PyTorch, ours (float32, int8) and ORT;
#   7. every CPU engine on one 512-text corpus in ENGINE_ROUNDS (default 5) interleaved rounds
#      (benches/compare_engines.py): sentence-transformers, ORT f32/int8, OpenVINO f32 hint /
#      default / NNCF int8, and our servers in float32, bfloat16, int8 and int8 + bfloat16, into
#      target/compare/engines.txt (skipped, with a note, when PYTHON has no openvino and nncf).
# REPEAT=N (default 1) runs the forward comparisons of steps 1 and 6 round-robin N times
# (PyTorch, ours f32, ours int8, ORT, PyTorch, ...), appending to the same files; the table takes
# the median per shape, which evens out the drift of a shared machine.
# Needs a Python with torch, transformers, sentence-transformers, onnx and onnxruntime (PYTHON,
# default python3) and models/all-MiniLM-L6-v2 (scripts/fetch-minilm.sh models). Outputs:
# target/compare/*.txt (the *-base*.txt files are the base-size model's), ORT's log in ort.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-1}
MODEL=models/all-MiniLM-L6-v2
BASE=target/compare/bert-base-random
OUT=target/compare
mkdir -p "$OUT"
: > "$OUT/ort.log"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -o -m1 -w 'avx512f' /proc/cpuinfo || echo 'no avx512')"

# forward_rounds DIR SUFFIX: the forward benchmarks of the model in DIR, REPEAT rounds of PyTorch,
# ours float32, ours int8, ORT (float32 and int8), appended to $OUT/torchSUFFIX.txt,
# forwardSUFFIX.txt, forwardSUFFIX-int8.txt and ortSUFFIX.txt (emptied first).
ort_failed() { echo "benches/compare_ort.py failed: see $OUT/ort.log" >&2; exit 1; }
forward_rounds() {
  local dir=$1 suffix=$2 round
  local torch="$OUT/torch$suffix.txt" ours="$OUT/forward$suffix.txt" int8="$OUT/forward$suffix-int8.txt" ort="$OUT/ort$suffix.txt"
  : > "$torch"; : > "$ours"; : > "$int8"; : > "$ort"
  for ((round = 1; round <= REPEAT; round++)); do
    if [ "$REPEAT" -gt 1 ]; then echo "== forward round $round of $REPEAT: $dir"; fi
    "$PYTHON" benches/compare.py "$dir" 2>/dev/null | tee -a "$torch"
    POOLSERVE_MINILM="$dir" cargo bench --bench forward 2>/dev/null | tee -a "$ours"
    POOLSERVE_MINILM="$dir" POOLSERVE_QUANTIZATION=int8 cargo bench --bench forward 2>/dev/null | tee -a "$int8"
    "$PYTHON" benches/compare_ort.py "$dir" 2>>"$OUT/ort.log" | tee -a "$ort" || ort_failed
  done
}

forward_rounds "$MODEL" ""
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
# ORT's pipeline (tokenize, sort, batches of 32, mean pooling, normalization) on the same texts.
"$PYTHON" benches/compare_ort.py "$MODEL" --corpus target/compare/corpus.json --no-forward 2>>"$OUT/ort.log" | tee target/compare/ort-e2e.txt || ort_failed

# The same corpus against the int8 server (--quantization int8).
serve server-int8.log --quantization int8
loadgen --concurrency 1 --requests 300 --min-tokens 16 --max-tokens 16 | tee target/compare/single-int8.txt
loadgen --concurrency 32 --requests 2000 | tee target/compare/load-int8.txt
kill $server; wait $server 2>/dev/null || true

# Every engine on one corpus, interleaved: our four precisions as four servers.
if "$PYTHON" -c 'import openvino, nncf' 2>/dev/null; then
  engine_servers=()
  for flags in "f32:" "bf16:--dtype bfloat16" "int8:--quantization int8" "int8-bf16:--quantization int8 --dtype bfloat16"; do
    engine_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # shellcheck disable=SC2086 # the flags are words
    ./target/release/poolserve serve "$MODEL" --host 127.0.0.1 --port "$engine_port" ${flags#*:} > "$OUT/server-${flags%%:*}.log" 2>&1 &
    engine_servers+=("--ours" "${flags%%:*}=http://127.0.0.1:$engine_port")
    server=$!
    until curl -fs "http://127.0.0.1:$engine_port/health" >/dev/null 2>&1; do sleep 0.2; done
    trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  done
  "$PYTHON" benches/compare_engines.py "$MODEL" --rounds "${ENGINE_ROUNDS:-5}" "${engine_servers[@]}" 2>>"$OUT/engines.log" | tee "$OUT/engines.txt"
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
else
  echo "NOTE: $PYTHON has no openvino/nncf: step 7 (every engine on one corpus) SKIPPED" >&2
fi

# Base size: BERT-base shapes (random weights; speed does not depend on them).
[ -f "$BASE/model.safetensors" ] || "$PYTHON" benches/make_base_model.py "$BASE" "$MODEL"
forward_rounds "$BASE" "-base"
python3 benches/compare_table.py target/compare "$(du -m "$MODEL/model.safetensors" | cut -f1)"
