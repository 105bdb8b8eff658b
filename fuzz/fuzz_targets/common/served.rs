//! The server the router targets fuzz: the real router over a real (tiny) model, the
//! bert-embed-mean fixture, loaded once per fuzzing process, with a one-thread runtime.

use std::sync::LazyLock;

pub struct Served {
    pub runtime: tokio::runtime::Runtime,
    pub router: axum::Router,
}

pub static SERVED: LazyLock<Served> = LazyLock::new(|| {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/bert-embed-mean");
    let config = poolserve::config::ServerConfig::for_model(folder);
    let engine = runtime.block_on(async { poolserve::engine::Engine::load(&config.models[0], &config.engine) }).expect("the fixture loads");
    let router = poolserve::api::router(poolserve::api::AppState::ready(engine), config.payload_limit);
    Served { runtime, router }
});
