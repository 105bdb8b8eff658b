#!/usr/bin/env bash
# Classify two texts with curl. Serve a classifier first, for example the tiny fixture:
#   poolserve serve tests/fixtures/models/bert-seqcls
#   examples/classify.sh                      # or POOLSERVE_BASE=http://host:port examples/classify.sh
set -euo pipefail
base=${POOLSERVE_BASE:-http://localhost:8000}

# Probabilities (softmax here: the model has 3 labels) and the winning label per input.
curl -sS --fail-with-body "$base/classify" -H 'Content-Type: application/json' \
  -d '{"input": ["A man is eating food.", "The weather is lovely today."]}'
echo
# Raw logits instead of probabilities.
curl -sS --fail-with-body "$base/classify" -H 'Content-Type: application/json' \
  -d '{"input": "A man is eating food.", "use_activation": false}'
echo
