//! Models on demand (`--models-dir`) through the real binary: nothing loads at start, a model
//! loads at its first request (concurrent first requests load it once) and answers the
//! reference's vectors, `--max-loaded-models` unloads the least recently used, an idle model
//! unloads after `--model-idle-timeout`, `--max-loaded-memory` unloads by the weights' bytes,
//! `/models/load` and `/models/unload`, a broken folder answers its own requests with its error
//! while the others serve, and bad values stop the start. (gRPC calls: `grpc.rs`; plugins:
//! `plugins.rs`.)

use crate::common::server::{assert_one_line_error, post, request, start, wait_ready};
use crate::common::*;
use serde_json::{json, Value};
use std::path::PathBuf;

fn models_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("poolserve-models-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, fixture) in [("bert", "bert-embed-mean"), ("modern", "modernbert-embed-mean"), ("ranker", "bert-reranker")] {
        std::os::unix::fs::symlink(fixture_model(fixture), dir.join(name)).unwrap();
    }
    // A folder whose config.json is broken, and one that is no model (skipped).
    std::fs::create_dir_all(dir.join("broken")).unwrap();
    std::fs::write(dir.join("broken/config.json"), "{ not json").unwrap();
    std::fs::create_dir_all(dir.join("notes")).unwrap();
    dir
}

fn loaded(port: u16) -> Vec<(String, bool)> {
    let list = request(port, "GET", "/v1/models", None, &[]).unwrap().json();
    list["data"].as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap().to_string(), m["loaded"].as_bool().unwrap())).collect()
}

fn metric(port: u16, name: &str, model: &str) -> f64 {
    let text = request(port, "GET", "/metrics", None, &[]).unwrap().text();
    let series = format!("poolserve_{name}{{model=\"{model}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)).map(|v| v.trim().parse().unwrap()).unwrap_or(0.0)
}

fn embed(port: u16, model: &str, text: &Value) -> Value {
    let answer = post(port, "/v1/embeddings", json!({"model": model, "input": text}));
    assert_eq!(answer.status, 200, "{model}: {}", answer.text());
    answer.json()
}

#[cfg(unix)]
#[test]
fn models_load_at_first_request_and_unload_by_the_limits() {
    let dir = models_dir();
    let mut server = start(&["--models-dir", dir.to_str().unwrap(), "--max-loaded-models", "1", "--model-idle-timeout", "2"], &[]);
    wait_ready(&mut server);
    let port = server.port;
    let none = vec![("bert".into(), false), ("broken".into(), false), ("modern".into(), false), ("ranker".into(), false)];
    assert_eq!(loaded(port), none, "nothing loads at start; the folder without config.json is no model");

    let reference = expected("bert-embed-mean");
    let first = &reference["texts"][0];
    let body = embed(port, "bert", &first["text"]);
    assert_close(&floats(&body["data"][0]["embedding"]), &floats(&first["embedding"]), "bert on demand");
    assert!(loaded(port).contains(&("bert".into(), true)));

    // Four concurrent first requests for another model: one load, four answers, and the
    // least recently used model leaves (at most one loaded).
    let modern = expected("modernbert-embed-mean");
    let text = modern["texts"][0]["text"].clone();
    let answers: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| embed(port, "modern", &text))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for answer in &answers {
        assert_close(&floats(&answer["data"][0]["embedding"]), &floats(&modern["texts"][0]["embedding"]), "modern on demand");
    }
    assert_eq!(metric(port, "model_loads_total", "modern"), 1.0, "concurrent first requests load it once");
    assert_eq!(metric(port, "model_unloads_total", "bert"), 1.0);
    assert_eq!(loaded(port).iter().filter(|(_, l)| *l).count(), 1);

    // A name that is no folder loads nothing; the broken folder answers with its error and the
    // others keep serving.
    let unknown = post(port, "/v1/embeddings", json!({"model": "../etc", "input": "a"}));
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    let broken = post(port, "/v1/embeddings", json!({"model": "broken", "input": "a"}));
    assert_eq!(broken.status, 500, "{}", broken.text());
    assert!(broken.message().contains("The model `broken` could not be loaded"), "{}", broken.text());
    embed(port, "modern", &text);

    // By hand, then idle.
    let unload = post(port, "/models/unload", json!({"model": "modern"}));
    assert_eq!(unload.json(), json!({"success": true}));
    assert_eq!(loaded(port), none);
    assert_eq!(post(port, "/models/load", json!({"model": "ranker"})).json(), json!({"success": true}));
    assert!(loaded(port).contains(&("ranker".into(), true)));
    assert_eq!(post(port, "/models/load", json!({"model": "nope"})).status, 404);
    std::thread::sleep(std::time::Duration::from_millis(3500));
    assert_eq!(loaded(port), none, "unloaded after 2 s idle");
    assert_eq!(metric(port, "model_resident", "ranker"), 0.0);
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn bad_models_dirs_stop_the_start_with_one_line() {
    let one_line = assert_one_line_error;
    one_line(&["serve", "--models-dir", "/no/such/dir"], "--models-dir /no/such/dir");
    let empty = std::env::temp_dir().join(format!("poolserve-empty-models-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    one_line(&["serve", "--models-dir", empty.to_str().unwrap()], "holds no model folder");
    std::os::unix::fs::symlink(fixture_model("bert-embed-mean"), empty.join("bert")).unwrap();
    one_line(&["serve", "--models-dir", empty.to_str().unwrap(), "--max-loaded-models", "0"], "--max-loaded-models must be greater than 0");
    one_line(
        &["serve", "--models-dir", empty.to_str().unwrap(), "--max-loaded-memory", "8 parsecs"],
        "--max-loaded-memory \"8 parsecs\" is not a size",
    );
    one_line(
        &["serve", "--models-dir", empty.to_str().unwrap(), "--max-loaded-memory", "0GiB"],
        "--max-loaded-memory must be greater than 0",
    );
    std::fs::remove_dir_all(&empty).unwrap();
}

#[cfg(unix)]
#[test]
fn listing_loads_nothing_and_ollamas_tag_is_understood() {
    let dir = std::env::temp_dir().join(format!("poolserve-models-dir-one-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(fixture_model("bert-embed-mean"), dir.join("bert")).unwrap();
    let mut server = start(&["--models-dir", dir.to_str().unwrap()], &[]);
    wait_ready(&mut server);
    for path in ["/v1/models", "/api/tags", "/info"] {
        request(server.port, "GET", path, None, &[]).unwrap();
    }
    assert_eq!(loaded(server.port), vec![("bert".into(), false)], "GETs load nothing");
    let answer = post(server.port, "/api/embed", json!({"model": "bert:latest", "input": "hello"}));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(loaded(server.port), vec![("bert".into(), true)]);
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--max-loaded-memory`: models count by their weight files' bytes; a newcomer that does not fit
/// unloads the least recently used models until it does, and a model larger than the whole
/// budget answers 500 saying so.
#[cfg(unix)]
#[test]
fn a_memory_budget_unloads_by_the_weights_bytes() {
    let dir = std::env::temp_dir().join(format!("poolserve-models-dir-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut bytes = std::collections::HashMap::new();
    for (name, fixture) in [("bert", "bert-embed-mean"), ("modern", "modernbert-embed-mean"), ("ranker", "bert-reranker")] {
        std::os::unix::fs::symlink(fixture_model(fixture), dir.join(name)).unwrap();
        bytes.insert(name, std::fs::metadata(fixture_model(fixture).join("model.safetensors")).unwrap().len());
    }
    // Room for bert and ranker together, not for modern beside either.
    assert!(bytes["modern"] + bytes["bert"].min(bytes["ranker"]) > bytes["bert"] + bytes["ranker"]);
    let budget = format!("{}B", bytes["bert"] + bytes["ranker"]);
    let mut server = start(&["--models-dir", dir.to_str().unwrap(), "--max-loaded-memory", &budget], &[]);
    wait_ready(&mut server);
    let port = server.port;
    embed(port, "bert", &json!("a"));
    assert_eq!(post(port, "/rerank", json!({"model": "ranker", "query": "a", "documents": ["b"]})).status, 200);
    assert_eq!(loaded(port), vec![("bert".into(), true), ("modern".into(), false), ("ranker".into(), true)], "both fit");
    let modern = expected("modernbert-embed-mean");
    let body = embed(port, "modern", &modern["texts"][0]["text"]);
    assert_close(&floats(&body["data"][0]["embedding"]), &floats(&modern["texts"][0]["embedding"]), "modern on demand");
    assert_eq!(loaded(port), vec![("bert".into(), false), ("modern".into(), true), ("ranker".into(), false)], "both left for it");
    assert_eq!(metric(port, "model_unloads_total", "bert"), 1.0);
    assert_eq!(metric(port, "model_unloads_total", "ranker"), 1.0);
    drop(server);

    let mut server = start(&["--models-dir", dir.to_str().unwrap(), "--max-loaded-memory", "1KiB"], &[]);
    wait_ready(&mut server);
    let answer = post(server.port, "/v1/embeddings", json!({"model": "bert", "input": "a"}));
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert!(answer.message().contains("more than --max-loaded-memory (1 KiB) allows"), "{}", answer.text());
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}
