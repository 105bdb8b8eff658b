# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# Ported from vLLM's tests/plugins/bge_m3_sparse_plugin: only the imports changed
# (`vllm.*` -> `poolserve_plugins`). poolserve finds a plugin folder by its name and calls
# `register()`, which names the processor class as vLLM's entry point does.


def register():
    return "bge_m3_sparse_plugin.sparse_embeddings_processor.BgeM3SparseEmbeddingsProcessor"
