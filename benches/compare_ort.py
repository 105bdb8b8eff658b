#!/usr/bin/env python3
"""ONNX Runtime side of the speed comparison (benches/compare.sh): the same model, shapes, ids and
iteration counts as benches/compare.py and `cargo bench --bench forward`, through ORT in float32
(transformer-optimized graph) and int8 (dynamic quantization).

    python3 benches/compare_ort.py MODEL_DIR [--corpus CORPUS.json] [--no-forward]

Needs torch, transformers, onnx and onnxruntime (see docs/performance.md). Once per model (cached
in target/compare/onnx/<model folder name>/, redone when model.safetensors is newer):
  1. model.onnx: `torch.onnx.export` (TorchScript exporter, opset 14) of the transformers model
     with eager attention; inputs input_ids / attention_mask / token_type_ids, output
     last_hidden_state, batch and sequence axes dynamic;
  2. model-opt.onnx: `onnxruntime.transformers.optimizer.optimize_model(model_type="bert")` with
     num_heads / hidden_size from config.json (fused attention, LayerNorm, GELU);
  3. model-int8.onnx: `onnxruntime.quantization.quantize_dynamic` of model-opt.onnx with
     QInt8 weights (ORT's defaults otherwise, plus DefaultTensorType FLOAT, without which it
     fails on the fused graph).
Sessions: CPU, intra-op threads BENCH_THREADS (default 2), inter-op 1, all graph optimizations.

Before timing it checks the mean-pooled output of both against PyTorch on a padded batch (float32
must reach cosine >= 0.9999, else it exits 1; int8's worst cosine is printed). Then, per
precision, the forward benchmark (forward + mean pooling in numpy), one line per shape in
compare.py's format. With --corpus (the file `loadgen --dump-corpus` wrote), the end-to-end
pipeline on those texts: tokenize (the model's fast tokenizer, truncated to the model's
max_seq_length like sentence-transformers, else 512) -> sort by length -> batches of 32 padded
to the batch's longest -> ORT -> mean pooling -> L2 normalization, timed from raw texts to
embeddings after a warm-up on the first 64 texts. `--no-forward` skips the forward benchmark.
BENCH_ITERATIONS_SCALE (default 1) scales the iteration counts, for smoke tests only.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

THREADS = int(os.environ.get("BENCH_THREADS", "2"))
SCALE = float(os.environ.get("BENCH_ITERATIONS_SCALE", "1"))
SHAPES = [(32, 128, 20), (1, 16, 200), (8, 128, 40)]  # as in benches/compare.py and forward.rs
BATCH = 32
INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("model_dir")
parser.add_argument("--corpus", help="JSON list of texts (loadgen --dump-corpus) for the end-to-end pipeline")
parser.add_argument("--no-forward", action="store_true", help="skip the forward benchmark")
args = parser.parse_args()
model_dir = args.model_dir
name = os.path.basename(os.path.normpath(model_dir))
config = json.load(open(os.path.join(model_dir, "config.json")))
torch.set_num_threads(THREADS)


def log(message):
    print(message, file=sys.stderr, flush=True)


def fresh(path, *sources):
    """path exists and is at least as new as every source."""
    return os.path.exists(path) and all(os.path.getmtime(path) >= os.path.getmtime(s) for s in sources if os.path.exists(s))


def export(path):
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    # A padded row, so the attention-mask path is traced, not constant-folded away.
    input_ids = torch.tensor([[101] + [2000 + i for i in range(14)] + [102]] * 2)
    mask = torch.ones_like(input_ids)
    mask[1, 8:] = 0
    axes = {n: {0: "batch", 1: "sequence"} for n in INPUTS + ["last_hidden_state"]}
    options = dict(input_names=INPUTS, output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=14, do_constant_folding=True)
    with torch.no_grad():
        try:
            torch.onnx.export(Encoder(model), (input_ids, mask, torch.zeros_like(input_ids)), path, dynamo=False, **options)
        except TypeError:  # torch < 2.5 has no `dynamo` argument (and only this exporter)
            torch.onnx.export(Encoder(model), (input_ids, mask, torch.zeros_like(input_ids)), path, **options)


def prepare():
    """The three ONNX files, made once per model (see the module docstring)."""
    cache = os.path.join(REPO, "target", "compare", "onnx", name)
    os.makedirs(cache, exist_ok=True)
    raw, opt, int8 = (os.path.join(cache, f) for f in ("model.onnx", "model-opt.onnx", "model-int8.onnx"))
    weights = os.path.join(model_dir, "model.safetensors")
    if not fresh(raw, weights):
        log(f"exporting {model_dir} to {raw}")
        export(raw + ".tmp")
        os.replace(raw + ".tmp", raw)
    if not fresh(opt, raw):
        from onnxruntime.transformers.optimizer import optimize_model

        log(f"optimizing {raw} (model_type bert)")
        optimized = optimize_model(raw, model_type="bert", num_heads=config["num_attention_heads"], hidden_size=config["hidden_size"])
        optimized.save_model_to_file(opt + ".tmp")
        os.replace(opt + ".tmp", opt)
    if not fresh(int8, opt):
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        log(f"quantizing {opt} (dynamic, QInt8 weights)")
        # ONNX shape inference gives no types past the fused com.microsoft ops, and without this
        # fallback the quantizer stops ("Unable to find data type for weight_name ..."; ORT PR
        # #19455, sentence-transformers issue #2598).
        extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
        quantize_dynamic(opt, int8 + ".tmp", weight_type=QuantType.QInt8, extra_options=extra)
        os.replace(int8 + ".tmp", int8)
    return opt, int8


def op_counts(path):
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    counts = {}
    for node in graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def encode(sess, input_ids, mask, type_ids=None):
    """Forward + mean pooling over the real tokens, as compare.py does in torch."""
    feed = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids) if type_ids is None else type_ids}
    hidden = sess.run(["last_hidden_state"], feed)[0]
    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)


def ids(seqs, length):
    """benches/compare.py's and forward.rs's deterministic ids."""
    vocab = config["vocab_size"]
    rows = [[1000 + (s * 7919 + t * 104729) % (vocab - 1000) for t in range(length)] for s in range(seqs)]
    for r in rows:
        r[0], r[-1] = 101, 102
    return np.array(rows, dtype=np.int64)


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


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def check(f32, int8, tokenizer):
    """Worst per-row cosine of ORT's mean-pooled outputs against PyTorch (transformers, as
    benches/compare.py runs it) on a padded batch of real sentences and on benchmark ids."""
    sentences = [
        "A man is eating food.",
        "A man is riding a white horse on an enclosed ground while the crowd watches from the stands.",
        "The new movie is awesome.",
        "Two men pushed carts through the woods.",
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
        "hello",
        "Transformers compute contextual embeddings of every token; mean pooling averages them over the real tokens only.",
        "A cheetah is running behind its prey.",
    ]
    batch = tokenizer(sentences, padding=True, return_tensors="np")
    cases = [
        (batch["input_ids"].astype(np.int64), batch["attention_mask"].astype(np.int64)),
        (ids(4, 64), np.ones((4, 64), dtype=np.int64)),
    ]
    reference = AutoModel.from_pretrained(model_dir).eval()
    worst = {"f32": 1.0, "int8": 1.0}
    for input_ids, mask in cases:
        with torch.inference_mode():
            t_ids, t_mask = torch.from_numpy(input_ids), torch.from_numpy(mask)
            hidden = reference(input_ids=t_ids, attention_mask=t_mask).last_hidden_state
            expected = ((hidden * t_mask.unsqueeze(-1)).sum(1) / t_mask.sum(1, keepdim=True)).numpy()
        for label, sess in [("f32", f32), ("int8", int8)]:
            worst[label] = min(worst[label], float(cosines(encode(sess, input_ids, mask), expected).min()))
    del reference
    gc.collect()
    rows = len(sentences) + 4
    print(f"check vs PyTorch, mean-pooled, {rows} sequences (padded batch + benchmark ids): worst cosine f32 {worst['f32']:.6f}, int8 {worst['int8']:.4f}")
    if worst["f32"] < 0.9999:
        log(f"ORT float32 output differs from PyTorch (worst cosine {worst['f32']:.6f} < 0.9999): not benchmarking a wrong model")
        sys.exit(1)


def forward_benchmark(label, sess):
    print(f"ORT {ort.__version__} {label}, {THREADS} threads, {name} forward (mean pooling)")
    for seqs, length, iterations in SHAPES:
        input_ids = ids(seqs, length)
        mask = np.ones_like(input_ids)
        type_ids = np.zeros_like(input_ids)
        median, p90 = measure(lambda: encode(sess, input_ids, mask, type_ids), max(1, round(iterations * SCALE)))
        print(f"{seqs:>3}x{length:<4} median {median * 1e3:8.2f} ms   p90 {p90 * 1e3:8.2f} ms   {seqs * length / median:8.0f} tokens/s", flush=True)


def max_length(tokenizer):
    """sentence-transformers' rule: max_seq_length if the folder sets it, else the tokenizer's and
    the position table's limit, at most 512."""
    path = os.path.join(model_dir, "sentence_bert_config.json")
    if os.path.exists(path):
        limit = json.load(open(path)).get("max_seq_length")
        if limit:
            return int(limit)
    return min(512, tokenizer.model_max_length, config.get("max_position_embeddings", 512))


def pipeline(sess, tokenizer, texts, limit):
    """Texts -> L2-normalized mean-pooled embeddings, in input order; returns (embeddings, tokens)."""
    encoded = tokenizer(texts, truncation=True, max_length=limit)
    rows = encoded["input_ids"]
    types = encoded.get("token_type_ids")
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    pad = tokenizer.pad_token_id or 0
    out = np.empty((len(rows), config["hidden_size"]), dtype=np.float32)
    for start in range(0, len(order), BATCH):
        chunk = order[start:start + BATCH]
        width = max(len(rows[i]) for i in chunk)
        input_ids = np.full((len(chunk), width), pad, dtype=np.int64)
        mask = np.zeros((len(chunk), width), dtype=np.int64)
        type_ids = np.zeros((len(chunk), width), dtype=np.int64)
        for r, i in enumerate(chunk):
            n = len(rows[i])
            input_ids[r, :n] = rows[i]
            mask[r, :n] = 1
            if types is not None:
                type_ids[r, :n] = types[i]
        pooled = encode(sess, input_ids, mask, type_ids)
        out[chunk] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return out, sum(len(r) for r in rows)


def end_to_end(label, sess, tokenizer, texts):
    limit = max_length(tokenizer)
    pipeline(sess, tokenizer, texts[:64], limit)  # warm-up
    start = time.perf_counter()
    _, tokens = pipeline(sess, tokenizer, texts, limit)
    elapsed = time.perf_counter() - start
    print(
        f"ORT {label} end to end: {len(texts) / elapsed:.1f} sentences/s, {tokens / elapsed:.0f} tokens/s "
        f"({len(texts)} texts, {tokens} tokens in {elapsed:.2f} s; batch {BATCH}, max {limit} tokens, {THREADS} threads)",
        flush=True,
    )


opt_path, int8_path = prepare()
f32_session, int8_session = session(opt_path), session(int8_path)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
fused = op_counts(opt_path)
print(
    f"ORT {ort.__version__}, {name}: optimized graph "
    + ", ".join(f"{op} x{fused[op]}" for op in ["EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu"] if fused.get(op))
)
check(f32_session, int8_session, tokenizer)
if not args.no_forward:
    forward_benchmark("f32 (optimized graph)", f32_session)
    forward_benchmark("int8 (dynamic quantization)", int8_session)
if args.corpus:
    texts = json.load(open(args.corpus))
    end_to_end("f32", f32_session, tokenizer, texts)
    end_to_end("int8", int8_session, tokenizer, texts)
