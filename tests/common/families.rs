//! The family checks of the parity tests (encoder and decoder families): a fixture model
//! through the real router against its reference in tests/fixtures/expected, every input alone
//! and all in one request; and a broken folder of a family as a one-line startup error.

use super::*;
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::path::Path;

pub const TOLERANCE: f32 = 1e-4;

pub fn router_for(model: &Path) -> axum::Router {
    router(engine(model, |_| {}), 2_000_000)
}

pub fn texts(expected: &Value) -> Vec<Value> {
    expected["texts"].as_array().unwrap().iter().map(|t| t["text"].clone()).collect()
}

/// `/v1/embeddings`, every text alone and all in one request, against the reference embedding.
pub async fn check_embeddings(name: &str) {
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    let inputs = texts(&expected);
    let batched = post(&router, "/v1/embeddings", json!({"input": inputs})).await;
    assert_eq!(batched.status, StatusCode::OK, "{}", batched.body);
    let mut tokens = 0;
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let single = post(&router, "/v1/embeddings", json!({"input": case["text"]})).await;
        assert_eq!(single.status, StatusCode::OK, "{}", single.body);
        let reference = floats(&case["embedding"]);
        for (how, reply) in [("single", &single.body["data"][0]), ("batched", &batched.body["data"][i])] {
            let c = cosine(&floats(&reply["embedding"]), &reference);
            assert!(c >= 0.9999, "{name} text {i} {how}: cosine {c}");
        }
        tokens += case["input_ids"].as_array().unwrap().len();
    }
    assert_eq!(batched.body["usage"]["prompt_tokens"], tokens, "{name}: token counts are the reference tokenizer's");
}

/// `/classify`: probabilities and labels, alone and batched; raw logits with `use_activation: false`.
pub async fn check_classifier(name: &str) {
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    let batched = post(&router, "/classify", json!({"input": texts(&expected)})).await;
    assert_eq!(batched.status, StatusCode::OK, "{}", batched.body);
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let single = post(&router, "/classify", json!({"input": case["text"]})).await;
        let raw = post(&router, "/classify", json!({"input": case["text"], "use_activation": false})).await;
        for (how, item) in [("single", &single.body["data"][0]), ("batched", &batched.body["data"][i])] {
            let diff = max_abs_diff(&floats(&item["probs"]), &floats(&case["softmax"]));
            assert!(diff <= TOLERANCE, "{name} text {i} {how}: probabilities differ by {diff}");
            assert_eq!(item["label"], case["label"], "{name} text {i} {how}");
        }
        let diff = max_abs_diff(&floats(&raw.body["data"][0]["probs"]), &floats(&case["logits"]));
        assert!(diff <= TOLERANCE, "{name} text {i}: logits differ by {diff}");
    }
}

/// `/score` and `/rerank` on a cross-encoder: the pair's tokens and segment ids, its score
/// alone and in an N:N batch, and the raw logit.
pub async fn check_cross_encoder(name: &str) {
    check_cross_encoder_on(name, &router_for(&fixture_model(name))).await
}

/// [`check_cross_encoder`] on a router already serving the fixture (with its overrides).
pub async fn check_cross_encoder_on(name: &str, router: &axum::Router) {
    let expected = expected(name);
    let pairs = expected["pairs"].as_array().unwrap();
    let queries: Vec<&Value> = pairs.iter().map(|p| &p["query"]).collect();
    let documents: Vec<&Value> = pairs.iter().map(|p| &p["document"]).collect();
    let batched = post(router, "/score", json!({"data_1": queries, "data_2": documents})).await;
    assert_eq!(batched.status, StatusCode::OK, "{}", batched.body);
    let mut tokens = 0;
    for (i, pair) in pairs.iter().enumerate() {
        let single = post(router, "/score", json!({"text_1": pair["query"], "text_2": pair["document"]})).await;
        let raw = post(router, "/score", json!({"text_1": pair["query"], "text_2": pair["document"], "use_activation": false})).await;
        let want = pair["score"].as_f64().unwrap();
        for (how, got) in [("single", &single.body["data"][0]["score"]), ("batched", &batched.body["data"][i]["score"])] {
            let got = got.as_f64().unwrap_or(f64::NAN);
            assert!((got - want).abs() <= TOLERANCE as f64, "{name} pair {i} {how}: {got} vs {want}");
        }
        let logit = raw.body["data"][0]["score"].as_f64().unwrap_or(f64::NAN);
        assert!((logit - pair["logit"].as_f64().unwrap()).abs() <= TOLERANCE as f64, "{name} pair {i}: logit {logit}");
        assert_eq!(single.body["usage"]["prompt_tokens"], pair["input_ids"].as_array().unwrap().len(), "{name} pair {i}: token count");
        tokens += pair["input_ids"].as_array().unwrap().len();
    }
    assert_eq!(batched.body["usage"]["prompt_tokens"], tokens);
    // /rerank orders the documents of the first query by the same scores.
    let first = &pairs[0]["query"];
    let same_query: Vec<(usize, &Value)> = pairs.iter().enumerate().filter(|(_, p)| &p["query"] == first).collect();
    let docs: Vec<&Value> = same_query.iter().map(|(_, p)| &p["document"]).collect();
    let reply = post(router, "/rerank", json!({"query": first, "documents": docs})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for result in reply.body["results"].as_array().unwrap() {
        let index = result["index"].as_u64().unwrap() as usize;
        let want = same_query[index].1["score"].as_f64().unwrap();
        assert!((result["relevance_score"].as_f64().unwrap() - want).abs() <= TOLERANCE as f64, "{name} rerank {index}");
    }
}

/// `/pooling` token_classify: probabilities per token, alone and batched.
pub async fn check_token_classifier(name: &str) {
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    let batched = post(&router, "/pooling", json!({"input": texts(&expected), "task": "token_classify"})).await;
    assert_eq!(batched.status, StatusCode::OK, "{}", batched.body);
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let single = post(&router, "/pooling", json!({"input": case["text"], "task": "token_classify"})).await;
        let reference = case["softmax"].as_array().unwrap();
        for (how, item) in [("single", &single.body["data"][0]["data"]), ("batched", &batched.body["data"][i]["data"])] {
            let rows = item.as_array().unwrap();
            assert_eq!(rows.len(), reference.len(), "{name} text {i} {how}: one row per token");
            for (t, (row, want)) in rows.iter().zip(reference).enumerate() {
                let diff = max_abs_diff(&floats(row), &floats(want));
                assert!(diff <= TOLERANCE, "{name} text {i} {how} token {t}: {diff}");
            }
        }
    }
}

/// Starting the real binary on a copy of `name` broken by `damage` fails with one line naming
/// the problem.
pub fn broken_folder_is_one_line(name: &str, damage: impl FnOnce(&Path), expect: &str) {
    let dir = std::env::temp_dir().join(format!("poolserve-broken-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&fixture_model(name), &dir);
    damage(&dir);
    let (ok, stderr) = server::run_to_exit(&["serve", dir.to_str().unwrap(), "--port", "0"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{name}: a broken folder must not start");
    let error: Vec<&str> = stderr.lines().filter(|l| l.contains("Error") || l.contains("error")).collect();
    assert_eq!(error.len(), 1, "{name}: one error line, got:\n{stderr}");
    assert!(error[0].contains(expect), "{name}: `{}` should say `{expect}`", error[0]);
}

/// A damage for [`broken_folder_is_one_line`]: sets `field` of the folder's JSON file `file`
/// (`config.json`, `1_Dense/config.json`, …) to `value`.
pub fn set_json(file: &'static str, field: &'static str, value: Value) -> impl FnOnce(&Path) {
    move |dir| {
        let path = dir.join(file);
        let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json[field] = value;
        std::fs::write(&path, json.to_string()).unwrap();
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Drops one tensor from a folder's model.safetensors (rewritten without it).
pub fn drop_tensor(dir: &Path, name_part: &str) {
    let path = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let before = tensors.len();
    tensors.retain(|name, _| !name.contains(name_part));
    assert!(tensors.len() < before, "no tensor named like {name_part}");
    candle_core::safetensors::save(&tensors, &path).unwrap();
}
