//! `POST /embed_sparse`: TEI's sparse-embedding endpoint for SPLADE models.
//! `{"inputs": str | [str], "truncate"?: bool, "truncation_direction"?: "Left" | "Right"}` →
//! one list of non-zero `{"index", "value"}` per input, in token-id order.

use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::pooling::SparseValue;
use super::{AppState};
use crate::engine::{PoolingOutput, Prompt};
use crate::loader::tokenizer::TruncationSide;
use crate::pooling::Task;
use crate::engine::params::PoolingParams;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SparseInputs {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
pub enum TruncationDirection {
    Left,
    Right,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct SparseRequest {
    pub inputs: SparseInputs,
    /// The served model (not in TEI's API; needed when several models serve SPLADE).
    #[serde(default)]
    pub model: Option<String>,
    /// Cut inputs longer than the model's limit instead of refusing them (TEI's default: no).
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<TruncationDirection>,
    /// A sentence-transformers prompt of the model, prepended to every input (TEI's field).
    #[serde(default)]
    pub prompt_name: Option<String>,
}

#[utoipa::path(post, tag = "Sparse embeddings (TEI)", path = "/embed_sparse", description = "SPLADE sparse embeddings (TEI).", request_body = SparseRequest,
    responses(
        (status = 200, body = Vec<Vec<SparseValue>>),
        ErrorResponses
    ))]
pub async fn create(State(state): State<AppState>, ApiJson(request): ApiJson<SparseRequest>) -> Result<Json<Vec<Vec<SparseValue>>>, ApiError> {
    let (engine, _permit) = match request.model.as_deref() {
        Some(name) => state.begin(Some(name), Task::EmbedSparse, "Sparse Embeddings")?,
        None => state.begin_unnamed(Task::EmbedSparse, "Sparse Embeddings")?,
    };
    let params = PoolingParams {
        truncate_prompt_tokens: request.truncate.unwrap_or(false).then_some(-1),
        truncation_side: request.truncation_direction.map(|d| match d {
            TruncationDirection::Left => TruncationSide::Left,
            TruncationDirection::Right => TruncationSide::Right,
        }),
        ..Default::default()
    }
    .verify(Task::EmbedSparse, engine.spec())?
    .with_prompt_name(request.prompt_name.as_deref(), engine.spec())?;
    let texts = match request.inputs {
        SparseInputs::One(text) => vec![text],
        SparseInputs::Many(texts) if texts.is_empty() => {
            return Err(ApiError::BadRequest { message: "inputs must not be empty".into(), param: Some("inputs") })
        }
        SparseInputs::Many(texts) => texts,
    };
    state.check_batch_size(texts.len())?;
    let (outputs, _) = engine.encode(texts.into_iter().map(Prompt::Text).collect(), &params).await?;
    outputs
        .into_iter()
        .map(|output| match output {
            PoolingOutput::Sparse(weights) => Ok(SparseValue::list(weights)),
            _ => Err(ApiError::Internal("the sparse head returned dense output".into())),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Json)
}
