#!/usr/bin/env python3
"""Prints the ratio tables of benches/compare.sh from the outputs it saved.

    python3 benches/compare_table.py target/compare WEIGHTS_MIB

Forward files holding several runs (compare.sh with REPEAT=N appends each round) count by the
median per shape. The ONNX Runtime files (ort.txt, ort-e2e.txt) and the base-size ones
(*-base*.txt) are optional: their tables or rows are left out where a file is missing.
"""
import os
import re
import statistics
import sys

folder, weights_mib = sys.argv[1], float(sys.argv[2])


def read(name):
    return open(f"{folder}/{name}").read()


def optional(name):
    return read(name) if os.path.exists(f"{folder}/{name}") else None


def runs(text):
    """shape -> the median times (ms) of every run in the text, in order."""
    found = {}
    for shape, ms in re.findall(r"(\d+x\d+)\s+median\s+([\d.]+) ms", text or ""):
        found.setdefault(shape, []).append(float(ms))
    return found


def forward(text):
    """shape -> median over the runs of the per-run median time (ms)."""
    return {shape: statistics.median(times) for shape, times in runs(text).items()}


def ort_forward(text):
    """compare_ort.py's output -> ({f32: shape -> ms, int8: shape -> ms}, worst int8 cosine)."""
    sections = {"f32": [], "int8": []}
    current = None
    for line in (text or "").splitlines():
        header = re.match(r"ORT \S+ (f32|int8) ", line)
        if header:
            current = header.group(1)
        elif line.startswith("ORT ") or line.startswith("check "):
            current = None
        elif current:
            sections[current].append(line)
    cosines = [float(c) for c in re.findall(r"worst cosine f32 [\d.]+, int8 ([\d.]+)", text or "")]
    return {k: forward("\n".join(v)) for k, v in sections.items()}, min(cosines) if cosines else None


def cpu_line():
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "cpu: unknown (no /proc/cpuinfo)"
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
    flags = set(flags.group(1).split()) if flags else set()
    cores = len(re.findall(r"^processor\s*:", info, re.M))
    present = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ["avx2", "avx512f", "avx512_vnni", "avx_vnni"])
    return f"cpu: {model.group(1).strip() if model else 'unknown'}, {cores} cores; {present}"


def most_runs(*texts):
    return max([len(v) for t in texts for v in runs(t).values()] or [0])


def cell(value):
    return f"{value:>10.1f}" if value is not None else f"{'-':>10}"


print(cpu_line())
torch_text, ours_text, int8_text = read("torch.txt"), read("forward.txt"), read("forward-int8.txt")
ort_text = optional("ort.txt")
n = most_runs(torch_text, ours_text, int8_text)
if n > 1:
    print(f"forward passes: the median of {n} runs per shape (REPEAT={n})")

torch, ours = forward(torch_text), forward(ours_text)
rows = []
for shape, tokens in [("32x128", 4096), ("8x128", 1024)]:
    rows.append((f"forward {shape} tokens/s", tokens / ours[shape] * 1e3, tokens / torch[shape] * 1e3, "vs the faster of PyTorch and ORT: see below"))
rows.append(("forward 1x16 ms (lower is better)", ours["1x16"], torch["1x16"], ""))
int8 = forward(int8_text)
rows.append(("int8 forward 32x128 tokens/s (vs torch f32)", 4096 / int8["32x128"] * 1e3, 4096 / torch["32x128"] * 1e3, ""))
rows.append(("int8 forward 1x16 ms (lower is better)", int8["1x16"], torch["1x16"], ""))
load, st = read("load.txt"), read("st.txt")
seq = lambda text: float(re.search(r"throughput ([\d.]+) sequences/s", text).group(1))  # noqa: E731
rows.append(("end to end, mixed corpus, sequences/s", seq(load), seq(st), ">= 1.5 (vs sentence-transformers)"))
rows.append(("int8 end to end, mixed corpus, sequences/s", seq(read("load-int8.txt")), seq(st), ""))
print(f"\n{'measure':<42} {'poolserve':>12} {'reference':>12} {'ratio':>7}  target")
for name, a, b, target in rows:
    ratio = b / a if "lower" in name else a / b
    print(f"{name:<42} {a:>12.1f} {b:>12.1f} {ratio:>6.2f}x  {target}")
def latency(text):
    return (float(x) for x in re.search(r"p50 ([\d.]+) ms, p90 [\d.]+ ms, p99 ([\d.]+) ms", text).groups())


p50, p99 = latency(read("single.txt"))
print(f"single 16-token request, idle server: p50 {p50:.2f} ms (target <= 5), p99 {p99:.2f} ms (target <= 10)")
if optional("single-int8.txt"):
    p50, p99 = latency(read("single-int8.txt"))
    print(f"single 16-token request, idle server, int8: p50 {p50:.2f} ms (target <= 3), p99 {p99:.2f} ms")
rss = re.search(r"peak RSS (\d+) MiB", load)
if rss:
    print(f"server peak RSS under load: {rss.group(1)} MiB (weights {weights_mib:.0f} MiB; target <= weights + 300)")
load_latency = re.search(r"latency (.*?); errors (\d+)", load)
print(f"under load (concurrency 32): {load_latency.group(1)}, errors {load_latency.group(2)}")


def ort_table(title, torch, ours, int8, ort_text, e2e=None):
    """Ours against PyTorch and ONNX Runtime. Throughput ratios > 1 and time ratios < 1 mean
    poolserve is ahead."""
    ort, worst_int8 = ort_forward(ort_text)
    version = re.search(r"^ORT (\S+) f32", ort_text or "", re.M)
    print(f"\n{title}, against ONNX Runtime {version.group(1) if version else '(no ORT output)'}"
          + (f" (ORT int8 worst cosine to PyTorch: {worst_int8:.4f})" if worst_int8 is not None else ""))
    print(f"{'measure':<34} {'poolserve':>10} {'PyTorch/ST':>10} {'ORT f32':>10} {'ORT int8':>10}  ratio")

    def tps(times, shape, tokens):
        return tokens / times[shape] * 1e3 if times and shape in times else None

    def ratio(a, b):
        return a / b if a is not None and b else None

    def fmt(value, what):
        return f"{value:.2f}x {what}" if value is not None else "-"

    for shape, tokens in [("32x128", 4096), ("8x128", 1024)]:
        a, t, o = tps(ours, shape, tokens), tps(torch, shape, tokens), tps(ort["f32"], shape, tokens)
        best = max([x for x in (t, o) if x is not None], default=None)
        print(f"{'forward ' + shape + ' tokens/s, f32':<34} {cell(a)} {cell(t)} {cell(o)} {cell(None)}  {fmt(ratio(a, best), 'ours / max(PyTorch, ORT f32)')}")
    a, t, o = ours.get("1x16"), torch.get("1x16"), ort["f32"].get("1x16")
    print(f"{'forward 1x16 ms, f32':<34} {cell(a)} {cell(t)} {cell(o)} {cell(None)}  {fmt(ratio(a, o), 'ours / ORT f32 time (< 1: ours faster)')}")
    for shape, tokens in [("32x128", 4096), ("8x128", 1024)]:
        a, q = tps(int8, shape, tokens), tps(ort["int8"], shape, tokens)
        print(f"{'forward ' + shape + ' tokens/s, int8':<34} {cell(a)} {cell(None)} {cell(None)} {cell(q)}  {fmt(ratio(a, q), 'ours int8 / ORT int8')}")
    a, q = int8.get("1x16"), ort["int8"].get("1x16")
    print(f"{'forward 1x16 ms, int8':<34} {cell(a)} {cell(None)} {cell(None)} {cell(q)}  {fmt(ratio(a, q), 'ours / ORT int8 time (< 1: ours faster)')}")
    if e2e is None:
        return
    load, st, load_int8, ort_e2e = e2e
    pipe = dict((k, float(v)) for k, v in re.findall(r"ORT (f32|int8) end to end: ([\d.]+) sentences/s", ort_e2e or ""))
    a, s, o = seq(load), seq(st), pipe.get("f32")
    both = [fmt(ratio(a, s), "vs sentence-transformers"), fmt(ratio(a, o), "vs ORT f32 pipeline")]
    print(f"{'end to end sequences/s, f32':<34} {cell(a)} {cell(s)} {cell(o)} {cell(None)}  {', '.join(x for x in both if x != '-') or '-'}")
    a, q = seq(load_int8), pipe.get("int8")
    print(f"{'end to end sequences/s, int8':<34} {cell(a)} {cell(None)} {cell(None)} {cell(q)}  {fmt(ratio(a, q), 'ours int8 / ORT int8 pipeline')}")


if ort_text is not None or optional("ort-e2e.txt") is not None:
    ort_table("all-MiniLM-L6-v2", torch, ours, int8, ort_text, (load, st, read("load-int8.txt"), optional("ort-e2e.txt")))
base = [optional(f) for f in ("torch-base.txt", "forward-base.txt", "forward-base-int8.txt", "ort-base.txt")]
if all(t is not None for t in base[:3]):
    name = re.search(r"threads, (\S+) forward", base[0])
    title = f"base size ({name.group(1) if name else 'bert-base-random'}: BERT-base shapes, random weights)"
    ort_table(title, forward(base[0]), forward(base[1]), forward(base[2]), base[3])
