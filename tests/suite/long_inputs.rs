//! Chunked processing of long embedding inputs (docs/http-api.md, "Long inputs") through the real router,
//! against a reference computed chunk by chunk with transformers
//! (tests/fixtures/make_chunked_reference.py): a 3,220-token text on a 128-token model.

use crate::common::*;
use axum::http::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_input_is_the_token_weighted_mean_of_its_chunks() {
    let reference = expected("bert-embed-mean-chunked");
    let text = reference["text"].as_str().unwrap();
    let tokens = reference["num_tokens"].as_u64().unwrap();
    let chunked = router(
        engine(&fixture_model("bert-embed-mean"), |c| {
            c.models[0].pooler.enable_chunked_processing = Some(true);
            c.models[0].pooler.max_embed_len = Some(4000);
        }),
        2_000_000,
    );
    // Mixed with a short input in one request: both answered, in order.
    let reply = post(&chunked, "/v1/embeddings", json!({"input": [text, "A man is eating food."]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&reference["embedding"]), "chunked embedding");
    let short = expected("bert-embed-mean");
    assert_close(&floats(&reply.body["data"][1]["embedding"]), &floats(&short["texts"][0]["embedding"]), "short input beside it");
    let short_tokens = short["texts"][0]["input_ids"].as_array().unwrap().len() as u64;
    assert_eq!(reply.body["usage"]["prompt_tokens"], tokens + short_tokens, "usage counts every chunk's tokens");

    let raw = post(&chunked, "/v1/embeddings", json!({"input": text, "normalize": false})).await;
    assert_close(&floats(&raw.body["data"][0]["embedding"]), &floats(&reference["embedding_unnormalized"]), "un-normalized mean");

    // Over max_embed_len: refused with vLLM's message.
    let capped = router(
        engine(&fixture_model("bert-embed-mean"), |c| {
            c.models[0].pooler.enable_chunked_processing = Some(true);
            c.models[0].pooler.max_embed_len = Some(1000);
        }),
        2_000_000,
    );
    let reply = post(&capped, "/v1/embeddings", json!({"input": text})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.body["error"]["message"],
        "This model's maximum context length is 1000 tokens. However, your prompt contains at least 1001 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
    );

    // Without chunking: the usual too-long error; token tasks never chunk.
    let plain = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let reply = post(&plain, "/v1/embeddings", json!({"input": text})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.body["error"]["message"].as_str().unwrap().starts_with("This model's maximum context length is 128 tokens."));
    let reply = post(&chunked, "/pooling", json!({"input": text, "task": "token_embed"})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
}
