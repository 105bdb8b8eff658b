#!/usr/bin/env bash
# Several models in one server, measured: three real models in one release server (all-MiniLM-L6-v2, rampart-ner,
# splade-tiny); single 16-token embedding latency on MiniLM with the server idle and while
# rampart-ner is flooded (32 concurrent /pooling requests of 8 texts); peak RSS against the sum
# of the weight files. Needs models/ (scripts/fetch-minilm.sh, scripts/fetch-models.sh), the
# release binary and the load generator:
#   cargo build --release && cargo bench --bench loadgen --no-run
#   benches/multi_model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${POOLSERVE_BIN:-target/release/poolserve}
loadgen=${LOADGEN:-$(ls -t target/release/deps/loadgen-* target-bench/release/deps/loadgen-* 2>/dev/null | grep -v '\.d$' | head -1)}
port=${PORT:-18931}
config=$(mktemp --suffix .yaml)
cat > "$config" <<YAML
models:
  - name: minilm
    model: models/all-MiniLM-L6-v2
  - name: ner
    model: models/rampart-ner
  - name: splade
    model: models/splade-tiny
    pooler_config: {pooling_type: SPLADE}
YAML
"$bin" serve --config "$config" --host 127.0.0.1 --port "$port" > target/multi-model-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$config"' EXIT
for _ in $(seq 1 600); do curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break; sleep 0.2; done
url="http://127.0.0.1:$port"
weights=$(( $(stat -c %s models/all-MiniLM-L6-v2/model.safetensors) + $(stat -c %s models/rampart-ner/model.safetensors) + $(stat -c %s models/splade-tiny/model.safetensors) ))
rss() { awk '/VmRSS|VmHWM/ {printf "%s %.0f MiB  ", $1, $2/1024}' "/proc/$server/status"; }
echo "weights (safetensors, f32): $(( weights / 1048576 )) MiB; after loading: $(rss)"
single() { "$loadgen" --url "$url" --model minilm --concurrency 1 --requests 200 --batch 1 --min-tokens 16 --max-tokens 16 | grep -E 'latency|seq'; }
for round in 1 2 3; do
  echo "== round $round: minilm idle"
  single
  echo "== round $round: minilm while ner is flooded"
  "$loadgen" --url "$url" --model ner --path /pooling --concurrency 32 --requests 100000 --batch 8 --min-tokens 8 --max-tokens 300 > target/multi-model-flood.log 2>&1 &
  flood=$!
  sleep 3
  single
  kill $flood 2>/dev/null || true
  wait $flood 2>/dev/null || true
  sleep 1
done
echo "peak: $(rss)"
