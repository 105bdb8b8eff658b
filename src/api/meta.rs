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
    pub root: String,
    pub max_model_len: usize,
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
    let data = state
        .engines()?
        .into_iter()
        .map(|engine| {
            let spec = engine.spec();
            ModelCard {
                id: spec.served_name.clone(),
                object: "model",
                created: state.started(),
                owned_by: "poolserve",
                root: spec.root.clone(),
                max_model_len: spec.max_model_len,
                tasks: spec.tasks.clone(),
            }
        })
        .collect();
    Ok(Json(ModelList { object: "list", data }))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Version {
    pub version: &'static str,
}

#[utoipa::path(get, tag = "Server", path = "/version", responses((status = 200, body = Version)))]
pub async fn version() -> Json<Version> {
    Json(Version { version: env!("CARGO_PKG_VERSION") })
}
