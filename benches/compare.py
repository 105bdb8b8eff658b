#!/usr/bin/env python3
"""PyTorch / sentence-transformers side of the forward benchmark, on the same machine and shapes
as `cargo bench --bench forward` (all-MiniLM-L6-v2 unless MODEL_DIR is given, f32, 2 threads).

    python3 benches/compare.py [MODEL_DIR]     # default models/all-MiniLM-L6-v2

Needs torch, transformers and sentence-transformers (see docs/performance.md). Prints, per shape,
the median time of a transformers forward pass (`torch.inference_mode`) and its tokens/s, then
sentence-transformers `encode` throughput on short sentences (not with SKIP_ST=1, e.g. for the
bare backbones of benches/make_family_models.py). Run `cargo bench --bench forward` right after
and compare the lines of the same shape.
"""
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModel  # noqa: E402

THREADS = int(os.environ.get("BENCH_THREADS", "2"))
torch.set_num_threads(THREADS)
model_dir = sys.argv[1] if len(sys.argv) > 1 else "models/all-MiniLM-L6-v2"
# DTYPE=bfloat16 runs the model in bfloat16 (what `--dtype bfloat16` is compared with).
DTYPE = getattr(torch, os.environ.get("DTYPE", "float32"))
model = AutoModel.from_pretrained(model_dir, torch_dtype=DTYPE).eval()
vocab = model.config.vocab_size


def ids(seqs, length):
    rows = [[1000 + (s * 7919 + t * 104729) % (vocab - 1000) for t in range(length)] for s in range(seqs)]
    for r in rows:
        r[0], r[-1] = 101, 102
    return torch.tensor(rows)


def measure(fn, iterations):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


name = os.path.basename(os.path.normpath(model_dir))
print(f"PyTorch {torch.__version__}, {THREADS} threads, {name} forward (transformers, mean pooling)")
# SHAPES=8x128,1x16 runs only the shapes named (as `cargo bench --bench forward -- 8x128 1x16`).
only = [s for s in os.environ.get("SHAPES", "").split(",") if s]
for seqs, length, iterations in [(32, 128, 20), (1, 16, 200), (8, 128, 40)]:
    if only and f"{seqs}x{length}" not in only:
        continue
    # BENCH_ITERATIONS=N times every shape N times (large models), as the forward bench reads it.
    iterations = int(os.environ.get("BENCH_ITERATIONS", iterations))
    input_ids = ids(seqs, length)
    mask = torch.ones_like(input_ids)

    def forward():
        with torch.inference_mode():
            hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)

    median, p90 = measure(forward, iterations)
    print(f"{seqs:>3}x{length:<4} median {median * 1e3:8.2f} ms   p90 {p90 * 1e3:8.2f} ms   {seqs * length / median:8.0f} tokens/s")

if os.environ.get("SKIP_ST"):
    sys.exit(0)
try:
    from sentence_transformers import SentenceTransformer
except ImportError:
    sys.exit(0)
st = SentenceTransformer(model_dir, device="cpu")
sentences = [f"A man is eating food number {i} while the girl carries a baby." for i in range(512)]
st.encode(sentences[:64], batch_size=32)
start = time.perf_counter()
st.encode(sentences, batch_size=32)
elapsed = time.perf_counter() - start
print(f"sentence-transformers encode, batch 32: {len(sentences) / elapsed:.0f} sentences/s")
