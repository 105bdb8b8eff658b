//! HTTP: the router, the shared state, and one file per endpoint family. Handlers stay thin:
//! parse, resolve the model, validate parameters, call the engine, shape the response.

pub mod auth;
pub mod chat;
pub mod classify;
pub mod cohere;
pub mod embeddings;
pub mod encoding;
pub mod error;
pub mod generative_scoring;
pub mod grpc;
pub mod infinity;
pub mod invocations;
pub mod json;
pub mod lora;
pub mod meta;
pub mod observe;
pub mod ollama;
pub mod on_demand;
pub mod openapi;
pub mod plugin;
pub mod pooling;
pub mod rerank;
pub mod score;
pub mod tei;
pub mod tokenize;

use crate::engine::Engine;
use crate::input::Prompt;
use crate::plugin::IoProcessor;
use crate::pooling::Task;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderName};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Set (internally) on a request whose `X-Request-Id` the server made up: the body's
/// `request_id` then names the response instead, as vLLM takes the header first, then the
/// body's field. A client's own copy of this header is dropped.
const GENERATED_REQUEST_ID: HeaderName = HeaderName::from_static("x-poolserve-generated-request-id");

/// Shared by every handler: the served models by name. Each model's engine arrives once it is
/// loaded and warmed; until then its routes answer 503, and /health until all have arrived.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<StateInner>,
}

/// One served model: the name clients send as `model`, and its engine once ready.
struct Slot {
    name: String,
    engine: OnceLock<Engine>,
    /// The model's IO-processor plugin, when it names one (started once the engine is).
    plugin: OnceLock<Arc<IoProcessor>>,
    /// `--models-dir`: the model loads on demand ([`on_demand`]); `engine` stays empty.
    on_demand: Option<on_demand::Loadable>,
}

impl Slot {
    fn new(name: String) -> Self {
        Slot { name, engine: OnceLock::new(), plugin: OnceLock::new(), on_demand: None }
    }

    /// Its engine, if it is ready (loaded, for a model on demand).
    fn current(&self) -> Option<Engine> {
        match &self.on_demand {
            Some(loadable) => loadable.current(),
            None => self.engine.get().cloned(),
        }
    }
}

struct StateInner {
    models: Vec<Slot>,
    started: u64,
    options: ApiOptions,
    /// Set on SIGTERM/SIGINT: /health answers 503 and new model requests are refused.
    draining: AtomicBool,
    /// `--models-dir`: how models load on demand (`None`: every model loads at start).
    on_demand: Option<on_demand::OnDemand>,
    /// When the state was made (the clock of models' last use).
    created: std::time::Instant,
}

/// The HTTP layer's own settings (from `ServerConfig`).
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// `--api-key`: requests must send one of these (none: no key asked for).
    pub api_keys: Vec<String>,
    pub max_client_batch_size: usize,
    /// Whether a request may bring its own `chat_template`.
    pub trust_request_chat_template: bool,
    /// Where images named by URL may come from.
    pub media: crate::input::media::MediaOptions,
    /// Whether the LoRA load/unload routes exist ([`lora`]).
    pub allow_runtime_lora_updating: bool,
    /// The path clients reach the routes under (`--root-path` then `--url-prefix`; "" for
    /// none): the OpenAPI description's server and where /docs fetches it.
    pub public_prefix: String,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            api_keys: Vec::new(),
            max_client_batch_size: 1024,
            trust_request_chat_template: false,
            media: crate::input::media::MediaOptions::default(),
            allow_runtime_lora_updating: false,
            public_prefix: String::new(),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl AppState {
    /// A state for the models named `served_names`, none ready yet.
    pub fn new(served_names: Vec<String>, options: ApiOptions) -> Self {
        Self {
            inner: Arc::new(StateInner {
                models: served_names.into_iter().map(Slot::new).collect(),
                started: unix_now(),
                options,
                draining: AtomicBool::new(false),
                on_demand: None,
                created: std::time::Instant::now(),
            }),
        }
    }

    /// A state whose models load on demand (`--models-dir`), none loaded yet.
    pub fn on_demand(
        models: Vec<crate::loader::options::ModelOptions>,
        options: ApiOptions,
        on_demand: on_demand::OnDemandOptions,
    ) -> Self {
        let models =
            models.into_iter().map(|m| Slot { on_demand: Some(on_demand::Loadable::new(m.clone())), ..Slot::new(m.served_name) }).collect();
        Self {
            inner: Arc::new(StateInner {
                models,
                started: unix_now(),
                options,
                draining: AtomicBool::new(false),
                on_demand: Some(on_demand::OnDemand::new(on_demand)),
                created: std::time::Instant::now(),
            }),
        }
    }

    /// Whether models load on demand.
    pub fn loads_on_demand(&self) -> bool {
        self.inner.on_demand.is_some()
    }

    /// The models that can be served and whether each is loaded (`/v1/models` on demand):
    /// (name, root, engine when loaded).
    pub fn catalogue(&self) -> Vec<(String, String, Option<Engine>)> {
        self.inner
            .models
            .iter()
            .map(|s| {
                let root = s.on_demand.as_ref().map(|l| l.root().to_string()).unwrap_or_default();
                (s.name.clone(), root, s.current())
            })
            .collect()
    }

    /// A state that is ready at once (tests, the library API).
    pub fn ready(engine: Engine) -> Self {
        Self::ready_with(engine, ApiOptions::default())
    }

    pub fn ready_with(engine: Engine, options: ApiOptions) -> Self {
        Self::ready_many(vec![engine], options)
    }

    /// Several models, ready at once (tests).
    pub fn ready_many(engines: Vec<Engine>, options: ApiOptions) -> Self {
        let state = Self::new(engines.iter().map(|e| e.spec().served_name.clone()).collect(), options);
        for engine in engines {
            state.set_engine(engine);
        }
        state
    }

    pub fn options(&self) -> &ApiOptions {
        &self.inner.options
    }

    /// Stop taking new work (shutdown has begun).
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// The `input` field of a request as prompts, within `--max-client-batch-size`.
    pub fn prompts(&self, input: &serde_json::Value) -> Result<Vec<Prompt>, ApiError> {
        let prompts = parse_input(input)?;
        self.check_batch_size(prompts.len())?;
        Ok(prompts)
    }

    /// A body with neither `input` nor `messages` is malformed: 400 before any model lookup,
    /// as a missing required field always was.
    pub fn require_input(input: &serde_json::Value, messages: Option<&serde_json::Value>) -> Result<(), ApiError> {
        if input.is_null() && messages.is_none() {
            return Err(ApiError::BadRequest { message: "missing field `input` (or vLLM's `messages`)".into(), param: Some("input") });
        }
        Ok(())
    }

    /// `--max-client-batch-size`, checked in this one place for every endpoint.
    pub fn check_batch_size(&self, inputs: usize) -> Result<(), ApiError> {
        let max = self.inner.options.max_client_batch_size;
        if inputs > max {
            return Err(ApiError::BadRequest {
                message: format!("Too many inputs in one request: {inputs}; the server accepts at most {max} (--max-client-batch-size)"),
                param: Some("input"),
            });
        }
        Ok(())
    }

    /// Hands a model's engine to its slot (by its served name) once it is warmed.
    pub fn set_engine(&self, engine: Engine) {
        if let Some(slot) = self.inner.models.iter().find(|s| s.name == engine.spec().served_name) {
            let _ = slot.engine.set(engine);
        }
    }

    /// Hands a model its started IO-processor plugin (by the model's served name).
    pub fn set_plugin(&self, served_name: &str, plugin: Arc<IoProcessor>) {
        if let Some(slot) = self.inner.models.iter().find(|s| s.name == served_name) {
            let _ = slot.plugin.set(plugin);
        }
    }

    /// The IO-processor plugin of the model `engine` serves, if it has one (a model on demand's
    /// starts with each load).
    pub fn plugin(&self, engine: &Engine) -> Option<Arc<IoProcessor>> {
        let slot = self.inner.models.iter().find(|s| s.name == engine.spec().served_name)?;
        match &slot.on_demand {
            Some(loadable) => loadable.plugin(),
            None => slot.plugin.get().cloned(),
        }
    }

    /// The served names, in the order given.
    pub fn served_names(&self) -> impl Iterator<Item = &str> {
        self.inner.models.iter().map(|s| s.name.as_str())
    }

    /// The engine of the model a request names, or of the model whose LoRA adapter it names
    /// (with that adapter); 404 for an unknown name. Without a name, the only model, or a 400
    /// naming the models when there are several. 503 while it loads or the server drains.
    pub fn model(&self, model: Option<&str>) -> Result<Engine, ApiError> {
        let (slot, adapter) = match model {
            Some(name) => match self.inner.models.iter().find(|s| s.name == name) {
                Some(slot) => (slot, None),
                // A name that is no model may be one of a ready model's LoRA adapters.
                None => self
                    .inner
                    .models
                    .iter()
                    .find_map(|s| Some((s, Some(s.current()?.with_adapter(name)?))))
                    .ok_or_else(|| ApiError::NotFound(format!("The model `{name}` does not exist.")))?,
            },
            None => match self.inner.models.as_slice() {
                [only] => (only, None),
                _ => return Err(self.name_required()),
            },
        };
        crate::metrics::note_model(&slot.name);
        if self.is_draining() {
            return Err(ApiError::Unavailable("The server is shutting down".into()));
        }
        match adapter {
            Some(engine) => Ok(engine),
            None => slot.current().ok_or_else(|| self.loading(slot)),
        }
    }

    /// The engines that serve LoRA adapters (ready ones).
    pub fn lora_engines(&self) -> impl Iterator<Item = Engine> + '_ {
        self.inner.models.iter().filter_map(|s| s.current()).filter(|e| e.lora().is_some())
    }

    fn name_required(&self) -> ApiError {
        let names: Vec<String> = self.served_names().map(|n| format!("`{n}`")).collect();
        ApiError::BadRequest {
            message: format!("This server serves several models; name one in `model`: {}", names.join(", ")),
            param: Some("model"),
        }
    }

    /// Every model's engine, once all are ready (/health, /v1/models); 503 before, or while
    /// draining. Models on demand count when loaded (an unloaded one is not "loading").
    pub fn engines(&self) -> Result<Vec<Engine>, ApiError> {
        if self.is_draining() {
            return Err(ApiError::Unavailable("The server is shutting down".into()));
        }
        self.inner
            .models
            .iter()
            .filter_map(|s| match (s.current(), &s.on_demand) {
                (Some(engine), _) => Some(Ok(engine)),
                (None, Some(_)) => None,
                (None, None) => Some(Err(self.loading(s))),
            })
            .collect()
    }

    /// 503 for a model not ready yet (naming it when there are several).
    fn loading(&self, slot: &Slot) -> ApiError {
        if slot.on_demand.is_some() {
            return ApiError::Unavailable(format!("The model `{}` is not loaded; an HTTP request for it loads it", slot.name));
        }
        match self.inner.models.len() {
            1 => ApiError::Unavailable("The model is still loading".into()),
            _ => ApiError::Unavailable(format!("The model `{}` is still loading", slot.name)),
        }
    }

    /// The one way into a model request, in one order on every route: the model named (404;
    /// without a name the only one, 400 with several), ready (503), the route's `check` of the
    /// model (which task it serves: 404 / 501 / 400, see [`serves`] and [`scores`]; and
    /// whatever else the route decides from the model and the body, returned as `T`), then
    /// admission (429). The handler then validates its parameters and parses its inputs
    /// (400), then runs.
    /// `E`: the route's error shape (ours, or TEI's on TEI's routes).
    pub fn begin<T, E: From<ApiError>>(
        &self,
        model: Option<&str>,
        check: impl FnOnce(&Engine) -> Result<T, E>,
    ) -> Result<(Engine, tokio::sync::OwnedSemaphorePermit, T), E> {
        let engine = self.model(model)?;
        let decided = check(&engine)?;
        let permit = engine.admit().map_err(ApiError::from)?;
        Ok((engine, permit, decided))
    }

    pub fn started(&self) -> u64 {
        self.inner.started
    }
}

/// Whether a model serves `task`'s endpoint, as vLLM 0.33 registers them: the route exists when
/// the model's tasks include `task` and answers when `task` is its pooling task; with the
/// task but another pooling task it answers 501 `The model does not support {api} API`
/// (switch with `--pooler-config '{"task": …}'`); without the task the route is not there
/// (404 `{"detail": "Not Found"}`).
pub fn serves(spec: &crate::loader::model_spec::ModelSpec, task: Task, api: &str) -> Result<(), ApiError> {
    if spec.pooling_task == task {
        Ok(())
    } else if spec.supports(task) {
        Err(ApiError::NotImplemented(format!("The model does not support {api} API")))
    } else {
        Err(ApiError::RouteNotFound)
    }
}

/// [`AppState::begin`]'s check for a vLLM task route: the model serves `task` ([`serves`];
/// `api` names the endpoint in the 501 message).
pub fn serving(task: Task, api: &'static str) -> impl FnOnce(&Engine) -> Result<(), ApiError> {
    move |engine| serves(engine.spec(), task, api)
}

/// [`AppState::begin`]'s check for `/score` and `/rerank`: a model whose pooling task scores
/// pairs ([`crate::loader::model_spec::ModelSpec::scores`]); vLLM registers no such route for others
/// (404 `{"detail": "Not Found"}`).
pub fn scores(engine: &Engine) -> Result<(), ApiError> {
    match engine.score_mode() {
        Some(_) => Ok(()),
        None => Err(ApiError::RouteNotFound),
    }
}

/// [`AppState::begin`]'s check for routes that serve any model.
pub fn any_model(_: &Engine) -> Result<(), ApiError> {
    Ok(())
}

/// Token counts of a response: everything the model ran, special tokens included.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(tokens: usize) -> Self {
        Usage { prompt_tokens: tokens, total_tokens: tokens }
    }
}

/// The envelope of the OpenAI-style list responses (embeddings, classify, score):
/// `{"id": "{prefix}-…", "object": "list", "created", "model", "data", "usage"}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListResponse<T> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<T>,
    pub usage: Usage,
}

impl<T> ListResponse<T> {
    /// `request_id`: the body's `request_id` field (see [`response_id`]).
    pub fn new(prefix: &str, headers: &HeaderMap, request_id: Option<&str>, engine: &Engine, data: Vec<T>, tokens: usize) -> Self {
        ListResponse {
            id: response_id(prefix, headers, request_id),
            object: "list",
            created: unix_now(),
            model: engine.served_name().to_string(),
            data,
            usage: Usage::new(tokens),
        }
    }
}

/// `{prefix}-{id}`, the id as vLLM picks it: the client's `X-Request-Id` header, else the
/// body's `request_id`, else one made up (the request-id layer's).
pub fn response_id(prefix: &str, headers: &HeaderMap, request_id: Option<&str>) -> String {
    let header = headers.get(REQUEST_ID).and_then(|v| v.to_str().ok());
    let made_up = headers.contains_key(GENERATED_REQUEST_ID);
    match (header, request_id) {
        (Some(_), Some(body)) if made_up => format!("{prefix}-{body}"),
        (None, Some(body)) => format!("{prefix}-{body}"),
        (Some(id), _) => format!("{prefix}-{id}"),
        (None, None) => format!("{prefix}-{}", uuid::Uuid::new_v4().simple()),
    }
}

/// Marks a request that came without `X-Request-Id` before the request-id layer makes one
/// up ([`GENERATED_REQUEST_ID`]).
async fn mark_made_up_request_id(mut request: axum::extract::Request, next: middleware::Next) -> axum::response::Response {
    let headers = request.headers_mut();
    headers.remove(GENERATED_REQUEST_ID);
    if !headers.contains_key(REQUEST_ID) {
        headers.insert(GENERATED_REQUEST_ID, axum::http::HeaderValue::from_static("1"));
    }
    next.run(request).await
}

/// The `input` field's four forms: a string, strings, token ids, or lists of token ids.
pub fn parse_input(input: &serde_json::Value) -> Result<Vec<Prompt>, ApiError> {
    use serde_json::Value;
    let shape_error = || ApiError::BadRequest {
        message: "input must be a string, a list of strings, a list of token ids, or a list of token-id lists".into(),
        param: Some("input"),
    };
    let token = |v: &Value| v.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32);
    let tokens = |items: &[Value]| items.iter().map(token).collect::<Option<Vec<u32>>>();
    // A negative id is out of vocabulary (vLLM's words), not a shape error.
    let negative = |items: &[Value]| items.iter().filter_map(Value::as_i64).filter(|&t| t < 0).min();
    let lowest = match input {
        Value::Array(items) => {
            negative(items).or_else(|| items.iter().filter_map(Value::as_array).filter_map(|inner| negative(inner)).min())
        }
        _ => None,
    };
    if let Some(id) = lowest {
        return Err(crate::input::InputError::InvalidTokenId { id }.into());
    }
    match input {
        Value::String(s) => Ok(vec![Prompt::Text(s.clone())]),
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::BadRequest { message: "input must not be an empty list".into(), param: Some("input") })
        }
        Value::Array(items) => match &items[0] {
            Value::String(_) => {
                items.iter().map(|v| v.as_str().map(|s| Prompt::Text(s.to_string()))).collect::<Option<Vec<_>>>().ok_or_else(shape_error)
            }
            Value::Number(_) => tokens(items).map(|ids| vec![Prompt::Tokens(ids)]).ok_or_else(shape_error),
            Value::Array(_) => items
                .iter()
                .map(|v| v.as_array().and_then(|a| tokens(a)).map(Prompt::Tokens))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(shape_error),
            _ => Err(shape_error()),
        },
        _ => Err(shape_error()),
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound("Not Found".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed("Method Not Allowed".into())
}

pub fn router(state: AppState, payload_limit: usize) -> Router {
    // Model routes sit behind the API key (when one is set); probes and /version do not.
    let mut protected = Router::new();
    if state.options().allow_runtime_lora_updating {
        tracing::warn!("LoRA adapters may be loaded and unloaded through the API (/v1/load_lora_adapter, /v1/unload_lora_adapter)");
        protected = protected.route("/v1/load_lora_adapter", post(lora::load)).route("/v1/unload_lora_adapter", post(lora::unload));
    }
    let protected = protected
        .route("/v1/embeddings", post(embeddings::create))
        .route("/embeddings", post(embeddings::create))
        .route("/embeddings_image", post(infinity::image))
        .route("/embeddings_audio", post(infinity::audio))
        .route("/classify", post(classify::create))
        .route("/pooling", post(pooling::create))
        .route("/embed_sparse", post(tei::embeddings::embed_sparse))
        .route("/embed", post(tei::embeddings::embed))
        .route("/embed_all", post(tei::embeddings::embed_all))
        .route("/predict", post(tei::scores::predict))
        .route("/similarity", post(tei::embeddings::similarity))
        .route("/decode", post(tei::tokens::decode))
        .route("/vertex", post(tei::vertex))
        .route("/info", get(tei::info))
        .route("/", post(tei::root))
        .route("/score", post(score::create))
        .route("/v1/score", post(score::create))
        .route("/rerank", post(rerank::create))
        .route("/generative_scoring", post(generative_scoring::create))
        .route("/v1/rerank", post(rerank::create))
        .route("/v2/rerank", post(rerank::create))
        .route("/v2/embed", post(cohere::create_v2))
        .route("/v1/embed", post(cohere::create_v1))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/invocations", post(invocations::invocations))
        .route("/v1/models", get(meta::models))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/tags", get(ollama::tags));
    let protected = if state.loads_on_demand() {
        protected
            .route("/models/load", post(on_demand::load))
            .route("/models/unload", post(on_demand::unload))
            .route_layer(middleware::from_fn_with_state(state.clone(), on_demand::ensure_loaded))
    } else {
        protected
    };
    let protected = protected.route_layer(middleware::from_fn_with_state(state.clone(), auth::require_api_key));
    let routes = Router::new()
        .merge(protected)
        .route("/health", get(meta::health))
        .route("/ping", get(meta::health).post(meta::health))
        .route("/", get(meta::health))
        .route("/version", get(meta::version))
        .route("/api/version", get(ollama::version))
        .route("/metrics", get(observe::metrics_text))
        .route("/openapi.json", get(openapi::openapi_json))
        .merge(openapi::docs(&state.options().public_prefix));
    let routes = grpc::add_services(routes, state.clone(), payload_limit);
    with_layers(routes, payload_limit).with_state(state)
}

/// What every route shares: metrics, 404/405 answers, the body limit, panic containment, the
/// request span and log line, request ids.
fn with_layers(routes: Router<AppState>, payload_limit: usize) -> Router<AppState> {
    routes
        .route_layer(middleware::from_fn(observe::track))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(payload_limit))
        // A handler that panics answers 500 in the error shape instead of dropping the
        // connection (and the worker thread survives).
        .layer(CatchPanicLayer::custom(|_: Box<dyn std::any::Any + Send>| {
            ApiError::Internal("internal error: the request handler panicked".into()).into_response()
        }))
        .layer(middleware::from_fn(observe::timing_headers_everywhere))
        // One span per request carrying its id, and one line per response (observe::log_response).
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &axum::http::Request<_>| {
                    let id = request.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
                    tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id = %id)
                })
                .on_response(observe::log_response)
                // A 5xx is already the response line's business: no second line.
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(middleware::from_fn(mark_made_up_request_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_in_the_error_shape() {
        use tower::ServiceExt;
        let routes = Router::new().route("/boom", get(|| async { panic!("handler bug") as &'static str }));
        let app = with_layers(routes, 1000).with_state(AppState::new(vec!["m".into()], ApiOptions::default()));
        let request = axum::http::Request::get("/boom").body(axum::body::Body::empty()).unwrap();
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 10_000).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], 500);
        assert!(body["error"]["message"].as_str().unwrap().contains("panicked"), "{body}");
    }

    #[test]
    fn input_forms() {
        assert_eq!(parse_input(&json!("hi")).unwrap(), vec![Prompt::Text("hi".into())]);
        assert_eq!(parse_input(&json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(parse_input(&json!([1, 2])).unwrap(), vec![Prompt::Tokens(vec![1, 2])]);
        assert_eq!(parse_input(&json!([[1], [2, 3]])).unwrap().len(), 2);
        assert!(parse_input(&json!([])).is_err());
        assert!(parse_input(&json!(["a", 1])).is_err());
        assert_eq!(parse_input(&json!([-1])).unwrap_err().to_string(), "Token id -1 is out of vocabulary");
        assert_eq!(parse_input(&json!([[1], [3, -2, -5]])).unwrap_err().to_string(), "Token id -5 is out of vocabulary");
        assert!(parse_input(&json!(5)).is_err());
        assert!(parse_input(&json!([[1], "a"])).is_err());
    }
}
