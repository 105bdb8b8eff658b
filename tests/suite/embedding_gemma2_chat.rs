//! EmbeddingGemma 2 of a second shape whose folder ships a chat template (generator:
//! tests/fixtures/make_embedding_gemma2.py `second`: a Unigram tokenizer with a bos-only
//! post-processor; `chat_template.jinja` writes the bos, then each part in order, a medium as its
//! bare placeholder), against transformers 5.24's `processor.apply_chat_template(…,
//! tokenize=True)` and the model: messages that mix text, images and audio in both orders,
//! alone and in one request, as vLLM (`messages`) and Cohere (`/v2/embed` `inputs`) clients send
//! them; the template's own placement of the parts decides (a folder without one keeps
//! poolserve's newline between parts, `embedding_gemma2_images.rs`).

use crate::common::families::router_for;
use crate::common::*;
use base64::Engine;
use serde_json::{json, Value};

const MODEL: &str = "embeddinggemma2-second";

fn data_url(folder: &str, file: &str, kind: &str) -> String {
    let bytes = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(folder).join(file)).unwrap();
    format!("data:{kind};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A reference's parts (`{"text"}`, `{"image": file}`, `{"audio": file}`) as OpenAI content parts.
fn content(parts: &Value) -> Vec<Value> {
    parts
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            if let Some(text) = p.get("text") {
                json!({"type": "text", "text": text})
            } else if let Some(image) = p["image"].as_str() {
                json!({"type": "image_url", "image_url": {"url": data_url("images", image, "image/png")}})
            } else {
                let file = p["audio"].as_str().unwrap();
                let format = file.rsplit('.').next().unwrap();
                json!({"type": "audio_url", "audio_url": {"url": data_url("audio", file, &format!("audio/{format}"))}})
            }
        })
        .collect()
}

fn check(ours: &Value, reference: &Value, what: &str) {
    let c = cosine(&floats(ours), &floats(reference));
    eprintln!("{what}: cosine {c:.7}");
    assert!(c >= 0.9999, "{what}: cosine {c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_mixing_text_and_media_embed_as_the_folders_chat_template_writes_them() {
    let expected = expected(MODEL);
    let router = router_for(&fixture_model(MODEL));
    let cases = expected["chat"].as_array().unwrap();
    let messages: Vec<Value> = cases.iter().map(|c| json!({"role": "user", "content": content(&c["parts"])})).collect();
    for (case, message) in cases.iter().zip(&messages) {
        let what = format!("message {}", case["rendered"]);
        let reply = post(&router, "/v1/embeddings", json!({"messages": [message]})).await;
        assert_eq!(reply.status, 200, "{what}: {}", reply.body);
        check(&reply.body["data"][0]["embedding"], &case["embedding"], &what);
        // Usage counts the template's sequence and the towers' passes over the media.
        let tokens = case["input_ids"].as_array().unwrap().len();
        assert!(reply.body["usage"]["prompt_tokens"].as_u64().unwrap() as usize >= tokens, "{what}: tokens");
    }
    // All of them in one request, each message one input.
    let reply = post(&router, "/v1/embeddings", json!({"messages": messages})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (i, case) in cases.iter().enumerate() {
        check(&reply.body["data"][i]["embedding"], &case["embedding"], &format!("batched message {i}"));
    }
    // /pooling's embed takes the same messages.
    let reply = post(&router, "/pooling", json!({"messages": [messages[0]], "task": "embed"})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    check(&reply.body["data"][0]["data"], &cases[0]["embedding"], "/pooling message 0");
}

/// Cohere's `inputs` (text and image parts) go through the folder's template, as vLLM's
/// /v2/embed renders them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_inputs_with_images_embed_as_the_template_writes_them() {
    let expected = expected(MODEL);
    let router = router_for(&fixture_model(MODEL));
    let cases: Vec<&Value> = expected["chat"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["parts"].as_array().unwrap().iter().all(|p| p.get("audio").is_none()))
        .collect();
    assert!(cases.len() >= 3, "texts and images in both orders");
    let inputs: Vec<Value> = cases.iter().map(|c| json!({"content": content(&c["parts"])})).collect();
    let reply = post(&router, "/v2/embed", json!({"inputs": inputs, "embedding_types": ["float"]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (i, case) in cases.iter().enumerate() {
        check(&reply.body["embeddings"]["float"][i], &case["embedding"], &format!("Cohere input {}", case["rendered"]));
    }
}

/// Plain texts keep the tokenizer's own bos; a placeholder typed as text, or a request's
/// `add_special_tokens`, are the request's to answer for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_and_typed_placeholders() {
    let expected = expected(MODEL);
    let router = router_for(&fixture_model(MODEL));
    for case in expected["texts"].as_array().unwrap() {
        let reply = post(&router, "/v1/embeddings", json!({"input": case["text"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        check(&reply.body["data"][0]["embedding"], &case["embedding"], &format!("text {}", case["text"]));
    }
    // The template writes `<|image|>` for the one image; a second typed in the text has none.
    let image = content(&json!([{"image": "gradient_97x61.png"}])).remove(0);
    let forged = json!({"role": "user", "content": [{"type": "text", "text": "look <|image|>"}, image]});
    let reply = post(&router, "/v1/embeddings", json!({"messages": [forged]})).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.body["error"]["message"], "Found more '<|image|>' placeholders in input prompt than actual multimodal data items.");
}
