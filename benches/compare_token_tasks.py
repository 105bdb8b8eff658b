#!/usr/bin/env python3
"""transformers side of `cargo bench --bench token_tasks`: the 32 documents of
benches/data/rerank.json as one padded batch, 2 threads, through BertForMaskedLM + SPLADE
(max over tokens of log1p(relu(logits)), padding masked) on splade-tiny, and through
BertForTokenClassification + softmax on rampart-ner.

    python3 benches/compare_token_tasks.py [MODELS_DIR]     # default models/
"""
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModelForMaskedLM, AutoModelForTokenClassification, AutoTokenizer  # noqa: E402

torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
root = sys.argv[1] if len(sys.argv) > 1 else "models"
documents = json.load(open("benches/data/rerank.json"))["documents"]


def median_time(fn, iterations=20):
    for _ in range(2):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


print(f"{len(documents)} documents per batch, torch {torch.__version__}, {torch.get_num_threads()} threads")
for label, name, loader in [
    ("SPLADE (splade-tiny)", "splade-tiny", AutoModelForMaskedLM),
    ("token classification (rampart-ner)", "rampart-ner", AutoModelForTokenClassification),
]:
    folder = os.path.join(root, name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = loader.from_pretrained(folder).eval()
    tokens = sum(len(tokenizer(d)["input_ids"]) for d in documents)

    def run():
        batch = tokenizer(documents, padding=True, truncation=True, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**batch).logits
            if loader is AutoModelForMaskedLM:
                weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"][..., None]
                return weights.max(dim=1).values
            return torch.softmax(logits, -1)

    t = median_time(run)
    print(f"{label:<36} median {t * 1e3:8.2f} ms   {len(documents) / t:6.0f} texts/s   {tokens / t:6.0f} tokens/s")
