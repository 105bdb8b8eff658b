//! `/pooling` and `/embed_sparse` through the real router: task selection, response shapes per
//! task, late interaction on /rerank, and the error cases.

use crate::common;

use crate::common::*;
use axum::http::StatusCode;
use poolserve::pooling::PoolingType;
use serde_json::json;

fn assert_error(reply: &Reply, status: StatusCode, message_part: &str) {
    assert_eq!(reply.status, status, "body: {}", reply.body);
    assert_eq!(reply.body["error"]["code"].as_u64(), Some(status.as_u16() as u64), "body: {}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains(message_part), "message {message:?} lacks {message_part:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooling_answers_each_task_in_its_shape() {
    let reference = expected("bert-embed-mean");
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let text = reference["texts"][0]["text"].as_str().unwrap();
    let n = reference["texts"][0]["input_ids"].as_array().unwrap().len();

    let reply = send(&router, "POST", "/pooling", Some(json!({"input": text}).to_string()), &[("x-request-id", "p1")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["id"], "pooling-p1");
    assert_eq!(reply.body["object"], "list");
    assert_eq!(reply.body["data"][0]["object"], "pooling");
    assert_close(&floats(&reply.body["data"][0]["data"]), &floats(&reference["texts"][0]["embedding"]), "default task embed");
    assert_eq!(reply.body["usage"]["prompt_tokens"], n);

    // token_embed is the model's once the pooler config says so (vLLM 0.33).
    assert_error(
        &post(&router, "/pooling", json!({"input": [text], "task": "token_embed"})).await,
        StatusCode::BAD_REQUEST,
        "Try switching the model's pooling_task via --pooler-config.task token_embed.",
    );
    let tokens =
        common::router(engine(&fixture_model("bert-embed-mean"), |c| c.models[0].pooler.task = Some("token_embed".into())), 2_000_000);
    let reply = post(&tokens, "/pooling", json!({"input": [text], "task": "token_embed", "normalize": false})).await;
    let rows = reply.body["data"][0]["data"].as_array().unwrap();
    assert_eq!(rows.len(), n);
    assert_close(&floats(&rows[1]), &floats(&reference["texts"][0]["last_hidden_state"][1]), "token 1");

    assert_error(
        &post(&router, "/pooling", json!({"input": text, "task": "classify"})).await,
        StatusCode::BAD_REQUEST,
        "Unsupported task: 'classify' Supported tasks: ('embed', 'token_embed')",
    );
    assert_error(
        &post(&router, "/pooling", json!({"input": text, "task": "score"})).await,
        StatusCode::BAD_REQUEST,
        "`score` task was removed; use `classify` instead.",
    );
    assert_error(&post(&router, "/pooling", json!({"input": text, "task": 3})).await, StatusCode::BAD_REQUEST, "literal_error");
    assert_error(&post(&router, "/pooling", json!({"input": []})).await, StatusCode::BAD_REQUEST, "empty");
    assert_tei_error(
        &post(&router, "/embed_sparse", json!({"inputs": "x"})).await,
        StatusCode::FAILED_DEPENDENCY,
        "Backend",
        "Model is not an embedding model with SPLADE pooling",
    );

    // Classifiers: classify by default; token classifiers: token_classify, probabilities per token.
    let classifier = router_for_fixture("bert-seqcls");
    let reply = post(&classifier, "/pooling", json!({"input": text})).await;
    assert_eq!(reply.body["data"][0]["data"].as_array().unwrap().len(), 3);
    assert_error(
        &post(&classifier, "/pooling", json!({"input": text, "dimensions": 2})).await,
        StatusCode::BAD_REQUEST,
        "Task 'classify' only supports",
    );
    let tagger = router_for_fixture("bert-tokcls");
    let reply = post(&tagger, "/pooling", json!({"input": text})).await;
    let rows = reply.body["data"][0]["data"].as_array().unwrap();
    let tokcls = expected("bert-tokcls");
    assert_eq!(rows.len(), tokcls["texts"][0]["input_ids"].as_array().unwrap().len());
    assert!(max_abs_diff(&floats(&rows[0]), &floats(&tokcls["texts"][0]["softmax"][0])) <= 1e-4);
    assert_route_not_registered(&post(&tagger, "/classify", json!({"input": text})).await);
}

fn router_for_fixture(name: &str) -> axum::Router {
    router(engine(&fixture_model(name), |_| {}), 2_000_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_sparse_follows_tei() {
    let reference = expected("bert-splade");
    let router = router(engine(&fixture_model("bert-splade"), |c| c.models[0].pooler.pooling_type = Some(PoolingType::Splade)), 2_000_000);
    let text = reference["texts"][0]["text"].as_str().unwrap();
    let reply = post(&router, "/embed_sparse", json!({"inputs": text})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let list = reply.body[0].as_array().unwrap();
    assert_eq!(list.len(), reference["texts"][0]["sparse"]["indices"].as_array().unwrap().len());
    assert_eq!(list[0]["index"], reference["texts"][0]["sparse"]["indices"][0]);
    assert!(list[0]["value"].is_number());

    // TEI's errors: `[]` is one empty input, a missing field a 422, an over-long input is cut
    // unless `truncate` is false (TEI's --auto-truncate default).
    assert_tei_error(
        &post(&router, "/embed_sparse", json!({"inputs": []})).await,
        StatusCode::BAD_REQUEST,
        "Empty",
        "Input validation error: `inputs` cannot be empty",
    );
    assert_tei_error(
        &post(&router, "/embed_sparse", json!({"input": "x"})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "Validation",
        "missing field `inputs`",
    );
    let long = "word ".repeat(300);
    assert_tei_error(
        &post(&router, "/embed_sparse", json!({"inputs": long, "truncate": false})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "Validation",
        "Input validation error: `inputs` must have less than 128 tokens. Given: 302",
    );
    let reply = post(&router, "/embed_sparse", json!({"inputs": [long]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_route_not_registered(&post(&router, "/v1/embeddings", json!({"input": "x"})).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_vector_models_rerank_by_maxsim() {
    let reference = expected("bert-colbert");
    let router = router_for_fixture("bert-colbert");
    for route in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        for pair in reference["pairs"].as_array().unwrap() {
            let reply = post(&router, route, json!({"query": pair["query"], "documents": [pair["document"]]})).await;
            assert_eq!(reply.status, StatusCode::OK, "{route}: {}", reply.body);
            let score = reply.body["results"][0]["relevance_score"].as_f64().unwrap();
            let query_tokens = pair["query_input_ids"].as_array().unwrap().len() as f64;
            assert!((score - pair["maxsim"].as_f64().unwrap()).abs() / query_tokens <= 1e-4, "{route}: {score} vs {}", pair["maxsim"]);
            let scored = post(&router, "/score", json!({"text_1": pair["query"], "text_2": pair["document"]})).await;
            // Equal up to float rounding: the two requests may batch their texts differently.
            let scored = scored.body["data"][0]["score"].as_f64().unwrap();
            assert!((scored - score).abs() <= 1e-5, "{route}: /score gives {scored}, /rerank {score}");
        }
    }
    // The pooling task is token_embed: /v1/embeddings answers token embeddings, as vLLM's.
    let reply = post(&router, "/v1/embeddings", json!({"input": "x"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body["data"][0]["embedding"][0].is_array(), "{}", reply.body);
}

/// The ColBERT layouts vLLM serves (tests/fixtures/make_colbert.py, vLLM's reference: every
/// token projected and normalized, MaxSim): PyLate's ModernBERT folder (its Dense module named
/// `pylate.models.Dense.Dense`, its fields in config_sentence_transformers.json), Stanford's
/// `HF_ColBERT` with `linear.weight` beside the backbone, and LFM2-ColBERT (transformers'
/// `Lfm2Model`: short convolutions and attention), and jina-colbert-v2 (`HF_ColBERT` around
/// jinaai's rotary XLM-RoBERTa, make_jina_colbert_v2.py with the published code). Each loads
/// with no flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colbert_layouts_embed_every_token_and_score_by_maxsim() {
    for name in ["modernbert-colbert-tiny", "hf-colbert-tiny", "lfm2-colbert-tiny", "jina-colbert-v2-tiny"] {
        let reference = expected(name);
        let router = router_for_fixture(name);
        for case in reference["texts"].as_array().unwrap() {
            let reply = post(&router, "/pooling", json!({"input": case["text"], "task": "token_embed"})).await;
            assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.body);
            let rows = reply.body["data"][0]["data"].as_array().unwrap();
            let want = case["token_vectors"].as_array().unwrap();
            assert_eq!(rows.len(), want.len(), "{name}: one vector per token, special tokens included");
            for (t, (row, w)) in rows.iter().zip(want).enumerate() {
                let c = cosine(&floats(row), &floats(w));
                assert!(c >= 0.9999 && (floats(row).len() == floats(w).len()), "{name} token {t}: cosine {c}");
            }
        }
        for pair in reference["pairs"].as_array().unwrap() {
            let reply = post(&router, "/score", json!({"text_1": pair["query"], "text_2": pair["document"]})).await;
            assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.body);
            let score = reply.body["data"][0]["score"].as_f64().unwrap();
            let want = pair["maxsim"].as_f64().unwrap();
            assert!((score - want).abs() <= 1e-4 * want.abs().max(1.0), "{name}: {score} vs {want}");
        }
    }
}

/// vLLM's recipe for jina-colbert-v2 (`--hf-overrides '{"architectures":
/// ["ColBERTJinaRobertaModel"]}'`) gives the same vectors as the folder as published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jina_colbert_v2_under_vllms_name() {
    let reference = expected("jina-colbert-v2-tiny");
    let overrides = json!({"architectures": ["ColBERTJinaRobertaModel"]}).as_object().unwrap().clone();
    let engine = engine(&fixture_model("jina-colbert-v2-tiny"), |c| c.models[0].hf_overrides = overrides);
    let router = router(engine, 2_000_000);
    let case = &reference["texts"][1];
    let reply = post(&router, "/pooling", json!({"input": case["text"], "task": "token_embed"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let rows = reply.body["data"][0]["data"].as_array().unwrap();
    let want = case["token_vectors"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for (row, w) in rows.iter().zip(want) {
        assert!(cosine(&floats(row), &floats(w)) >= 0.9999);
    }
}

#[test]
fn broken_colbert_folders_are_one_line() {
    use crate::common::families::{broken_folder_is_one_line, set_json};
    broken_folder_is_one_line("modernbert-colbert-tiny", set_json("1_Dense/config.json", "use_residual", json!(true)), "use_residual");
    broken_folder_is_one_line(
        "lfm2-colbert-tiny",
        set_json("config.json", "layer_types", json!(["conv", "full_attention", "mamba", "full_attention"])),
        "layer_types[2] is Some(\"mamba\")",
    );
    broken_folder_is_one_line(
        "lfm2-colbert-tiny",
        |dir| crate::common::families::drop_tensor(dir, "layers.2.conv.conv"),
        "layers.2.conv.conv.weight",
    );
    broken_folder_is_one_line(
        "hf-colbert-tiny",
        |dir| {
            let file = dir.join("model.safetensors");
            let mut tensors = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
            tensors.insert(
                "linear.weight".into(),
                candle_core::Tensor::zeros((12, 31), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
            );
            candle_core::safetensors::save(&tensors, &file).unwrap();
        },
        "linear.weight has shape [12, 31]",
    );
    broken_folder_is_one_line(
        "jina-colbert-v2-tiny",
        set_json("config.json", "rotary_emb_interleaved", json!(true)),
        "rotary_emb_interleaved: true is not supported",
    );
}
