//! gRPC calls through the real router and a real (tiny) model: the first byte picks the method
//! (unary and streaming), the rest is the request body, framed as one message (or, for odd
//! picks, sent raw, so the frame prefix itself is fuzzed). Every call must end with a
//! `grpc-status` in an HTTP 200 (a panic would be a 500), never UNKNOWN (2), and INTERNAL (13)
//! only from tonic's codec, which is gRPC's code for a frame or message that does not decode
//! (TEI, on tonic too, answers the same); INTERNAL from our service (a request's task that
//! failed) is a bug.
#![no_main]

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

#[path = "common/served.rs"]
mod served;
use served::SERVED;

const METHODS: [&str; 17] = [
    "/tei.v1.Info/Info",
    "/tei.v1.Embed/Embed",
    "/tei.v1.Embed/EmbedStream",
    "/tei.v1.Embed/EmbedSparse",
    "/tei.v1.Embed/EmbedSparseStream",
    "/tei.v1.Embed/EmbedAll",
    "/tei.v1.Embed/EmbedAllStream",
    "/tei.v1.Predict/Predict",
    "/tei.v1.Predict/PredictPair",
    "/tei.v1.Predict/PredictStream",
    "/tei.v1.Predict/PredictPairStream",
    "/tei.v1.Rerank/Rerank",
    "/tei.v1.Rerank/RerankStream",
    "/tei.v1.Tokenize/Tokenize",
    "/tei.v1.Tokenize/TokenizeStream",
    "/tei.v1.Tokenize/Decode",
    "/tei.v1.Tokenize/DecodeStream",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, message)) = data.split_first() else { return };
    let method = METHODS[(pick >> 1) as usize % METHODS.len()];
    let body = if pick & 1 == 0 {
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        framed
    } else {
        message.to_vec()
    };
    let served = &*SERVED;
    let request =
        Request::post(method).header("content-type", "application/grpc").header("te", "trailers").body(Body::from(body)).expect("request");
    let (status, headers, trailers) = served.runtime.block_on(async {
        let response = served.router.clone().oneshot(request).await.expect("the router answers");
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.expect("the body ends");
        (parts.status, parts.headers, collected.trailers().cloned().unwrap_or_default())
    });
    assert_eq!(status.as_u16(), 200, "{method} answered HTTP {status}");
    let ended = if trailers.contains_key("grpc-status") { &trailers } else { &headers };
    let code = ended.get("grpc-status").and_then(|v| v.to_str().ok()).expect("a grpc-status");
    let message = poolserve::api::grpc::message_of(ended).unwrap_or_default();
    let ours = message.starts_with("the request's task failed") || message.starts_with("rerank results");
    assert!(code != "2" && !(code == "13" && ours), "{method} ended with grpc-status {code}: {message}");
});
