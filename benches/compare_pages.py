#!/usr/bin/env python3
"""Page-image encoding, poolserve against transformers on the CPU: one page (a 1240×1754 PNG,
an A4 scan at 150 dpi) through ColQwen2, ColPali, ColModernVBert, Qwen3-VL-Embedding and ColQwen3.5 at their published widths and image sizes,
with fewer layers (random weights: speed does not depend on them), each side end to end: the
image file decoded, preprocessed and run through the tower and the language model to its
vectors. poolserve over HTTP (`/pooling` token_embed, a data URL), transformers as its
documentation runs it (`processor.process_images`, then the model; Qwen3-VL-Embedding: its chat
prompt through the processor, then the model's last token, over `/v1/embeddings` on our side).

    python3 benches/compare_pages.py [--models DIR] [--rounds 3] [--dtype float32|bfloat16]

The shapes (layers cut, widths kept):
  ColQwen2: Qwen2-VL-2B's vision tower (1280 wide, 16 heads) with 4 of its 32 blocks, its language
            model (1536 wide, 12 heads over 2, MLP 8960) with 4 of 28 layers; vidore's max_pixels
            768·28·28 (the page becomes 2,944 patches, 736 soft tokens)
  ColPali:  SigLIP-so400m at 448 px (1152 wide, 16 heads, 1,024 patches) with 4 of 27 layers,
            Gemma-2B (2048 wide, 8 heads of 256 over 1, MLP 16384) with 4 of 18 layers
  ColModernVBert: SigLIP-base at 512 px (768 wide, 12 heads, MLP 3072, 1,024 patches a frame) with
            4 of 12 layers, pixel shuffle ×4, ModernBERT (ettin-encoder-150m: 768 wide, 12 heads,
            MLP 1152, a global layer every 3, local window 128) with 8 of 22 layers; Idefics3's
            frames at longest edge 2048 and 512-pixel tiles (the page becomes 4 × 3 tiles + the
            whole page: 13 frames, 13,312 patches, 832 soft tokens)
  Qwen3-VL-Embedding-2B: its vision tower (1024 wide, 16 heads, MLP 4096, 3 DeepStack mergers) with 4
            of 24 blocks, its language model (2048 wide, 16 heads of 128 over 8, MLP 6144) with 4 of
            28 layers; the embedder's max_pixels 1800·32·32 (the page becomes 7,140 patches, 1,785
            soft tokens)
  ColQwen3.5 (colqwen3.5-4.5B, on Qwen3.5-4B): its vision tower (1024 wide, 16 heads, MLP 4096, no
            DeepStack) with 4 of 24 blocks, its hybrid language model (2560 wide; gated attention of
            16 heads of 256 over 4, a quarter of each head rotated; Gated DeltaNet of 16 key and 32
            value heads of 128; MLP 9216) with 4 of 32 layers (3 DeltaNet, 1 attention, the model's
            ratio); the page at Qwen3-VL-Embedding's max_pixels (7,140 patches, 1,785 soft tokens);
            transformers runs colpali-engine's ColQwen3_5 (its chunked delta rule in PyTorch)
Rounds alternate the two engines; each round's number is the median of 3 pages after a warm-up.
"""
import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np
import torch
import transformers
from PIL import Image, ImageDraw

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "models")
torch.set_num_threads(os.cpu_count() or 2)


def page(path):
    rng = np.random.default_rng(0)
    img = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(img)
    for y in range(120, 1650, 28):  # lines of "text"
        x = 100
        while x < 1140:
            w = int(rng.integers(20, 90))
            draw.rectangle([x, y, min(x + w, 1140), y + 14], fill=(20, 20, 20))
            x += w + 12
    draw.rectangle([150, 900, 1090, 1300], outline=(0, 0, 0), width=3)
    img.save(path)


def make(models):
    os.makedirs(models, exist_ok=True)
    made = {}
    name = os.path.join(models, "colqwen2-bench")
    if not os.path.exists(os.path.join(name, "model.safetensors")):
        shutil.copytree(os.path.join(FIXTURES, "colqwen2-tiny"), name, dirs_exist_ok=True)
        config = transformers.ColQwen2Config.from_pretrained(name)
        v, t = config.vlm_config.vision_config, config.vlm_config.text_config
        v.depth, v.embed_dim, v.num_heads, v.mlp_ratio, v.hidden_size = 4, 1280, 16, 4, 1536
        t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads = 1536, 8960, 4, 12, 2
        t.rope_parameters["mrope_section"] = [16, 24, 24]
        t.layer_types = ["full_attention"] * t.num_hidden_layers
        t.max_position_embeddings = 32768
        config.embedding_dim = 128
        transformers.ColQwen2ForRetrieval(config).save_pretrained(name)
        proc = json.load(open(os.path.join(name, "processor_config.json")))
        proc["image_processor"]["size"] = {"shortest_edge": 56 * 56, "longest_edge": 768 * 28 * 28}
        json.dump(proc, open(os.path.join(name, "processor_config.json"), "w"), indent=2)
    made["colqwen2"] = name
    name = os.path.join(models, "colpali-bench")
    if not os.path.exists(os.path.join(name, "model.safetensors")):
        shutil.copytree(os.path.join(FIXTURES, "colpali-tiny"), name, dirs_exist_ok=True)
        config = transformers.ColPaliConfig.from_pretrained(name)
        v, t = config.vlm_config.vision_config, config.vlm_config.text_config
        v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads, v.image_size, v.patch_size = 1152, 4304, 4, 16, 448, 14
        t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim = 2048, 16384, 4, 8, 1, 256
        t.num_image_tokens = 1024
        t.max_position_embeddings = 8192
        if getattr(t, "layer_types", None):
            t.layer_types = t.layer_types[:1] * t.num_hidden_layers
        config.vlm_config.projection_dim = v.projection_dim = 2048
        config.embedding_dim = 128
        transformers.ColPaliForRetrieval(config).save_pretrained(name)
        proc = json.load(open(os.path.join(name, "processor_config.json")))
        proc["image_processor"]["size"] = {"height": 448, "width": 448}
        proc["image_processor"]["image_seq_length"] = 1024
        json.dump(proc, open(os.path.join(name, "processor_config.json"), "w"), indent=2)
    made["colpali"] = name
    name = os.path.join(models, "qwen3vl-bench")
    if not os.path.exists(os.path.join(name, "model.safetensors")):
        shutil.copytree(os.path.join(FIXTURES, "qwen3-vl-embedding-tiny"), name, dirs_exist_ok=True)
        config = transformers.Qwen3VLConfig.from_pretrained(name)
        v, t = config.vision_config, config.text_config
        v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.out_hidden_size = 4, 1024, 4096, 16, 2048
        v.num_position_embeddings, v.deepstack_visual_indexes = 2304, [0, 1, 2]
        t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads = 2048, 6144, 4, 16, 8
        t.head_dim, t.max_position_embeddings = 128, 32768
        t.rope_parameters["mrope_section"] = [24, 20, 20]
        transformers.Qwen3VLForConditionalGeneration(config).save_pretrained(name)
        proc = json.load(open(os.path.join(name, "processor_config.json")))
        proc["image_processor"]["size"] = {"shortest_edge": 4 * 32 * 32, "longest_edge": 1800 * 32 * 32}
        json.dump(proc, open(os.path.join(name, "processor_config.json"), "w"), indent=2)
    made["qwen3vl"] = name
    name = os.path.join(models, "colmodernvbert-bench")
    if not os.path.exists(os.path.join(name, "model.safetensors")):
        shutil.copytree(os.path.join(FIXTURES, "colmodernvbert-tiny"), name, dirs_exist_ok=True)
        config = transformers.ColModernVBertConfig.from_pretrained(name)
        v, t = config.vlm_config.vision_config, config.vlm_config.text_config
        v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads, v.image_size, v.patch_size = 768, 3072, 4, 12, 512, 16
        t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.local_attention = 768, 1152, 8, 12, 128
        t.layer_types = ["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(8)]
        t.max_position_embeddings = 8192
        config.vlm_config.pixel_shuffle_factor = 4
        config.embedding_dim = 128
        transformers.ColModernVBertForRetrieval(config).save_pretrained(name)
        proc = json.load(open(os.path.join(name, "processor_config.json")))
        proc["image_processor"]["size"] = {"longest_edge": 2048}
        proc["image_processor"]["max_image_size"] = {"longest_edge": 512}
        proc["image_seq_len"] = 64
        json.dump(proc, open(os.path.join(name, "processor_config.json"), "w"), indent=2)
    made["colmodernvbert"] = name
    name = os.path.join(models, "colqwen3_5-bench")
    if not os.path.exists(os.path.join(name, "model.safetensors")):
        from colpali_engine.models import ColQwen3_5
        shutil.copytree(os.path.join(FIXTURES, "colqwen3_5-tiny"), name, dirs_exist_ok=True)
        config = transformers.Qwen3_5Config.from_pretrained(name)
        v, t = config.vision_config, config.text_config
        v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.out_hidden_size, v.num_position_embeddings = 4, 1024, 4096, 16, 2560, 2304
        t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads = 2560, 9216, 4, 16, 4
        t.head_dim, t.max_position_embeddings = 256, 32768
        t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim, t.linear_value_head_dim = 16, 32, 128, 128
        t.layer_types = ["linear_attention"] * 3 + ["full_attention"]
        t.rope_parameters.update({"partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "rope_theta": 1e7})
        model = ColQwen3_5(config)
        model.custom_text_proj = torch.nn.Linear(2560, 128)
        model.save_pretrained(name)
        proc = json.load(open(os.path.join(name, "processor_config.json")))
        proc["image_processor"]["size"] = {"shortest_edge": 4 * 32 * 32, "longest_edge": 1800 * 32 * 32}
        json.dump(proc, open(os.path.join(name, "processor_config.json"), "w"), indent=2)
    made["colqwen3_5"] = name
    png = os.path.join(models, "page.png")
    if not os.path.exists(png):
        page(png)
    return made, png


def start(binary, folder, dtype, port):
    server = subprocess.Popen([binary, "serve", folder, "--port", str(port), "--dtype", dtype], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return server
        except Exception:
            time.sleep(0.2)
    server.kill()
    sys.exit(f"{folder} did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/work/bench-models")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--only", choices=["colqwen2", "colpali", "qwen3vl", "colmodernvbert", "colqwen3_5"])
    args = ap.parse_args()
    made, png = make(args.models)
    binary = os.path.join(ROOT, "target", "release", "poolserve")
    subprocess.run(["cargo", "build", "--release", "--locked"], cwd=ROOT, check=True)
    url = "data:image/png;base64," + base64.b64encode(open(png, "rb").read()).decode()
    body = json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}], "task": "token_embed"}).encode()
    embed_body = json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}).encode()
    torch_dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    for family, folder in made.items():
        if args.only and family != args.only:
            continue
        if family == "colqwen3_5":
            # colpali-engine's class and processor (its from_pretrained would rebuild a
            # projection of config.dim; the saved one is loaded by hand).
            from colpali_engine.models import ColQwen3_5, ColQwen3_5Processor
            from safetensors.torch import load_file
            model = ColQwen3_5(transformers.Qwen3_5Config.from_pretrained(folder))
            model.custom_text_proj = torch.nn.Linear(model.config.text_config.hidden_size, 128)
            model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")))
            model = model.to(torch_dtype).eval()
            processor = ColQwen3_5Processor.from_pretrained(folder)
        else:
            model_class = {"colqwen2": transformers.ColQwen2ForRetrieval, "colpali": transformers.ColPaliForRetrieval,
                           "qwen3vl": transformers.Qwen3VLForConditionalGeneration,
                           "colmodernvbert": transformers.ColModernVBertForRetrieval}[family]
            model = model_class.from_pretrained(folder, dtype=torch_dtype).eval()
            processor = transformers.AutoProcessor.from_pretrained(folder)
        server = start(binary, folder, args.dtype, 18599)

        def ours():
            if family == "qwen3vl":
                req = urllib.request.Request("http://127.0.0.1:18599/v1/embeddings", data=embed_body, headers={"Content-Type": "application/json"})
                return json.loads(urllib.request.urlopen(req, timeout=600).read())["usage"]["prompt_tokens"]
            req = urllib.request.Request("http://127.0.0.1:18599/pooling", data=body, headers={"Content-Type": "application/json"})
            rows = json.loads(urllib.request.urlopen(req, timeout=600).read())["data"][0]["data"]
            return len(rows)

        def theirs():
            if family == "qwen3vl":
                conversation = [{"role": "system", "content": [{"type": "text", "text": "Represent the user's input."}]},
                                {"role": "user", "content": [{"type": "image"}]}]
                prompt = processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
                batch = processor(text=[prompt], images=[Image.open(png)], return_tensors="pt")
                with torch.no_grad():
                    states = model.model(**{k: v for k, v in batch.items() if k != "token_type_ids"}).last_hidden_state
                torch.nn.functional.normalize(states[:, -1].float(), dim=-1)
                return batch["input_ids"].shape[1] + int(batch["image_grid_thw"].prod())
            batch = processor.process_images([Image.open(png)])
            if family == "colqwen3_5":
                batch["pixel_values"] = batch["pixel_values"].to(torch_dtype)
                with torch.no_grad():
                    out = model(**{k: v for k, v in batch.items() if k != "token_type_ids"})
                return out.shape[1]
            with torch.no_grad():
                out = model(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "token_type_ids")
                               and not (family == "colmodernvbert" and k == "token_type_ids")})
            return out.embeddings.shape[1]

        def timed(fn):
            fn()
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                n = fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times), n

        unit = "tokens + patches" if family == "qwen3vl" else "vectors"
        ratios = []
        try:
            for r in range(args.rounds):
                (t, nt), (o, no) = timed(theirs), timed(ours)
                ratios.append(t / o)
                print(f"{family} {args.dtype} round {r + 1}: transformers {t * 1e3:.0f} ms ({nt} {unit}), poolserve {o * 1e3:.0f} ms ({no} {unit}): {t / o:.2f}x", flush=True)
        finally:
            server.kill()
        print(f"{family} {args.dtype}: median ratio {statistics.median(ratios):.2f}x over {args.rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
