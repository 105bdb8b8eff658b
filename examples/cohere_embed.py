#!/usr/bin/env python3
"""Embed texts through poolserve with the official Cohere SDK (ClientV2 and the v1 Client), and
rerank with an embedding model, against all-MiniLM-L6-v2.

    pip install cohere numpy
    poolserve serve sentence-transformers/all-MiniLM-L6-v2
    python3 examples/cohere_embed.py                     # server at http://localhost:8000
    POOLSERVE_BASE=http://host:port python3 examples/cohere_embed.py

Asks for all five embedding types (float, int8, uint8, binary, ubinary) plus base64 and checks
them: float against sentence-transformers' embeddings, binary / ubinary against its
`quantize_embeddings` (both from tests/fixtures/expected/all-MiniLM-L6-v2-quantized.json, made
by tests/fixtures/make_minilm_quantized.py), int8 / uint8 by their cosine to the float vector.
binary / ubinary are the sign bits of the server's own floats, exactly; against the reference
they are equal where the server runs float32, and within 1% of the bits where `--dtype auto`
chose bfloat16 (`/info`'s `model_dtype`: CPUs with AMX or AVX-512 BF16), whose values near zero
may change sign. Exits non-zero on any mismatch, so the test command runs it.
"""
import base64
import json
import os
import sys
import urllib.request

import cohere
import numpy as np

base = os.environ.get("POOLSERVE_BASE", "http://localhost:8000")
api_key = os.environ.get("POOLSERVE_API_KEY", "none")
here = os.path.dirname(os.path.abspath(__file__))
reference = json.load(open(os.path.join(here, "..", "tests", "fixtures", "expected", "all-MiniLM-L6-v2-quantized.json")))
with urllib.request.urlopen(f"{base}/v1/models") as answer:
    model = json.load(answer)["data"][0]["id"]
with urllib.request.urlopen(f"{base}/info") as answer:
    dtype = json.load(answer)["model_dtype"]

texts = reference["texts"]
types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
v2 = cohere.ClientV2(api_key=api_key, base_url=base)
response = v2.embed(model=model, texts=texts, input_type="search_document", embedding_types=types)
e = response.embeddings
print(f"v2: {len(e.float_)} texts, {len(e.float_[0])} dims, billed {response.meta.billed_units.input_tokens} tokens")


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


failures = []
for i, text in enumerate(texts):
    want = np.asarray(reference["float"][i])
    got = np.asarray(e.float_[i])
    if cosine(got, want) < 0.9999:
        failures.append(f"float {i}: cosine {cosine(got, want)}")
    signs = np.packbits(got > 0).tolist()
    if e.ubinary[i] != signs or e.binary[i] != [b - 128 for b in signs]:
        failures.append(f"binary / ubinary {i} are not the sign bits of the floats")
    allowed = 0 if dtype == "float32" else len(got) // 100
    for name, values, offset in [("ubinary", e.ubinary[i], 0), ("binary", e.binary[i], 128)]:
        ours = np.asarray(values, dtype=np.int64) + offset
        theirs = np.asarray(reference[name][i], dtype=np.int64) + offset
        differ = int(np.unpackbits((ours ^ theirs).astype(np.uint8)).sum())
        if differ > allowed:
            failures.append(f"{name} {i}: {differ} bits differ from quantize_embeddings ({dtype}; at most {allowed})")
        elif differ:
            print(f"  {name} {i}: {differ} of {len(got)} bits differ from quantize_embeddings ({dtype})")
    for name, values, offset in [("int8", e.int8[i], 0.0), ("uint8", e.uint8[i], 127.5)]:
        c = cosine(np.asarray(values) - offset, got)
        if c < 0.999:
            failures.append(f"{name} {i}: cosine to float {c}")
    decoded = np.frombuffer(base64.b64decode(e.base64[i]), dtype="<f4")
    if not np.array_equal(decoded, np.asarray(got, dtype=np.float32)):
        failures.append(f"base64 {i} differs from float")
    print(f"  [{i}] {text!r}: ubinary {e.ubinary[i][:4]}…, int8 {e.int8[i][:4]}…")

# The v1 client: a plain float list without embedding_types.
v1 = cohere.Client(api_key=api_key, base_url=base).embed(model=model, texts=texts[:1], input_type="search_query")
if cosine(v1.embeddings[0], reference["float"][0]) < 0.9999:
    failures.append("v1 float differs")

# An embedding model reranks by cosine through both Cohere rerank clients.
query = "What is the capital of France?"
ranked = v2.rerank(model=model, query=query, documents=texts, top_n=1)
ranked_v1 = cohere.Client(api_key=api_key, base_url=base).rerank(model=model, query=query, documents=texts, top_n=2)
if ranked.results[0].index != 3 or ranked_v1.results[0].index != 3:
    failures.append(f"rerank picked {ranked.results[0].index} / {ranked_v1.results[0].index}, not the Paris sentence")
if abs(ranked.results[0].relevance_score - ranked_v1.results[0].relevance_score) > 1e-6:
    failures.append("v1 and v2 rerank disagree")
print(f"v2 rerank: best [{ranked.results[0].index}] {ranked.results[0].relevance_score:.4f}; v1 agrees")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("cohere embed example: ok")
