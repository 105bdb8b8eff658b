//! Operations through the real router: API keys, the client batch limit, /metrics and the
//! timing headers, overload at 4× the concurrency limit, dropped work of disconnected clients,
//! and 10,000 random or malformed bodies on every POST route (never a 500, always the error
//! shape).

use crate::common::*;
use axum::http::StatusCode;
use poolserve::api::{self, ApiOptions, AppState};
use serde_json::{json, Value};

const POST_ROUTES: [&str; 20] = [
    "/v1/embeddings",
    "/embeddings",
    "/classify",
    "/pooling",
    "/embed_sparse",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/tokenize",
    "/detokenize",
    "/invocations",
    "/embed",
    "/embed_all",
    "/predict",
    "/similarity",
    "/decode",
    "/vertex",
    "/",
];

fn router_with(options: ApiOptions) -> axum::Router {
    api::router(AppState::ready_with(engine(&fixture_model("bert-embed-mean"), |_| {}), options), 2_000_000)
}

fn assert_error_shape(reply: &Reply, what: &str) {
    // vLLM's own answer on a route it does not register for the model.
    if reply.status == StatusCode::NOT_FOUND && reply.body == json!({"detail": "Not Found"}) {
        return;
    }
    // TEI's routes answer in TEI's shape.
    if reply.body["error"].is_string() {
        assert!(reply.body["error_type"].is_string(), "{what}: {}", reply.body);
        return;
    }
    let error = &reply.body["error"];
    assert_eq!(error["code"].as_u64(), Some(reply.status.as_u16() as u64), "{what}: {}", reply.body);
    assert!(error["message"].is_string() && error["type"].is_string() && error.get("param").is_some(), "{what}: {}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_every_model_route() {
    let router = router_with(ApiOptions { api_keys: vec!["s3cret".into()], ..Default::default() });
    let body =
        json!({"input": "a", "prompt": "a", "tokens": [1], "text_1": "a", "text_2": "b", "query": "a", "documents": ["b"], "inputs": "a"});
    for route in POST_ROUTES {
        for headers in [vec![], vec![("authorization", "Bearer wrong")], vec![("authorization", "s3cret")]] {
            let reply = send(&router, "POST", route, Some(body.to_string()), &headers).await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{route} with {headers:?}");
            assert_eq!(reply.body["error"]["type"], "AuthenticationError");
        }
        let reply = send(&router, "POST", route, Some(body.to_string()), &[("authorization", "Bearer s3cret")]).await;
        assert_ne!(reply.status, StatusCode::UNAUTHORIZED, "{route} with the right key");
    }
    assert_eq!(send(&router, "GET", "/v1/models", None, &[]).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&router, "GET", "/v1/models", None, &[("authorization", "Bearer s3cret")]).await.status, StatusCode::OK);
    let embed =
        send(&router, "POST", "/v1/embeddings", Some(json!({"input": "a"}).to_string()), &[("authorization", "Bearer s3cret")]).await;
    assert_eq!(embed.status, StatusCode::OK);
    // Probes, version, the scrape and the API's description stay open (the list --api-key's
    // help gives).
    for route in ["/health", "/ping", "/", "/version", "/metrics", "/openapi.json", "/docs/"] {
        assert_eq!(send(&router, "GET", route, None, &[]).await.status, StatusCode::OK, "{route}");
    }
    assert_eq!(send(&router, "POST", "/ping", None, &[]).await.status, StatusCode::OK, "POST /ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_batch_limit_is_one_rule_for_every_endpoint() {
    let router = router_with(ApiOptions { max_client_batch_size: 2, ..Default::default() });
    for (route, body) in [
        ("/v1/embeddings", json!({"input": ["a", "b", "c"]})),
        ("/pooling", json!({"input": [[1], [2], [3]]})),
        ("/score", json!({"text_1": "a", "text_2": ["b", "c", "d"]})),
    ] {
        let reply = post(&router, route, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{route}");
        assert!(reply.body["error"]["message"].as_str().unwrap().contains("at most 2 (--max-client-batch-size)"), "{}", reply.body);
    }
    assert_eq!(post(&router, "/v1/embeddings", json!({"input": ["a", "b"]})).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_timing_headers_describe_the_work() {
    let router = router_with(ApiOptions::default());
    let reply =
        send(&router, "POST", "/v1/embeddings", Some(json!({"input": ["a man", "a dog"]}).to_string()), &[("x-request-id", "m-1")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["x-request-id"], "m-1");
    // TEI's headers, as TEI writes them: whole milliseconds, counts as integers.
    let number = |name: &str| -> u64 { reply.headers[name].to_str().unwrap().parse().unwrap_or_else(|_| panic!("{name} is an integer")) };
    let total = number("x-total-time");
    assert_eq!(number("x-compute-time"), total);
    for header in ["x-tokenization-time", "x-queue-time", "x-inference-time"] {
        assert!(number(header) <= total, "{header} within the total {total}");
    }
    assert_eq!(number("x-compute-characters"), "a man".len() as u64 + "a dog".len() as u64);
    assert!(number("x-compute-tokens") >= 4, "both inputs' tokens, special tokens included");
    assert_eq!(reply.headers["x-compute-type"], "cpu");

    let metrics = axum::body::to_bytes(
        tower::ServiceExt::oneshot(router.clone(), axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap())
            .await
            .unwrap()
            .into_body(),
        1 << 20,
    )
    .await
    .unwrap();
    let text = String::from_utf8(metrics.to_vec()).unwrap();
    for needle in [
        "poolserve_requests_total{endpoint=\"/v1/embeddings\",status=\"200\",model=\"",
        "poolserve_request_duration_seconds_bucket{endpoint=\"/v1/embeddings\",model=\"",
        "poolserve_tokenization_duration_seconds_count",
        "poolserve_queue_duration_seconds_count",
        "poolserve_inference_duration_seconds_count",
        "poolserve_batch_size_bucket",
        "poolserve_batch_tokens_sum",
        "poolserve_input_tokens_total",
        "poolserve_queue_depth",
        "poolserve_requests_in_flight",
        "poolserve_model_load_seconds",
        "poolserve_cancelled_inputs_total",
    ] {
        assert!(text.contains(needle), "/metrics lacks {needle}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_times_the_concurrency_limit_gets_answers_or_429_and_stays_healthy() {
    let limit = 4;
    let router = router(engine(&fixture_model("bert-embed-mean"), |c| c.engine.max_concurrent_requests = limit), 2_000_000);
    let reference = expected("bert-embed-mean");
    let long_text = reference["texts"][3]["text"].clone();
    let mut tasks = Vec::new();
    for _ in 0..4 * limit {
        let (router, text) = (router.clone(), long_text.clone());
        tasks.push(tokio::spawn(async move { post(&router, "/v1/embeddings", json!({"input": vec![text; 16]})).await }));
    }
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            StatusCode::OK => {
                ok += 1;
                for item in reply.body["data"].as_array().unwrap() {
                    assert_close(&floats(&item["embedding"]), &floats(&reference["texts"][3]["embedding"]), "admitted answer");
                }
            }
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert_error_shape(&reply, "429");
            }
            other => panic!("unexpected {other}: {}", reply.body),
        }
    }
    assert!(ok >= 1 && ok + refused == 4 * limit, "ok {ok}, refused {refused}");
    assert_eq!(send(&router, "GET", "/health", None, &[]).await.status, StatusCode::OK);
    assert_eq!(post(&router, "/v1/embeddings", json!({"input": "after"})).await.status, StatusCode::OK);
}

/// `poolserve_cancelled_inputs_total` from /metrics, summed over the models.
async fn cancelled_inputs(router: &axum::Router) -> f64 {
    let reply = tower::ServiceExt::oneshot(router.clone(), axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    let bytes = axum::body::to_bytes(reply.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.lines()
        .filter(|l| l.starts_with("poolserve_cancelled_inputs_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_clients_queued_work_is_dropped() {
    let engine = engine(&fixture_model("bert-embed-mean"), |c| {
        c.engine.max_batch_tokens = Some(128);
        c.engine.max_num_seqs = 1;
    });
    let router = router(engine, 2_000_000);
    let before = cancelled_inputs(&router).await;
    // One busy request keeps the model thread occupied, one input per batch, for far longer
    // (over a second) than the victim needs to be queued. Its inputs are token ids, so it is
    // queued at once and surely ahead of the victim.
    let ids: Vec<u32> = (0..120).map(|i| 100 + i % 600).collect();
    let busy = {
        let router = router.clone();
        let body = json!({"input": vec![ids.clone(); 1000]});
        tokio::spawn(async move { post(&router, "/v1/embeddings", body).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // The victim queues 64 inputs behind it and then hangs up.
    let victim = {
        let router = router.clone();
        let body = json!({"input": vec![ids; 64]});
        tokio::spawn(async move { post(&router, "/v1/embeddings", body).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    victim.abort();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    let after = cancelled_inputs(&router).await;
    assert!(after > before, "no queued input was dropped ({before} → {after})");
}

/// A tiny deterministic generator (no rand dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next() as usize % items.len()]
    }

    /// A random JSON value, nested up to `depth`.
    fn value(&mut self, depth: u32) -> Value {
        match self.next() % if depth == 0 { 6 } else { 8 } {
            0 => Value::Null,
            1 => json!(self.next().is_multiple_of(2)),
            2 => json!(self.next() as i64 - (1 << 30)),
            3 => json!((self.next() as f64) / 7.0 - 1e6),
            4 => json!(["", "a", "hello world", "naïve café 日本語 😀", "word ".repeat(300).as_str()][self.next() as usize % 5]),
            5 => json!(-1),
            6 => Value::Array((0..self.next() % 4).map(|_| self.value(depth - 1)).collect()),
            _ => {
                let keys = FIELDS;
                Value::Object((0..self.next() % 4).map(|_| (self.pick(&keys).to_string(), self.value(depth - 1))).collect())
            }
        }
    }
}

const FIELDS: [&str; 32] = [
    "input",
    "inputs",
    "model",
    "encoding_format",
    "dimensions",
    "normalize",
    "use_activation",
    "truncate_prompt_tokens",
    "truncation_side",
    "add_special_tokens",
    "task",
    "text_1",
    "text_2",
    "queries",
    "documents",
    "data_1",
    "data_2",
    "query",
    "top_n",
    "return_documents",
    "prompt",
    "tokens",
    "truncate",
    "max_tokens_per_doc",
    "messages",
    "texts",
    "ids",
    "instances",
    "chat_template_kwargs",
    "raw_scores",
    "late_chunking_params",
    "padding",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_bodies_never_break_the_server() {
    let router = router_with(ApiOptions::default());
    let mut rng = Lcg(42);
    let mut statuses = std::collections::BTreeMap::new();
    // A valid body for each route, to mutate.
    let valid_for = |route: &str| match route {
        "/score" | "/v1/score" => json!({"text_1": "a", "text_2": ["b", "c"]}),
        "/rerank" | "/v1/rerank" | "/v2/rerank" => json!({"query": "a", "documents": ["b", "c"]}),
        "/tokenize" => json!({"prompt": "a b"}),
        "/detokenize" => json!({"tokens": [5, 6]}),
        "/embed_sparse" | "/embed" | "/embed_all" | "/predict" | "/" => json!({"inputs": "a"}),
        "/similarity" => json!({"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}),
        "/decode" => json!({"ids": [5, 6]}),
        "/vertex" => json!({"instances": [{"inputs": "a"}, {"inputs": ["b", "c"]}]}),
        "/pooling" => json!({"input": [[5, 6], [7]], "task": "embed"}),
        _ => json!({"input": ["a", "b c"]}),
    };
    for i in 0..10_000 {
        let route = *rng.pick(&POST_ROUTES);
        let valid = [valid_for(route)];
        let body: Vec<u8> = match rng.next() % 6 {
            // The valid body as is, or with one field set to a random value.
            4 => valid[0].to_string().into_bytes(),
            5 => {
                let mut body = valid[0].clone();
                body[*rng.pick(&FIELDS)] = rng.value(2);
                body.to_string().into_bytes()
            }
            // Random bytes.
            0 => (0..rng.next() % 64).map(|_| rng.next() as u8).collect(),
            // A valid body cut short, or with a byte flipped.
            1 => {
                let mut b = rng.pick(&valid).to_string().into_bytes();
                let at = rng.next() as usize % b.len();
                if rng.next().is_multiple_of(2) {
                    b.truncate(at);
                } else {
                    b[at] = rng.next() as u8;
                }
                b
            }
            // A random object of known fields with random values.
            2 => {
                let fields = (0..1 + rng.next() % 5).map(|_| (rng.pick(&FIELDS).to_string(), rng.value(2))).collect();
                Value::Object(fields).to_string().into_bytes()
            }
            // Any JSON value at all.
            _ => rng.value(3).to_string().into_bytes(),
        };
        let reply = send(&router, "POST", route, Some(String::from_utf8_lossy(&body).into_owned()), &[]).await;
        assert!(reply.status != StatusCode::INTERNAL_SERVER_ERROR, "body {i} on {route} gave 500: {}", reply.body);
        *statuses.entry(reply.status.as_u16()).or_insert(0) += 1;
        if reply.status != StatusCode::OK {
            assert_error_shape(&reply, &format!("body {i} on {route}"));
        }
    }
    eprintln!("statuses: {statuses:?}");
    // The generator must reach the model too, not only the JSON parser.
    assert!(statuses.get(&200).copied().unwrap_or(0) >= 1000, "too few accepted bodies: {statuses:?}");
    assert_eq!(send(&router, "GET", "/health", None, &[]).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_describes_every_primary_route() {
    let router = router_with(ApiOptions::default());
    let reply = send(&router, "GET", "/openapi.json", None, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let paths = reply.body["paths"].as_object().unwrap();
    for route in [
        "/v1/embeddings",
        "/classify",
        "/pooling",
        "/score",
        "/rerank",
        "/embed_sparse",
        "/tokenize",
        "/detokenize",
        "/health",
        "/v1/models",
        "/version",
    ] {
        assert!(paths.contains_key(route), "/openapi.json lacks {route}");
    }
    assert!(reply.body["components"]["schemas"]["ErrorBody"].is_object());
}
