//! The real `poolserve` binary, the way users run it: startup errors, a served fixture over
//! real HTTP, environment-variable flags, a model from the hub cache in offline mode, and a
//! clean exit on SIGTERM.

use crate::common;

use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::server::{assert_one_line_error, run_to_exit, start, wait_ready, Server, BIN};

fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, String)> {
    common::server::request(port, method, path, body, &[]).map(|a| (a.status, a.text()))
}

fn embed(port: u16, body: Value) -> Value {
    let (status, text) = http(port, "POST", "/v1/embeddings", Some(&body)).expect("answer");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn bad_flags_and_models_fail_with_one_line() {
    assert_one_line_error(&["serve", "m", "--max-batch-tokens", "0"], "--max-batch-tokens must be greater than 0");
    assert_one_line_error(&["serve", "m", "--pooler-config", "{nope"], "--pooler-config");
    assert_one_line_error(&["serve", "m", "--pooler-config", r#"{"pooling": "MEAN"}"#], "unknown field");
    assert_one_line_error(&["serve", "m", "--device", "cuda"], "cuda");
    assert_one_line_error(
        &["serve", "m", "--quantization", "int8", "--dtype", "float16"],
        "--quantization int8 runs on --device cpu with --dtype float32 or bfloat16 only",
    );
    assert_one_line_error(&["serve", "./no/such/folder", "--port", "0"], "does not exist");

    let dir = std::env::temp_dir().join(format!("poolserve-cli-phi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"architectures": ["PhiForCausalLM"], "model_type": "phi"}"#).unwrap();
    assert_one_line_error(&["serve", dir.to_str().unwrap(), "--port", "0"], "unsupported model");
    let fixture = fixture_model("bert-embed-mean");
    assert_one_line_error(&["serve", fixture.to_str().unwrap(), "--port", "0", "--max-model-len", "4096"], "larger than the model's limit");
    assert_one_line_error(
        &["serve", fixture.to_str().unwrap(), "--port", "0", "--pooler-config", r#"{"pooling_type": "ALL"}"#],
        "one vector per token",
    );
    assert_one_line_error(&["serve", fixture.to_str().unwrap(), "--port", "0", "--convert", "classify"], "--convert classify needs");
    // A classifier whose config promises more labels than its weights have.
    let seqcls = fixture_model("bert-seqcls");
    assert_one_line_error(
        &["serve", seqcls.to_str().unwrap(), "--port", "0", "--hf-overrides", r#"{"id2label": {"0": "a", "1": "b"}}"#],
        "classifier",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serves_published_sentence_transformers_folders_without_flags() {
    // config.json names MPNetForMaskedLM (as all-mpnet-base-v2's does); modules.json pools.
    let model = fixture_model("mpnet-embed-masked-lm");
    let mut server = start(&[model.to_str().unwrap()], &[]);
    wait_ready(&mut server);
    let reference = expected("mpnet-embed-masked-lm");
    let body = embed(server.port, json!({"input": reference["texts"][3]["text"]}));
    assert_close(&floats(&body["data"][0]["embedding"]), &floats(&reference["texts"][3]["embedding"]), "masked-LM folder");
    drop(server);

    // Prompts: --default-prompt-name replaces the folder's default.
    let model = fixture_model("bert-embed-prompts");
    let mut server = start(&[model.to_str().unwrap(), "--default-prompt-name", "passage"], &[]);
    wait_ready(&mut server);
    let reference = expected("bert-embed-prompts");
    let body = embed(server.port, json!({"input": reference["inputs"]["texts"][0]}));
    assert_close(&floats(&body["data"][0]["embedding"]), &floats(&reference["cases"]["passage"][0]["embedding"]), "--default-prompt-name");
    drop(server);
    let model = model.to_str().unwrap();
    assert_one_line_error(&["serve", model, "--port", "0", "--default-prompt-name", "nope"], "--default-prompt-name `nope`");
    let (ok, stderr) = run_to_exit(&["serve", model, "--default-prompt-name", "query", "--default-prompt", "x"]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn serves_a_fixture_over_http_and_stops_on_sigterm() {
    let model = fixture_model("xlmr-embed-cls");
    let mut server = start(&[model.to_str().unwrap()], &[("POOLSERVE_SERVED_MODEL_NAME", "tiny-xlmr")]);
    wait_ready(&mut server);
    let reference = expected("xlmr-embed-cls");
    let body = embed(server.port, json!({"model": "tiny-xlmr", "input": [reference["texts"][0]["text"], reference["texts"][3]["text"]]}));
    assert_close(&floats(&body["data"][0]["embedding"]), &floats(&reference["texts"][0]["embedding"]), "text 0");
    assert_close(&floats(&body["data"][1]["embedding"]), &floats(&reference["texts"][3]["embedding"]), "text 3");
    let (status, models) = http(server.port, "GET", "/v1/models", None).unwrap();
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"], "tiny-xlmr");
    let (status, error) = http(server.port, "POST", "/v1/embeddings", Some(&json!({"input": "a", "model": "other"}))).unwrap();
    assert_eq!(status, 404, "{error}");

    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert_clean_exit(&mut server, Duration::from_secs(20));
}

#[test]
fn sigterm_lets_in_flight_requests_finish_and_refuses_new_ones() {
    let model = fixture_model("bert-embed-mean");
    let mut server = start(&[model.to_str().unwrap(), "--shutdown-timeout", "60"], &[]);
    wait_ready(&mut server);
    let port = server.port;
    // Four large requests (1,024 inputs of ~130 tokens each) keep the model busy for a while.
    let body = json!({"input": vec!["word ".repeat(100); 1024]});
    let started = Instant::now();
    let in_flight: Vec<_> = (0..4)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || http(port, "POST", "/v1/embeddings", Some(&body)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(100));
    // New work is refused: the listener is closed (or, racing it, 503).
    let after = http(port, "POST", "/v1/embeddings", Some(&json!({"input": "a"})));
    assert!(matches!(after, None | Some((503, _))), "a request after SIGTERM got {after:?}");
    for request in in_flight {
        let (status, body) = request.join().unwrap().expect("an in-flight request was cut off");
        assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    }
    eprintln!("in-flight requests answered {:?} after they were sent (SIGTERM at 300 ms)", started.elapsed());
    assert_clean_exit(&mut server, Duration::from_secs(60));
}

/// Waits (at most `timeout`) for the server to exit after SIGTERM, and checks it exited 0.
fn assert_clean_exit(server: &mut Server, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "exit status after SIGTERM: {status}");
            return;
        }
        assert!(Instant::now() < deadline, "no exit within {timeout:?} of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn copy_dir(from: &Path, to: &Path) {
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

#[test]
fn loads_a_hub_id_from_the_offline_cache() {
    // The layout hf-hub and huggingface_hub share: $HF_HOME/hub/models--org--name/...
    let home = std::env::temp_dir().join(format!("poolserve-hf-home-{}", std::process::id()));
    let repo = home.join("hub/models--acme--tiny-bert");
    copy_dir(&fixture_model("bert-embed-mean"), &repo.join("snapshots/0123abc"));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abc").unwrap();

    let mut server = start(&["acme/tiny-bert"], &[("HF_HOME", home.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")]);
    wait_ready(&mut server);
    let reference = expected("bert-embed-mean");
    let body = embed(server.port, json!({"model": "acme/tiny-bert", "input": reference["texts"][0]["text"]}));
    assert_close(&floats(&body["data"][0]["embedding"]), &floats(&reference["texts"][0]["embedding"]), "cached model");
    drop(server);

    let (ok, stderr) = {
        let output = Command::new(BIN)
            .args(["serve", "acme/missing-model", "--port", "0"])
            .env("HF_HOME", &home)
            .env("HF_HUB_OFFLINE", "1")
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).to_string())
    };
    assert!(!ok && stderr.contains("not in the hub cache"), "{stderr}");
    std::fs::remove_dir_all(&home).unwrap();
}

/// Broken model folders: a one-line error at startup, never a panic.
#[test]
fn broken_model_folders_fail_with_one_line() {
    let root = std::env::temp_dir().join(format!("poolserve-cli-broken-{}", std::process::id()));
    let broken = |name: &str, fixture: &str, damage: &dyn Fn(&Path)| {
        let dir = root.join(name);
        copy_dir(&fixture_model(fixture), &dir);
        damage(&dir);
        dir
    };
    let serve = |dir: &Path, part: &str| assert_one_line_error(&["serve", dir.to_str().unwrap(), "--port", "0"], part);

    // Weights cut off halfway through the file.
    let dir = broken("truncated", "bert-embed-mean", &|d| {
        let file = d.join("model.safetensors");
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    });
    serve(&dir, "safetensors");
    // A config whose sizes disagree with the weights.
    let dir = broken("sizes", "bert-embed-mean", &|d| {
        let file = d.join("config.json");
        let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        config["intermediate_size"] = json!(64);
        std::fs::write(&file, config.to_string()).unwrap();
    });
    serve(&dir, "shape");
    // An unparsable tokenizer.json.
    let dir = broken("tokenizer", "bert-embed-mean", &|d| std::fs::write(d.join("tokenizer.json"), "{not json").unwrap());
    serve(&dir, "tokenizer");
    // A Dense module whose bias has more values than its weight has outputs.
    let dir = broken("dense-bias", "distilbert-embed-mean-dense", &|d| {
        let file = d.join("2_Dense/model.safetensors");
        let mut tensors = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
        tensors.insert("linear.bias".into(), candle_core::Tensor::zeros(30, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap());
        candle_core::safetensors::save(&tensors, &file).unwrap();
    });
    serve(&dir, "bias");
    // --dense-path naming a folder the model lacks, or set where modules.json has no Dense.
    let stella = fixture_model("bert-embed-dense-dims");
    let args = |model: &Path, dense: &str| {
        ["serve".to_string(), model.display().to_string(), "--dense-path".into(), dense.into(), "--port".into(), "0".into()]
    };
    let line = args(&stella, "2_Dense_99");
    assert_one_line_error(&line.iter().map(String::as_str).collect::<Vec<_>>(), "2_Dense_99/config.json");
    let line = args(&fixture_model("bert-embed-mean"), "2_Dense_24");
    assert_one_line_error(&line.iter().map(String::as_str).collect::<Vec<_>>(), "lists no Dense module");
    std::fs::remove_dir_all(&root).unwrap();
}

/// `serve NAME=MODEL NAME=MODEL` and `serve --config FILE` (YAML) run several models in
/// one process, routed by `model`; a bad models file is a one-line error naming the problem.
#[test]
fn serves_several_models_from_arguments_and_from_a_models_file() {
    let embedder = fixture_model("bert-embed-mean");
    let reranker = fixture_model("bert-reranker");
    let embed_reference = expected("bert-embed-mean");
    let text = embed_reference["texts"][0]["text"].clone();
    let check = |server: &mut Server| {
        wait_ready(server);
        let body = embed(server.port, json!({"model": "embedder", "input": text}));
        assert_close(&floats(&body["data"][0]["embedding"]), &floats(&embed_reference["texts"][0]["embedding"]), "embedder");
        let (status, reply) =
            http(server.port, "POST", "/rerank", Some(&json!({"model": "reranker", "query": "q", "documents": ["a", "b"]}))).unwrap();
        assert_eq!(status, 200, "{reply}");
        let (status, reply) = http(server.port, "POST", "/v1/embeddings", Some(&json!({"input": "x"}))).unwrap();
        assert_eq!(status, 400, "{reply}");
        assert!(reply.contains("`embedder`, `reranker`"), "{reply}");
        let (_, models) = http(server.port, "GET", "/v1/models", None).unwrap();
        let models: Value = serde_json::from_str(&models).unwrap();
        assert_eq!(models["data"].as_array().unwrap().len(), 2, "{models}");
    };
    let mut server = start(&[&format!("embedder={}", embedder.display()), &format!("reranker={}", reranker.display())], &[]);
    check(&mut server);
    drop(server);

    let dir = std::env::temp_dir().join(format!("poolserve-models-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("models.yaml");
    std::fs::write(
        &file,
        format!(
            "models:\n  - name: embedder\n    model: {}\n    max_model_len: 64\n  - name: reranker\n    model: {}\n",
            embedder.display(),
            reranker.display()
        ),
    )
    .unwrap();
    let mut server = start(&["--config", file.to_str().unwrap()], &[]);
    check(&mut server);
    let (_, models) = http(server.port, "GET", "/v1/models", None).unwrap();
    assert!(models.contains(r#""max_model_len":64"#), "{models}");
    drop(server);

    std::fs::write(&file, "models:\n  - model: /x\n    pooler_confg: {}\n").unwrap();
    assert_one_line_error(&["serve", "--config", file.to_str().unwrap()], "unknown field `pooler_confg`");
    std::fs::write(&file, format!("models:\n  - name: a\n    model: {}\n  - name: b\n    model: /no/such/model\n", embedder.display()))
        .unwrap();
    assert_one_line_error(&["serve", "--config", file.to_str().unwrap()], "model `b`");
    assert_one_line_error(&["serve", "a=/m/x", "a=/m/y"], "two models are named `a`");
    let _ = std::fs::remove_dir_all(&dir);
}
