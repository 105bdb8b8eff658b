#!/usr/bin/env bash
# Before/after on one GPU: two poolserve binaries, interleaved, on the random-weight speed
# models of scripts/gpu-check.sh (made here if missing), in float16.
#
#   scripts/gpu-ab.sh OLD_BIN NEW_BIN [ROUNDS]      # on the GPU machine, repository root
#   DEVICE=cpu DTYPE=float32 SIZES=minilm ...       # dry run on a CPU machine
#   SERVER_ARGS="--quantization int8" ...           # more flags for both servers
#
# For each model shape (SIZES, default "minilm base qwen3"), ROUNDS (default 2) rounds of
# old-then-new servers, each under the same three loads as the GPU check: one 16-token request
# at a time, 64 concurrent 1-input requests, 8 concurrent 32-input requests. The new server logs
# its per-batch timing breakdown (RUST_LOG debug: forward pass, copy to the host, heads), summed
# in the table over its batches of 1024 tokens or more. Then both binaries' cold start: the model load with the
# driver's JIT cache disabled (what a fresh container pays), after the loads. Output: target/gpu-check/ab-*.txt
# and the table ab.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2 ROUNDS=${3:-2}
DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-float16} PYTHON=${PYTHON:-python3}
SIZES=${SIZES:-minilm base qwen3}
BUNDLE=${BUNDLE:-target/gpu-bundle}
LOADGEN=${LOADGEN_BIN:-$BUNDLE/loadgen} TOKENIZER=${TOKENIZER_DIR:-$BUNDLE/tokenizer}
REQUESTS=${REQUESTS:-2000} SINGLE=${SINGLE:-200}
OUT=target/gpu-check
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  lib=$("$PYTHON" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
server=""
trap '[ -n "$server" ] && kill $server 2>/dev/null || true' EXIT

start() {  # start BIN MODEL LOG [env...]: a server on $port, ready
  local bin=$1 model=$2 log=$3
  shift 3
  # shellcheck disable=SC2086 # SERVER_ARGS is a list of flags
  env "$@" "$bin" serve "$model" --host 127.0.0.1 --port "$port" --device "$DEVICE" --dtype "$DTYPE" ${SERVER_ARGS:-} > "$log" 2>&1 &
  server=$!
  until curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1; do
    kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
}
stop() { kill $server; wait $server 2>/dev/null || true; server=""; }

for size in $SIZES; do
  model="$OUT/$size-random"
  if [ ! -f "$model/model.safetensors" ]; then
    "$PYTHON" benches/make_base_model.py "$model" "$TOKENIZER" "$size" > "$OUT/make-$size.log" 2>&1 || { cat "$OUT/make-$size.log" >&2; exit 1; }
  fi
done

for size in $SIZES; do
  for round in $(seq "$ROUNDS"); do
    for which in old new; do
      bin=$OLD; [ $which = new ] && bin=$NEW
      log="$OUT/ab-server-$size-$which-$round.log"
      start "$bin" "$OUT/$size-random" "$log" RUST_LOG=info,poolserve::engine::scheduler=debug
      lg() { "$LOADGEN" --url "http://127.0.0.1:$port" "$@"; }
      lg --concurrency 1 --requests 50 --min-tokens 16 --max-tokens 16 > /dev/null
      for load in single load load32; do
        case $load in
          single) args=(--concurrency 1 --requests "$SINGLE" --min-tokens 16 --max-tokens 16) ;;
          load) args=(--concurrency 64 --requests "$REQUESTS") ;;
          load32) args=(--concurrency 8 --requests $((REQUESTS / 32)) --batch 32) ;;
        esac
        lg "${args[@]}" > "$OUT/ab-$size-$load-$which-$round.txt"
      done
      stop
    done
  done
done

# Cold start: no JIT cache (CUDA_CACHE_DISABLE), the first size's model.
first=$(echo $SIZES | cut -d' ' -f1)
for which in old new; do
  bin=$OLD; [ $which = new ] && bin=$NEW
  start "$bin" "$OUT/$first-random" "$OUT/ab-cold-$which.log" CUDA_CACHE_DISABLE=1
  stop
  echo "cold start $which: $(sed 's/\x1b\[[0-9;]*m//g' "$OUT/ab-cold-$which.log" | grep -o 'model loaded in [0-9.]*m\?s')" | tee -a "$OUT/ab-cold.txt"
done

"$PYTHON" - "$OUT" "$SIZES" "$ROUNDS" <<'EOF' | tee "$OUT/ab.md"
import re, statistics, sys
out, sizes, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def grab(path, pattern):
    m = re.search(pattern, open(path).read())
    return float(m.group(1)) if m else float("nan")
print("| model | load | old tokens/s | new tokens/s | new ÷ old (per round) | old p50 / p99 ms | new p50 / p99 ms |")
print("|---|---|---|---|---|---|---|")
for size in sizes:
    for load in ("single", "load", "load32"):
        tok = {w: [grab(f"{out}/ab-{size}-{load}-{w}-{r}.txt", r"sequences/s, ([\d.]+) tokens/s") for r in range(1, rounds + 1)] for w in ("old", "new")}
        lat = {w: [(grab(f"{out}/ab-{size}-{load}-{w}-{r}.txt", r"p50 ([\d.]+) ms"), grab(f"{out}/ab-{size}-{load}-{w}-{r}.txt", r"p99 ([\d.]+) ms")) for r in range(1, rounds + 1)] for w in ("old", "new")}
        ratios = " ".join(f"{n / o:.2f}" for o, n in zip(tok["old"], tok["new"]))
        fmt = lambda w: f"{statistics.median(p for p, _ in lat[w]):.2f} / {statistics.median(q for _, q in lat[w]):.2f}"
        print(f"| {size} | {load} | {statistics.median(tok['old']):,.0f} | {statistics.median(tok['new']):,.0f} | {ratios} | {fmt('old')} | {fmt('new')} |")
# The new binary's batch timing breakdown, per size: share of the batch time in each part.
unit = {"µs": 1e-3, "ms": 1.0, "s": 1e3}
for size in sizes:
    parts, tokens = [0.0, 0.0, 0.0], 0
    for r in range(1, rounds + 1):
        for line in open(f"{out}/ab-server-{size}-new-{r}.log"):
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            m = re.search(r"forward ([\d.]+)(µs|ms|s), to host ([\d.]+)(µs|ms|s), heads ([\d.]+)(µs|ms|s)", line)
            n = re.search(r"tokens=(\d+)", line)
            if m and n and int(n.group(1)) >= 1024:
                tokens += int(n.group(1))
                for i in range(3):
                    parts[i] += float(m.group(1 + 2 * i)) * unit[m.group(2 + 2 * i)]
    total = sum(parts) or float("nan")
    print(f"\n{size}, new binary, batches of 1024+ tokens: {tokens:,} tokens in {total:,.0f} ms of batches; forward {parts[0]:,.0f} ms ({100 * parts[0] / total:.0f}%), to host {parts[1]:,.0f} ms ({100 * parts[1] / total:.0f}%), heads {parts[2]:,.0f} ms ({100 * parts[2] / total:.0f}%); forward alone {tokens / parts[0] * 1e3 if parts[0] else float('nan'):,.0f} tokens/s")
print()
import os
print(open(f"{out}/ab-cold.txt").read() if os.path.exists(f"{out}/ab-cold.txt") else "no cold-start numbers")
EOF
