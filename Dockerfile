# poolserve, CPU image. Multi-stage: the Rust toolchain stays in the builder.
#
#   docker build -t poolserve .
#   docker run -p 8000:8000 -v $PWD/models:/models poolserve /models/all-MiniLM-L6-v2
#   docker run -p 8000:8000 -v hf-cache:/data poolserve sentence-transformers/all-MiniLM-L6-v2
#
# Every `serve` flag is also an environment variable (POOLSERVE_PORT, POOLSERVE_MAX_BATCH_TOKENS,
# ...); the hub cache lives in the /data volume (HF_HOME).

FROM rust:1-bookworm AS builder
# nasm: openh264's SIMD assembly (video decoding; without it the C fallback builds).
RUN apt-get update \
 && apt-get install -y --no-install-recommends nasm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# The workspace's other member (the fuzz targets): cargo reads every member's manifest
# before it builds anything, and builds none of its targets here.
COPY fuzz/Cargo.toml ./fuzz/
COPY crates ./crates
COPY src ./src
COPY benches ./benches
# Left empty (the default), the binary is built here. scripts/test-container.sh sets it to the
# release binary the test command already built and checked on the same Debian release with the
# same toolchain, mounted into the build (`buildah bud -v`), so the test command compiles it once.
ARG POOLSERVE_PREBUILT=
RUN if [ -n "${POOLSERVE_PREBUILT}" ]; then \
      cp "${POOLSERVE_PREBUILT}" /usr/local/bin/poolserve; \
    else \
      cargo build --release --locked --bin poolserve \
      && cp target/release/poolserve /usr/local/bin/poolserve; \
    fi

FROM debian:bookworm-slim
# IO-processor plugins (docs/plugins.md) run in a Python of their own: Debian's python3 with
# pydantic 2 from PyPI in /opt/poolserve-python (vLLM's plugins' request types are pydantic 2
# models; Debian's python3-pydantic is 1.10). No tokenizer package: plugins ask the server's.
# PIP_CERT: a CA bundle for pip behind a TLS-intercepting proxy (a path the build can read).
ARG PIP_CERT=
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && python3 -m venv /opt/poolserve-python \
 && /opt/poolserve-python/bin/pip install --no-cache-dir --disable-pip-version-check -q ${PIP_CERT:+--cert "$PIP_CERT"} 'pydantic>=2,<3' \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /home/poolserve poolserve \
 && mkdir -p /data /models \
 && chown poolserve:poolserve /data /models
COPY --from=builder /usr/local/bin/poolserve /usr/local/bin/poolserve
# The plugins shipped as examples (vLLM's own, ported), found by name: --io-processor-plugin
# bge_m3_sparse_plugin. More: mount a folder and add it with --plugin-path.
COPY plugins /usr/share/poolserve/plugins
ENV POOLSERVE_HOST=0.0.0.0 \
    POOLSERVE_PORT=8000 \
    HF_HOME=/data \
    RUST_LOG=info \
    POOLSERVE_PLUGIN_PYTHON=/opt/poolserve-python/bin/python \
    POOLSERVE_PLUGIN_PATH=/usr/share/poolserve/plugins
VOLUME ["/data"]
EXPOSE 8000
USER poolserve
ENTRYPOINT ["poolserve", "serve"]
