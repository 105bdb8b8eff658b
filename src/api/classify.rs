//! `POST /classify`: class probabilities (or raw logits with `use_activation: false`) and the
//! winning label for every input, as vLLM answers it.

use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::{AppState, ListResponse};
use crate::engine::PoolingOutput;
use crate::pooling::Task;
use crate::engine::params::PoolingParams;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ClassifyRequest {
    pub input: serde_json::Value,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(flatten)]
    pub params: PoolingParams,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClassifyData {
    pub index: usize,
    pub label: String,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}

use crate::pooling::classifier::argmax;

#[utoipa::path(post, tag = "Classification", path = "/classify", description = "Class probabilities per input.", request_body = ClassifyRequest,
    responses(
        (status = 200, body = ListResponse<ClassifyData>),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ClassifyRequest>,
) -> Result<Json<ListResponse<ClassifyData>>, ApiError> {
    let (engine, _permit) = state.begin(request.model.as_deref(), Task::Classify, "Classification")?;
    let params = request.params.verify(Task::Classify, engine.spec())?;
    let prompts = state.prompts(&request.input)?;
    let (outputs, tokens) = engine.encode(prompts, &params).await?;
    let labels = &engine.spec().labels;
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let PoolingOutput::Vector(probs) = output else {
                return Err(ApiError::Internal("classification returned per-token output".into()));
            };
            let label = labels.get(argmax(&probs)).cloned().unwrap_or_default();
            Ok(ClassifyData { index, label, num_classes: probs.len(), probs })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(ListResponse::new("classify", &headers, engine, data, tokens)))
}

#[cfg(test)]
mod tests {
    use crate::pooling::classifier::argmax;

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 0.7, 0.2]), 1);
        assert_eq!(argmax(&[0.5, 0.5]), 0);
        assert_eq!(argmax(&[-3.0]), 0);
    }
}
