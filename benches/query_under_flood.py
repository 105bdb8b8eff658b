"""A person's query while indexing runs (issue 70): one-sentence queries against a flood of
bulk requests, on one server; the queries' latency and the model's throughput (tokens/s from /metrics).

FLOODERS clients each send, back to back, /v1/embeddings requests of 1,024 texts of about 200
tokens; one client sends a one-sentence query every 250 ms and times it. Each round runs for
SECONDS; with several binaries (a change's before and after), rounds alternate between them so
the machine's drift hits all alike.

    python benches/query_under_flood.py MODEL BINARY [BINARY ...] [--rounds N] [--seconds S] [-- SERVE FLAGS]
"""

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

FLOODERS = 3
BULK_TEXTS = 1024
QUERY = "How do I reset my password?"
WORDS = ("the index holds every chunk of the manual with its section title page number and a short "
         "summary written by the team so that search can find the right passage quickly").split()


def bulk_text(seed):
    # About 200 MiniLM tokens: 160 words of this vocabulary.
    return " ".join(WORDS[(seed * 13 + i * 7) % len(WORDS)] for i in range(160))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(connection, body):
    connection.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {payload[:200]!r}")


def serve(binary, model, flags):
    port = free_port()
    server = subprocess.Popen([binary, "serve", model, "--port", str(port), "--host", "127.0.0.1", *flags],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return server, port
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit(f"{binary} did not start")


def tokens_run(port):
    """Tokens the models ran in forward batches (`poolserve_batch_tokens_sum`), all models."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("poolserve_batch_tokens_sum{"))


def round_of(binary, model, flags, seconds):
    server, port = serve(binary, model, flags)
    stop = threading.Event()
    bodies = [json.dumps({"input": [bulk_text(c * BULK_TEXTS + i) for i in range(BULK_TEXTS)]}) for c in range(FLOODERS)]

    def flood(body):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while not stop.is_set():
            try:
                post(c, body)
            except (OSError, http.client.HTTPException):
                return  # the server stopped at the end of the round

    threads = [threading.Thread(target=flood, args=(b,), daemon=True) for b in bodies]
    for t in threads:
        t.start()
    time.sleep(2.0)  # the flood is under way
    start_tokens, started = tokens_run(port), time.time()
    latencies = []
    q = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"input": QUERY})
    while time.time() - started < seconds:
        t0 = time.perf_counter()
        post(q, body)
        latencies.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.25)
    throughput = (tokens_run(port) - start_tokens) / (time.time() - started)
    stop.set()
    server.terminate()
    server.wait()
    return latencies, throughput


def main():
    args = sys.argv[1:]
    flags = []
    if "--" in args:
        flags = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    rounds, seconds = 3, 20.0
    if "--rounds" in args:
        i = args.index("--rounds"); rounds = int(args[i + 1]); del args[i:i + 2]
    if "--seconds" in args:
        i = args.index("--seconds"); seconds = float(args[i + 1]); del args[i:i + 2]
    model, binaries = args[0], args[1:]
    results = {b: ([], []) for b in binaries}
    for r in range(rounds):
        for binary in binaries:
            latencies, throughput = round_of(binary, model, flags, seconds)
            results[binary][0].extend(latencies)
            results[binary][1].append(throughput)
            print(f"round {r + 1} {binary}: query p50 {statistics.median(latencies):.0f} ms, "
                  f"max {max(latencies):.0f} ms ({len(latencies)} queries); flood {throughput:.1f} tokens/s", flush=True)
    for binary, (latencies, throughputs) in results.items():
        latencies.sort()
        p90 = latencies[int(0.9 * (len(latencies) - 1))]
        print(f"{binary}: query p50 {statistics.median(latencies):.0f} ms, p90 {p90:.0f} ms, max {max(latencies):.0f} ms "
              f"over {len(latencies)} queries; flood median {statistics.median(throughputs):.1f} tokens/s "
              f"(rounds {', '.join(f'{t:.1f}' for t in throughputs)})")


if __name__ == "__main__":
    main()
