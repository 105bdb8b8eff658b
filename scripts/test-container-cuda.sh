#!/usr/bin/env bash
# Builds the CUDA image from the unchanged Dockerfile.cuda without a Docker engine (buildah, as
# scripts/test-container.sh does for the CPU image, whose base-image stand-ins it reuses: run
# that first), then checks what can be checked without a GPU:
#
# 1. the image's binary is the --features cuda build (it embeds our PTX kernels);
# 2. every library it links resolves inside the image except the driver's libcuda.so.1, which the
#    NVIDIA container toolkit mounts at `docker run --gpus` time;
# 3. cuBLAS/cuBLASLt/cuRAND in the image are the CUDA 13.0 line scripts/build-cuda.sh builds for;
# 4. the final stage has no compiler and runs as uid 10001.
#
# The binary is not compiled a second time: scripts/build-cuda.sh builds it on this machine (or
# POOLSERVE_CUDA_BIN names one already built: the test command's `scripts/build-cuda.sh --check`
# binary, whose GPU code is unoptimized; no GPU runs it here), and the image's builder stage copies that binary
# (Dockerfile.cuda's POOLSERVE_PREBUILT) instead of running the same script again inside. Both
# are Debian bookworm with this machine's Rust toolchain (the stand-in rust:1-bookworm is made
# from it), so the binary is the one the builder stage would make; check 2 below would catch a
# library it cannot find. A user's `docker build -f Dockerfile.cuda .` still builds from source.
# Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
IMAGE=localhost/poolserve:cuda-test
mkdir -p target/container-cuda
binary=${POOLSERVE_CUDA_BIN:-$(scripts/build-cuda.sh | tail -1)}
for base in docker.io/library/debian:bookworm-slim docker.io/library/rust:1-bookworm; do
  buildah images --quiet "$base" >/dev/null 2>&1 || { echo "container-cuda: $base missing (run scripts/test-container.sh first)" >&2; exit 1; }
done

# The builds inside fetch wheels from PyPI. Where this machine reaches PyPI through a proxy with
# its own certificate authority, pip inside the build needs the same trust: the host's CA bundle
# is mounted beside the image's own (which apt's ca-certificates must still be able to write)
# with a pip.conf pointing at it (the Dockerfile itself stays standard).
trust=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  printf '[global]\ncert = /etc/pip-host-ca.crt\n' > target/container-cuda/pip.conf
  trust=(-v /etc/ssl/certs/ca-certificates.crt:/etc/pip-host-ca.crt:ro -v "$PWD/target/container-cuda/pip.conf:/etc/pip.conf:ro")
fi
[ -f "$binary.d" ] && python3 scripts/dockerfile_copies.py "$binary.d" Dockerfile.cuda
echo "container-cuda: building $IMAGE from Dockerfile.cuda with $binary"
buildah bud --isolation chroot --pull=never --layers=false -q "${trust[@]}" \
  -v "$(dirname "$binary"):/prebuilt:ro" --build-arg POOLSERVE_PREBUILT=/prebuilt/poolserve \
  -t "$IMAGE" -f Dockerfile.cuda . >/dev/null
built=$(date +%s)
echo "container-cuda: image $IMAGE is $(buildah images --format '{{.Size}}' "$IMAGE" | head -1)"

ctr=$(buildah from --pull=never "$IMAGE")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; buildah rmi "$IMAGE" >/dev/null 2>&1 || true' EXIT
in_image() { buildah run --isolation chroot "$ctr" -- "$@"; }

in_image sh -c 'grep -c attention_d128_f16 /usr/local/bin/poolserve' >/dev/null \
  || { echo "container-cuda: the binary has no poolserve CUDA kernels" >&2; exit 1; }
[ "$(in_image sha256sum /usr/local/bin/poolserve | cut -d' ' -f1)" = "$(sha256sum "$binary" | cut -d' ' -f1)" ] \
  || { echo "container-cuda: the image's binary is not $binary" >&2; exit 1; }
missing=$(in_image sh -c 'ldd /usr/local/bin/poolserve | grep "not found" | awk "{print \$1}"' | sort | tr '\n' ' ')
[ "$missing" = "libcuda.so.1 " ] || { echo "container-cuda: unresolved libraries: '$missing' (expected the driver's libcuda.so.1 only)" >&2; exit 1; }
in_image sh -c 'ls /opt/cuda/lib/libcublas.so.13 /opt/cuda/lib/libcublasLt.so.13 /opt/cuda/lib/libcurand.so.10' >/dev/null
for tool in cargo rustc gcc cc nvcc; do
  if in_image sh -c "command -v $tool" >/dev/null 2>&1; then
    echo "container-cuda: $tool found in the final image" >&2; exit 1
  fi
done
user=$(buildah inspect --format '{{.OCIv1.Config.User}}' "$IMAGE")
[ "$user" = poolserve ] || { echo "container-cuda: the image's USER is '$user'" >&2; exit 1; }
echo "container-cuda: links everything but the driver (mounted by --gpus), no compiler, USER $user; build $((built - started)) s"
echo "container-cuda: ok (not run: no GPU here)"
