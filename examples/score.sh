#!/usr/bin/env bash
# Score query/document pairs with curl. Serve a cross-encoder first (an embedding model answers
# /score and /rerank too, by cosine similarity), for example the tiny fixture:
#   poolserve serve tests/fixtures/models/bert-reranker
#   examples/score.sh                         # or POOLSERVE_BASE=http://host:port examples/score.sh
set -euo pipefail
base=${POOLSERVE_BASE:-http://localhost:8000}

# 1:N: one query against two documents.
curl -sS --fail-with-body "$base/score" -H 'Content-Type: application/json' \
  -d '{"queries": "what is the capital of france",
       "documents": ["paris is the capital of france.", "the cat sat on the mat."]}'
echo
# N:N with vLLM's text_1/text_2 names, pairs cut to 64 tokens longest-first.
curl -sS --fail-with-body "$base/v1/score" -H 'Content-Type: application/json' \
  -d '{"text_1": ["what is the capital of france", "who wrote hamlet"],
       "text_2": ["paris is the capital of france.", "hamlet is a play by shakespeare."],
       "truncate_prompt_tokens": 64}'
echo
# The same query as a rerank request (Jina / Cohere shape), best document first.
curl -sS --fail-with-body "$base/rerank" -H 'Content-Type: application/json' \
  -d '{"query": "what is the capital of france", "top_n": 1,
       "documents": ["the cat sat on the mat.", "paris is the capital of france."]}'
echo
