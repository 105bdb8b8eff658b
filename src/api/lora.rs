//! `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`: LoRA adapters added and removed
//! while serving, as vLLM's routes do. They exist only with `--allow-runtime-lora-updating`
//! (or vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`), behind `--api-key`; without the switch
//! they are absent (404 `{"detail": "Not Found"}`, as FastAPI answers for vLLM).
//!
//! Bodies and messages are vLLM's; success is its plain-text line. They are not in
//! /openapi.json, which describes the routes every server has. One difference: an adapter
//! that cannot be applied (rank over `--max-lora-rank`, DoRA, a module this model lacks) is a
//! 400 naming the reason, where vLLM answers 500 with the same reason.

use super::error::ApiError;
use super::json::ApiJson;
use super::AppState;
use crate::engine::Engine;
use crate::loader::LoadError;
use axum::extract::State;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct LoadLoraRequest {
    pub lora_name: String,
    pub lora_path: String,
    /// Replace an adapter of that name.
    #[serde(default)]
    pub load_inplace: bool,
    /// The served model the adapter adapts (ours; default: the first that serves adapters).
    #[serde(default)]
    pub base_model_name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct UnloadLoraRequest {
    pub lora_name: String,
    /// vLLM's field, unused there too.
    #[serde(default)]
    pub lora_int_id: Option<i64>,
}

/// The model an adapter request is about: `base_model_name`, else the first serving adapters.
fn base_model(state: &AppState, base_model_name: Option<&str>) -> Result<Engine, ApiError> {
    let engine = match base_model_name {
        Some(name) => state.model(Some(name))?,
        None => state.lora_engines().next().ok_or_else(|| ApiError::BadRequest {
            message: "No served model takes LoRA adapters: start the server with --enable-lora".into(),
            param: None,
        })?,
    };
    if engine.lora().is_none() || engine.adapter().is_some() {
        return Err(ApiError::BadRequest {
            message: format!("The model `{}` does not take LoRA adapters (--enable-lora)", engine.served_name()),
            param: Some("base_model_name"),
        });
    }
    Ok(engine)
}

fn adapter_error(e: LoadError) -> ApiError {
    match e {
        LoadError::AdapterNotFound { .. } => ApiError::NotFound(e.to_string()),
        LoadError::Adapter(message) => ApiError::BadRequest { message, param: None },
        // The registry reports adapters as the two above; anything else of the loader's is still
        // about the adapter the request named.
        other => ApiError::BadRequest { message: other.to_string(), param: None },
    }
}

pub async fn load(State(state): State<AppState>, ApiJson(request): ApiJson<LoadLoraRequest>) -> Result<String, ApiError> {
    if request.lora_name.is_empty() || request.lora_path.is_empty() {
        return Err(ApiError::BadRequest { message: "Both 'lora_name' and 'lora_path' must be provided.".into(), param: None });
    }
    let engine = base_model(&state, request.base_model_name.as_deref())?;
    let name = request.lora_name.clone();
    // An adapter's name is a `model`: it must not hide a served model or another model's adapter.
    let taken = state.served_names().any(|n| n == name)
        || state.lora_engines().any(|e| e.spec().served_name != engine.spec().served_name && e.with_adapter(&name).is_some());
    if taken {
        return Err(ApiError::BadRequest {
            message: format!("The name '{name}' is taken by another model or adapter."),
            param: Some("lora_name"),
        });
    }
    // Reading and packing the adapter is file and CPU work: off the async runtime.
    let loaded = tokio::task::spawn_blocking(move || {
        let registry = engine.lora().ok_or(LoadError::Adapter("LoRA is not enabled".into()))?;
        match request.load_inplace {
            true => registry.replace(&request.lora_name, &request.lora_path),
            false => registry.load(&request.lora_name, &request.lora_path),
        }
    })
    .await
    .map_err(|_| ApiError::Internal("loading the adapter failed".into()))?;
    let adapter = loaded.map_err(adapter_error)?;
    tracing::info!("LoRA adapter `{}` loaded from {} (rank {}, {} floats)", adapter.name, adapter.path, adapter.rank, adapter.floats);
    Ok(format!("Success: LoRA adapter '{name}' added successfully."))
}

pub async fn unload(State(state): State<AppState>, ApiJson(request): ApiJson<UnloadLoraRequest>) -> Result<String, ApiError> {
    let name = request.lora_name;
    if name.is_empty() {
        return Err(ApiError::BadRequest { message: "'lora_name' needs to be provided to unload a LoRA adapter.".into(), param: None });
    }
    let removed = state.lora_engines().any(|engine| engine.lora().is_some_and(|registry| registry.unload(&name)));
    if !removed {
        return Err(ApiError::NotFound(format!("The lora adapter '{name}' cannot be found.")));
    }
    tracing::info!("LoRA adapter `{name}` unloaded");
    Ok(format!("Success: LoRA adapter '{name}' removed successfully."))
}
