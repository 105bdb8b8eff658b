#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs on the GPU machine (which has no Rust toolchain) into
# target/gpu-bundle/, one carried path of about 40 MB (stripped):
#   poolserve   the --features cuda release binary (scripts/build-cuda.sh)
#   loadgen     our load generator (benches/loadgen.rs), built for the host
#   tokenizer/  all-MiniLM-L6-v2's tokenizer files (the random-weight models' vocabulary)
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=target/gpu-bundle
rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/tokenizer"
cp "$(scripts/build-cuda.sh | tail -1)" "$BUNDLE/poolserve"
loadgen=$(cargo bench --locked --bench loadgen --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("target", {}).get("name") == "loadgen" and m.get("executable")][-1])')
cp "$loadgen" "$BUNDLE/loadgen"
[ -f models/all-MiniLM-L6-v2/tokenizer.json ] || scripts/fetch-minilm.sh
for f in tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do
  cp "models/all-MiniLM-L6-v2/$f" "$BUNDLE/tokenizer/"
done
# Symbols stay here: the working tree and its carried paths travel in 64 MiB at most.
strip "$BUNDLE/poolserve" "$BUNDLE/loadgen"
du -sh "$BUNDLE"
