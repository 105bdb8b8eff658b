#!/usr/bin/env python3
"""Every CPU engine on one corpus, in interleaved rounds: sentence-transformers, ONNX Runtime
(f32 optimized graph, int8 dynamic quantization), OpenVINO (f32 precision hint, its default
precision, which is bf16 on CPUs with native bf16, and int8 from NNCF) and our servers, the same
texts through each, round after round, so that the machine's drift falls on all of them alike.

    python3 benches/compare_engines.py MODEL_DIR --ours f32=http://127.0.0.1:PORT [--ours bf16=URL ...]
        [--corpus CORPUS.json] [--texts 512] [--rounds 5] [--engines st,ort-f32,...]

Each engine turns the texts into L2-normalized mean-pooled embeddings, timed from raw texts:
- the Python engines tokenize (the folder's fast tokenizer, truncated at max_seq_length), sort
  by length, and run batches of 32 padded to the batch's longest (sentence-transformers:
  `encode(batch_size=32)`, which does the same);
- ours get the same length-sorted batches of 32 texts, one `/v1/embeddings` request at a time
  (base64 floats), so each engine has one batch in flight on BENCH_THREADS threads (default 2;
  start the servers with as many).
Every engine's embeddings are checked against sentence-transformers f32 (worst cosine printed).
The corpus: CORPUS.json (a JSON list, e.g. `loadgen --dump-corpus`'s) or, by default, `--texts`
deterministic texts of 8 to 300 words. OpenVINO reads the ONNX export benches/compare_ort.py makes
(run first if missing); its int8 model is `nncf.quantize` (model_type TRANSFORMER, preset MIXED,
300 calibration texts from the corpus). Needs torch, transformers, sentence-transformers, onnx,
onnxruntime, openvino and nncf. Prints one line per engine and round, then a table of medians.
"""
import argparse
import base64
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
BATCH = 32

parser = argparse.ArgumentParser()
parser.add_argument("model_dir")
parser.add_argument("--ours", action="append", default=[], help="LABEL=URL of a running poolserve serving MODEL_DIR")
parser.add_argument("--corpus")
parser.add_argument("--texts", type=int, default=512)
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--engines", default="st,ort-f32,ort-int8,ov-f32,ov-default,ov-int8")
args = parser.parse_args()
model_dir = args.model_dir.rstrip("/")
name = os.path.basename(model_dir)
config = json.load(open(os.path.join(model_dir, "config.json")))


def log(message):
    print(message, file=sys.stderr, flush=True)


def corpus():
    if args.corpus:
        return json.load(open(args.corpus))[: args.texts]
    rng = random.Random(7)
    words = (
        "the of and to in is was for on that with as by at from his an were are which this be or had not but "
        "first one their its new after who they have her she two been other when there all during into school "
        "time may years more most only over city some world would where later up such used many can state about "
        "national out known university united then made team search model data retrieval vector embedding query "
        "document server request memory network language system people water river music film game history"
    ).split()
    lengths = [int(8 * (300 / 8) ** rng.random()) for _ in range(args.texts)]
    return [" ".join(rng.choice(words) for _ in range(n)).capitalize() + "." for n in lengths]


texts = corpus()
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

torch.set_num_threads(THREADS)
st = SentenceTransformer(model_dir, device="cpu")
limit = st.max_seq_length
tokenizer = AutoTokenizer.from_pretrained(model_dir)
encoded = tokenizer(texts, truncation=True, max_length=limit)
rows, types = encoded["input_ids"], encoded.get("token_type_ids")
tokens = sum(len(r) for r in rows)
order = sorted(range(len(texts)), key=lambda i: -len(rows[i]))
batches = [order[s:s + BATCH] for s in range(0, len(order), BATCH)]


def pooled_pipeline(run):
    """Texts -> embeddings through `run(input_ids, mask, type_ids) -> last_hidden_state`."""
    encoded = tokenizer(texts, truncation=True, max_length=limit)
    rows, types = encoded["input_ids"], encoded.get("token_type_ids")
    pad = tokenizer.pad_token_id or 0
    out = np.empty((len(rows), config["hidden_size"]), dtype=np.float32)
    for chunk in batches:
        width = max(len(rows[i]) for i in chunk)
        input_ids = np.full((len(chunk), width), pad, dtype=np.int64)
        mask = np.zeros((len(chunk), width), dtype=np.int64)
        type_ids = np.zeros((len(chunk), width), dtype=np.int64)
        for r, i in enumerate(chunk):
            n = len(rows[i])
            input_ids[r, :n], mask[r, :n] = rows[i], 1
            if types is not None:
                type_ids[r, :n] = types[i]
        hidden = run(input_ids, mask, type_ids)
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        out[chunk] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return out


def onnx_files():
    cache = os.path.join(REPO, "target", "compare", "onnx", name)
    files = [os.path.join(cache, f) for f in ("model.onnx", "model-opt.onnx", "model-int8.onnx")]
    if not all(os.path.exists(f) for f in files):
        log("making the ONNX files with benches/compare_ort.py")
        subprocess.run([sys.executable, os.path.join(REPO, "benches", "compare_ort.py"), model_dir, "--no-forward"], check=True, stdout=subprocess.DEVNULL)
    return files


def ort_engine(path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}

    def run(input_ids, mask, type_ids):
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = type_ids
        return sess.run(None, feed)[0]

    return lambda: pooled_pipeline(run), f"ONNX Runtime {ort.__version__}"


def ov_engine(path, precision):
    import openvino as ov

    core = ov.Core()
    model = core.read_model(path)
    if precision == "int8":
        import nncf

        samples = []
        for chunk in batches[: max(1, 300 // BATCH)]:
            width = max(len(rows[i]) for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for r, i in enumerate(chunk):
                ids[r, : len(rows[i])], mask[r, : len(rows[i])] = rows[i], 1
            samples.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        model = nncf.quantize(model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER, preset=nncf.QuantizationPreset.MIXED, subset_size=len(samples) * BATCH)
    properties = {"INFERENCE_NUM_THREADS": THREADS}
    if precision == "f32":
        properties["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(model, "CPU", properties)
    request = compiled.create_infer_request()
    names = {i.get_any_name() for i in compiled.inputs}

    def run(input_ids, mask, type_ids):
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = type_ids
        return request.infer(feed)[compiled.outputs[0]]

    actual = compiled.get_property("INFERENCE_PRECISION_HINT")
    return lambda: pooled_pipeline(run), f"OpenVINO {ov.__version__} ({precision}; computes in {actual})"


def ours_engine(url):
    url = url.rstrip("/") + "/v1/embeddings"

    def run():
        out = np.empty((len(texts), config["hidden_size"]), dtype=np.float32)
        for chunk in batches:
            body = json.dumps({"input": [texts[i] for i in chunk], "encoding_format": "base64", "truncate_prompt_tokens": -1}).encode()
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request) as reply:
                data = json.load(reply)["data"]
            for r, d in enumerate(data):
                out[chunk[r]] = np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32)
        return out

    return run, f"poolserve at {url}"


def st_engine():
    return lambda: st.encode(texts, batch_size=BATCH, normalize_embeddings=True), "sentence-transformers f32"


raw, opt, int8 = onnx_files() if any(e.startswith(("ort", "ov")) for e in args.engines.split(",")) else (None,) * 3
makers = {
    "st": st_engine,
    "ort-f32": lambda: ort_engine(opt),
    "ort-int8": lambda: ort_engine(int8),
    "ov-f32": lambda: ov_engine(raw, "f32"),
    "ov-default": lambda: ov_engine(raw, "default"),
    "ov-int8": lambda: ov_engine(raw, "int8"),
}
engines = {e: makers[e]() for e in args.engines.split(",") if e}
for spec in args.ours:
    label, url = spec.split("=", 1)
    engines[f"ours-{label}"] = ours_engine(url)

print(f"{len(texts)} texts, {tokens} tokens, batches of {BATCH}, {THREADS} threads, {args.rounds} interleaved rounds; {name}")
reference = st.encode(texts, batch_size=BATCH, normalize_embeddings=True)
rates = {e: [] for e in engines}
cosines = {}
for label, (run, what) in engines.items():
    out = run()  # warm-up, and the accuracy check
    cosines[label] = float(np.min(np.sum(out * reference, axis=1) / np.linalg.norm(out, axis=1) / np.linalg.norm(reference, axis=1)))
    print(f"{label}: {what}; worst cosine to sentence-transformers {cosines[label]:.6f}", flush=True)
for round_ in range(1, args.rounds + 1):
    for label, (run, _) in engines.items():
        start = time.perf_counter()
        run()
        rate = len(texts) / (time.perf_counter() - start)
        rates[label].append(rate)
        print(f"round {round_} {label}: {rate:.1f} seq/s", flush=True)
print("| engine | seq/s (median) | rounds | worst cosine to ST |")
print("|---|---|---|---|")
for label in engines:
    print(f"| {label} | {statistics.median(rates[label]):.1f} | {' '.join(f'{r:.0f}' for r in rates[label])} | {cosines[label]:.6f} |")
