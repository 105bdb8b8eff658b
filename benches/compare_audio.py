#!/usr/bin/env python3
"""The audio-input benchmark: decoding and log-mel features for EmbeddingGemma 2, ours
(`cargo bench --bench audio`) against transformers' `load_audio` (soundfile, then soxr's
high-quality resampler: its backend without torchcodec) and `Gemma4AudioFeatureExtractor`, on
the same files, rounds interleaved; prints each side's milliseconds per file and the ratio.

    python3 benches/compare_audio.py [--rounds 3]
      (transformers >= 5.24, soundfile, soxr, numpy; the files go to target/audio-bench/)
"""
import argparse
import os
import re
import statistics
import subprocess
import time

import numpy as np
import soundfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "target", "audio-bench")
# (file, rate, channels, format, subtype): 30 s each, what the model hears at most.
FILES = [
    ("speech_16k_mono.wav", 16000, 1, "WAV", "PCM_16"),
    ("music_44k_stereo.wav", 44100, 2, "WAV", "PCM_16"),
    ("music_44k_stereo.flac", 44100, 2, "FLAC", "PCM_16"),
    ("music_44k_stereo.mp3", 44100, 2, "MP3", "MPEG_LAYER_III"),
]


def write_files():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, rate, channels, fmt, subtype in FILES:
        path = os.path.join(OUT, name)
        if os.path.exists(path):
            continue
        t = np.arange(30 * rate) / rate
        mono = 0.4 * np.sin(2 * np.pi * (220 + 30 * np.sin(t)) * t) + 0.05 * rng.standard_normal(t.size)
        data = np.stack([mono, np.roll(mono, 100)], 1) if channels == 2 else mono
        soundfile.write(path, data.astype(np.float32), rate, format=fmt, subtype=subtype)
    return [os.path.join(OUT, f[0]) for f in FILES]


def transformers_ms(paths, iterations=5):
    from transformers.audio_utils import load_audio
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor
    extractor = Gemma4AudioFeatureExtractor()
    result = {}
    for path in paths:
        def run():
            wave = load_audio(path, sampling_rate=16000)
            extractor([wave], return_tensors="np")
        run()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        result[path] = statistics.median(times) * 1e3
    return result


def ours_ms(paths):
    out = subprocess.run(["cargo", "bench", "--locked", "--bench", "audio", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        m = re.match(r"(.+): decode ([\d.]+) ms, features ([\d.]+) ms", line)
        if m:
            result[m.group(1)] = float(m.group(2)) + float(m.group(3))
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = write_files()
    rounds = []
    for r in range(args.rounds):
        theirs, ours = transformers_ms(paths), ours_ms(paths)
        rounds.append((theirs, ours))
        for p in paths:
            print(f"round {r + 1} {os.path.basename(p):24} transformers {theirs[p]:8.2f} ms  poolserve {ours[p]:8.2f} ms  ratio {theirs[p] / ours[p]:5.2f}x", flush=True)
    for p in paths:
        ratios = [t[p] / o[p] for t, o in rounds]
        print(f"{os.path.basename(p):24} 30 s: transformers {statistics.median(t[p] for t, _ in rounds):.2f} ms, poolserve "
              f"{statistics.median(o[p] for _, o in rounds):.2f} ms, ratios {', '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
    main()
