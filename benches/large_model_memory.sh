#!/usr/bin/env bash
# Serves a large half-precision decoder folder and reports what it costs: load time (start to
# /health 200), peak resident memory (the kernel's VmHWM of the server process, plus the RSS
# sampled every half second), and one embedding request's time. The bar: peak RSS ≤ 1.15 ×
# the weight files + 1 GiB (a 7B model in bfloat16 must serve on a 24 GiB machine).
#
#   benches/large_model_memory.sh FOLDER [extra serve flags…]
#   e.g. python3 benches/make_large_decoder.py /tmp/mistral-7b && benches/large_model_memory.sh /tmp/mistral-7b
#
# Loopback only; stops the server it started.
set -euo pipefail
folder=$1
shift
cd "$(dirname "$0")/.."
binary=target/release/poolserve
[ -x "$binary" ] || cargo build --release --locked
port=$((20000 + RANDOM % 20000))
weights=$(du -cb "$folder"/*.safetensors | tail -1 | cut -f1)
start=$(date +%s.%N)
"$binary" serve "$folder" --port "$port" --host 127.0.0.1 "$@" >/tmp/large-model-server.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
peak_sampled=0
sample() {
    local rss
    rss=$(awk '/VmRSS/ {printf "%.0f", $2 * 1024}' "/proc/$pid/status" 2>/dev/null || echo 0)
    [ "${rss:-0}" -gt "$peak_sampled" ] && peak_sampled=$rss
    return 0
}
until curl -sf "localhost:$port/health" >/dev/null; do
    if ! kill -0 $pid 2>/dev/null; then
        echo "the server exited:"; cat /tmp/large-model-server.log; exit 1
    fi
    sample
    sleep 0.5
done
loaded=$(date +%s.%N)
body='{"input": ["Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: how much memory does a 7B model need?"]}'
request_start=$(date +%s.%N)
reply=$(curl -sf "localhost:$port/v1/embeddings" -H 'Content-Type: application/json' -d "$body")
request_end=$(date +%s.%N)
sample
hwm=$(awk '/VmHWM/ {printf "%.0f", $2 * 1024}' "/proc/$pid/status")
python3 - "$weights" "$hwm" "$peak_sampled" "$start" "$loaded" "$request_start" "$request_end" "$reply" <<'PY'
import json, math, sys
weights, hwm, sampled = (int(x) for x in sys.argv[1:4])
start, loaded, r0, r1 = (float(x) for x in sys.argv[4:8])
reply = json.loads(sys.argv[8])
vector = reply["data"][0]["embedding"]
bar = 1.15 * weights + 2**30
gib = 2**30
print(f"weights            {weights / gib:6.2f} GiB")
print(f"load time          {loaded - start:6.1f} s (to /health 200)")
print(f"peak RSS (VmHWM)   {hwm / gib:6.2f} GiB = {hwm / weights:.3f} × the weights (sampled peak {sampled / gib:.2f} GiB)")
print(f"bar                {bar / gib:6.2f} GiB (1.15 × weights + 1 GiB): {'met' if hwm <= bar else 'MISSED'}")
print(f"one request        {r1 - r0:6.1f} s, {reply['usage']['prompt_tokens']} tokens, {len(vector)} dims, finite: {all(math.isfinite(v) for v in vector)}")
PY
