//! Chat templates and the messages they render: a request may carry its own template
//! (`--trust-request-chat-template`) and always carries its messages. The data before the first
//! NUL is a template, the rest the messages (JSON; text that is not JSON becomes one user
//! message). Each renders with the request's template and with a real model's (Qwen2's), under
//! minijinja's fuel: an answer or an error, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolserve::input::chat_template::{ChatOptions, ChatTemplate};
use std::sync::LazyLock;

static QWEN2: LazyLock<ChatTemplate> = LazyLock::new(|| {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/qwen2-embed-chat/tokenizer_config.json");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).expect("json");
    let source = config["chat_template"].as_str().map(str::to_string);
    ChatTemplate::new(source, &config, None).expect("the fixture's template compiles")
});

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, rest) = text.split_once('\0').unwrap_or(("{{ messages }}", &text));
    let messages: Vec<serde_json::Value> = match serde_json::from_str(rest) {
        Ok(serde_json::Value::Array(messages)) => messages,
        Ok(other) => vec![other],
        Err(_) => vec![serde_json::json!({"role": "user", "content": rest})],
    };
    for options in [ChatOptions::default(), ChatOptions { add_generation_prompt: true, ..ChatOptions::default() }] {
        let _ = QWEN2.render(&messages, &options);
        let _ = QWEN2.render_source(source, &messages, &options);
    }
});
