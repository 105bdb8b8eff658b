#!/usr/bin/env bash
# check-docs-page.sh BASE_URL [SCREENSHOT.png]
#
# Renders BASE_URL/docs (Swagger UI over /openapi.json) in headless Chromium, as a person's
# browser would, and fails unless the rendered page lists the endpoints. Saves a screenshot.
# Installs Debian's chromium when it is missing (root only). Nothing is fetched from the
# internet by the page: its assets are served by poolserve.
set -euo pipefail
BASE=${1:?usage: check-docs-page.sh BASE_URL [SCREENSHOT.png]}
SHOT=${2:-target/docs-page.png}
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
  --disable-component-update --disable-sync --user-data-dir="$profile" --virtual-time-budget=10000)
dom=$(chromium "${flags[@]}" --dump-dom "$BASE/docs/" 2>/dev/null)
chromium "${flags[@]}" --window-size=1280,1600 --screenshot="$SHOT" "$BASE/docs/" >/dev/null 2>&1
missing=()
for path in /v1/embeddings /v2/embed /rerank /score /classify /pooling /tokenize /health; do
  # Swagger UI renders each operation's path in an element of class opblock-summary-path.
  grep -q "opblock-summary-path[^>]*>.*${path}" <<<"$dom" || grep -q "data-path=\"${path}\"" <<<"$dom" || missing+=("$path")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "docs page: endpoints not rendered: ${missing[*]}" >&2
  exit 1
fi
count=$(grep -o 'class="opblock-summary-path"' <<<"$dom" | wc -l)
echo "docs page: $count operations rendered; screenshot $SHOT"
