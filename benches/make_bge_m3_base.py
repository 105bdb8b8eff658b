#!/usr/bin/env python3
"""Writes a BGE-M3 folder of XLM-R-base's shape with seeded random weights, for
benches/plugin_overhead.py at a realistic size (the real BGE-M3 cannot be fetched here):

    .venv/bin/python benches/make_bge_m3_base.py OUT_DIR

The layout is BAAI/bge-m3's (tests/fixtures/models/bge-m3-tiny, whose tokenizer and
sentence-transformers files it copies): config.json `XLMRobertaModel` with hidden 768, 12 layers,
12 heads, intermediate 3072, 514 positions (xlm-roberta-base's encoder; 85M parameters outside
the embedding table); `model.safetensors`; `sparse_linear.pt` (Linear(768, 1)) and
`colbert_linear.pt` (Linear(768, 768)) in torch.save's zip format. The vocabulary is the tiny
fixture's (1066 rows, not 250002): the table is only looked up, so the work per token is
XLM-R-base's. Needs numpy and safetensors only (the test command's .venv has both): the two .pt
files are pickled here the way torch.save writes them, without torch. Speed does not depend on
the weights' values; the outputs mean nothing.
"""
import collections
import io
import json
import os
import pickle
import shutil
import sys
import types
import zipfile

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TINY = os.path.join(ROOT, "tests", "fixtures", "models", "bge-m3-tiny")
HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 768, 12, 12, 3072, 514


# ---- torch.save's format without torch: a zip of data.pkl (tensors as _rebuild_tensor_v2 of
# persistent storages), data/N (each storage's bytes), version and byteorder.
_torch = types.ModuleType("torch")
_utils = types.ModuleType("torch._utils")


class FloatStorage:
    pass


def _rebuild_tensor_v2(*args):
    raise RuntimeError("only for pickling")


FloatStorage.__module__, FloatStorage.__qualname__ = "torch", "FloatStorage"
_rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
_torch.FloatStorage, _utils._rebuild_tensor_v2 = FloatStorage, _rebuild_tensor_v2


class _Storage:
    def __init__(self, key, array):
        self.key, self.array = key, array


class _Tensor:
    def __init__(self, storage, shape):
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        stride = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        return _rebuild_tensor_v2, (self.storage, 0, self.shape, stride, False, collections.OrderedDict())


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", FloatStorage, obj.key, "cpu", obj.array.size)
        return None


def torch_save(path, tensors):
    name = os.path.splitext(os.path.basename(path))[0]
    storages, state = [], collections.OrderedDict()
    for key, array in tensors.items():
        storage = _Storage(str(len(storages)), np.ascontiguousarray(array, dtype="<f4"))
        storages.append(storage)
        state[key] = _Tensor(storage, tuple(array.shape))
    saved = dict(sys.modules)
    sys.modules["torch"], sys.modules["torch._utils"] = _torch, _utils
    try:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=2).dump(state)
    finally:
        sys.modules.clear()
        sys.modules.update(saved)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{name}/data.pkl", buffer.getvalue())
        archive.writestr(f"{name}/byteorder", "little")
        for storage in storages:
            archive.writestr(f"{name}/data/{storage.key}", storage.array.tobytes())
        archive.writestr(f"{name}/version", "3\n")


def main(out):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "modules.json", "sentence_bert_config.json"):
        shutil.copy(os.path.join(TINY, name), out)
    shutil.copytree(os.path.join(TINY, "1_Pooling"), os.path.join(out, "1_Pooling"))
    with open(os.path.join(TINY, "config.json")) as f:
        config = json.load(f)
    config.update(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=INTERMEDIATE, max_position_embeddings=POSITIONS)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    rng = np.random.default_rng(20261204)
    normal = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    ones, zeros = (lambda n: np.ones(n, np.float32)), (lambda n: np.zeros(n, np.float32))
    weights = {
        "embeddings.word_embeddings.weight": normal(config["vocab_size"], HIDDEN),
        "embeddings.position_embeddings.weight": normal(POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": normal(1, HIDDEN),
        "embeddings.LayerNorm.weight": ones(HIDDEN),
        "embeddings.LayerNorm.bias": zeros(HIDDEN),
    }
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}."
        for part in ("query", "key", "value"):
            weights[p + f"attention.self.{part}.weight"] = normal(HIDDEN, HIDDEN)
            weights[p + f"attention.self.{part}.bias"] = zeros(HIDDEN)
        weights[p + "attention.output.dense.weight"] = normal(HIDDEN, HIDDEN)
        weights[p + "attention.output.dense.bias"] = zeros(HIDDEN)
        weights[p + "attention.output.LayerNorm.weight"] = ones(HIDDEN)
        weights[p + "attention.output.LayerNorm.bias"] = zeros(HIDDEN)
        weights[p + "intermediate.dense.weight"] = normal(INTERMEDIATE, HIDDEN)
        weights[p + "intermediate.dense.bias"] = zeros(INTERMEDIATE)
        weights[p + "output.dense.weight"] = normal(HIDDEN, INTERMEDIATE)
        weights[p + "output.dense.bias"] = zeros(HIDDEN)
        weights[p + "output.LayerNorm.weight"] = ones(HIDDEN)
        weights[p + "output.LayerNorm.bias"] = zeros(HIDDEN)
    save_file(weights, os.path.join(out, "model.safetensors"))
    torch_save(os.path.join(out, "sparse_linear.pt"), {"weight": normal(1, HIDDEN), "bias": zeros(1)})
    torch_save(os.path.join(out, "colbert_linear.pt"), {"weight": normal(HIDDEN, HIDDEN), "bias": zeros(HIDDEN)})
    parameters = sum(a.size for k, a in weights.items() if not k.startswith("embeddings.word"))
    print(f"wrote {out}: XLM-R-base shape, {parameters / 1e6:.1f}M parameters outside the embedding table")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "compare", "bge-m3-base-random"))
