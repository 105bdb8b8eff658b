#!/usr/bin/env bash
# Soak run: five models in one server (an embedder, a cross-encoder, a token
# classifier, a multi-vector model for token_embed, an image model) under benches/soak.py's mixed load for MINUTES (default 30),
# loopback only; stops by itself. RSS every 10 s, p50/p99 per route per minute, statuses, and
# target/soak/soak.png. Fails (exit 1) when RSS grows more than 10 % after the warm-up (5 min,
# or half of a run under 15 minutes), on any 5xx or unexpected status, and with CHECK_P99=1 when a
# minute's p99 passes 1.5x the first minute's.
#
#   benches/soak.sh [MINUTES | SECONDSs]   # 30 (default), or e.g. 60s; POOLSERVE_BIN (default
#                                          # target/release/poolserve), PYTHON
#
# Models: models/all-MiniLM-L6-v2 (scripts/fetch-minilm.sh), models/rampart-ner
# (scripts/fetch-models.sh; else the bert-tokcls fixture), and the bert-reranker, bert-colbert
# and clip-tiny fixtures. The test command runs a 60-second version on its release binary.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-30}
case "$duration" in
  *s) seconds=${duration%s} ;;
  *) seconds=$((duration * 60)) ;;
esac
[ "$seconds" -gt 0 ] 2> /dev/null || { echo "soak: the duration is minutes or seconds with an s (60s), not '$duration'" >&2; exit 2; }
bin=${POOLSERVE_BIN:-target/release/poolserve}
python=${PYTHON:-python3}
out=${SOAK_OUT:-target/soak}
embedder=${SOAK_EMBEDDER:-models/all-MiniLM-L6-v2}
tagger=models/rampart-ner
[ -d "$tagger" ] || { echo "soak: $tagger missing: the bert-tokcls fixture tags instead" >&2; tagger=tests/fixtures/models/bert-tokcls; }
[ -d "$embedder" ] || { echo "soak: $embedder missing (scripts/fetch-minilm.sh models)" >&2; exit 2; }
warmup=$(( seconds >= 900 ? 300 : seconds / 2 ))
mkdir -p "$out"
config="$out/models.yaml"
cat > "$config" <<YAML
models:
  - name: embedder
    model: $embedder
  - name: reranker
    model: tests/fixtures/models/bert-reranker
  - name: tagger
    model: $tagger
  - name: tokens
    model: tests/fixtures/models/bert-colbert
  - name: images
    model: tests/fixtures/models/clip-tiny
YAML
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --config "$config" --host 127.0.0.1 --port "$port" --max-concurrent-requests 16 > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { cat "$out/server.log"; exit 1; }
  sleep 0.2
done
check_p99=()
[ "${CHECK_P99:-0}" = 1 ] && check_p99=(--check-p99)
"$python" benches/soak.py --url "http://127.0.0.1:$port" --pid $server --seconds $seconds --warmup $warmup --out "$out" "${check_p99[@]}"
