//! Infinity's media routes, `POST /embeddings_image` and `POST /embeddings_audio`: `input` is
//! one data URI or URL, or a list of them (`model`, `encoding_format`, `user` as on
//! `/v1/embeddings`), and the answer is `/v1/embeddings`' list. Each input is sent on as one
//! message holding that image or audio, so the media rules (allowed hosts, data URLs, the
//! pixel and duration limits) are `/v1/embeddings`' own. `/embeddings` with Infinity's
//! `modality` field reads its `input` the same way (`embeddings::read_modality`); a page retriever
//! (ColPali, ColQwen2) answers a matrix per input there, as Infinity does.

use super::embeddings::{self, media_messages, EmbeddingData, EmbeddingRequest};
use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::{AppState, ListResponse};
use axum::extract::State;
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{json, Value};

/// Infinity's `ImageEmbeddingInput` / `AudioEmbeddingInput`. Its default `model`,
/// `default/not-specified`, names the served model.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct MediaEmbeddingRequest {
    /// A data URI (`data:image/png;base64,…`, `data:audio/wav;base64,…`) or an http(s) URL of
    /// an allowed host, or a list of them.
    #[schema(value_type = Object)]
    pub input: Value,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[utoipa::path(post, tag = "Embeddings (Infinity)", path = "/embeddings_image", request_body = MediaEmbeddingRequest,
    description = "Infinity's image embeddings: `input` is a data URI or URL, or a list of them.",
    responses(
        (status = 200, description = "the embeddings, as /v1/embeddings answers", body = ListResponse<EmbeddingData>),
        ErrorResponses
    ))]
pub async fn image(
    state: State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<MediaEmbeddingRequest>,
) -> Result<axum::response::Response, ApiError> {
    embed(state, headers, request, |url| json!({"type": "image_url", "image_url": {"url": url}})).await
}

#[utoipa::path(post, tag = "Embeddings (Infinity)", path = "/embeddings_audio", request_body = MediaEmbeddingRequest,
    description = "Infinity's audio embeddings: `input` is a data URI or URL, or a list of them.",
    responses(
        (status = 200, description = "the embeddings, as /v1/embeddings answers", body = ListResponse<EmbeddingData>),
        ErrorResponses
    ))]
pub async fn audio(
    state: State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<MediaEmbeddingRequest>,
) -> Result<axum::response::Response, ApiError> {
    embed(state, headers, request, |url| json!({"type": "audio_url", "audio_url": {"url": url}})).await
}

/// The request as `/v1/embeddings` `messages`, one per input.
async fn embed(
    state: State<AppState>,
    headers: HeaderMap,
    request: MediaEmbeddingRequest,
    part: impl Fn(&str) -> Value,
) -> Result<axum::response::Response, ApiError> {
    let messages = media_messages(&request.input, part)?;
    // Infinity's clients send its placeholder model name when none is chosen.
    let model = request.model.filter(|m| m != "default/not-specified");
    let mut body = json!({"messages": messages, "model": model, "user": request.user});
    if let Some(format) = request.encoding_format {
        body["encoding_format"] = Value::String(format);
    }
    let request: EmbeddingRequest = serde_json::from_value(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    embeddings::create(state, headers, ApiJson(request)).await
}
