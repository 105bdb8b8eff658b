//! Ollama's embedding API through the real router (`api/ollama.rs`): vectors against the
//! transformers references of two fixture shapes, normalized and cut as Ollama does, and
//! Ollama's error shape and messages. The `ollama` client itself runs against MiniLM in the test
//! command (`examples/ollama_embed.py`).

use crate::common::*;
use axum::http::StatusCode;
use poolserve::api::{self, ApiOptions, AppState};
use serde_json::{json, Value};

fn normalized(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_matches_the_reference_normalized_and_cut() {
    for fixture in ["bert-embed-mean", "modernbert-embed-mean"] {
        let router = router(engine(&fixture_model(fixture), |_| {}), 2_000_000);
        // Served under its path (no --served-model-name here).
        let name = fixture_model(fixture).to_str().unwrap().to_string();
        let reference = expected(fixture);
        let texts: Vec<Value> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].clone()).collect();
        let reply = post(&router, "/api/embed", json!({"model": name, "input": texts, "keep_alive": "5m", "options": {}})).await;
        assert_eq!(reply.status, StatusCode::OK, "{fixture}: {}", reply.body);
        assert_eq!(reply.body["model"], name);
        for (i, text) in reference["texts"].as_array().unwrap().iter().enumerate() {
            let want = normalized(&floats(&text["embedding"]));
            assert_close(&floats(&reply.body["embeddings"][i]), &want, &format!("{fixture} /api/embed {i}"));
        }
        let tokens: usize = reference["texts"].as_array().unwrap().iter().map(|t| t["input_ids"].as_array().unwrap().len()).sum();
        assert_eq!(reply.body["prompt_eval_count"], tokens, "{fixture}");
        assert!(reply.body["total_duration"].as_u64().unwrap() >= reply.body["load_duration"].as_u64().unwrap());

        // `dimensions`: the normalized vector cut, then normalized again; a string input; the
        // `:latest` tag.
        let first = &reference["texts"][0];
        let reply = post(&router, "/api/embed", json!({"model": format!("{name}:latest"), "input": first["text"], "dimensions": 8})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let want = normalized(&normalized(&floats(&first["embedding"]))[..8]);
        assert_close(&floats(&reply.body["embeddings"][0]), &want, &format!("{fixture} dimensions 8"));

        // The older route: one prompt, the /v1/embeddings vector.
        let reply = post(&router, "/api/embeddings", json!({"model": name, "prompt": first["text"]})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_close(&floats(&reply.body["embedding"]), &floats(&first["embedding"]), &format!("{fixture} /api/embeddings"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollamas_answers_for_empty_long_and_bad_requests() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let path = fixture_model("bert-embed-mean");
    let model = path.to_str().unwrap();
    let error = |reply: &Reply, status: StatusCode, message: &str| {
        assert_eq!(reply.status, status, "{}", reply.body);
        assert_eq!(reply.body, json!({ "error": message }));
    };
    // Nothing to embed: no vectors (Ollama loads the model and answers empty).
    let reply = post(&router, "/api/embed", json!({"model": model, "input": ""})).await;
    assert_eq!(reply.body, json!({"model": model, "embeddings": []}));
    let reply = post(&router, "/api/embeddings", json!({"model": model, "prompt": ""})).await;
    assert_eq!(reply.body, json!({"embedding": []}));

    let long = "word ".repeat(2000);
    let reply = post(&router, "/api/embed", json!({"model": model, "input": long, "truncate": false})).await;
    error(&reply, StatusCode::BAD_REQUEST, "the input length exceeds the context length");
    let reply = post(&router, "/api/embed", json!({"model": model, "input": [long, "short"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "truncated by default: {}", reply.body);
    assert_eq!(reply.body["embeddings"].as_array().unwrap().len(), 2);
    // `options.num_ctx` below the model's context truncates there.
    let short = post(&router, "/api/embed", json!({"model": model, "input": long, "options": {"num_ctx": 5}})).await;
    assert_eq!(short.body["prompt_eval_count"], 5, "{}", short.body);

    error(&post(&router, "/api/embed", json!({"model": model, "input": [1, 2]})).await, StatusCode::BAD_REQUEST, "invalid input type");
    error(&post(&router, "/api/embed", json!({"model": model, "input": {"a": 1}})).await, StatusCode::BAD_REQUEST, "invalid input type");
    error(&post(&router, "/api/embed", json!({"model": "nope", "input": "a"})).await, StatusCode::NOT_FOUND, "model 'nope' not found");
    error(&post(&router, "/api/embed", json!({"input": "a"})).await, StatusCode::BAD_REQUEST, "model is required");
    error(&send(&router, "POST", "/api/embed", Some(String::new()), &[]).await, StatusCode::BAD_REQUEST, "missing request body");
    let reply = send(&router, "POST", "/api/embed", Some("{not json".into()), &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.body["error"].is_string() && reply.body.as_object().unwrap().len() == 1, "{}", reply.body);

    // A model that does not embed.
    let classifier = crate::common::router(engine(&fixture_model("bert-seqcls"), |_| {}), 2_000_000);
    error(
        &post(&classifier, "/api/embed", json!({"model": fixture_model("bert-seqcls"), "input": "a"})).await,
        StatusCode::BAD_REQUEST,
        "this model does not support embeddings",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_and_version_list_what_is_served() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let reply = send(&router, "GET", "/api/tags", None, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let models = reply.body["models"].as_array().unwrap();
    assert_eq!(models.len(), 1);
    let name = fixture_model("bert-embed-mean");
    assert_eq!(models[0]["name"], name.to_str().unwrap());
    assert_eq!(models[0]["model"], name.to_str().unwrap());
    assert!(models[0]["modified_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(models[0]["details"]["family"], "BertModel");
    let reply = send(&router, "GET", "/api/version", None, &[]).await;
    // The Ollama release whose API we reproduce, not ours: clients compare it with Ollama's.
    assert_eq!(reply.body["version"], api::ollama::OLLAMA_API_VERSION);
    assert_eq!(reply.body["version"], "0.11.11");
}

/// Open WebUI's Ollama embedding engine, request for request (backend/open_webui/retrieval/
/// utils.py, `generate_ollama_batch_embeddings`, and its connection check): `GET /api/version`
/// and `/api/tags` with its bearer key, then `POST /api/embed` with `input` a list, `truncate:
/// true`, the optional prefix field it adds under a configurable name, `Authorization: Bearer
/// {key}` (an empty key when none is set) and its `X-OpenWebUI-User-*` headers. It reads
/// `embeddings`, and `error` from a failure's body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_webuis_requests_are_answered() {
    let path = fixture_model("bert-embed-mean");
    let model = path.to_str().unwrap();
    let reference = expected("bert-embed-mean");
    let texts: Vec<Value> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].clone()).collect();
    let user = [
        ("x-openwebui-user-name", "Jane Doe"),
        ("x-openwebui-user-id", "7f3c"),
        ("x-openwebui-user-email", "jane@example.com"),
        ("x-openwebui-user-role", "admin"),
    ];
    let body = json!({"input": texts, "model": model, "truncate": true, "prefix": "search_document: "}).to_string();
    let check = |reply: &Reply| {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        for (i, text) in reference["texts"].as_array().unwrap().iter().enumerate() {
            let want = normalized(&floats(&text["embedding"]));
            assert_close(&floats(&reply.body["embeddings"][i]), &want, &format!("Open WebUI /api/embed {i}"));
        }
    };

    // No key configured: Open WebUI still sends `Authorization: Bearer ` (empty).
    let open = router(engine(&path, |_| {}), 2_000_000);
    let headers: Vec<(&str, &str)> = [("authorization", "Bearer ")].into_iter().chain(user).collect();
    assert_eq!(send(&open, "GET", "/api/version", None, &headers).await.body, json!({"version": "0.11.11"}));
    assert_eq!(send(&open, "GET", "/api/tags", None, &headers).await.body["models"][0]["model"], model);
    check(&send(&open, "POST", "/api/embed", Some(body.clone()), &headers).await);

    // With --api-key, its connection's key.
    let keyed = api::router(
        AppState::ready_with(engine(&path, |_| {}), ApiOptions { api_keys: vec!["owui-key".into()], ..Default::default() }),
        2_000_000,
    );
    let headers: Vec<(&str, &str)> = [("authorization", "Bearer owui-key")].into_iter().chain(user).collect();
    check(&send(&keyed, "POST", "/api/embed", Some(body.clone()), &headers).await);
    let refused = send(&keyed, "POST", "/api/embed", Some(body), &[("authorization", "Bearer ")]).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    // What it shows for a failure: `error` of the body.
    let missing = send(
        &keyed,
        "POST",
        "/api/embed",
        Some(json!({"input": ["a"], "model": "nomic-embed-text", "truncate": true}).to_string()),
        &headers,
    )
    .await;
    assert_eq!((missing.status, missing.body), (StatusCode::NOT_FOUND, json!({"error": "model 'nomic-embed-text' not found"})));
}
