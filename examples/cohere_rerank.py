#!/usr/bin/env python3
"""Rerank documents through poolserve with the official Cohere SDK, v1 and v2 clients.

    pip install cohere
    poolserve serve cross-encoder/ms-marco-MiniLM-L-6-v2        # any cross-encoder
    python3 examples/cohere_rerank.py                           # server at http://localhost:8000
    POOLSERVE_BASE=http://host:port python3 examples/cohere_rerank.py

The Cohere clients add `/v1/rerank` and `/v2/rerank` to the base URL themselves. The script
exits non-zero if either client cannot parse the answer or the two disagree, so CI runs it.
"""
import json
import os
import sys
import urllib.request

import cohere

base = os.environ.get("POOLSERVE_BASE", "http://localhost:8000")
api_key = os.environ.get("POOLSERVE_API_KEY", "none")
with urllib.request.urlopen(f"{base}/v1/models") as answer:
    model = json.load(answer)["data"][0]["id"]

query = "what is the capital of france"
documents = [
    "the cat sat on the mat.",
    "paris is the capital of france.",
    "berlin is the capital of germany.",
]

v1 = cohere.Client(api_key=api_key, base_url=base).rerank(
    model=model, query=query, documents=documents, top_n=3, return_documents=True
)
v2 = cohere.ClientV2(api_key=api_key, base_url=base).rerank(model=model, query=query, documents=documents, top_n=2)

print("v1 client:")
for result in v1.results:
    print(f"  {result.relevance_score:.4f}  [{result.index}] {result.document.text}")
print("v2 client (top_n=2):")
for result in v2.results:
    print(f"  {result.relevance_score:.4f}  [{result.index}] {documents[result.index]}")

scores = [r.relevance_score for r in v1.results]
ok = (
    len(v1.results) == 3
    and len(v2.results) == 2
    and scores == sorted(scores, reverse=True)
    and all(r.document.text == documents[r.index] for r in v1.results)
    and [r.index for r in v2.results] == [r.index for r in v1.results[:2]]
    and all(abs(a.relevance_score - b.relevance_score) < 1e-6 for a, b in zip(v1.results, v2.results))
)
if not ok:
    sys.exit("the v1 and v2 answers are inconsistent")
