//! Helpers shared by the integration tests: fixture paths, engines over fixture models,
//! requests through the real router, and the comparison metrics of the parity contract.
#![allow(dead_code)]

pub mod cross_encoder;
pub mod families;
pub mod server;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use poolserve::api::{self, AppState};
use poolserve::config::ServerConfig;
use poolserve::engine::Engine;
use serde_json::Value;
use std::path::PathBuf;
use tower::ServiceExt;

pub fn fixture_model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

pub fn expected(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/expected").join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture file")).expect("fixture json")
}

/// A real model folder made by scripts/fetch-models.sh (`splade-tiny`, `rampart-ner`) under
/// `POOLSERVE_MODELS` (default `models/`). In CI its absence is a failure.
pub fn real_model_dir(name: &str) -> Option<PathBuf> {
    let root =
        std::env::var("POOLSERVE_MODELS").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    let dir = root.join(name);
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing: run scripts/fetch-models.sh models splade rampart", dir.display());
    }
    eprintln!("skipping: {} is missing (scripts/fetch-models.sh models splade rampart)", dir.display());
    None
}

/// The real all-MiniLM-L6-v2 folder made by scripts/fetch-minilm.sh (`POOLSERVE_MINILM`
/// overrides the default `models/all-MiniLM-L6-v2`). In CI its absence is a failure.
pub fn minilm_dir() -> Option<PathBuf> {
    let dir = std::env::var("POOLSERVE_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2"));
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing: run scripts/fetch-minilm.sh models", dir.display());
    }
    eprintln!("skipping: {} is missing (scripts/fetch-minilm.sh models)", dir.display());
    None
}

/// The server config of `model`, in float32: the parity references are float32, and `--dtype
/// auto` may choose bfloat16 on CPUs with native bf16 products (`loader::auto_dtype`), which its
/// own tests cover (`tweak` sets `DTypeArg::Auto` back).
pub fn config_for(model: &std::path::Path, tweak: impl FnOnce(&mut ServerConfig)) -> ServerConfig {
    let mut config = ServerConfig::for_model(model.to_str().expect("utf-8 path"));
    config.models[0].dtype = poolserve::loader::options::DTypeArg::Float32;
    tweak(&mut config);
    config
}

pub fn engine(model: &std::path::Path, tweak: impl FnOnce(&mut ServerConfig)) -> Engine {
    let config = config_for(model, tweak);
    poolserve::engine::Engine::load(&config.models[0], &config.engine).expect("model loads")
}

pub fn router(engine: Engine, payload_limit: usize) -> axum::Router {
    api::router(AppState::ready(engine), payload_limit)
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Value,
}

pub async fn send(router: &axum::Router, method: &str, uri: &str, body: Option<String>, headers: &[(&str, &str)]) -> Reply {
    let mut request = Request::builder().method(method).uri(uri).header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(body.map(Body::from).unwrap_or_else(Body::empty)).expect("request");
    let response = router.clone().oneshot(request).await.expect("router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    // Non-JSON bodies (/metrics) come back as a string.
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Reply { status, headers, body }
}

pub async fn post(router: &axum::Router, uri: &str, body: Value) -> Reply {
    send(router, "POST", uri, Some(body.to_string()), &[]).await
}

/// vLLM's answer on a route it does not register for the model (its pooling task has no such
/// endpoint): FastAPI's own 404.
pub fn assert_route_not_registered(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "body: {}", reply.body);
    assert_eq!(reply.body, serde_json::json!({"detail": "Not Found"}));
}

/// TEI's error shape (`{"error": message, "error_type": kind}`) with `status`, and a message
/// holding `part`.
pub fn assert_tei_error(reply: &Reply, status: StatusCode, kind: &str, part: &str) {
    assert_eq!(reply.status, status, "body: {}", reply.body);
    assert_eq!(reply.body["error_type"], kind, "body: {}", reply.body);
    let message = reply.body["error"].as_str().unwrap_or_default();
    assert!(message.contains(part), "message {message:?} lacks {part:?}");
}

/// Content parts as vLLM 0.33's list of documents for `/score` and `/rerank`: each part a
/// document `{"content": [part]}` of its own (one `{"content": [parts]}` is one document).
pub fn one_part_documents(parts: &[Value]) -> Value {
    Value::Array(parts.iter().map(|part| serde_json::json!({"content": [part]})).collect())
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "vector sizes differ");
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-30)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vector sizes differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The embedding tolerance of the parity contract: cosine ≥ 0.9999 and max abs diff ≤ 1e-4.
pub fn assert_close(ours: &[f32], reference: &[f32], what: &str) {
    let cos = cosine(ours, reference);
    let diff = max_abs_diff(ours, reference);
    assert!(cos >= 0.9999 && diff <= 1e-4, "{what}: cosine {cos}, max abs diff {diff}");
}
