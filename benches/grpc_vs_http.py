"""gRPC vs HTTP, and TLS vs plain, on one model: latency and throughput, interleaved rounds.

Starts two servers of the same binary and model: plain, and TLS (a CA made here; no client
certificates). Each round runs every client once, in turn, so the machine's drift hits all
alike; the report gives each client's median over the rounds.

Clients: HTTP/1.1 keep-alive (`http.client`, POST /embed, TEI's body), gRPC unary
(`tei.v1.Embed/Embed`, grpcio), gRPC stream (`EmbedStream`, one message per text), and the
same over TLS. Latency: one client, one text at a time. Throughput: THREADS clients at once
for SECONDS (the stream: one stream carrying as many).

    python benches/grpc_vs_http.py target/release/poolserve models/all-MiniLM-L6-v2 [ROUNDS]

The HTTP request path of two binaries (a change's before and after), interleaved the same way:

    python benches/grpc_vs_http.py --ab NEW_BINARY OLD_BINARY MODEL [ROUNDS]
"""

import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "protocols"))
from grpc_check import pb, rpc  # noqa: E402
from tls_check import pki, serve  # noqa: E402

TEXT = "A man is eating food while the girl is carrying a baby across the old bridge."
LATENCY_CALLS = 200
THREADS = 8
SECONDS = 4.0


def http_client(port, context=None):
    connection = http.client.HTTPSConnection("localhost", port, context=context) if context else http.client.HTTPConnection("127.0.0.1", port)
    body = json.dumps({"inputs": TEXT})

    def call():
        connection.request("POST", "/embed", body, {"content-type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        assert response.status == 200, data

    return call


def grpc_client(port, credentials=None):
    channel = grpc.secure_channel(f"localhost:{port}", credentials) if credentials else grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = rpc.EmbedStub(channel)
    request = pb.EmbedRequest(inputs=TEXT)
    return lambda: stub.Embed(request)


def latency_ms(make):
    call = make()
    call()  # connect
    times = []
    for _ in range(LATENCY_CALLS):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def throughput(make):
    calls = [make() for _ in range(THREADS)]
    for call in calls:
        call()
    done = [0] * THREADS
    deadline = time.perf_counter() + SECONDS

    def run(i):
        while time.perf_counter() < deadline:
            calls[i]()
            done[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - started)


def stream_throughput(port, credentials=None):
    channel = grpc.secure_channel(f"localhost:{port}", credentials) if credentials else grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = rpc.EmbedStub(channel)
    deadline = time.perf_counter() + SECONDS

    def requests():
        while time.perf_counter() < deadline:
            yield pb.EmbedRequest(inputs=TEXT)

    started = time.perf_counter()
    count = sum(1 for _ in stub.EmbedStream(requests()))
    return count / (time.perf_counter() - started)


def main(binary, model, rounds):
    folder = tempfile.mkdtemp(prefix="poolserve-bench-pki-")
    pki(folder)
    plain, plain_port = serve(binary, model, [])
    tls, tls_port = serve(binary, model, ["--ssl-keyfile", f"{folder}/server.key", "--ssl-certfile", f"{folder}/server.pem"])
    context = ssl.create_default_context(cafile=f"{folder}/ca.pem")
    credentials = grpc.ssl_channel_credentials(open(f"{folder}/ca.pem", "rb").read())
    try:
        for port, ctx in [(plain_port, None), (tls_port, context)]:
            for _ in range(600):
                try:
                    http_client(port, ctx)()
                    break
                except (OSError, AssertionError, http.client.HTTPException):
                    time.sleep(0.2)
        clients = {
            "HTTP/1.1 /embed": lambda: http_client(plain_port),
            "gRPC Embed": lambda: grpc_client(plain_port),
            "HTTPS/1.1 /embed": lambda: http_client(tls_port, context),
            "gRPC Embed over TLS": lambda: grpc_client(tls_port, credentials),
        }
        latency = {name: [] for name in clients}
        rate = {name: [] for name in list(clients) + ["gRPC EmbedStream", "gRPC EmbedStream over TLS"]}
        for r in range(rounds):
            for name, make in clients.items():
                latency[name].append(latency_ms(make))
                rate[name].append(throughput(make))
            rate["gRPC EmbedStream"].append(stream_throughput(plain_port))
            rate["gRPC EmbedStream over TLS"].append(stream_throughput(tls_port, credentials))
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
        print(f"| client | latency, median of {rounds} rounds (ms, 1 text, 1 client) | throughput (requests/s, {THREADS} clients) |")
        print("|---|---|---|")
        for name in rate:
            lat = f"{statistics.median(latency[name]):.3f} ({min(latency[name]):.3f}–{max(latency[name]):.3f})" if name in latency else "—"
            print(f"| {name} | {lat} | {statistics.median(rate[name]):.0f} ({min(rate[name]):.0f}–{max(rate[name]):.0f}) |")
    finally:
        for process in (plain, tls):
            process.terminate()
            process.wait(timeout=40)


def ab(new, old, model, rounds):
    servers = {"new": serve(new, model, []), "old": serve(old, model, [])}
    try:
        for _, port in servers.values():
            for _ in range(600):
                try:
                    http_client(port)()
                    break
                except (OSError, AssertionError, http.client.HTTPException):
                    time.sleep(0.2)
        latency = {name: [] for name in servers}
        rate = {name: [] for name in servers}
        for r in range(rounds):
            for name, (_, port) in servers.items():
                latency[name].append(latency_ms(lambda: http_client(port)))
                rate[name].append(throughput(lambda: http_client(port)))
            print(f"round {r + 1}/{rounds}: latency new/old {latency['new'][-1] / latency['old'][-1]:.3f}, throughput new/old {rate['new'][-1] / rate['old'][-1]:.3f}", file=sys.stderr)
        lat_ratio = [a / b for a, b in zip(latency["new"], latency["old"])]
        rate_ratio = [a / b for a, b in zip(rate["new"], rate["old"])]
        print(f"| binary | HTTP /embed latency (ms, median of {rounds} rounds) | throughput (requests/s, {THREADS} clients) |")
        print("|---|---|---|")
        for name in servers:
            print(f"| {name} | {statistics.median(latency[name]):.3f} | {statistics.median(rate[name]):.0f} |")
        print(f"| new/old, pair by pair | {statistics.median(lat_ratio):.3f} ({min(lat_ratio):.3f}–{max(lat_ratio):.3f}) | {statistics.median(rate_ratio):.3f} ({min(rate_ratio):.3f}–{max(rate_ratio):.3f}) |")
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=40)


if __name__ == "__main__":
    if sys.argv[1] == "--ab":
        ab(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 5)
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5)
