//! `GET /health`, `GET /v1/models`, `GET /version`.

use super::error::ApiError;
use super::AppState;
use axum::extract::State;
use axum::Json;
use serde::Serialize;

/// 200 with an empty body once the model is loaded and warmed, 503 before and while draining
/// for shutdown.
pub async fn health(State(state): State<AppState>) -> Result<(), ApiError> {
    state.engine().map(|_| ())
}

#[derive(Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub max_model_len: usize,
}

#[derive(Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

pub async fn models(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let spec = state.engine()?.spec();
    Ok(Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: spec.served_name.clone(),
            object: "model",
            created: state.started(),
            owned_by: "poolserve",
            root: spec.root.clone(),
            max_model_len: spec.max_model_len,
        }],
    }))
}

#[derive(Serialize)]
pub struct Version {
    pub version: &'static str,
}

pub async fn version() -> Json<Version> {
    Json(Version { version: env!("CARGO_PKG_VERSION") })
}
