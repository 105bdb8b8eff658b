//! Hugging Face Text Embeddings Inference's routes, so that a TEI user switches by changing
//! the image: `/embed`, `/embed_all`, `/embed_sparse`, `/predict`, `/rerank` (TEI's body),
//! `/similarity`, `/decode`, `/tokenize` (TEI's body), `/vertex`, `/info`, and `POST /` (TEI's
//! model-kind dispatch, also `/invocations` for TEI bodies). TEI 1.9's field names, defaults,
//! response shapes, validation order and messages, and its error shape:
//! `{"error": "...", "error_type": "Validation" | "Empty" | "Backend" | "Overloaded" |
//! "Tokenizer" | "Unhealthy"}` (422, 400, 424, 429, 422, 503).
//!
//! TEI's own decisions kept here: `truncate` defaults to true (TEI's `--auto-truncate`); a
//! batch over `--max-client-batch-size` is a 422; `/predict` and `/rerank` use softmax (sigmoid
//! for one label) over the raw logits unless `raw_scores`, and sort by score with ties in
//! reverse input order; `/embed`'s `dimensions` cuts any model's vector (then normalizes);
//! model kinds as TEI decides them: an embedding model, a SPLADE model, a classifier, a
//! reranker (a classifier with one label).
//!
//! **Decisions** where TEI is silent or differs by accident: a malformed body answers in TEI's
//! JSON error shape (TEI's framework answers plain text): 400 for invalid JSON, 422 for a
//! wrong shape; requests may name a `model` (TEI serves one; with several models here a
//! request without one goes to the only model of the kind the route needs). On `/rerank` a
//! body with `texts` and no `documents` is TEI's; with `documents` it is Cohere's / Jina's /
//! vLLM's ([`super::rerank`]). On `/tokenize` a body with `inputs` and neither `prompt` nor
//! `messages` is TEI's. `/embed_all` returns each token's vector after the folder's Dense
//! layers (none for most models), not normalized.

//!
//! A file a subject: `error` (the error shape and the body extractor), `inputs` (the fields the
//! embedding routes share), `embeddings`, `scores` (`/predict`, `/rerank`), `tokens`
//! (`/decode`, `/tokenize`); here, which model a request goes to, TEI's dispatch by model kind
//! (`POST /`, `/vertex`, `/invocations`) and `/info`.

pub mod embeddings;
pub mod error;
pub mod inputs;
pub mod scores;
pub mod tokens;

use crate::api::pooling::SparseValue;
use crate::api::AppState;
use crate::engine::Engine;
use crate::loader::model_spec::ModelSpec;
use crate::pooling::Task;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use embeddings::{embed_inner, embed_sparse_inner};
use error::{from_value, TeiError, TeiJson};
use scores::{predict_inner, rerank_inner, PredictResponse, Rank};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// TEI's model kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::api) enum Kind {
    Embedding,
    Splade,
    Classifier,
    Reranker,
}

impl Kind {
    pub(in crate::api) fn of(spec: &ModelSpec) -> Option<Kind> {
        if spec.m3 {
            // BGE-M3 is an embedding model to TEI; its lexical weights are on /embed_sparse too.
            return Some(Kind::Embedding);
        }
        if spec.supports(Task::Classify) {
            Some(if spec.num_labels == 1 { Kind::Reranker } else { Kind::Classifier })
        } else if spec.supports(Task::EmbedSparse) {
            Some(Kind::Splade)
        } else if spec.supports(Task::Embed) {
            Some(Kind::Embedding)
        } else {
            None
        }
    }
}

/// The served name a TEI request goes to: the model it names, else the only one, else the
/// only one `fits` (several models serve here; TEI serves one); `None` leaves the choice to
/// [`AppState::model`] (which then asks for a name).
pub(super) fn pick(state: &AppState, name: Option<&str>, fits: impl Fn(&ModelSpec) -> bool) -> Result<Option<String>, TeiError> {
    if name.is_some() || state.served_names().count() == 1 {
        return Ok(name.map(str::to_string));
    }
    let engines = state.engines()?;
    let fitting: Vec<&Engine> = engines.iter().filter(|e| fits(e.spec())).collect();
    Ok(match fitting.as_slice() {
        [one] => Some(one.spec().served_name.clone()),
        _ => None,
    })
}

/// The engine a TEI request reads (its tokenizer, its description), without model work.
pub(in crate::api) fn model(state: &AppState, name: Option<&str>, fits: impl Fn(&ModelSpec) -> bool) -> Result<Engine, TeiError> {
    Ok(state.model(pick(state, name, fits)?.as_deref())?)
}

/// A TEI request's way into the model: [`pick`], then [`AppState::begin`] with the route's
/// `check`.
pub(super) fn begin<T>(
    state: &AppState,
    name: Option<&str>,
    fits: impl Fn(&ModelSpec) -> bool,
    check: impl FnOnce(&Engine) -> Result<T, TeiError>,
) -> Result<(Engine, tokio::sync::OwnedSemaphorePermit, T), TeiError> {
    state.begin(pick(state, name, fits)?.as_deref(), check)
}

pub(super) fn batch_size(state: &AppState, n: usize) -> Result<(), TeiError> {
    let max = state.options().max_client_batch_size;
    if n > max {
        return Err(TeiError::validation(format!("batch size {n} > maximum allowed batch size {max}")));
    }
    Ok(())
}

/// `/vertex`'s request: Vertex AI's `instances`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct VertexRequest {
    #[schema(value_type = Vec<Object>)]
    pub instances: Vec<Value>,
}

/// What a TEI route answers, for the routes that answer for another (`/vertex`, `POST /`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Answer {
    Embeddings(Vec<Vec<f32>>),
    Sparse(Vec<Vec<SparseValue>>),
    Predictions(PredictResponse),
    Ranks(Vec<Rank>),
}

/// One body, answered as TEI's route for it: a rerank body (`query` and `texts`) reranks,
/// anything else goes where the model kind sends it (predict, sparse or dense embed).
async fn dispatch(state: &AppState, body: Value) -> Result<Answer, TeiError> {
    if body.get("query").is_some_and(Value::is_string) && body.get("texts").is_some_and(Value::is_array) {
        return Ok(Answer::Ranks(rerank_inner(state, from_value(body)?).await?));
    }
    let name = body.get("model").and_then(Value::as_str).map(str::to_string);
    let engine = model(state, name.as_deref(), |s| Kind::of(s).is_some())?;
    Ok(match Kind::of(engine.spec()) {
        Some(Kind::Classifier) | Some(Kind::Reranker) => Answer::Predictions(predict_inner(state, from_value(body)?).await?),
        Some(Kind::Splade) => Answer::Sparse(embed_sparse_inner(state, from_value(body)?).await?),
        _ => Answer::Embeddings(embed_inner(state, from_value(body)?).await?),
    })
}

#[utoipa::path(post, tag = "TEI", path = "/vertex", description = "TEI's Vertex AI route: each instance answered as its TEI route.", request_body = VertexRequest, responses((status = 200, body = Object), crate::api::error::TeiErrorResponses))]
pub async fn vertex(State(state): State<AppState>, TeiJson(request): TeiJson<VertexRequest>) -> Result<Json<Predictions>, TeiError> {
    // One after another: each instance is a request's worth of work, which the engine batches
    // with everything else anyway.
    let mut predictions = Vec::with_capacity(request.instances.len());
    for instance in request.instances {
        predictions.push(dispatch(&state, instance).await?);
    }
    Ok(Json(Predictions { predictions }))
}

/// `/vertex`'s answer.
#[derive(Debug, Serialize)]
pub struct Predictions {
    pub predictions: Vec<Answer>,
}

/// `POST /` (and `/invocations` with a TEI body): TEI's dispatch by model kind.
pub async fn root(State(state): State<AppState>, TeiJson(body): TeiJson<Value>) -> Result<Json<Answer>, TeiError> {
    dispatch(&state, body).await.map(Json)
}

/// Answers a TEI body handed over by another route (`/invocations`).
pub async fn invoke(state: &AppState, body: Value) -> Response {
    dispatch(state, body).await.map(Json).into_response()
}

#[derive(Debug, Deserialize)]
pub struct InfoQuery {
    pub model: Option<String>,
}

/// `GET /info`: TEI's description of the served model (`?model=NAME` with several).
#[utoipa::path(get, tag = "TEI", path = "/info", description = "TEI: the served model.", responses((status = 200, body = Object), crate::api::error::TeiErrorResponses))]
pub async fn info(State(state): State<AppState>, Query(query): Query<InfoQuery>) -> Result<Json<Value>, TeiError> {
    let engine = state.model(query.model.as_deref())?;
    let spec = engine.spec();
    let labels = || {
        let id2label: serde_json::Map<String, Value> =
            spec.labels.iter().enumerate().map(|(i, l)| (i.to_string(), l.clone().into())).collect();
        let label2id: serde_json::Map<String, Value> = spec.labels.iter().enumerate().map(|(i, l)| (l.clone(), i.into())).collect();
        serde_json::json!({"id2label": id2label, "label2id": label2id})
    };
    let model_type = match Kind::of(spec) {
        Some(Kind::Classifier) => serde_json::json!({"classifier": labels()}),
        Some(Kind::Reranker) => serde_json::json!({"reranker": labels()}),
        Some(Kind::Splade) => serde_json::json!({"embedding": {"pooling": "splade"}}),
        _ => serde_json::json!({"embedding": {"pooling": format!("{:?}", spec.pooling).to_lowercase().replace("last", "last_token")}}),
    };
    let limits = engine.limits();
    Ok(Json(serde_json::json!({
        "model_id": spec.root,
        "model_sha": null,
        "model_dtype": spec.dtype,
        "model_dtype_reason": spec.dtype_reason,
        "served_model_name": spec.served_name,
        "model_type": model_type,
        "max_concurrent_requests": limits.max_concurrent_requests,
        "max_input_length": spec.max_model_len,
        "max_batch_tokens": limits.max_batch_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": state.options().max_client_batch_size,
        "auto_truncate": true,
        "tokenization_workers": limits.tokenizer_workers,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null
    })))
}
