//! Request bodies through the real router and a real (tiny) model: the first byte picks the
//! route, the rest is the body. Every answer must be an answer (no panic, which the router
//! would turn into a 500) and never a 500: bad input is the client's error.
#![no_main]

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

#[path = "common/served.rs"]
mod served;
use served::SERVED;

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

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let route = ROUTES[pick as usize % ROUTES.len()];
    let served = &*SERVED;
    let request = Request::post(route).header("content-type", "application/json").body(Body::from(body.to_vec())).expect("request");
    let status = served.runtime.block_on(served.router.clone().oneshot(request)).expect("the router answers").status();
    assert!(status.as_u16() != 500, "{route} answered 500 to {:?}", String::from_utf8_lossy(body));
});
