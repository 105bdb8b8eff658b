#!/usr/bin/env bash
# The compiler wrapper of the test command's fuzz build (scripts/fuzz.sh with FUZZ_PROFILE=dev):
# cargo runs it, as RUSTC_WORKSPACE_WRAPPER, for the workspace's own crates only (poolserve and
# the targets of fuzz/), so that those get libFuzzer's coverage instrumentation while every
# dependency is the test build's, already compiled in target/debug. The flags are cargo-fuzz's
# (its `cargo fuzz build --sanitizer none`): sancov's inline 8-bit counters and PC table at
# edge level, comparisons traced, stack depth, dead code linked, `--cfg fuzzing`.
#
#   RUSTC_WORKSPACE_WRAPPER=scripts/fuzz-rustc.sh cargo build -p poolserve-fuzz --bins
set -euo pipefail
rustc=$1
shift
# Build scripts run on this machine and are not fuzzed; cargo's queries of the compiler
# (`-vV`, `--print`) are not compilations.
case " $* " in
  *" --crate-name build_script_build "* | *" -vV "* | *" --print"*) exec "$rustc" "$@" ;;
esac
exec "$rustc" "$@" \
  -Cpasses=sancov-module \
  -Cllvm-args=-sanitizer-coverage-level=4 \
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
  -Cllvm-args=-sanitizer-coverage-pc-table \
  -Cllvm-args=-sanitizer-coverage-trace-compares \
  -Cllvm-args=-sanitizer-coverage-stack-depth \
  -Clink-dead-code \
  --cfg fuzzing
