//! jina-embeddings-v5 through the real router (generator: tests/fixtures/make_jina_v5.py, the
//! published peft wrapping as reference): -small's Qwen3 decoder and -nano's EuroBERT encoder
//! (a Llama attending both ways), each with the task adapter `jina_task` names merged at load
//! (retrieval by default, an unknown name falling back to it, as vLLM's `jina.py`), and, beyond
//! vLLM, any task per request; last token, L2; cosine ≥ 0.9999, every text alone and all in
//! one batch.

use crate::common::families::*;
use crate::common::*;
use axum::http::StatusCode;
use serde_json::json;

const FIXTURES: [&str; 2] = ["jina-v5-small-tiny", "jina-v5-nano-tiny"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_task_is_retrieval() {
    for name in FIXTURES {
        check_embeddings(name).await;
        let engine = engine(&fixture_model(name), |_| {});
        assert_eq!(engine.spec().pooling, poolserve::pooling::PoolingType::Last, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jina_task_merges_that_adapter() {
    for name in FIXTURES {
        let expected = expected(name);
        for (task, rows) in expected["tasks"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, r)| (t.as_str(), r))
            .chain([("summarize", &expected["tasks"]["retrieval"])])
        {
            let overrides = json!({"jina_task": task}).as_object().unwrap().clone();
            let router = router(engine(&fixture_model(name), |c| c.models[0].hf_overrides = overrides), 2_000_000);
            let reply = post(&router, "/v1/embeddings", json!({"input": texts(&expected)})).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            for (i, row) in rows.as_array().unwrap().iter().enumerate() {
                let c = cosine(&floats(&reply.body["data"][i]["embedding"]), &floats(row));
                assert!(c >= 0.9999, "{name} jina_task {task} text {i}: cosine {c}");
            }
        }
    }
}

/// Beyond vLLM: every task per request (`task`, as jina-embeddings-v3's), whichever one is
/// merged, tasks mixed in one batch; an unknown task is refused with the model's list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_picks_any_task() {
    for (name, merged) in [("jina-v5-small-tiny", "retrieval"), ("jina-v5-nano-tiny", "clustering")] {
        let expected = expected(name);
        let overrides = json!({"jina_task": merged}).as_object().unwrap().clone();
        let router = router(engine(&fixture_model(name), |c| c.models[0].hf_overrides = overrides), 2_000_000);
        let tasks = expected["tasks"].as_object().unwrap();
        let mut pending = Vec::new();
        for (task, rows) in tasks {
            let router = router.clone();
            let (body, rows) = (json!({"input": texts(&expected), "task": task}), rows.clone());
            pending.push(tokio::spawn(async move { (post(&router, "/v1/embeddings", body).await, rows) }));
        }
        for (task, handle) in tasks.keys().zip(pending) {
            let (reply, rows) = handle.await.unwrap();
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            for (i, row) in rows.as_array().unwrap().iter().enumerate() {
                let c = cosine(&floats(&reply.body["data"][i]["embedding"]), &floats(row));
                assert!(c >= 0.9999, "{name} (merged {merged}) task {task} text {i}: cosine {c}");
            }
        }
        let reply = post(&router, "/v1/embeddings", json!({"input": "hello", "task": "summarize"})).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert_eq!(message, "Unsupported task 'summarize'. Supported tasks are: retrieval, text-matching, classification, clustering.");
    }
}

#[test]
fn broken_jina_v5_folders_are_one_line() {
    broken_folder_is_one_line(
        "jina-v5-small-tiny",
        set_json("adapters/retrieval/adapter_config.json", "r", json!(0)),
        "r must be positive",
    );
    broken_folder_is_one_line("jina-v5-nano-tiny", |d| drop_tensor(d, "layers.1.mlp.up_proj"), "layers.1.mlp.up_proj");
}
