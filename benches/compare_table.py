#!/usr/bin/env python3
"""Prints the ratio table of benches/compare.sh from the outputs it saved."""
import re
import sys

folder, weights_mib = sys.argv[1], float(sys.argv[2])


def read(name):
    return open(f"{folder}/{name}").read()


def forward(text):
    return {m[0]: float(m[1]) for m in re.findall(r"(\d+x\d+)\s+median\s+([\d.]+) ms", text)}


torch, ours = forward(read("torch.txt")), forward(read("forward.txt"))
rows = []
for shape, tokens in [("32x128", 4096), ("8x128", 1024)]:
    rows.append((f"forward {shape} tokens/s", tokens / ours[shape] * 1e3, tokens / torch[shape] * 1e3, ">= 1.15" if shape == "32x128" else ""))
rows.append(("forward 1x16 ms (lower is better)", ours["1x16"], torch["1x16"], ""))
int8 = forward(read("forward-int8.txt"))
rows.append(("int8 forward 32x128 tokens/s (vs torch f32)", 4096 / int8["32x128"] * 1e3, 4096 / torch["32x128"] * 1e3, ">= 2"))
rows.append(("int8 forward 1x16 ms (lower is better)", int8["1x16"], torch["1x16"], ""))
load, st = read("load.txt"), read("st.txt")
seq = lambda text: float(re.search(r"throughput ([\d.]+) sequences/s", text).group(1))  # noqa: E731
rows.append(("end to end, mixed corpus, sequences/s", seq(load), seq(st), ">= 1.5 (vs sentence-transformers)"))
rows.append(("int8 end to end, mixed corpus, sequences/s", seq(read("load-int8.txt")), seq(st), ""))
print(f"\n{'measure':<42} {'poolserve':>12} {'reference':>12} {'ratio':>7}  target")
for name, a, b, target in rows:
    ratio = b / a if "lower" in name else a / b
    print(f"{name:<42} {a:>12.1f} {b:>12.1f} {ratio:>6.2f}x  {target}")
single = read("single.txt")
p50, p99 = (float(x) for x in re.search(r"p50 ([\d.]+) ms, p90 [\d.]+ ms, p99 ([\d.]+) ms", single).groups())
print(f"single 16-token request, idle server: p50 {p50:.2f} ms (target <= 5), p99 {p99:.2f} ms (target <= 10)")
rss = re.search(r"peak RSS (\d+) MiB", load)
if rss:
    print(f"server peak RSS under load: {rss.group(1)} MiB (weights {weights_mib:.0f} MiB; target <= weights + 300)")
load_latency = re.search(r"latency (.*?); errors (\d+)", load)
print(f"under load (concurrency 32): {load_latency.group(1)}, errors {load_latency.group(2)}")
