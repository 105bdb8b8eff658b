//! `GET /health`, `GET /v1/models`, `GET /version`.

use super::error::{ApiError, ErrorBody};
use super::AppState;
use axum::extract::State;
use axum::Json;
use serde::Serialize;

/// 200 with an empty body once every model is loaded and warmed, 503 before, while draining for
/// shutdown, and when an engine cannot serve (its model thread is gone: a liveness probe then
/// restarts the pod).
#[utoipa::path(get, tag = "Server", path = "/health", responses((status = 200, description = "ready"), (status = 503, description = "loading, shutting down, or the engine has stopped", body = ErrorBody)))]
pub async fn health(State(state): State<AppState>) -> Result<(), ApiError> {
    for engine in state.engines()? {
        engine.check_alive()?;
    }
    Ok(())
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// The model folder, or a LoRA adapter's folder.
    pub root: String,
    /// For a LoRA adapter, the served model it adapts; `null` for models (vLLM's card).
    pub parent: Option<String>,
    /// `null` for a model on demand not loaded now.
    pub max_model_len: Option<usize>,
    /// Models on demand (`--models-dir`) only: whether it is loaded now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<bool>,
    /// The tasks it serves (`embed`, `classify`, `score`, `token_embed`, `token_classify`,
    /// `embed_sparse`), the first being /pooling's default.
    #[schema(value_type = Vec<String>)]
    pub tasks: Vec<crate::pooling::Task>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[utoipa::path(get, tag = "Server", path = "/v1/models", responses((status = 200, body = ModelList), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn models(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let mut data = Vec::new();
    let on_demand = state.loads_on_demand().then_some(true);
    if state.loads_on_demand() {
        if state.is_draining() {
            return Err(ApiError::Unavailable("The server is shutting down".into()));
        }
        // Every model that can be served, loaded or not.
        for (name, root, engine) in state.catalogue() {
            let Some(engine) = engine else {
                data.push(ModelCard {
                    id: name,
                    object: "model",
                    created: state.started(),
                    owned_by: "poolserve",
                    root,
                    parent: None,
                    max_model_len: None,
                    loaded: Some(false),
                    tasks: Vec::new(),
                });
                continue;
            };
            push_cards(&mut data, &state, &engine, on_demand);
        }
    } else {
        for engine in state.engines()? {
            push_cards(&mut data, &state, &engine, on_demand);
        }
    }
    Ok(Json(ModelList { object: "list", data }))
}

/// A model's card, then its adapters' (as vLLM lists them).
fn push_cards(data: &mut Vec<ModelCard>, state: &AppState, engine: &crate::engine::Engine, loaded: Option<bool>) {
    let spec = engine.spec();
    let card = |id: &str, root: &str, parent: Option<String>| ModelCard {
        id: id.to_string(),
        object: "model",
        created: state.started(),
        owned_by: "poolserve",
        root: root.to_string(),
        parent,
        max_model_len: Some(spec.max_model_len),
        loaded,
        tasks: spec.tasks.clone(),
    };
    data.push(card(&spec.served_name, &spec.root, None));
    for adapter in engine.lora().map(|l| l.list()).unwrap_or_default() {
        data.push(card(&adapter.name, &adapter.path, Some(spec.served_name.clone())));
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Version {
    pub version: &'static str,
}

#[utoipa::path(get, tag = "Server", path = "/version", responses((status = 200, body = Version)))]
pub async fn version() -> Json<Version> {
    Json(Version { version: env!("CARGO_PKG_VERSION") })
}
