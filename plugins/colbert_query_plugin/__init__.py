# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# Ported from vLLM's tests/plugins/colbert_query_plugin: only the imports changed
# (`vllm.*` -> `poolserve_plugins`).


def register():
    return "colbert_query_plugin.query_embedding_processor.ColBERTQueryEmbeddingProcessor"
