//! A MiniLM-sized cross-encoder built from all-MiniLM-L6-v2: its encoder under the `bert.`
//! prefix, its pooler, and a deterministic one-logit `classifier`, saved as a standard
//! `BertForSequenceClassification` folder. Real cross-encoders (ms-marco-MiniLM-L6-v2) have
//! exactly this shape, but none can be fetched without the hub; the scores mean nothing, the
//! shapes, tokenizer and numerics are real. Used by the real-size parity test and the rerank
//! benchmark (included with `#[path]`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Builds (once) the folder under `out` and returns it.
pub fn minilm_cross_encoder(minilm: &Path, out: &Path) -> PathBuf {
    let dir = out.join("minilm-cross-encoder");
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    let tmp = out.join(format!("minilm-cross-encoder.tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("create folder");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(minilm.join("config.json")).expect("config.json")).expect("json");
    config["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
    config["id2label"] = serde_json::json!({"0": "LABEL_0"});
    config["label2id"] = serde_json::json!({"LABEL_0": 0});
    std::fs::write(tmp.join("config.json"), config.to_string()).expect("write config");
    for file in ["tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"] {
        std::fs::copy(minilm.join(file), tmp.join(file)).expect("copy tokenizer file");
    }
    let device = candle_core::Device::Cpu;
    let encoder = candle_core::safetensors::load(minilm.join("model.safetensors"), &device).expect("weights");
    let hidden = config["hidden_size"].as_u64().expect("hidden_size") as usize;
    let mut tensors: HashMap<String, candle_core::Tensor> = encoder.into_iter().map(|(name, t)| (format!("bert.{name}"), t)).collect();
    let weight: Vec<f32> = (0..hidden).map(|j| ((j * 37 % 19) as f32 - 9.0) / 40.0).collect();
    tensors.insert("classifier.weight".into(), candle_core::Tensor::from_vec(weight, (1, hidden), &device).expect("tensor"));
    tensors.insert("classifier.bias".into(), candle_core::Tensor::from_vec(vec![0.1f32], 1, &device).expect("tensor"));
    candle_core::safetensors::save(&tensors, tmp.join("model.safetensors")).expect("save weights");
    // Another process may have finished first; either folder is the same.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    dir
}
