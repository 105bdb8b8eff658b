//! The decoder families (Llama, Mistral, Gemma 2 and 3, EmbeddingGemma) through the real router, against transformers and
//! sentence-transformers (generator: tests/fixtures/make_decoder_families.py): Llama (llama3
//! and dynamic rope scaling, biases, GQA), Mistral (sliding window, YaRN, e5-mistral's
//! prompts), Gemma 2 (soft-capping, query_pre_attn_scalar, local layers), Gemma 3 (causal, and
//! EmbeddingGemma's bidirectional folder with its Dense layers, prompts and Matryoshka
//! dimensions), and bge-reranker-v2-gemma's reading of a Gemma causal LM. Embeddings by cosine
//! ≥ 0.9999, probabilities and scores within 1e-4, every input alone and all in one batch.

use crate::common::families::*;
use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

/// Embeddings with each of the folder's prompts, by `prompt_name` on the OpenAI route and by
/// Cohere's `input_type` where it maps to one (`search_query` → `query`, `search_document` →
/// `document`), against sentence-transformers' `encode(prompt_name=…)`.
async fn check_prompts(name: &str) {
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    for (prompt_name, cases) in expected["prompts"].as_object().unwrap() {
        let cases = cases.as_array().unwrap();
        let texts: Vec<&Value> = cases.iter().map(|c| &c["text"]).collect();
        let openai = post(&router, "/v1/embeddings", json!({"input": texts, "prompt_name": prompt_name})).await;
        assert_eq!(openai.status, StatusCode::OK, "{}", openai.body);
        let input_type = match prompt_name.as_str() {
            "query" => Some("search_query"),
            "document" => Some("search_document"),
            _ => None,
        };
        let cohere = match input_type {
            Some(t) => Some(post(&router, "/v2/embed", json!({"texts": texts, "input_type": t, "embedding_types": ["float"]})).await),
            None => None,
        };
        for (i, case) in cases.iter().enumerate() {
            let reference = floats(&case["embedding"]);
            let c = cosine(&floats(&openai.body["data"][i]["embedding"]), &reference);
            assert!(c >= 0.9999, "{name} prompt {prompt_name} text {i}: cosine {c}");
            if let Some(cohere) = &cohere {
                assert_eq!(cohere.status, StatusCode::OK, "{}", cohere.body);
                let c = cosine(&floats(&cohere.body["embeddings"]["float"][i]), &reference);
                assert!(c >= 0.9999, "{name} input_type for {prompt_name} text {i}: cosine {c}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_and_mistral_match_transformers() {
    check_embeddings("llama-embed-last").await;
    check_classifier("llama-seqcls").await;
    check_embeddings("mistral-embed-window").await;
    check_prompts("mistral-embed-window").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma_families_match_transformers() {
    check_embeddings("gemma2-embed-last").await;
    check_classifier("gemma2-seqcls").await;
    check_embeddings("gemma3-causal").await;
    check_embeddings("embeddinggemma-tiny").await;
    check_prompts("embeddinggemma-tiny").await;
}

/// EmbeddingGemma 2's text encoder (PLE, wider full-attention layers, value norms, the
/// symmetric window, `embedding_projection`), published as a sentence-transformers folder, and
/// the multimodal `EmbeddingGemma2Model` folder serving text through its `language_model`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddinggemma2_matches_transformers() {
    check_embeddings("embeddinggemma2-text").await;
    check_prompts("embeddinggemma2-text").await;
    check_embeddings("embeddinggemma2-omni").await;
}

/// EmbeddingGemma's Matryoshka sizes, flagged as vLLM flags them (`--hf-overrides
/// '{"matryoshka_dimensions": [...]}'`): `dimensions` keeps the leading components.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddinggemma_truncates_to_its_matryoshka_dimensions() {
    let expected = expected("embeddinggemma-tiny");
    let flagged = router(
        engine(&fixture_model("embeddinggemma-tiny"), |c| {
            c.models[0].hf_overrides.insert("matryoshka_dimensions".into(), json!([32, 16, 8]));
        }),
        2_000_000,
    );
    let reply = post(&flagged, "/v1/embeddings", json!({"input": texts(&expected), "dimensions": 16})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let got = floats(&reply.body["data"][i]["embedding"]);
        assert_eq!(got.len(), 16);
        let c = cosine(&got, &floats(&case["embedding"])[..16]);
        assert!(c >= 0.9999, "text {i}: cosine {c}");
    }
    let refused = post(&flagged, "/v1/embeddings", json!({"input": "x", "dimensions": 12})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
}

/// BAAI/bge-reranker-v2-gemma as vLLM serves it: the Gemma causal LM with vLLM's
/// `--hf-overrides`, pairs wrapped in FlagEmbedding's prompt, sigmoid of the "Yes" logit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma_causal_lm_reads_yes_as_bge_reranker_v2_gemma() {
    let name = "gemma-causal-reranker";
    let overrides = expected(name)["hf_overrides"].as_object().unwrap().clone();
    let served = router(
        engine(&fixture_model(name), |c| {
            c.models[0].hf_overrides.extend(overrides.clone());
        }),
        2_000_000,
    );
    check_cross_encoder_on(name, &served).await;

    // The same prompt set by hand (`rerank_template` in `--hf-overrides`) gives the same scores.
    let by_hand = router(
        engine(&fixture_model(name), |c| {
            c.models[0].hf_overrides.extend(overrides);
            c.models[0].hf_overrides.insert("rerank_template".into(), json!("<bos>A: {query}\nB: {document}\n{instruction}"));
            c.models[0].hf_overrides.insert(
                "rerank_instruction".into(),
                json!("Given a query A and a passage B, determine whether the passage contains an answer to the query by providing a prediction of either 'Yes' or 'No'."),
            );
        }),
        2_000_000,
    );
    check_cross_encoder_on(name, &by_hand).await;
}

#[test]
fn broken_decoder_folders_are_one_line() {
    broken_folder_is_one_line("gemma3-causal", |dir| drop_tensor(dir, "layers.1.self_attn.q_norm"), "q_norm");
    broken_folder_is_one_line(
        "embeddinggemma2-text",
        |dir| drop_tensor(dir, "layers.1.ple_block.per_layer_input_gate"),
        "per_layer_input_gate",
    );
    broken_folder_is_one_line(
        "embeddinggemma2-text",
        |dir| {
            let path = dir.join("config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["per_layer_config"]["1"]["num_key_value_heads"] = json!(3);
            std::fs::write(&path, config.to_string()).unwrap();
        },
        "layer 1: 4 heads over 3 key/value heads",
    );
    broken_folder_is_one_line(
        "llama-embed-last",
        |dir| {
            let path = dir.join("config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["rope_parameters"] = json!({"rope_type": "longrope", "rope_theta": 10000.0});
            std::fs::write(&path, config.to_string()).unwrap();
        },
        "rope_type `longrope` is not supported",
    );
}

/// e5-mistral-7b-instruct's tokenizer files: a tokenizer.json that appends nothing, and
/// `add_eos_token: true` in tokenizer_config.json, which transformers 4's LlamaTokenizerFast
/// (what the model was evaluated with) turns into a `</s>` after every text. Served so, the
/// last token pooled is that `</s>`, and the embeddings are the reference's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_eos_token_appends_the_eos_last_token_pooling_reads() {
    let dir = std::env::temp_dir().join(format!("poolserve-e5-tokenizer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&fixture_model("mistral-embed-window"), &dir);
    let tokenizer_path = dir.join("tokenizer.json");
    let mut tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(&tokenizer_path).unwrap()).unwrap();
    let bos = tokenizer["post_processor"]["special_tokens"]["<s>"].clone();
    tokenizer["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": bos},
    });
    std::fs::write(&tokenizer_path, tokenizer.to_string()).unwrap();
    let config_path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let served_without_flag = router_for(&dir);
    let text = expected("mistral-embed-window")["texts"][0].clone();
    let without = post(&served_without_flag, "/tokenize", json!({"prompt": text["text"]})).await;
    assert_eq!(without.status, StatusCode::OK, "{}", without.body);
    assert_eq!(
        without.body["tokens"].as_array().unwrap().len() + 1,
        text["input_ids"].as_array().unwrap().len(),
        "tokenizer.json alone appends nothing"
    );

    config["tokenizer_class"] = json!("LlamaTokenizerFast");
    config["add_bos_token"] = json!(true);
    config["add_eos_token"] = json!(true);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let served = router_for(&dir);
    let tokens = post(&served, "/tokenize", json!({"prompt": text["text"]})).await;
    assert_eq!(tokens.body["tokens"], text["input_ids"], "<s> … </s>, as transformers 4 encodes it");
    for (i, case) in expected("mistral-embed-window")["texts"].as_array().unwrap().iter().enumerate() {
        let reply = post(&served, "/v1/embeddings", json!({"input": case["text"]})).await;
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "text {i}: cosine {c}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
