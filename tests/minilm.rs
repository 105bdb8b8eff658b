//! The real all-MiniLM-L6-v2 (fetched by scripts/fetch-minilm.sh) against the embeddings
//! sentence-transformers computes (tests/fixtures/expected/all-MiniLM-L6-v2.json), through the
//! real router: parity, truncation at max_seq_length, the too-long error, and semantics.

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_matches_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    let reference = expected("all-MiniLM-L6-v2");
    let engine = engine(&dir, |_| {});
    assert_eq!(engine.spec().max_model_len, 256, "max_seq_length wins over tokenizer.json's baked-in 128");
    let router = router(engine, 2_000_000);
    let texts: Vec<&str> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();

    // One batch with every text; the 722-token text needs truncation to max_model_len.
    let reply = post(&router, "/v1/embeddings", json!({"input": texts, "truncate_prompt_tokens": -1})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let batched: Vec<Vec<f32>> = reply.body["data"].as_array().unwrap().iter().map(|d| floats(&d["embedding"])).collect();
    let expected_tokens: usize = reference["texts"].as_array().unwrap().iter().map(|t| t["input_ids"].as_array().unwrap().len()).sum();
    assert_eq!(reply.body["usage"]["prompt_tokens"], expected_tokens);

    for (i, text) in texts.iter().enumerate() {
        let want = floats(&reference["texts"][i]["embedding"]);
        assert_close(&batched[i], &want, &format!("MiniLM text {i} batched"));
        let single = post(&router, "/v1/embeddings", json!({"input": text, "truncate_prompt_tokens": -1})).await;
        let single = floats(&single.body["data"][0]["embedding"]);
        assert_close(&single, &want, &format!("MiniLM text {i} single"));
        assert!(max_abs_diff(&single, &batched[i]) <= 1e-5, "text {i}: batched differs from single");
        let ids = post(&router, "/tokenize", json!({"prompt": text})).await;
        let n = reference["texts"][i]["input_ids"].as_array().unwrap().len();
        if n < 256 {
            assert_eq!(ids.body["tokens"], reference["texts"][i]["input_ids"], "text {i}: token ids");
        }
    }

    // Semantics: cosine of text 0 with the others, as sentence-transformers reports.
    for (j, want) in reference["cosine"][0].as_array().unwrap().iter().enumerate() {
        let got = cosine(&batched[0], &batched[j]);
        assert!((got - want.as_f64().unwrap()).abs() < 1e-4, "cosine(0, {j}) = {got}, reference {want}");
    }

    // Without truncation the long text is refused, as vLLM does.
    let long = post(&router, "/v1/embeddings", json!({"input": texts[6]})).await;
    assert_eq!(long.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        long.body["error"]["message"],
        "This model's maximum context length is 256 tokens. However, you requested 722 tokens in the input for embedding generation. Please reduce the length of the input."
    );
}
