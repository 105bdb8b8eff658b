# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# vLLM v0.33.0's tests/plugins/bge_m3_sparse_plugin, unchanged but for its imports (`vllm.*` -> `poolserve_plugins`).

from collections.abc import Sequence

from poolserve_plugins import (
    PoolerConfig,
    VllmConfig,
    UsageInfo,
    PromptType,
    PoolingRequestOutput,
    IOProcessor,
    PoolingParams,
    BaseRenderer,
    convert_ids_list_to_tokens,
)

from .types import (
    SparseEmbeddingCompletionRequestMixin,
    SparseEmbeddingResponse,
    SparseEmbeddingResponseData,
    SparseEmbeddingTokenWeight,
)


class BgeM3SparseEmbeddingsProcessor(
    IOProcessor[SparseEmbeddingCompletionRequestMixin, SparseEmbeddingResponse]
):
    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer):
        super().__init__(vllm_config, renderer)
        self.offline_requests: list[SparseEmbeddingCompletionRequestMixin] = []
        self.online_requests: dict[str, SparseEmbeddingCompletionRequestMixin] = {}
        self.renderer: BaseRenderer = renderer
        self.default_pooling_params = {}
        pooler_config: PoolerConfig | None = vllm_config.model_config.pooler_config
        if pooler_config is not None:
            for param in ["use_activation", "dimensions"]:
                if getattr(pooler_config, param, None) is None:
                    continue
                self.default_pooling_params[param] = getattr(pooler_config, param)
        self.embed_dimensions = vllm_config.model_config.embedding_size

    def __repr__(self) -> str:
        return (
            f"BgeM3SparseEmbeddingsProcessor("
            f"embed_dimensions={self.embed_dimensions}, "
            f"default_pooling_params={self.default_pooling_params})"
        )

    def merge_pooling_params(
        self,
        params: PoolingParams | None = None,
    ) -> PoolingParams:
        if params is None:
            params = PoolingParams()
        # refer to PoolingCompletionRequest.to_pooling_params
        # set and verify pooling params
        params.skip_reading_prefix_cache = True
        params.task = "embed&token_classify"
        params.use_activation = True
        params.dimensions = self.embed_dimensions
        return params

    def parse_data(self, data: object) -> SparseEmbeddingCompletionRequestMixin:
        # for vllm.entrypoints.llm.LLM, offline mode, calls `encode` directly.
        if isinstance(data, dict):
            return SparseEmbeddingCompletionRequestMixin(**data)
        raise TypeError("data should be a dictionary")

    def pre_process(
        self,
        prompt: SparseEmbeddingCompletionRequestMixin,
        request_id: str | None = None,
        **kwargs,
    ) -> PromptType | Sequence[PromptType]:
        if request_id is not None:
            assert request_id not in self.online_requests, "request_id duplicated"
            self.online_requests[request_id] = prompt
        else:
            self.offline_requests.append(prompt)
        return prompt.input

    def _get_sparse_embedding_request(self, request_id: str | None = None):
        if request_id:
            return self.online_requests.pop(request_id, None)
        return self.offline_requests.pop(0)

    def _build_sparse_embedding_token_weights(
        self,
        sparse_embedding: dict[int, float],
        return_tokens: bool = False,
    ) -> list[SparseEmbeddingTokenWeight]:
        token_ids = sparse_embedding.keys()
        token_weights = sparse_embedding.values()
        tokens: Sequence[str | None] = [None] * len(token_ids)

        if return_tokens and self.renderer is not None:
            tokens = convert_ids_list_to_tokens(
                self.renderer.get_tokenizer(), list(token_ids)
            )
        sparse_embedding_output: list[SparseEmbeddingTokenWeight] = []
        for token_id, weight, token in zip(token_ids, token_weights, tokens):
            sparse_embedding_output.append(
                SparseEmbeddingTokenWeight(
                    token_id=token_id, weight=weight, token=token
                )
            )
        return sparse_embedding_output

    def post_process(
        self,
        model_output: Sequence[PoolingRequestOutput],
        request_id: str | None = None,
        **kwargs,
    ) -> SparseEmbeddingResponse:
        num_prompt_tokens = 0
        response_data = []
        raw_request = self._get_sparse_embedding_request(request_id)
        has_dense_embed = raw_request.embed_task in ["dense", "dense&sparse"]
        has_sparse_embed = raw_request.embed_task in ["sparse", "dense&sparse"]
        embed_dimensions = self.embed_dimensions
        for idx in range(len(model_output)):
            mo = model_output[idx]
            sparse_embedding_dict: dict[int, float] = {}
            num_prompt_tokens += len(mo.prompt_token_ids)
            dense_embedding: list[float] | None = None
            sparse_embedding: list[SparseEmbeddingTokenWeight] | None = None
            if has_dense_embed:
                dense_embedding = mo.outputs.data[:embed_dimensions].tolist()
            if has_sparse_embed:
                sparse_weights = mo.outputs.data[embed_dimensions:].tolist()
                if len(mo.prompt_token_ids) != len(sparse_weights):
                    # this is the case that add_special_tokens is True,
                    # which means first token and last token are special tokens
                    mo.prompt_token_ids = mo.prompt_token_ids[1:]
                for token_id, weight in zip(mo.prompt_token_ids, sparse_weights):
                    sparse_embedding_dict[token_id] = max(
                        weight, sparse_embedding_dict.get(token_id, 0.0)
                    )
                sparse_embedding = self._build_sparse_embedding_token_weights(
                    sparse_embedding_dict,
                    raw_request.return_tokens,
                )

            response_data.append(
                SparseEmbeddingResponseData(
                    index=idx,
                    object=raw_request.embed_task,
                    sparse_embedding=sparse_embedding,
                    dense_embedding=dense_embedding,
                )
            )

        usage = UsageInfo(
            prompt_tokens=num_prompt_tokens,
            total_tokens=num_prompt_tokens,
        )
        resp = SparseEmbeddingResponse(
            data=response_data,
            usage=usage,
        )

        return resp
