//! The output cache (`--cache-size`, `--cache-dir`) through the real binary: an input run again
//! is answered from the cache with the very floats the model gave (and counted on /metrics),
//! vLLM's `cache_salt` keeps tenants apart with vLLM's validation messages, what changes an
//! output (special tokens, normalization, truncation) changes the entry, and the entries
//! persist across a restart with `--cache-dir`.

use crate::common::server::{post, request, serve, Answer};
use serde_json::{json, Value};

fn metric(port: u16, name: &str) -> f64 {
    let text = request(port, "GET", "/metrics", None, &[]).expect("/metrics answers").text();
    let line = text.lines().find(|l| l.starts_with(&format!("poolserve_{name}{{"))).unwrap_or_else(|| panic!("no {name} in {text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
}

fn embed(port: u16, body: Value) -> Answer {
    let answer = post(port, "/v1/embeddings", body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
}

fn vectors(answer: &Answer) -> Vec<Value> {
    answer.json()["data"].as_array().expect("data").iter().map(|d| d["embedding"].clone()).collect()
}

#[test]
fn a_repeated_input_is_answered_from_the_cache_and_salts_keep_tenants_apart() {
    let model = crate::common::fixture_model("bert-embed-mean");
    let dir = std::env::temp_dir().join(format!("poolserve-cache-suite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let args = [model.to_str().unwrap(), "--cache-size", "16", "--cache-dir", dir.to_str().unwrap()];
    let server = serve(&args);
    let port = server.port;

    let first = embed(port, json!({"input": ["one text", "another text"]}));
    assert_eq!((metric(port, "cache_hits_total"), metric(port, "cache_misses_total")), (0.0, 2.0));
    // One input again, one new: one hit, one miss, and the repeated one's floats are the same.
    let second = embed(port, json!({"input": ["a third text", "one text"]}));
    assert_eq!((metric(port, "cache_hits_total"), metric(port, "cache_misses_total")), (1.0, 3.0));
    assert_eq!(vectors(&second)[1], vectors(&first)[0]);
    assert_eq!(metric(port, "cache_entries"), 3.0);
    let third = embed(port, json!({"input": ["one text", "another text"]}));
    assert_eq!(metric(port, "cache_hits_total"), 3.0);
    assert_eq!(vectors(&third), vectors(&first));
    assert_eq!(third.json()["usage"], first.json()["usage"], "usage counts cached inputs");

    // What changes the output misses; a salt only meets its own entries.
    let misses = metric(port, "cache_misses_total");
    for body in [
        json!({"input": "one text", "add_special_tokens": false}),
        json!({"input": "one text", "use_activation": false}),
        json!({"input": "one text", "truncate_prompt_tokens": 2}),
        json!({"input": "one text", "cache_salt": "tenant-a"}),
        json!({"input": "one text", "cache_salt": "tenant-b"}),
    ] {
        let answer = post(port, "/v1/embeddings", body.clone());
        assert_eq!(answer.status, 200, "{body}: {}", answer.text());
    }
    assert_eq!(metric(port, "cache_misses_total"), misses + 5.0);
    let salted = embed(port, json!({"input": "one text", "cache_salt": "tenant-a"}));
    assert_eq!(metric(port, "cache_misses_total"), misses + 5.0, "the same salt hits");
    assert_eq!(vectors(&salted)[0], vectors(&first)[0], "a salt changes the key, not the output");

    // vLLM's rules for the salt, on every pooling route.
    for (salt, message) in [
        ("", "Parameter 'cache_salt' must be a non-empty string if provided."),
        ("a/b", "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."),
    ] {
        for route in ["/v1/embeddings", "/pooling"] {
            let answer = post(port, route, json!({"input": "x", "cache_salt": salt}));
            assert_eq!(answer.status, 400, "{route} {salt:?}: {}", answer.text());
            assert_eq!(answer.json()["error"]["message"], message);
            assert_eq!(answer.json()["error"]["param"], "cache_salt");
        }
    }
    let long = "s".repeat(129);
    assert_eq!(post(port, "/v1/embeddings", json!({"input": "x", "cache_salt": long})).status, 400);
    drop(server);

    // Restarted on the same folder: the unsalted and salted entries are read back.
    let server = serve(&args);
    let again = embed(server.port, json!({"input": ["one text", "another text"]}));
    assert_eq!(metric(server.port, "cache_hits_total"), 2.0, "entries persisted");
    assert_eq!(vectors(&again), vectors(&first));
    drop(server);

    // A folder without a size is refused at start.
    let (ok, output) = crate::common::server::run_to_exit(&["serve", model.to_str().unwrap(), "--cache-dir", dir.to_str().unwrap()]);
    assert!(!ok && output.contains("--cache-dir needs --cache-size"), "{output}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_cache_size_there_is_no_cache() {
    let model = crate::common::fixture_model("bert-embed-mean");
    let server = serve(&[model.to_str().unwrap()]);
    embed(server.port, json!({"input": ["one text", "one text"], "cache_salt": "accepted"}));
    let text = request(server.port, "GET", "/metrics", None, &[]).unwrap().text();
    assert!(!text.contains("poolserve_cache_"), "{text}");
}
