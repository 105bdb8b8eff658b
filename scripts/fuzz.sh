#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo-fuzz, libFuzzer, AddressSanitizer unless told; the nightly
# toolchain) for SECONDS each (default 600), one after another, from the corpus committed in
# fuzz/corpus/TARGET (new finds are added there; `cargo +nightly fuzz cmin TARGET` shrinks it
# before a commit). A crash, a timeout (10 s an input) or an allocation over 2 GiB stops the run
# and leaves the input in fuzz/artifacts/TARGET.
#
# The toolchain is nightly where rustup has it; without it, the stable one with RUSTC_BOOTSTRAP=1
# (cargo-fuzz's -Zsanitizer flag is nightly-only; the ASan runtime ships with every channel).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --build            # builds every target, runs none
#
# FUZZ_PROFILE=dev builds with `cargo fuzz build --dev` (fuzz/Cargo.toml's dev profile: a few
# minutes instead of cargo-fuzz's release build with one codegen unit per crate, about 13; the
# test command's short run uses it); unset, cargo-fuzz's release build (faster for long runs).
#
# FUZZ_SANITIZER=none fuzzes without AddressSanitizer (`cargo fuzz --sanitizer none`: still
# coverage-guided, a panic, a timeout or an allocation over the limit still fails). The test
# command's 2-minute run uses it: the targets drive safe Rust, where ASan finds nothing a panic
# would not, and the instrumented build cost more than the run. Unset: AddressSanitizer, for the
# longer campaigns run when a change touches `unsafe` code that parsers reach (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
[ "${FUZZ_PROFILE:-release}" = dev ] && profile=(--dev)
profile+=(--sanitizer "${FUZZ_SANITIZER:-address}")
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
if rustup toolchain list | grep -q '^nightly'; then
  toolchain=+nightly
else
  toolchain=+stable
  export RUSTC_BOOTSTRAP=1
  echo "fuzz: no nightly toolchain here: the stable one, with RUSTC_BOOTSTRAP=1"
fi
if [ "${1:-}" = --build ]; then
  cargo "$toolchain" fuzz build "${profile[@]}"
  exit 0
fi
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo "$toolchain" fuzz list)
for target in "${targets[@]}"; do
  echo "fuzz: $target for ${seconds} s"
  cargo "$toolchain" fuzz run "${profile[@]}" "$target" -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1
done
