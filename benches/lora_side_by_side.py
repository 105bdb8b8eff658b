#!/usr/bin/env python3
"""Eight fine-tunes served two ways, as a user would deploy them, on all-MiniLM-L6-v2:

  adapters     one server, --enable-lora --max-loras 8, the 8 PEFT adapters of
               `cargo bench --bench lora` (target/lora-bench/r16-a*; run that first)
  8 servers    8 servers side by side, one per fine-tune (the model folder each: a merged
               fine-tune has the base's size and cost)
  base         the adapters' server, every request to the base model

Each round sends 8 concurrent requests of 4 texts (~128 tokens each), one per fine-tune, and
times until all 8 have answered; rounds alternate between the setups. Prints medians, their
ratios, and each setup's resident memory. Loopback only; stops its servers on exit.

    python3 benches/lora_side_by_side.py [--rounds 10] [--binary target/release/poolserve]
"""
import argparse
import concurrent.futures
import glob
import json
import os
import signal
import socket
import statistics
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near the river".split()


def text(i):
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(110))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, args):
    port = free_port()
    process = subprocess.Popen(
        [binary, "serve", *args, "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return process, port
        except Exception:
            if process.poll() is not None:
                raise SystemExit(f"server exited: {args}")
            time.sleep(0.1)
    raise SystemExit("server not ready")


def embed(port, model, texts):
    body = json.dumps({"model": model, "input": texts}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        assert answer.status == 200


def round_trip(targets):
    """targets: (port, model, texts) per request, all sent at once; the wall time."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        list(pool.map(lambda t: embed(*t), targets))
    return time.perf_counter() - started


def rss_mib(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return total / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/release/poolserve"))
    parser.add_argument("--model", default=os.environ.get("POOLSERVE_MINILM", os.path.join(ROOT, "models/all-MiniLM-L6-v2")))
    args = parser.parse_args()
    adapters = sorted(glob.glob(os.path.join(ROOT, "target/lora-bench/r16-a*")))[:8]
    if len(adapters) < 8:
        raise SystemExit("run `cargo bench --bench lora` first (it writes target/lora-bench/r16-a*)")
    processes = []
    try:
        modules = [f"a{i}={path}" for i, path in enumerate(adapters)]
        lora, lora_port = start(args.binary, [args.model, "--served-model-name", "base", "--enable-lora", "--max-loras", "8", "--lora-modules", *modules])
        processes.append(lora)
        copies = [start(args.binary, [args.model, "--served-model-name", f"m{i}"]) for i in range(8)]
        processes.extend(p for p, _ in copies)
        batches = [[text(4 * i + j) for j in range(4)] for i in range(8)]
        setups = {
            "adapters": [(lora_port, f"a{i}", batches[i]) for i in range(8)],
            "8 servers": [(copies[i][1], f"m{i}", batches[i]) for i in range(8)],
            "base": [(lora_port, "base", batches[i]) for i in range(8)],
        }
        for targets in setups.values():
            round_trip(targets)
        times = {name: [] for name in setups}
        for _ in range(args.rounds):
            for name, targets in setups.items():
                times[name].append(round_trip(targets))
        medians = {name: statistics.median(t) for name, t in times.items()}
        print(f"8 fine-tunes × 4 texts of ~128 tokens, 8 concurrent requests, {args.rounds} interleaved rounds (median):")
        for name, m in medians.items():
            print(f"  {name:<10} {m * 1e3:8.1f} ms   {m / medians['base']:.2f}× base")
        print(f"  8 servers / adapters: {medians['8 servers'] / medians['adapters']:.2f}×")
        print(f"memory: adapters' server {rss_mib([lora.pid]):.0f} MiB RSS; 8 servers {rss_mib([p.pid for p, _ in copies]):.0f} MiB RSS")
    finally:
        for p in processes:
            p.send_signal(signal.SIGTERM)
        for p in processes:
            p.wait()


if __name__ == "__main__":
    main()
