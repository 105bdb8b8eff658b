#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo-fuzz, libFuzzer, AddressSanitizer; the nightly
# toolchain) for SECONDS each (default 600), one after another, from the corpus committed in
# fuzz/corpus/TARGET (new finds are added there; `cargo +nightly fuzz cmin TARGET` shrinks it
# before a commit). A crash, a timeout (10 s an input) or an allocation over 2 GiB stops the run
# and leaves the input in fuzz/artifacts/TARGET.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
for target in "${targets[@]}"; do
  echo "fuzz: $target for ${seconds} s"
  cargo +nightly fuzz run "$target" -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1
done
