//! Chat templates against transformers' `apply_chat_template`: a Qwen2.5-style template
//! (tests/fixtures/make_vllm_compat.py) rendered by minijinja through `/tokenize` gives the
//! reference's token ids, with and without the generation prompt, with
//! `continue_final_message`, with `chat_template_kwargs`, with tool calls, and through a
//! `--chat-template` given on the command line.

use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

async fn tokens(router: &axum::Router, messages: &Value, options: &Value) -> Vec<u64> {
    let mut body = json!({"messages": messages, "add_generation_prompt": false});
    for (k, v) in options.as_object().unwrap() {
        if k == "enable_thinking" {
            body["chat_template_kwargs"] = json!({"enable_thinking": v});
        } else {
            body[k] = v.clone();
        }
    }
    let reply = post(router, "/tokenize", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_render_as_transformers_does() {
    let reference = expected("qwen2-embed-chat");
    let chat = &reference["chat"];
    let folder = router(engine(&fixture_model("qwen2-embed-chat"), |_| {}), 2_000_000);
    let flag = router(
        engine(&fixture_model("qwen2-embed-chat"), |c| {
            c.models[0].chat_template = Some(chat["vllm_test_template"].as_str().unwrap().into())
        }),
        2_000_000,
    );
    for case in chat["cases"].as_array().unwrap() {
        let messages = &chat["conversations"][case["conversation"].as_str().unwrap()];
        let router = if case["template"] == "folder" { &folder } else { &flag };
        let ids = tokens(router, messages, &case["options"]).await;
        let want: Vec<u64> = case["input_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        assert_eq!(ids, want, "{} / {} / {}: {:?}", case["conversation"], case["template"], case["options"], case["text"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_errors_are_client_errors() {
    let router = router(engine(&fixture_model("qwen2-embed-chat"), |_| {}), 2_000_000);
    // The template's own raise_exception, in its words.
    let reply = post(&router, "/v1/embeddings", json!({"messages": [{"role": "robot", "content": "x"}]})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.body["error"]["message"], "Unknown role: robot");
    // A model without a template.
    let plain = router_for("qwen2-embed-last");
    let reply = post(&plain, "/v1/embeddings", json!({"messages": [{"role": "user", "content": "x"}]})).await;
    assert!(reply.body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("As of transformers v4.44, default chat template is no longer allowed"));
    // Batched conversations: one embedding each, each equal to its own request's.
    let one = json!([{"role": "user", "content": "first"}]);
    let two = json!([{"role": "user", "content": "second"}]);
    let batch = post(&router, "/v1/embeddings", json!({"messages": [one, two]})).await;
    assert_eq!(batch.body["data"].as_array().unwrap().len(), 2, "{}", batch.body);
    let alone = post(&router, "/v1/embeddings", json!({"messages": two})).await;
    assert_close(&floats(&batch.body["data"][1]["embedding"]), &floats(&alone.body["data"][0]["embedding"]), "second conversation");
    // A conversation sent as `input` reads as `messages`.
    let as_input = post(&router, "/v1/embeddings", json!({"input": two})).await;
    assert_eq!(as_input.body["data"][0]["embedding"], alone.body["data"][0]["embedding"]);
}

fn router_for(name: &str) -> axum::Router {
    router(engine(&fixture_model(name), |_| {}), 2_000_000)
}
