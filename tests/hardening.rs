//! What hostile requests, crashed workers and broken folders must not do to the server
//! (a panic, a hang, unbounded memory, a delay for others), through the real router.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::json;

/// A panic while tokenizing fails that request only: the (single) worker survives, /health
/// stays 200 and the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenizer_panic_fails_one_request_and_the_worker_goes_on() {
    let engine = engine(&fixture_model("bert-embed-mean"), |c| c.engine.tokenizer_workers = 1);
    let router = router(engine.clone(), 2_000_000);
    let failed = engine.panic_in_a_tokenizer_worker().await;
    assert!(matches!(failed, Err(poolserve::engine::EngineError::Input(poolserve::input::InputError::Tokenizer(_)))), "{failed:?}");
    assert_eq!(send(&router, "GET", "/health", None, &[]).await.status, StatusCode::OK);
    for _ in 0..3 {
        let reply = post(&router, "/v1/embeddings", json!({"input": ["A man is eating food."]})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }
    assert!(engine.check_alive().is_ok());
}

/// 404 and 405 answers carry the timing headers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrouted_answers_carry_timing_headers() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let not_found = send(&router, "GET", "/no/such/route", None, &[]).await;
    assert_eq!(not_found.status, StatusCode::NOT_FOUND);
    let wrong_method = send(&router, "GET", "/v1/embeddings", None, &[]).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    for reply in [not_found, wrong_method] {
        for header in ["x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"] {
            assert!(reply.headers.contains_key(header), "{} answer lacks {header}", reply.status);
        }
    }
}

fn in_flight(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with("poolserve_requests_in_flight "))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1.0)
}

/// A client that disconnects mid-request is still counted out of `requests_in_flight`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_leaves_no_request_in_flight() {
    use tower::ServiceExt;
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let texts: Vec<String> = (0..1024).map(|i| format!("text number {i} about something long enough to take a while")).collect();
    let body = serde_json::to_string(&json!({"input": texts})).unwrap();
    let request =
        axum::http::Request::post("/v1/embeddings").header("content-type", "application/json").body(axum::body::Body::from(body)).unwrap();
    // The client gives up after 20 ms: the handler's future is dropped mid-way.
    let gave_up = tokio::time::timeout(std::time::Duration::from_millis(20), router.clone().oneshot(request)).await;
    assert!(gave_up.is_err(), "the request finished within 20 ms; the test needs a slower one");
    // Other tests of this file may be in flight at the same time: wait for the gauge to settle.
    let mut gauge = -1.0;
    for _ in 0..200 {
        let metrics = router.clone().oneshot(axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap()).await.unwrap();
        let text = String::from_utf8(axum::body::to_bytes(metrics.into_body(), 1_000_000).await.unwrap().to_vec()).unwrap();
        // The /metrics request itself is in flight while it renders.
        gauge = in_flight(&text) - 1.0;
        if gauge == 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(gauge, 0.0, "requests_in_flight did not return to zero");
}

/// Resident memory of this test process, in MiB (Linux).
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// A 1.5 MB query against 1,000 documents: refused at once without truncation; with it, the
/// query is cut to what the model could use and tokenized once, and memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_query_against_many_documents_does_not_amplify() {
    let router = router(engine(&fixture_model("bert-reranker"), |_| {}), 20_000_000);
    let query = "the quick brown fox ".repeat(75_000); // 1.5 MB
    let documents: Vec<String> = (0..1000).map(|i| format!("document {i}")).collect();
    let before = rss_mib();
    let started = std::time::Instant::now();
    let refused = post(&router, "/rerank", json!({"query": query, "documents": documents})).await;
    let refused_in = started.elapsed();
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(refused.body["error"]["message"].as_str().unwrap().contains("bytes"), "{}", refused.body);
    let started = std::time::Instant::now();
    let truncated = post(&router, "/score", json!({"text_1": query, "text_2": documents, "truncate_prompt_tokens": -1})).await;
    let truncated_in = started.elapsed();
    assert_eq!(truncated.status, StatusCode::OK, "{}", truncated.body);
    assert_eq!(truncated.body["data"].as_array().unwrap().len(), 1000);
    let growth = rss_mib() - before;
    eprintln!(
        "1.5 MB query × 1000 documents: refused in {refused_in:?}; truncated and scored in {truncated_in:?}; RSS growth {growth:.0} MiB"
    );
    // Before the fix the query was copied into every pair: 1.5 GB of strings.
    assert!(growth < 300.0, "RSS grew by {growth:.0} MiB");
}

/// Requests take turns in the batches: a one-text request sent after three 1,024-input
/// requests is answered while they are still running, not after them. Prints the one-text
/// latency idle and under that flood (no timing is asserted: machines are noisy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_request_is_not_stuck_behind_big_ones() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |c| c.engine.max_num_seqs = 64), 20_000_000);
    let single = || post(&router, "/v1/embeddings", json!({"input": ["A man is eating food."]}));
    let mut idle = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        assert_eq!(single().await.status, StatusCode::OK);
        idle.push(started.elapsed());
    }
    // Long enough (120 tokens each) that the floods outlast the small requests on a fast
    // machine too: with 14-token texts they once finished within the first 200 ms.
    let words = "with a few more words in it to make it longer ".repeat(12);
    let texts: Vec<String> = (0..1024).map(|i| format!("flood text number {i} {words}")).collect();
    let floods: Vec<_> = (0..3)
        .map(|_| {
            let router = router.clone();
            let body = json!({"input": texts, "truncate_prompt_tokens": 120});
            tokio::spawn(async move { post(&router, "/v1/embeddings", body).await.status })
        })
        .collect();
    // Long enough for the floods to be queued, short against their run.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let mut flooded = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        assert_eq!(single().await.status, StatusCode::OK);
        flooded.push(started.elapsed());
    }
    let floods_running = floods.iter().filter(|f| !f.is_finished()).count();
    for flood in floods {
        assert_eq!(flood.await.unwrap(), StatusCode::OK);
    }
    idle.sort();
    flooded.sort();
    eprintln!(
        "one-text request p50 / max: idle {:?} / {:?}, under three 1,024-input floods {:?} / {:?}",
        idle[2], idle[4], flooded[2], flooded[4]
    );
    assert!(floods_running > 0, "the floods finished before the small requests: nothing was tested");
}

/// Token-level outputs over `--max-output-floats` are refused with 400 before the model runs:
/// /pooling token_embed and late-interaction /score alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_outputs_over_the_budget_are_refused() {
    // bert-colbert: 16-dimensional token vectors; 100 floats are 6 tokens.
    let router = router(engine(&fixture_model("bert-colbert"), |c| c.engine.max_output_floats = 100), 2_000_000);
    let long = "the quick brown fox jumps over the lazy dog";
    let refused = post(&router, "/pooling", json!({"input": long, "task": "token_embed"})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(refused.body["error"]["message"].as_str().unwrap().contains("--max-output-floats"), "{}", refused.body);
    let scored = post(&router, "/score", json!({"text_1": long, "text_2": long})).await;
    assert_eq!(scored.status, StatusCode::BAD_REQUEST, "{}", scored.body);
    let small = post(&router, "/pooling", json!({"input": "hi", "task": "token_embed"})).await;
    assert_eq!(small.status, StatusCode::OK, "{}", small.body);
}

/// /tokenize and /detokenize go through admission like every model route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_routes_are_admitted_like_model_routes() {
    let engine = engine(&fixture_model("bert-embed-mean"), |c| c.engine.max_concurrent_requests = 1);
    let router = router(engine.clone(), 2_000_000);
    let held = engine.admit().unwrap();
    assert_eq!(post(&router, "/tokenize", json!({"prompt": "hello"})).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(post(&router, "/detokenize", json!({"tokens": [5, 6]})).await.status, StatusCode::TOO_MANY_REQUESTS);
    drop(held);
    assert_eq!(post(&router, "/tokenize", json!({"prompt": "hello"})).await.status, StatusCode::OK);
    let reply = post(&router, "/detokenize", json!({"tokens": [5, 6]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// `/health` keeps answering while three 1,024-input requests saturate the engine (their
/// tokenizing, scoring and serialization run off the async runtime). Prints its latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_the_server_is_saturated() {
    let router = router(engine(&fixture_model("bert-colbert"), |_| {}), 50_000_000);
    let texts: Vec<String> = (0..1024).map(|i| format!("flood text number {i} with a few more words in it to make it longer")).collect();
    let floods: Vec<_> = (0..3)
        .map(|k| {
            let router = router.clone();
            // Token matrices (token_embed) and MaxSim scores: the heavy outputs.
            let body = if k == 0 { json!({"input": texts, "task": "token_embed"}) } else { json!({"text_1": texts[0], "text_2": texts}) };
            let path = if k == 0 { "/pooling" } else { "/score" };
            tokio::spawn(async move { post(&router, path, body).await.status })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let started = std::time::Instant::now();
        assert_eq!(send(&router, "GET", "/health", None, &[]).await.status, StatusCode::OK);
        latencies.push(started.elapsed());
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let running = floods.iter().filter(|f| !f.is_finished()).count();
    for flood in floods {
        assert_eq!(flood.await.unwrap(), StatusCode::OK);
    }
    latencies.sort();
    eprintln!("/health under load ({running} of 3 floods still running at the end): p50 {:?}, max {:?}", latencies[10], latencies[19]);
}

/// Every model route checks in one order: the model (404), then admission (429), then the
/// request's parameter values and inputs (400): the same bad request gets the same status
/// anywhere. (A body that does not parse at all, wrong types and unknown enum values included,
/// is 400 before anything else, on every route alike.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_in_the_same_order() {
    let engine = engine(&fixture_model("bert-embed-mean"), |c| c.engine.max_concurrent_requests = 1);
    let router = router(engine.clone(), 2_000_000);
    let bad = json!(-5); // an invalid truncate_prompt_tokens
    let routes = [
        ("/v1/embeddings", json!({"input": "a", "truncate_prompt_tokens": bad})),
        ("/pooling", json!({"input": "a", "truncate_prompt_tokens": bad})),
        (
            "/v2/embed",
            json!({"texts": ["a"], "input_type": "search_query", "embedding_types": ["float"], "truncate": "NONE", "max_tokens": 5}),
        ),
        ("/score", json!({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": bad})),
        ("/rerank", json!({"query": "a", "documents": ["b"], "truncate_prompt_tokens": bad})),
    ];
    let held = engine.admit().unwrap();
    for (path, body) in &routes {
        let mut unknown = body.clone();
        unknown["model"] = json!("no-such-model");
        assert_eq!(post(&router, path, unknown).await.status, StatusCode::NOT_FOUND, "{path}: unknown model");
        assert_eq!(post(&router, path, body.clone()).await.status, StatusCode::TOO_MANY_REQUESTS, "{path}: at the limit");
    }
    drop(held);
    for (path, body) in &routes {
        let reply = post(&router, path, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path}: {}", reply.body);
    }
}

/// When the model thread is gone, /health says 503 (so Kubernetes restarts the pod) and model
/// requests get 503 instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_once_the_model_thread_is_gone() {
    let engine = engine(&fixture_model("bert-embed-mean"), |_| {});
    let router = router(engine.clone(), 2_000_000);
    assert_eq!(send(&router, "GET", "/health", None, &[]).await.status, StatusCode::OK);
    engine.stop_model_thread();
    let mut status = StatusCode::OK;
    for _ in 0..100 {
        status = send(&router, "GET", "/health", None, &[]).await.status;
        if status != StatusCode::OK {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let reply = post(&router, "/v1/embeddings", json!({"input": "a"})).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
}

/// Large bodies are streamed in chunks as they are serialized (no Content-Length), small ones
/// are sent whole; both parse to the same vectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_and_small_ones_do_not() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let texts: Vec<String> = (0..400).map(|i| format!("text {i}")).collect();
    let large = post(&router, "/v1/embeddings", json!({"input": texts})).await;
    assert_eq!(large.status, StatusCode::OK);
    assert!(!large.headers.contains_key("content-length"), "a large body should stream");
    let data = large.body["data"].as_array().unwrap();
    assert_eq!(data.len(), 400);
    let small = post(&router, "/v1/embeddings", json!({"input": texts[399]})).await;
    assert!(small.headers.contains_key("content-length"), "a small body is sent whole");
    assert_eq!(small.body["data"][0]["embedding"], data[399]["embedding"]);
}
