//! The batch commands through the real binary: order and ids, the bad-line report, skipping,
//! shards covering every line once, resuming, plain-text input, classify and score, plugin
//! records.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_poolserve");

fn workdir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("batch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `poolserve ARGS`; returns (success, stderr).
fn run(args: &[&str]) -> (bool, String) {
    // float32, as the references are (see `common::server::start_in`).
    let out = Command::new(BIN).args(args).env("RUST_LOG", "warn").env("POOLSERVE_DTYPE", "float32").output().expect("binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Ten texts from the fixture, as JSON Lines with ids t0..t9, and one bad line at line 5.
fn write_input(dir: &Path) -> (PathBuf, Vec<String>) {
    let reference = expected("bert-embed-mean");
    let texts: Vec<String> = (0..10).map(|i| reference["texts"][i % 4]["text"].as_str().unwrap().to_string()).collect();
    let mut lines: Vec<String> =
        texts.iter().enumerate().map(|(i, t)| serde_json::json!({"id": format!("t{i}"), "text": t}).to_string()).collect();
    lines.insert(4, "{\"id\": \"bad\", \"text\": 42}".into());
    let path = dir.join("input.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    (path, texts)
}

#[test]
fn embed_writes_in_order_reports_bad_lines_and_shards_exactly() {
    let dir = workdir("embed");
    let model = fixture_model("bert-embed-mean");
    let model = model.to_str().unwrap();
    let (input, texts) = write_input(&dir);
    let input = input.to_str().unwrap();
    let out = dir.join("out.jsonl");
    let out_s = out.to_str().unwrap();

    // Without --skip-errors: stops at line 5 with its number, after writing lines 1-4.
    let (ok, stderr) = run(&["embed", model, "--input", input, "--output", out_s, "--chunk", "2"]);
    assert!(!ok, "a bad line must fail the run");
    assert!(stderr.contains("error: line 5: `text` must be a string"), "{stderr}");
    let written: Vec<String> = read_lines(&out).iter().map(|l| l["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(written, vec!["t0", "t1", "t2", "t3"]);

    // With --skip-errors: every good line, in order, with the reference embeddings.
    let (ok, stderr) = run(&["embed", model, "--input", input, "--output", out_s, "--skip-errors", "--chunk", "3"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("line 5: `text` must be a string (skipped)"), "{stderr}");
    let reference = expected("bert-embed-mean");
    let lines = read_lines(&out);
    assert_eq!(lines.len(), 10);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["id"], format!("t{i}"));
        assert_eq!(texts[i], reference["texts"][i % 4]["text"].as_str().unwrap());
        assert_close(&floats(&line["embedding"]), &floats(&reference["texts"][i % 4]["embedding"]), &format!("line {i}"));
    }

    // Three shards cover every good line exactly once.
    let mut seen = Vec::new();
    for shard in 0..3 {
        let part = dir.join(format!("shard{shard}.jsonl"));
        let (ok, stderr) =
            run(&["embed", model, "--input", input, "--output", part.to_str().unwrap(), "--skip-errors", "--shard", &format!("{shard}/3")]);
        assert!(ok, "{stderr}");
        seen.extend(read_lines(&part).iter().map(|l| l["id"].as_str().unwrap().to_string()));
    }
    seen.sort();
    let mut all: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    all.sort();
    assert_eq!(seen, all);

    // --resume after a partial run: each id once in the end.
    let resumed = dir.join("resumed.jsonl");
    let resumed_s = resumed.to_str().unwrap();
    assert!(run(&["embed", model, "--input", input, "--output", resumed_s, "--skip-errors", "--shard", "0/2"]).0);
    let first = read_lines(&resumed).len();
    let (ok, stderr) = run(&["embed", model, "--input", input, "--output", resumed_s, "--skip-errors", "--resume"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains(&format!("{first} already in the output")), "{stderr}");
    let mut ids: Vec<String> = read_lines(&resumed).iter().map(|l| l["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, all);

    assert!(!run(&["embed", model, "--input", input, "--output", out_s, "--shard", "3/3"]).0);
}

#[test]
fn plain_text_classify_and_score() {
    let dir = workdir("tasks");
    let reference = expected("bert-seqcls");
    let texts: Vec<&str> = (0..4).map(|i| reference["texts"][i]["text"].as_str().unwrap()).filter(|t| !t.is_empty()).collect();
    let input = dir.join("texts.txt");
    std::fs::write(&input, texts.join("\n") + "\n").unwrap();
    let out = dir.join("labels.jsonl");
    let model = fixture_model("bert-seqcls");
    let (ok, stderr) = run(&["classify", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let lines = read_lines(&out);
    let cases: Vec<&Value> = reference["texts"].as_array().unwrap().iter().filter(|c| !c["text"].as_str().unwrap().is_empty()).collect();
    for (i, (line, case)) in lines.iter().zip(&cases).enumerate() {
        assert_eq!(line["id"], i + 1, "plain text ids are line numbers");
        assert_eq!(line["label"], case["label"]);
        assert!(max_abs_diff(&floats(&line["probs"]), &floats(&case["softmax"])) <= 1e-4);
    }

    let pairs = expected("bert-reranker");
    let input = dir.join("pairs.jsonl");
    let body: Vec<String> = pairs["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| serde_json::json!({"id": i, "text_1": p["query"], "text_2": p["document"]}).to_string())
        .collect();
    std::fs::write(&input, body.join("\n")).unwrap();
    let model = fixture_model("bert-reranker");
    let (ok, stderr) = run(&["score", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    for (i, line) in read_lines(&out).iter().enumerate() {
        assert_eq!(line["id"], i);
        assert!((line["score"].as_f64().unwrap() - pairs["pairs"][i]["score"].as_f64().unwrap()).abs() <= 1e-4);
    }
}

#[test]
fn embed_takes_a_prompt_name() {
    let dir = workdir("prompts");
    let reference = expected("bert-embed-prompts");
    let model = fixture_model("bert-embed-prompts");
    let text = reference["inputs"]["texts"][0].as_str().unwrap();
    let input = dir.join("input.txt");
    std::fs::write(&input, format!("{text}\n")).unwrap();
    let out = dir.join("out.jsonl");
    for (flag, case) in [(None, "default"), (Some("passage"), "passage")] {
        let mut args = vec!["embed", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap()];
        if let Some(name) = flag {
            args.extend(["--prompt-name", name]);
        }
        let (ok, stderr) = run(&args);
        assert!(ok, "{stderr}");
        assert_close(&floats(&read_lines(&out)[0]["embedding"]), &floats(&reference["cases"][case][0]["embedding"]), case);
    }
    let (ok, stderr) = run(&[
        "embed",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--prompt-name",
        "nope",
    ]);
    assert!(!ok && stderr.contains("Unknown prompt_name 'nope'"), "{stderr}");
}

/// Several models in one batch run (`NAME=MODEL` arguments): each JSON line names the model it
/// runs on, and each answer matches that model's reference; an unnamed or unknown model is a
/// bad line.
#[test]
fn encode_routes_each_line_to_the_model_it_names() {
    let dir = workdir("models");
    let embed_ref = expected("bert-embed-mean");
    let tokcls_ref = expected("bert-tokcls");
    let lines = [
        serde_json::json!({"id": "e0", "model": "embedder", "text": embed_ref["texts"][0]["text"]}),
        serde_json::json!({"id": "n0", "model": "ner", "text": tokcls_ref["texts"][0]["text"]}),
        serde_json::json!({"id": "e1", "model": "embedder", "text": embed_ref["texts"][1]["text"]}),
        serde_json::json!({"id": "x", "text": "no model"}),
        serde_json::json!({"id": "y", "model": "other", "text": "unknown model"}),
    ];
    let input = dir.join("input.jsonl");
    std::fs::write(&input, lines.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let out = dir.join("out.jsonl");
    let embedder = format!("embedder={}", fixture_model("bert-embed-mean").display());
    let ner = format!("ner={}", fixture_model("bert-tokcls").display());
    let args = ["encode", &embedder, &ner, "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap(), "--skip-errors"];
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("line 4: several models are loaded") && stderr.contains("line 5: model `other` is not loaded"), "{stderr}");
    let written = read_lines(&out);
    let ids: Vec<&str> = written.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["e0", "n0", "e1"]);
    // `encode` runs each model's first task: embed for the embedder, token_classify for NER.
    assert_close(&floats(&written[0]["embedding"]), &floats(&embed_ref["texts"][0]["embedding"]), "embedder line");
    assert_close(&floats(&written[2]["embedding"]), &floats(&embed_ref["texts"][1]["embedding"]), "embedder line 2");
    let rows = written[1]["data"].as_array().unwrap();
    let want = tokcls_ref["texts"][0]["softmax"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for (row, want) in rows.iter().zip(want) {
        assert!(max_abs_diff(&floats(row), &floats(want)) <= 1e-4);
    }
}

#[test]
fn embed_takes_images_by_path_and_data_url() {
    use base64::Engine as _;
    let dir = workdir("images");
    let model = fixture_model("siglip-tiny");
    let reference = expected("siglip-tiny");
    let images = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    let png = images.join("gradient_97x61.png");
    let data_url = format!(
        "data:image/webp;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(images.join("checker_33x77.webp")).unwrap())
    );
    let text = reference["texts"][0]["text"].as_str().unwrap();
    let lines = [
        serde_json::json!({"id": "png", "image": png.to_str().unwrap()}),
        serde_json::json!({"id": "text", "text": text}),
        serde_json::json!({"id": "webp", "image": data_url}),
        serde_json::json!({"id": "missing", "image": dir.join("nope.png").to_str().unwrap()}),
    ];
    let input = dir.join("input.jsonl");
    std::fs::write(&input, lines.iter().map(|l| l.to_string() + "\n").collect::<String>()).unwrap();
    let out = dir.join("out.jsonl");
    let (ok, stderr) =
        run(&["embed", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--output", out.to_str().unwrap(), "--skip-errors"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("line 4: image") && stderr.contains("nope.png"), "{stderr}");
    let written = read_lines(&out);
    assert_eq!(written.len(), 3);
    let image =
        |file: &str| reference["images"].as_array().unwrap().iter().find(|i| i["file"] == file).unwrap()["image_embeds_normalized"].clone();
    let cos_png = cosine(&floats(&written[0]["embedding"]), &floats(&image("gradient_97x61.png")));
    let cos_webp = cosine(&floats(&written[2]["embedding"]), &floats(&image("checker_33x77.webp")));
    assert!(cos_png >= 0.999 && cos_webp >= 0.999, "{cos_png} {cos_webp}");
    assert_close(&floats(&written[1]["embedding"]), &floats(&reference["texts"][0]["text_embeds_normalized"]), "text line");
}

#[test]
fn encode_token_classify_gives_per_token_rewards() {
    let dir = workdir("rewards");
    let reference = expected("qwen2-reward");
    let input = dir.join("input.jsonl");
    let lines: String = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": i, "text": t["text"]}).to_string() + "\n")
        .collect();
    std::fs::write(&input, lines).unwrap();
    let out = dir.join("out.jsonl");
    let model = fixture_model("qwen2-reward");
    let (ok, stderr) = run(&[
        "encode",
        model.to_str().unwrap(),
        "--task",
        "token_classify",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    for (line, case) in read_lines(&out).iter().zip(reference["texts"].as_array().unwrap()) {
        let ours = line["data"].as_array().unwrap();
        let want = case["token_rewards"].as_array().unwrap();
        assert_eq!(ours.len(), want.len());
        for (a, b) in ours.iter().zip(want) {
            assert!(max_abs_diff(&floats(a), &floats(b)) <= 1e-4, "{a} vs {b}");
        }
    }
}

/// Plugin records under `encode` (vLLM's offline `LLM.encode({"data": …})`): each `data`
/// through the model's IO-processor plugin, the line `{"id", "data"}` with what it returned
/// (vLLM's BGE-M3 sparse plugin: FlagEmbedding's dense vector and lexical weights); a record the
/// plugin refuses is a bad line with its message; model inputs still run beside them.
#[test]
fn encode_runs_plugin_records_through_the_models_plugin() {
    let dir = workdir("plugin");
    let reference = expected("bge-m3-tiny");
    let case = &reference["texts"][0];
    let lines = [
        serde_json::json!({"id": "p0", "data": {"input": case["text"]}}),
        serde_json::json!({"id": "p1", "data": {"input": [case["text"], reference["texts"][2]["text"]], "embed_task": "sparse"}}),
        serde_json::json!({"id": "bad", "data": "not an object"}),
        serde_json::json!({"id": "t0", "text": case["text"]}),
    ];
    let input = dir.join("input.jsonl");
    std::fs::write(&input, lines.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let out = dir.join("out.jsonl");
    let root = env!("CARGO_MANIFEST_DIR");
    let python = format!("{root}/.venv/bin/python");
    assert!(Path::new(&python).exists(), "{python} is missing: scripts/test.sh installs it");
    let model = fixture_model("bge-m3-tiny");
    let output = Command::new(BIN)
        .current_dir(root)
        .args(["encode", model.to_str().unwrap(), "--io-processor-plugin", "bge_m3_sparse_plugin", "--plugin-python", &python])
        .args(["--input", input.to_str().unwrap(), "--output", out.to_str().unwrap(), "--skip-errors"])
        .env("RUST_LOG", "warn")
        .env("POOLSERVE_DTYPE", "float32")
        .output()
        .expect("binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("line 3: data should be a dictionary"), "{stderr}");
    let written = read_lines(&out);
    let ids: Vec<&str> = written.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["p0", "p1", "t0"]);
    let entry = &written[0]["data"]["data"][0];
    assert_eq!(entry["object"], "dense&sparse");
    assert_close(&floats(&entry["dense_embedding"]), &floats(&case["embedding"]), "the plugin's dense vector");
    let weights: std::collections::BTreeMap<String, f64> =
        entry["sparse_embedding"].as_array().unwrap().iter().map(|w| (w["token_id"].to_string(), w["weight"].as_f64().unwrap())).collect();
    let want = case["lexical_weights"].as_object().unwrap();
    assert_eq!(weights.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (id, w) in want {
        assert!((weights[id] - w.as_f64().unwrap()).abs() <= 1e-4, "token {id}");
    }
    let two = written[1]["data"]["data"].as_array().unwrap();
    assert_eq!(two.len(), 2);
    assert!(two.iter().all(|e| e["object"] == "sparse" && e["dense_embedding"].is_null()));
    // The text line: the model's own task (embed), the same vector as the plugin's dense one.
    assert_close(&floats(&written[2]["embedding"]), &floats(&case["embedding"]), "the text line");
}
