#!/usr/bin/env bash
# Builds the binary with `--features cuda` on a machine without a CUDA toolkit, from PyPI's
# CUDA 13.0 wheels, and prints the binary's path as its last line.
#
#   scripts/build-cuda.sh            # the release build → target/cuda/release/poolserve
#   scripts/build-cuda.sh --check    # the test command's: lints, compiles and links (dev profile) → target/cuda-check/poolserve
#   scripts/build-cuda.sh --toolkit  # step 1 only (the test command starts it early)
#
# CUDA_COMPUTE_CAP (default 90: H100/H200) picks the GPU generation candle's kernels are
# compiled for; candle's build turns 90 into sm_90a, which runs on compute capability 9.0 only.
#
# Why 13.0 exactly: the PTX embedded in the binary is JIT-compiled by the driver when a module
# is first used, and nvcc 13.0 writes PTX ISA 9.0, which drivers from 580 (CUDA 13.0) load;
# a newer nvcc writes PTX that those drivers refuse.
#
# What it does:
# 1. installs nvcc, cicc/libdevice, the CRT and CCCL headers and the CUDA runtime from PyPI into
#    target/cuda-toolkit/ (about 270 MB; once);
# 2. gives the linker what candle's cudarc links against: `libcudart.so` (the wheel's), and
#    link-only stubs of the driver (`libcuda.so`, which no wheel ships), cuBLAS, cuBLASLt, cuRAND
#    and NVRTC, generated from the functions cudarc declares, with the real libraries' sonames.
#    The stubs are never loaded: the binary needs the real `libcuda.so.1` (the driver),
#    `libcublas.so.13` and `libcurand.so.10` at run time, e.g. from PyTorch's nvidia wheels:
#    LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib;
# 3. the release build goes into target/cuda/ (not target/, so the CPU build is left alone).
#    `--check` builds on the dev profile into target/debug/ instead, where the test command's
#    test build has already compiled every dependency the `cuda` feature leaves alone (all but
#    candle, cudarc, the kernels and a few crates whose features it changes), with clippy
#    (-D warnings) linting the library and the binary as they compile, and the GPU code compiled
#    without nvcc's optimizer; the binary is copied to target/cuda-check/ and
#    target/debug/poolserve is put back to the CPU build's. It is for checking that everything
#    compiles, lints and links: the GPU check (scripts/gpu-bundle.sh) and Dockerfile.cuda use the
#    plain release build. (It used the release profile, sharing the CPU release build's
#    dependencies, until 2026-12-03: our crate at opt-level 3 with thin LTO was most of its
#    time, for a binary nothing runs.)
# Needs python3 (with venv), gcc and cargo; the release build takes about 8 minutes on 2 cores
# from a warm registry.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLKIT="$PWD/target/cuda-toolkit"
CU13="$TOOLKIT/site-packages/nvidia/cu13"
WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
        nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96)

if [ ! -x "$CU13/bin/nvcc" ] || [ "$(cat "$TOOLKIT/wheels.txt" 2>/dev/null)" != "${WHEELS[*]}" ]; then
  rm -rf "$TOOLKIT"
  python3 -m venv "$TOOLKIT/venv"
  "$TOOLKIT/venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps \
    --target "$TOOLKIT/site-packages" "${WHEELS[@]}"
  # Wheels do not keep the executable bit on every tool.
  chmod +x "$CU13"/bin/* "$CU13"/nvvm/bin/*
  echo "${WHEELS[*]}" > "$TOOLKIT/wheels.txt"
fi
"$CU13/bin/nvcc" --version | grep -q "release 13.0" || { echo "build-cuda: nvcc is not 13.0" >&2; exit 1; }
[ "${1:-}" = --toolkit ] && exit 0

# Link-time names. cudarc's build script searches $CUDA_HOME/lib and $CUDA_HOME/lib/stubs.
ln -sf libcudart.so.13 "$CU13/lib/libcudart.so"
cudarc=$(cargo metadata --locked --format-version 1 --features cuda |
  python3 -c 'import json, sys, os; print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')
mkdir -p "$CU13/lib/stubs" "$TOOLKIT/stub-src"
# stub MODULE LIBRARY SONAME: an empty function for every `fn` cudarc declares in MODULE's bindings.
stub() {
  local src="$TOOLKIT/stub-src/$2.c"
  grep -hoE '^ {12}fn [A-Za-z0-9_]+\(' "$cudarc/src/$1/sys/mod.rs" |
    sed -E 's/^ +fn ([A-Za-z0-9_]+)\(/void \1(void) {}/' | sort -u > "$src"
  [ -s "$src" ] || { echo "build-cuda: no $2 functions found in $cudarc/src/$1/sys/mod.rs" >&2; exit 1; }
  gcc -shared -fPIC -o "$CU13/lib/stubs/lib$2.so" -Wl,-soname,"$3" "$src"
}
stub driver cuda libcuda.so.1
stub cublas cublas libcublas.so.13
stub cublaslt cublasLt libcublasLt.so.13
stub curand curand libcurand.so.10
stub nvrtc nvrtc libnvrtc.so.13

export PATH="$CU13/bin:$CU13/nvvm/bin:$PATH" CUDA_HOME="$CU13"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}" CUDARC_CUDA_VERSION=13000
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
if [ "${1:-}" = --check ]; then
  # clippy-driver is rustc with clippy's lints: it compiles the workspace's crates and lints
  # them in one pass (the test command's CPU build does the same, scripts/test.sh).
  export RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  # Device code unoptimized: this binary is never run (no GPU here), and nvcc's optimizer was
  # most of the build (candle's quantized and MoE kernels: 37 s a file at -O3, 13 s here).
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }-Xcicc -O0 -Xptxas -O0"
  built=${CARGO_TARGET_DIR:-target}/debug/poolserve
  saved=()
  for f in "$built" "$built.d"; do
    if [ -f "$f" ]; then cp -p "$f" "$f.cpu"; saved+=("$f"); fi
  done
  # The host code unoptimized too, in the crates the `cuda` feature makes new (the CPU build's
  # candle is at level 3, poolserve at 1; every other crate keeps its profile, so that the
  # test build's copy serves): nothing runs this binary. Measured on a 2-vCPU Xeon
  # (2026-12-06): these crates' compile time 236 s at their levels, 59 s at 0.
  unoptimized=()
  for package in poolserve candle-core candle-nn cudarc; do
    unoptimized+=(--config "profile.dev.package.$package.opt-level=0")
  done
  cargo build --locked --features cuda --lib --bins "${unoptimized[@]}" >&2
  mkdir -p target/cuda-check
  cp -p "$built" target/cuda-check/poolserve
  cp -p "$built.d" target/cuda-check/poolserve.d
  for f in "${saved[@]}"; do mv "$f.cpu" "$f"; done
  echo "$PWD/target/cuda-check/poolserve"
  exit 0
fi
export CARGO_TARGET_DIR="$PWD/target/cuda"
cargo build --release --locked --features cuda --bin poolserve >&2
echo "$PWD/target/cuda/release/poolserve"
