//! `POST /invocations` and `/ping` (GET or POST): SageMaker's routes, as vLLM serves them.
//! `/invocations` takes the body of any pooling route and answers as that route would; the
//! route is chosen by the body's shape, in vLLM's order, among those the model serves:
//!
//! 1. embeddings (`input` or `messages`), when the model's pooling task is `embed`;
//! 2. classify (`input` or `messages`), when it is `classify`;
//! 3. rerank (`query` and `documents`), then score (`queries` with `documents` or `items`,
//!    `data_1`/`data_2`, `text_1`/`text_2`), when the model scores;
//! 4. pooling (`input` or `messages`).
//!
//! A body none of them takes is a 400 naming the request types the model accepts. `/ping` is
//! `/health`.

use super::error::ApiError;
use super::json::{from_value, ApiJson};
use super::AppState;
use crate::pooling::Task;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::Value;

/// The routes `/invocations` can hand a body to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Embeddings,
    Classify,
    Rerank,
    Score,
    Pooling,
}

impl Route {
    fn request_type(self) -> &'static str {
        match self {
            Route::Embeddings => "EmbeddingRequest",
            Route::Classify => "ClassificationRequest",
            Route::Rerank => "RerankRequest",
            Route::Score => "ScoreRequest",
            Route::Pooling => "PoolingRequest",
        }
    }

    /// Whether the body has this route's required fields.
    fn takes(self, body: &Value) -> bool {
        let has = |field: &str| body.get(field).is_some_and(|v| !v.is_null());
        match self {
            Route::Embeddings | Route::Classify | Route::Pooling => has("input") || has("messages"),
            Route::Rerank => has("query") && has("documents"),
            Route::Score => {
                (has("queries") && (has("documents") || has("items")))
                    || (has("data_1") && has("data_2"))
                    || (has("text_1") && has("text_2"))
            }
        }
    }
}

/// The routes a model serves, in the order `/invocations` tries them.
fn routes(spec: &crate::loader::model_spec::ModelSpec) -> Vec<Route> {
    let mut routes = Vec::new();
    match spec.pooling_task {
        Task::Embed => routes.push(Route::Embeddings),
        Task::Classify => routes.push(Route::Classify),
        _ => {}
    }
    if spec.scores() {
        routes.extend([Route::Rerank, Route::Score]);
    }
    routes.push(Route::Pooling);
    routes
}

#[utoipa::path(post, tag = "SageMaker", path = "/invocations", description = "Any pooling route's body, answered as that route (vLLM's order; TEI's bodies as TEI's /invocations).", request_body = Object, responses((status = 200, body = Object), super::error::AnyErrorResponses))]
pub async fn invocations(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let model = body.get("model").and_then(Value::as_str).map(str::to_string);
    let engine = state.model(model.as_deref())?;
    let candidates = routes(engine.spec());
    let Some(route) = candidates.iter().copied().find(|r| r.takes(&body)) else {
        // A TEI body (SageMaker's TEI images answer /invocations too): TEI's dispatch.
        if body.get("inputs").is_some() || (body.get("query").is_some() && body.get("texts").is_some()) {
            return Ok(super::tei::invoke(&state, body).await);
        }
        let names: Vec<String> = candidates.iter().map(|r| format!("'{}'", r.request_type())).collect();
        return Err(ApiError::bad_request(format!("Cannot find suitable handler for request. Expected one of: [{}]", names.join(", "))));
    };
    let state = State(state);
    Ok(match route {
        Route::Embeddings => super::embeddings::create(state, headers, ApiJson(from_value(body)?)).await?,
        Route::Classify => super::classify::create(state, headers, ApiJson(from_value(body)?)).await?.into_response(),
        Route::Rerank => super::rerank::create(state, headers, ApiJson(body)).await?.into_response(),
        Route::Score => super::score::create(state, headers, ApiJson(from_value(body)?)).await?.into_response(),
        Route::Pooling => super::pooling::create(state, headers, ApiJson(from_value(body)?)).await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::model_spec::ModelSpec;
    use serde_json::json;

    #[test]
    fn bodies_go_where_vllm_sends_them() {
        let spec = ModelSpec::for_tests(8, 16);
        let route = |body: Value| routes(&spec).into_iter().find(|r| r.takes(&body));
        assert_eq!(route(json!({"input": "a"})), Some(Route::Embeddings));
        assert_eq!(route(json!({"messages": [{"role": "user", "content": "a"}]})), Some(Route::Embeddings));
        assert_eq!(route(json!({"query": "q", "documents": ["d"]})), Some(Route::Rerank));
        assert_eq!(route(json!({"queries": "q", "items": ["d"]})), Some(Route::Score));
        assert_eq!(route(json!({"text_1": "q", "text_2": "d"})), Some(Route::Score));
        assert_eq!(route(json!({"prompt": "a"})), None);
        let mut reward = ModelSpec::for_tests(8, 16);
        reward.pooling_task = Task::TokenClassify;
        assert_eq!(routes(&reward), vec![Route::Pooling]);
    }
}
