#!/usr/bin/env python3
"""Writes base-sized random-weight folders of the encoder families of issue 30, for the forward
comparison against transformers (benches/compare.py and `cargo bench --bench forward` on the same
folder, interleaved; see README, "Benchmarks"):

  deberta-v3-base   DebertaV2Model in microsoft/deberta-v3-base's shape: hidden 768, 12 layers,
                    12 heads, intermediate 3072, vocab 128100, position_buckets 256, relative
                    attention with shared keys, LayerNorm'ed relative embeddings (184M parameters)
  nomic-v1.5        transformers 5's own NomicBertModel in nomic-embed-text-v1.5's shape: hidden
                    768, 12 layers, 12 heads, SwiGLU 3072, vocab 30528, rotary base 1000 (137M)

    python3 benches/make_family_models.py OUT_DIR      # needs torch and transformers >= 5

Weights are each class's random initialization under a fixed seed: speed does not depend on
their values. The tokenizer is the deberta-embed fixture's (only its files are needed: the forward
benchmarks feed token ids).
"""
import os
import shutil
import sys

import torch
from transformers import DebertaV2Config, DebertaV2Model, NomicBertConfig, NomicBertModel

if len(sys.argv) < 2:
    sys.exit(__doc__)
out = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
tokenizer = os.path.join(here, "..", "tests", "fixtures", "models", "deberta-embed")


def write(name, model):
    dst = os.path.join(out, name)
    shutil.rmtree(dst, ignore_errors=True)
    model.eval().save_pretrained(dst)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(tokenizer, f), dst)
    print(dst)


torch.manual_seed(0)
write("deberta-v3-base", DebertaV2Model(DebertaV2Config(
    vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
    max_position_embeddings=512, relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
    pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False, type_vocab_size=0,
    pad_token_id=0, architectures=["DebertaV2Model"])))
torch.manual_seed(0)
write("nomic-v1.5", NomicBertModel(NomicBertConfig(
    vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="silu",
    max_position_embeddings=2048, layer_norm_eps=1e-12, rope_parameters={"rope_theta": 1000.0, "rope_type": "default"},
    architectures=["NomicBertModel"])))
