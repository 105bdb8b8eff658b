#!/usr/bin/env python3
"""The video-input benchmark: an MP4 to EmbeddingGemma 2's frame patches, ours (`cargo bench
--bench video`: demux, openh264, YUV to RGB, resize and patch) against transformers'
`load_video` (PyAV backend, the processor's 1-fps sampling) and `EmbeddingGemma2VideoProcessor`
(torchvision) on the same files, rounds interleaved; prints each side's milliseconds per file
and the ratio.

    python3 benches/compare_video.py [--rounds 3]
      (transformers >= 5.24, torch, torchvision, av; the files go to target/video-bench/)
"""
import argparse
import os
import re
import statistics
import subprocess
import time
from functools import partial

import av
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "target", "video-bench")
# (file, width, height, fps, seconds, profile, B-frames): what phones and screen recorders make.
FILES = [
    ("clip_640x360_30fps_10s_high.mp4", 640, 360, 30, 10, "high", 2),
    ("clip_1280x720_30fps_10s_high.mp4", 1280, 720, 30, 10, "high", 2),
    ("clip_1280x720_30fps_40s_main.mp4", 1280, 720, 30, 40, "main", 0),
]


def write(path, width, height, fps, seconds, profile, bframes):
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    with av.open(path, "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"profile": profile, "bf": str(bframes), "crf": "23", "preset": "veryfast"}
        for i in range(fps * seconds):
            rgb = np.stack([(x + 3 * i) % 256, (y + 2 * i) % 256, ((x * y) // 64 + i) % 256], -1).astype(np.int16)
            rgb = np.clip(rgb + rng.integers(-8, 9, rgb.shape), 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def ours(paths):
    env = dict(os.environ, BENCH_ITERATIONS="3")
    out = subprocess.run(["cargo", "bench", "--locked", "--bench", "video", "--", *paths], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    return {os.path.basename(m.group(1)): float(m.group(2)) for m in re.finditer(r"^(\S+): ([\d.]+) ms", out, re.M)}, out


def theirs(paths, processor):
    from transformers.video_utils import load_video
    sample = partial(processor.sample_frames, fps=processor.fps, max_frames=processor.max_frames,
                     overflow_strategy=processor.overflow_strategy)
    times = {}
    for path in paths:
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            frames, metadata = load_video(path, backend="pyav", sample_indices_fn=sample)
            processor(videos=[frames], video_metadata=[metadata], do_sample_frames=False, return_tensors="pt")
            runs.append(time.perf_counter() - start)
        times[os.path.basename(path)] = statistics.median(runs) * 1e3
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch
    from transformers.models.embedding_gemma2.video_processing_embedding_gemma2 import EmbeddingGemma2VideoProcessor
    torch.set_num_threads(1)  # the server decodes a video on one input worker
    os.makedirs(OUT, exist_ok=True)
    paths = []
    for name, *spec in FILES:
        path = os.path.join(OUT, name)
        if not os.path.exists(path):
            write(path, *spec)
        paths.append(path)
    processor = EmbeddingGemma2VideoProcessor()
    results = {os.path.basename(p): ([], []) for p in paths}
    for r in range(args.rounds):
        mine, raw = ours(paths)
        if r == 0:
            print(raw.strip())
        for name, ms in theirs(paths, processor).items():
            results[name][0].append(mine[name])
            results[name][1].append(ms)
    print("| file | poolserve ms | transformers (PyAV + video processor) ms | ratio |")
    print("|---|---|---|---|")
    for name, (a, b) in results.items():
        a, b = statistics.median(a), statistics.median(b)
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f}× |")


if __name__ == "__main__":
    main()
