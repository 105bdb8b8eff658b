//! The HTTP contract through the real router (no sockets): response shapes, every error case
//! of docs/http-api.md that applies to embeddings, and the auxiliary endpoints.

use crate::common::*;
use axum::http::StatusCode;
use base64::Engine as _;
use poolserve::api::{self, AppState};
use serde_json::{json, Value};

fn tiny_router() -> axum::Router {
    router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000)
}

fn served_name() -> String {
    fixture_model("bert-embed-mean").to_str().unwrap().to_string()
}

fn assert_error(reply: &Reply, status: StatusCode, message_part: &str) {
    assert_eq!(reply.status, status, "body: {}", reply.body);
    let error = &reply.body["error"];
    assert_eq!(error["code"].as_u64(), Some(status.as_u16() as u64), "body: {}", reply.body);
    assert!(error["type"].is_string() && error.get("param").is_some(), "error shape: {}", reply.body);
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(message_part), "message {message:?} lacks {message_part:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_response_shape_and_order() {
    let router = tiny_router();
    let reference = expected("bert-embed-mean");
    let texts: Vec<Value> = reference["inputs"]["texts"].as_array().unwrap().clone();
    let reply = send(
        &router,
        "POST",
        "/v1/embeddings",
        Some(json!({"input": texts, "model": served_name(), "user": "someone"}).to_string()),
        &[("x-request-id", "abc123")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.headers["x-request-id"], "abc123");
    let body = &reply.body;
    assert_eq!(body["id"], "embd-abc123");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], served_name().as_str());
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    let mut tokens = 0;
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i);
        assert_eq!(item["object"], "embedding");
        assert_close(&floats(&item["embedding"]), &floats(&reference["texts"][i]["embedding"]), &format!("text {i}"));
        tokens += reference["texts"][i]["input_ids"].as_array().unwrap().len();
    }
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    assert_eq!(body["usage"]["total_tokens"], tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_input_forms_and_base64() {
    let router = tiny_router();
    let reference = expected("bert-embed-mean");
    let ids = reference["texts"][0]["input_ids"].clone();
    let want = floats(&reference["texts"][0]["embedding"]);
    for input in [json!("A man is eating food."), json!(["A man is eating food."]), ids.clone(), json!([ids])] {
        let reply = post(&router, "/embeddings", json!({"input": input})).await;
        assert_eq!(reply.status, StatusCode::OK, "{input}: {}", reply.body);
        assert_close(&floats(&reply.body["data"][0]["embedding"]), &want, &format!("input form {input}"));
    }
    let reply = post(&router, "/v1/embeddings", json!({"input": "A man is eating food.", "encoding_format": "base64"})).await;
    assert_eq!(reply.status, StatusCode::OK);
    let bytes = base64::engine::general_purpose::STANDARD.decode(reply.body["data"][0]["embedding"].as_str().unwrap()).unwrap();
    let decoded: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_close(&decoded, &want, "base64");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dimensions_normalize_and_truncation() {
    let router = tiny_router();
    let reference = expected("bert-embed-mean");
    // Native size is always accepted (a no-op).
    let reply = post(&router, "/v1/embeddings", json!({"input": "A man is eating food.", "dimensions": 32})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["data"][0]["embedding"].as_array().unwrap().len(), 32);
    // normalize=false returns the raw pooled vector.
    let reply = post(&router, "/v1/embeddings", json!({"input": "A man is eating food.", "normalize": false})).await;
    assert_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&reference["texts"][0]["embedding_unnormalized"]), "raw");
    // Truncation keeps k tokens, special tokens included, from the chosen side.
    let long = reference["texts"][3]["text"].as_str().unwrap();
    for side in ["right", "left"] {
        let reply = post(&router, "/tokenize", json!({"prompt": long})).await;
        let all: Vec<u64> = reply.body["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let kept: Vec<u64> = if side == "right" {
            all[..9].iter().chain(&all[all.len() - 1..]).copied().collect()
        } else {
            all[..1].iter().chain(&all[all.len() - 9..]).copied().collect()
        };
        let direct = post(&router, "/v1/embeddings", json!({"input": long, "truncate_prompt_tokens": 10, "truncation_side": side})).await;
        assert_eq!(direct.status, StatusCode::OK, "{}", direct.body);
        assert_eq!(direct.body["usage"]["prompt_tokens"], 10);
        let by_ids = post(&router, "/v1/embeddings", json!({"input": kept})).await;
        assert!(
            max_abs_diff(&floats(&direct.body["data"][0]["embedding"]), &floats(&by_ids.body["data"][0]["embedding"])) < 1e-6,
            "{side}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_error_shape() {
    let router = tiny_router();
    let malformed = send(&router, "POST", "/v1/embeddings", Some("{\"input\": ".into()), &[]).await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "Invalid JSON");
    assert_eq!(malformed.body["error"]["type"], "BadRequestError");
    assert_error(&post(&router, "/v1/embeddings", json!({"model": "x"})).await, StatusCode::BAD_REQUEST, "input");
    assert_error(&post(&router, "/v1/embeddings", json!({"input": 5})).await, StatusCode::BAD_REQUEST, "input must be");
    assert_error(&post(&router, "/v1/embeddings", json!({"input": []})).await, StatusCode::BAD_REQUEST, "empty");
    assert_error(&post(&router, "/v1/embeddings", json!({"input": [[]]})).await, StatusCode::BAD_REQUEST, "empty");
    assert_error(&post(&router, "/v1/embeddings", json!({"input": "a", "dimensions": "8"})).await, StatusCode::BAD_REQUEST, "invalid type");
    assert_error(
        &post(&router, "/v1/embeddings", json!({"input": "a", "encoding_format": "int8"})).await,
        StatusCode::BAD_REQUEST,
        "literal_error",
    );
    assert_error(
        &post(&router, "/v1/embeddings", json!({"input": [5, 100000]})).await,
        StatusCode::BAD_REQUEST,
        "Token id 100000 is out of vocabulary",
    );
    let name = served_name();
    assert_error(
        &post(&router, "/v1/embeddings", json!({"input": "a", "dimensions": 16})).await,
        StatusCode::BAD_REQUEST,
        &format!("Model '{name}' does not support Matryoshka embeddings; dimensions must be unset (received dimensions=16)."),
    );
    assert_error(
        &post(&router, "/v1/embeddings", json!({"input": "a", "truncate_prompt_tokens": 500})).await,
        StatusCode::BAD_REQUEST,
        "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
    );
    let long = "word ".repeat(300);
    let too_long = post(&router, "/v1/embeddings", json!({"input": ["short", long]})).await;
    assert_error(
        &too_long,
        StatusCode::BAD_REQUEST,
        "This model's maximum context length is 128 tokens. However, your prompt contains at least 129 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.",
    );
    assert_error(
        &post(&router, "/v1/embeddings", json!({"input": "a", "model": "other"})).await,
        StatusCode::NOT_FOUND,
        "The model `other` does not exist.",
    );
    assert_error(&send(&router, "GET", "/v1/embeddings", None, &[]).await, StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    assert_error(&send(&router, "GET", "/nope", None, &[]).await, StatusCode::NOT_FOUND, "Not Found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matryoshka_errors_follow_the_model() {
    let engine = engine(&fixture_model("bert-embed-mean"), |c| {
        c.models[0].hf_overrides.insert("matryoshka_dimensions".into(), json!([8, 16]));
    });
    let router = router(engine, 2_000_000);
    let reply = post(&router, "/v1/embeddings", json!({"input": "a", "dimensions": 12})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "only supports Matryoshka dimensions [8, 16], got 12.");
    let reply = post(&router, "/v1/embeddings", json!({"input": "a", "dimensions": 8})).await;
    assert_eq!(reply.body["data"][0]["embedding"].as_array().unwrap().len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_is_413() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 1000);
    let big = json!({"input": "x".repeat(5000)});
    assert_error(&post(&router, "/v1/embeddings", big).await, StatusCode::PAYLOAD_TOO_LARGE, "too large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_concurrency_limit_get_429() {
    let engine = engine(&fixture_model("bert-embed-mean"), |c| c.engine.max_concurrent_requests = 1);
    let held = engine.admit().expect("first slot");
    let router = router(engine.clone(), 2_000_000);
    assert_error(&post(&router, "/v1/embeddings", json!({"input": "a"})).await, StatusCode::TOO_MANY_REQUESTS, "concurrent requests");
    drop(held);
    assert_eq!(post(&router, "/v1/embeddings", json!({"input": "a"})).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_all_get_their_own_answers() {
    let router = tiny_router();
    let reference = expected("bert-embed-mean");
    let mut tasks = Vec::new();
    for i in 0..24 {
        let router = router.clone();
        let text = reference["texts"][i % 4]["text"].clone();
        tasks.push(tokio::spawn(async move { (i % 4, post(&router, "/v1/embeddings", json!({"input": text})).await) }));
    }
    for task in tasks {
        let (which, reply) = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&reference["texts"][which]["embedding"]), "concurrent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_model_routes_wait_for_the_model() {
    let loading = api::router(AppState::new(vec!["m".into()], api::ApiOptions::default()), 1000);
    assert_error(&send(&loading, "GET", "/health", None, &[]).await, StatusCode::SERVICE_UNAVAILABLE, "loading");
    assert_error(&post(&loading, "/v1/embeddings", json!({"input": "a"})).await, StatusCode::SERVICE_UNAVAILABLE, "loading");
    let version = send(&loading, "GET", "/version", None, &[]).await;
    assert_eq!(version.body["version"], env!("CARGO_PKG_VERSION"));

    let router = tiny_router();
    let health = send(&router, "GET", "/health", None, &[]).await;
    assert_eq!(health.status, StatusCode::OK);
    let models = send(&router, "GET", "/v1/models", None, &[]).await;
    assert_eq!(models.body["object"], "list");
    let card = &models.body["data"][0];
    assert_eq!(card["id"], served_name().as_str());
    assert_eq!(card["object"], "model");
    assert_eq!(card["owned_by"], "poolserve");
    assert_eq!(card["max_model_len"], 128);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize() {
    let router = tiny_router();
    let reference = expected("bert-embed-mean");
    let reply = post(&router, "/tokenize", json!({"prompt": "A man is eating food.", "return_token_strs": true})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body["tokens"], reference["texts"][0]["input_ids"]);
    assert_eq!(reply.body["token_strs"], reference["texts"][0]["tokens"]);
    assert_eq!(reply.body["count"], 16);
    assert_eq!(reply.body["max_model_len"], 128);
    let plain = post(&router, "/tokenize", json!({"prompt": "A man", "add_special_tokens": false})).await;
    assert_eq!(plain.body["token_strs"], Value::Null);
    assert_eq!(plain.body["count"], 2);
    let back = post(&router, "/detokenize", json!({"tokens": plain.body["tokens"]})).await;
    assert_eq!(back.body["prompt"], "a man");
    assert_error(&post(&router, "/detokenize", json!({"tokens": [99999]})).await, StatusCode::BAD_REQUEST, "out of vocabulary");
    assert_error(&post(&router, "/tokenize", json!({"prompt": 3})).await, StatusCode::BAD_REQUEST, "invalid type");
}
