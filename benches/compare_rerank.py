#!/usr/bin/env python3
"""sentence-transformers side of `cargo bench --bench rerank`: the same query and 32 documents
(benches/data/rerank.json) through `CrossEncoder.predict` (batch 32, 2 threads) on the
MiniLM-sized cross-encoder the Rust benchmark builds in target/minilm-cross-encoder, and through
`SentenceTransformer.encode` + cosine on all-MiniLM-L6-v2 (the bi-encoder path).

    cargo bench --bench rerank        # builds target/minilm-cross-encoder, prints our numbers
    python3 benches/compare_rerank.py [MINILM_DIR] [CROSS_ENCODER_DIR]
"""
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from sentence_transformers import CrossEncoder, SentenceTransformer  # noqa: E402

torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
minilm = sys.argv[1] if len(sys.argv) > 1 else "models/all-MiniLM-L6-v2"
cross_dir = sys.argv[2] if len(sys.argv) > 2 else "target/minilm-cross-encoder"
corpus = json.load(open("benches/data/rerank.json"))
query, documents = corpus["query"], corpus["documents"]
pairs = [(query, d) for d in documents]


def median_time(fn, iterations=20):
    for _ in range(2):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


cross = CrossEncoder(cross_dir, device="cpu")
tokens = sum(len(cross.tokenizer(q, d)["input_ids"]) for q, d in pairs)
t = median_time(lambda: cross.predict(pairs, batch_size=32))
print(f"rerank 1 query x {len(documents)} documents, torch {torch.__version__}, {torch.get_num_threads()} threads")
print(f"{'CrossEncoder.predict':<32} median {t * 1e3:8.2f} ms   {len(pairs) / t:6.0f} pairs/s   {tokens / t:6.0f} tokens/s")

bi = SentenceTransformer(minilm, device="cpu")
texts = [query] + documents
bi_tokens = sum(len(bi.tokenizer(x)["input_ids"]) for x in texts)


def bi_scores():
    e = bi.encode(texts, batch_size=32, convert_to_tensor=True, normalize_embeddings=True)
    return e[1:] @ e[0]


t = median_time(bi_scores)
print(f"{'SentenceTransformer.encode+cos':<32} median {t * 1e3:8.2f} ms   {len(pairs) / t:6.0f} pairs/s   {bi_tokens / t:6.0f} tokens/s")
