"""Re-indexing with the output cache (issue 70): the same CHUNKS texts embedded twice through
/v1/embeddings (requests of 64), by a server without the cache and one with `--cache-size`,
in interleaved rounds. Prints each pass's time, the cache's hits and misses from /metrics, and
the server's resident memory before and after the first pass (with the cache on, its growth
beyond the cache-off server's, over the entries, is the memory one cached entry costs, the
allocator's share included).

    python benches/cache_reindex.py MODEL BINARY [--chunks 10000] [--rounds 3] [--cache-mib 256]
"""

import argparse
import http.client
import json
import statistics
import time

import query_under_flood  # its server start-up (this folder is on the path when run as a script)

WORDS = ("the index holds every chunk of the manual with its section title page number and a short "
         "summary written by the team so that search can find the right passage quickly").split()

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("binary")
parser.add_argument("--chunks", type=int, default=10_000)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--cache-mib", type=int, default=256)
parser.add_argument("--batch", type=int, default=64)
args = parser.parse_args()


def chunk(seed):
    # 40 to 120 words (about 50 to 150 MiniLM tokens), distinct for every seed.
    n = 40 + seed % 81
    return f"chunk {seed}: " + " ".join(WORDS[(seed * 13 + i * 7 + i * i) % len(WORDS)] for i in range(n))


def serve(flags):
    return query_under_flood.serve(args.binary, args.model, flags)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(f"poolserve_{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def one_pass(port, bodies):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    vectors = []
    for body in bodies:
        c.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        response = c.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {payload[:200]!r}")
        vectors.extend(d["embedding"] for d in json.loads(payload)["data"])
    return time.perf_counter() - start, vectors


texts = [chunk(i) for i in range(args.chunks)]
bodies = [json.dumps({"input": texts[i:i + args.batch]}) for i in range(0, len(texts), args.batch)]
results = {"off": [], "on": []}
for r in range(args.rounds):
    for label in ("off", "on") if r % 2 == 0 else ("on", "off"):
        flags = ["--cache-size", str(args.cache_mib)] if label == "on" else []
        server, port = serve(flags)
        try:
            before = rss_kib(server.pid)
            first, v1 = one_pass(port, bodies)
            after_first = rss_kib(server.pid)
            second, v2 = one_pass(port, bodies)
            same = v1 == v2
            hits, misses = metric(port, "cache_hits_total"), metric(port, "cache_misses_total")
            entries, counted = metric(port, "cache_entries"), metric(port, "cache_bytes")
        finally:
            server.kill()
            server.wait()
        results[label].append((first, second))
        growth = (after_first - before) * 1024
        line = (f"round {r + 1} cache {label}: first pass {first:.2f} s, second {second:.2f} s, identical vectors: {same};"
                f" RSS +{growth / 1e6:.1f} MB over the first pass")
        if label == "on":
            line += (f" ({growth / entries:.0f} B/entry); hits {hits:.0f}, misses {misses:.0f}, entries {entries:.0f},"
                     f" counted {counted / 1e6:.1f} MB ({counted / entries:.0f} B/entry)")
        print(line, flush=True)

for label in ("off", "on"):
    firsts = [f for f, _ in results[label]]
    seconds = [s for _, s in results[label]]
    print(f"cache {label}: first pass median {statistics.median(firsts):.2f} s, second {statistics.median(seconds):.2f} s")
ratios = [on[0] / off[0] for on, off in zip(results["on"], results["off"])]
print("first pass, cache on / off per round: " + ", ".join(f"{x:.3f}" for x in ratios))
ratios = [off[1] / on[1] for on, off in zip(results["on"], results["off"])]
print("second pass speed-up per round: " + ", ".join(f"{x:.1f}x" for x in ratios))
