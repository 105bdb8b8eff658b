//! `POST /v1/embeddings` (and `/embeddings`): the OpenAI embeddings API with vLLM's pooling
//! parameters.

use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::{admit, AppState, ListResponse};
use crate::engine::PoolingOutput;
use crate::pooling::{PoolingParams, Task};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine as _;
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
    pub input: serde_json::Value,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    pub user: Option<String>,
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

/// Little-endian f32 bytes, base64-encoded (what the OpenAI SDK decodes with numpy).
pub fn encode_base64(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[utoipa::path(post, path = "/v1/embeddings", description = "OpenAI embeddings (also at /embeddings).", request_body = EmbeddingRequest,
    responses(
        (status = 200, body = ListResponse<EmbeddingData>),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<EmbeddingRequest>,
) -> Result<Json<ListResponse<EmbeddingData>>, ApiError> {
    let engine = state.engine_for(request.model.as_deref(), Task::Embed, "Embeddings")?;
    let _permit = admit(engine)?;
    let params = request.params.verify(Task::Embed, engine.spec())?;
    let prompts = state.prompts(&request.input)?;
    let (outputs, tokens) = engine.encode(prompts, &params).await?;
    let format = request.encoding_format.unwrap_or_default();
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let PoolingOutput::Vector(v) = output else {
                return Err(ApiError::Internal("embedding task returned per-token output".into()));
            };
            let embedding = match format {
                EncodingFormat::Float => EmbeddingValue::Float(v),
                EncodingFormat::Base64 => EmbeddingValue::Base64(encode_base64(&v)),
            };
            Ok(EmbeddingData { index, object: "embedding", embedding })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(ListResponse::new("embd", &headers, &state, data, tokens)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(encode_base64(&[1.0]), "AACAPw==");
    }
}
