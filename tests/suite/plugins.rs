//! IO-processor plugins (vLLM's `plugin` task) through the real router and the real binary:
//! vLLM v0.33.0's BGE-M3 sparse plugin, ported by its imports only, against FlagEmbedding's
//! dense vectors and lexical weights (its compound task `embed&token_classify`, its tokens from
//! the server's tokenizer over the pipe, checked against the `tokenizers` package); its
//! ColBERT query plugin; vLLM's messages for the error cases; a plugin that needs what we do
//! not offer, refused at start; and a plugin that crashes, hangs or floods memory on request,
//! which costs only its own request.

use crate::common::server::{post as server_post, start_in, wait_ready, BIN};
use crate::common::*;
use axum::http::StatusCode;
use poolserve::api::{self, AppState};
use poolserve::plugin::{IoProcessor, PluginOptions};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The Python the test command installs (`.venv`, with pydantic and tokenizers); the suite
/// fails rather than skips without it.
fn python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(venv.exists(), "{} is missing: scripts/test.sh installs it (python_and_models)", venv.display());
    venv
}

fn options() -> PluginOptions {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    PluginOptions {
        python: python(),
        paths: vec![root.join("plugins"), root.join("tests/fixtures/plugins")],
        timeout: Duration::from_secs(3),
        start_timeout: Duration::from_secs(60),
        memory_limit_bytes: 512 << 20,
        processes: 2,
    }
}

async fn router_with_plugin(model: &str, plugin: &str) -> axum::Router {
    let engine = engine(&fixture_model(model), |_| {});
    let processor = IoProcessor::start(plugin, &options(), &engine).await.expect("plugin starts");
    let name = engine.spec().served_name.clone();
    let state = AppState::ready(engine);
    state.set_plugin(&name, processor);
    api::router(state, 2_000_000)
}

fn assert_error(reply: &Reply, status: StatusCode, message_part: &str) {
    assert_eq!(reply.status, status, "body: {}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(message_part), "message {message:?} lacks {message_part:?}");
}

/// vLLM 0.33's `convert_ids_list_to_tokens` of `ids` computed by the `tokenizers` package from
/// the fixture's tokenizer.json: each id decoded alone, the leading spaces a Metaspace marker
/// stands for restored. The reference for the tokens the plugin returns.
fn reference_tokens(model: &str, ids: &[u64]) -> Vec<String> {
    let script = r#"
import json, sys
from tokenizers import Tokenizer
path, ids = sys.argv[1], json.loads(sys.argv[2])
tok = Tokenizer.from_file(path)
pre = json.loads(tok.to_str()).get("pre_tokenizer") or {}
marker = pre.get("replacement", "\u2581") if pre.get("type") == "Metaspace" else None
out = []
for i in ids:
    text = tok.decode([i], skip_special_tokens=False) or ""
    raw = tok.id_to_token(i) or ""
    if marker:
        missing = (len(raw) - len(raw.lstrip(marker))) - (len(text) - len(text.lstrip(" ")))
        text = " " * missing + text if missing > 0 else text
    out.append(text)
print(json.dumps(out))
"#;
    let path = fixture_model(model).join("tokenizer.json");
    let output = std::process::Command::new(python())
        .args(["-c", script, path.to_str().unwrap(), &serde_json::to_string(ids).unwrap()])
        .output()
        .expect("python runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("a list of tokens")
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

fn numbers(value: &Value) -> Vec<f64> {
    value.as_array().expect("a list of numbers").iter().map(|v| v.as_f64().unwrap()).collect()
}

/// The plugin's sparse embedding as token id → weight.
fn weights(data: &Value) -> Vec<(String, f64)> {
    let mut pairs: Vec<(String, f64)> =
        data["sparse_embedding"].as_array().unwrap().iter().map(|w| (w["token_id"].to_string(), w["weight"].as_f64().unwrap())).collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bge_m3_sparse_plugin_matches_flag_embedding() {
    let reference = expected("bge-m3-tiny");
    let router = router_with_plugin("bge-m3-tiny", "bge_m3_sparse_plugin").await;
    let cases = reference["texts"].as_array().unwrap();
    let inputs: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let body = json!({"task": "plugin", "data": {"input": inputs, "return_tokens": true}, "unknown_field": 1});
    let reply = send(&router, "POST", "/pooling", Some(body.to_string()), &[("x-request-id", "sparse-1")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["request_id"], "pooling-sparse-1");
    assert!(reply.body["created_at"].as_u64().unwrap() > 1_700_000_000);
    let data = &reply.body["data"]["data"];
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(data[i]["index"], i);
        // vLLM 0.33's default embed_task: both, from one pass (`embed&token_classify`).
        assert_eq!(data[i]["object"], "dense&sparse");
        let (dense, reference) = (numbers(&data[i]["dense_embedding"]), numbers(&case["embedding"]));
        assert_eq!(dense.len(), reference.len(), "text {i}: dense size");
        assert!(cosine(&dense, &reference) >= 0.9999, "text {i}: dense cosine {}", cosine(&dense, &reference));
        let worst = dense.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-4, "text {i}: dense differs from FlagEmbedding's by {worst}");
        // FlagEmbedding's lexical weights: the largest weight per token id, specials dropped.
        let mut expected: Vec<(String, f64)> =
            case["lexical_weights"].as_object().unwrap().iter().map(|(id, w)| (id.clone(), w.as_f64().unwrap())).collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        let ours = weights(&data[i]);
        assert_eq!(ours.iter().map(|p| &p.0).collect::<Vec<_>>(), expected.iter().map(|p| &p.0).collect::<Vec<_>>(), "text {i}: ids");
        for ((id, w), (_, e)) in ours.iter().zip(&expected) {
            assert!((w - e).abs() <= 1e-4, "text {i} token {id}: {w} vs FlagEmbedding's {e}");
        }
        // return_tokens: each id as vLLM's convert_ids_list_to_tokens writes it, from the
        // server's tokenizer (the plugin's Python needs no tokenizer package).
        let entries = data[i]["sparse_embedding"].as_array().unwrap();
        let ids: Vec<u64> = entries.iter().map(|e| e["token_id"].as_u64().unwrap()).collect();
        let tokens: Vec<&str> = entries.iter().map(|e| e["token"].as_str().expect("a token")).collect();
        assert_eq!(tokens, reference_tokens("bge-m3-tiny", &ids), "text {i}: tokens");
    }
    assert!(
        data[0]["sparse_embedding"].as_array().unwrap().iter().any(|e| e["token"].as_str().unwrap().starts_with(' ')),
        "a restored space"
    );
    let tokens: u64 = cases.iter().map(|c| c["input_ids"].as_array().unwrap().len() as u64).sum();
    assert_eq!(reply.body["data"]["usage"]["prompt_tokens"], tokens);

    // Equal to what our own route gives for the same input: token_classify, largest per id.
    let own = post(&router, "/pooling", json!({"input": inputs[0], "task": "token_classify"})).await;
    let plain = post(&router, "/pooling", json!({"data": {"input": inputs[0]}})).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.body);
    assert!(plain.body["data"]["data"][0]["sparse_embedding"][0]["token"].is_null());
    let ids = cases[0]["input_ids"].as_array().unwrap();
    let inner = &ids[1..ids.len() - 1];
    let rows = own.body["data"][0]["data"].as_array().unwrap();
    let mut largest: std::collections::BTreeMap<String, f64> = Default::default();
    for (id, row) in inner.iter().zip(rows) {
        let weight = largest.entry(id.to_string()).or_insert(f64::MIN);
        *weight = weight.max(row[0].as_f64().unwrap());
    }
    let ours: std::collections::BTreeMap<String, f64> = weights(&plain.body["data"]["data"][0]).into_iter().collect();
    assert_eq!(ours.keys().collect::<Vec<_>>(), largest.keys().collect::<Vec<_>>());
    for (id, weight) in &largest {
        assert!((ours[id] - weight).abs() < 1e-6, "token {id}: plugin {} vs /pooling's largest {weight}", ours[id]);
    }
    // Its dense part is our /v1/embeddings vector.
    let embedded = post(&router, "/v1/embeddings", json!({"input": inputs[0]})).await;
    let (route, plugin) = (numbers(&embedded.body["data"][0]["embedding"]), numbers(&plain.body["data"]["data"][0]["dense_embedding"]));
    assert!(route.iter().zip(&plugin).all(|(a, b)| (a - b).abs() < 1e-6) && route.len() == plugin.len(), "dense vs /v1/embeddings");

    // embed_task picks the parts.
    let sparse = post(&router, "/pooling", json!({"data": {"input": inputs[0], "embed_task": "sparse"}})).await;
    let entry = &sparse.body["data"]["data"][0];
    assert_eq!((entry["object"].as_str(), entry["dense_embedding"].is_null()), (Some("sparse"), true), "{entry}");
    assert_eq!(weights(entry), weights(&plain.body["data"]["data"][0]));
    let dense = post(&router, "/pooling", json!({"data": {"input": inputs[0], "embed_task": "dense"}})).await;
    let entry = &dense.body["data"]["data"][0];
    assert_eq!((entry["object"].as_str(), entry["sparse_embedding"].is_null()), (Some("dense"), true), "{entry}");
    assert_eq!(numbers(&entry["dense_embedding"]), plugin);
    let refused = post(&router, "/pooling", json!({"data": {"input": inputs[0], "embed_task": "colbert"}})).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, "embed_task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_requests_fail_as_vllm_fails_them() {
    // A model without a plugin.
    let plain = router(engine(&fixture_model("bge-m3-tiny"), |_| {}), 2_000_000);
    let reply = post(&plain, "/pooling", json!({"data": {"input": "x"}})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "No IOProcessor plugin installed.");
    assert_eq!(reply.body["error"]["param"], "task");

    let router = router_with_plugin("bge-m3-tiny", "bge_m3_sparse_plugin").await;
    let reply = post(&router, "/pooling", json!({"data": {"input": "x"}, "dimensions": 4})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "dimensions is currently not supported");
    // The plugin's own checks: a TypeError and pydantic's ValidationError are the client's.
    let reply = post(&router, "/pooling", json!({"data": "not an object"})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "data should be a dictionary");
    let reply = post(&router, "/pooling", json!({"data": {"inputs": "misspelt"}})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "validation error");
    let reply = post(&router, "/pooling", json!({"input": "x", "task": "plugin"})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "takes `data`");
    // Plain requests still work beside it.
    let reply = post(&router, "/pooling", json!({"input": "x"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = post(&router, "/v1/embeddings", json!({"input": "x"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// What a plugin needs and we do not offer stops the start with a message naming the plugin and
/// the missing piece: vLLM's own imports left in, a vLLM name the host lacks, a pooling task the
/// model has not. The compound task itself runs where the model has it (BGE-M3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_needs_what_we_lack_is_refused_at_start() {
    let start = |model: &str, plugin: &'static str| {
        let engine = engine(&fixture_model(model), |_| {});
        async move { IoProcessor::start(plugin, &options(), &engine).await.err().map(|e| e.to_string()).unwrap_or_default() }
    };
    let unported = start("bert-embed-mean", "unported_plugin").await;
    assert!(unported.contains("plugin 'unported_plugin' imports vLLM itself (vllm"), "{unported}");
    assert!(unported.contains("poolserve_plugins"), "{unported}");
    let missing = start("bert-embed-mean", "missing_name_plugin").await;
    assert!(missing.contains("plugin 'missing_name_plugin' imports a name poolserve does not offer"), "{missing}");
    assert!(missing.contains("SamplingParams"), "{missing}");
    let compound = start("bert-embed-mean", "compound_task_plugin").await;
    assert!(
        compound.contains("plugin `compound_task_plugin` cannot run on this model: Unsupported task: 'embed&token_classify'"),
        "{compound}"
    );

    // On BGE-M3 the compound output is the dense vector, then one weight per token but the
    // specials: 1 + the inner tokens' count after the embedding's size.
    let router = router_with_plugin("bge-m3-tiny", "compound_task_plugin").await;
    let reference = expected("bge-m3-tiny");
    let case = &reference["texts"][0];
    let reply = post(&router, "/pooling", json!({"data": {"input": case["text"]}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let size = case["embedding"].as_array().unwrap().len() + case["input_ids"].as_array().unwrap().len() - 2;
    assert_eq!(reply.body["data"]["sizes"], json!([size]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_hanging_or_flooding_plugin_costs_only_its_request() {
    let router = router_with_plugin("bert-embed-mean", "misbehaving_plugin").await;
    let ok = |reply: &Reply| {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body["data"]["sizes"], json!([32]), "{}", reply.body);
    };
    ok(&post(&router, "/pooling", json!({"data": {"input": "hello"}})).await);
    let reply = post(&router, "/pooling", json!({"data": {"input": "x", "do": "refuse"}})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "the plugin refused on purpose");
    let reply = post(&router, "/pooling", json!({"data": {"input": "x", "do": "raise"}})).await;
    assert_error(&reply, StatusCode::INTERNAL_SERVER_ERROR, "the plugin failed on purpose");

    let reply = post(&router, "/pooling", json!({"data": {"input": "x", "do": "crash"}})).await;
    assert_error(&reply, StatusCode::INTERNAL_SERVER_ERROR, "the plugin process exited");
    ok(&post(&router, "/pooling", json!({"data": {"input": "after the crash"}})).await);

    // A hang holds one process until the timeout; another request meanwhile is answered.
    let hang = post(&router, "/pooling", json!({"data": {"input": "x", "do": "hang"}}));
    let beside = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post(&router, "/pooling", json!({"data": {"input": "during the hang"}})).await
    };
    let (hang, beside) = tokio::join!(hang, beside);
    assert_error(&hang, StatusCode::GATEWAY_TIMEOUT, "did not answer within");
    ok(&beside);
    ok(&post(&router, "/pooling", json!({"data": {"input": "after the hang"}})).await);

    let reply = post(&router, "/pooling", json!({"data": {"input": "x", "do": "flood"}})).await;
    assert_error(&reply, StatusCode::INTERNAL_SERVER_ERROR, "out of memory");
    ok(&post(&router, "/pooling", json!({"data": {"input": "after the flood"}})).await);

    let metrics = send(&router, "GET", "/metrics", None, &[]).await;
    let text = metrics.body.as_str().unwrap();
    for outcome in ["ok", "rejected", "error", "crashed", "timeout"] {
        assert!(text.contains(&format!("plugin=\"misbehaving_plugin\",outcome=\"{outcome}\"")), "no {outcome} in /metrics");
    }
    assert!(text.contains("poolserve_plugin_processes_started_total"), "{text}");
}

/// The binary as a user runs it from the repository: the plugin found by name in `plugins/`.
#[test]
fn the_binary_serves_a_plugin_by_name_and_refuses_an_unknown_one() {
    let root = env!("CARGO_MANIFEST_DIR");
    let python = python();
    let python = python.to_str().unwrap();
    let model = format!("{root}/tests/fixtures/models/bge-m3-tiny");
    // A Python without the `tokenizers` and `numpy` packages, as the container image's (stand-ins
    // that fail to import shadow the installed ones): return_tokens and several inputs need no
    // tokenizer package (the server's answers), the outputs no numpy (the host's own arrays).
    let no_tokenizers = format!("{root}/tests/fixtures/python-pydantic-only");
    let envs = [("POOLSERVE_PLUGIN_PYTHON", python), ("PYTHONPATH", no_tokenizers.as_str())];
    let mut server = start_in(root, &[&model, "--io-processor-plugin", "bge_m3_sparse_plugin"], &envs);
    wait_ready(&mut server);
    let body = json!({"data": {"input": ["What is BGE M3?", "Defination of BM25"], "return_tokens": true}});
    let answer = server_post(server.port, "/pooling", body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let data = &answer.json()["data"]["data"];
    assert_eq!(data[0]["object"], "dense&sparse");
    assert_eq!(data.as_array().map(Vec::len), Some(2));
    assert!(data[1]["sparse_embedding"][0]["token"].is_string(), "{data}");
    assert_eq!(data[0]["dense_embedding"].as_array().map(Vec::len), Some(32), "{data}");
    drop(server);

    let output = std::process::Command::new(BIN)
        .current_dir(root)
        .args(["serve", &model, "--io-processor-plugin", "no_such_plugin", "--port", "0"])
        .env("POOLSERVE_PLUGIN_PYTHON", python)
        .env("RUST_LOG", "error")
        .output()
        .expect("binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("The model requires the 'no_such_plugin' IO Processor plugin but it is not installed. Available plugins: ['bge_m3_sparse_plugin'"),
        "{stderr}"
    );
}

/// A model on demand (`--models-dir`) starts its plugin with each load, as a server's start
/// does, and stops it when it is unloaded.
#[cfg(unix)]
#[test]
fn a_model_on_demand_starts_its_plugin_with_each_load() {
    let root = env!("CARGO_MANIFEST_DIR");
    let python = python();
    let dir = std::env::temp_dir().join(format!("poolserve-models-dir-plugin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(fixture_model("bge-m3-tiny"), dir.join("bge")).unwrap();
    let envs = [("POOLSERVE_PLUGIN_PYTHON", python.to_str().unwrap())];
    let mut server = start_in(root, &["--models-dir", dir.to_str().unwrap(), "--io-processor-plugin", "bge_m3_sparse_plugin"], &envs);
    wait_ready(&mut server);
    for round in ["first load", "after an unload"] {
        let answer = server_post(server.port, "/pooling", json!({"model": "bge", "data": {"input": "What is BGE M3?"}}));
        assert_eq!(answer.status, 200, "{round}: {}", answer.text());
        assert_eq!(answer.json()["data"]["data"][0]["object"], "dense&sparse", "{round}");
        assert_eq!(server_post(server.port, "/models/unload", json!({"model": "bge"})).status, 200);
    }
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// vLLM's ColBERT query plugin, ported, on jina-colbert-v2: its query prompt (`[CLS]
/// [QueryMarker] text [SEP]` padded with `[MASK]` to 32) and document prompt give the vectors
/// our own `/pooling` token_embed gives for the same token ids.
/// jina-colbert-v2-tiny with the published tokenizer's two marker tokens: the tiny fixture's
/// vocabulary has no room for them, so this copy renames two of its pieces (本, 語) as the
/// markers (ids 1063 and 1064).
fn colbert_with_markers(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("poolserve-colbert-markers-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    families::copy_dir(&fixture_model("jina-colbert-v2-tiny"), &dir);
    let path = dir.join("tokenizer.json");
    let mut tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (id, content) in [(1063, "[QueryMarker]"), (1064, "[DocumentMarker]")] {
        tokenizer["model"]["vocab"][id][0] = json!(content);
        let token = json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
        tokenizer["added_tokens"].as_array_mut().unwrap().push(token);
    }
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colbert_query_plugin_gives_the_routes_vectors() {
    let dir = colbert_with_markers("http");
    let engine = engine(&dir, |_| {});
    let processor = IoProcessor::start("colbert_query_plugin", &options(), &engine).await.expect("plugin starts");
    let name = engine.spec().served_name.clone();
    let state = AppState::ready(engine);
    state.set_plugin(&name, processor);
    let router = api::router(state, 2_000_000);

    let text = "What is late interaction?";
    let pieces = post(&router, "/tokenize", json!({"prompt": text, "add_special_tokens": false})).await;
    let pieces: Vec<u64> = pieces.body["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    for (input_type, marker) in [("query", 1063u64), ("document", 1064)] {
        let reply = post(&router, "/pooling", json!({"data": {"input": text, "input_type": input_type}})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let item = &reply.body["data"]["data"][0];
        assert_eq!(item["input_type"], input_type);
        let mut ids = vec![0, marker];
        ids.extend(&pieces);
        ids.push(2);
        if input_type == "query" {
            ids.resize(32, 1065);
        }
        assert_eq!(reply.body["data"]["usage"]["prompt_tokens"], ids.len());
        let own = post(&router, "/pooling", json!({"input": ids, "task": "token_embed"})).await;
        assert_eq!(own.status, StatusCode::OK, "{}", own.body);
        let (ours, theirs) = (item["embedding"].as_array().unwrap(), own.body["data"][0]["data"].as_array().unwrap());
        assert_eq!(ours.len(), ids.len(), "{input_type}: one vector per token");
        for (t, (a, b)) in ours.iter().zip(theirs).enumerate() {
            assert!(max_abs_diff(&floats(a), &floats(b)) <= 1e-6, "{input_type} token {t}");
        }
    }
    // Without `input_type`, pydantic refuses the data: 400, as vLLM's test expects.
    let reply = post(&router, "/pooling", json!({"data": {"input": text}})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "input_type");
    // vLLM's batch case: a list of queries, one entry each, each expanded to 32 vectors.
    let queries = json!({"data": {"input": ["What is machine learning?", "What is deep learning?"], "input_type": "query"}});
    let reply = post(&router, "/pooling", queries).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let entries = reply.body["data"]["data"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!((entry["index"].as_u64(), entry["object"].as_str()), (Some(i as u64), Some("embedding")));
        assert_eq!(entry["embedding"].as_array().map(Vec::len), Some(32));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The plugin docs/plugins.md writes, as it ships in `plugins/word_count`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_plugin_answers_as_documented() {
    let router = router_with_plugin("bert-embed-mean", "word_count").await;
    let reply = post(&router, "/pooling", json!({"data": {"texts": ["a", "b c"]}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (i, text) in ["a", "b c"].iter().enumerate() {
        let own = post(&router, "/v1/embeddings", json!({"input": text})).await;
        let norm = floats(&own.body["data"][0]["embedding"]).iter().map(|x| (x * x) as f64).sum::<f64>().sqrt();
        let item = &reply.body["data"][i];
        assert!((item["norm"].as_f64().unwrap() - norm).abs() < 1e-5, "{item} vs {norm}");
        assert_eq!(item["tokens"], own.body["usage"]["prompt_tokens"]);
    }
    let reply = post(&router, "/pooling", json!({"data": {"text": "a"}})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "data must be");
}

/// The library's form of a plugin request (vLLM's offline `encode({"data": …},
/// pooling_task="plugin")`): the same plugin, no request id, the same lexical weights.
#[test]
fn the_library_runs_a_plugin() {
    use poolserve::library::{LibraryError, LocalModel, LocalModelOptions};
    let reference = expected("bge-m3-tiny");
    let mut options = LocalModelOptions::for_model(fixture_model("bge-m3-tiny").to_str().unwrap());
    options.plugins = self::options();
    let plain = LocalModel::load(options.clone()).expect("model loads");
    assert!(matches!(plain.plugin(json!({"input": "x"})), Err(LibraryError::NoPlugin)));
    options.model.io_processor_plugin = Some("bge_m3_sparse_plugin".into());
    let model = LocalModel::load(options).expect("model and plugin load");
    let case = &reference["texts"][0];
    let output = model.plugin(json!({"input": case["text"]})).expect("plugin answers");
    let mut expected: Vec<(String, f64)> =
        case["lexical_weights"].as_object().unwrap().iter().map(|(id, w)| (id.clone(), w.as_f64().unwrap())).collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    let ours = weights(&output["data"][0]);
    assert_eq!(ours.len(), expected.len());
    for ((id, w), (_, e)) in ours.iter().zip(&expected) {
        assert!((w - e).abs() <= 1e-4, "token {id}: {w} vs FlagEmbedding's {e}");
    }
    let refused = model.plugin(json!("not an object")).unwrap_err();
    assert_eq!(refused.to_string(), "data should be a dictionary");
}

/// The ColBERT plugin through the library: a query of token ids (`[CLS] [QueryMarker] ids
/// [SEP]`, `[MASK]` to 32) gives the library's own token_embed vectors for those ids.
#[test]
fn the_library_runs_the_colbert_plugin() {
    use poolserve::input::Prompt;
    use poolserve::library::{LocalModel, LocalModelOptions, PoolingParams};
    use poolserve::pooling::{PoolingOutput, Task};
    let dir = colbert_with_markers("library");
    let mut options = LocalModelOptions::for_model(dir.to_str().unwrap());
    options.plugins = self::options();
    options.model.io_processor_plugin = Some("colbert_query_plugin".into());
    let model = LocalModel::load(options).expect("model and plugin load");
    let output = model.plugin(json!({"input": [40, 41, 42], "input_type": "query"})).expect("plugin answers");
    let mut ids = vec![0u32, 1063, 40, 41, 42, 2];
    ids.resize(32, 1065);
    let own = model.encode(Task::TokenEmbed, vec![Prompt::Tokens(ids)], &PoolingParams::default()).expect("token_embed");
    let PoolingOutput::Tokens(rows) = &own[0] else { panic!("token_embed gives rows") };
    let vectors = output["data"][0]["embedding"].as_array().unwrap();
    assert_eq!(vectors.len(), 32);
    for (t, (ours, row)) in vectors.iter().zip(rows).enumerate() {
        assert!(max_abs_diff(&floats(ours), row) <= 1e-6, "token {t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
