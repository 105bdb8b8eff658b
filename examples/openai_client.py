#!/usr/bin/env python3
"""Embed sentences through poolserve with the official OpenAI SDK and print their cosine
similarities.

    pip install openai
    python3 examples/openai_client.py            # server at http://localhost:8000/v1
    POOLSERVE_URL=http://host:port/v1 python3 examples/openai_client.py

Exits non-zero if the similarities make no sense (a paraphrase must score above an unrelated
sentence), so CI can run it against a real model.
"""
import math
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("POOLSERVE_URL", "http://localhost:8000/v1"), api_key=os.environ.get("POOLSERVE_API_KEY", "none"))
model = client.models.list().data[0].id

sentences = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
]
# The SDK asks for base64 by default and decodes it; float lists are checked too.
response = client.embeddings.create(model=model, input=sentences)
floats = client.embeddings.create(model=model, input=sentences, encoding_format="float")
vectors = [item.embedding for item in response.data]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


print(f"model {model}: {len(vectors)} embeddings of {len(vectors[0])} dimensions, {response.usage.prompt_tokens} tokens")
for i, sentence in enumerate(sentences):
    print(f"{sentence:<36}" + " ".join(f"{cosine(vectors[i], v):6.3f}" for v in vectors))

base64_matches_float = all(
    abs(x - y) < 1e-6 for a, b in zip(response.data, floats.data) for x, y in zip(a.embedding, b.embedding)
)
if not base64_matches_float:
    sys.exit("base64 and float encodings disagree")
if not cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]):
    sys.exit("a paraphrase scored below an unrelated sentence")
