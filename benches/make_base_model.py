#!/usr/bin/env python3
"""Writes a BERT-base-sized sentence-transformers model with random weights, for the base-size
speed comparison in benches/compare.sh (no base-size embedding model can be fetched here).

    python3 benches/make_base_model.py OUT_DIR [TOKENIZER_DIR [SIZE]]   # default models/all-MiniLM-L6-v2, base

SIZE `base` (the default) is bert-base-uncased's shape; `minilm` is all-MiniLM-L6-v2's (hidden 384,
6 layers, 12 heads, intermediate 1536), for the GPU check's small size; `qwen3` is
Qwen3-Embedding-0.6B's decoder shape (hidden 1024, 28 layers, 16 query and 8 key/value heads of
128, intermediate 3072, 440M parameters outside the embedding table) with last-token pooling, for
the GPU check's large size. Its vocabulary is the WordPiece one below (30522 rows, not Qwen's
151669): the table is only looked up, so the work per token is Qwen3-0.6B's. The base shape is bert-base-uncased's: hidden 768, 12 layers, 12 heads, intermediate 3072, vocab
30522, 512 positions (110M parameters, ~420 MiB of float32 safetensors). The weights are
`BertModel(BertConfig(...))`'s random initialization under a fixed seed, so every run writes the
same model. Speed does not depend on the weights' values (same shapes, same kernels, same work;
int8 dynamic quantization too, since its scales are computed whatever the values), so these
numbers stand for any BERT-base embedding model (e.g. bge-base, e5-base); the embeddings
themselves mean nothing.

The tokenizer files are all-MiniLM-L6-v2's (the same uncased 30522-token WordPiece vocabulary as
bert-base-uncased); modules.json, 1_Pooling/config.json (mean pooling) and sentence_bert_config.json
follow all-MiniLM-L6-v2's, so both poolserve and sentence-transformers load the folder.
"""
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import BertConfig, BertModel, Qwen3Config, Qwen3Model  # noqa: E402

if len(sys.argv) < 2:
    sys.exit(__doc__)
out = sys.argv[1]
source = sys.argv[2] if len(sys.argv) > 2 else "models/all-MiniLM-L6-v2"
size = sys.argv[3] if len(sys.argv) > 3 else "base"
shapes = {"base": (768, 12, 3072), "minilm": (384, 6, 1536), "qwen3": (1024, 28, 3072)}
if size not in shapes:
    sys.exit(f"SIZE must be one of {sorted(shapes)}")
hidden, layers, intermediate = shapes[size]

torch.manual_seed(0)
# Initialized on the GPU where there is one (Qwen3's 600M random values take a minute on a CPU);
# the same seed gives the same model on the same kind of device.
torch.set_default_device("cuda" if torch.cuda.is_available() else "cpu")
if size == "qwen3":
    config = Qwen3Config(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        pad_token_id=0,
    )
    config.architectures = ["Qwen3Model"]
    model = Qwen3Model(config).eval()
else:
    config = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=intermediate,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )
    config.architectures = ["BertModel"]
    model = BertModel(config).eval()
os.makedirs(out, exist_ok=True)
model.save_pretrained(out)  # safetensors (the default since transformers 4.35)
if not os.path.exists(os.path.join(out, "model.safetensors")):
    sys.exit(f"{out}/model.safetensors was not written (transformers too old? needs safetensors serialization)")

for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
    if os.path.exists(os.path.join(source, name)):
        shutil.copy(os.path.join(source, name), os.path.join(out, name))
modules = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]
pooling = {
    "word_embedding_dimension": config.hidden_size,
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": size != "qwen3",
    "pooling_mode_lasttoken": size == "qwen3",
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
}
os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
for path, value in [
    ("modules.json", modules),
    ("1_Pooling/config.json", pooling),
    ("sentence_bert_config.json", {"max_seq_length": 512, "do_lower_case": False}),
]:
    with open(os.path.join(out, path), "w") as f:
        json.dump(value, f, indent=2)
print(f"{out}: random-weight {config.architectures[0]}, {size} shape ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters), {'last-token' if size == 'qwen3' else 'mean'} pooling")
