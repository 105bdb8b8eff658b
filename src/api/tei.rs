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

use super::error::{ApiError, ErrorNote};
use super::pooling::SparseValue;
use super::AppState;
use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::engine::{Engine, EngineError};
use crate::input::tokenizer::TruncationSide;
use crate::input::InputError;
use crate::input::Prompt;
use crate::loader::spec::ModelSpec;
use crate::pooling::Task;
use axum::body::Bytes;
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An error in TEI's shape.
#[derive(Debug)]
pub struct TeiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl TeiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        TeiError { status, kind, message: message.into() }
    }

    fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Validation", message)
    }

    fn empty(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Empty", message)
    }

    fn backend(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::FAILED_DEPENDENCY, "Backend", format!("Backend error: {message}"))
    }
}

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(serde_json::json!({"error": self.message, "error_type": self.kind}))).into_response();
        response.extensions_mut().insert(ErrorNote(self.message));
        response
    }
}

/// Errors of the layers below, in TEI's words where TEI has them.
impl From<EngineError> for TeiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Input(e) => e.into(),
            EngineError::Overloaded(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, "Overloaded", "Model is overloaded"),
            EngineError::Model(message) => Self::backend(message),
            EngineError::Stopped | EngineError::Dead(_) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", "unhealthy"),
            other => Self::validation(format!("Input validation error: {other}")),
        }
    }
}

/// The input layer's errors, in TEI's words where TEI has them.
impl From<InputError> for TeiError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::InputTooLong { max, got, .. } => {
                Self::validation(format!("Input validation error: `inputs` must have less than {max} tokens. Given: {got}"))
            }
            InputError::TextTooLong { bytes, limit, .. } => {
                Self::validation(format!("Input validation error: `inputs` must have less than {limit} characters. Given: {bytes}"))
            }
            InputError::EmptyPrompt => Self::empty("Input validation error: `inputs` cannot be empty"),
            InputError::Tokenizer(message) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Tokenizer", format!("tokenizer error {message}"))
            }
            InputError::Panicked(message) => Self::backend(message),
            InputError::Stopped => Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", "unhealthy"),
            other => Self::validation(format!("Input validation error: {other}")),
        }
    }
}

/// Errors of the HTTP layer's shared steps (the model's name, admission, parameters).
impl From<ApiError> for TeiError {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::TooManyRequests(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, "Overloaded", "Model is overloaded"),
            ApiError::Unavailable(_) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", message),
            ApiError::Internal(_) => Self::backend(message),
            other => Self::new(other.status(), "Validation", message),
        }
    }
}

/// TEI's JSON body extractor: failures in TEI's error shape.
pub struct TeiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for TeiJson<T> {
    type Rejection = TeiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, TeiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            TeiError::new(rejection.status(), "Validation", format!("Failed to buffer the request body: {}", rejection.body_text()))
        })?;
        parse(&bytes).map(TeiJson)
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TeiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => TeiError::validation(format!("Failed to deserialize the JSON body into the target type: {e}")),
        _ => TeiError::new(StatusCode::BAD_REQUEST, "Validation", format!("Failed to parse the request body as JSON: {e}")),
    })
}

fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, TeiError> {
    serde_json::from_value(value).map_err(|e| TeiError::validation(e.to_string()))
}

/// TEI's model kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Embedding,
    Splade,
    Classifier,
    Reranker,
}

impl Kind {
    fn of(spec: &ModelSpec) -> Option<Kind> {
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
fn pick(state: &AppState, name: Option<&str>, fits: impl Fn(&ModelSpec) -> bool) -> Result<Option<String>, TeiError> {
    if name.is_some() || state.served_names().count() == 1 {
        return Ok(name.map(str::to_string));
    }
    let engines = state.engines()?;
    let fitting: Vec<&&Engine> = engines.iter().filter(|e| fits(e.spec())).collect();
    Ok(match fitting.as_slice() {
        [one] => Some(one.spec().served_name.clone()),
        _ => None,
    })
}

/// The engine a TEI request reads (its tokenizer, its description), without model work.
fn model(state: &AppState, name: Option<&str>, fits: impl Fn(&ModelSpec) -> bool) -> Result<Engine, TeiError> {
    Ok(state.model(pick(state, name, fits)?.as_deref())?)
}

/// A TEI request's way into the model: [`pick`], then [`AppState::begin`] with the route's
/// `check`.
fn begin<T>(
    state: &AppState,
    name: Option<&str>,
    fits: impl Fn(&ModelSpec) -> bool,
    check: impl FnOnce(&Engine) -> Result<T, TeiError>,
) -> Result<(Engine, tokio::sync::OwnedSemaphorePermit, T), TeiError> {
    state.begin(pick(state, name, fits)?.as_deref(), check)
}

fn batch_size(state: &AppState, n: usize) -> Result<(), TeiError> {
    let max = state.options().max_client_batch_size;
    if n > max {
        return Err(TeiError::validation(format!("batch size {n} > maximum allowed batch size {max}")));
    }
    Ok(())
}

/// TEI's `truncation_direction`: `Left`/`left`/`Right`/`right`.
#[derive(Debug, Clone, Copy, Default, Deserialize, utoipa::ToSchema)]
pub enum TruncationDirection {
    #[serde(alias = "left")]
    Left,
    #[default]
    #[serde(alias = "right")]
    Right,
}

impl From<TruncationDirection> for TruncationSide {
    fn from(d: TruncationDirection) -> Self {
        match d {
            TruncationDirection::Left => TruncationSide::Left,
            TruncationDirection::Right => TruncationSide::Right,
        }
    }
}

/// One TEI input: a text or token ids.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum InputType {
    Text(String),
    Ids(Vec<u32>),
}

/// TEI's `inputs`: one input, or a list of them (`[]` is one empty id list, as in TEI).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Input {
    Single(InputType),
    Batch(Vec<InputType>),
}

impl Input {
    /// The inputs as prompts; an empty text or id list is refused as TEI refuses it (before
    /// special tokens would make it non-empty).
    fn prompts(self) -> Result<Vec<Prompt>, TeiError> {
        let prompt = |i: InputType| match i {
            InputType::Text(t) if t.is_empty() => Err(TeiError::empty("Input validation error: `inputs` cannot be empty")),
            InputType::Ids(ids) if ids.is_empty() => Err(TeiError::empty("Input validation error: `inputs` cannot be empty")),
            InputType::Text(t) => Ok(Prompt::Text(t)),
            InputType::Ids(ids) => Ok(Prompt::Tokens(ids)),
        };
        match self {
            Input::Single(one) => Ok(vec![prompt(one)?]),
            Input::Batch(many) => many.into_iter().map(prompt).collect(),
        }
    }
}

/// The fields every TEI embedding route shares.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct InputFields {
    pub inputs: Input,
    /// Cut over-long inputs (default true, TEI's `--auto-truncate`).
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// A sentence-transformers prompt of the model.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// The served model (not in TEI's API, which serves one).
    #[serde(default)]
    pub model: Option<String>,
}

impl InputFields {
    /// The pooling parameters for `task`; `activation` (normalize) as the route decides.
    fn params(&self, task: Task, spec: &ModelSpec, activation: bool) -> Result<ResolvedParams, TeiError> {
        let sent = PoolingParams {
            truncate_prompt_tokens: self.truncate.unwrap_or(true).then_some(-1),
            truncation_side: Some(self.truncation_direction.into()),
            ..Default::default()
        };
        let mut params = sent.verify(task, spec).map_err(|e| TeiError::validation(e.message))?;
        params.activation = activation;
        if self.prompt_name.is_some() {
            params.prompt = spec
                .prompts
                .resolve(self.prompt_name.as_deref())
                .map_err(|_| unknown_prompt(self.prompt_name.as_deref().unwrap_or(""), spec))?
                .map(Into::into);
        }
        Ok(params)
    }
}

/// TEI's words for a prompt name the model lacks.
fn unknown_prompt(name: &str, spec: &ModelSpec) -> TeiError {
    if spec.prompts.named.is_empty() {
        return TeiError::validation(format!("Input validation error: `default-prompt-name` is set to `{name}` but no prompts were found in the Sentence Transformers configuration"));
    }
    let keys: Vec<String> = spec.prompts.named.keys().map(|k| format!("{k:?}")).collect();
    TeiError::validation(format!(
        "Input validation error: `default-prompt-name` is set to `{name}` but it was not found in the Sentence Transformers prompts. Available prompts: [{}]",
        keys.join(", ")
    ))
}

/// `/embed`'s request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct EmbedRequest {
    #[serde(flatten)]
    pub fields: InputFields,
    #[serde(default = "yes")]
    pub normalize: bool,
    /// Keep the first `dimensions` values (then normalize).
    #[serde(default)]
    pub dimensions: Option<usize>,
}

fn yes() -> bool {
    true
}

async fn embed_inner(state: &AppState, request: EmbedRequest) -> Result<Vec<Vec<f32>>, TeiError> {
    let (engine, _permit, ()) =
        begin(state, request.fields.model.as_deref(), |s| s.supports(Task::Embed) || s.supports(Task::EmbedSparse), |_| Ok(()))?;
    let spec = engine.spec();
    let splade = Kind::of(spec) == Some(Kind::Splade);
    if splade && request.normalize {
        return Err(TeiError::backend("`normalize` is not available for SPLADE models"));
    }
    if request.dimensions == Some(0) {
        return Err(TeiError::validation("Input validation error: `dimensions` should be positive"));
    }
    if !splade && !spec.supports(Task::Embed) {
        return Err(TeiError::backend("Model is not an embedding model"));
    }
    let prompts = request.fields.inputs.clone().prompts()?;
    batch_size(state, prompts.len())?;
    if splade {
        // TEI's dense form of a SPLADE vector: every vocabulary weight.
        let params = request.fields.params(Task::EmbedSparse, spec, false)?;
        let (outputs, _): (Vec<Vec<(u32, f32)>>, _) = engine.encode_as(prompts, &params).await?;
        let size = engine.input().vocab_size();
        return Ok(outputs
            .into_iter()
            .map(|weights| {
                let mut dense = vec![0.0; size];
                weights.into_iter().filter(|(i, _)| (*i as usize) < size).for_each(|(i, w)| dense[i as usize] = w);
                dense
            })
            .collect());
    }
    let mut params = request.fields.params(Task::Embed, spec, request.normalize)?;
    if let Some(d) = request.dimensions {
        if d > spec.embedding_size {
            return Err(TeiError::validation(
                "Input validation error: `dimensions` should be smaller than the maximum embedding dimension.",
            ));
        }
        params.dimensions = (d < spec.embedding_size).then_some(d);
    }
    Ok(engine.encode_as(prompts, &params).await?.0)
}

#[utoipa::path(post, tag = "TEI", path = "/embed", description = "TEI: one vector per input (a list of lists).", request_body = EmbedRequest, responses((status = 200, body = Vec<Vec<f32>>), super::error::TeiErrorResponses))]
pub async fn embed(State(state): State<AppState>, TeiJson(request): TeiJson<EmbedRequest>) -> Result<Json<Vec<Vec<f32>>>, TeiError> {
    embed_inner(&state, request).await.map(Json)
}

#[utoipa::path(post, tag = "TEI", path = "/embed_all", description = "TEI: one vector per token of each input.", request_body = InputFields, responses((status = 200, body = Vec<Vec<Vec<f32>>>), super::error::TeiErrorResponses))]
pub async fn embed_all(
    State(state): State<AppState>,
    TeiJson(request): TeiJson<InputFields>,
) -> Result<Json<Vec<Vec<Vec<f32>>>>, TeiError> {
    let (engine, _permit, ()) = begin(&state, request.model.as_deref(), |s| s.supports(Task::Embed), |_| Ok(()))?;
    let spec = engine.spec();
    match Kind::of(spec) {
        Some(Kind::Splade) => return Err(TeiError::backend("`embed_all` is not available for SPLADE models")),
        Some(Kind::Embedding) if spec.supports(Task::TokenEmbed) => {}
        _ => return Err(TeiError::backend("Model is not an embedding model")),
    }
    let prompts = request.inputs.clone().prompts()?;
    batch_size(&state, prompts.len())?;
    let params = request.params(Task::TokenEmbed, spec, false)?;
    Ok(Json(engine.encode_as(prompts, &params).await?.0))
}

async fn embed_sparse_inner(state: &AppState, request: InputFields) -> Result<Vec<Vec<SparseValue>>, TeiError> {
    let (engine, _permit, ()) = begin(state, request.model.as_deref(), |s| s.supports(Task::EmbedSparse), |_| Ok(()))?;
    let spec = engine.spec();
    if Kind::of(spec) != Some(Kind::Splade) && !spec.m3 {
        return Err(TeiError::backend("Model is not an embedding model with SPLADE pooling"));
    }
    let prompts = request.inputs.clone().prompts()?;
    batch_size(state, prompts.len())?;
    let params = request.params(Task::EmbedSparse, spec, false)?;
    let (outputs, _): (Vec<Vec<(u32, f32)>>, _) = engine.encode_as(prompts, &params).await?;
    Ok(outputs.into_iter().map(SparseValue::list).collect())
}

#[utoipa::path(post, tag = "TEI", path = "/embed_sparse", description = "TEI: SPLADE sparse embeddings, non-zero `{index, value}` per input.", request_body = InputFields, responses((status = 200, body = Vec<Vec<SparseValue>>), super::error::TeiErrorResponses))]
pub async fn embed_sparse(
    State(state): State<AppState>,
    TeiJson(request): TeiJson<InputFields>,
) -> Result<Json<Vec<Vec<SparseValue>>>, TeiError> {
    embed_sparse_inner(&state, request).await.map(Json)
}

/// `/predict`'s request; `inputs` is read by [`predict_inputs`].
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct PredictRequest {
    #[schema(value_type = Object)]
    pub inputs: Value,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Prediction {
    pub score: f32,
    pub label: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PredictResponse {
    Single(Vec<Prediction>),
    Batch(Vec<Vec<Prediction>>),
}

/// TEI's `inputs` of `/predict`: `"a"` or `["a"]` is one text, `["a", "b"]` one pair, and a
/// batch is a list of such lists (`[["a"], ["b", "c"]]`). Returns the inputs and whether it
/// was a batch.
fn predict_inputs(inputs: &Value) -> Result<(Vec<Prompt>, bool), TeiError> {
    const EXPECTED: &str =
        "a string, a pair of strings [string, string] or a batch of mixed strings and pairs [[string], [string, string], ...]";
    let invalid = |what: String| {
        TeiError::validation(format!("Failed to deserialize the JSON body into the target type: inputs: {what}, expected {EXPECTED}"))
    };
    let item = |list: &[Value]| -> Result<Prompt, TeiError> {
        let texts: Vec<&str> =
            list.iter().map(|v| v.as_str().ok_or_else(|| invalid(format!("invalid type: {v}")))).collect::<Result<_, _>>()?;
        match texts.as_slice() {
            [one] => Ok(Prompt::Text(one.to_string())),
            [a, b] => Ok(Prompt::Pair(a.to_string(), b.to_string())),
            other => Err(invalid(format!("invalid length {}", other.len()))),
        }
    };
    match inputs {
        Value::String(text) => Ok((vec![Prompt::Text(text.clone())], false)),
        Value::Array(items) if items.first().is_some_and(Value::is_array) => {
            let batch = items
                .iter()
                .map(|i| i.as_array().ok_or_else(|| invalid(format!("invalid type: {i}"))).and_then(|l| item(l)))
                .collect::<Result<_, _>>()?;
            Ok((batch, true))
        }
        Value::Array(items) => Ok((vec![item(items)?], false)),
        other => Err(invalid(format!("invalid type: {other}"))),
    }
}

/// TEI's scores: softmax over the labels (sigmoid for one), unless raw.
fn tei_activation(logits: &mut [f32], raw: bool) {
    use crate::pooling::classifier::ClassifierActivation;
    if !raw {
        let activation = if logits.len() == 1 { ClassifierActivation::Sigmoid } else { ClassifierActivation::Softmax };
        activation.apply(logits);
    }
}

/// Highest first; equal scores in reverse input order (TEI sorts ascending, then reverses).
fn tei_order<T>(items: &mut [T], score: impl Fn(&T) -> f32) {
    items.sort_by(|a, b| score(a).total_cmp(&score(b)));
    items.reverse();
}

async fn predict_inner(state: &AppState, request: PredictRequest) -> Result<PredictResponse, TeiError> {
    let (engine, _permit, (prompts, batch)) = begin(
        state,
        request.model.as_deref(),
        |s| s.supports(Task::Classify),
        |_| {
            let (prompts, batch) = predict_inputs(&request.inputs)?;
            if batch {
                batch_size(state, prompts.len())?;
            }
            Ok((prompts, batch))
        },
    )?;
    let spec = engine.spec();
    if !spec.supports(Task::Classify) {
        return Err(TeiError::backend("Model is not a classifier model"));
    }
    let sent = PoolingParams {
        truncate_prompt_tokens: request.truncate.unwrap_or(true).then_some(-1),
        truncation_side: Some(request.truncation_direction.into()),
        use_activation: Some(false),
        ..Default::default()
    };
    let params = sent.verify(Task::Classify, spec).map_err(|e| TeiError::validation(e.message))?;
    let (outputs, _): (Vec<Vec<f32>>, _) = engine.encode_as(prompts, &params).await?;
    let mut lists = Vec::with_capacity(outputs.len());
    for mut logits in outputs {
        tei_activation(&mut logits, request.raw_scores);
        if logits.iter().any(|s| s.is_nan()) {
            return Err(TeiError::backend("score is NaN").with_message("score is NaN"));
        }
        let mut predictions: Vec<Prediction> = logits
            .into_iter()
            .enumerate()
            .map(|(i, score)| Prediction { score, label: spec.labels.get(i).cloned().unwrap_or_else(|| format!("LABEL_{i}")) })
            .collect();
        tei_order(&mut predictions, |p| p.score);
        lists.push(predictions);
    }
    Ok(match batch {
        true => PredictResponse::Batch(lists),
        false => PredictResponse::Single(lists.pop().unwrap_or_default()),
    })
}

impl TeiError {
    fn with_message(mut self, message: &str) -> Self {
        self.message = message.to_string();
        self
    }
}

#[utoipa::path(post, tag = "TEI", path = "/predict", description = "TEI: class scores per input, sorted.", request_body = PredictRequest, responses((status = 200, body = PredictResponse), super::error::TeiErrorResponses))]
pub async fn predict(State(state): State<AppState>, TeiJson(request): TeiJson<PredictRequest>) -> Result<Json<PredictResponse>, TeiError> {
    predict_inner(&state, request).await.map(Json)
}

/// TEI's `/rerank` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    pub query: String,
    pub texts: Vec<String>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub return_text: bool,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Rank {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub score: f32,
}

/// Whether a `/rerank` body is TEI's: `texts` without `documents`.
pub fn is_tei_rerank(body: &Value) -> bool {
    body.get("texts").is_some() && body.get("documents").is_none()
}

async fn rerank_inner(state: &AppState, request: RerankRequest) -> Result<Vec<Rank>, TeiError> {
    if request.texts.is_empty() {
        return Err(TeiError::empty("`texts` cannot be empty"));
    }
    let (engine, _permit, ()) = begin(
        state,
        request.model.as_deref(),
        |s| Kind::of(s) == Some(Kind::Reranker),
        |engine| {
            if Kind::of(engine.spec()) != Some(Kind::Reranker) || engine.score_mode().is_none() {
                return Err(TeiError::backend("model is not a re-ranker model"));
            }
            batch_size(state, request.texts.len())
        },
    )?;
    let spec = engine.spec();
    let sent = PoolingParams {
        truncate_prompt_tokens: request.truncate.unwrap_or(true).then_some(-1),
        truncation_side: Some(request.truncation_direction.into()),
        use_activation: Some(false),
        ..Default::default()
    };
    let params = sent.verify(Task::Score, spec).map_err(|e| TeiError::validation(e.message))?;
    let (logits, _) = engine.score(std::slice::from_ref(&request.query), &request.texts, &params, None).await?;
    let mut ranks = Vec::with_capacity(logits.len());
    for (index, logit) in logits.into_iter().enumerate() {
        let mut score = [logit];
        tei_activation(&mut score, request.raw_scores);
        if score[0].is_nan() {
            return Err(TeiError::backend("score is NaN").with_message("score is NaN"));
        }
        ranks.push(Rank { index, text: request.return_text.then(|| request.texts[index].clone()), score: score[0] });
    }
    tei_order(&mut ranks, |r| r.score);
    Ok(ranks)
}

/// TEI's `/rerank`, for bodies [`is_tei_rerank`] says are TEI's.
pub async fn rerank(state: &AppState, body: Value) -> Response {
    let answer = async { rerank_inner(state, handed_over(body)?).await };
    answer.await.map(Json).into_response()
}

/// A body another route hands over, read as [`TeiJson`] reads a body.
fn handed_over<T: DeserializeOwned>(body: Value) -> Result<T, TeiError> {
    serde_json::from_value(body).map_err(|e| TeiError::validation(format!("Failed to deserialize the JSON body into the target type: {e}")))
}

/// `/similarity`'s request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct SimilarityRequest {
    pub inputs: SimilarityInputs,
    #[serde(default)]
    pub parameters: Option<SimilarityParameters>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct SimilarityInputs {
    pub source_sentence: String,
    pub sentences: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct SimilarityParameters {
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub prompt_name: Option<String>,
}

#[utoipa::path(post, tag = "TEI", path = "/similarity", description = "TEI: cosine of the source sentence with each sentence.", request_body = SimilarityRequest, responses((status = 200, body = Vec<f32>), super::error::TeiErrorResponses))]
pub async fn similarity(State(state): State<AppState>, TeiJson(request): TeiJson<SimilarityRequest>) -> Result<Json<Vec<f32>>, TeiError> {
    if request.inputs.sentences.is_empty() {
        return Err(TeiError::empty("`inputs.sentences` cannot be empty"));
    }
    batch_size(&state, request.inputs.sentences.len() + 1)?;
    let parameters = request.parameters.unwrap_or_default();
    let mut texts = vec![InputType::Text(request.inputs.source_sentence)];
    texts.extend(request.inputs.sentences.into_iter().map(InputType::Text));
    let embed = EmbedRequest {
        fields: InputFields {
            inputs: Input::Batch(texts),
            truncate: parameters.truncate,
            truncation_direction: parameters.truncation_direction,
            prompt_name: parameters.prompt_name,
            model: request.model,
        },
        normalize: false,
        dimensions: None,
    };
    let vectors = embed_inner(&state, embed).await?;
    let (source, others) = vectors.split_first().ok_or_else(|| TeiError::backend("no embedding returned"))?;
    Ok(Json(others.iter().map(|v| cosine(source, v)).collect()))
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    (dot / (norm(a) * norm(b)).max(1e-12)) as f32
}

/// `/decode`'s request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct DecodeRequest {
    pub ids: DecodeIds,
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum DecodeIds {
    Single(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

#[utoipa::path(post, tag = "TEI", path = "/decode", description = "TEI: token ids back to text.", request_body = DecodeRequest, responses((status = 200, body = Vec<String>), super::error::TeiErrorResponses))]
pub async fn decode(State(state): State<AppState>, TeiJson(request): TeiJson<DecodeRequest>) -> Result<Json<Vec<String>>, TeiError> {
    let engine = model(&state, request.model.as_deref(), |_| true)?;
    let lists = match request.ids {
        DecodeIds::Single(ids) => vec![ids],
        DecodeIds::Batch(lists) => {
            batch_size(&state, lists.len())?;
            lists
        }
    };
    if lists.iter().any(Vec::is_empty) {
        return Err(TeiError::empty("Input validation error: `input_ids` cannot be empty"));
    }
    let vocab = engine.input().tokenizer().vocab_size();
    if let Some(&id) = lists.iter().flatten().find(|&&id| id as usize >= vocab) {
        return Err(TeiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Tokenizer",
            format!("tokenizer error Token id {id} is out of vocabulary"),
        ));
    }
    Ok(Json(engine.input().decode_all(lists, request.skip_special_tokens).await?))
}

/// TEI's `/tokenize` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    pub inputs: TokenizeInput,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum TokenizeInput {
    Single(String),
    Batch(Vec<String>),
}

/// One token of TEI's `/tokenize`: `start`/`stop` are byte offsets in the (prompted) text.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    pub text: String,
    pub special: bool,
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

/// Whether a `/tokenize` body is TEI's: `inputs` without vLLM's `prompt` or `messages`.
pub fn is_tei_tokenize(body: &Value) -> bool {
    body.get("inputs").is_some() && body.get("prompt").is_none() && body.get("messages").is_none()
}

async fn tokenize_inner(state: &AppState, request: TokenizeRequest) -> Result<Vec<Vec<SimpleToken>>, TeiError> {
    let engine = model(state, request.model.as_deref(), |_| true)?;
    let texts = match request.inputs {
        TokenizeInput::Single(text) => vec![text],
        TokenizeInput::Batch(texts) if texts.is_empty() => return Err(TeiError::empty("`inputs` cannot be empty")),
        TokenizeInput::Batch(texts) => {
            batch_size(state, texts.len())?;
            texts
        }
    };
    let spec = engine.spec();
    let prompt = match &request.prompt_name {
        Some(name) => spec.prompts.resolve(Some(name)).map_err(|_| unknown_prompt(name, spec))?,
        None => spec.prompts.default.clone(),
    };
    let limit = spec.max_model_len * 250;
    let mut prompted = Vec::with_capacity(texts.len());
    for text in texts {
        if text.is_empty() {
            return Err(TeiError::empty("Input validation error: `inputs` cannot be empty"));
        }
        let chars = text.chars().count();
        if chars > limit {
            return Err(TeiError::validation(format!(
                "Input validation error: `inputs` must have less than {limit} characters. Given: {chars}"
            )));
        }
        prompted.push(format!("{}{text}", prompt.as_deref().unwrap_or("")));
    }
    let tokens = engine.input().tokens(prompted.clone(), request.add_special_tokens).await?;
    let tokenizer = engine.input().tokenizer();
    Ok(tokens
        .into_iter()
        .zip(&prompted)
        .map(|(list, text)| {
            list.into_iter()
                .map(|(id, special, range)| {
                    let text = match range {
                        Some((start, stop)) => {
                            String::from_utf8_lossy(&text.as_bytes()[start.min(text.len())..stop.min(text.len())]).into_owned()
                        }
                        None => tokenizer.token_strings(&[id]).pop().unwrap_or_default(),
                    };
                    SimpleToken { id, text, special, start: range.map(|r| r.0), stop: range.map(|r| r.1) }
                })
                .collect()
        })
        .collect())
}

/// TEI's `/tokenize`, for bodies [`is_tei_tokenize`] says are TEI's.
pub async fn tokenize(state: &AppState, body: Value) -> Response {
    let answer = async { tokenize_inner(state, handed_over(body)?).await };
    answer.await.map(Json).into_response()
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

#[utoipa::path(post, tag = "TEI", path = "/vertex", description = "TEI's Vertex AI route: each instance answered as its TEI route.", request_body = VertexRequest, responses((status = 200, body = Object), super::error::TeiErrorResponses))]
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
#[utoipa::path(get, tag = "TEI", path = "/info", description = "TEI: the served model.", responses((status = 200, body = Object), super::error::TeiErrorResponses))]
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
    let (concurrent, batch_tokens, workers) = engine.limits();
    Ok(Json(serde_json::json!({
        "model_id": spec.root,
        "model_sha": null,
        "model_dtype": spec.dtype,
        "served_model_name": spec.served_name,
        "model_type": model_type,
        "max_concurrent_requests": concurrent,
        "max_input_length": spec.max_model_len,
        "max_batch_tokens": batch_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": state.options().max_client_batch_size,
        "auto_truncate": true,
        "tokenization_workers": workers,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn predict_inputs_follow_tei() {
        let one = |v: Value| predict_inputs(&v).unwrap();
        assert_eq!(one(json!("a")), (vec![Prompt::Text("a".into())], false));
        assert_eq!(one(json!(["a"])), (vec![Prompt::Text("a".into())], false));
        assert_eq!(one(json!(["a", "b"])), (vec![Prompt::Pair("a".into(), "b".into())], false));
        assert_eq!(one(json!([["a"], ["b", "c"]])), (vec![Prompt::Text("a".into()), Prompt::Pair("b".into(), "c".into())], true));
        for bad in [json!(["a", "b", "c"]), json!([]), json!([[]]), json!(5), json!([["a"], "b"])] {
            assert_eq!(predict_inputs(&bad).unwrap_err().status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        }
    }

    #[test]
    fn ties_come_out_in_reverse_input_order() {
        let mut ranks = vec![(0, 0.5), (1, 0.1), (2, 0.5)];
        tei_order(&mut ranks, |r| r.1);
        assert_eq!(ranks.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 0, 1]);
    }

    #[test]
    fn rerank_bodies_are_told_apart() {
        assert!(is_tei_rerank(&json!({"query": "q", "texts": ["a"]})));
        assert!(!is_tei_rerank(&json!({"query": "q", "documents": ["a"]})));
        assert!(!is_tei_rerank(&json!({"query": "q", "documents": ["a"], "texts": ["b"]})));
        assert!(is_tei_tokenize(&json!({"inputs": "a"})));
        assert!(!is_tei_tokenize(&json!({"prompt": "a"})));
    }
}
