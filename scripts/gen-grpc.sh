#!/usr/bin/env bash
# Regenerates src/api/grpc/pb/ (the tei.v1 servers and their descriptor set) from
# proto/tei.proto, TEI's proto unchanged. protoc comes from PyPI's grpcio-tools, so nothing
# beyond the registries is needed; the output is committed (builds need no protoc).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
"$python" -c 'import grpc_tools' 2>/dev/null || "$python" -m pip install -q grpcio-tools
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\nexec "%s" -m grpc_tools.protoc "$@"\n' "$(command -v "$python")" > "$shim/protoc"
chmod +x "$shim/protoc"
PROTOC="$shim/protoc" cargo run --quiet --release --manifest-path tools/grpc-codegen/Cargo.toml -- "$PWD"
rustfmt --edition 2021 src/api/grpc/pb/tei.v1.rs
