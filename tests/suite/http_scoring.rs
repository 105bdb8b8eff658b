//! `/classify`, `/score` and `/rerank` through the real router: response shapes, the values of
//! the reference, and every error case of these endpoints.

use crate::common;

use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

fn router_for(name: &str) -> axum::Router {
    router(engine(&fixture_model(name), |_| {}), 2_000_000)
}

fn assert_error(reply: &Reply, status: StatusCode, message_part: &str) {
    assert_eq!(reply.status, status, "body: {}", reply.body);
    let error = &reply.body["error"];
    assert_eq!(error["code"].as_u64(), Some(status.as_u16() as u64), "body: {}", reply.body);
    assert!(error["type"].is_string() && error.get("param").is_some(), "error shape: {}", reply.body);
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(message_part), "message {message:?} lacks {message_part:?}");
}

fn pair_text(expected: &Value, i: usize, side: &str) -> String {
    expected["pairs"][i][side].as_str().unwrap().to_string()
}

fn reference_score(expected: &Value, i: usize) -> f64 {
    expected["pairs"][i]["score"].as_f64().unwrap()
}

fn assert_score(value: &Value, want: f64, what: &str) {
    let got = value.as_f64().unwrap_or(f64::NAN);
    assert!((got - want).abs() <= 1e-4, "{what}: {got} vs reference {want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_answers_labels_and_probabilities() {
    let router = router_for("bert-seqcls");
    let expected = expected("bert-seqcls");
    let texts: Vec<Value> = expected["inputs"]["texts"].as_array().unwrap().clone();
    let reply = send(&router, "POST", "/classify", Some(json!({"input": texts}).to_string()), &[("x-request-id", "r1")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = &reply.body;
    assert_eq!(body["id"], "classify-r1");
    assert_eq!(body["object"], "list");
    let mut tokens = 0;
    for (i, item) in body["data"].as_array().unwrap().iter().enumerate() {
        let case = &expected["texts"][i];
        assert_eq!(item["index"], i);
        assert_eq!(item["label"], case["label"]);
        assert_eq!(item["num_classes"], 3);
        assert!(max_abs_diff(&floats(&item["probs"]), &floats(&case["softmax"])) <= 1e-4, "text {i}");
        tokens += case["input_ids"].as_array().unwrap().len();
    }
    assert_eq!(body["usage"]["prompt_tokens"], tokens);

    let raw = post(&router, "/classify", json!({"input": [texts[0].clone()], "use_activation": false})).await;
    assert_eq!(raw.status, StatusCode::OK, "{}", raw.body);
    assert!(max_abs_diff(&floats(&raw.body["data"][0]["probs"]), &floats(&expected["texts"][0]["logits"])) <= 1e-4);

    // Token-id input works like text.
    let ids = expected["texts"][0]["input_ids"].clone();
    let by_ids = post(&router, "/classify", json!({"input": ids})).await;
    assert_eq!(by_ids.body["data"][0]["label"], expected["texts"][0]["label"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_errors() {
    let router = router_for("bert-seqcls");
    let reply = post(&router, "/classify", json!({"input": "x", "dimensions": 8})).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Task 'classify' only supports ['use_activation'] parameters, does not support ['dimensions'] parameters",
    );
    let reply = post(&router, "/classify", json!({"input": "x", "normalize": true})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "does not support ['normalize'] parameters");
    assert_error(&post(&router, "/classify", json!({"input": []})).await, StatusCode::BAD_REQUEST, "empty");
    assert_error(&post(&router, "/classify", json!({"input": 3})).await, StatusCode::BAD_REQUEST, "input must be");
    assert_error(&post(&router, "/classify", json!({"input": "x", "model": "other"})).await, StatusCode::NOT_FOUND, "does not exist");
    let long = "word ".repeat(200);
    let reply = post(&router, "/classify", json!({"input": long})).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.",
    );
    // A classifier (three labels) serves neither embeddings nor scores; an embedder does not
    // classify: vLLM registers no such routes for them.
    assert_route_not_registered(&post(&router, "/v1/embeddings", json!({"input": "x"})).await);
    assert_route_not_registered(&post(&router, "/score", json!({"text_1": "a", "text_2": "b"})).await);
    assert_route_not_registered(&post(&router, "/rerank", json!({"query": "a", "documents": ["b"]})).await);
    let embedder = router_for("bert-embed-mean");
    assert_route_not_registered(&post(&embedder, "/classify", json!({"input": "x"})).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_forms_and_pairings() {
    let router = router_for("bert-reranker");
    let expected = expected("bert-reranker");
    let (q0, d0, d1) = (pair_text(&expected, 0, "query"), pair_text(&expected, 0, "document"), pair_text(&expected, 1, "document"));
    let (q2, d2) = (pair_text(&expected, 2, "query"), pair_text(&expected, 2, "document"));

    for route in ["/score", "/v1/score"] {
        let reply = send(&router, "POST", route, Some(json!({"text_1": q0, "text_2": d0}).to_string()), &[("x-request-id", "s1")]).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body["id"], "score-s1");
        assert_eq!(reply.body["object"], "list");
        assert_eq!(reply.body["data"][0]["object"], "score");
        assert_eq!(reply.body["data"][0]["index"], 0);
        assert_score(&reply.body["data"][0]["score"], reference_score(&expected, 0), "1:1");
        let tokens = expected["pairs"][0]["input_ids"].as_array().unwrap().len();
        assert_eq!(reply.body["usage"]["prompt_tokens"], tokens);
    }
    // 1:N, in the queries/documents form with a text object.
    let reply = post(&router, "/score", json!({"queries": [q0], "documents": [d0, {"text": d1}]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_score(&reply.body["data"][0]["score"], reference_score(&expected, 0), "1:N first");
    assert_score(&reply.body["data"][1]["score"], reference_score(&expected, 1), "1:N second");
    // N:N in the data_1/data_2 form.
    let reply = post(&router, "/score", json!({"data_1": [q0, q2], "data_2": [d0, d2]})).await;
    assert_score(&reply.body["data"][0]["score"], reference_score(&expected, 0), "N:N first");
    assert_score(&reply.body["data"][1]["score"], reference_score(&expected, 2), "N:N second");
    // use_activation false gives the raw logit.
    let reply = post(&router, "/score", json!({"text_1": q0, "text_2": d0, "use_activation": false})).await;
    assert_score(&reply.body["data"][0]["score"], expected["pairs"][0]["logit"].as_f64().unwrap(), "logit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_errors() {
    let router = router_for("bert-reranker");
    let bad = |body: Value| {
        let router = router.clone();
        async move { post(&router, "/score", body).await }
    };
    assert_error(
        &bad(json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})).await,
        StatusCode::BAD_REQUEST,
        "Input lengths must be either 1:1, 1:N or N:N",
    );
    assert_error(
        &bad(json!({"text_1": ["a", "b"], "text_2": "c"})).await,
        StatusCode::BAD_REQUEST,
        "Input lengths must be either 1:1, 1:N or N:N",
    );
    // vLLM's messages and order (`_validate_score_input_lens`).
    assert_error(&bad(json!({"text_1": [], "text_2": ["c"]})).await, StatusCode::BAD_REQUEST, "At least one text element must be given");
    assert_error(
        &bad(json!({"queries": "a", "documents": []})).await,
        StatusCode::BAD_REQUEST,
        "At least one text_pair element must be given",
    );
    assert_error(&bad(json!({"text_1": ["a", "b"], "text_2": []})).await, StatusCode::BAD_REQUEST, "Input lengths must be either 1:1");
    // A multimodal document for a model that takes no media: vLLM's words.
    let page = json!({"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]});
    assert_error(
        &bad(json!({"queries": "a", "documents": [page.clone(), "b"]})).await,
        StatusCode::BAD_REQUEST,
        "MultiModalParam is not supported for BertForSequenceClassification",
    );
    assert_error(
        &post(&router, "/rerank", json!({"query": "a", "documents": [page]})).await,
        StatusCode::BAD_REQUEST,
        "MultiModalParam is not supported for BertForSequenceClassification",
    );
    assert_error(&bad(json!({"text_1": "a"})).await, StatusCode::BAD_REQUEST, "text_2 is required");
    assert_error(&bad(json!({"text_1": "a", "documents": "b"})).await, StatusCode::BAD_REQUEST, "exactly one of");
    assert_error(&bad(json!({"input": "a"})).await, StatusCode::BAD_REQUEST, "exactly one of");
    assert_error(&bad(json!({"text_1": 5, "text_2": "b"})).await, StatusCode::BAD_REQUEST, "text_1 must be a string");
    assert_error(
        &bad(json!({"text_1": "a", "text_2": "b", "dimensions": 4})).await,
        StatusCode::BAD_REQUEST,
        "Task 'score' only supports ['use_activation'] parameters",
    );
    assert_error(
        &bad(json!({"text_1": "a", "text_2": "b", "max_tokens_per_doc": -1})).await,
        StatusCode::BAD_REQUEST,
        "max_tokens_per_doc must be a non-negative integer",
    );
    assert_error(
        &bad(json!({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 1000})).await,
        StatusCode::BAD_REQUEST,
        "is greater than max_model_len",
    );
    let long = "word ".repeat(100);
    assert_error(
        &bad(json!({"text_1": long, "text_2": long})).await,
        StatusCode::BAD_REQUEST,
        "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.",
    );
    // Truncation makes the same pair fit.
    let reply = bad(json!({"text_1": long, "text_2": long, "truncate_prompt_tokens": -1})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["usage"]["prompt_tokens"], 128);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bi_encoder_scores_are_embedding_cosines() {
    let router = router_for("bert-embed-mean");
    let expected = expected("bert-embed-mean");
    let texts = expected["inputs"]["texts"].clone();
    let reply = post(&router, "/score", json!({"text_1": texts[0], "text_2": [texts[2], texts[3]]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reference = |i: usize| floats(&expected["texts"][i]["embedding"]);
    for (k, j) in [2usize, 3].iter().enumerate() {
        let want = cosine(&reference(0), &reference(*j));
        assert_score(&reply.body["data"][k]["score"], want, &format!("cosine 0-{j}"));
    }
    // An embedding model reranks by the same cosines (vLLM), on all three routes, sorted.
    for route in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let reply = post(&router, route, json!({"query": texts[0], "documents": [texts[1], texts[2], texts[3]], "top_n": 3})).await;
        assert_eq!(reply.status, StatusCode::OK, "{route}: {}", reply.body);
        let results = reply.body["results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        let mut previous = f64::INFINITY;
        for result in results {
            let j = result["index"].as_u64().unwrap() as usize + 1;
            assert_score(&result["relevance_score"], cosine(&reference(0), &reference(j)), &format!("{route} cosine 0-{j}"));
            assert_eq!(result["document"]["text"], texts[j]);
            let score = result["relevance_score"].as_f64().unwrap();
            assert!(score <= previous, "{route}: results not sorted");
            previous = score;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_embedding_fixture_reranks_by_its_score() {
    // relevance_score equals /score's score for the same pair, whatever the architecture.
    for name in ["bert-embed-cls", "xlmr-embed-cls", "mpnet-embed-mean", "distilbert-embed-mean-dense", "qwen3-embed-last"] {
        let router = router_for(name);
        let texts = expected(name)["inputs"]["texts"].clone();
        let documents = json!([texts[1], texts[2], texts[3]]);
        let scores = post(&router, "/score", json!({"text_1": texts[0], "text_2": documents})).await;
        assert_eq!(scores.status, StatusCode::OK, "{name}: {}", scores.body);
        let reranked = post(&router, "/v2/rerank", json!({"query": texts[0], "documents": documents})).await;
        assert_eq!(reranked.status, StatusCode::OK, "{name}: {}", reranked.body);
        for result in reranked.body["results"].as_array().unwrap() {
            let index = result["index"].as_u64().unwrap() as usize;
            // Equal up to float rounding: the two requests may batch their texts differently.
            assert_score(
                &result["relevance_score"],
                scores.body["data"][index]["score"].as_f64().unwrap(),
                &format!("{name} document {index}"),
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_sorts_cuts_and_shapes_like_cohere() {
    let router = router_for("xlmr-reranker");
    let expected = expected("xlmr-reranker");
    let query = pair_text(&expected, 0, "query");
    let documents = vec![pair_text(&expected, 1, "document"), pair_text(&expected, 0, "document")];
    let want = [reference_score(&expected, 1), reference_score(&expected, 0)];
    let best = if want[0] > want[1] { 0 } else { 1 };

    for route in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let body = json!({"model": fixture_model("xlmr-reranker").to_str().unwrap(), "query": query, "documents": documents});
        let reply = send(&router, "POST", route, Some(body.to_string()), &[("x-request-id", "k1")]).await;
        assert_eq!(reply.status, StatusCode::OK, "{route}: {}", reply.body);
        let body = &reply.body;
        assert_eq!(body["id"], "rerank-k1");
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], best);
        assert_eq!(results[1]["index"], 1 - best);
        for r in results {
            let i = r["index"].as_u64().unwrap() as usize;
            assert_score(&r["relevance_score"], want[i], route);
            assert_eq!(r["document"]["text"], documents[i].as_str());
        }
        assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);
    }

    // Jina style, with text objects, top_n and no documents returned.
    let reply = post(
        &router,
        "/v1/rerank",
        json!({"query": query, "documents": [{"text": documents[0]}, {"text": documents[1]}], "top_n": 1, "return_documents": false}),
    )
    .await;
    let results = reply.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["index"], best);
    assert!(results[0].get("document").is_none(), "{}", reply.body);
    // top_n above the number of documents returns them all.
    let reply = post(&router, "/rerank", json!({"query": query, "documents": documents, "top_n": 10})).await;
    assert_eq!(reply.body["results"].as_array().unwrap().len(), 2);

    assert_error(
        &post(&router, "/rerank", json!({"query": query, "documents": documents, "top_n": -1})).await,
        StatusCode::BAD_REQUEST,
        "top_n must be a non-negative integer",
    );
    assert_error(
        &post(&router, "/rerank", json!({"query": query, "documents": []})).await,
        StatusCode::BAD_REQUEST,
        "At least one text_pair element must be given",
    );
    assert_error(&post(&router, "/rerank", json!({"documents": ["a"]})).await, StatusCode::BAD_REQUEST, "query");
    // vLLM takes one document as well as a list.
    let one = post(&router, "/rerank", json!({"query": "a", "documents": "b"})).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    assert_eq!(one.body["results"][0]["document"], json!({"text": "b"}));
    assert_error(&post(&router, "/rerank", json!({"query": "a", "documents": 5})).await, StatusCode::BAD_REQUEST, "documents must be");
    assert_error(
        &post(&router, "/rerank", json!({"query": ["a", "b"], "documents": ["c"]})).await,
        StatusCode::BAD_REQUEST,
        "query must be",
    );
    assert_error(
        &post(&router, "/rerank", json!({"query": "a", "documents": ["b"], "normalize": true})).await,
        StatusCode::BAD_REQUEST,
        "Task 'score' only supports ['use_activation'] parameters",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activation_fn_and_logit_bias_change_the_score() {
    let expected = expected("bert-reranker");
    let logit = expected["pairs"][0]["logit"].as_f64().unwrap();
    let body = json!({"text_1": pair_text(&expected, 0, "query"), "text_2": pair_text(&expected, 0, "document")});
    // sentence-transformers' activation_fn (here Identity, via --hf-overrides) decides /score's activation.
    let identity = router(
        engine(&fixture_model("bert-reranker"), |c| {
            let overrides = json!({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}});
            c.models[0].hf_overrides = overrides.as_object().unwrap().clone();
        }),
        2_000_000,
    );
    let reply = post(&identity, "/score", body.clone()).await;
    assert_score(&reply.body["data"][0]["score"], logit, "identity activation");
    // /classify keeps the classification rule (sigmoid for one label).
    let reply = post(&identity, "/classify", json!({"input": "A man is eating food."})).await;
    assert!(max_abs_diff(&floats(&reply.body["data"][0]["probs"]), &floats(&expected["texts"][0]["sigmoid"])) <= 1e-4);

    // --pooler-config logit_bias is subtracted before the activation.
    let biased = router(engine(&fixture_model("bert-reranker"), |c| c.models[0].pooler.logit_bias = Some(0.5)), 2_000_000);
    let reply = post(&biased, "/score", body).await;
    assert_score(&reply.body["data"][0]["score"], 1.0 / (1.0 + (-(logit - 0.5)).exp()), "logit bias");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_reranker_conversion_serves_rerank_with_its_prompt() {
    let expected = expected("qwen3-causal-reranker");
    let engine = engine(&fixture_model("qwen3-causal-reranker"), |c| {
        let overrides = json!({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true});
        c.models[0].hf_overrides = overrides.as_object().unwrap().clone();
    });
    let router = router(engine, 2_000_000);
    let query = pair_text(&expected, 0, "query");
    let documents = vec![pair_text(&expected, 0, "document"), pair_text(&expected, 1, "document")];
    let reply = post(&router, "/v2/rerank", json!({"query": query, "documents": documents})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for r in reply.body["results"].as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_score(&r["relevance_score"], reference_score(&expected, i), "qwen3 reranker");
    }
    let tokens: usize = (0..2).map(|i| expected["pairs"][i]["input_ids"].as_array().unwrap().len()).sum();
    assert_eq!(reply.body["usage"]["total_tokens"], tokens);
    // A custom instruction changes the prompt, hence the score.
    let custom = post(&router, "/score", json!({"text_1": query, "text_2": documents[0], "instruction": "Find French cities"})).await;
    let score = custom.body["data"][0]["score"].as_f64().unwrap();
    assert!((score - reference_score(&expected, 0)).abs() > 1e-6, "instruction had no effect");
    // The same instruction as the server's default gives the same score.
    let by_flag = common::router(
        common::engine(&fixture_model("qwen3-causal-reranker"), |c| {
            let overrides = json!({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true});
            c.models[0].hf_overrides = overrides.as_object().unwrap().clone();
            c.models[0].reranker_instruction = Some("Find French cities".into());
        }),
        2_000_000,
    );
    let flagged = post(&by_flag, "/score", json!({"text_1": query, "text_2": documents[0]})).await;
    assert_score(&flagged.body["data"][0]["score"], score, "--reranker-instruction");
    // The causal LM without the conversion is an embedding model: it reranks by cosine, with
    // the raw texts (no reranker prompt), exactly as its /score does.
    let plain = router_for("qwen3-causal-reranker");
    let reranked = post(&plain, "/rerank", json!({"query": "a", "documents": ["b"]})).await;
    let scored = post(&plain, "/score", json!({"text_1": "a", "text_2": "b"})).await;
    assert_eq!(reranked.status, StatusCode::OK, "{}", reranked.body);
    assert_score(
        &reranked.body["results"][0]["relevance_score"],
        scored.body["data"][0]["score"].as_f64().unwrap(),
        "unconverted causal LM",
    );
    assert_eq!(reranked.body["usage"]["prompt_tokens"], 2, "no reranker prompt around the texts");
}
