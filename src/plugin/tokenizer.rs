//! The model's tokenizer as a plugin sees it (its renderer's `get_tokenizer()`, host.py's
//! `Tokenizer`): what the host is told at start (the special tokens, the vocabulary's size, the
//! SentencePiece space marker) and the calls it makes over the pipe while a request runs
//! (encode, decode, ids to tokens and back), answered by the server's own tokenizer. So a plugin
//! needs no Python tokenizer package, and sees the very tokens the model runs on.

use crate::input::tokenizer::{special_token, EncodeOptions, PairLimits, TextTokenizer, TruncationSide};
use serde_json::{json, Value};
use std::path::Path;

/// transformers' special-token roles, as attributes of the tokenizer (`cls_token`,
/// `cls_token_id`, …).
const ROLES: [&str; 7] = ["unk", "mask", "cls", "sep", "pad", "bos", "eos"];

/// What the host's tokenizer knows without asking: each role's token (`tokenizer_config.json`
/// in the model's tokenizer folder) and id, the vocabulary's size with added tokens, the space
/// marker, `model_max_length`.
pub fn describe(text: &TextTokenizer, folder: Option<&Path>) -> Value {
    let config: Value = folder
        .and_then(|dir| std::fs::read_to_string(dir.join("tokenizer_config.json")).ok())
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let mut special = serde_json::Map::new();
    for role in ROLES {
        let token = special_token(&config, &format!("{role}_token"));
        let id = token.as_deref().and_then(|t| text.token_id(t));
        special.insert(format!("{role}_token"), json!(token));
        special.insert(format!("{role}_token_id"), json!(id));
    }
    json!({
        "special": special,
        "vocab_size": text.vocab_size(),
        "leading_space_marker": text.leading_space_marker(),
        "model_max_length": config.get("model_max_length").filter(|v| v.is_u64()),
    })
}

/// The answer to one of the host's tokenizer calls: `{"ok": true, "result": …}`, or
/// `{"ok": false, "message": …}`, which the host raises as a ValueError in the plugin.
pub fn answer(text: &TextTokenizer, call: &Value) -> Value {
    match answer_method(text, call) {
        Ok(result) => json!({"ok": true, "result": result}),
        Err(message) => json!({"ok": false, "message": message}),
    }
}

fn answer_method(text: &TextTokenizer, call: &Value) -> Result<Value, String> {
    let flag = |name: &str, default: bool| call[name].as_bool().unwrap_or(default);
    match call["method"].as_str().unwrap_or_default() {
        "encode" => {
            let input = call["text"].as_str().ok_or("encode takes a string")?;
            let options = EncodeOptions {
                add_special_tokens: flag("add_special_tokens", true),
                truncate_to: None,
                side: TruncationSide::Right,
                pair_limits: PairLimits::default(),
            };
            let encoded = text.encode(input, options).map_err(|e| e.to_string())?;
            Ok(json!(encoded.ids))
        }
        "decode" => Ok(json!(text.decode(&ids(&call["ids"])?, flag("skip_special_tokens", false)).map_err(|e| e.to_string())?)),
        // Each id alone (vLLM's convert_ids_list_to_tokens), in one call.
        "decode_each" => {
            let each: Result<Vec<String>, String> =
                ids(&call["ids"])?.iter().map(|&id| text.decode(&[id], false).map_err(|e| e.to_string())).collect();
            Ok(json!(each?))
        }
        "ids_to_tokens" => {
            let ids = ids(&call["ids"])?;
            let tokens: Vec<Option<String>> = ids.iter().map(|&id| text.token_string(id)).collect();
            Ok(json!(tokens))
        }
        "tokens_to_ids" => {
            let tokens = call["tokens"].as_array().ok_or("convert_tokens_to_ids takes a list of strings")?;
            let ids: Result<Vec<Option<u32>>, String> =
                tokens.iter().map(|t| t.as_str().map(|t| text.token_id(t)).ok_or_else(|| "a token is not a string".to_string())).collect();
            Ok(json!(ids?))
        }
        other => Err(format!("the server's tokenizer has no method {other:?}")),
    }
}

fn ids(value: &Value) -> Result<Vec<u32>, String> {
    let listed = value.as_array().ok_or("token ids must be a list of integers")?;
    listed.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| format!("{id} is not a token id"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> (TextTokenizer, PathBuf) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name);
        (TextTokenizer::from_file(&dir.join("tokenizer.json"), false, false).expect("fixture tokenizer"), dir)
    }

    #[test]
    fn the_host_is_told_the_special_tokens_and_the_space_marker() {
        let (text, dir) = fixture("bge-m3-tiny");
        let told = describe(&text, Some(&dir));
        assert_eq!(told["special"]["cls_token"], "<s>");
        assert_eq!(told["special"]["cls_token_id"], 0);
        assert_eq!(told["special"]["mask_token_id"], json!(text.token_id("<mask>")));
        assert_eq!(told["leading_space_marker"], "\u{2581}");
        // WordPiece has no marker.
        let (bert, dir) = fixture("bert-embed-mean");
        assert!(describe(&bert, Some(&dir))["leading_space_marker"].is_null());
    }

    #[test]
    fn calls_are_answered_or_refused_in_one_line() {
        let (text, _) = fixture("bge-m3-tiny");
        let call = |c: Value| answer(&text, &c);
        let ids = call(json!({"call": "tokenizer", "method": "encode", "text": "What is BGE M3?", "add_special_tokens": true}));
        assert_eq!(ids["ok"], true);
        let listed: Vec<u32> = serde_json::from_value(ids["result"].clone()).unwrap();
        assert_eq!(listed.first(), Some(&0));
        let decoded = call(json!({"method": "decode", "ids": listed, "skip_special_tokens": true}));
        assert_eq!(decoded["result"], "What is BGE M3?");
        let tokens = call(json!({"method": "ids_to_tokens", "ids": [0, 4_000_000]}));
        assert_eq!(tokens["result"], json!(["<s>", null]));
        let back = call(json!({"method": "tokens_to_ids", "tokens": ["<s>", "no such piece"]}));
        assert_eq!(back["result"], json!([0, null]));
        let each = call(json!({"method": "decode_each", "ids": &listed[1..3]}));
        assert_eq!(each["result"].as_array().map(Vec::len), Some(2));
        for refused in [json!({"method": "encode"}), json!({"method": "decode", "ids": [-1]}), json!({"method": "train"})] {
            let reply = call(refused.clone());
            assert_eq!(reply["ok"], false, "{refused}");
            assert!(reply["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }
}
