//! The real all-MiniLM-L6-v2 (fetched by scripts/fetch-minilm.sh) against the embeddings
//! sentence-transformers computes (tests/fixtures/expected/all-MiniLM-L6-v2.json), through the
//! real router: parity, truncation at max_seq_length, the too-long error, and semantics; and a
//! MiniLM-sized cross-encoder built from it against sentence-transformers' CrossEncoder.

use crate::common;

use crate::common::*;
use axum::http::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_matches_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    let reference = expected("all-MiniLM-L6-v2");
    let engine = engine(&dir, |_| {});
    assert_eq!(engine.spec().max_model_len, 256, "max_seq_length wins over tokenizer.json's baked-in 128");
    let router = router(engine, 2_000_000);
    let texts: Vec<&str> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();

    // One batch with every text; the 722-token text needs truncation to max_model_len.
    let reply = post(&router, "/v1/embeddings", json!({"input": texts, "truncate_prompt_tokens": -1})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let batched: Vec<Vec<f32>> = reply.body["data"].as_array().unwrap().iter().map(|d| floats(&d["embedding"])).collect();
    let expected_tokens: usize = reference["texts"].as_array().unwrap().iter().map(|t| t["input_ids"].as_array().unwrap().len()).sum();
    assert_eq!(reply.body["usage"]["prompt_tokens"], expected_tokens);

    for (i, text) in texts.iter().enumerate() {
        let want = floats(&reference["texts"][i]["embedding"]);
        assert_close(&batched[i], &want, &format!("MiniLM text {i} batched"));
        let single = post(&router, "/v1/embeddings", json!({"input": text, "truncate_prompt_tokens": -1})).await;
        let single = floats(&single.body["data"][0]["embedding"]);
        assert_close(&single, &want, &format!("MiniLM text {i} single"));
        assert!(max_abs_diff(&single, &batched[i]) <= 1e-5, "text {i}: batched differs from single");
        let ids = post(&router, "/tokenize", json!({"prompt": text})).await;
        let n = reference["texts"][i]["input_ids"].as_array().unwrap().len();
        if n < 256 {
            assert_eq!(ids.body["tokens"], reference["texts"][i]["input_ids"], "text {i}: token ids");
        }
    }

    // Semantics: cosine of text 0 with the others, as sentence-transformers reports.
    for (j, want) in reference["cosine"][0].as_array().unwrap().iter().enumerate() {
        let got = cosine(&batched[0], &batched[j]);
        assert!((got - want.as_f64().unwrap()).abs() < 1e-4, "cosine(0, {j}) = {got}, reference {want}");
    }

    // Without truncation the long text is refused, as vLLM does.
    let long = post(&router, "/v1/embeddings", json!({"input": texts[6]})).await;
    assert_eq!(long.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        long.body["error"]["message"],
        "This model's maximum context length is 256 tokens. However, your prompt contains at least 257 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_sized_cross_encoder_matches_sentence_transformers() {
    let Some(dir) = minilm_dir() else { return };
    let reference = expected("minilm-cross-encoder");
    let folder = common::cross_encoder::minilm_cross_encoder(&dir, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let engine = engine(&folder, |_| {});
    assert_eq!(engine.spec().max_model_len, 512);
    let query = reference["query"].as_str().unwrap();
    let documents: Vec<&str> = reference["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();

    let pair = poolserve::input::Prompt::Pair(query.into(), documents[0].into());
    let params = poolserve::engine::params::PoolingParams::default().verify(poolserve::pooling::Task::Score, engine.spec()).unwrap();
    let tokenized = engine.prepare(vec![pair], &params).await.unwrap().remove(0);
    assert_eq!(json!(tokenized.ids), reference["first_pair"]["input_ids"]);
    assert_eq!(json!(tokenized.type_ids), reference["first_pair"]["token_type_ids"]);

    // Every pair in one /score request; the last document needs truncation to 512 tokens.
    let router = router(engine, 2_000_000);
    let reply = post(&router, "/score", json!({"queries": query, "documents": documents, "truncate_prompt_tokens": -1})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let lengths: usize = reference["input_lengths"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap() as usize).sum();
    assert_eq!(reply.body["usage"]["prompt_tokens"], lengths);
    for (j, want) in reference["scores"].as_array().unwrap().iter().enumerate() {
        let got = reply.body["data"][j]["score"].as_f64().unwrap();
        assert!((got - want.as_f64().unwrap()).abs() <= 1e-4, "pair {j}: {got} vs reference {want}");
    }
    // /rerank orders the same scores.
    let reply = post(&router, "/rerank", json!({"query": query, "documents": &documents[..32], "top_n": 3})).await;
    let scores = reference["scores"].as_array().unwrap();
    let mut order: Vec<usize> = (0..32).collect();
    order.sort_by(|&a, &b| scores[b].as_f64().unwrap().total_cmp(&scores[a].as_f64().unwrap()));
    let got: Vec<usize> = reply.body["results"].as_array().unwrap().iter().map(|r| r["index"].as_u64().unwrap() as usize).collect();
    assert_eq!(got, order[..3].to_vec());
}

/// `--quantization int8` on the real model: every embedding within cosine 0.999 of float32
/// (the int8 bar: what retrieval keeps) and of sentence-transformers, on the reference texts and the 33 documents of
/// the cross-encoder fixture (8 to 512+ tokens), and the neighbours of text 0 keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_int8_stays_within_cosine_0_999_of_f32() {
    precision_stays_close("int8", 0.999, |c| c.models[0].quantization = Some(poolserve::loader::options::Quantization::Int8)).await;
}

/// `--dtype bfloat16` on the CPU (bf16 weights and products, f32 elsewhere): the same texts
/// within cosine 0.9999 of float32 and of sentence-transformers (the f32 bar: bf16 must not
/// lose what f32 keeps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_bfloat16_stays_within_cosine_0_9999_of_f32() {
    precision_stays_close("bfloat16", 0.9999, |c| c.models[0].dtype = poolserve::loader::options::DTypeArg::Bfloat16).await;
}

/// `--dtype auto`, the default: where the CPU multiplies bf16 natively (AMX, AVX-512 BF16) the
/// load-time probe keeps this embedder in bfloat16 and `/info` says why; elsewhere, and under
/// `POOLSERVE_MAX_CPU_ISA=avx512` and below, it stays float32 and says that. Either way the
/// vectors stay within cosine 0.9999 of float32 and of sentence-transformers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_dtype_auto_is_bfloat16_where_the_cpu_multiplies_it_natively() {
    use poolserve::loader::options::DTypeArg;
    let Some(dir) = minilm_dir() else { return };
    let served = engine(&dir, |c| c.models[0].dtype = DTypeArg::Auto);
    let reason = served.spec().dtype_reason.clone().expect("--dtype auto says why");
    eprintln!("all-MiniLM-L6-v2 --dtype auto: {} ({reason})", served.spec().dtype);
    match poolserve::kernels::native_bf16() {
        Some(kernel) => {
            assert_eq!(served.spec().dtype, "bfloat16", "{reason}");
            assert!(reason.starts_with(&format!("bfloat16 on {kernel}: the load-time probe's worst cosine")), "{reason}");
        }
        None => {
            assert_eq!(served.spec().dtype, "float32");
            assert_eq!(reason, "float32: this CPU has no native bf16 products (AMX or AVX-512 BF16)");
        }
    }
    let info = send(&router(served, 2_000_000), "GET", "/info", None, &[]).await;
    assert_eq!(info.body["model_dtype_reason"], json!(reason), "{}", info.body);
    precision_stays_close("auto", 0.9999, |c| c.models[0].dtype = DTypeArg::Auto).await;
}

/// The real model served with `tweak` against float32 and sentence-transformers: every embedding
/// within `min_cosine` of both, and the neighbours of text 0 in the same order.
async fn precision_stays_close(label: &str, min_cosine: f64, tweak: impl FnOnce(&mut poolserve::config::ServerConfig)) {
    let Some(dir) = minilm_dir() else { return };
    let reference = expected("all-MiniLM-L6-v2");
    let documents = expected("minilm-cross-encoder");
    let mut texts: Vec<&str> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();
    let fixture_texts = texts.len();
    texts.extend(documents["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()));
    let request = json!({"input": texts, "truncate_prompt_tokens": -1});
    let embed = |router: axum::Router| {
        let request = request.clone();
        async move {
            let reply = post(&router, "/v1/embeddings", request).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.body["data"].as_array().unwrap().iter().map(|d| floats(&d["embedding"])).collect::<Vec<_>>()
        }
    };
    let f32s = embed(router(engine(&dir, |_| {}), 2_000_000)).await;
    let variant = embed(router(engine(&dir, tweak), 2_000_000)).await;
    let worst = variant.iter().zip(&f32s).map(|(q, f)| cosine(q, f)).fold(1.0, f64::min);
    let worst_st = (0..fixture_texts).map(|i| cosine(&variant[i], &floats(&reference["texts"][i]["embedding"]))).fold(1.0, f64::min);
    eprintln!(
        "all-MiniLM-L6-v2 {label}: worst cosine to f32 over {} texts {worst:.6}, to sentence-transformers {worst_st:.6}",
        texts.len()
    );
    for (i, (q, f)) in variant.iter().zip(&f32s).enumerate() {
        let similarity = cosine(q, f);
        assert!(similarity >= min_cosine, "text {i}: {label} vs f32 cosine {similarity}");
        if i < fixture_texts {
            let want = floats(&reference["texts"][i]["embedding"]);
            assert!(cosine(q, &want) >= min_cosine, "text {i}: {label} vs sentence-transformers cosine {}", cosine(q, &want));
        }
    }
    let ranking = |e: &[Vec<f32>]| {
        let mut order: Vec<usize> = (1..fixture_texts).collect();
        order.sort_by(|&a, &b| cosine(&e[0], &e[b]).total_cmp(&cosine(&e[0], &e[a])));
        order
    };
    assert_eq!(ranking(&variant), ranking(&f32s));
}
