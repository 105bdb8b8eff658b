#!/usr/bin/env python3
"""sentence-transformers side of the end-to-end comparison: `SentenceTransformer.encode` (batch
32, 2 threads) on the exact corpus the load generator sent (`--dump-corpus`).

    python3 benches/compare_server.py CORPUS.json [MODEL_DIR]
"""
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
texts = json.load(open(sys.argv[1]))
model = SentenceTransformer(sys.argv[2] if len(sys.argv) > 2 else "models/all-MiniLM-L6-v2", device="cpu")
tokens = sum(len(ids) for ids in model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"])
model.encode(texts[:64], batch_size=32)  # warm-up
start = time.perf_counter()
model.encode(texts, batch_size=32)
elapsed = time.perf_counter() - start
print(f"sentence-transformers encode: {len(texts)} texts, batch 32, {torch.get_num_threads()} threads")
print(f"throughput {len(texts) / elapsed:.1f} sequences/s, {tokens / elapsed:.0f} tokens/s ({tokens} tokens in {elapsed:.2f} s)")
