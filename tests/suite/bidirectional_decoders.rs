//! Decoders read as encoders (every token attends to its whole sequence) through the real
//! router, against their published modeling code transcribed onto transformers' classes
//! (generator: tests/fixtures/make_bidirectional_decoders.py): NVIDIA's LlamaBidirectional
//! embedder and reranker (pooling and temperature from config.json), voyage-4-nano (Qwen3 with a
//! per-token projection, also under vLLM's `VoyageQwen3BidirectionalEmbedModel` name) and
//! pplx-embed-v1 (TEI's int8 output). Embeddings by cosine ≥ 0.9999, scores within 1e-4, every
//! input alone and all in one batch.

use crate::common::families::*;
use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_nemotron_embed_pools_as_its_config_says() {
    check_embeddings("llama-nemotron-embed-tiny").await;
    // The architecture alone decides it: `pooling` from config.json (avg), not the last token.
    let engine = engine(&fixture_model("llama-nemotron-embed-tiny"), |_| {});
    assert_eq!(engine.spec().pooling, poolserve::pooling::PoolingType::Mean);
    let engine = engine_with(&fixture_model("llama-nemotron-embed-tiny"), json!({"pooling": "cls"}));
    assert_eq!(engine.spec().pooling, poolserve::pooling::PoolingType::Cls);
}

fn engine_with(model: &std::path::Path, overrides: Value) -> poolserve::engine::Engine {
    engine(model, |c| c.models[0].hf_overrides = overrides.as_object().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_nemotron_rerank_scores_the_pooled_sequence_over_temperature() {
    let name = "llama-nemotron-rerank-tiny";
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    let inputs = texts(&expected);
    let batched = post(&router, "/classify", json!({"input": inputs, "use_activation": false})).await;
    assert_eq!(batched.status, StatusCode::OK, "{}", batched.body);
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let single = post(&router, "/classify", json!({"input": case["text"], "use_activation": false})).await;
        for (how, item) in [("single", &single.body["data"][0]), ("batched", &batched.body["data"][i])] {
            let diff = max_abs_diff(&floats(&item["probs"]), &floats(&case["logits"]));
            assert!(diff <= TOLERANCE, "{name} text {i} {how}: logits differ by {diff}");
        }
    }
    check_cross_encoder(name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voyage_nano_projects_every_token_then_averages() {
    check_embeddings("voyage-nano-tiny").await;
    let expected = expected("voyage-nano-tiny");
    // vLLM's published recipe: the architecture renamed, which attends both ways by itself.
    let engine = engine_with(
        &fixture_model("voyage-nano-tiny"),
        json!({"architectures": ["VoyageQwen3BidirectionalEmbedModel"], "use_bidirectional_attention": false}),
    );
    assert_eq!(engine.spec().embedding_size, 24);
    let router = router(engine, 2_000_000);
    let reply = post(&router, "/v1/embeddings", json!({"input": texts(&expected)})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let c = cosine(&floats(&reply.body["data"][i]["embedding"]), &floats(&case["embedding"]));
        assert!(c >= 0.9999, "voyage under vLLM's name, text {i}: cosine {c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pplx_embed_returns_int8_values() {
    let name = "pplx-embed-tiny";
    check_embeddings(name).await;
    // TEI's /embed with normalize false: the int8 values themselves.
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    let reply = post(&router, "/embed", json!({"inputs": texts(&expected), "normalize": false})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let ours = floats(&reply.body[i]);
        assert!(ours.iter().all(|x| x.fract() == 0.0 && x.abs() <= 127.0), "text {i}: {ours:?}");
        // A value within rounding of .5 may land on either side: at most one step apart.
        let diff = max_abs_diff(&ours, &floats(&case["embedding"]));
        assert!(diff <= 1.0, "{name} text {i}: {diff}");
    }
}

#[test]
fn broken_bidirectional_folders_are_one_line() {
    broken_folder_is_one_line(
        "llama-nemotron-embed-tiny",
        set_json("config.json", "pooling", json!("weighted_avg")),
        "pool_type \"weighted_avg\" not supported",
    );
    broken_folder_is_one_line(
        "llama-nemotron-rerank-tiny",
        set_json("config.json", "temperature", json!(0.0)),
        "temperature 0 must be positive",
    );
    broken_folder_is_one_line("voyage-nano-tiny", set_json("config.json", "num_labels", json!(25)), "linear.weight");
    broken_folder_is_one_line("pplx-embed-tiny", |d| drop_tensor(d, "layers.1.mlp.down_proj"), "layers.1.mlp.down_proj");
    broken_folder_is_one_line("gritlm-tiny", |d| drop_tensor(d, "layers.0.self_attn.o_proj"), "layers.0.self_attn.o_proj");
    // A tokenizer without the pieces of GritLM's instruction pattern could never find it.
    broken_folder_is_one_line(
        "gritlm-tiny",
        |d| {
            let path = d.join("tokenizer.json");
            let text = std::fs::read_to_string(&path).unwrap().replace("\"<0x0A>\"", "\"<0x0Z>\"");
            std::fs::write(&path, text).unwrap();
        },
        "lacks the pieces of its instruction pattern",
    );
}

/// GritLM as vLLM serves it (`GritLM` over a `mistral` config): attending both ways with no
/// sliding window, its mean leaving out the instruction (`<|user|>\n…\n<|embed|>\n` or
/// `<|embed|>\n`, BOS included), against the published `gritlm.GritLM.encode` (generator:
/// tests/fixtures/make_gritlm.py); a text without the format has its BOS alone left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gritlm_embeds_the_text_after_its_instruction() {
    check_embeddings("gritlm-tiny").await;
    let engine = engine(&fixture_model("gritlm-tiny"), |_| {});
    assert_eq!(engine.spec().pooling, poolserve::pooling::PoolingType::Mean);
    // Token ids sent as they are find the same span.
    let expected = expected("gritlm-tiny");
    let router = router(engine, 2_000_000);
    let case = &expected["texts"][0];
    let reply = post(&router, "/v1/embeddings", json!({"input": [case["input_ids"]]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&case["embedding"]));
    assert!(c >= 0.9999, "gritlm from token ids: cosine {c}");
}
