#!/usr/bin/env python3
"""Writes a random Mistral-7B-shaped MistralModel folder in bfloat16 (about 14.2 GB), as
save_pretrained shards it (model-0000k-of-0000n.safetensors + the index), for the memory
measurement of benches/large_model_memory.sh. The values are random (a 64 Mi-value block of
N(0, 0.02) reused across tensors): this measures loading and serving, not quality. The tokenizer
is the tiny Llama fixture's.

    python3 benches/make_large_decoder.py OUT_DIR [--layers 32]     # numpy only
"""
import argparse
import json
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "tests", "fixtures", "models", "llama-embed-last")
SHARD_BYTES = 5 * 1000**3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    hidden, inter, heads, kv_heads, vocab = 4096, 14336, 32, 8, 32000
    head_dim = hidden // heads
    shapes = [("embed_tokens.weight", (vocab, hidden))]
    for i in range(args.layers):
        p = f"layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
            (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
            (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    shapes.append(("norm.weight", (hidden,)))
    rng = np.random.default_rng(0)
    block = (rng.standard_normal(64 * 2**20, dtype=np.float32) * 0.02).view(np.uint32) >> 16
    block = block.astype(np.uint16)
    ones = np.full(hidden, 0x3F80, dtype=np.uint16)  # bfloat16 1.0 for the norms

    shards, current, size = [], [], 0
    for name, shape in shapes:
        nbytes = int(np.prod(shape)) * 2
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    shards.append(current)

    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in shard:
            n = int(np.prod(shape)) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(os.path.join(args.out, file), "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for name, shape in shard:
                count = int(np.prod(shape))
                if len(shape) == 1:
                    f.write(ones[:count].tobytes())
                    continue
                while count > 0:
                    n = min(count, block.size)
                    f.write(block[:n].tobytes())
                    count -= n
        total += offset
        print(f"{file}: {offset / 1e9:.2f} GB", flush=True)
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, open(os.path.join(args.out, "model.safetensors.index.json"), "w"), indent=2)
    config = {
        "architectures": ["MistralModel"], "model_type": "mistral", "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": args.layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "bfloat16", "bos_token_id": 1000, "eos_token_id": 1001,
    }
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, name), args.out)
    print(f"{args.out}: {total / 1e9:.2f} GB of bfloat16 weights in {len(shards)} shards")


if __name__ == "__main__":
    main()
