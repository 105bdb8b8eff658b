//! Hugging Face TEI's routes against the real binary over HTTP: the requests of TEI's tests and
//! documentation (`/embed` with `dimensions`, `/predict` single, pair and batch, `/rerank` with
//! `return_text` and its tie order, `/similarity`, `/embed_all`, `/embed_sparse`, `/decode`,
//! `/tokenize`, `/vertex`, `/info`, `POST /`), its response shapes, validation messages and
//! error shape, checked against the transformers references of the fixtures.

use crate::common::server::{post, request, serve, Answer, Server};
use crate::common::{cosine, expected, fixture_model, floats};
use serde_json::{json, Value};

fn serve_fixture(name: &str, flags: &[&str]) -> Server {
    let path = fixture_model(name).to_str().unwrap().to_string();
    let mut args = vec![path.as_str()];
    args.extend_from_slice(flags);
    serve(&args)
}

fn ok(answer: &Answer) -> Value {
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

/// TEI's error shape, status and message.
fn tei_error(answer: &Answer, status: u16, kind: &str, message: &str) {
    assert_eq!(answer.status, status, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["error_type"], kind, "{body}");
    let text = body["error"].as_str().unwrap();
    assert!(text.contains(message), "{text:?} lacks {message:?}");
}

#[test]
fn embedding_routes() {
    let reference = expected("bert-embed-mean");
    let texts = &reference["texts"];
    let server = serve_fixture("bert-embed-mean", &["--max-client-batch-size", "4"]);
    let port = server.port;
    // One input still answers a list of lists, normalized, equal to transformers'.
    let body = ok(&post(port, "/embed", json!({"inputs": texts[0]["text"]})));
    assert_eq!(body.as_array().unwrap().len(), 1);
    assert!(cosine(&floats(&body[0]), &floats(&texts[0]["embedding"])) >= 0.9999);
    let batch = ok(&post(port, "/embed", json!({"inputs": [texts[0]["text"], texts[2]["text"]]})));
    assert!(cosine(&floats(&batch[1]), &floats(&texts[2]["embedding"])) >= 0.9999);
    // test_http_embed.rs: `dimensions` cuts (any model), then normalizes; single equals batch rows.
    let cut = ok(&post(port, "/embed", json!({"inputs": "test", "dimensions": 8})));
    let rows = ok(&post(port, "/embed", json!({"inputs": ["test", "test", "test"], "dimensions": 8})));
    assert_eq!(floats(&cut[0]).len(), 8);
    let norm: f32 = floats(&cut[0]).iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5);
    for row in rows.as_array().unwrap() {
        assert!(cosine(&floats(row), &floats(&cut[0])) > 0.99999);
    }
    let raw = ok(&post(port, "/embed", json!({"inputs": texts[0]["text"], "normalize": false})));
    assert!(cosine(&floats(&raw[0]), &floats(&texts[0]["embedding_unnormalized"])) >= 0.9999);
    // Token ids are inputs too.
    let by_ids = ok(&post(port, "/embed", json!({"inputs": texts[0]["input_ids"]})));
    assert!(cosine(&floats(&by_ids[0]), &floats(&texts[0]["embedding"])) >= 0.9999);
    // Validation in TEI's words.
    tei_error(
        &post(port, "/embed", json!({"inputs": "a", "dimensions": 0})),
        422,
        "Validation",
        "Input validation error: `dimensions` should be positive",
    );
    tei_error(
        &post(port, "/embed", json!({"inputs": "a", "dimensions": 1000})),
        422,
        "Validation",
        "`dimensions` should be smaller than the maximum embedding dimension.",
    );
    tei_error(&post(port, "/embed", json!({"inputs": []})), 400, "Empty", "Input validation error: `inputs` cannot be empty");
    tei_error(&post(port, "/embed", json!({"inputs": ""})), 400, "Empty", "Input validation error: `inputs` cannot be empty");
    tei_error(
        &post(port, "/embed", json!({"inputs": ["a", "b", "c", "d", "e"]})),
        422,
        "Validation",
        "batch size 5 > maximum allowed batch size 4",
    );
    let long = "word ".repeat(300);
    tei_error(
        &post(port, "/embed", json!({"inputs": long, "truncate": false})),
        422,
        "Validation",
        "Input validation error: `inputs` must have less than 128 tokens. Given: 302",
    );
    ok(&post(port, "/embed", json!({"inputs": long})));
    tei_error(&post(port, "/embed", json!({"input": "a"})), 422, "Validation", "missing field `inputs`");
    tei_error(&post(port, "/embed", json!({"inputs": "a", "truncation_direction": "LEFT"})), 422, "Validation", "unknown variant");
    ok(&post(port, "/embed", json!({"inputs": long, "truncation_direction": "left"})));
    // /embed_all: every token's state.
    let all = ok(&post(port, "/embed_all", json!({"inputs": texts[0]["text"]})));
    let states = texts[0]["last_hidden_state"].as_array().unwrap();
    assert_eq!(all[0].as_array().unwrap().len(), states.len());
    for (ours, want) in all[0].as_array().unwrap().iter().zip(states) {
        assert!(cosine(&floats(ours), &floats(want)) >= 0.9999);
    }
    // /similarity: the cosine of the source with each sentence.
    let sentences = [texts[2]["text"].clone(), texts[3]["text"].clone()];
    let similarity = ok(&post(port, "/similarity", json!({"inputs": {"source_sentence": texts[0]["text"], "sentences": sentences}})));
    for (i, s) in similarity.as_array().unwrap().iter().enumerate() {
        let want = cosine(&floats(&texts[0]["embedding"]), &floats(&texts[i + 2]["embedding"]));
        assert!((s.as_f64().unwrap() - want).abs() < 1e-4, "{s} vs {want}");
    }
    tei_error(
        &post(port, "/similarity", json!({"inputs": {"source_sentence": "a", "sentences": []}})),
        400,
        "Empty",
        "`inputs.sentences` cannot be empty",
    );
    // Nested structs from objects only (serde's derive alone takes `[]` as every default).
    for body in [json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": []}), json!({"inputs": ["a", ["b"]]})] {
        tei_error(
            &post(port, "/similarity", body),
            422,
            "Validation",
            "Failed to deserialize the JSON body into the target type: invalid type: sequence, expected an object",
        );
    }
    ok(&post(port, "/similarity", json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": null})));
    tei_error(
        &post(port, "/similarity", json!({"inputs": {"source_sentence": "a", "sentences": ["b", "c", "d", "e"]}})),
        422,
        "Validation",
        "batch size 5 > maximum allowed batch size 4",
    );
    // Routes for other kinds of model.
    tei_error(&post(port, "/predict", json!({"inputs": "a"})), 424, "Backend", "Backend error: Model is not a classifier model");
    tei_error(
        &post(port, "/rerank", json!({"query": "a", "texts": ["b"]})),
        424,
        "Backend",
        "Backend error: model is not a re-ranker model",
    );
    tei_error(
        &post(port, "/embed_sparse", json!({"inputs": "a"})),
        424,
        "Backend",
        "Backend error: Model is not an embedding model with SPLADE pooling",
    );
    // /decode and TEI's /tokenize.
    let decoded = ok(&post(port, "/decode", json!({"ids": texts[0]["input_ids"]})));
    let kept = ok(&post(port, "/decode", json!({"ids": [texts[0]["input_ids"]], "skip_special_tokens": false})));
    assert!(!decoded[0].as_str().unwrap().contains("[CLS]") && kept[0].as_str().unwrap().starts_with("[CLS]"), "{decoded} {kept}");
    tei_error(&post(port, "/decode", json!({"ids": []})), 400, "Empty", "Input validation error: `input_ids` cannot be empty");
    let text = "hello world, 这是";
    let tokens = ok(&post(port, "/tokenize", json!({"inputs": text})));
    let list = tokens[0].as_array().unwrap();
    assert_eq!(list.first().unwrap()["special"], true);
    assert_eq!(list.first().unwrap()["start"], Value::Null);
    for token in list.iter().filter(|t| t["special"] == false) {
        let (start, stop) = (token["start"].as_u64().unwrap() as usize, token["stop"].as_u64().unwrap() as usize);
        assert_eq!(token["text"].as_str().unwrap(), String::from_utf8_lossy(&text.as_bytes()[start..stop]), "byte offsets");
    }
    let ids: Vec<Value> = list.iter().map(|t| t["id"].clone()).collect();
    let vllm = ok(&post(port, "/tokenize", json!({"prompt": text})));
    assert_eq!(vllm["tokens"], json!(ids), "TEI's and vLLM's /tokenize agree on the ids");
    tei_error(&post(port, "/tokenize", json!({"inputs": []})), 400, "Empty", "`inputs` cannot be empty");
    // /vertex, POST / and /invocations with TEI bodies: TEI's dispatch by model kind.
    let vertex =
        ok(&post(port, "/vertex", json!({"instances": [{"inputs": texts[0]["text"]}, {"inputs": ["a", "b"], "normalize": false}]})));
    assert!(cosine(&floats(&vertex["predictions"][0][0]), &floats(&texts[0]["embedding"])) >= 0.9999);
    assert_eq!(vertex["predictions"][1].as_array().unwrap().len(), 2);
    for path in ["/", "/invocations"] {
        let body = ok(&post(port, path, json!({"inputs": texts[0]["text"]})));
        assert!(cosine(&floats(&body[0]), &floats(&texts[0]["embedding"])) >= 0.9999, "{path}");
    }
    let info = ok(&request(port, "GET", "/info", None, &[]).unwrap());
    assert_eq!(info["model_type"], json!({"embedding": {"pooling": "mean"}}));
    assert_eq!(
        (info["max_input_length"].as_u64(), info["max_client_batch_size"].as_u64(), info["auto_truncate"].as_bool()),
        (Some(128), Some(4), Some(true))
    );
    assert_eq!(request(port, "GET", "/", None, &[]).unwrap().status, 200);
}

#[test]
fn classifier_and_reranker_routes() {
    let reference = expected("bert-seqcls");
    let server = serve_fixture("bert-seqcls", &[]);
    let text = &reference["texts"][0];
    // One input: every label, sorted by score; softmax as transformers gives it.
    let single = ok(&post(server.port, "/predict", json!({"inputs": text["text"]})));
    let labels = &reference["labels"]["id2label"];
    let mut want: Vec<(String, f32)> =
        floats(&text["softmax"]).into_iter().enumerate().map(|(i, p)| (labels[i.to_string()].as_str().unwrap().to_string(), p)).collect();
    want.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (item, (label, score)) in single.as_array().unwrap().iter().zip(&want) {
        assert_eq!(item["label"], label.as_str());
        assert!((item["score"].as_f64().unwrap() as f32 - score).abs() <= 1e-4);
    }
    // ["a"] is one input, ["a", "b"] one pair, [["a"], ["b", "c"]] a batch.
    assert_eq!(ok(&post(server.port, "/predict", json!({"inputs": [text["text"]]}))), single);
    let pair = ok(&post(server.port, "/predict", json!({"inputs": ["I like you.", "I hate pineapples"]})));
    assert_eq!(pair.as_array().unwrap().len(), 3);
    let batch = ok(&post(server.port, "/predict", json!({"inputs": [[text["text"]], ["I like you.", "I hate pineapples"]]})));
    assert_eq!(batch[0], single);
    assert_eq!(batch[1], pair);
    let raw = ok(&post(server.port, "/predict", json!({"inputs": text["text"], "raw_scores": true})));
    let logits = floats(&text["logits"]);
    assert!(raw.as_array().unwrap().iter().all(|p| logits.iter().any(|l| (p["score"].as_f64().unwrap() as f32 - l).abs() <= 1e-4)));
    tei_error(&post(server.port, "/predict", json!({"inputs": ["a", "b", "c"]})), 422, "Validation", "invalid length 3");
    tei_error(&post(server.port, "/embed", json!({"inputs": "a"})), 424, "Backend", "Backend error: Model is not an embedding model");
    // A classifier with three labels is not a reranker.
    tei_error(&post(server.port, "/rerank", json!({"query": "a", "texts": ["b"]})), 424, "Backend", "model is not a re-ranker model");
    tei_error(&post(server.port, "/rerank", json!({"query": "a", "texts": []})), 400, "Empty", "`texts` cannot be empty");
    drop(server);

    let reference = expected("bert-reranker");
    let server = serve_fixture("bert-reranker", &[]);
    let pairs = reference["pairs"].as_array().unwrap();
    let query = &pairs[0]["query"];
    let documents: Vec<Value> = pairs.iter().filter(|p| p["query"] == *query).map(|p| p["document"].clone()).collect();
    let ranks = ok(&post(server.port, "/rerank", json!({"query": query, "texts": documents, "return_text": true})));
    let ranks = ranks.as_array().unwrap();
    assert_eq!(ranks.len(), documents.len());
    for rank in ranks {
        let index = rank["index"].as_u64().unwrap() as usize;
        assert_eq!(rank["text"], documents[index]);
        let want = pairs.iter().find(|p| p["query"] == *query && p["document"] == documents[index]).unwrap()["score"].as_f64().unwrap();
        assert!((rank["score"].as_f64().unwrap() - want).abs() <= 1e-4);
    }
    assert!(ranks.windows(2).all(|w| w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
    // test_http_rerank.rs: equal scores come out in reverse input order, and no text unless asked.
    let tied = ok(&post(server.port, "/rerank", json!({"query": "test", "texts": ["test", "other", "test"]})));
    // (With random weights "other" may rank anywhere; the two equal pairs stay adjacent.)
    let order: Vec<u64> = tied.as_array().unwrap().iter().map(|r| r["index"].as_u64().unwrap()).collect();
    let at = order.iter().position(|&i| i == 2).unwrap();
    assert_eq!(order.get(at + 1), Some(&0), "{order:?}");
    assert_eq!(tied[at]["score"], tied[at + 1]["score"]);
    assert!(tied[0].get("text").is_none());
    // The same route still takes Cohere's and vLLM's body.
    let cohere = ok(&post(server.port, "/rerank", json!({"query": "test", "documents": ["test", "other"]})));
    assert!(cohere["results"].is_array());
    // A reranker's /predict is its one sigmoid score; /vertex reranks a rerank body.
    let predicted = ok(&post(server.port, "/predict", json!({"inputs": [pairs[0]["query"], pairs[0]["document"]]})));
    assert!((predicted[0]["score"].as_f64().unwrap() - pairs[0]["score"].as_f64().unwrap()).abs() <= 1e-4);
    let vertex = ok(&post(server.port, "/vertex", json!({"instances": [{"query": "test", "texts": ["test", "other", "test"]}]})));
    assert_eq!(vertex["predictions"][0], tied);
    let info = ok(&request(server.port, "GET", "/info", None, &[]).unwrap());
    assert!(info["model_type"]["reranker"]["id2label"].is_object());
}

#[test]
fn sparse_routes() {
    let reference = expected("bert-splade");
    let server = serve_fixture("bert-splade", &["--pooler-config", r#"{"pooling_type": "SPLADE"}"#]);
    let case = &reference["texts"][0];
    let sparse = ok(&post(server.port, "/embed_sparse", json!({"inputs": case["text"]})));
    let indices: Vec<Value> = sparse[0].as_array().unwrap().iter().map(|v| v["index"].clone()).collect();
    assert_eq!(json!(indices), case["sparse"]["indices"]);
    // /embed on SPLADE: normalize is refused, the raw vocabulary vector is not.
    tei_error(&post(server.port, "/embed", json!({"inputs": "a"})), 424, "Backend", "`normalize` is not available for SPLADE models");
    let dense = ok(&post(server.port, "/embed", json!({"inputs": case["text"], "normalize": false})));
    let dense = floats(&dense[0]);
    for (i, v) in case["sparse"]["indices"].as_array().unwrap().iter().zip(case["sparse"]["values"].as_array().unwrap()) {
        assert!((dense[i.as_u64().unwrap() as usize] - v.as_f64().unwrap() as f32).abs() <= 1e-4);
    }
    tei_error(&post(server.port, "/embed_all", json!({"inputs": "a"})), 424, "Backend", "`embed_all` is not available for SPLADE models");
    let vertex = ok(&post(server.port, "/vertex", json!({"instances": [{"inputs": case["text"]}]})));
    assert!(vertex["predictions"][0] == sparse, "/vertex answers as /embed_sparse");
}
