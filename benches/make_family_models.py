#!/usr/bin/env python3
"""Writes base-sized random-weight folders of the newer encoder families, for the forward
comparison against transformers (benches/compare.py and `cargo bench --bench forward` on the same
folder, interleaved; see docs/performance.md):

  deberta-v3-base   DebertaV2Model in microsoft/deberta-v3-base's shape: hidden 768, 12 layers,
                    12 heads, intermediate 3072, vocab 128100, position_buckets 256, relative
                    attention with shared keys, LayerNorm'ed relative embeddings (184M parameters)
  nomic-v1.5        transformers 5's own NomicBertModel in nomic-embed-text-v1.5's shape: hidden
                    768, 12 layers, 12 heads, SwiGLU 3072, vocab 30528, rotary base 1000 (137M)

and of the decoder families:

  qwen3-0.6b        Qwen3Model in Qwen3-Embedding-0.6B's shape: hidden 1024, 28 layers, 16 heads
                    over 8 key/value heads of 128, SwiGLU 3072, vocab 151669 (596M)
  gemma3-300m       Gemma3TextModel in google/embeddinggemma-300m's shape: hidden 768, 24 layers,
                    3 heads over 1 key/value head of 256, GeGLU 1152, vocab 262144, bidirectional,
                    sliding window 512 on 5 of every 6 layers (303M)
  embeddinggemma2   EmbeddingGemma2TextModel in transformers 5.24's defaults (its docstring's
                    google/embeddinggemma-2): hidden 512, 24 layers, 4 heads over 2 key/value
                    heads of 256 (full layers: one of 512), GeGLU 2048, PLE 512, embedding_dim
                    768, vocab 262144, sliding radius 512 on 5 of every 6 layers (254M)

    python3 benches/make_family_models.py OUT_DIR [NAME ...]   # torch and transformers >= 5; all by default

Weights are each class's random initialization under a fixed seed: speed does not depend on
their values. The tokenizer is the deberta-embed fixture's (only its files are needed: the forward
benchmarks feed token ids).
"""
import os
import shutil
import sys

import torch
from transformers import (DebertaV2Config, DebertaV2Model, Gemma3TextConfig, Gemma3TextModel, NomicBertConfig, NomicBertModel,
                          Qwen3Config, Qwen3Model)

if len(sys.argv) < 2:
    sys.exit(__doc__)
out = sys.argv[1]
wanted = set(sys.argv[2:]) or {"deberta-v3-base", "nomic-v1.5", "qwen3-0.6b", "gemma3-300m", "embeddinggemma2"}
here = os.path.dirname(os.path.abspath(__file__))
tokenizer = os.path.join(here, "..", "tests", "fixtures", "models", "deberta-embed")


def write(name, make):
    if name not in wanted:
        return
    torch.manual_seed(0)
    model = make()
    dst = os.path.join(out, name)
    shutil.rmtree(dst, ignore_errors=True)
    model.eval().save_pretrained(dst)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(tokenizer, f), dst)
    print(dst)


write("deberta-v3-base", lambda: DebertaV2Model(DebertaV2Config(
    vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
    max_position_embeddings=512, relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
    pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False, type_vocab_size=0,
    pad_token_id=0, architectures=["DebertaV2Model"])))
write("nomic-v1.5", lambda: NomicBertModel(NomicBertConfig(
    vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="silu",
    max_position_embeddings=2048, layer_norm_eps=1e-12, rope_parameters={"rope_theta": 1000.0, "rope_type": "default"},
    architectures=["NomicBertModel"])))
write("qwen3-0.6b", lambda: Qwen3Model(Qwen3Config(
    vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    intermediate_size=3072, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, architectures=["Qwen3Model"])))
write("gemma3-300m", lambda: Gemma3TextModel(Gemma3TextConfig(
    vocab_size=262144, hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1, head_dim=256,
    intermediate_size=1152, max_position_embeddings=2048, query_pre_attn_scalar=256, sliding_window=512,
    use_bidirectional_attention=True, rms_norm_eps=1e-6, architectures=["Gemma3TextModel"])))
if "embeddinggemma2" in wanted:  # transformers >= 5.24
    from transformers import EmbeddingGemma2TextConfig, EmbeddingGemma2TextModel

    def embeddinggemma2():
        model = EmbeddingGemma2TextModel(EmbeddingGemma2TextConfig(architectures=["EmbeddingGemma2TextModel"]))
        # Its attention is unscaled over q/k-normed heads of 256 and 512: at the norms' initial
        # weight 1 the scores have a standard deviation of 16-23, so sharp that transformers'
        # own float32 forward is only within cosine 0.997 of its float64 one at 100 tokens,
        # and no float32 comparison means anything. A quarter of that weight gives scores
        # like a trained model's (float32 and float64 then agree to 1.000000 at 300 tokens);
        # speed does not depend on it.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.mul_(0.25)
        return model

    write("embeddinggemma2", embeddinggemma2)
