//! ELECTRA, ERNIE, DeBERTa-v2/v3, NomicBERT and JinaBERT through the real router, against their references in
//! tests/fixtures/expected (generators: tests/fixtures/make_encoder_families.py for ELECTRA,
//! ERNIE and DeBERTa-v2/v3, with transformers; tests/fixtures/make_nomic_bert.py for NomicBERT, with
//! nomic-ai's published modeling code; tests/fixtures/make_jina_bert.py for JinaBERT, with its
//! published forward pass): embeddings by cosine ≥ 0.9999, probabilities and
//! scores within 1e-4, every input alone and all in one batch, pairs with token types; a broken
//! folder of each family is a one-line startup error.

use crate::common::families::*;
use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electra_matches_transformers() {
    check_embeddings("electra-embed").await;
    check_classifier("electra-seqcls").await;
    check_cross_encoder("electra-reranker").await;
    check_token_classifier("electra-tokcls").await;
}

/// NomicBERT MoE (nomic-embed-text-v2-moe's layout: experts in layers 1 and 3, top-2 of 4,
/// plain GELU MLPs in the others) against the transcribed published forward
/// (tests/fixtures/make_nomic_moe.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomic_bert_moe_matches_the_published_forward() {
    check_embeddings("nomic-moe-tiny").await;
}

#[test]
fn broken_nomic_moe_folder_is_one_line() {
    broken_folder_is_one_line(
        "nomic-moe-tiny",
        |dir| drop_tensor(dir, "layers.3.mlp.experts.mlp.w2"),
        "encoder.layers.3.mlp.experts.mlp.w2",
    );
    broken_folder_is_one_line("nomic-moe-tiny", set_json("config.json", "moe_top_k", json!(5)), "moe_top_k 5 of 4 experts");
}

/// ERNIE (ernie-3.0's layout: `use_task_id`, four token types, legacy LayerNorm names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ernie_matches_transformers() {
    check_embeddings("ernie-embed").await;
    check_classifier("ernie-seqcls").await;
    check_token_classifier("ernie-tokcls").await;
}

#[test]
fn broken_ernie_folder_is_one_line() {
    broken_folder_is_one_line("ernie-seqcls", |dir| drop_tensor(dir, "task_type_embeddings"), "task_type_embeddings");
}

/// GTE as Alibaba publishes it (tests/fixtures/make_gte.py): gte-multilingual-base's fixed
/// NTK rope scaling, gte-base-en-v1.5's missing token-type table, and the multilingual
/// reranker's `NewForSequenceClassification` head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gte_matches_alibabas_published_code() {
    check_embeddings("gte-multilingual-tiny").await;
    check_embeddings("gte-en-v15-tiny").await;
    check_cross_encoder("gte-multilingual-reranker-tiny").await;
}

#[test]
fn broken_gte_folders_are_one_line() {
    broken_folder_is_one_line(
        "gte-multilingual-tiny",
        set_json("config.json", "logn_attention_scale", json!(true)),
        "logn_attention_scale",
    );
    broken_folder_is_one_line("gte-multilingual-tiny", set_json("config.json", "rope_scaling", json!({"type": "ntk"})), "needs `factor`");
    broken_folder_is_one_line("gte-multilingual-reranker-tiny", |d| drop_tensor(d, "pooler.dense"), "pooler.dense");
}

#[test]
fn broken_electra_folder_is_one_line() {
    broken_folder_is_one_line("electra-seqcls", |dir| drop_tensor(dir, "embeddings_project.weight"), "embeddings_project.weight");
}

/// NomicBERT (nomic-embed-text-v1.5's layout) against nomic-ai's published modeling code
/// (tests/fixtures/make_nomic_bert.py): embeddings alone and batched, its prompts by
/// `prompt_name` and by Cohere's `input_type`, Matryoshka dimensions, and a pair whose token
/// types change the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomic_bert_matches_the_published_code() {
    check_embeddings("nomic-embed-mean").await;
    let expected = expected("nomic-embed-mean");
    let server = router_for(&fixture_model("nomic-embed-mean"));
    for (prompt_name, input_type) in [("search_query", "search_query"), ("search_document", "search_document")] {
        let cases = expected["cases"][prompt_name].as_array().unwrap();
        let texts: Vec<&Value> = cases.iter().map(|c| &c["text"]).collect();
        let openai = post(&server, "/v1/embeddings", json!({"input": texts, "prompt_name": prompt_name})).await;
        assert_eq!(openai.status, StatusCode::OK, "{}", openai.body);
        let cohere = post(&server, "/v2/embed", json!({"texts": texts, "input_type": input_type, "embedding_types": ["float"]})).await;
        assert_eq!(cohere.status, StatusCode::OK, "{}", cohere.body);
        for (i, case) in cases.iter().enumerate() {
            let reference = floats(&case["embedding"]);
            let c = cosine(&floats(&openai.body["data"][i]["embedding"]), &reference);
            assert!(c >= 0.9999, "{prompt_name} text {i}: cosine {c}");
            let c = cosine(&floats(&cohere.body["embeddings"]["float"][i]), &reference);
            assert!(c >= 0.9999, "input_type {input_type} text {i}: cosine {c}");
        }
    }

    // Matryoshka: the published checkpoints do not flag it in config.json; with the flag (as
    // vLLM asks, `--hf-overrides '{"is_matryoshka": true}'`) `dimensions` truncates, then normalizes.
    let matryoshka = &expected["matryoshka"];
    let dims = matryoshka["dimensions"].as_u64().unwrap();
    let flagged = router(
        engine(&fixture_model("nomic-embed-mean"), |c| {
            c.models[0].hf_overrides.insert("is_matryoshka".into(), json!(true));
        }),
        2_000_000,
    );
    let reply = post(&flagged, "/v1/embeddings", json!({"input": texts(&expected), "dimensions": dims})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (i, want) in matryoshka["embeddings"].as_array().unwrap().iter().enumerate() {
        let got = floats(&reply.body["data"][i]["embedding"]);
        assert_eq!(got.len(), dims as usize);
        let diff = max_abs_diff(&got, &floats(want));
        assert!(diff <= TOLERANCE, "matryoshka text {i}: {diff}");
    }

    // A pair: token types 0 and 1 pick different rows of the type table.
    let pair = &expected["pair"];
    let engine = engine(&fixture_model("nomic-embed-mean"), |_| {});
    let params = poolserve::engine::params::PoolingParams::default().verify(poolserve::pooling::Task::Embed, engine.spec()).unwrap();
    let prompt = poolserve::input::Prompt::Pair(pair["text"].as_str().unwrap().into(), pair["text_pair"].as_str().unwrap().into());
    let prepared = engine.prepare(vec![prompt.clone()], &params).await.unwrap().remove(0);
    assert_eq!(prepared.ids, pair["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>());
    let (outputs, _) = engine.encode(vec![prompt], &params).await.unwrap();
    let poolserve::pooling::PoolingOutput::Vector(got) = &outputs[0] else { panic!("one vector") };
    let c = cosine(got, &floats(&pair["embedding"]));
    assert!(c >= 0.9999, "pair: cosine {c}");
}

/// A NomicBERT folder as transformers 5's own `NomicBertModel` saves it (BERT-style config
/// names over the published tensor names, an exact `intermediate_size`, `rope_parameters`),
/// against that class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nomic_bert_saved_by_transformers5_matches_it() {
    check_embeddings("nomic-embed-t5").await;
}

#[test]
fn broken_nomic_bert_folder_is_one_line() {
    broken_folder_is_one_line("nomic-embed-mean", |dir| drop_tensor(dir, "layers.1.mlp.fc12"), "encoder.layers.1.mlp.fc12.weight");
    broken_folder_is_one_line(
        "nomic-embed-mean",
        |dir| {
            let path = dir.join("config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["rotary_emb_interleaved"] = json!(true);
            std::fs::write(&path, config.to_string()).unwrap();
        },
        "NomicBERT with rotary_emb_interleaved: true is not supported",
    );
}

/// DeBERTa-v3's layout (shared attention keys, LayerNorm'ed relative embeddings, log-bucketed
/// distances, no absolute positions) on the embedder, classifier and cross-encoder; v2's older
/// layout (separate position projections, clamped distances, absolute positions and token
/// types) on the token classifier. References: transformers' `DebertaV2*` classes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deberta_matches_transformers() {
    check_embeddings("deberta-embed").await;
    check_classifier("deberta-seqcls").await;
    check_cross_encoder("deberta-reranker").await;
    check_token_classifier("deberta-tokcls").await;
}

/// A DeBERTa folder as microsoft/deberta-v3-* publish theirs: `spm.model` and the slow
/// tokenizer's tokenizer_config.json, no tokenizer.json. The tokenizer built from spm.model
/// gives transformers' ids (texts with whitespace runs, tabs, newlines and combining accents,
/// and pairs with their type ids), and the classifier the same outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deberta_without_tokenizer_json_tokenizes_from_spm_model() {
    let dir = std::env::temp_dir().join(format!("poolserve-deberta-spm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&fixture_model("deberta-seqcls"), &dir);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let published = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sentencepiece/deberta");
    for file in ["spm.model", "tokenizer_config.json"] {
        std::fs::copy(published.join(file), dir.join(file)).unwrap();
    }
    let engine = engine(&dir, |_| {});
    let reference = expected("deberta-spm");
    let params = poolserve::engine::params::PoolingParams::default().verify(poolserve::pooling::Task::Classify, engine.spec()).unwrap();
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
    for case in reference["texts"].as_array().unwrap() {
        let prompt = poolserve::input::Prompt::Text(case["text"].as_str().unwrap().into());
        let prepared = engine.prepare(vec![prompt], &params).await.unwrap().remove(0);
        assert_eq!(prepared.ids, ids(&case["input_ids"]), "{:?}", case["text"]);
    }
    for pair in reference["pairs"].as_array().unwrap() {
        let prompt = poolserve::input::Prompt::Pair(pair["query"].as_str().unwrap().into(), pair["document"].as_str().unwrap().into());
        let prepared = engine.prepare(vec![prompt], &params).await.unwrap().remove(0);
        assert_eq!(prepared.ids, ids(&pair["input_ids"]), "{:?}", pair["query"]);
    }
    let router = router(engine, 2_000_000);
    let classified = expected("deberta-seqcls");
    for (i, case) in classified["texts"].as_array().unwrap().iter().enumerate() {
        let reply = post(&router, "/classify", json!({"input": case["text"]})).await;
        let diff = max_abs_diff(&floats(&reply.body["data"][0]["probs"]), &floats(&case["softmax"]));
        assert!(diff <= TOLERANCE, "text {i}: {diff}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn broken_deberta_folder_is_one_line() {
    broken_folder_is_one_line("deberta-seqcls", |dir| drop_tensor(dir, "rel_embeddings"), "deberta.encoder.rel_embeddings.weight");
    broken_folder_is_one_line(
        "deberta-embed",
        |dir| {
            let path = dir.join("config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["conv_kernel_size"] = json!(3);
            std::fs::write(&path, config.to_string()).unwrap();
        },
        "conv_kernel_size",
    );
}

/// JinaBERT (jina-embeddings-v2's `JinaBertForMaskedLM` in its sentence-transformers folder, and
/// jina-reranker-v1's `JinaBertForSequenceClassification`) against the published forward pass
/// (tests/fixtures/make_jina_bert.py): symmetric ALiBi with 6 heads, the GEGLU feed-forward,
/// mean pooling, a 698-token input past BERT's 512 positions, pairs with token types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jina_bert_matches_the_published_code() {
    check_embeddings("jina-embed").await;
    check_cross_encoder("jina-reranker").await;
    // jina-embeddings-v2-base-code's qk-post-norm variant.
    check_embeddings("jina-code-embed").await;
    let longest = expected("jina-embed")["texts"].as_array().unwrap().iter().map(|t| t["input_ids"].as_array().unwrap().len()).max();
    assert!(longest > Some(512), "the fixture holds an input longer than BERT's position table");
}

#[test]
fn broken_jina_bert_folder_is_one_line() {
    broken_folder_is_one_line("jina-embed", |dir| drop_tensor(dir, "layer.1.mlp.gated_layers"), "encoder.layer.1.mlp.gated_layers.weight");
    broken_folder_is_one_line("jina-code-embed", |dir| drop_tensor(dir, "layer.1.layer_norm_1"), "encoder.layer.1.layer_norm_1.weight");
    broken_folder_is_one_line(
        "jina-reranker",
        |dir| {
            let path = dir.join("config.json");
            let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["feed_forward_type"] = json!("original");
            std::fs::write(&path, config.to_string()).unwrap();
        },
        "feed_forward_type `original`",
    );
}

/// Lexical weights as `(id, weight)` from TEI's `[{"index", "value"}]` (or FlagEmbedding's
/// `{"id": weight}`), in id order.
fn sparse_of(value: &Value) -> Vec<(u64, f64)> {
    let mut pairs: Vec<(u64, f64)> = match value {
        Value::Array(items) => items.iter().map(|i| (i["index"].as_u64().unwrap(), i["value"].as_f64().unwrap())).collect(),
        Value::Object(map) => map.iter().map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap())).collect(),
        other => panic!("not sparse weights: {other}"),
    };
    pairs.sort_by_key(|p| p.0);
    pairs
}

fn assert_sparse_equal(got: &Value, want: &Value, what: &str) {
    let (got, want) = (sparse_of(got), sparse_of(want));
    assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), want.iter().map(|p| p.0).collect::<Vec<_>>(), "{what}: token ids");
    for ((id, g), (_, w)) in got.iter().zip(&want) {
        assert!((g - w).abs() <= TOLERANCE as f64, "{what}: token {id}: {g} vs {w}");
    }
}

fn assert_rows_close(got: &Value, want: &Value, what: &str) {
    let (got, want) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        let diff = max_abs_diff(&floats(g), &floats(w));
        assert!(diff <= TOLERANCE, "{what}: row {r} differs by {diff}");
    }
}

/// BGE-M3 as BAAI/bge-m3 ships it (XLM-R with `sparse_linear.pt` and `colbert_linear.pt`)
/// against FlagEmbedding's `BGEM3FlagModel` (tests/fixtures/make_bge_m3.py): the dense
/// embedding, lexical weights (`/embed_sparse`, `/pooling` embed_sparse), vLLM's per-token
/// weights (token_classify) and ColBERT vectors (token_embed), all three from one request, and
/// the weighted hybrid score on `/score` and `/rerank`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bge_m3_matches_flag_embedding() {
    let name = "bge-m3-tiny";
    check_embeddings(name).await;
    let expected = expected(name);
    let router = router_for(&fixture_model(name));
    let cases = expected["texts"].as_array().unwrap();
    let inputs = texts(&expected);
    let dense = post(&router, "/v1/embeddings", json!({"input": inputs})).await;
    for (i, case) in cases.iter().enumerate() {
        // The tiny model's dense vectors lie close together: hold them to values, not only angles.
        let diff = max_abs_diff(&floats(&dense.body["data"][i]["embedding"]), &floats(&case["embedding"]));
        assert!(diff <= TOLERANCE, "dense text {i}: {diff}");
    }

    let tei = post(&router, "/embed_sparse", json!({"inputs": inputs})).await;
    assert_eq!(tei.status, StatusCode::OK, "{}", tei.body);
    let pooled = post(&router, "/pooling", json!({"input": inputs, "task": "embed_sparse"})).await;
    assert_eq!(pooled.status, StatusCode::OK, "{}", pooled.body);
    let tokens = post(&router, "/pooling", json!({"input": inputs, "task": "token_classify"})).await;
    assert_eq!(tokens.status, StatusCode::OK, "{}", tokens.body);
    let colbert = post(&router, "/pooling", json!({"input": inputs, "task": "token_embed"})).await;
    assert_eq!(colbert.status, StatusCode::OK, "{}", colbert.body);
    let all =
        post(&router, "/pooling", json!({"input": inputs, "return_dense": true, "return_sparse": true, "return_colbert_vecs": true})).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    for (i, case) in cases.iter().enumerate() {
        assert_sparse_equal(&tei.body[i], &case["lexical_weights"], &format!("/embed_sparse text {i}"));
        assert_sparse_equal(&pooled.body["data"][i]["data"], &case["lexical_weights"], &format!("embed_sparse text {i}"));
        // vLLM's token_classify: every token's weight but the leading <s> and trailing </s>.
        let weights = case["token_weights"].as_array().unwrap();
        let inner: Vec<Value> = weights[1..weights.len() - 1].iter().map(|w| json!([w])).collect();
        assert_rows_close(&tokens.body["data"][i]["data"], &Value::Array(inner), &format!("token_classify text {i}"));
        assert_rows_close(&colbert.body["data"][i]["data"], &case["colbert_vecs"], &format!("token_embed text {i}"));
        let one = &all.body["data"][i]["data"];
        assert!(max_abs_diff(&floats(&one["dense_vecs"]), &floats(&case["embedding"])) <= TOLERANCE, "dense_vecs text {i}");
        assert_sparse_equal(&one["lexical_weights"], &case["lexical_weights"], &format!("lexical_weights text {i}"));
        assert_rows_close(&one["colbert_vecs"], &case["colbert_vecs"], &format!("colbert_vecs text {i}"));
    }
    // Only what is asked for.
    let some = post(&router, "/pooling", json!({"input": inputs[0], "return_sparse": true})).await;
    let keys: Vec<&String> = some.body["data"][0]["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["lexical_weights"]);

    // Scores: dense cosine by default (the pooling task is embed), the weighted hybrid when asked.
    let weights = &expected["weights_for_different_modes"];
    for (i, pair) in expected["pairs"].as_array().unwrap().iter().enumerate() {
        let body = json!({"text_1": pair["query"], "text_2": pair["passage"]});
        let plain = post(&router, "/score", body.clone()).await;
        let got = plain.body["data"][0]["score"].as_f64().unwrap();
        assert!((got - pair["dense"].as_f64().unwrap()).abs() <= TOLERANCE as f64, "pair {i} dense: {got}");
        let mut weighted = body;
        weighted["weights_for_different_modes"] = weights.clone();
        let hybrid = post(&router, "/score", weighted).await;
        assert_eq!(hybrid.status, StatusCode::OK, "{}", hybrid.body);
        let got = hybrid.body["data"][0]["score"].as_f64().unwrap();
        let want = pair["colbert+sparse+dense"].as_f64().unwrap();
        assert!((got - want).abs() <= TOLERANCE as f64, "pair {i} hybrid: {got} vs {want}");
        for (mode, w) in [("dense", json!([1, 0, 0])), ("sparse", json!([0, 1, 0])), ("colbert", json!([0, 0, 1]))] {
            let one =
                post(&router, "/score", json!({"text_1": pair["query"], "text_2": pair["passage"], "weights_for_different_modes": w}))
                    .await;
            let got = one.body["data"][0]["score"].as_f64().unwrap();
            assert!((got - pair[mode].as_f64().unwrap()).abs() <= TOLERANCE as f64, "pair {i} {mode}: {got}");
        }
    }
    let first = &expected["pairs"][0]["query"];
    let same: Vec<&Value> = expected["pairs"].as_array().unwrap().iter().filter(|p| &p["query"] == first).collect();
    let docs: Vec<&Value> = same.iter().map(|p| &p["passage"]).collect();
    let reranked = post(&router, "/rerank", json!({"query": first, "documents": docs, "weights_for_different_modes": weights})).await;
    assert_eq!(reranked.status, StatusCode::OK, "{}", reranked.body);
    for result in reranked.body["results"].as_array().unwrap() {
        let index = result["index"].as_u64().unwrap() as usize;
        let want = same[index]["colbert+sparse+dense"].as_f64().unwrap();
        assert!((result["relevance_score"].as_f64().unwrap() - want).abs() <= TOLERANCE as f64, "rerank {index}");
    }

    // Refused clearly.
    let bad = post(&router, "/score", json!({"text_1": "a", "text_2": "b", "weights_for_different_modes": [1, 1]})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let bad = post(&router, "/pooling", json!({"input": "a", "return_dense": false})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let bad = post(&router, "/pooling", json!({"input": "a", "task": "token_embed", "return_sparse": true})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let other = router_for(&fixture_model("xlmr-embed-cls"));
    let bad = post(&other, "/pooling", json!({"input": "a", "return_sparse": true})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body["error"]["message"].as_str().unwrap().contains("no sparse and ColBERT heads"), "{}", bad.body);
    let bad = post(&other, "/score", json!({"text_1": "a", "text_2": "b", "weights_for_different_modes": [1, 1, 1]})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
}

/// With vLLM's `--pooler-config '{"task": "token_embed"}'` BGE-M3 scores by late interaction:
/// vLLM's MaxSim over the ColBERT vectors, the sum over query vectors (FlagEmbedding's colbert
/// score is the mean).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bge_m3_scores_by_late_interaction_when_its_task_is_token_embed() {
    let name = "bge-m3-tiny";
    let expected = expected(name);
    let router = router(engine(&fixture_model(name), |c| c.models[0].pooler.task = Some("token_embed".into())), 2_000_000);
    let cases = expected["texts"].as_array().unwrap();
    for pair in expected["pairs"].as_array().unwrap() {
        let reply = post(&router, "/score", json!({"text_1": pair["query"], "text_2": pair["passage"]})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let query_vectors = cases.iter().find(|c| c["text"] == pair["query"]).unwrap()["colbert_vecs"].as_array().unwrap().len();
        let want = pair["colbert"].as_f64().unwrap() * query_vectors as f64;
        let got = reply.body["data"][0]["score"].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-3, "MaxSim {got} vs {want}");
    }
}

#[test]
fn broken_bge_m3_folder_is_one_line() {
    broken_folder_is_one_line("bge-m3-tiny", |dir| std::fs::remove_file(dir.join("colbert_linear.pt")).unwrap(), "the folder has only one");
    broken_folder_is_one_line(
        "bge-m3-tiny",
        |dir| std::fs::write(dir.join("sparse_linear.pt"), b"not a pickle").unwrap(),
        "sparse_linear.pt",
    );
}
