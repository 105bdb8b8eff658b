//! Several models in one server, through the real router. An embedding model, a
//! token classifier (NER) and a SPLADE model are served together; each must answer exactly as
//! its reference, alone and under concurrent mixed traffic, and requests are routed by `model`.

use crate::common::*;
use axum::http::StatusCode;
use poolserve::api::{self, ApiOptions, AppState};
use poolserve::pooling::PoolingType;
use serde_json::{json, Value};

fn assert_error(reply: &Reply, status: StatusCode, message_part: &str) {
    assert_eq!(reply.status, status, "body: {}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(message_part), "message {message:?} lacks {message_part:?}");
}

/// The three fixture models under the names clients use.
fn three_models() -> axum::Router {
    let named = |fixture: &str, name: &str, splade: bool| {
        engine(&fixture_model(fixture), |c| {
            c.models[0].served_name = name.into();
            if splade {
                c.models[0].pooler.pooling_type = Some(PoolingType::Splade);
            }
        })
    };
    let engines =
        vec![named("bert-embed-mean", "embedder", false), named("bert-tokcls", "ner", false), named("bert-splade", "splade", true)];
    api::router(AppState::ready_many(engines, ApiOptions::default()), 2_000_000)
}

/// One request per model, each checked against its reference; returns how many checks ran.
async fn check_each_model(router: &axum::Router, text_index: usize) -> usize {
    let embed = expected("bert-embed-mean");
    let case = &embed["texts"][text_index];
    let reply = post(router, "/v1/embeddings", json!({"model": "embedder", "input": case["text"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["model"], "embedder");
    assert_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]), "embedder");

    let ner = expected("bert-tokcls");
    let case = &ner["texts"][text_index];
    let reply = post(router, "/pooling", json!({"model": "ner", "input": case["text"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["model"], "ner");
    let rows = reply.body["data"][0]["data"].as_array().unwrap();
    let reference = case["softmax"].as_array().unwrap();
    assert_eq!(rows.len(), reference.len());
    for (row, want) in rows.iter().zip(reference) {
        assert!(max_abs_diff(&floats(row), &floats(want)) <= 1e-4, "ner token probabilities");
    }

    let splade = expected("bert-splade");
    let case = &splade["texts"][text_index];
    let reply = post(router, "/pooling", json!({"model": "splade", "input": case["text"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let entries = reply.body["data"][0]["data"].as_array().unwrap();
    let indices: Vec<u64> = entries.iter().map(|e| e["index"].as_u64().unwrap()).collect();
    let want: Vec<u64> = case["sparse"]["indices"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(indices, want, "splade non-zero entries");
    let values: Vec<f32> = entries.iter().map(|e| e["value"].as_f64().unwrap() as f32).collect();
    assert!(max_abs_diff(&values, &floats(&case["sparse"]["values"])) <= 1e-4, "splade weights");
    3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_models_answer_as_their_references() {
    let router = three_models();
    for i in 0..4 {
        check_each_model(&router, i).await;
    }

    // /v1/models lists every model with its tasks and length limit.
    let models = send(&router, "GET", "/v1/models", None, &[]).await;
    assert_eq!(models.status, StatusCode::OK);
    let cards = models.body["data"].as_array().unwrap();
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["embedder", "ner", "splade"]);
    assert_eq!(cards[0]["tasks"], json!(["embed", "token_embed"]));
    assert_eq!(cards[1]["tasks"], json!(["token_classify"]));
    assert_eq!(cards[2]["tasks"], json!(["embed_sparse"]));
    assert!(cards.iter().all(|c| c["max_model_len"].as_u64().unwrap() > 0));
    assert_eq!(send(&router, "GET", "/health", None, &[]).await.status, StatusCode::OK);

    // TEI's /embed_sparse has no `model` field: the one model that serves SPLADE answers.
    let reply = post(&router, "/embed_sparse", json!({"inputs": "a test"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_routed_by_model() {
    let router = three_models();
    assert_error(
        &post(&router, "/v1/embeddings", json!({"model": "nope", "input": "x"})).await,
        StatusCode::NOT_FOUND,
        "The model `nope` does not exist.",
    );
    // With several models a request must name one; the message lists them.
    let unnamed = post(&router, "/v1/embeddings", json!({"input": "x"})).await;
    assert_error(&unnamed, StatusCode::BAD_REQUEST, "name one in `model`: `embedder`, `ner`, `splade`");
    assert_eq!(unnamed.body["error"]["param"], "model");
    assert_route_not_registered(&post(&router, "/v1/embeddings", json!({"model": "ner", "input": "x"})).await);
    assert_route_not_registered(&post(&router, "/classify", json!({"model": "splade", "input": "x"})).await);
    assert_route_not_registered(&post(&router, "/rerank", json!({"model": "ner", "query": "q", "documents": ["d"]})).await);
    let reply = post(&router, "/rerank", json!({"model": "embedder", "query": "q", "documents": ["d", "e"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["model"], "embedder");
    let reply = post(&router, "/tokenize", json!({"model": "ner", "prompt": "a test"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_error(&post(&router, "/tokenize", json!({"prompt": "a test"})).await, StatusCode::BAD_REQUEST, "name one in `model`");

    assert_eq!(post(&router, "/embed_sparse", json!({"model": "splade", "inputs": "a test"})).await.status, StatusCode::OK);
    assert_tei_error(
        &post(&router, "/embed_sparse", json!({"model": "ner", "inputs": "a"})).await,
        StatusCode::FAILED_DEPENDENCY,
        "Backend",
        "Model is not an embedding model with SPLADE pooling",
    );

    // Every request metric carries the model it resolved to.
    let metrics = send(&router, "GET", "/metrics", None, &[]).await.body;
    let text = metrics.as_str().unwrap();
    assert!(text.contains(r#"poolserve_requests_total{endpoint="/rerank",status="200",model="embedder"}"#), "{text}");
    assert!(text.contains(r#"endpoint="/v1/embeddings",status="404",model=""}"#), "{text}");
    for model in ["embedder", "ner", "splade"] {
        assert!(text.contains(&format!(r#"poolserve_model_load_seconds{{model="{model}"}}"#)), "{model}: {text}");
    }
    assert!(text.contains(r#"poolserve_batch_tokens_count{model="ner"}"#), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_mixed_traffic_keeps_every_answer_exact() {
    let router = three_models();
    let mut tasks = Vec::new();
    for round in 0..6 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move { check_each_model(&router, round % 4).await }));
    }
    let mut checks = 0;
    for task in tasks {
        checks += task.await.expect("no panic");
    }
    assert_eq!(checks, 18);
    let _: Value = Value::Null;
}
