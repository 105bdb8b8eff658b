//! Real token-level models (fetched by scripts/fetch-models.sh) through the real router against
//! the transformers references in tests/fixtures/expected (copied from shared/models/expected):
//! SPLADE-tiny over /embed_sparse and /pooling, the Rampart PII NER model over /pooling.

use crate::common::*;
use axum::http::StatusCode;
use poolserve::pooling::PoolingType;
use serde_json::{json, Value};
use std::collections::HashMap;

fn sparse_map(list: &Value) -> HashMap<u64, f32> {
    list.as_array().unwrap().iter().map(|p| (p["index"].as_u64().unwrap(), p["value"].as_f64().unwrap() as f32)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splade_tiny_matches_transformers_and_ranks_the_query_terms() {
    let Some(dir) = real_model_dir("splade-tiny") else { return };
    let reference = expected("splade-tiny");
    let router = router(engine(&dir, |c| c.models[0].pooler.pooling_type = Some(PoolingType::Splade)), 2_000_000);
    let texts: Vec<&str> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();
    // TEI's /embed_sparse refuses an empty text as TEI does; vLLM's /pooling embeds it (its
    // special tokens). Every reference text goes through /pooling, the others through both.
    let reply = post(&router, "/embed_sparse", json!({"inputs": texts})).await;
    assert_tei_error(&reply, StatusCode::BAD_REQUEST, "Empty", "Input validation error: `inputs` cannot be empty");
    let non_empty: Vec<usize> = (0..texts.len()).filter(|&i| !texts[i].is_empty()).collect();
    let tei = post(&router, "/embed_sparse", json!({"inputs": non_empty.iter().map(|&i| texts[i]).collect::<Vec<_>>()})).await;
    assert_eq!(tei.status, StatusCode::OK, "{}", tei.body);
    let vllm = post(&router, "/pooling", json!({"input": texts, "task": "embed_sparse"})).await;
    assert_eq!(vllm.status, StatusCode::OK, "{}", vllm.body);
    let outputs: Vec<HashMap<u64, f32>> = vllm.body["data"].as_array().unwrap().iter().map(|d| sparse_map(&d["data"])).collect();
    for (k, &i) in non_empty.iter().enumerate() {
        assert_eq!(sparse_map(&tei.body[k]), outputs[i], "text {i}: /embed_sparse and /pooling differ");
    }
    for (i, case) in reference["texts"].as_array().unwrap().iter().enumerate() {
        let ours = &outputs[i];
        let ids = case["sparse"]["indices"].as_array().unwrap();
        let values = case["sparse"]["values"].as_array().unwrap();
        let want: HashMap<u64, f32> = ids.iter().zip(values).map(|(k, v)| (k.as_u64().unwrap(), v.as_f64().unwrap() as f32)).collect();
        for (id, w) in &want {
            let got = ours.get(id).copied().unwrap_or(0.0);
            assert!((got - w).abs() <= 1e-4, "text {i} token {id}: {got} vs {w}");
        }
        assert!(ours.iter().all(|(id, w)| want.contains_key(id) || *w <= 1e-4), "text {i}: extra non-zero weights");
        // The strongest terms are the reference's top five, in order.
        let mut ranked: Vec<(&u64, &f32)> = ours.iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(a.1));
        let top: Vec<u64> = ranked.iter().take(5).map(|(id, _)| **id).collect();
        let want_top: Vec<u64> = case["top5"].as_array().unwrap().iter().map(|t| t[1].as_u64().unwrap()).collect();
        assert_eq!(top, want_top, "text {i}: top terms");
    }
    // "capital" (3007) and "france" (2605) lead for the query.
    let top = &reference["texts"][0]["top5"];
    assert_eq!((top[0][0].as_str(), top[1][0].as_str()), (Some("capital"), Some("france")));

    // The same through /pooling; the query scores high against the matching document only.
    let reply = post(&router, "/pooling", json!({"input": [texts[0], texts[1]], "task": "embed_sparse"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let (q, d) = (sparse_map(&reply.body["data"][0]["data"]), sparse_map(&reply.body["data"][1]["data"]));
    let dot: f32 = q.iter().map(|(id, w)| w * d.get(id).copied().unwrap_or(0.0)).sum();
    let want_dot = reference["dot"][0][1].as_f64().unwrap() as f32;
    assert!((dot - want_dot).abs() <= 1e-3, "dot {dot} vs {want_dot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rampart_labels_names_and_emails() {
    let Some(dir) = real_model_dir("rampart-ner") else { return };
    let reference = expected("rampart-ner");
    let router = router(engine(&dir, |_| {}), 2_000_000);
    let labels = |i: usize| reference["id2label"][i.to_string()].as_str().unwrap().to_string();
    for (i, case) in reference["texts"].as_array().unwrap().iter().enumerate() {
        let text = case["text"].as_str().unwrap();
        let reply = post(&router, "/pooling", json!({"input": text, "task": "token_classify", "use_activation": false})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let rows = reply.body["data"][0]["data"].as_array().unwrap();
        let want = case["logits"].as_array().unwrap();
        assert_eq!(rows.len(), want.len(), "text {i}: tokens");
        let mut ours = Vec::new();
        for (t, (row, want_row)) in rows.iter().zip(want).enumerate() {
            let (row, want_row) = (floats(row), floats(want_row));
            assert!(max_abs_diff(&row, &want_row) <= 1e-4, "text {i} token {t}: logits differ by {}", max_abs_diff(&row, &want_row));
            ours.push(labels(row.iter().enumerate().fold(0, |b, (j, v)| if *v > row[b] { j } else { b })));
        }
        let want_labels: Vec<String> = case["labels"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect();
        assert_eq!(ours, want_labels, "text {i}: labels");
    }
    // "My name is John Smith and my email is john.smith@example.com.": a person and an email.
    let first = &reference["texts"][0];
    let tokens: Vec<&str> = first["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let reply = post(&router, "/pooling", json!({"input": first["text"], "task": "token_classify"})).await;
    let rows = reply.body["data"][0]["data"].as_array().unwrap();
    let label_of = |t: usize| {
        let p = floats(&rows[t]);
        labels(p.iter().enumerate().fold(0, |b, (j, v)| if *v > p[b] { j } else { b }))
    };
    assert!((floats(&rows[4]).iter().sum::<f32>() - 1.0).abs() < 1e-4, "probabilities per token");
    assert_eq!((tokens[4], label_of(4).as_str()), ("john", "B-GIVEN_NAME"));
    assert_eq!((tokens[5], label_of(5).as_str()), ("smith", "B-SURNAME"));
    assert_eq!((tokens[10], label_of(10).as_str()), ("john", "B-EMAIL"));
}
