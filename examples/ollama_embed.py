#!/usr/bin/env python3
"""Embed through poolserve with the official `ollama` Python client, as tools that speak only
Ollama do (Open WebUI, AnythingLLM, LangChain's and LlamaIndex's Ollama embedders).

    pip install ollama
    poolserve serve sentence-transformers/all-MiniLM-L6-v2 --served-model-name all-minilm
    OLLAMA_HOST=http://localhost:8000 python3 examples/ollama_embed.py

Exits non-zero unless the vectors match sentence-transformers' (cosine >= 0.9999, from
tests/fixtures/expected/all-MiniLM-L6-v2-quantized.json, made by
tests/fixtures/make_minilm_quantized.py) through `embed` (normalized, several inputs,
`dimensions`) and the older `embeddings`, and `list` names the model.
"""
import json
import math
import os
import sys

import ollama

here = os.path.dirname(os.path.abspath(__file__))
reference = json.load(open(os.path.join(here, "..", "tests", "fixtures", "expected", "all-MiniLM-L6-v2-quantized.json")))
client = ollama.Client(host=os.environ.get("OLLAMA_HOST", "http://localhost:8000"))


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


models = [m.model for m in client.list().models]
model = models[0]
print(f"models: {models}")

answer = client.embed(model=model, input=reference["texts"])
for text, got, want in zip(reference["texts"], answer.embeddings, reference["float"]):
    c = cosine(got, want)
    print(f"embed  {text:<36} cosine to sentence-transformers {c:.6f}")
    if c < 0.9999 or abs(math.sqrt(sum(x * x for x in got)) - 1) > 1e-4:
        sys.exit(f"embed: {text!r} differs from the reference (cosine {c}) or is not normalized")
if answer.prompt_eval_count is None or answer.prompt_eval_count <= len(reference["texts"]):
    sys.exit(f"embed: prompt_eval_count {answer.prompt_eval_count} does not count the tokens")

short = client.embed(model=model, input=reference["texts"][0], dimensions=64, truncate=True, keep_alive="5m")
cut = reference["float"][0][:64]
if len(short.embeddings[0]) != 64 or cosine(short.embeddings[0], cut) < 0.9999:
    sys.exit("embed: dimensions=64 is not the cut, renormalized vector")

legacy = client.embeddings(model=model, prompt=reference["texts"][1])
c = cosine(legacy.embedding, reference["float"][1])
print(f"embeddings (older route): cosine {c:.6f}")
if c < 0.9999:
    sys.exit("embeddings: differs from the reference")

try:
    client.embed(model="no-such-model", input="x")
    sys.exit("an unknown model was answered")
except ollama.ResponseError as e:
    if e.status_code != 404 or e.error != "model 'no-such-model' not found":
        sys.exit(f"unknown model: {e.status_code} {e.error!r}")
print("ollama client: ok")
