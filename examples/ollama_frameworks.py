#!/usr/bin/env python3
"""Embed through poolserve's Ollama API with the Ollama embedders of LangChain and LlamaIndex,
configured as their documentation shows for a local Ollama, only the base URL changed.

    pip install langchain-ollama llama-index-embeddings-ollama
    poolserve serve sentence-transformers/all-MiniLM-L6-v2 --served-model-name all-minilm
    OLLAMA_HOST=http://localhost:8000 python3 examples/ollama_frameworks.py

Both classes call the `ollama` client's `embed` with their own `options` and `keep_alive`
(LangChain adds `dimensions`; LangChain's `validate_model_on_init` lists the models first).
Exits non-zero unless every vector matches sentence-transformers' (cosine >= 0.9999, from
tests/fixtures/expected/all-MiniLM-L6-v2-quantized.json, made by
tests/fixtures/make_minilm_quantized.py), synchronously and through the async clients, and an
instruction LlamaIndex prepends is embedded as the text it sends.
"""
import asyncio
import json
import math
import os
import sys

import ollama
from langchain_ollama import OllamaEmbeddings
from llama_index.embeddings.ollama import OllamaEmbedding

here = os.path.dirname(os.path.abspath(__file__))
reference = json.load(open(os.path.join(here, "..", "tests", "fixtures", "expected", "all-MiniLM-L6-v2-quantized.json")))
texts, expected = reference["texts"], reference["float"]
base_url = os.environ.get("OLLAMA_HOST", "http://localhost:8000")
model = ollama.Client(host=base_url).list().models[0].model


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def check(what, got, want):
    if len(got) != len(want):
        sys.exit(f"{what}: {len(got)} vectors for {len(want)} texts")
    worst = min(cosine(g, w) for g, w in zip(got, want))
    print(f"{what:<48} {len(got)} vectors, worst cosine to sentence-transformers {worst:.6f}")
    if worst < 0.9999:
        sys.exit(f"{what}: differs from the reference (cosine {worst})")


langchain = OllamaEmbeddings(model=model, base_url=base_url, validate_model_on_init=True, keep_alive=300)
check("LangChain OllamaEmbeddings.embed_documents", langchain.embed_documents(texts), expected)
check("LangChain OllamaEmbeddings.embed_query", [langchain.embed_query(texts[1])], expected[1:2])
check("LangChain OllamaEmbeddings.aembed_documents", asyncio.run(langchain.aembed_documents(texts)), expected)
short = OllamaEmbeddings(model=model, base_url=base_url, dimensions=64).embed_query(texts[0])
if len(short) != 64 or cosine(short, expected[0][:64]) < 0.9999:
    sys.exit("LangChain dimensions=64: not the cut, renormalized vector")
try:
    OllamaEmbeddings(model="no-such-model", base_url=base_url, validate_model_on_init=True)
    sys.exit("LangChain: an unknown model passed validate_model_on_init")
except ValueError as e:
    if "Model `no-such-model` not found in Ollama" not in str(e):
        sys.exit(f"LangChain: unexpected refusal {e}")
    print("LangChain refuses an unknown model: Model `no-such-model` not found in Ollama")

llamaindex = OllamaEmbedding(model_name=model, base_url=base_url, keep_alive="5m")
check("LlamaIndex OllamaEmbedding.get_text_embedding_batch", llamaindex.get_text_embedding_batch(texts), expected)
check("LlamaIndex OllamaEmbedding.get_query_embedding", [llamaindex.get_query_embedding(texts[2])], expected[2:3])
check("LlamaIndex OllamaEmbedding.aget_text_embedding", [asyncio.run(llamaindex.aget_text_embedding(texts[0]))], expected[:1])
instructed = OllamaEmbedding(model_name=model, base_url=base_url, query_instruction="query:")
sent = ollama.Client(host=base_url).embed(model=model, input=f"query: {texts[0]}").embeddings
check("LlamaIndex query_instruction = the text it sends", [instructed.get_query_embedding(texts[0])], sent)
print("LangChain and LlamaIndex Ollama embedders: ok")
