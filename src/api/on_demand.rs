//! Models on demand (`--models-dir`): each model loads at its first request, at most
//! `--max-loaded-models` stay loaded (the least recently used one that no request is using
//! leaves for a newcomer), one idle past `--model-idle-timeout` is unloaded, and
//! `POST /models/load` and `/models/unload` (llama.cpp's router routes, behind `--api-key`) do
//! it by hand. Only the folders found at start can load: a request names one of them or gets
//! 404.
//!
//! How a request reaches its model: [`ensure_loaded`], a middleware in front of the model
//! routes, reads the body's `model` (the body is kept and handed on), loads the model if it
//! must, and counts the request as using it until the response is made, so that it cannot be
//! evicted under the request. Concurrent first requests load it once: one load runs (in a task
//! of its own, so that a client that gives up does not waste it) and the others wait for it,
//! at most `--model-load-timeout`, then 503 with `Retry-After`. A model that fails to load
//! answers its requests with the error (500), and the next request tries again; the other
//! models keep serving. An unloaded model's memory goes when the last request that holds its
//! engine ends (the engine's threads stop and drop the weights).

use super::error::ApiError;
use super::AppState;
use crate::engine::{Engine, EngineOptions};
use crate::loader::options::ModelOptions;
use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// `--max-loaded-models`, `--model-idle-timeout`, `--model-load-timeout`.
#[derive(Debug, Clone)]
pub struct OnDemandOptions {
    pub max_loaded: Option<usize>,
    pub idle_timeout: Option<Duration>,
    /// How long a request waits for its model to load (or for room to load it).
    pub load_timeout: Duration,
    /// The engine options every model loads with.
    pub engine: EngineOptions,
    /// `--payload-limit`: the body the middleware reads at most.
    pub payload_limit: usize,
}

/// A model that loads on demand: how to load it, and its engine while loaded.
pub(super) struct Loadable {
    options: ModelOptions,
    current: RwLock<Option<Engine>>,
    /// Held by the one load in progress.
    loading: Arc<tokio::sync::Mutex<()>>,
    /// The last load's error, until the next attempt.
    failure: Mutex<Option<String>>,
    /// Requests using the model now (they keep it from eviction).
    in_use: AtomicUsize,
    /// Milliseconds since the state was made, at the last request's end.
    last_used: AtomicU64,
}

impl Loadable {
    pub(super) fn new(options: ModelOptions) -> Self {
        Loadable {
            options,
            current: RwLock::new(None),
            loading: Arc::new(tokio::sync::Mutex::new(())),
            failure: Mutex::new(None),
            in_use: AtomicUsize::new(0),
            last_used: AtomicU64::new(0),
        }
    }

    pub(super) fn current(&self) -> Option<Engine> {
        self.current.read().ok().and_then(|c| c.clone())
    }

    pub(super) fn root(&self) -> &str {
        &self.options.source
    }

    /// Drops the slot's engine (requests that hold it finish with it). True if it was loaded.
    fn unload(&self, name: &str, why: &str) -> bool {
        let engine = self.current.write().ok().and_then(|mut c| c.take());
        let unloaded = engine.is_some();
        drop(engine);
        if unloaded {
            crate::metrics::model_unloaded(name);
            tracing::info!(model = %name, "unloaded ({why})");
        }
        unloaded
    }
}

/// A request's use of a model; the model may be evicted once none is left.
pub(super) struct InUse {
    state: AppState,
    index: usize,
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(loadable) = self.state.loadable(self.index) {
            loadable.last_used.store(self.state.millis(), Ordering::SeqCst);
            loadable.in_use.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// 503 with `Retry-After`: the model could not be made ready in time.
fn not_ready(message: String) -> Response {
    let mut response = ApiError::Unavailable(message).into_response();
    response.headers_mut().insert(RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
    response
}

impl AppState {
    fn loadable(&self, index: usize) -> Option<&Loadable> {
        self.inner.models.get(index)?.on_demand.as_ref()
    }

    fn millis(&self) -> u64 {
        self.inner.created.elapsed().as_millis() as u64
    }

    fn on_demand_index(&self, name: &str) -> Option<usize> {
        self.inner.models.iter().position(|s| s.name == name && s.on_demand.is_some())
    }

    /// The model `index` loaded and marked in use, loading it if it must.
    pub(super) async fn ensure_loaded(&self, index: usize) -> Result<InUse, Response> {
        let (Some(loadable), Some(options)) = (self.loadable(index), self.inner.on_demand.as_ref()) else {
            return Err(ApiError::Internal("not a model on demand".into()).into_response());
        };
        let name = &self.inner.models[index].name;
        let deadline = tokio::time::Instant::now() + options.load_timeout;
        loop {
            // Counted before looking, so that an eviction between the two cannot take it.
            loadable.in_use.fetch_add(1, Ordering::SeqCst);
            let using = InUse { state: self.clone(), index };
            if loadable.current().is_some() {
                return Ok(using);
            }
            drop(using);
            if let Ok(guard) = loadable.loading.clone().try_lock_owned() {
                let state = self.clone();
                tokio::spawn(async move { state.load(index, guard).await });
            }
            // The load in progress ends when its lock is free.
            match tokio::time::timeout_at(deadline, loadable.loading.lock()).await {
                Ok(_) => {
                    if loadable.current().is_none() {
                        if let Some(failure) = loadable.failure.lock().ok().and_then(|f| f.clone()) {
                            return Err(failure_response(name, &failure));
                        }
                    }
                }
                Err(_) => {
                    return Err(not_ready(format!(
                        "The model `{name}` is loading and was not ready within {:?} (--model-load-timeout); retry later",
                        options.load_timeout
                    )))
                }
            }
        }
    }

    /// One load of model `index`, holding its lock: room first (the least recently used model
    /// no request is using goes), then the load off the runtime.
    async fn load(&self, index: usize, _guard: tokio::sync::OwnedMutexGuard<()>) {
        let (Some(loadable), Some(options)) = (self.loadable(index), self.inner.on_demand.as_ref()) else { return };
        let name = self.inner.models[index].name.clone();
        if let Some(failure) = self.make_room(index, options).await {
            if let Ok(mut f) = loadable.failure.lock() {
                *f = Some(failure);
            }
            return;
        }
        let started = Instant::now();
        let model = loadable.options.clone();
        let engine_options = options.engine.clone();
        let loaded = tokio::task::spawn_blocking(move || Engine::load(&model, &engine_options)).await;
        let loaded = match loaded {
            Ok(Ok(engine)) => Ok(engine),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("the load stopped: {e}")),
        };
        match loaded {
            Ok(engine) => {
                tracing::info!(model = %name, "loaded on demand in {:.2?}", started.elapsed());
                loadable.last_used.store(self.millis(), Ordering::SeqCst);
                if let Ok(mut current) = loadable.current.write() {
                    *current = Some(engine);
                }
                if let Ok(mut f) = loadable.failure.lock() {
                    *f = None;
                }
            }
            Err(e) => {
                tracing::error!(model = %name, "cannot load: {e}");
                if let Ok(mut f) = loadable.failure.lock() {
                    *f = Some(e);
                }
            }
        }
    }

    /// Unloads least recently used models no request is using until `index` fits under
    /// `--max-loaded-models`; waits for one to be free at most the load timeout. `Some(reason)`
    /// when there is no room.
    async fn make_room(&self, index: usize, options: &OnDemandOptions) -> Option<String> {
        let max = options.max_loaded?;
        let deadline = Instant::now() + options.load_timeout;
        loop {
            let loaded: Vec<(usize, &Loadable)> = self
                .inner
                .models
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != index)
                .filter_map(|(i, s)| s.on_demand.as_ref().map(|l| (i, l)))
                .filter(|(_, l)| l.current().is_some())
                .collect();
            if loaded.len() < max {
                return None;
            }
            let idle =
                loaded.iter().filter(|(_, l)| l.in_use.load(Ordering::SeqCst) == 0).min_by_key(|(_, l)| l.last_used.load(Ordering::SeqCst));
            match idle {
                Some((i, l)) => {
                    l.unload(&self.inner.models[*i].name, "least recently used, for another model (--max-loaded-models)");
                }
                None if Instant::now() >= deadline => {
                    return Some(format!("all {max} loaded models are in use (--max-loaded-models {max}); retry later"));
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Unloads every model on demand idle past `--model-idle-timeout` (run every second).
    pub fn unload_idle(&self) {
        let Some(idle) = self.inner.on_demand.as_ref().and_then(|o| o.idle_timeout) else { return };
        let now = self.millis();
        for slot in &self.inner.models {
            let Some(l) = &slot.on_demand else { continue };
            let unused = l.in_use.load(Ordering::SeqCst) == 0;
            if unused && now.saturating_sub(l.last_used.load(Ordering::SeqCst)) >= idle.as_millis() as u64 && l.current().is_some() {
                l.unload(&slot.name, "idle past --model-idle-timeout");
            }
        }
    }
}

fn failure_response(name: &str, failure: &str) -> Response {
    if failure.contains("--max-loaded-models") {
        return not_ready(format!("The model `{name}` cannot load now: {failure}"));
    }
    ApiError::Internal(format!("The model `{name}` could not be loaded: {failure}")).into_response()
}

/// The model a body names, read without keeping more than the body.
#[derive(serde::Deserialize)]
struct Named {
    #[serde(default)]
    model: Option<serde_json::Value>,
}

/// In front of the model routes when models load on demand: the model a POST names (or the
/// only one) loaded and in use until the response is made. GETs (`/v1/models`, `/info`,
/// `/api/tags`) describe and load nothing.
pub async fn ensure_loaded(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(options) = state.inner.on_demand.as_ref() else { return next.run(request).await };
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, options.payload_limit).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return ApiError::PayloadTooLarge(format!("The request body is larger than {} bytes (--payload-limit)", options.payload_limit))
                .into_response()
        }
    };
    let named = serde_json::from_slice::<Named>(&bytes).ok().and_then(|n| n.model).and_then(|m| m.as_str().map(String::from));
    let index = match named {
        // Ollama's clients may add the `:latest` tag (api/ollama.rs takes it off too).
        Some(name) => state.on_demand_index(&name).or_else(|| state.on_demand_index(name.strip_suffix(":latest")?)),
        None if state.inner.models.len() == 1 => state.on_demand_index(&state.inner.models[0].name),
        None => None,
    };
    let _using = match index {
        Some(index) => match state.ensure_loaded(index).await {
            Ok(using) => Some(using),
            Err(response) => return response,
        },
        None => None,
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// `POST /models/load` `{"model": NAME}`: loads it now (llama.cpp's router route).
pub async fn load(State(state): State<AppState>, axum::Json(body): axum::Json<serde_json::Value>) -> Response {
    let Some(index) = named_model(&state, &body) else { return unknown(&body) };
    match state.ensure_loaded(index).await {
        Ok(_) => axum::Json(serde_json::json!({"success": true})).into_response(),
        Err(response) => response,
    }
}

/// `POST /models/unload` `{"model": NAME}`: unloads it (requests using it finish first with it).
pub async fn unload(State(state): State<AppState>, axum::Json(body): axum::Json<serde_json::Value>) -> Response {
    let Some(index) = named_model(&state, &body) else { return unknown(&body) };
    if let Some(l) = state.loadable(index) {
        l.unload(&state.inner.models[index].name, "asked to (POST /models/unload)");
    }
    axum::Json(serde_json::json!({"success": true})).into_response()
}

fn named_model(state: &AppState, body: &serde_json::Value) -> Option<usize> {
    state.on_demand_index(body.get("model")?.as_str()?)
}

fn unknown(body: &serde_json::Value) -> Response {
    match body.get("model").and_then(serde_json::Value::as_str) {
        Some(name) => ApiError::NotFound(format!("The model `{name}` does not exist.")).into_response(),
        None => ApiError::BadRequest { message: "name the model in `model`".into(), param: Some("model") }.into_response(),
    }
}
