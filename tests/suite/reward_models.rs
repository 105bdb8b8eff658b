//! Reward models (Qwen2.5-Math-RM and -PRM layouts) against the PyTorch reference of tests/fixtures/make_reward_models.py:
//! Qwen2ForRewardModel's per-token and sequence rewards, Qwen2ForProcessRewardModel's STEP
//! probabilities, single and batched, through the engine, the router and the library; the
//! conversion table and the STEP parameters' errors.

use crate::common;

use crate::common::*;
use poolserve::config::ServerConfig;
use poolserve::engine::Engine;
use poolserve::pooling::config::PoolerConfig;
use poolserve::pooling::Task;
use serde_json::{json, Value};

const TOLERANCE: f32 = 1e-4;

fn rows(v: &Value) -> Vec<Vec<f32>> {
    v.as_array().expect("rows").iter().map(floats).collect()
}

fn assert_rows_close(ours: &[Vec<f32>], reference: &[Vec<f32>], what: &str) {
    assert_eq!(ours.len(), reference.len(), "{what}: row count");
    for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
        let diff = max_abs_diff(a, b);
        assert!(diff <= TOLERANCE, "{what}: row {i} differs by {diff}: {a:?} vs {b:?}");
    }
}

fn with_pooler(pooler: Value) -> impl FnOnce(&mut ServerConfig) {
    move |c| c.models[0].pooler = serde_json::from_value::<PoolerConfig>(pooler).expect("pooler config")
}

fn load_error(model: &str, tweak: impl FnOnce(&mut ServerConfig)) -> String {
    let config = config_for(&fixture_model(model), tweak);
    Engine::load(&config.models[0], &config.engine).err().expect("load fails").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reward_model_per_token_and_sequence_rewards() {
    let expected = expected("qwen2-reward");
    let engine = engine(&fixture_model("qwen2-reward"), |_| {});
    assert_eq!(engine.spec().tasks, vec![Task::TokenClassify, Task::Classify]);
    let router = router(engine, 2_000_000);
    let texts: Vec<Value> = expected["texts"].as_array().unwrap().iter().map(|t| t["text"].clone()).collect();
    // One text at a time, then all in one request (one batch).
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let reply = post(&router, "/pooling", json!({"input": case["text"]})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_rows_close(&rows(&reply.body["data"][0]["data"]), &rows(&case["token_rewards"]), &format!("text {i} token rewards"));
        let tokens = post(&router, "/tokenize", json!({"prompt": case["text"]})).await;
        assert_eq!(tokens.body["tokens"], case["input_ids"], "text {i} tokens");
    }
    let reply = post(&router, "/pooling", json!({"input": texts, "task": "token_classify"})).await;
    for (i, (item, case)) in reply.body["data"].as_array().unwrap().iter().zip(expected["texts"].as_array().unwrap()).enumerate() {
        assert_rows_close(&rows(&item["data"]), &rows(&case["token_rewards"]), &format!("batched text {i}"));
    }
    // The pooling task is token_classify (vLLM's): /classify answers 501 until the pooler
    // config switches the task; the sequence reward is then the last token's, raw, on /classify
    // and /pooling classify.
    assert_eq!(post(&router, "/classify", json!({"input": texts})).await.status, 501);
    // Reward models do not embed or score.
    assert_route_not_registered(&post(&router, "/v1/embeddings", json!({"input": "a"})).await);
    let router = common::router(engine_with_task("qwen2-reward", "classify"), 2_000_000);
    let classify = post(&router, "/classify", json!({"input": texts})).await;
    assert_eq!(classify.status, 200, "{}", classify.body);
    let pooled = post(&router, "/pooling", json!({"input": texts, "task": "classify"})).await;
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let reference = floats(&case["sequence_reward"]);
        assert!(max_abs_diff(&floats(&classify.body["data"][i]["probs"]), &reference) <= TOLERANCE, "classify {i}: {}", classify.body);
        assert!(max_abs_diff(&floats(&pooled.body["data"][i]["data"]), &reference) <= TOLERANCE, "pooling classify {i}");
    }
}

fn engine_with_task(name: &str, task: &str) -> poolserve::engine::Engine {
    engine(&fixture_model(name), |c| c.models[0].pooler.task = Some(task.into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_reward_model_scores_steps() {
    let expected = expected("qwen2-process-reward");
    let step = expected["step_tag_id"].as_u64().unwrap();
    let cases = expected["texts"].as_array().unwrap();
    let texts: Vec<Value> = cases.iter().map(|t| t["text"].clone()).collect();
    let engine = engine(
        &fixture_model("qwen2-process-reward"),
        with_pooler(json!({"pooling_type": "STEP", "step_tag_id": step, "returned_token_ids": [0, 1]})),
    );
    assert_eq!(engine.spec().tasks, vec![Task::TokenClassify]);
    let router = router(engine, 2_000_000);
    for (route_body, what) in [(json!({"input": texts.clone()}), "batched")] {
        let reply = post(&router, "/pooling", route_body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        for (i, (item, case)) in reply.body["data"].as_array().unwrap().iter().zip(cases).enumerate() {
            assert_rows_close(&rows(&item["data"]), &rows(&case["step_probs"]), &format!("{what} text {i} steps"));
        }
    }
    for (i, case) in cases.iter().enumerate() {
        let reply = post(&router, "/pooling", json!({"input": case["text"], "task": "token_classify"})).await;
        assert_rows_close(&rows(&reply.body["data"][0]["data"]), &rows(&case["step_probs"]), &format!("text {i} steps"));
    }
    // use_activation false: the raw logits of the kept rows.
    let raw = post(&router, "/pooling", json!({"input": cases[0]["text"], "use_activation": false})).await;
    let positions: Vec<usize> = cases[0]["step_positions"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as usize).collect();
    let logits = rows(&cases[0]["token_rewards"]);
    let want: Vec<Vec<f32>> = positions.iter().map(|&p| logits[p].clone()).collect();
    assert_rows_close(&rows(&raw.body["data"][0]["data"]), &want, "raw step logits");
    // Only token_classify: no /classify route.
    assert_route_not_registered(&post(&router, "/classify", json!({"input": "a"})).await);

    // Without step_tag_id the PRM uses vLLM's default, Qwen2.5-Math-PRM's `<extra_0>` (151651),
    // which the tiny fixture's vocabulary lacks: no step rows.
    let router = router_without_step();
    let reply = post(&router, "/pooling", json!({"input": cases[1]["text"]})).await;
    assert_eq!(reply.body["data"][0]["data"], json!([]), "{}", reply.body);
}

fn router_without_step() -> axum::Router {
    router(engine(&fixture_model("qwen2-process-reward"), |_| {}), 2_000_000)
}

#[test]
fn step_parameters_and_reward_layouts_are_checked_at_load() {
    let bad_column =
        load_error("qwen2-process-reward", with_pooler(json!({"pooling_type": "STEP", "step_tag_id": 1000, "returned_token_ids": [0, 5]})));
    assert!(bad_column.contains("returned_token_ids: 5 is not one of the model's 2 labels"), "{bad_column}");
    let step_on_embedder = load_error("qwen2-embed-last", with_pooler(json!({"pooling_type": "STEP"})));
    assert!(step_on_embedder.contains("STEP pooling needs a token-classification model"), "{step_on_embedder}");
    // A reward layout we do not know: one line saying what to do.
    let unknown = |c: &mut ServerConfig| {
        c.models[0].hf_overrides = serde_json::from_value(json!({"architectures": ["Qwen2ForRewardModeling"]})).unwrap();
    };
    let message = load_error("qwen2-reward", unknown);
    assert!(message.contains("reward-model layout poolserve does not know") && message.contains("--convert embed"), "{message}");
    assert_eq!(message.lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reward_layouts_convert_to_embedders() {
    // The seed's conversion table: *ForRewardModeling / *RewardModel served by --convert embed.
    for architecture in ["Qwen2ForRewardModeling", "Qwen2ForRewardModel"] {
        let engine = engine(&fixture_model("qwen2-reward"), |c| {
            c.models[0].hf_overrides = serde_json::from_value(json!({"architectures": [architecture]})).unwrap();
            c.models[0].convert = poolserve::loader::options::Convert::Embed;
        });
        assert_eq!(engine.spec().tasks, vec![Task::Embed, Task::TokenEmbed], "{architecture}");
        let router = router(engine, 2_000_000);
        let reply = post(&router, "/v1/embeddings", json!({"input": ["a", "b c"]})).await;
        assert_eq!(reply.status, 200, "{architecture}: {}", reply.body);
        assert_eq!(floats(&reply.body["data"][0]["embedding"]).len(), 32);
    }
}

#[test]
fn library_reward_matches_the_reference() {
    use poolserve::library::{LocalModel, LocalModelOptions, PoolingParams};
    let expected = expected("qwen2-reward");
    let model = LocalModel::load(LocalModelOptions::for_model(fixture_model("qwen2-reward").to_str().unwrap())).expect("loads");
    let texts: Vec<&str> = expected["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();
    let rewards = model.reward(&texts, &PoolingParams::default()).unwrap();
    for (i, (ours, case)) in rewards.iter().zip(expected["texts"].as_array().unwrap()).enumerate() {
        assert_rows_close(ours, &rows(&case["token_rewards"]), &format!("library text {i}"));
    }
}
