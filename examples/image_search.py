#!/usr/bin/env python3
"""Image search with the official OpenAI and Cohere SDKs against an image-text model (CLIP,
SigLIP): embed images and texts into one space, rank images for a text query.

    pip install openai cohere numpy
    poolserve serve tests/fixtures/models/clip-tiny        # or openai/clip-vit-base-patch32
    python3 examples/image_search.py                        # server at http://localhost:8000
    POOLSERVE_BASE=http://host:port python3 examples/image_search.py

Against the fixture models (the test command runs it on clip-tiny), every vector is checked
against transformers' features in tests/fixtures/expected/<model>.json; exits non-zero on a
mismatch.
"""
import base64
import json
import os
import sys
import urllib.request

import cohere
import numpy as np
import openai

base = os.environ.get("POOLSERVE_BASE", "http://localhost:8000")
api_key = os.environ.get("POOLSERVE_API_KEY", "none")
here = os.path.dirname(os.path.abspath(__file__))
with urllib.request.urlopen(f"{base}/v1/models") as answer:
    model = json.load(answer)["data"][0]["id"]
fixture = os.path.basename(model.rstrip("/"))
expected_path = os.path.join(here, "..", "tests", "fixtures", "expected", f"{fixture}.json")
expected = json.load(open(expected_path)) if os.path.exists(expected_path) else None
images_dir = os.path.join(here, "..", "tests", "fixtures", "images")
files = sorted(os.listdir(images_dir))


def data_url(name):
    kind = {"jpg": "jpeg"}.get(name.rsplit(".", 1)[-1], name.rsplit(".", 1)[-1])
    return f"data:image/{kind};base64," + base64.b64encode(open(os.path.join(images_dir, name), "rb").read()).decode()


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# OpenAI SDK: `embeddings.create` has no `messages`, so the body is posted as vLLM's docs do.
client = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key)
image_vectors = []
for name in files:
    body = {"model": model, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(name)}}]}]}
    reply = client.post("/embeddings", cast_to=openai.types.CreateEmbeddingResponse, body=body)
    image_vectors.append(reply.data[0].embedding)
query = expected["texts"][0]["text"] if expected else "a photo of a cat"
text_vector = client.embeddings.create(model=model, input=[query]).data[0].embedding

# Cohere SDK: the same images through `images` (input_type "image").
co = cohere.ClientV2(base_url=base, api_key=api_key)
cohere_vectors = co.embed(model=model, input_type="image", embedding_types=["float"], images=[data_url(n) for n in files]).embeddings.float_

ranking = sorted(((cosine(text_vector, v), n) for v, n in zip(image_vectors, files)), reverse=True)
print(f"{query!r} ->", ", ".join(f"{n} {s:.3f}" for s, n in ranking))

failures = 0
for name, ours, theirs in zip(files, image_vectors, cohere_vectors):
    if cosine(ours, theirs) < 0.99999:
        print(f"FAIL {name}: OpenAI-route and Cohere-route embeddings differ")
        failures += 1
if expected:
    by_file = {i["file"]: i["image_embeds_normalized"] for i in expected["images"]}
    for name, ours in zip(files, image_vectors):
        c = cosine(ours, by_file[name])
        print(f"{name}: cosine to transformers {c:.6f}")
        failures += c < 0.999
    c = cosine(text_vector, expected["texts"][0]["text_embeds_normalized"])
    print(f"text: cosine to transformers {c:.6f}")
    failures += c < 0.9999
sys.exit(1 if failures else 0)
