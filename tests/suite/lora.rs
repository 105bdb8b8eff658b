//! LoRA adapters through the real router: each adapter's outputs against PEFT's merged model
//! (tests/fixtures/make_lora_adapters.py), concurrent requests for the base and three adapters
//! sharing batches, int8 and bf16 bases, /v1/models, the load/unload routes and their gate,
//! refusals, the library and the batch command.

use crate::common;

use crate::common::{cosine, fixture_model, post, send};
use axum::http::StatusCode;
use poolserve::api::{self, ApiOptions, AppState};
use poolserve::config::ServerConfig;
use poolserve::engine::Engine;
use poolserve::loader::lora::{LoraModule, LoraOptions};
use serde_json::{json, Value};
use std::path::PathBuf;

fn adapter_dir(base: &str, adapter: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora").join(base).join(adapter)
}

/// The reference entries of `base`'s adapters.
fn references(base: &str) -> Vec<Value> {
    common::expected("lora")["adapters"].as_array().expect("adapters").iter().filter(|a| a["base"] == base).cloned().collect()
}

fn texts() -> Vec<String> {
    common::expected("lora")["texts"].as_array().expect("texts").iter().map(|t| t.as_str().expect("text").to_string()).collect()
}

fn rows(v: &Value) -> Vec<Vec<f32>> {
    v.as_array().expect("rows").iter().map(common::floats).collect()
}

/// `base` serving `adapters` (each under its fixture name), up to `max_loras` per batch.
fn lora_config(base: &str, adapters: &[&str], max_loras: usize, tweak: impl FnOnce(&mut ServerConfig)) -> ServerConfig {
    common::config_for(&fixture_model(base), |config| {
        config.models[0].served_name = base.to_string();
        config.models[0].lora = Some(LoraOptions {
            modules: adapters
                .iter()
                .map(|a| LoraModule {
                    name: a.to_string(),
                    path: adapter_dir(base, a).to_str().expect("utf-8").to_string(),
                    base_model_name: None,
                })
                .collect(),
            max_loras,
            max_lora_rank: 16,
        });
        tweak(config);
    })
}

fn load(config: &ServerConfig) -> Engine {
    Engine::load(&config.models[0], &config.engine).expect("model with adapters loads")
}

fn app(engine: Engine, runtime_updates: bool) -> axum::Router {
    api::router(
        AppState::ready_with(engine, ApiOptions { allow_runtime_lora_updating: runtime_updates, ..ApiOptions::default() }),
        2_000_000,
    )
}

async fn embed(router: &axum::Router, model: &str, input: Value) -> Vec<Vec<f32>> {
    let reply = post(router, "/v1/embeddings", json!({"model": model, "input": input})).await;
    assert_eq!(reply.status, StatusCode::OK, "{model}: {}", reply.body);
    assert_eq!(reply.body["model"], model);
    reply.body["data"].as_array().expect("data").iter().map(|d| common::floats(&d["embedding"])).collect()
}

fn assert_matches(ours: &[Vec<f32>], reference: &[Vec<f32>], bar: f64, what: &str) {
    for (i, (o, r)) in ours.iter().zip(reference).enumerate() {
        let c = cosine(o, r);
        assert!(c >= bar, "{what}, text {i}: cosine {c} < {bar}");
    }
}

/// Every embedder adapter of every base, all texts in one request, against PEFT's merged model.
#[tokio::test]
async fn every_adapter_matches_peft_merged_model() {
    for base in ["bert-embed-cls", "xlmr-embed-cls", "qwen3-embed-last"] {
        let refs = references(base);
        let names: Vec<String> = refs.iter().map(|r| r["adapter"].as_str().expect("name").to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let router = app(load(&lora_config(base, &names, 4, |_| {})), false);
        for r in &refs {
            let name = r["adapter"].as_str().expect("name");
            let ours = embed(&router, name, json!(texts())).await;
            assert_matches(&ours, &rows(&r["embeddings"]), 0.9999, &format!("{base}/{name}"));
        }
        let base_ref = rows(&common::expected("lora")["base_embeddings"][base]);
        assert_matches(&embed(&router, base, json!(texts())).await, &base_ref, 0.9999, &format!("{base} without an adapter"));
    }
}

/// A classifier's adapter (its head stays the base's): probabilities within 1e-4 of the
/// merged model's softmax.
#[tokio::test]
async fn a_classifier_adapter_matches_peft_probabilities() {
    let router = app(load(&lora_config("bert-seqcls", &["qv"], 1, |_| {})), false);
    let reference = &references("bert-seqcls")[0];
    let reply = post(&router, "/classify", json!({"model": "qv", "input": texts()})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (i, (data, expected)) in reply.body["data"].as_array().expect("data").iter().zip(rows(&reference["probabilities"])).enumerate() {
        let diff = common::max_abs_diff(&common::floats(&data["probs"]), &expected);
        assert!(diff <= 1e-4, "text {i}: probabilities differ by {diff}");
    }
}

/// `rows` against `expected` within 1e-4, value by value.
fn assert_probabilities(ours: &[Vec<f32>], expected: &[Vec<f32>], what: &str) {
    assert_eq!(ours.len(), expected.len(), "{what}: row count");
    for (i, (o, e)) in ours.iter().zip(expected).enumerate() {
        let diff = common::max_abs_diff(o, e);
        assert!(diff <= 1e-4, "{what}, row {i}: differs by {diff}");
    }
}

/// Adapters that save their classifier head (PEFT's `modules_to_save`: SEQ_CLS and TOKEN_CLS
/// adapters, one with the BERT pooler too): each runs its own head over its own hidden states,
/// against the merged model's probabilities; `/score` pairs through a cross-encoder adapter's
/// head; requests for an adapter with its own head and one without share batches.
#[tokio::test]
async fn adapters_with_their_own_classifier_head_match_peft() {
    for base in ["bert-seqcls", "xlmr-reranker", "qwen3-seqcls"] {
        let reference = references(base).into_iter().find(|r| r["adapter"] == "head").expect("head adapter");
        assert!(!reference["saved_modules"].as_array().expect("saved").is_empty(), "{base}: the fixture saves no head");
        let router = app(load(&lora_config(base, &["head"], 1, |_| {})), false);
        let reply = post(&router, "/classify", json!({"model": "head", "input": texts()})).await;
        assert_eq!(reply.status, StatusCode::OK, "{base}: {}", reply.body);
        let ours: Vec<Vec<f32>> = reply.body["data"].as_array().expect("data").iter().map(|d| common::floats(&d["probs"])).collect();
        assert_probabilities(&ours, &rows(&reference["probabilities"]), &format!("{base}/head"));
        if let Some(pairs) = reference.get("pair_scores") {
            let reply = post(&router, "/score", json!({"model": "head", "text_1": texts()[0], "text_2": texts()})).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            let ours: Vec<f32> =
                reply.body["data"].as_array().expect("data").iter().map(|d| d["score"].as_f64().expect("score") as f32).collect();
            assert_probabilities(&[ours], &[common::floats(pairs)], &format!("{base}/head pairs"));
        }
    }

    let reference = references("bert-tokcls").into_iter().find(|r| r["adapter"] == "head").expect("head adapter");
    let router = app(load(&lora_config("bert-tokcls", &["head"], 1, |_| {})), false);
    for (text, expected) in texts().iter().zip(reference["probabilities"].as_array().expect("texts")) {
        let reply = post(&router, "/pooling", json!({"model": "head", "input": text})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let ours: Vec<Vec<f32>> = reply.body["data"][0]["data"].as_array().expect("rows").iter().map(common::floats).collect();
        assert_probabilities(&ours, &rows(expected), "bert-tokcls/head");
    }

    // One server, two adapters of one classifier (own head, base head), requests at once.
    let router = app(load(&lora_config("bert-seqcls", &["head", "qv"], 2, |_| {})), false);
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..16 {
        let adapter = ["head", "qv"][i % 2];
        let text = i / 2 % texts().len();
        let router = router.clone();
        requests.spawn(async move {
            let reply = post(&router, "/classify", json!({"model": adapter, "input": texts()[text]})).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            (adapter, text, common::floats(&reply.body["data"][0]["probs"]))
        });
    }
    let all = references("bert-seqcls");
    for (adapter, text, ours) in requests.join_all().await {
        let reference = all.iter().find(|r| r["adapter"] == adapter).expect("reference");
        assert_probabilities(&[ours], &[rows(&reference["probabilities"])[text].clone()], &format!("mixed batch, {adapter} text {text}"));
    }
}

/// Saved modules the server cannot apply per adapter are refused, naming them: a head on a
/// model without one, and a backbone weight (shared by every adapter of a batch).
#[tokio::test]
async fn saved_modules_outside_a_classifier_head_are_refused() {
    let with_saved = |what: &str, base: &str, adapter: &str, module: &str, key: &str, shape: (usize, usize)| -> PathBuf {
        let dir = scratch(what);
        let source = adapter_dir(base, adapter);
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(source.join("adapter_config.json")).expect("config")).expect("json");
        let mut saved: Vec<Value> = config["modules_to_save"].as_array().cloned().unwrap_or_default();
        saved.push(json!(module));
        config["modules_to_save"] = json!(saved);
        std::fs::write(dir.join("adapter_config.json"), config.to_string()).expect("write");
        let mut tensors =
            candle_core::safetensors::load(source.join("adapter_model.safetensors"), &candle_core::Device::Cpu).expect("load");
        let zeros = candle_core::Tensor::zeros(shape, candle_core::DType::F32, &candle_core::Device::Cpu).expect("tensor");
        tensors.insert(key.to_string(), zeros.squeeze(0).expect("squeeze"));
        candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).expect("save");
        dir
    };
    let cases = [
        (
            "bert-embed-cls",
            with_saved("head-on-embedder", "bert-embed-cls", "ffn", "classifier", "base_model.model.classifier.weight", (3, 32)),
            "modules_to_save replaces [\"classifier.weight\"], but this model serves no classifier head to replace",
        ),
        (
            "bert-seqcls",
            with_saved("layer-norm", "bert-seqcls", "head", "LayerNorm", "base_model.model.bert.embeddings.LayerNorm.weight", (1, 32)),
            "modules_to_save replaces [\"bert.embeddings.LayerNorm.weight\"], outside the classifier head: not supported",
        ),
        (
            "bert-seqcls",
            with_saved("wrong-shape", "bert-seqcls", "head", "classifier", "base_model.model.classifier.weight", (5, 32)),
            "its modules_to_save do not fit this model's classifier head",
        ),
    ];
    for (base, dir, message) in cases {
        let router = app(load(&lora_config(base, &[], 1, |_| {})), true);
        let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "bad", "lora_path": dir})).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{message}: {}", reply.body);
        let got = reply.body["error"]["message"].as_str().expect("message");
        assert!(got.contains(message), "expected `{message}` in `{got}`");
    }
}

/// 32 one-text requests at once over the base and three adapters: batches mix them, and each
/// request gets its own model's vector. With max_loras 2, batches are split by adapter count,
/// with the same answers.
#[tokio::test]
async fn concurrent_requests_for_the_base_and_three_adapters_keep_their_own_model() {
    let base = "bert-embed-cls";
    let texts = texts();
    let mut expected: Vec<(String, Vec<Vec<f32>>)> = vec![(base.to_string(), rows(&common::expected("lora")["base_embeddings"][base]))];
    for r in references(base) {
        expected.push((r["adapter"].as_str().expect("name").to_string(), rows(&r["embeddings"])));
    }
    // The test means something only if the four models' vectors differ.
    for (a, b) in [(0, 1), (1, 2), (2, 3), (0, 3)] {
        assert!(cosine(&expected[a].1[0], &expected[b].1[0]) < 0.99, "{} and {} embed alike", expected[a].0, expected[b].0);
    }
    for max_loras in [4, 2] {
        let router = app(load(&lora_config(base, &["all-dense", "qv-rslora", "ffn"], max_loras, |_| {})), false);
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..32 {
            let (model, refs) = expected[i % 4].clone();
            let text = i / 4 % texts.len();
            let router = router.clone();
            let input = texts[text].clone();
            requests.spawn(async move { (model.clone(), text, embed(&router, &model, json!(input)).await.remove(0), refs[text].clone()) });
        }
        for (model, text, ours, reference) in requests.join_all().await {
            let c = cosine(&ours, &reference);
            assert!(c >= 0.9999, "max_loras {max_loras}: `{model}` text {text} got cosine {c} to its own reference");
        }
    }
}

/// Adapters on an int8 base (LoRA in f32) and on a bf16-packed base, at the bars of those
/// precisions: int8's 0.999; bf16 0.9995, as these random adapters move the activations far
/// from the base's (the base fixture alone stays above 0.9999 in bf16; measured 0.99989 here).
#[tokio::test]
async fn int8_and_bfloat16_bases_take_adapters() {
    use poolserve::loader::options::{DTypeArg, Quantization};
    let base = "bert-embed-cls";
    let reference = &references(base)[0];
    let name = reference["adapter"].as_str().expect("name");
    for (what, bar, tweak) in [
        (
            "int8",
            0.999,
            Box::new(|c: &mut ServerConfig| c.models[0].quantization = Some(Quantization::Int8)) as Box<dyn FnOnce(&mut ServerConfig)>,
        ),
        ("bf16", 0.9995, Box::new(|c: &mut ServerConfig| c.models[0].dtype = DTypeArg::Bfloat16)),
    ] {
        let router = app(load(&lora_config(base, &[name], 1, tweak)), false);
        let ours = embed(&router, name, json!(texts())).await;
        assert_matches(&ours, &rows(&reference["embeddings"]), bar, &format!("{what} base, adapter {name}"));
    }
}

#[tokio::test]
async fn models_lists_each_adapter_with_its_parent() {
    let router = app(load(&lora_config("bert-embed-cls", &["ffn", "all-dense"], 1, |_| {})), false);
    let reply = send(&router, "GET", "/v1/models", None, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let cards = reply.body["data"].as_array().expect("cards");
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().expect("id")).collect();
    assert_eq!(ids, ["bert-embed-cls", "all-dense", "ffn"]);
    assert_eq!(cards[0]["parent"], Value::Null);
    assert_eq!(cards[1]["parent"], "bert-embed-cls");
    assert_eq!(cards[2]["root"], adapter_dir("bert-embed-cls", "ffn").to_str().expect("utf-8"));
}

/// vLLM's load/unload routes: absent without the switch (404), then every answer of theirs.
#[tokio::test]
async fn adapters_load_and_unload_at_run_time() {
    let config = lora_config("bert-embed-cls", &[], 2, |_| {});
    let engine = load(&config);
    let path = adapter_dir("bert-embed-cls", "qv-rslora").to_str().expect("utf-8").to_string();
    let gated = app(engine.clone(), false);
    let reply = post(&gated, "/v1/load_lora_adapter", json!({"lora_name": "x", "lora_path": path})).await;
    // Not registered: the server's answer for any unknown path.
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.body["error"]["message"], "Not Found");

    let router = app(engine, true);
    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "tenant", "lora_path": path})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body, "Success: LoRA adapter 'tenant' added successfully.");
    let reference = references("bert-embed-cls").into_iter().find(|r| r["adapter"] == "qv-rslora").expect("reference");
    assert_matches(&embed(&router, "tenant", json!(texts())).await, &rows(&reference["embeddings"]), 0.9999, "loaded at run time");

    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "tenant", "lora_path": path})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.body["error"]["message"],
        "The lora adapter 'tenant' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
    );
    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "tenant", "lora_path": path, "load_inplace": true})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "", "lora_path": path})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["error"]["message"], "Both 'lora_name' and 'lora_path' must be provided.");
    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "nope", "lora_path": "/no/such/adapter"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.body["error"]["message"], "Loading lora nope failed: No adapter found for /no/such/adapter");
    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "bert-embed-cls", "lora_path": path})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "an adapter may not take a served model's name");

    let reply = post(&router, "/v1/unload_lora_adapter", json!({"lora_name": "tenant"})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "Success: LoRA adapter 'tenant' removed successfully.");
    let reply = post(&router, "/v1/unload_lora_adapter", json!({"lora_name": "tenant"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.body["error"]["message"], "The lora adapter 'tenant' cannot be found.");
    let reply = post(&router, "/v1/unload_lora_adapter", json!({"lora_name": ""})).await;
    assert_eq!(reply.body["error"]["message"], "'lora_name' needs to be provided to unload a LoRA adapter.");
    let reply = post(&router, "/v1/embeddings", json!({"model": "tenant", "input": "hi"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.body["error"]["message"], "The model `tenant` does not exist.");
}

#[tokio::test]
async fn the_adapter_routes_sit_behind_the_api_key() {
    let engine = load(&lora_config("bert-embed-cls", &[], 1, |_| {}));
    let options = ApiOptions { api_keys: vec!["k".into()], allow_runtime_lora_updating: true, ..ApiOptions::default() };
    let router = api::router(AppState::ready_with(engine, options), 2_000_000);
    let body = json!({"lora_name": "t", "lora_path": "/x"}).to_string();
    let reply = send(&router, "POST", "/v1/load_lora_adapter", Some(body.clone()), &[]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let reply = send(&router, "POST", "/v1/load_lora_adapter", Some(body), &[("authorization", "Bearer k")]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "authorized: the path is checked");
}

/// A fresh folder under target/, named after `what`.
fn scratch(what: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("lora-{what}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// A copy of the `ffn` adapter in `scratch(what)` with its config changed by `edit`.
fn edited_adapter(what: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let dir = scratch(what);
    let source = adapter_dir("bert-embed-cls", "ffn");
    std::fs::copy(source.join("adapter_model.safetensors"), dir.join("adapter_model.safetensors")).expect("copy");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("adapter_config.json")).expect("config")).expect("json");
    edit(&mut config);
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).expect("write");
    dir
}

/// What cannot be applied is refused at load, naming it.
#[tokio::test]
async fn unsupported_adapters_are_refused_with_the_reason() {
    let router = app(load(&lora_config("bert-embed-cls", &[], 1, |_| {})), true);
    let cases: Vec<(PathBuf, &str)> = vec![
        (edited_adapter("dora", |c| c["use_dora"] = json!(true)), "DoRA (use_dora) is not supported."),
        (edited_adapter("rank", |c| c["r"] = json!(32)), "LoRA rank 32 is greater than max_lora_rank 16."),
        (edited_adapter("ia3", |c| c["peft_type"] = json!("IA3")), "PEFT type IA3 is not supported"),
        (edited_adapter("bias", |c| c["bias"] = json!("all")), "Adapter bias is not supported."),
    ];
    for (dir, message) in &cases {
        let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "bad", "lora_path": dir})).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{message}: {}", reply.body);
        let got = reply.body["error"]["message"].as_str().expect("message");
        assert!(got.contains(message), "expected `{message}` in `{got}`");
    }
    // An adapter trained on a module this model does not run.
    let dir = scratch("embeddings");
    std::fs::copy(adapter_dir("bert-embed-cls", "ffn").join("adapter_config.json"), dir.join("adapter_config.json")).expect("copy");
    let zeros =
        |shape: (usize, usize)| candle_core::Tensor::zeros(shape, candle_core::DType::F32, &candle_core::Device::Cpu).expect("tensor");
    let tensors = std::collections::HashMap::from([
        ("base_model.model.embeddings.word_embeddings.lora_A.weight".to_string(), zeros((4, 809))),
        ("base_model.model.embeddings.word_embeddings.lora_B.weight".to_string(), zeros((32, 4))),
    ]);
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).expect("save");
    let reply = post(&router, "/v1/load_lora_adapter", json!({"lora_name": "bad", "lora_path": dir})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let got = reply.body["error"]["message"].as_str().expect("message");
    assert!(
        got.contains("LoRA on `embeddings.word_embeddings` is not supported: adapters of this model may train its dense layers"),
        "{got}"
    );
    // None of the refused adapters was registered.
    let reply = post(&router, "/v1/embeddings", json!({"model": "bad", "input": "hi"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

/// `--lora-modules` with an adapter that cannot be applied: the model does not start, and says why.
#[tokio::test]
async fn a_start_with_a_broken_adapter_fails_with_its_reason() {
    let dir = edited_adapter("start", |c| c["use_dora"] = json!(true));
    let config = common::config_for(&fixture_model("bert-embed-cls"), |c| {
        c.models[0].lora = Some(LoraOptions {
            modules: vec![LoraModule { name: "dora".into(), path: dir.to_str().expect("utf-8").into(), base_model_name: None }],
            ..LoraOptions::default()
        });
    });
    let err = Engine::load(&config.models[0], &config.engine).err().expect("refused");
    assert!(err.to_string().contains("LoRA adapter `dora`: DoRA (use_dora) is not supported."), "{err}");
}

/// The library: `with_adapter`, and an adapter loaded from code.
#[test]
fn the_library_runs_adapters() {
    use poolserve::library::{LocalModel, LocalModelOptions};
    let base = "bert-embed-cls";
    let mut options = LocalModelOptions::for_model(fixture_model(base).to_str().expect("utf-8"));
    options.model.lora = Some(LoraOptions { max_loras: 2, ..LoraOptions::default() });
    let model = LocalModel::load(options).expect("loads");
    model.load_adapter("ffn", adapter_dir(base, "ffn").to_str().expect("utf-8")).expect("adapter loads");
    let reference = references(base).into_iter().find(|r| r["adapter"] == "ffn").expect("reference");
    let texts = texts();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tuned = model.with_adapter("ffn").expect("adapter");
    let params = poolserve::engine::params::PoolingParams::default();
    assert_matches(&tuned.embed(&texts, &params).expect("embeds"), &rows(&reference["embeddings"]), 0.9999, "library");
    let base_ref = rows(&common::expected("lora")["base_embeddings"][base]);
    assert_matches(&model.embed(&texts, &params).expect("embeds"), &base_ref, 0.9999, "library base");
    assert!(model.with_adapter("nope").is_err());
}

/// Every family that takes adapters names its dense layers after the checkpoint's modules: each
/// site's module is a `<name>.weight` of the model file (what PEFT's keys are matched against).
#[test]
fn every_family_names_its_layers_after_the_checkpoint() {
    let families = [
        ("bert-embed-cls", 8),
        ("xlmr-embed-cls", 8),
        ("distilbert-seqcls", 0),
        ("mpnet-embed-mean", 0),
        ("electra-embed", 0),
        ("deberta-embed", 0),
        ("modernbert-embed-mean", 0),
        ("gte-embed-cls", 0),
        ("nomic-embed-mean", 0),
        ("jina-embed", 0),
        ("qwen2-embed-last", 0),
        ("qwen3-embed-last", 0),
        ("llama-embed-last", 0),
        ("mistral-embed-window", 0),
        ("gemma3-causal", 0),
        ("clip-tiny", 0),
        ("siglip-tiny", 0),
    ];
    for (family, at_least) in families {
        let dir = fixture_model(family);
        let mut options = poolserve::loader::options::ModelOptions::for_model(dir.to_str().expect("utf-8"));
        options.lora = Some(LoraOptions::default());
        let model = poolserve::loader::load(&options).unwrap_or_else(|e| panic!("{family}: {e}"));
        let sites = &model.lora.as_ref().expect("lora").sites;
        assert!(sites.len() >= at_least.max(1), "{family}: {} sites", sites.len());
        let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu).expect("weights");
        let names: std::collections::HashSet<String> = tensors.into_keys().collect();
        for part in sites.iter().flat_map(|s| &s.parts) {
            assert!(names.contains(&format!("{}.weight", part.name)), "{family}: `{}` is not a module of the checkpoint", part.name);
        }
    }
}

/// The real binary as a user starts it: vLLM's flags, the adapters answering over HTTP, one
/// more loaded through the route vLLM's variable opens; then the batch command with lines
/// naming an adapter.
#[test]
fn the_binary_serves_adapters_and_the_batch_command_runs_them() {
    use common::server;
    let base = "bert-embed-cls";
    let model = fixture_model(base);
    let all_dense = format!("all-dense={}", adapter_dir(base, "all-dense").display());
    let ffn = json!({"name": "ffn", "path": adapter_dir(base, "ffn"), "base_model_name": base}).to_string();
    let args = [
        model.to_str().expect("utf-8"),
        "--served-model-name",
        base,
        "--enable-lora",
        "--lora-modules",
        &all_dense,
        &ffn,
        "--max-loras",
        "4",
    ];
    let mut binary = server::start(&args, &[("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")]);
    server::wait_ready(&mut binary);
    let references = references(base);
    let reference = |name: &str| rows(&references.iter().find(|r| r["adapter"] == name).expect("reference")["embeddings"]);
    let path = adapter_dir(base, "qv-rslora");
    let answer = server::post(binary.port, "/v1/load_lora_adapter", json!({"lora_name": "qv-rslora", "lora_path": path}));
    assert_eq!((answer.status, answer.text()), (200, "Success: LoRA adapter 'qv-rslora' added successfully.".to_string()));
    for name in ["all-dense", "ffn", "qv-rslora"] {
        let answer = server::post(binary.port, "/v1/embeddings", json!({"model": name, "input": texts()}));
        assert_eq!(answer.status, 200, "{name}: {}", answer.text());
        let body = answer.json();
        assert_eq!(body["model"], name);
        let ours: Vec<Vec<f32>> = body["data"].as_array().expect("data").iter().map(|d| common::floats(&d["embedding"])).collect();
        assert_matches(&ours, &reference(name), 0.9999, &format!("binary, {name}"));
    }
    let models = server::request(binary.port, "GET", "/v1/models", None, &[]).expect("answer").json();
    let parents: Vec<&Value> = models["data"].as_array().expect("cards").iter().map(|c| &c["parent"]).collect();
    assert_eq!(parents, [&Value::Null, &json!(base), &json!(base), &json!(base)]);
    drop(binary);

    let dir = scratch("batch");
    let input = dir.join("in.jsonl");
    let lines: Vec<String> = texts()
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": i, "model": if i.is_multiple_of(2) { "ffn" } else { base }, "text": t}).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n")).expect("input");
    let output = dir.join("out.jsonl");
    let ffn_path = format!("ffn={}", adapter_dir(base, "ffn").display());
    let (ok, stderr) = server::run_to_exit(&[
        "embed",
        model.to_str().expect("utf-8"),
        "--served-model-name",
        base,
        "--enable-lora",
        "--lora-modules",
        &ffn_path,
        "--input",
        input.to_str().expect("utf-8"),
        "--output",
        output.to_str().expect("utf-8"),
    ]);
    assert!(ok, "{stderr}");
    let base_ref = rows(&common::expected("lora")["base_embeddings"][base]);
    let ffn_ref = reference("ffn");
    for line in std::fs::read_to_string(&output).expect("output").lines() {
        let v: Value = serde_json::from_str(line).expect("json line");
        let i = v["id"].as_u64().expect("id") as usize;
        let expected = if i.is_multiple_of(2) { &ffn_ref[i] } else { &base_ref[i] };
        let c = cosine(&common::floats(&v["embedding"]), expected);
        assert!(c >= 0.9999, "batch line {i}: cosine {c}");
    }
}

/// jina-embeddings-v3 as its publisher's code runs it (tests/fixtures/make_jina_v3.py): served
/// without --enable-lora, its five tasks listed as adapters of the model, each selected by
/// `model` or by Jina's `task` field (the retrieval tasks with their instruction prepended),
/// the base weights without one; requests for every task at once share batches and each gets
/// its own task's vector.
#[tokio::test]
async fn jina_embeddings_v3_tasks_match_the_published_code() {
    let expected = common::expected("jina-v3-tiny");
    let texts: Vec<String> = expected["texts"].as_array().expect("texts").iter().map(|t| t.as_str().expect("text").to_string()).collect();
    let engine = common::engine(&fixture_model("jina-v3-tiny"), |c| c.models[0].served_name = "jina-v3".into());
    let router = app(engine, false);
    let reply = send(&router, "GET", "/v1/models", None, &[]).await;
    let cards = reply.body["data"].as_array().expect("cards");
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().expect("id")).collect();
    assert_eq!(ids, ["jina-v3", "classification", "retrieval.passage", "retrieval.query", "separation", "text-matching"]);
    assert!(cards[1..].iter().all(|c| c["parent"] == "jina-v3"), "{cards:?}");

    let tasks = expected["tasks"].as_object().expect("tasks");
    for (task, reference) in tasks {
        let reference = rows(reference);
        let model = if task == "none" { "jina-v3" } else { task.as_str() };
        assert_matches(&embed(&router, model, json!(texts)).await, &reference, 0.9999, &format!("task {task} as model"));
        if task != "none" {
            let reply = post(&router, "/v1/embeddings", json!({"model": "jina-v3", "task": task, "input": texts})).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            assert_eq!(reply.body["model"], "jina-v3");
            let ours: Vec<Vec<f32>> =
                reply.body["data"].as_array().expect("data").iter().map(|d| common::floats(&d["embedding"])).collect();
            assert_matches(&ours, &reference, 0.9999, &format!("task {task} as `task`"));
        }
    }
    // Cohere's input_type picks the task (search_query → retrieval.query, clustering → separation).
    for (input_type, task) in [("search_query", "retrieval.query"), ("search_document", "retrieval.passage"), ("clustering", "separation")]
    {
        let reply =
            post(&router, "/v2/embed", json!({"model": "jina-v3", "texts": texts, "input_type": input_type, "embedding_types": ["float"]}))
                .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let ours: Vec<Vec<f32>> = reply.body["embeddings"]["float"].as_array().expect("float").iter().map(common::floats).collect();
        assert_matches(&ours, &rows(&tasks[task]), 0.9999, &format!("input_type {input_type}"));
    }
    // The tasks really differ, so that a mix-up would show.
    let query = rows(&tasks["retrieval.query"]);
    let matching = rows(&tasks["text-matching"]);
    assert!(cosine(&query[0], &matching[0]) < 0.99);

    let reply = post(&router, "/v1/embeddings", json!({"model": "jina-v3", "task": "retrieval", "input": "hi"})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.body["error"]["message"],
        "Unsupported task 'retrieval'. Supported tasks are: retrieval.query, retrieval.passage, separation, classification, text-matching."
    );

    // Every task and the base at once.
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..24 {
        let (task, reference) = tasks.iter().nth(i % tasks.len()).map(|(t, r)| (t.clone(), rows(r))).expect("task");
        let text = i / tasks.len() % texts.len();
        let (router, input) = (router.clone(), texts[text].clone());
        requests.spawn(async move {
            let model = if task == "none" { "jina-v3".to_string() } else { task.clone() };
            (task, text, embed(&router, &model, json!(input)).await.remove(0), reference[text].clone())
        });
    }
    for (task, text, ours, reference) in requests.join_all().await {
        let c = cosine(&ours, &reference);
        assert!(c >= 0.9999, "concurrent: task {task} text {text} got cosine {c}");
    }
}

/// `task` on a model without task adapters is refused, naming why.
#[tokio::test]
async fn task_needs_a_model_with_task_adapters() {
    let router = app(load(&lora_config("bert-embed-cls", &["ffn"], 1, |_| {})), false);
    let reply = post(&router, "/v1/embeddings", json!({"model": "bert-embed-cls", "task": "retrieval.query", "input": "hi"})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body["error"]["message"], "`task` selects a task adapter; the model `bert-embed-cls` has none");
    assert_eq!(reply.body["error"]["param"], "task");
}
