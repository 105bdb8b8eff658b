#!/usr/bin/env bash
# check-cors-browser.sh POOLSERVE_BINARY MODEL
#
# CORS as a browser enforces it, in headless Chromium: a page served from one origin calls
# poolserve's /v1/embeddings with `fetch`, a JSON body and an `Authorization` header (so the
# browser sends a preflight first), poolserve started with `--allowed-origins` naming that origin
# and `--api-key`. The same page from a second origin, not allowed, must be blocked by the
# browser. Fails unless the allowed page gets the vector and the other gets a network error.
# Installs Debian's chromium when it is missing (root only). Everything runs on 127.0.0.1.
set -euo pipefail
BIN=${1:?usage: check-cors-browser.sh POOLSERVE_BINARY MODEL}
MODEL=${2:?usage: check-cors-browser.sh POOLSERVE_BINARY MODEL}
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
api_port=$(free_port)
allowed_port=$(free_port)
other_port=$(free_port)
while [ "$other_port" = "$allowed_port" ]; do other_port=$(free_port); done

# The page: one cross-origin call; the outcome is written into the DOM for --dump-dom.
cat > "$work/index.html" <<EOF
<!doctype html><html><body><pre id="result">pending</pre><script>
fetch("http://127.0.0.1:$api_port/v1/embeddings", {
  method: "POST",
  headers: { "Content-Type": "application/json", "Authorization": "Bearer browser-key" },
  body: JSON.stringify({ input: "CORS from a real browser", model: "cors-model" }),
})
  .then((r) => r.json().then((j) => ({ status: r.status, j })))
  .then(({ status, j }) => { document.getElementById("result").textContent = "status " + status + " dimensions " + j.data[0].embedding.length; })
  .catch((e) => { document.getElementById("result").textContent = "blocked " + e.name; });
</script></body></html>
EOF
python3 -m http.server "$allowed_port" --bind 127.0.0.1 --directory "$work" > "$work/allowed.log" 2>&1 &
pids+=($!)
python3 -m http.server "$other_port" --bind 127.0.0.1 --directory "$work" > "$work/other.log" 2>&1 &
pids+=($!)
"$BIN" serve "$MODEL" --served-model-name cors-model --host 127.0.0.1 --port "$api_port" \
  --api-key browser-key --allowed-origins "http://127.0.0.1:$allowed_port" > "$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$api_port/health" >/dev/null 2>&1 && curl -fs "http://127.0.0.1:$allowed_port/" >/dev/null 2>&1 \
    && curl -fs "http://127.0.0.1:$other_port/" >/dev/null 2>&1 && break
  kill -0 "${pids[2]}" 2>/dev/null || { cat "$work/server.log"; exit 1; }
  sleep 0.2
done

render() {
  local profile
  profile=$(mktemp -d -p "$work")
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --virtual-time-budget=10000 \
    --dump-dom "$1" 2>/dev/null | sed -n 's:.*<pre id="result">\([^<]*\)</pre>.*:\1:p'
}
allowed=$(render "http://127.0.0.1:$allowed_port/index.html")
other=$(render "http://127.0.0.1:$other_port/index.html")
echo "CORS in Chromium: page from the allowed origin: ${allowed:-nothing}; from another origin: ${other:-nothing}"
dimensions=$(curl -fs "http://127.0.0.1:$api_port/v1/embeddings" -H 'Authorization: Bearer browser-key' \
  -H 'Content-Type: application/json' -d '{"input": "x"}' | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["data"][0]["embedding"]))')
[ "$allowed" = "status 200 dimensions $dimensions" ] || { echo "the allowed origin's page did not get the vector" >&2; exit 1; }
[ "$other" = "blocked TypeError" ] || { echo "the browser did not block the origin that is not allowed" >&2; exit 1; }
# The allowed call could only be sent after a preflight that poolserve answered without the key
# (browsers send none with OPTIONS): `Authorization` is not a CORS-safelisted header.
echo "CORS in Chromium: ok"
