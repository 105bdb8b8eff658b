//! `POST /pooling` with `data` (vLLM's `IOProcessorRequest`): the model's IO-processor plugin
//! turns `data` into prompts and the model's outputs into the response's `data`
//! ([`crate::plugin`]). vLLM's checks in its order: `dimensions` refused, then a model without
//! a plugin refused; the task is `plugin` whatever the body says.

use super::error::ApiError;
use super::pooling::PoolingRequest;
use super::{response_id, unix_now, AppState};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// vLLM's `IOProcessorResponse`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PluginResponse {
    pub request_id: String,
    pub created_at: u64,
    /// The plugin's output, as it returned it.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// A body is a plugin request when it sends `data` and neither `input` nor `messages`.
pub fn is_plugin_request(request: &PoolingRequest) -> bool {
    request.data.is_some() && request.input.is_null() && request.messages.is_none()
}

pub async fn run(state: &AppState, headers: &HeaderMap, mut request: PoolingRequest) -> Result<Response, ApiError> {
    let (engine, _permit, plugin) = state.begin(request.model.as_deref(), |engine| {
        if request.params.dimensions.is_some() {
            return Err(ApiError::BadRequest { message: "dimensions is currently not supported".into(), param: Some("dimensions") });
        }
        state.plugin(engine).ok_or_else(|| ApiError::BadRequest { message: super::pooling::NO_PLUGIN.into(), param: Some("task") })
    })?;
    let request_id = response_id("pooling", headers, request.request_id.as_deref());
    let data = request.data.take().unwrap_or_default();
    let output = plugin.process(&engine, data, Some(&request_id)).await?;
    Ok(Json(PluginResponse { request_id, created_at: unix_now(), data: output }).into_response())
}
