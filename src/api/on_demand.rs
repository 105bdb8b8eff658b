//! Models on demand (`--models-dir`): each model loads at its first request (and warms up,
//! and starts its IO-processor plugin, as at a server's start), at most `--max-loaded-models`
//! stay loaded and at most `--max-loaded-memory` of their weights (the least recently used
//! model that no request is using leaves for a newcomer), one idle past
//! `--model-idle-timeout` is unloaded, and `POST /models/load` and `/models/unload`
//! (llama.cpp's router routes, behind `--api-key`) do it by hand. Only the folders found at
//! start can load: a request names one of them or gets 404.
//!
//! How a request reaches its model: [`ensure_loaded`], a middleware in front of the model
//! routes, reads the body's `model` (the body is kept and handed on), loads the model if it
//! must, and counts the request as using it until the response is made, so that it cannot be
//! evicted under the request; gRPC calls name it in their `model` metadata
//! (`super::grpc`'s middleware, which keeps it in use until a stream's last message). Concurrent first requests load it once: one load runs (in a task
//! of its own, so that a client that gives up does not waste it) and the others wait for it,
//! at most `--model-load-timeout`, then 503 with `Retry-After`. A model that fails to load
//! answers its requests with the error (500), and the next request tries again; the other
//! models keep serving. An unloaded model's memory goes when the last request that holds its
//! engine ends (the engine's threads stop and drop the weights).

use super::error::ApiError;
use super::AppState;
use crate::engine::{Engine, EngineOptions};
use crate::loader::options::ModelOptions;
use crate::plugin::{IoProcessor, PluginOptions};
use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// `--max-loaded-models`, `--max-loaded-memory`, `--model-idle-timeout`, `--model-load-timeout`.
#[derive(Debug, Clone)]
pub struct OnDemandOptions {
    pub max_loaded: Option<usize>,
    /// `--max-loaded-memory`, in bytes: the weight files of the loaded models at most
    /// ([`crate::loader::weight_bytes`]).
    pub max_memory: Option<u64>,
    pub idle_timeout: Option<Duration>,
    /// How long a request waits for its model to load (or for room to load it).
    pub load_timeout: Duration,
    /// The engine options every model loads with.
    pub engine: EngineOptions,
    /// `--payload-limit`: the body the middleware reads at most.
    pub payload_limit: usize,
    /// How the models' IO-processor plugins run.
    pub plugins: PluginOptions,
}

/// [`OnDemandOptions`] and the lock under which a load takes its room.
pub(super) struct OnDemand {
    pub(super) options: OnDemandOptions,
    /// Held while a load checks the limits and reserves its room (never across an await), so
    /// that two loads cannot both take the last place.
    room: Mutex<()>,
}

impl OnDemand {
    pub(super) fn new(options: OnDemandOptions) -> Self {
        OnDemand { options, room: Mutex::new(()) }
    }
}

/// A loaded model: its engine, warmed up, and its plugin when it names one.
struct Loaded {
    engine: Engine,
    plugin: Option<Arc<IoProcessor>>,
}

/// Why a request's model is not ready for it.
#[derive(Debug, Clone)]
pub(super) enum NotReady {
    /// Not now (it is loading, or no room): 503 with `Retry-After`, gRPC UNAVAILABLE.
    Later(String),
    /// It cannot load (its error, or weights over the whole budget): 500, gRPC INTERNAL.
    Failed(String),
}

impl NotReady {
    fn message(&self) -> &str {
        match self {
            NotReady::Later(message) | NotReady::Failed(message) => message,
        }
    }

    pub(super) fn http(self) -> Response {
        match self {
            NotReady::Later(message) => {
                let mut response = ApiError::Unavailable(message).into_response();
                response.headers_mut().insert(RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
                response
            }
            NotReady::Failed(message) => ApiError::Internal(message).into_response(),
        }
    }

    pub(super) fn grpc(self) -> tonic::Status {
        match self {
            NotReady::Later(message) => tonic::Status::unavailable(message),
            NotReady::Failed(message) => tonic::Status::internal(message),
        }
    }
}

/// A model that loads on demand: how to load it, and its engine while loaded.
pub(super) struct Loadable {
    options: ModelOptions,
    /// What it counts against `--max-loaded-memory`: the bytes of its weight files.
    weight_bytes: u64,
    current: RwLock<Option<Loaded>>,
    /// Room taken under the limits by the load in progress (it counts as loaded).
    reserved: AtomicBool,
    /// Held by the one load in progress.
    loading: Arc<tokio::sync::Mutex<()>>,
    /// The last load's error, until the next attempt.
    failure: Mutex<Option<NotReady>>,
    /// Requests using the model now (they keep it from eviction).
    in_use: AtomicUsize,
    /// Milliseconds since the state was made, at the last request's end.
    last_used: AtomicU64,
}

impl Loadable {
    pub(super) fn new(options: ModelOptions) -> Self {
        let weight_bytes = crate::loader::weight_bytes(std::path::Path::new(&options.source));
        Loadable {
            options,
            weight_bytes,
            current: RwLock::new(None),
            reserved: AtomicBool::new(false),
            loading: Arc::new(tokio::sync::Mutex::new(())),
            failure: Mutex::new(None),
            in_use: AtomicUsize::new(0),
            last_used: AtomicU64::new(0),
        }
    }

    pub(super) fn current(&self) -> Option<Engine> {
        self.current.read().ok().and_then(|c| c.as_ref().map(|l| l.engine.clone()))
    }

    /// The loaded model's plugin, if it has one.
    pub(super) fn plugin(&self) -> Option<Arc<IoProcessor>> {
        self.current.read().ok().and_then(|c| c.as_ref().and_then(|l| l.plugin.clone()))
    }

    /// Whether it counts against the limits: loaded, or room reserved for its load.
    fn holds_room(&self) -> bool {
        self.reserved.load(Ordering::SeqCst) || self.current().is_some()
    }

    pub(super) fn root(&self) -> &str {
        &self.options.source
    }

    /// Drops the slot's engine and plugin (requests that hold the engine finish with it; the
    /// plugin's processes stop). True if it was loaded.
    fn unload(&self, name: &str, why: &str) -> bool {
        let loaded = self.current.write().ok().and_then(|mut c| c.take());
        let unloaded = loaded.is_some();
        drop(loaded);
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

    /// The model on demand a request names (Ollama's clients may add the `:latest` tag, which
    /// api/ollama.rs takes off too), or without a name the only model.
    pub(super) fn on_demand_named(&self, name: Option<&str>) -> Option<usize> {
        match name {
            Some(name) => self.on_demand_index(name).or_else(|| self.on_demand_index(name.strip_suffix(":latest")?)),
            None if self.inner.models.len() == 1 => self.on_demand_index(&self.inner.models[0].name),
            None => None,
        }
    }

    /// The model `index` loaded and marked in use, loading it if it must.
    pub(super) async fn ensure_loaded(&self, index: usize) -> Result<InUse, NotReady> {
        let (Some(loadable), Some(on_demand)) = (self.loadable(index), self.inner.on_demand.as_ref()) else {
            return Err(NotReady::Failed("not a model on demand".into()));
        };
        let options = &on_demand.options;
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
                            return Err(match failure {
                                NotReady::Later(why) => NotReady::Later(format!("The model `{name}` cannot load now: {why}")),
                                NotReady::Failed(why) => NotReady::Failed(format!("The model `{name}` could not be loaded: {why}")),
                            });
                        }
                    }
                }
                Err(_) => {
                    return Err(NotReady::Later(format!(
                        "The model `{name}` is loading and was not ready within {:?} (--model-load-timeout); retry later",
                        options.load_timeout
                    )))
                }
            }
        }
    }

    /// One load of model `index`, holding its lock: room first (least recently used models no
    /// request is using go), then the load off the runtime, the warm-up and the plugin.
    async fn load(&self, index: usize, _guard: tokio::sync::OwnedMutexGuard<()>) {
        let (Some(loadable), Some(on_demand)) = (self.loadable(index), self.inner.on_demand.as_ref()) else { return };
        let name = self.inner.models[index].name.clone();
        let loaded = match self.make_room(index, on_demand).await {
            Ok(()) => self.load_reserved(loadable, &on_demand.options).await,
            Err(no_room) => Err(no_room),
        };
        match loaded {
            Ok(loaded) => {
                loadable.last_used.store(self.millis(), Ordering::SeqCst);
                if let Ok(mut current) = loadable.current.write() {
                    *current = Some(loaded);
                }
                if let Ok(mut f) = loadable.failure.lock() {
                    *f = None;
                }
            }
            Err(e) => {
                tracing::error!(model = %name, "cannot load: {}", e.message());
                if let Ok(mut f) = loadable.failure.lock() {
                    *f = Some(e);
                }
            }
        }
        // Loaded (it counts as such now) or failed: the reservation ends.
        loadable.reserved.store(false, Ordering::SeqCst);
    }

    /// The load itself, once room is reserved: the engine (off the runtime), its warm-up, and
    /// its IO-processor plugin, as a server's start does them.
    async fn load_reserved(&self, loadable: &Loadable, options: &OnDemandOptions) -> Result<Loaded, NotReady> {
        let started = Instant::now();
        let model = loadable.options.clone();
        let engine_options = options.engine.clone();
        let engine = match tokio::task::spawn_blocking(move || Engine::load(&model, &engine_options)).await {
            Ok(Ok(engine)) => engine,
            Ok(Err(e)) => return Err(NotReady::Failed(e.to_string())),
            Err(e) => return Err(NotReady::Failed(format!("the load stopped: {e}"))),
        };
        engine.warm_up().await.map_err(|e| NotReady::Failed(format!("its warm-up failed: {e}")))?;
        let plugin = match &engine.spec().io_processor_plugin {
            Some(plugin) => {
                let started = IoProcessor::start(plugin, &options.plugins, &engine).await.map_err(|e| NotReady::Failed(e.to_string()))?;
                tracing::info!(model = %engine.spec().served_name, "IO-processor plugin `{plugin}` started");
                Some(started)
            }
            None => None,
        };
        tracing::info!(model = %engine.spec().served_name, "loaded on demand in {:.2?}", started.elapsed());
        Ok(Loaded { engine, plugin })
    }

    /// Unloads least recently used models no request is using until `index` fits under
    /// `--max-loaded-models` and `--max-loaded-memory`, then reserves its room; waits for one
    /// to be free at most the load timeout.
    async fn make_room(&self, index: usize, on_demand: &OnDemand) -> Result<(), NotReady> {
        let options = &on_demand.options;
        let Some(me) = self.loadable(index) else { return Ok(()) };
        if let Some(max) = options.max_memory {
            if me.weight_bytes > max {
                return Err(NotReady::Failed(format!(
                    "its weights take {}, more than --max-loaded-memory ({}) allows",
                    size(me.weight_bytes),
                    size(max)
                )));
            }
        }
        let deadline = Instant::now() + options.load_timeout;
        loop {
            let (evict, full) = {
                let _room = on_demand.room.lock();
                let others: Vec<(usize, &Loadable)> = self
                    .inner
                    .models
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != index)
                    .filter_map(|(i, s)| s.on_demand.as_ref().map(|l| (i, l)))
                    .filter(|(_, l)| l.holds_room())
                    .collect();
                let held: u64 = others.iter().map(|(_, l)| l.weight_bytes).sum();
                let full = match (options.max_loaded, options.max_memory) {
                    (Some(max), _) if others.len() >= max => {
                        Some(format!("all {max} loaded models are in use (--max-loaded-models {max}); retry later"))
                    }
                    (_, Some(max)) if held + me.weight_bytes > max => Some(format!(
                        "the models in use hold {} of --max-loaded-memory's {} and it needs {}; retry later",
                        size(held),
                        size(max),
                        size(me.weight_bytes)
                    )),
                    _ => None,
                };
                if full.is_none() {
                    me.reserved.store(true, Ordering::SeqCst);
                    return Ok(());
                }
                // Only a loaded model can go (one still loading holds its room).
                let idle = others
                    .iter()
                    .filter(|(_, l)| l.current().is_some() && l.in_use.load(Ordering::SeqCst) == 0)
                    .min_by_key(|(_, l)| l.last_used.load(Ordering::SeqCst))
                    .map(|(i, _)| *i);
                (idle, full)
            };
            match (evict, full) {
                (Some(i), _) => {
                    if let Some(l) = self.loadable(i) {
                        l.unload(&self.inner.models[i].name, "least recently used, to make room for another model");
                    }
                }
                (None, Some(full)) if Instant::now() >= deadline => return Err(NotReady::Later(full)),
                (None, _) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Unloads every model on demand idle past `--model-idle-timeout` (run every second).
    pub fn unload_idle(&self) {
        let Some(idle) = self.inner.on_demand.as_ref().and_then(|o| o.options.idle_timeout) else { return };
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

/// Bytes as people read them: "180 KiB", "1.3 GiB".
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{} KiB", b.div_ceil(1 << 10)),
    }
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
    let Some(options) = state.inner.on_demand.as_ref().map(|o| &o.options) else { return next.run(request).await };
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
    let _using = match state.on_demand_named(named.as_deref()) {
        Some(index) => match state.ensure_loaded(index).await {
            Ok(using) => Some(using),
            Err(not_ready) => return not_ready.http(),
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
        Err(not_ready) => not_ready.http(),
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
