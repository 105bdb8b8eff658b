//! vLLM's `/generative_scoring` on causal LMs served with `--runner generate`, against
//! transformers' next-token distribution as vLLM's serving code reads it (generator:
//! tests/fixtures/make_generative_scoring.py): Llama with its own LM head and a short context
//! (the long query is cut to max_model_len − 1), Gemma 2 with its final logit soft-cap, and
//! Qwen3 with its LM head tied to the embeddings. Probabilities within 1e-4; vLLM's checks and
//! messages; the route is not there for a model run as a pooling model.

use crate::common::*;
use axum::http::StatusCode;
use poolserve::loader::options::Runner;
use serde_json::{json, Value};

fn generating_router(name: &str) -> axum::Router {
    router(engine(&fixture_model(name), |c| c.models[0].runner = Runner::Generate), 2_000_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_match_transformers_next_token_probabilities() {
    let expected = expected("generative-scoring");
    for (name, model) in expected["models"].as_object().unwrap() {
        let router = generating_router(name);
        for (c, case) in model["cases"].as_array().unwrap().iter().enumerate() {
            let reply = post(&router, "/generative_scoring", case["request"].clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{name} case {c}: {}", reply.body);
            let body = &reply.body;
            assert_eq!(body["object"], "list");
            assert!(body["id"].as_str().unwrap().starts_with("generative-scoring-"), "{body}");
            let want = floats(&case["scores"]);
            let data = body["data"].as_array().unwrap();
            assert_eq!(data.len(), want.len(), "{name} case {c}");
            for (i, (item, want)) in data.iter().zip(&want).enumerate() {
                assert_eq!(item["index"], i);
                assert_eq!(item["object"], "score");
                let got = item["score"].as_f64().unwrap() as f32;
                assert!((got - want).abs() <= 1e-4, "{name} case {c} item {i}: {got} vs transformers {want}");
            }
            // vLLM's usage: the prompts' tokens, and the one token it samples per item.
            let prompt_tokens: usize = case["prompts"].as_array().unwrap().iter().map(|p| p.as_array().unwrap().len()).sum();
            assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens, "{name} case {c}");
            assert_eq!(body["usage"]["completion_tokens"], want.len());
            assert_eq!(body["usage"]["total_tokens"], prompt_tokens + want.len());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_vllms_messages() {
    let router = generating_router("llama-causal-lm");
    let vocab = expected("generative-scoring")["models"]["llama-causal-lm"]["vocab_size"].as_u64().unwrap();
    let bad = |body: Value| {
        let router = router.clone();
        async move {
            let reply = post(&router, "/generative_scoring", body).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
            assert_eq!(reply.body["error"]["type"], "BadRequestError", "{}", reply.body);
            reply.body["error"]["message"].as_str().unwrap().to_string()
        }
    };
    let message = bad(json!({"query": "q", "items": ["a"], "label_token_ids": [3, vocab]})).await;
    assert_eq!(message, format!("label_token_id {vocab} is out of vocabulary range [0, {vocab}). Please provide valid token IDs."));
    let message = bad(json!({"query": "q", "items": ["a"], "label_token_ids": [-1]})).await;
    assert!(message.starts_with("label_token_id -1 is out of vocabulary range"), "{message}");
    let message = bad(json!({"query": "q", "items": ["a"], "label_token_ids": []})).await;
    assert_eq!(message, "label_token_ids must contain at least one token ID.");
    let message = bad(json!({"query": "q", "items": [], "label_token_ids": [3]})).await;
    assert_eq!(message, "items must contain at least one item.");
    // Items are all texts or all token lists; ids must be in the vocabulary; a prompt can't be empty.
    bad(json!({"query": "q", "items": ["a", [1, 2]], "label_token_ids": [3]})).await;
    let message = bad(json!({"query": [1, 2], "items": [[vocab + 5]], "label_token_ids": [3]})).await;
    assert!(message.contains(&(vocab + 5).to_string()), "{message}");
    bad(json!({"query": "", "items": [""], "label_token_ids": [3], "add_special_tokens": false})).await;
    bad(json!({"items": ["a"], "label_token_ids": [3]})).await;
}

/// Naming the whole vocabulary as labels is the vocabulary's own probability: the many-label
/// path (the LM head's whole product, in bounded chunks) agrees with `apply_softmax: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_label_at_once_is_the_vocabulary_probability() {
    let router = generating_router("gemma2-causal-lm");
    let vocab = expected("generative-scoring")["models"]["gemma2-causal-lm"]["vocab_size"].as_u64().unwrap();
    let all: Vec<u64> = std::iter::once(48).chain(0..vocab).collect();
    let items = json!(["a fox", "the river bank", "hello"]);
    let labelled = post(&router, "/generative_scoring", json!({"query": "q", "items": items, "label_token_ids": all})).await;
    let whole =
        post(&router, "/generative_scoring", json!({"query": "q", "items": items, "label_token_ids": [48], "apply_softmax": false})).await;
    assert_eq!(labelled.status, StatusCode::OK, "{}", labelled.body);
    for i in 0..3 {
        let (a, b) = (labelled.body["data"][i]["score"].as_f64().unwrap(), whole.body["data"][i]["score"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-6, "item {i}: {a} vs {b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_is_not_there_for_pooling_models() {
    // The same causal LM run as vLLM's pooling runner: vLLM registers no such route.
    let router = router_for_pooling("llama-causal-lm");
    let reply = post(&router, "/generative_scoring", json!({"query": "q", "items": ["a"], "label_token_ids": [3]})).await;
    assert_route_not_registered(&reply);
    // With --runner generate the model keeps its pooling task beside it (the last token's state).
    let router = generating_router("llama-causal-lm");
    let reply = post(&router, "/v1/embeddings", json!({"input": "hello"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

fn router_for_pooling(name: &str) -> axum::Router {
    router(engine(&fixture_model(name), |_| {}), 2_000_000)
}

#[test]
fn an_encoder_cannot_run_as_a_generator() {
    broken_folder_is_one_line_with("bert-embed-mean", &["--runner", "generate"], "--runner generate");
}

/// Starting the real binary on a good folder with flags it cannot take fails with one line.
fn broken_folder_is_one_line_with(name: &str, flags: &[&str], expect: &str) {
    let dir = fixture_model(name);
    let mut args = vec!["serve", dir.to_str().unwrap(), "--port", "0"];
    args.extend_from_slice(flags);
    let (ok, stderr) = server::run_to_exit(&args);
    assert!(!ok, "{name} {flags:?} must not start");
    let error: Vec<&str> = stderr.lines().filter(|l| l.contains("Error") || l.contains("error")).collect();
    assert_eq!(error.len(), 1, "{name}: one error line, got:\n{stderr}");
    assert!(error[0].contains(expect), "{name}: `{}` should say `{expect}`", error[0]);
}

#[test]
fn the_binary_serves_generative_scores() {
    let expected = expected("generative-scoring");
    let case = &expected["models"]["gemma2-causal-lm"]["cases"][1];
    let dir = fixture_model("gemma2-causal-lm");
    let server = server::serve(&[dir.to_str().unwrap(), "--served-model-name", "gemma", "--runner", "generate"]);
    let mut request = case["request"].clone();
    request["model"] = json!("gemma");
    let answer = server::post(server.port, "/generative_scoring", request);
    let body: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(answer.status, 200, "{body}");
    assert_eq!(body["model"], "gemma");
    for (item, want) in body["data"].as_array().unwrap().iter().zip(floats(&case["scores"])) {
        let got = item["score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() <= 1e-4, "{got} vs {want}");
    }
}
