//! Qwen3-VL against transformers 5.24 (generator: tests/fixtures/make_qwen3_vl.py), through
//! the real router:
//! - as Qwen3-VL-Embedding: the embedder's chat-framed prompts token for token, and the last
//!   token's normalized state for texts, images and an image with text, alone and batched, as
//!   OpenAI, vLLM (`messages`) and Cohere clients send them;
//! - as Qwen3-VL-Reranker (vLLM's `--hf-overrides` conversion): pairs of texts and images
//!   written into vLLM's `qwen3_vl_reranker.jinja` prompt, scored `sigmoid(yes − no)` on
//!   `/score` and `/rerank` (documents of content parts).

use crate::common::*;
use base64::Engine as _;
use serde_json::{json, Value};

const MODEL: &str = "qwen3-vl-embedding-tiny";

fn image_url(file: &str) -> String {
    let bytes = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images").join(file)).unwrap();
    let kind = if file.ends_with(".jpg") { "jpeg" } else { "png" };
    format!("data:image/{kind};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// An input's content as a chat message carries it: the image first, then the text (the
/// embedder's order), or the text first where the reference says so (`text_first`).
fn content(input: &Value) -> Value {
    let mut parts = Vec::new();
    if let Some(file) = input["image"].as_str() {
        parts.push(json!({"type": "image_url", "image_url": {"url": image_url(file)}}));
    }
    if let Some(text) = input["text"].as_str() {
        let text = json!({"type": "text", "text": text});
        match input["text_first"].as_bool() {
            Some(true) => parts.insert(0, text),
            _ => parts.push(text),
        }
    }
    json!(parts)
}

/// The f32 bar, but for the JPEG: zune-jpeg's chroma upsampling differs from libjpeg-turbo's
/// by a level or two, which these random weights amplify (as for ColQwen2's pages).
fn bar(input: &Value) -> f64 {
    match input["image"].as_str() {
        Some(file) if file.ends_with(".jpg") => 0.99,
        _ => 0.9999,
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_images_and_both_embed_as_the_published_embedder_does() {
    // Two shapes (make_qwen3_vl.py QWEN3_VL_SHAPES); the second has a text before its image too.
    for model in [MODEL, "qwen3-vl-embedding-second-tiny"] {
        eprintln!("{model}:");
        embeds_as_the_published_embedder_does(model).await;
    }
}

async fn embeds_as_the_published_embedder_does(model: &str) {
    let expected = expected(model);
    let engine = engine(&fixture_model(model), |_| {});
    assert!(engine.spec().tasks.contains(&poolserve::pooling::Task::Embed), "{:?}", engine.spec().tasks);
    let router = router(engine, 16 << 20);
    let inputs = expected["inputs"].as_array().unwrap();

    // Texts: the chat frame, token for token, and the vector, through the OpenAI route.
    for input in inputs.iter().filter(|i| i.get("image").is_none()) {
        let reply = post(&router, "/tokenize", json!({"prompt": input["text"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(ids(&reply.body["tokens"]), ids(&input["input_ids"]), "{} tokens", input["text"]);
        let reply = post(&router, "/v1/embeddings", json!({"input": input["text"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&input["vector"]));
        eprintln!("text {}: cosine {c:.9}", input["text"]);
        assert!(c >= 0.9999, "text {}: cosine {c}", input["text"]);
    }

    // Every input alone, then all in one request, as vLLM's chat-style embedding request.
    for input in inputs {
        let reply = post(&router, "/v1/embeddings", json!({"messages": [{"role": "user", "content": content(input)}]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&input["vector"]));
        eprintln!("{} / {}: alone cosine {c:.9}", input["image"], input["text"]);
        assert!(c >= bar(input), "{} / {}: cosine {c}", input["image"], input["text"]);
        if input.get("image").is_some() {
            // Usage: the prompt's tokens and the tower's patches.
            let grid = ids(&input["grid_thw"]).iter().product::<u32>() as usize;
            assert_eq!(reply.body["usage"]["prompt_tokens"], json!(input["input_ids"].as_array().unwrap().len() + grid));
        }
    }
    let messages: Vec<Value> = inputs.iter().map(|i| json!({"role": "user", "content": content(i)})).collect();
    let reply = post(&router, "/v1/embeddings", json!({"messages": messages})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (item, input) in reply.body["data"].as_array().unwrap().iter().zip(inputs) {
        let c = cosine(&floats(&item["embedding"]), &floats(&input["batched"]));
        eprintln!("{} / {}: batched cosine {c:.9}", input["image"], input["text"]);
        assert!(c >= bar(input), "{} / {} batched: cosine {c}", input["image"], input["text"]);
    }

    // A system message is the instruction (the embedder's system turn), for texts and images.
    for item in expected["instructed"].as_array().unwrap() {
        let system = json!({"role": "system", "content": item["instruction"]});
        let reply = post(&router, "/v1/embeddings", json!({"messages": [system, {"role": "user", "content": content(item)}]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body["data"].as_array().unwrap().len(), 1, "the system message is not an input");
        let c = cosine(&floats(&reply.body["data"][0]["embedding"]), &floats(&item["vector"]));
        assert!(c >= bar(item), "instructed {} / {}: cosine {c}", item["image"], item["text"]);
    }
    let system = json!({"role": "system", "content": [{"type": "image_url", "image_url": {"url": image_url("gray_19x25.png")}}]});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [system, {"role": "user", "content": "a"}]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);

    // Cohere's /v2/embed with an image: the same vector.
    let png = inputs.iter().find(|i| i["image"] == "gradient_97x61.png" && i.get("text").is_none()).unwrap();
    let body = json!({"input_type": "image", "images": [image_url("gradient_97x61.png")], "embedding_types": ["float"]});
    let reply = post(&router, "/v2/embed", body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let c = cosine(&floats(&reply.body["embeddings"]["float"][0]), &floats(&png["vector"]));
    assert!(c >= 0.9999, "Cohere image: cosine {c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_image_placeholder_is_refused() {
    let router = router(engine(&fixture_model(MODEL), |_| {}), 16 << 20);
    let reply = post(&router, "/v1/embeddings", json!({"input": "look <|image_pad|> here"})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.to_string().contains("<|image_pad|>"), "{}", reply.body);
    let message = json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [message]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
}

/// Qwen3-VL-Reranker converted as vLLM's docs serve it.
fn reranker_router() -> axum::Router {
    let engine = engine(&fixture_model("qwen3-vl-reranker-tiny"), |c| {
        let overrides = json!({"architectures": ["Qwen3VLForSequenceClassification"], "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true});
        c.models[0].hf_overrides = overrides.as_object().unwrap().clone();
    });
    router(engine, 16 << 20)
}

/// A side as vLLM's score API takes it: a text, or `{"content": [an image part]}`.
fn side(value: &Value) -> Value {
    match value["image"].as_str() {
        Some(file) => json!({"content": [{"type": "image_url", "image_url": {"url": image_url(file)}}]}),
        None => value["text"].clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reranker_scores_texts_and_images_in_its_template() {
    let expected = expected("qwen3-vl-reranker-tiny");
    let router = reranker_router();
    let pairs = expected["pairs"].as_array().unwrap();
    for pair in pairs {
        let reply = post(&router, "/score", json!({"data_1": side(&pair["query"]), "data_2": side(&pair["document"])})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let (ours, want) = (reply.body["data"][0]["score"].as_f64().unwrap(), pair["score"].as_f64().unwrap());
        eprintln!("{} × {}: {ours:.7} (transformers {want:.7})", pair["query"], pair["document"]);
        assert!((ours - want).abs() <= 1e-4, "{} × {}: {ours} vs {want}", pair["query"], pair["document"]);
        // Usage: the prompt's tokens and the tower's patches of its images.
        let patches: usize = [&pair["query"], &pair["document"]]
            .iter()
            .filter_map(|s| s["image"].as_str())
            .map(|f| if f.starts_with("gradient") { 24 } else { 16 })
            .sum();
        assert_eq!(reply.body["usage"]["prompt_tokens"], json!(pair["input_ids"].as_array().unwrap().len() + patches));
    }
    // vLLM's /rerank with documents of content parts: a text and two images, one request.
    let query = &pairs[0]["query"]["text"];
    let documents: Vec<Value> = pairs[..3]
        .iter()
        .map(|p| match p["document"]["image"].as_str() {
            Some(file) => json!({"type": "image_url", "image_url": {"url": image_url(file)}}),
            None => json!({"type": "text", "text": p["document"]["text"]}),
        })
        .collect();
    let reply = post(&router, "/rerank", json!({"query": query, "documents": one_part_documents(&documents)})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for result in reply.body["results"].as_array().unwrap() {
        let i = result["index"].as_u64().unwrap() as usize;
        let (ours, want) = (result["relevance_score"].as_f64().unwrap(), pairs[i]["score"].as_f64().unwrap());
        assert!((ours - want).abs() <= 1e-4, "rerank document {i}: {ours} vs {want}");
    }
    // A text pair through the plain route: the template rendered, as for Qwen3-Reranker.
    let reply = post(&router, "/rerank", json!({"query": query, "documents": [pairs[0]["document"]["text"]]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let ours = reply.body["results"][0]["relevance_score"].as_f64().unwrap();
    assert!((ours - pairs[0]["score"].as_f64().unwrap()).abs() <= 1e-4, "text rerank: {ours}");
    // A request's instruction goes into the template for image documents too.
    let instructed = &expected["instructed"];
    let body =
        json!({"data_1": instructed["query"]["text"], "data_2": side(&instructed["document"]), "instruction": instructed["instruction"]});
    let custom = post(&router, "/score", body).await;
    assert_eq!(custom.status, 200, "{}", custom.body);
    let (ours, want) = (custom.body["data"][0]["score"].as_f64().unwrap(), instructed["score"].as_f64().unwrap());
    assert!((ours - want).abs() <= 1e-4, "instructed: {ours} vs {want}");
    // Token ids cannot stand beside an image in the template: a 400, not a failure.
    let reply = post(&router, "/score", json!({"data_1": [1, 2, 3], "data_2": side(&pairs[1]["document"])})).await;
    assert!(reply.status == 400 || reply.status == 422, "{}", reply.body);
}

/// The embedder's folder converted into a reranker: its LM head is tied to the embeddings,
/// which the converted classifier reads under the language model's prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tied_lm_head_converts_into_a_reranker() {
    let expected = expected(MODEL);
    let tied = &expected["tied_reranker"];
    let engine = engine(&fixture_model(MODEL), |c| {
        let overrides = json!({"architectures": ["Qwen3VLForSequenceClassification"], "classifier_from_token": tied["classifier_from_token"], "is_original_qwen3_reranker": true});
        c.models[0].hf_overrides = overrides.as_object().unwrap().clone();
    });
    let router = router(engine, 16 << 20);
    let body = json!({"data_1": tied["query"], "data_2": side(&json!({"image": tied["document"]}))});
    let reply = post(&router, "/score", body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let (ours, want) = (reply.body["data"][0]["score"].as_f64().unwrap(), tied["score"].as_f64().unwrap());
    assert!((ours - want).abs() <= 1e-4, "tied head: {ours} vs {want}");
}
