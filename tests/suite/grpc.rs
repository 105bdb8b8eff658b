//! TEI's gRPC API through the real router: gRPC frames in, frames and trailers out (the wire
//! format, without a client library; `tests/protocols/grpc_check.py` drives a real grpcio
//! client against the binary).

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use poolserve::api::grpc::pb;
use poolserve::api::{self, ApiOptions, AppState};
use prost::Message;
use serde_json::json;
use tower::ServiceExt;

/// One unary call: the message framed (no compression, 4-byte length), the answer's message
/// (when there is one), its `grpc-status` and `grpc-message` (from the trailers, or from the
/// headers of a trailers-only answer).
async fn call<Req: Message, Res: Message + Default>(
    router: &axum::Router,
    path: &str,
    request: Req,
    metadata: &[(&str, &str)],
) -> (Option<Res>, i32, String) {
    let payload = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(&payload);
    let mut builder = Request::post(path).header("content-type", "application/grpc").header("te", "trailers");
    for (k, v) in metadata {
        builder = builder.header(*k, *v);
    }
    let response = router.clone().oneshot(builder.body(Body::from(framed)).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "gRPC answers HTTP 200 whatever the outcome");
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let bytes = collected.to_bytes();
    let ended = if trailers.contains_key("grpc-status") { &trailers } else { &headers };
    let status: i32 = ended.get("grpc-status").expect("a grpc-status").to_str().unwrap().parse().unwrap();
    let message = poolserve::api::grpc::message_of(ended).unwrap_or_default();
    let answer = (bytes.len() >= 5).then(|| Res::decode(&bytes[5..]).expect("one answer message"));
    (answer, status, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_answers_as_the_http_route_does() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let reference = expected("bert-embed-mean");
    let text = reference["texts"][0]["text"].as_str().unwrap();
    let (answer, status, _) =
        call::<_, pb::EmbedResponse>(&router, "/tei.v1.Embed/Embed", pb::EmbedRequest { inputs: text.into(), ..Default::default() }, &[])
            .await;
    assert_eq!(status, 0);
    let answer = answer.unwrap();
    assert_close(&answer.embeddings, &floats(&reference["texts"][0]["embedding"]), "gRPC Embed");
    let over_http = post(&router, "/embed", json!({"inputs": text})).await;
    assert_eq!(answer.embeddings, floats(&over_http.body[0]), "the HTTP route's numbers");
    let metadata = answer.metadata.unwrap();
    assert_eq!(metadata.compute_tokens as usize, reference["texts"][0]["input_ids"].as_array().unwrap().len());
    assert_eq!(metadata.compute_chars as usize, text.chars().count());
    assert!(metadata.total_time_ns >= metadata.inference_time_ns && metadata.inference_time_ns > 0);

    // TEI's codes and words.
    let (_, status, message) = call::<_, pb::EmbedResponse>(&router, "/tei.v1.Embed/Embed", pb::EmbedRequest::default(), &[]).await;
    assert_eq!((status, message.as_str()), (3, "Input validation error: `inputs` cannot be empty"), "INVALID_ARGUMENT");
    let (_, status, message) = call::<_, pb::RerankResponse>(
        &router,
        "/tei.v1.Rerank/Rerank",
        pb::RerankRequest { query: "q".into(), texts: vec!["a".into()], ..Default::default() },
        &[],
    )
    .await;
    assert_eq!((status, message.as_str()), (9, "model is not a classifier model"), "FAILED_PRECONDITION");
    let (_, status, _) = call::<_, pb::EmbedResponse>(
        &router,
        "/tei.v1.Embed/Embed",
        pb::EmbedRequest { inputs: "a".into(), ..Default::default() },
        &[("model", "nope")],
    )
    .await;
    assert_eq!(status, 5, "NOT_FOUND for a model that is not served");
    let (_, status, _) = call::<_, pb::EmbedResponse>(&router, "/tei.v1.Embed/NoSuchCall", pb::EmbedRequest::default(), &[]).await;
    assert_eq!(status, 12, "UNIMPLEMENTED");

    // Counted by the metrics as the HTTP status the gRPC status means.
    let metrics = send(&router, "GET", "/metrics", None, &[]).await.body.as_str().unwrap().to_string();
    assert!(metrics.contains(r#"poolserve_requests_total{endpoint="/tei.v1.Embed/{*rest}",status="400""#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_grpc_but_not_health() {
    let options = ApiOptions { api_keys: vec!["sekret".into()], ..Default::default() };
    let router = api::router(AppState::ready_with(engine(&fixture_model("bert-reranker"), |_| {}), options), 2_000_000);
    let predict = || pb::PredictPairRequest { inputs: vec!["a".into(), "b".into()], ..Default::default() };
    let (_, status, message) = call::<_, pb::PredictResponse>(&router, "/tei.v1.Predict/PredictPair", predict(), &[]).await;
    assert_eq!((status, message.as_str()), (16, "No valid auth token"), "UNAUTHENTICATED");
    let (answer, status, _) =
        call::<_, pb::PredictResponse>(&router, "/tei.v1.Predict/PredictPair", predict(), &[("authorization", "Bearer sekret")]).await;
    assert_eq!(status, 0);
    assert_eq!(answer.unwrap().predictions[0].label, "LABEL_0");
    let (answer, status, _) = call::<_, tonic_health::pb::HealthCheckResponse>(
        &router,
        "/grpc.health.v1.Health/Check",
        tonic_health::pb::HealthCheckRequest { service: "tei.v1.Rerank".into() },
        &[],
    )
    .await;
    assert_eq!((status, answer.unwrap().status), (0, 1), "SERVING, without the key");
}

/// Models on demand (`--models-dir`) over gRPC: a call loads the model its `model` metadata
/// names and answers the reference's vector, as an HTTP request would; Info describes and loads
/// nothing; a model that cannot load answers INTERNAL with its error, and a call the API key
/// refuses loads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_loads_its_model_on_demand() {
    use poolserve::api::on_demand::OnDemandOptions;
    let options = |name: &str, fixture: &str| {
        let mut model = config_for(&fixture_model(fixture), |_| {}).models.remove(0);
        model.served_name = name.into();
        model
    };
    let broken = std::env::temp_dir().join(format!("poolserve-grpc-broken-{}", std::process::id()));
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("config.json"), "{ not json").unwrap();
    let mut broken_model = options("broken", "bert-embed-mean");
    broken_model.source = broken.to_str().unwrap().into();
    let models = vec![options("bert", "bert-embed-mean"), options("ranker", "bert-reranker"), broken_model];
    let on_demand = OnDemandOptions {
        max_loaded: Some(1),
        max_memory: None,
        idle_timeout: None,
        load_timeout: std::time::Duration::from_secs(60),
        engine: config_for(&fixture_model("bert-embed-mean"), |_| {}).engine,
        payload_limit: 2_000_000,
        plugins: Default::default(),
    };
    let api_options = ApiOptions { api_keys: vec!["key".into()], ..Default::default() };
    let state = AppState::on_demand(models, api_options, on_demand);
    let router = api::router(state.clone(), 2_000_000);
    let loaded = |name: &str| state.catalogue().iter().any(|(n, _, engine)| n == name && engine.is_some());
    let auth = ("authorization", "Bearer key");

    let (_, status, _) = call::<_, pb::EmbedResponse>(
        &router,
        "/tei.v1.Embed/Embed",
        pb::EmbedRequest { inputs: "a".into(), ..Default::default() },
        &[("model", "bert")],
    )
    .await;
    assert_eq!(status, 16, "UNAUTHENTICATED without the key");
    assert!(!loaded("bert"), "a refused call loads nothing");
    let (_, status, _) = call::<_, pb::InfoResponse>(&router, "/tei.v1.Info/Info", pb::InfoRequest {}, &[("model", "bert"), auth]).await;
    assert_eq!(status, 14, "UNAVAILABLE: Info describes a model that is not loaded");
    assert!(!loaded("bert"), "Info loads nothing");

    let reference = expected("bert-embed-mean");
    let text = reference["texts"][0]["text"].as_str().unwrap();
    let request = pb::EmbedRequest { inputs: text.into(), ..Default::default() };
    let (answer, status, message) = call::<_, pb::EmbedResponse>(&router, "/tei.v1.Embed/Embed", request, &[("model", "bert"), auth]).await;
    assert_eq!(status, 0, "{message}");
    assert_close(&answer.unwrap().embeddings, &floats(&reference["texts"][0]["embedding"]), "gRPC Embed on demand");
    assert!(loaded("bert"));

    // Another model's call takes the one place (--max-loaded-models 1).
    let request = pb::RerankRequest { query: "a".into(), texts: vec!["b".into(), "c".into()], ..Default::default() };
    let (answer, status, message) =
        call::<_, pb::RerankResponse>(&router, "/tei.v1.Rerank/Rerank", request, &[("model", "ranker"), auth]).await;
    assert_eq!(status, 0, "{message}");
    assert_eq!(answer.unwrap().ranks.len(), 2);
    assert!(loaded("ranker") && !loaded("bert"), "the least recently used model left");

    let (_, status, message) = call::<_, pb::EmbedResponse>(
        &router,
        "/tei.v1.Embed/Embed",
        pb::EmbedRequest { inputs: "a".into(), ..Default::default() },
        &[("model", "broken"), auth],
    )
    .await;
    assert_eq!(status, 13, "INTERNAL for a model that cannot load");
    assert!(message.contains("The model `broken` could not be loaded"), "{message}");
    let _ = std::fs::remove_dir_all(&broken);
}
