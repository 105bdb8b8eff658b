"""What an IO-processor plugin costs a request: the BGE-M3 sparse plugin against the same work
on our own route, interleaved (docs/plugins.md).

One server with the plugin (vLLM v0.33's, whose default `embed_task` is "dense&sparse": the
compound task `embed&token_classify`); each round sends, in turn, the plugin request
(`{"data": {"input": ...}}`) and the route request with the same answer from the same one pass
(`{"input": ..., "return_dense": true, "return_sparse": true}`: the dense vector and the largest
weight per token id), CALLS times each, one at a time on a keep-alive connection. Two shapes:
one 16-token text, and a batch of 32 texts of 128 tokens. The report: each side's median per
round, the median of the rounds' differences (plugin − route, ms) and ratios.

    python benches/plugin_overhead.py target/release/poolserve MODEL [ROUNDS [BATCH_CALLS]]

MODEL: tests/fixtures/models/bge-m3-tiny, or XLM-R-base's shape from benches/make_bge_m3_base.py
(there a 32 x 128 batch takes seconds on two cores: BATCH_CALLS 2 keeps a round short).
"""

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WORDS = ("search retrieval dense sparse lexical vector query document passage index ranking "
         "embedding model token weight score").split()
CALLS = {"one 16-token text": 60, "32 x 128 tokens": 8}


def text_of(tokenizer, tokens, seed):
    """Words until the text is `tokens` tokens long with the model's special tokens."""
    words = []
    while True:
        words.append(WORDS[(seed * 7 + len(words) * 3) % len(WORDS)])
        n = len(tokenizer.encode(" ".join(words)).ids)
        if n >= tokens:
            return " ".join(words if n == tokens else words[:-1])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(connection, body):
    connection.request("POST", "/pooling", json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    if response.status != 200:
        raise SystemExit(f"{response.status}: {payload[:300]!r}")
    return payload


def timed(connection, body, calls):
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        post(connection, body)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main():
    binary, model = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    if len(sys.argv) > 4:
        CALLS["32 x 128 tokens"] = int(sys.argv[4])
    port = free_port()
    python = os.path.join(ROOT, ".venv", "bin", "python")
    server = subprocess.Popen(
        [binary, "serve", model, "--io-processor-plugin", "bge_m3_sparse_plugin", "--plugin-python", python,
         "--port", str(port), "--host", "127.0.0.1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("server did not start")
            time.sleep(0.2)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
        shapes = {
            "one 16-token text": [text_of(tokenizer, 16, 1)],
            "32 x 128 tokens": [text_of(tokenizer, 128, s) for s in range(32)],
        }
        for name, texts in shapes.items():
            plugin = {"data": {"input": texts}}
            route = {"input": texts, "return_dense": True, "return_sparse": True}
            post(connection, plugin), post(connection, route)  # warm both
            differences, ratios, sides = [], [], []
            for _ in range(rounds):
                p = timed(connection, plugin, CALLS[name])
                r = timed(connection, route, CALLS[name])
                differences.append(p - r)
                ratios.append(p / r)
                sides.append((p, r))
            tokens = json.loads(post(connection, plugin))["data"]["usage"]["prompt_tokens"]
            print(f"{name} ({tokens} tokens): plugin {statistics.median(s[0] for s in sides):.2f} ms, "
                  f"route {statistics.median(s[1] for s in sides):.2f} ms; plugin − route: median "
                  f"{statistics.median(differences):+.2f} ms (rounds {min(differences):+.2f} … {max(differences):+.2f}), "
                  f"ratio {statistics.median(ratios):.3f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
