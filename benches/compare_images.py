#!/usr/bin/env python3
"""The image benchmark: a ViT-B/32-sized CLIPModel with random weights (transformers'
default CLIPConfig: vision 768 wide, 12 layers, patch 32, 224x224; text 512 wide), our vision
tower (`cargo bench --bench images`) against transformers' get_image_features on the same
machine, batch 1 and 32, rounds interleaved; prints medians and ratios.

    python3 benches/compare_images.py [--rounds 3] [--make-only]
      (torch, transformers, Pillow; the model goes to target/clip-vit-b32-random)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(ROOT, "target", "clip-vit-b32-random")


def make_model():
    import transformers
    if os.path.exists(os.path.join(MODEL, "model.safetensors")):
        return
    torch.manual_seed(0)
    model = transformers.CLIPModel(transformers.CLIPConfig())
    model.save_pretrained(MODEL)
    processor = {
        "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True,
        "do_rescale": True, "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3, "rescale_factor": 1 / 255, "size": {"shortest_edge": 224},
    }
    with open(os.path.join(MODEL, "preprocessor_config.json"), "w") as f:
        json.dump(processor, f, indent=2)
    # The text side needs a tokenizer to load; the CLIP fixture's (vocabulary ids < 2514) serves.
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"]:
        src = os.path.join(ROOT, "tests/fixtures/models/clip-tiny", name)
        with open(src, "rb") as a, open(os.path.join(MODEL, name), "wb") as b:
            b.write(a.read())
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(os.path.join(MODEL, "bench.png"))


def torch_round(model, processor, png):
    out = {}
    for batch, iterations in [(1, 30), (32, 5)]:
        pixels = torch.randn(batch, 3, 224, 224)
        with torch.inference_mode():
            for _ in range(2):
                model.get_image_features(pixel_values=pixels)
            times = []
            for _ in range(iterations):
                start = time.perf_counter()
                model.get_image_features(pixel_values=pixels)
                times.append(time.perf_counter() - start)
        out[batch] = statistics.median(times) * 1e3
    with torch.inference_mode():
        times = []
        for _ in range(30):
            start = time.perf_counter()
            image = Image.open(png)
            inputs = processor(images=image, return_tensors="pt")
            features = model.get_image_features(**inputs)
            features = getattr(features, "pooler_output", features)
            torch.nn.functional.normalize(features, dim=-1)
            times.append(time.perf_counter() - start)
    out["e2e"] = statistics.median(times[2:]) * 1e3
    return out


def ours_round(binary):
    text = subprocess.run([binary], capture_output=True, text=True, env={**os.environ, "POOLSERVE_IMAGE_MODEL": MODEL}, check=True).stdout
    out = {}
    for batch, ms in re.findall(r"batch (\d+): median ([\d.]+) ms", text):
        out[int(batch)] = float(ms)
    out["e2e"] = float(re.search(r"end to end .*median ([\d.]+) ms", text).group(1))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--make-only", action="store_true")
    args = parser.parse_args()
    make_model()
    if args.make_only:
        return
    import transformers
    torch.set_num_threads(os.cpu_count())
    model = transformers.CLIPModel.from_pretrained(MODEL).eval()
    processor = transformers.CLIPImageProcessor.from_pretrained(MODEL)
    png = os.path.join(MODEL, "bench.png")
    build = subprocess.run(["cargo", "bench", "--bench", "images", "--no-run", "--message-format=json"], cwd=ROOT, capture_output=True, text=True, check=True)
    binary = [json.loads(l)["executable"] for l in build.stdout.splitlines() if '"executable":"' in l and "images" in l][-1]
    rows = {"torch": [], "ours": []}
    for r in range(args.rounds):
        rows["torch"].append(torch_round(model, processor, png))
        rows["ours"].append(ours_round(binary))
        print(f"round {r + 1}: torch {rows['torch'][-1]}  ours {rows['ours'][-1]}", flush=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    for key, label in [(1, "batch 1 (ms)"), (32, "batch 32 (ms)"), ("e2e", "1 PNG 640x480 end to end (ms)")]:
        t = statistics.median(x[key] for x in rows["torch"])
        o = statistics.median(x[key] for x in rows["ours"])
        extra = f"  images/s torch {32e3 / t:.1f} ours {32e3 / o:.1f}" if key == 32 else (f"  images/s torch {1e3 / t:.1f} ours {1e3 / o:.1f}" if key == 1 else "")
        print(f"{label:32} torch {t:8.2f}  ours {o:8.2f}  ours/torch time {o / t:.2f}{extra}")


if __name__ == "__main__":
    sys.exit(main())
