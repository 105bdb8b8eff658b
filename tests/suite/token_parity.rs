//! Parity of the token-level and sparse heads with the Hugging Face reference in
//! tests/fixtures: token classification (bert-tokcls), late interaction (bert-colbert MaxSim),
//! SPLADE (bert-splade with `--pooler-config`, bert-splade-st from its sentence-transformers
//! files), each input alone and in one batch.

use crate::common::*;
use poolserve::config::ServerConfig;
use poolserve::engine::params::PoolingParams;
use poolserve::engine::Engine;
use poolserve::input::Prompt;
use poolserve::pooling::PoolingOutput;
use poolserve::pooling::{PoolingType, Task};
use serde_json::Value;

fn texts(expected: &Value) -> Vec<Prompt> {
    expected["texts"].as_array().unwrap().iter().map(|t| Prompt::Text(t["text"].as_str().unwrap().into())).collect()
}

async fn outputs(engine: &Engine, prompts: Vec<Prompt>, task: Task) -> Vec<PoolingOutput> {
    let params = PoolingParams::default().verify(task, engine.spec()).unwrap();
    engine.encode(prompts, &params).await.unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_classifier_matches_reference() {
    let expected = expected("bert-tokcls");
    let engine = engine(&fixture_model("bert-tokcls"), |_| {});
    assert_eq!(engine.spec().tasks, vec![Task::TokenClassify]);
    let prompts = texts(&expected);
    let batched = outputs(&engine, prompts.clone(), Task::TokenClassify).await;
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let single = outputs(&engine, vec![prompts[i].clone()], Task::TokenClassify).await.remove(0);
        for (label, output) in [("single", single), ("batched", batched[i].clone())] {
            let PoolingOutput::Tokens(rows) = output else { panic!("per-token output expected") };
            let want = case["softmax"].as_array().unwrap();
            assert_eq!(rows.len(), want.len(), "text {i}: token count");
            for (t, (ours, theirs)) in rows.iter().zip(want).enumerate() {
                let diff = max_abs_diff(ours, &floats(theirs));
                assert!(diff <= 1e-4, "text {i} token {t} {label}: {diff}");
                let best = ours.iter().enumerate().fold(0, |b, (j, v)| if *v > ours[b] { j } else { b });
                assert_eq!(engine.spec().labels[best], case["labels"][t].as_str().unwrap(), "text {i} token {t} label");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_interaction_maxsim_matches_reference() {
    let expected = expected("bert-colbert");
    let engine = engine(&fixture_model("bert-colbert"), |_| {});
    assert_eq!(engine.spec().tasks, vec![Task::TokenEmbed, Task::Score]);
    let params = PoolingParams::default().verify(Task::Score, engine.spec()).unwrap();
    let pairs = expected["pairs"].as_array().unwrap();
    let queries: Vec<String> = pairs.iter().map(|p| p["query"].as_str().unwrap().to_string()).collect();
    let documents: Vec<String> = pairs.iter().map(|p| p["document"].as_str().unwrap().to_string()).collect();
    let (scores, _) = engine.score(&queries, &documents, &params, None).await.unwrap();
    for (j, pair) in pairs.iter().enumerate() {
        let want = pair["maxsim"].as_f64().unwrap() as f32;
        let query_tokens = pair["query_input_ids"].as_array().unwrap().len() as f32;
        // The fixture tolerance is on MaxSim per query token.
        assert!((scores[j] - want).abs() / query_tokens <= 1e-4, "pair {j}: {} vs {want}", scores[j]);
    }
}

async fn check_splade(name: &str, tweak: impl FnOnce(&mut ServerConfig)) {
    let expected = expected(name);
    let engine = engine(&fixture_model(name), tweak);
    assert_eq!(engine.spec().tasks, vec![Task::EmbedSparse]);
    let prompts = texts(&expected);
    let batched = outputs(&engine, prompts.clone(), Task::EmbedSparse).await;
    for (i, case) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let single = outputs(&engine, vec![prompts[i].clone()], Task::EmbedSparse).await.remove(0);
        for (label, output) in [("single", single), ("batched", batched[i].clone())] {
            let PoolingOutput::Sparse(weights) = output else { panic!("sparse output expected") };
            let want_ids: Vec<u32> = case["sparse"]["indices"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let want_values = floats(&case["sparse"]["values"]);
            let want: std::collections::HashMap<u32, f32> = want_ids.iter().copied().zip(want_values).collect();
            let ours: std::collections::HashMap<u32, f32> = weights.iter().copied().collect();
            // Same non-zero set, except weights within 1e-4 of zero (fixture README).
            for (id, w) in &want {
                let got = ours.get(id).copied().unwrap_or(0.0);
                assert!((got - w).abs() <= 1e-4, "{name} text {i} {label}: token {id}: {got} vs {w}");
            }
            for (id, w) in &ours {
                assert!(want.contains_key(id) || *w <= 1e-4, "{name} text {i} {label}: extra token {id} ({w})");
            }
            assert!(weights.windows(2).all(|p| p[0].0 < p[1].0), "ids ascend");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splade_from_pooler_config_matches_reference() {
    check_splade("bert-splade", |c| c.models[0].pooler.pooling_type = Some(PoolingType::Splade)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splade_from_sentence_transformers_files_matches_reference() {
    check_splade("bert-splade-st", |_| {}).await;
}

/// STEP pooling: only the tokens with `step_tag_id`, only the `returned_token_ids` label
/// columns, softmax over those (vLLM's StepPooler), from the reference logits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_pooling_selects_tagged_tokens_and_columns() {
    let expected = expected("bert-tokcls");
    let case = &expected["texts"][0];
    let ids: Vec<u32> = case["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let tag = ids[ids.len() - 2]; // the "." before [SEP]
    let engine = engine(&fixture_model("bert-tokcls"), |c| {
        c.models[0].pooler.pooling_type = Some(PoolingType::Step);
        c.models[0].pooler.step_tag_id = Some(tag);
        c.models[0].pooler.returned_token_ids = Some(vec![1, 3]);
    });
    let out = outputs(&engine, vec![Prompt::Text(case["text"].as_str().unwrap().into())], Task::TokenClassify).await.remove(0);
    let PoolingOutput::Tokens(rows) = out else { panic!("per-token output expected") };
    let tagged: Vec<usize> = ids.iter().enumerate().filter(|(_, id)| **id == tag).map(|(i, _)| i).collect();
    assert_eq!(rows.len(), tagged.len());
    for (row, &t) in rows.iter().zip(&tagged) {
        let logits = floats(&case["logits"][t]);
        let (a, b) = (logits[1], logits[3]);
        let want = [1.0 / (1.0 + (b - a).exp()), 1.0 / (1.0 + (a - b).exp())];
        assert!(max_abs_diff(row, &want) <= 1e-4, "token {t}: {row:?} vs {want:?}");
    }
}
