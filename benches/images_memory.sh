#!/usr/bin/env bash
# Peak memory of one request of N images (default 1,024): the server's VmHWM after
# the request against its RSS before it, on a CLIP with 224×224 crops
# (benches/make_clip_224.py DIR, which also writes DIR/bench.jpg, a 640×480 JPEG).
#
#   benches/images_memory.sh DIR [N]      # POOLSERVE_BIN (default target/release/poolserve)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1
count=${2:-1024}
bin=${POOLSERVE_BIN:-target/release/poolserve}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$bin" serve "$dir" --served-model-name clip --host 127.0.0.1 --port "$port" --payload-limit 400000000 --max-client-batch-size "$count" > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break; sleep 0.2; done
python3 - "$port" "$dir/bench.jpg" "$count" "$server" <<'PY'
import base64, http.client, json, sys, time
port, image, count, pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
def status(field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
url = "data:image/jpeg;base64," + base64.b64encode(open(image, "rb").read()).decode()
body = json.dumps({"model": "clip", "images": [url] * count, "input_type": "image", "embedding_types": ["float"]})
before = status("VmRSS:")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
started = time.time()
conn.request("POST", "/v2/embed", body, {"content-type": "application/json"})
reply = conn.getresponse()
data = json.loads(reply.read())
elapsed = time.time() - started
assert reply.status == 200, data
assert len(data["embeddings"]["float"]) == count
peak = status("VmHWM:")
print(f"{count} images ({len(body) / 1e6:.0f} MB body): RSS before {before:.0f} MiB, peak {peak:.0f} MiB, "
      f"peak growth {peak - before:.0f} MiB, {elapsed:.1f} s")
PY
