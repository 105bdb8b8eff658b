#!/usr/bin/env python3
"""Long inputs, ours against transformers: one input of 2k, 8k and 16k tokens through a Qwen3
embedder shape (hidden 256, 4 layers, 4 heads of 64 over 2 KV heads, MLP 768, 32k positions,
random weights; last-token pooling, normalized), in interleaved rounds, seconds and peak memory.

    python3 benches/compare_long_inputs.py [--bin [NAME=]target/release/poolserve ...] [--lengths 2048,8192,16384]
        [--rounds 3] [--dtype float32] [--model DIR]

`--bin` may repeat (`--bin before=old/poolserve --bin after=target/release/poolserve`): each binary
serves the folder on its own port, and every round times each of them and then transformers, so
the ratios of a before/after pair come from the same minutes.

The folder is written once (transformers' `Qwen3Model(config).save_pretrained`, the tokenizer and
pooling files of the qwen3-embed-last fixture) into DIR (default target/bench-long-qwen3). Ours:
the release binary serving it on BENCH_THREADS threads (default 2, RAYON_NUM_THREADS), one `/v1/embeddings` request
of token ids at a time; transformers: `Qwen3Model` in float32 with SDPA attention on as many
torch threads, the last token's hidden state normalized, under `torch.inference_mode()`. Every
round checks our vector against transformers' (cosine printed). Memory: the server's peak RSS
(VmHWM) after each length, and the peak RSS of this process for transformers, both growing
with the longest input so far (the lengths run in ascending order). Needs torch and
transformers.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "models", "qwen3-embed-last")
THREADS = int(os.environ.get("BENCH_THREADS", "2"))

parser = argparse.ArgumentParser()
parser.add_argument("--bin", action="append", help="[NAME=]PATH of a poolserve binary; may repeat")
parser.add_argument("--model", default=os.path.join(REPO, "target", "bench-long-qwen3"))
parser.add_argument("--lengths", default="2048,8192,16384")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--dtype", default="float32", help="our --dtype (transformers always runs float32)")
args = parser.parse_args()
lengths = [int(n) for n in args.lengths.split(",")]
binaries = [(b.split("=", 1) if "=" in b else ("ours", b)) for b in (args.bin or [os.path.join(REPO, "target", "release", "poolserve")])]


def log(message):
    print(message, file=sys.stderr, flush=True)


def make_folder(path):
    import torch
    from transformers import Qwen3Config, Qwen3Model

    if os.path.exists(os.path.join(path, "model.safetensors")):
        return
    os.makedirs(path, exist_ok=True)
    config = Qwen3Config(
        vocab_size=1000, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=32768, eos_token_id=0, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3Model(config).eval().save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "modules.json", "1_Pooling"):
        source = os.path.join(FIXTURE, name)
        (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, os.path.join(path, name))
    sentence = json.load(open(os.path.join(FIXTURE, "sentence_bert_config.json")))
    sentence["max_seq_length"] = 32768
    json.dump(sentence, open(os.path.join(path, "sentence_bert_config.json"), "w"))


def vm_hwm_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    import resource

    import torch
    from transformers import Qwen3Model

    make_folder(args.model)
    torch.set_num_threads(THREADS)
    reference = Qwen3Model.from_pretrained(args.model, attn_implementation="sdpa", dtype=torch.float32).eval()
    servers = []
    try:
        for name, binary in binaries:
            port = socket.socket()
            port.bind(("127.0.0.1", 0))
            port_number = port.getsockname()[1]
            port.close()
            server = subprocess.Popen(
                [binary, "serve", args.model, "--served-model-name", "long-qwen3", "--host", "127.0.0.1", "--port", str(port_number),
                 "--dtype", args.dtype, "--max-model-len", str(max(lengths))],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(args.model, f"server-{name}.log"), "w"),
                env={**os.environ, "RAYON_NUM_THREADS": str(THREADS)},
            )
            servers.append((name, server, f"http://127.0.0.1:{port_number}"))
        for name, server, base in servers:
            for _ in range(600):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1)
                    break
                except Exception:
                    if server.poll() is not None:
                        sys.exit(f"the server {name} exited: see {args.model}/server-{name}.log")
                    time.sleep(0.2)
        rows = []
        rng = np.random.default_rng(0)
        for n in lengths:
            ids = [int(i) for i in rng.integers(1, 1000, n)]
            ours_s = {name: [] for name, _, _ in servers}
            worst = {name: 1.0 for name, _, _ in servers}
            theirs_s = []
            for r in range(args.rounds):
                vectors = {}
                for name, _, base in servers:
                    started = time.perf_counter()
                    body = json.dumps({"input": [ids], "model": "long-qwen3"}).encode()
                    request = urllib.request.Request(base + "/v1/embeddings", body, {"Content-Type": "application/json"})
                    reply = json.load(urllib.request.urlopen(request, timeout=3600))
                    ours_s[name].append(time.perf_counter() - started)
                    vectors[name] = np.array(reply["data"][0]["embedding"], dtype=np.float64)
                started = time.perf_counter()
                with torch.inference_mode():
                    hidden = reference(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
                theirs_s.append(time.perf_counter() - started)
                theirs = torch.nn.functional.normalize(hidden, dim=-1).double().numpy()
                line = []
                for name, ours in vectors.items():
                    cosine = float(ours @ theirs / np.linalg.norm(ours) / np.linalg.norm(theirs))
                    worst[name] = min(worst[name], cosine)
                    line.append(f"{name} {ours_s[name][-1]:.2f} s (cosine {cosine:.6f})")
                log(f"{n} tokens, round {r + 1}: {', '.join(line)}, transformers {theirs_s[-1]:.2f} s")
            theirs_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            for name, server, _ in servers:
                rows.append((name, n, statistics.median(ours_s[name]), statistics.median(theirs_s), worst[name], vm_hwm_mib(server.pid), theirs_mib))
        print(f"| binary | tokens | ours {args.dtype} s | transformers f32 s | ours / transformers (time) | worst cosine | ours peak RSS MiB | transformers peak RSS MiB |")
        print("|---|---|---|---|---|---|---|---|")
        for name, n, ours, theirs, worst_cosine, ours_mib, theirs_mib in rows:
            print(f"| {name} | {n} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}× | {worst_cosine:.6f} | {ours_mib:.0f} | {theirs_mib:.0f} |")
    finally:
        for _, server, _ in servers:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
