//! `POST /pooling`: vLLM's task-generic endpoint. `task` picks embed, classify, token_embed,
//! token_classify or embed_sparse (default: the model's first task); per-token tasks answer
//! nested lists, embed_sparse lists of `{"index", "value"}`.

use super::error::{ApiError, ErrorResponses};
use super::json::{ApiJson, OffRuntimeJson};
use super::{admit, AppState, ListResponse};
use crate::engine::PoolingOutput;
use crate::pooling::Task;
use crate::engine::params::PoolingParams;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct PoolingRequest {
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
    pub task: Option<String>,
    /// A sentence-transformers prompt of the model, prepended to every text input.
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(flatten)]
    pub params: PoolingParams,
}

/// One non-zero weight of a sparse embedding (TEI's `SparseValue`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SparseValue {
    pub index: u32,
    pub value: f32,
}

impl SparseValue {
    pub fn list(weights: Vec<(u32, f32)>) -> Vec<SparseValue> {
        weights.into_iter().map(|(index, value)| SparseValue { index, value }).collect()
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PoolingValue {
    Vector(Vec<f32>),
    Tokens(Vec<Vec<f32>>),
    Sparse(Vec<SparseValue>),
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PoolingData {
    pub index: usize,
    pub object: &'static str,
    pub data: PoolingValue,
}

/// Python's repr of a tuple of strings, as vLLM prints the supported tasks.
fn py_tuple(tasks: &[Task]) -> String {
    let items: Vec<String> = tasks.iter().map(|t| format!("'{t}'")).collect();
    match items.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", items.join(", ")),
    }
}

#[utoipa::path(post, tag = "Pooling (vLLM)", path = "/pooling", description = "Any pooling task (vLLM).", request_body = PoolingRequest,
    responses(
        (status = 200, body = ListResponse<PoolingData>),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<PoolingRequest>,
) -> Result<axum::response::Response, ApiError> {
    AppState::require_input(&request.input, request.messages.as_ref())?;
    let engine = state.model(request.model.as_deref())?;
    let spec = engine.spec();
    // `score` is a pair task: /score and /rerank serve it.
    let poolable: Vec<Task> = spec.tasks.iter().copied().filter(|t| *t != Task::Score).collect();
    let task = match request.task.as_deref() {
        None => poolable.first().copied().ok_or_else(|| ApiError::bad_request("The model does not support Pooling API"))?,
        Some(name) => name.parse::<Task>().ok().filter(|t| poolable.contains(t)).ok_or_else(|| ApiError::BadRequest {
            message: format!("Unsupported task: '{name}' Supported tasks: {}", py_tuple(&poolable)),
            param: Some("task"),
        })?,
    };
    let permit = admit(engine)?;
    let params = request.params.verify(task, spec)?.with_prompt_name(request.prompt_name.as_deref(), spec)?;
    let prompts = state.inputs(&request.input, request.messages.as_ref(), spec.images).await?;
    let (outputs, tokens) = engine.encode(prompts, &params).await?;
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let data = match output {
                PoolingOutput::Vector(v) => PoolingValue::Vector(v),
                PoolingOutput::Tokens(t) => PoolingValue::Tokens(t),
                PoolingOutput::Sparse(s) => PoolingValue::Sparse(SparseValue::list(s)),
            };
            PoolingData { index, object: "pooling", data }
        })
        .collect();
    OffRuntimeJson(ListResponse::new("pool", &headers, engine, data, tokens)).into_response(permit).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_print_as_python_tuples() {
        assert_eq!(py_tuple(&[Task::Embed, Task::TokenEmbed]), "('embed', 'token_embed')");
        assert_eq!(py_tuple(&[Task::Classify]), "('classify',)");
    }
}
