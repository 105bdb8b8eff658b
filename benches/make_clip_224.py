#!/usr/bin/env python3
"""A CLIP with the published image size (224×224, patches of 32: ViT-B/32's 50-token sequence)
but a toy width, random weights: what the image-memory bench (benches/images_memory.sh) serves,
where the tiny test fixture's 30×30 crops would hide the cost of real crops. Also writes a
640×480 JPEG photo-sized input beside it (bench.jpg).

    python3 benches/make_clip_224.py DEST     # torch, transformers, Pillow
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "models", "clip-tiny")


def main():
    dest = sys.argv[1]
    os.makedirs(dest, exist_ok=True)
    config = transformers.CLIPConfig.from_pretrained(FIXTURE)
    config.vision_config.image_size = 224
    config.vision_config.patch_size = 32
    torch.manual_seed(0)
    transformers.CLIPModel(config).eval().save_pretrained(dest)
    for name in ("merges.txt", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json"):
        shutil.copy(os.path.join(FIXTURE, name), dest)
    processor = json.load(open(os.path.join(FIXTURE, "preprocessor_config.json")))
    processor["size"] = {"shortest_edge": 224}
    processor["crop_size"] = {"height": 224, "width": 224}
    json.dump(processor, open(os.path.join(dest, "preprocessor_config.json"), "w"), indent=2)
    rng = np.random.default_rng(0)
    x, y = np.meshgrid(np.linspace(0, 1, 640), np.linspace(0, 1, 480))
    photo = np.stack([x * 255, y * 255, (x * y) * 255], axis=-1) + rng.normal(0, 12, (480, 640, 3))
    Image.fromarray(np.clip(photo, 0, 255).astype(np.uint8)).save(os.path.join(dest, "bench.jpg"), quality=80)
    print(dest, sorted(os.listdir(dest)))


if __name__ == "__main__":
    main()
