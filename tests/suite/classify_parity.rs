//! Parity of the classification and cross-encoder heads with the Hugging Face reference in
//! tests/fixtures: logits and probabilities within 1e-4, pair token ids and token_type_ids
//! identical, each input alone and in one mixed batch.

use crate::common::*;
use poolserve::engine::params::{PoolingParams, ResolvedParams};
use poolserve::engine::Engine;
use poolserve::input::Prompt;
use poolserve::pooling::PoolingOutput;
use poolserve::pooling::Task;
use serde_json::Value;

const TOLERANCE: f32 = 1e-4;

fn params(engine: &Engine, task: Task, use_activation: Option<bool>) -> ResolvedParams {
    let p = PoolingParams { use_activation, ..Default::default() };
    p.verify(task, engine.spec()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

async fn outputs(engine: &Engine, prompts: Vec<Prompt>, params: &ResolvedParams) -> Vec<Vec<f32>> {
    let (outputs, _) = engine.encode(prompts, params).await.unwrap();
    outputs
        .into_iter()
        .map(|o| match o {
            PoolingOutput::Vector(v) => v,
            _ => panic!("expected one vector per input"),
        })
        .collect()
}

fn assert_within(ours: &[f32], reference: &[f32], what: &str) {
    let diff = max_abs_diff(ours, reference);
    assert!(diff <= TOLERANCE, "{what}: max abs diff {diff} (ours {ours:?}, reference {reference:?})");
}

/// Single texts through `/classify`'s path: logits (no activation) and probabilities.
async fn check_texts(name: &str, activation: &str) {
    let expected = expected(name);
    let engine = engine(&fixture_model(name), |_| {});
    let cases = expected["texts"].as_array().unwrap();
    let prompts: Vec<Prompt> = cases.iter().map(|c| Prompt::Text(c["text"].as_str().unwrap().into())).collect();
    let probs = params(&engine, Task::Classify, None);
    let logits = params(&engine, Task::Classify, Some(false));
    let batched = outputs(&engine, prompts.clone(), &probs).await;
    let batched_logits = outputs(&engine, prompts.clone(), &logits).await;
    for (i, case) in cases.iter().enumerate() {
        let tokenized = engine.prepare(vec![prompts[i].clone()], &probs).await.unwrap().remove(0);
        assert_eq!(tokenized.ids, ids(&case["input_ids"]), "{name} text {i}: token ids");
        let single = outputs(&engine, vec![prompts[i].clone()], &probs).await.remove(0);
        assert_within(&single, &floats(&case[activation]), &format!("{name} text {i} single {activation}"));
        assert_within(&batched[i], &floats(&case[activation]), &format!("{name} text {i} batched {activation}"));
        assert_within(&batched_logits[i], &floats(&case["logits"]), &format!("{name} text {i} logits"));
        assert!(max_abs_diff(&single, &batched[i]) <= 1e-5, "{name} text {i}: batched differs from single");
    }
    let labels = &engine.spec().labels;
    for (i, case) in cases.iter().enumerate() {
        let best = batched[i].iter().enumerate().fold(0, |b, (j, v)| if *v > batched[i][b] { j } else { b });
        assert_eq!(labels[best], case["label"].as_str().unwrap(), "{name} text {i}: label");
    }
}

/// Query/document pairs through the cross-encoder: tokens, segment ids, logit and score.
async fn check_pairs(name: &str) {
    let expected = expected(name);
    let engine = engine(&fixture_model(name), |_| {});
    let cases = expected["pairs"].as_array().unwrap();
    let prompts: Vec<Prompt> =
        cases.iter().map(|c| Prompt::Pair(c["query"].as_str().unwrap().into(), c["document"].as_str().unwrap().into())).collect();
    let score = params(&engine, Task::Score, None);
    let raw = params(&engine, Task::Score, Some(false));
    let tokenized = engine.prepare(prompts.clone(), &score).await.unwrap();
    let batched = outputs(&engine, prompts.clone(), &score).await;
    let batched_raw = outputs(&engine, prompts.clone(), &raw).await;
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(tokenized[i].ids, ids(&case["input_ids"]), "{name} pair {i}: token ids");
        let want_types = case.get("token_type_ids").map(ids).unwrap_or_else(|| vec![0; tokenized[i].len()]);
        assert_eq!(tokenized[i].type_ids, want_types, "{name} pair {i}: token_type_ids");
        let single = outputs(&engine, vec![prompts[i].clone()], &score).await.remove(0);
        let want = case["score"].as_f64().unwrap() as f32;
        assert_within(&single, &[want], &format!("{name} pair {i} single score"));
        assert_within(&batched[i], &[want], &format!("{name} pair {i} batched score"));
        assert_within(&batched_raw[i], &[case["logit"].as_f64().unwrap() as f32], &format!("{name} pair {i} logit"));
    }

    // The same pairs through the scoring path of /score and /rerank (1:N with the first query).
    let queries = vec![cases[0]["query"].as_str().unwrap().to_string()];
    let documents: Vec<String> = cases[..2].iter().map(|c| c["document"].as_str().unwrap().to_string()).collect();
    let (scores, _) = engine.score(&queries, &documents, &score, None).await.unwrap();
    for (j, s) in scores.iter().enumerate() {
        assert_within(&[*s], &[cases[j]["score"].as_f64().unwrap() as f32], &format!("{name} 1:N score {j}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bert_sequence_classifier_matches_reference() {
    check_texts("bert-seqcls", "softmax").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modernbert_sequence_classifier_matches_reference() {
    check_texts("modernbert-seqcls", "softmax").await;
}

/// Generated by tests/fixtures/make_extra_classifiers.py (transformers as the reference).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distilbert_and_mpnet_classifiers_match_reference() {
    check_texts("distilbert-seqcls", "softmax").await;
    check_texts("mpnet-seqcls", "softmax").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bert_cross_encoder_matches_reference() {
    check_texts("bert-reranker", "sigmoid").await;
    check_pairs("bert-reranker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xlmr_cross_encoder_matches_reference() {
    check_texts("xlmr-reranker", "sigmoid").await;
    check_pairs("xlmr-reranker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_of_pairs_is_longest_first() {
    let engine = engine(&fixture_model("bert-reranker"), |_| {});
    let query = "what is the capital of france".to_string();
    let document = "paris is the capital of france and the largest city of the country".to_string();
    let pair = vec![Prompt::Pair(query.clone(), document.clone())];
    let full = engine.prepare(pair.clone(), &params(&engine, Task::Score, None)).await.unwrap().remove(0);
    let mut p = PoolingParams { truncate_prompt_tokens: Some(30), ..Default::default() }.verify(Task::Score, engine.spec()).unwrap();
    let cut = engine.prepare(pair.clone(), &p).await.unwrap().remove(0);
    assert_eq!(cut.len(), 30);
    // Longest-first: the longer document loses tokens until it is as short as the query.
    let query_len = |t: &poolserve::models::batch::TokenizedInput| t.type_ids.iter().filter(|&&x| x == 0).count();
    assert_eq!(query_len(&cut), query_len(&full));
    assert_eq!(&cut.ids[..query_len(&full)], &full.ids[..query_len(&full)]);

    p.truncate_to = None;
    p.pair_limits.query = Some(3);
    p.pair_limits.document = Some(2);
    let capped = engine.prepare(pair, &p).await.unwrap().remove(0);
    assert_eq!(capped.len(), 3 + 2 + 3, "[CLS] q×3 [SEP] d×2 [SEP]");
    assert_eq!(capped.type_ids, vec![0, 0, 0, 0, 0, 1, 1, 1]);
}

/// Pairs of prompt-based rerankers: the rendered Qwen3-Reranker prompt, its tokens (no special
/// tokens added) and the score, through the same path as `/score` and `/rerank`.
async fn check_template_pairs(name: &str, engine: Engine) {
    let expected = expected(name);
    let template = engine.spec().rerank_template.clone().expect("a Qwen3 reranker gets the prompt template");
    let cases = expected["pairs"].as_array().unwrap();
    let score = params(&engine, Task::Score, None);
    let raw = params(&engine, Task::Score, Some(false));
    let mut plain = score.clone();
    plain.add_special_tokens = false;
    for (i, case) in cases.iter().enumerate() {
        let (query, document) = (case["query"].as_str().unwrap(), case["document"].as_str().unwrap());
        let prompt = template.render(query, document, None);
        assert_eq!(prompt, case["prompt"].as_str().unwrap(), "{name} pair {i}: prompt");
        let tokenized = engine.prepare(vec![Prompt::Text(prompt)], &plain).await.unwrap().remove(0);
        assert_eq!(tokenized.ids, ids(&case["input_ids"]), "{name} pair {i}: token ids");
    }
    let queries: Vec<String> = cases.iter().map(|c| c["query"].as_str().unwrap().to_string()).collect();
    let documents: Vec<String> = cases.iter().map(|c| c["document"].as_str().unwrap().to_string()).collect();
    let (scores, _) = engine.score(&queries, &documents, &score, None).await.unwrap();
    let (logits, _) = engine.score(&queries, &documents, &raw, None).await.unwrap();
    for (i, case) in cases.iter().enumerate() {
        assert_within(&[scores[i]], &[case["score"].as_f64().unwrap() as f32], &format!("{name} pair {i} score"));
        let want_logit = match case.get("logit") {
            Some(l) => l.as_f64().unwrap(),
            None => case["logit_yes"].as_f64().unwrap() - case["logit_no"].as_f64().unwrap(),
        };
        assert_within(&[logits[i]], &[want_logit as f32], &format!("{name} pair {i} logit"));
        let (single, _) = engine.score(&queries[i..=i], &documents[i..=i], &score, None).await.unwrap();
        assert!((single[0] - scores[i]).abs() <= 1e-5, "{name} pair {i}: batched differs from single");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_sequence_classifier_matches_reference() {
    check_texts("qwen3-seqcls", "sigmoid").await;
    check_template_pairs("qwen3-seqcls", engine(&fixture_model("qwen3-seqcls"), |_| {})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_causal_lm_converts_to_the_reranker() {
    let engine = engine(&fixture_model("qwen3-causal-reranker"), |c| {
        let overrides = serde_json::json!({
            "architectures": ["Qwen3ForSequenceClassification"],
            "classifier_from_token": ["no", "yes"],
            "is_original_qwen3_reranker": true
        });
        c.models[0].hf_overrides = overrides.as_object().unwrap().clone();
    });
    assert!(engine.spec().supports(Task::Score));
    check_template_pairs("qwen3-causal-reranker", engine).await;
}

/// token_classify of sequence classifiers (vLLM's `DispatchPooler.for_seq_cls`: the classifier
/// on every token; BERT's pooler, DistilBERT's pre_classifier and ModernBERT's head stay
/// sequence-level, RoBERTa's and MPNet's dense layer runs per token), against transformers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_classifiers_classify_every_token() {
    let reference = expected("vllm-compat");
    for (name, case) in reference["token_classify"].as_object().unwrap() {
        let engine = engine(&fixture_model(name), |c| c.models[0].pooler.task = Some("token_classify".into()));
        assert_eq!(engine.spec().pooling_task, Task::TokenClassify, "{name}");
        let params = params(&engine, Task::TokenClassify, None);
        let inputs = case["inputs"].as_array().unwrap();
        let prompts = inputs.iter().map(|i| Prompt::Text(i["text"].as_str().unwrap().to_string())).collect();
        let (outputs, _) = engine.encode(prompts, &params).await.unwrap();
        for (output, input) in outputs.into_iter().zip(inputs) {
            let PoolingOutput::Tokens(rows) = output else { panic!("{name}: expected one row per token") };
            let want = input["probs"].as_array().unwrap();
            assert_eq!(rows.len(), want.len(), "{name}: tokens");
            for (t, (row, want)) in rows.iter().zip(want).enumerate() {
                assert_within(row, &floats(want), &format!("{name} token {t}"));
            }
        }
    }
}
