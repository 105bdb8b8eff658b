#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (libFuzzer) for SECONDS each (default 600), one after another,
# from the corpus committed in fuzz/corpus/TARGET (new finds are added there; `cargo +nightly
# fuzz cmin TARGET` shrinks it before a commit). A crash, a timeout (10 s an input) or an
# allocation over 2 GiB stops the run and leaves the input in fuzz/artifacts/TARGET.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --build            # builds every target, runs none
#
# Two builds:
# - unset FUZZ_PROFILE (the longer campaigns): cargo-fuzz's release build, every crate
#   instrumented, with AddressSanitizer unless FUZZ_SANITIZER=none; the nightly toolchain where
#   rustup has it, else the stable one with RUSTC_BOOTSTRAP=1 (cargo-fuzz's -Zsanitizer flag is
#   nightly-only; the ASan runtime ships with every channel). Installs cargo-fuzz if missing.
# - FUZZ_PROFILE=dev (the test command's 2-minute run): plain cargo, the dev profile in
#   target/debug, no sanitizer, and only the workspace's crates (poolserve and the targets)
#   instrumented, through scripts/fuzz-rustc.sh: every dependency is the one the test build
#   compiled, so this build compiles only our crate again (docs/testing.md "Fuzzing" says what
#   that leaves out: coverage guidance inside the dependencies). Nothing to install.
set -euo pipefail
cd "$(dirname "$0")/.."
targets_of_manifest() { sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | tail -n +2; }
if [ "${FUZZ_PROFILE:-release}" = dev ]; then
  if [ "${FUZZ_SANITIZER:-none}" != none ]; then
    echo "fuzz: FUZZ_PROFILE=dev builds without a sanitizer (its dependencies are the test build's); unset FUZZ_PROFILE for FUZZ_SANITIZER=${FUZZ_SANITIZER}" >&2
    exit 2
  fi
  RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/fuzz-rustc.sh" cargo build --locked -p poolserve-fuzz --bins
  [ "${1:-}" = --build ] && exit 0
  list_targets() { targets_of_manifest; }
  run_target() {
    local target=$1
    shift 2
    mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
    "target/debug/$target" -artifact_prefix="fuzz/artifacts/$target/" "$@" "fuzz/corpus/$target"
  }
else
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
  if rustup toolchain list | grep -q '^nightly'; then
    toolchain=+nightly
  else
    toolchain=+stable
    export RUSTC_BOOTSTRAP=1
    echo "fuzz: no nightly toolchain here: the stable one, with RUSTC_BOOTSTRAP=1"
  fi
  sanitizer=(--sanitizer "${FUZZ_SANITIZER:-address}")
  if [ "${1:-}" = --build ]; then
    cargo "$toolchain" fuzz build "${sanitizer[@]}"
    exit 0
  fi
  list_targets() { cargo "$toolchain" fuzz list; }
  run_target() {
    local target=$1
    shift 2
    cargo "$toolchain" fuzz run "${sanitizer[@]}" "$target" -- "$@"
  }
fi
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(list_targets)
for target in "${targets[@]}"; do
  echo "fuzz: $target for ${seconds} s"
  run_target "$target" "$seconds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1
done
