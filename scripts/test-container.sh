#!/usr/bin/env bash
# Builds the CPU image from the unchanged Dockerfile and runs it the way docs/deployment.md's `docker run`
# line does, without a Docker engine or registry access (../shared/docs/containers.md):
#
# 1. installs buildah, podman and debootstrap (Debian packages) if missing;
# 2. makes the two base images the Dockerfile names from Debian's mirror, imported under their
#    public tags: debian:bookworm-slim (debootstrap minbase) and rust:1-bookworm (the same plus
#    build-essential, with this machine's Rust toolchain copied in);
# 3. `buildah bud` the Dockerfile, with the host's cargo registry mounted so crates are not
#    downloaded twice, and a persistent target folder (target/container) so a second run only
#    rebuilds what changed; reports the image size. With POOLSERVE_PREBUILT=BINARY (the test
#    command sets it to the release binary it built and ran its end-to-end checks on), the
#    builder stage copies that binary instead of compiling the project a second time: same
#    Debian release, same toolchain (the stand-in rust:1-bookworm is made from this machine's).
#    Then every source file the binary was compiled from (its dep-info, BINARY.d) must be one
#    the Dockerfile's COPY lines bring in, so that the builder stage would compile it too;
# 4. runs the image with models/all-MiniLM-L6-v2 mounted at /models, waits for /health, checks an
#    embedding against the sentence-transformers reference, checks the server runs as uid 10001
#    and has no compiler in its image, then SIGTERMs it and expects exit status 0.
#
#   scripts/test-container.sh                 # steps 1-4
#   scripts/test-container.sh --base-images   # steps 1-2 (the test command starts them early)
#
# Needs root (buildah with chroot isolation) and models/all-MiniLM-L6-v2 (scripts/fetch-minilm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
IMAGE=localhost/poolserve:test
WORK=${POOLSERVE_CONTAINER_WORK:-/var/tmp/poolserve-container}
mkdir -p "$WORK" target/container

if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman debootstrap >/dev/null
fi
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

image_exists() { buildah images --quiet "$1" >/dev/null 2>&1; }

if ! image_exists docker.io/library/debian:bookworm-slim; then
  echo "container: making debian:bookworm-slim with debootstrap"
  rm -rf "$WORK/base" && debootstrap --variant=minbase bookworm "$WORK/base" "$mirror" >/dev/null
  tar -C "$WORK/base" -c . | podman import - docker.io/library/debian:bookworm-slim >/dev/null
fi
if ! image_exists docker.io/library/rust:1-bookworm; then
  echo "container: making rust:1-bookworm (debootstrap + build-essential + this machine's toolchain)"
  rm -rf "$WORK/rust" && debootstrap --variant=minbase --include=build-essential,pkg-config,ca-certificates bookworm "$WORK/rust" "$mirror" >/dev/null
  toolchain=$(rustc --print sysroot)
  mkdir -p "$WORK/rust/usr/local/rustup/toolchains" "$WORK/rust/usr/local/cargo/bin"
  name=$(basename "$toolchain")
  # The toolchain without its documentation and sources (about a third of its size).
  mkdir -p "$WORK/rust/usr/local/rustup/toolchains/$name"
  tar -C "$toolchain" --exclude=./share/doc --exclude=./lib/rustlib/src -c . | tar -C "$WORK/rust/usr/local/rustup/toolchains/$name" -x
  for tool in cargo rustc rustdoc; do ln -sf "/usr/local/rustup/toolchains/$name/bin/$tool" "$WORK/rust/usr/local/cargo/bin/$tool"; done
  tar -C "$WORK/rust" -c . | podman import \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' \
    - docker.io/library/rust:1-bookworm >/dev/null
fi
base_ready=$(date +%s)
[ "${1:-}" = --base-images ] && { echo "container: base images ready in $((base_ready - started)) s"; exit 0; }

prebuilt=()
if [ -n "${POOLSERVE_PREBUILT:-}" ]; then
  python3 scripts/dockerfile_copies.py "$POOLSERVE_PREBUILT.d" Dockerfile
  prebuilt=(-v "$(dirname "$(realpath "$POOLSERVE_PREBUILT")"):/prebuilt:ro" --build-arg "POOLSERVE_PREBUILT=/prebuilt/$(basename "$POOLSERVE_PREBUILT")")
fi
# pip inside the build trusts what this machine trusts (a TLS-intercepting proxy's CA, say):
# pip's own setting, else the system's bundle.
pip_cert=()
host_cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
host_cert=${host_cert:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
if [ -f "$host_cert" ]; then
  pip_cert=(-v "$host_cert:/etc/pip-ca.crt:ro" --build-arg PIP_CERT=/etc/pip-ca.crt)
fi
echo "container: building $IMAGE from Dockerfile${POOLSERVE_PREBUILT:+ around $POOLSERVE_PREBUILT}"
buildah bud --isolation chroot --pull=never --layers=false -q "${prebuilt[@]}" "${pip_cert[@]}" \
  -v "${CARGO_HOME:-$HOME/.cargo}/registry:/usr/local/cargo/registry" \
  -v "$PWD/target/container:/src/target" \
  -t "$IMAGE" -f Dockerfile . >/dev/null
built=$(date +%s)
if [ -n "${POOLSERVE_PREBUILT:-}" ]; then
  ctr_check=$(buildah from --pull=never "$IMAGE")
  [ "$(buildah run --isolation chroot "$ctr_check" -- sha256sum /usr/local/bin/poolserve | cut -d' ' -f1)" = "$(sha256sum "$POOLSERVE_PREBUILT" | cut -d' ' -f1)" ] \
    || { echo "container: the image's binary is not $POOLSERVE_PREBUILT" >&2; exit 1; }
  buildah rm "$ctr_check" >/dev/null
fi
size=$(buildah images --format '{{.Size}}' "$IMAGE" | head -1)
echo "container: image $IMAGE is $size"

ctr=$(buildah from --pull=never "$IMAGE")
cleanup() { [ -n "${server:-}" ] && kill "$server" 2>/dev/null; buildah rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
# The final stage must not carry a build toolchain.
for tool in cargo rustc gcc cc; do
  if buildah run --isolation chroot "$ctr" -- sh -c "command -v $tool" >/dev/null 2>&1; then
    echo "container: $tool found in the final image" >&2; exit 1
  fi
done

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# As docs/deployment.md's `docker run -p 8000:8000 -v $PWD/models:/models poolserve /models/all-MiniLM-L6-v2`
# (chroot isolation shares the host network, so the port is set instead of published).
# `buildah run` does not apply the image's USER by itself; docker does, so pass it as docker would.
user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$IMAGE")
[ -n "$user" ] && [ "$user" != root ] && [ "$user" != 0 ] || { echo "container: the image's USER is '$user'" >&2; exit 1; }
buildah run --isolation chroot --user "$user" -v "$PWD/models:/models:ro" -e POOLSERVE_PORT="$port" -e POOLSERVE_HOST=127.0.0.1 \
  "$ctr" -- poolserve serve /models/all-MiniLM-L6-v2 > target/container/server.log 2>&1 &
server=$!
for _ in $(seq 1 300); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat target/container/server.log; exit 1; }
  sleep 0.2
done
curl -fs "http://127.0.0.1:$port/health" >/dev/null || { echo "container: never healthy" >&2; cat target/container/server.log; exit 1; }

# Parity through the container: every reference text of all-MiniLM-L6-v2 (cosine >= 0.9999).
python3 - "$port" <<'PY'
import json, math, sys, urllib.request
reference = json.load(open("tests/fixtures/expected/all-MiniLM-L6-v2.json"))
texts = [t["text"] for t in reference["texts"]]
body = json.dumps({"input": texts, "truncate_prompt_tokens": -1}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/embeddings", body, {"Content-Type": "application/json"})
data = json.load(urllib.request.urlopen(request))["data"]
worst = 1.0
for item, case in zip(data, reference["texts"]):
    a, b = item["embedding"], case["embedding"]
    cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    worst = min(worst, cos)
print(f"container: {len(data)} embeddings, worst cosine against sentence-transformers {worst:.6f}")
sys.exit(0 if worst >= 0.9999 else 1)
PY

# The server process runs as the image's non-root user.
# The server itself (under buildah's chroot helpers), by process name.
pid=$(pgrep -n -x poolserve)
uid=$(awk '/^Uid:/{print $2}' "/proc/$pid/status")
[ "$uid" = 10001 ] || { echo "container: server runs as uid $uid, not 10001" >&2; exit 1; }
echo "container: server runs as uid $uid"

kill -TERM "$pid"
status=0
wait "$server" || status=$?
server=
[ "$status" = 0 ] || { echo "container: exit status $status after SIGTERM" >&2; cat target/container/server.log; exit 1; }
grep -q "stopped" target/container/server.log

# The shipped plugins run in the image's own Python (pydantic, no tokenizer package, no numpy),
# one server, three models (a models file): vLLM's BGE-M3 sparse plugin on the tiny BGE-M3
# fixture (its dense vector against FlagEmbedding's), vLLM's ColBERT query plugin on
# jina-colbert-v2-tiny with the two marker tokens (the copy tests/suite/plugins.rs makes), and
# word_count on bert-embed-mean (its norms against the same server's /v1/embeddings).
plugin_models=target/container/plugin-models
rm -rf "$plugin_models" && mkdir -p "$plugin_models"
cp -r tests/fixtures/models/bge-m3-tiny tests/fixtures/models/bert-embed-mean "$plugin_models/"
cp -r tests/fixtures/models/jina-colbert-v2-tiny "$plugin_models/colbert"
python3 - "$plugin_models/colbert/tokenizer.json" <<'PY'
import json, sys
tokenizer = json.load(open(sys.argv[1]))
for id_, content in [(1063, "[QueryMarker]"), (1064, "[DocumentMarker]")]:
    tokenizer["model"]["vocab"][id_][0] = content
    tokenizer["added_tokens"].append({"id": id_, "content": content, "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
json.dump(tokenizer, open(sys.argv[1], "w"))
PY
cat > "$plugin_models/models.yaml" <<'YAML'
models:
  - {name: bge, model: /models/bge-m3-tiny, io_processor_plugin: bge_m3_sparse_plugin}
  - {name: colbert, model: /models/colbert, io_processor_plugin: colbert_query_plugin}
  - {name: words, model: /models/bert-embed-mean, io_processor_plugin: word_count}
YAML
buildah run --isolation chroot --user "$user" -v "$PWD/$plugin_models:/models:ro" \
  -e POOLSERVE_PORT="$port" -e POOLSERVE_HOST=127.0.0.1 \
  "$ctr" -- poolserve serve --config /models/models.yaml > target/container/plugin-server.log 2>&1 &
server=$!
for _ in $(seq 1 300); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat target/container/plugin-server.log; exit 1; }
  sleep 0.2
done
python3 - "$port" <<'PY' || { cat target/container/plugin-server.log; exit 1; }
import json, math, sys, urllib.request

def post(path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request))

case = json.load(open("tests/fixtures/expected/bge-m3-tiny.json"))["texts"][0]
entry = post("/pooling", {"model": "bge", "data": {"input": case["text"], "return_tokens": True}})["data"]["data"][0]
a, b = entry["dense_embedding"], case["embedding"]
cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
weights = {str(w["token_id"]): w["weight"] for w in entry["sparse_embedding"]}
worst = max(abs(weights[k] - v) for k, v in case["lexical_weights"].items())
bge = entry["object"] == "dense&sparse" and cos >= 0.9999 and worst <= 1e-4 and set(weights) == set(case["lexical_weights"]) \
    and all(isinstance(w["token"], str) for w in entry["sparse_embedding"])
print(f"container: bge_m3_sparse_plugin in the image: dense cosine {cos:.6f}, lexical weights within {worst:.1e}, tokens named")

query = post("/pooling", {"model": "colbert", "data": {"input": "What is late interaction?", "input_type": "query"}})["data"]
document = post("/pooling", {"model": "colbert", "data": {"input": "Late interaction.", "input_type": "document"}})["data"]
colbert = len(query["data"][0]["embedding"]) == 32 == query["usage"]["prompt_tokens"] \
    and len(document["data"][0]["embedding"]) == document["usage"]["prompt_tokens"] < 32
print(f"container: colbert_query_plugin in the image: a query of {len(query['data'][0]['embedding'])} vectors, "
      f"a document of {len(document['data'][0]['embedding'])}")

texts = ["a", "b c"]
counted = post("/pooling", {"model": "words", "data": {"texts": texts}})["data"]
norms = [math.sqrt(sum(x * x for x in post("/v1/embeddings", {"model": "words", "input": t})["data"][0]["embedding"])) for t in texts]
words = all(abs(item["norm"] - n) < 1e-5 for item, n in zip(counted, norms)) and len(counted) == 2
print(f"container: word_count in the image: norms {[round(i['norm'], 6) for i in counted]} as /v1/embeddings'")
sys.exit(0 if bge and colbert and words else 1)
PY
pid=$(pgrep -n -x poolserve)
kill -TERM "$pid"
wait "$server" || { echo "container: the plugin server did not stop cleanly" >&2; cat target/container/plugin-server.log; exit 1; }
server=
done_at=$(date +%s)
echo "container: stopped cleanly on SIGTERM; base images $((base_ready - started)) s, image build $((built - base_ready)) s, run $((done_at - built)) s"
echo "container: ok"
