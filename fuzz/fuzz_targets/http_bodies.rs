//! Request bodies through the real router and a real (tiny) model: the first byte picks the
//! route, the rest is the body. Every answer must be an answer (no panic, which the router
//! would turn into a 500) and never a 500: bad input is the client's error.
#![no_main]

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use tower::ServiceExt;

const ROUTES: [&str; 16] = [
    "/v1/embeddings",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
    "/v2/embed",
    "/v1/embed",
    "/tokenize",
    "/detokenize",
    "/embed",
    "/embed_all",
    "/predict",
    "/similarity",
    "/decode",
    "/vertex",
    "/invocations",
];

struct Served {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

static SERVED: LazyLock<Served> = LazyLock::new(|| {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/bert-embed-mean");
    let config = poolserve::config::ServerConfig::for_model(folder);
    let engine = runtime.block_on(async { poolserve::engine::Engine::load(&config.models[0], &config.engine) }).expect("the fixture loads");
    let router = poolserve::api::router(poolserve::api::AppState::ready(engine), config.payload_limit);
    Served { runtime, router }
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let route = ROUTES[pick as usize % ROUTES.len()];
    let served = &*SERVED;
    let request = Request::post(route).header("content-type", "application/json").body(Body::from(body.to_vec())).expect("request");
    let status = served.runtime.block_on(served.router.clone().oneshot(request)).expect("the router answers").status();
    assert!(status.as_u16() != 500, "{route} answered 500 to {:?}", String::from_utf8_lossy(body));
});
