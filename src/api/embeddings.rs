//! `POST /v1/embeddings` (and `/embeddings`): the OpenAI embeddings API with vLLM's pooling
//! parameters, sentence-transformers' `prompt_name`, and vLLM's `embed_dtype` / `endianness`
//! for base64 (see [`super::encoding`]).

use super::error::{ApiError, ErrorResponses};
use super::json::{ApiJson, OffRuntimeJson};
use super::{AppState, ListResponse};
use crate::engine::PoolingOutput;
use crate::pooling::Task;
use crate::engine::params::PoolingParams;
use axum::extract::State;
use axum::http::HeaderMap;
use super::encoding::{self, EmbedDtype, Endianness};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    /// Texts or token ids (absent when `messages` is sent).
    #[serde(default)]
    pub input: serde_json::Value,
    /// vLLM's chat-style inputs, one embedding per message; images as `image_url` parts.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<serde_json::Value>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    pub user: Option<String>,
    /// A sentence-transformers prompt of the model (`config_sentence_transformers.json`),
    /// prepended to every text input; default: the model's default prompt, if any.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// vLLM: element type of base64 embeddings (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2).
    #[serde(default)]
    pub embed_dtype: Option<EmbedDtype>,
    /// vLLM: byte order of base64 embeddings (native, little, big).
    #[serde(default)]
    pub endianness: Option<Endianness>,
    #[serde(flatten)]
    pub params: PoolingParams,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmbeddingData {
    pub index: usize,
    pub object: &'static str,
    pub embedding: EmbeddingValue,
}

#[utoipa::path(post, tag = "Embeddings (OpenAI)", path = "/v1/embeddings", description = "OpenAI embeddings (also at /embeddings).", request_body = EmbeddingRequest,
    responses(
        (status = 200, body = ListResponse<EmbeddingData>),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<EmbeddingRequest>,
) -> Result<axum::response::Response, ApiError> {
    AppState::require_input(&request.input, request.messages.as_ref())?;
    let (engine, permit) = state.begin(request.model.as_deref(), Task::Embed, "Embeddings")?;
    let params = request.params.verify(Task::Embed, engine.spec())?.with_prompt_name(request.prompt_name.as_deref(), engine.spec())?;
    let prompts = state.inputs(&request.input, request.messages.as_ref(), engine.spec().images).await?;
    let (outputs, tokens) = engine.encode(prompts, &params).await?;
    let format = request.encoding_format.unwrap_or_default();
    let (dtype, endianness) = (request.embed_dtype.unwrap_or_default(), request.endianness.unwrap_or_default());
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let PoolingOutput::Vector(v) = output else {
                return Err(ApiError::Internal("embedding task returned per-token output".into()));
            };
            let embedding = match format {
                EncodingFormat::Float => EmbeddingValue::Float(v),
                EncodingFormat::Base64 => EmbeddingValue::Base64(encoding::base64_as(&v, dtype, endianness)),
            };
            Ok(EmbeddingData { index, object: "embedding", embedding })
        })
        .collect::<Result<Vec<_>, _>>()?;
    OffRuntimeJson(ListResponse::new("embd", &headers, engine, data, tokens)).into_response(permit).await
}

