//! `POST /pooling` with `data` (vLLM's `IOProcessorRequest`): the model's IO-processor plugin
//! turns `data` into prompts and the model's outputs into the response's `data`
//! ([`crate::plugin`]). vLLM's checks in its order: `dimensions` refused, then a model without
//! a plugin refused; the task is `plugin` whatever the body says.

use super::error::ApiError;
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

/// vLLM's message for a plugin request to a model without an IO-processor plugin.
pub const NO_PLUGIN: &str = "No IOProcessor plugin installed. Please refer to the documentation and to the 'prithvi_geospatial_mae_io_processor' offline inference example for more details.";

/// What a plugin request brings besides `data`.
pub struct PluginCall<'a> {
    pub model: Option<&'a str>,
    pub request_id: Option<&'a str>,
    /// vLLM refuses `dimensions` on a plugin request.
    pub dimensions: bool,
}

pub async fn run(state: &AppState, headers: &HeaderMap, call: PluginCall<'_>, data: serde_json::Value) -> Result<Response, ApiError> {
    let (engine, _permit, plugin) = state.begin(call.model, |engine| {
        if call.dimensions {
            return Err(ApiError::BadRequest { message: "dimensions is currently not supported".into(), param: Some("dimensions") });
        }
        state.plugin(engine).ok_or_else(|| ApiError::BadRequest { message: NO_PLUGIN.into(), param: Some("task") })
    })?;
    let request_id = response_id("pooling", headers, call.request_id);
    let output = plugin.process(&engine, data, Some(&request_id)).await?;
    Ok(Json(PluginResponse { request_id, created_at: unix_now(), data: output }).into_response())
}
