//! Parity with the Hugging Face reference outputs in tests/fixtures (copied from
//! shared/fixtures): token ids, embeddings (normalized and not), per-token hidden states,
//! Dense projection, Matryoshka slices; each input alone and in one mixed-length batch.

use crate::common::*;
use poolserve::engine::params::{PoolingParams, ResolvedParams};
use poolserve::engine::Engine;
use poolserve::input::Prompt;
use poolserve::pooling::PoolingOutput;
use poolserve::pooling::Task;
use serde_json::Value;

fn texts(expected: &Value) -> Vec<String> {
    expected["inputs"]["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

fn params(engine: &Engine, task: Task, f: impl FnOnce(&mut PoolingParams)) -> ResolvedParams {
    let mut p = PoolingParams::default();
    f(&mut p);
    p.verify(task, engine.spec()).unwrap()
}

async fn vectors(engine: &Engine, texts: &[String], params: &ResolvedParams) -> Vec<Vec<f32>> {
    let prompts = texts.iter().map(|t| Prompt::Text(t.clone())).collect();
    let (outputs, _) = engine.encode(prompts, params).await.unwrap();
    outputs
        .into_iter()
        .map(|o| match o {
            PoolingOutput::Vector(v) => v,
            _ => panic!("expected one vector per input"),
        })
        .collect()
}

async fn token_vectors(engine: &Engine, text: &str, params: &ResolvedParams) -> Vec<Vec<f32>> {
    let (mut outputs, _) = engine.encode(vec![Prompt::Text(text.into())], params).await.unwrap();
    match outputs.remove(0) {
        PoolingOutput::Tokens(t) => t,
        _ => panic!("expected per-token output"),
    }
}

/// Embeddings (normalized and raw) and hidden states, single and batched.
async fn check_embedder(name: &str) {
    let expected = expected(name);
    let engine = engine(&fixture_model(name), |_| {});
    let texts = texts(&expected);
    let normalized = params(&engine, Task::Embed, |_| {});
    let raw = params(&engine, Task::Embed, |p| p.normalize = Some(false));

    let batched = vectors(&engine, &texts, &normalized).await;
    let batched_raw = vectors(&engine, &texts, &raw).await;
    for (i, text) in texts.iter().enumerate() {
        let reference = &expected["texts"][i];
        let ids = engine.prepare(vec![Prompt::Text(text.clone())], &normalized).await.unwrap();
        let want_ids: Vec<u32> = reference["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids[0].ids, want_ids, "{name} text {i}: token ids");

        let single = vectors(&engine, &texts[i..=i], &normalized).await.remove(0);
        assert_close(&single, &floats(&reference["embedding"]), &format!("{name} text {i} single"));
        assert_close(&batched[i], &floats(&reference["embedding"]), &format!("{name} text {i} batched"));
        assert!(max_abs_diff(&single, &batched[i]) <= 1e-5, "{name} text {i}: batched differs from single");
        assert_close(&batched_raw[i], &floats(&reference["embedding_unnormalized"]), &format!("{name} text {i} unnormalized"));

        // token_embed applies the Dense layers per token, so it equals the backbone output only
        // for models without them (a Dense sentence head's token_embed is checked by the
        // bert-colbert fixture instead).
        if !expected["pooling"]["dense"].is_null() {
            continue;
        }
        let hidden = token_vectors(&engine, text, &params(&engine, Task::TokenEmbed, |p| p.normalize = Some(false))).await;
        let want = reference["last_hidden_state"].as_array().unwrap();
        assert_eq!(hidden.len(), want.len(), "{name} text {i}: token count");
        for (t, (ours, theirs)) in hidden.iter().zip(want).enumerate() {
            assert_close(ours, &floats(theirs), &format!("{name} text {i} token {t}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bert_mean_pooling_matches_reference() {
    check_embedder("bert-embed-mean").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bert_cls_pooling_matches_reference() {
    check_embedder("bert-embed-cls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xlm_roberta_cls_pooling_matches_reference() {
    check_embedder("xlmr-embed-cls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distilbert_mean_pooling_with_dense_matches_reference() {
    check_embedder("distilbert-embed-mean-dense").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpnet_relative_positions_match_reference() {
    check_embedder("mpnet-embed-mean").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modernbert_local_and_global_attention_match_reference() {
    check_embedder("modernbert-embed-mean").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gte_rotary_encoder_matches_reference() {
    check_embedder("gte-embed-cls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_last_token_pooling_matches_reference() {
    check_embedder("qwen3-embed-last").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen2_last_token_pooling_matches_reference() {
    check_embedder("qwen2-embed-last").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_matryoshka_block_matches_reference() {
    let expected = expected("qwen3-embed-last");
    let engine = engine(&fixture_model("qwen3-embed-last"), |c| {
        c.models[0].hf_overrides.insert("is_matryoshka".into(), Value::Bool(true));
    });
    let sliced = vectors(&engine, &texts(&expected), &params(&engine, Task::Embed, |p| p.dimensions = Some(16))).await;
    for (i, v) in sliced.iter().enumerate() {
        assert_close(v, &floats(&expected["matryoshka"]["embeddings"][i]), &format!("qwen3 matryoshka text {i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matryoshka_dimensions_match_sentence_transformers_truncate_dim() {
    let expected = expected("bert-embed-mean");
    let engine = engine(&fixture_model("bert-embed-mean"), |c| {
        c.models[0].hf_overrides.insert("is_matryoshka".into(), Value::Bool(true));
    });
    let texts = texts(&expected);
    let sliced = vectors(&engine, &texts, &params(&engine, Task::Embed, |p| p.dimensions = Some(16))).await;
    for (i, v) in sliced.iter().enumerate() {
        assert_eq!(v.len(), 16);
        assert_close(v, &floats(&expected["matryoshka"]["embeddings"][i]), &format!("matryoshka text {i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_projection_per_token_matches_colbert_reference() {
    let expected = expected("bert-colbert");
    let engine = engine(&fixture_model("bert-colbert"), |_| {});
    assert_eq!(engine.spec().embedding_size, 16);
    let token_params = params(&engine, Task::TokenEmbed, |_| {});
    for (i, reference) in expected["texts"].as_array().unwrap().iter().enumerate() {
        let ours = token_vectors(&engine, reference["text"].as_str().unwrap(), &token_params).await;
        let want = reference["token_vectors"].as_array().unwrap();
        assert_eq!(ours.len(), want.len());
        for (t, (a, b)) in ours.iter().zip(want).enumerate() {
            assert_close(a, &floats(b), &format!("colbert text {i} token {t}"));
        }
    }
}

#[test]
fn chunked_forward_equals_one_pass() {
    use poolserve::models::batch::Batch;
    let expected = expected("bert-embed-mean");
    let model = poolserve::loader::load(&config_for(&fixture_model("bert-embed-mean"), |_| {}).models[0]).unwrap();
    let inputs: Vec<_> = expected["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| poolserve::models::batch::TokenizedInput {
            ids: t["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect(),
            type_ids: t["token_type_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect(),
        })
        .collect();
    let batch = Batch::from_inputs(&inputs);
    let whole = model.backbone.forward(&batch).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let chunked =
        poolserve::models::forward_chunked(model.backbone.as_ref(), &batch, 20).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(max_abs_diff(&whole, &chunked) < 1e-5);
}

/// The lowest cosine between fixture `name`'s embeddings, served with `tweak`, and the reference.
async fn worst_embedding_cosine(name: &str, tweak: impl FnOnce(&mut poolserve::config::ServerConfig)) -> f64 {
    let expected = expected(name);
    let engine = engine(&fixture_model(name), tweak);
    let ours = vectors(&engine, &texts(&expected), &params(&engine, Task::Embed, |_| {})).await;
    ours.iter().enumerate().map(|(i, v)| cosine(v, &floats(&expected["texts"][i]["embedding"]))).fold(1.0, f64::min)
}

/// `--dtype float16|bfloat16`: the same models in half precision stay within the documented
/// tolerance of the float32 reference (docs/models.md, "Precision"). On the CPU bfloat16 is the packed
/// bf16 kernels' path (f32 activations), float16 candle's composite ops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_precision_stays_within_tolerance() {
    use poolserve::loader::options::DTypeArg;
    for (dtype, min_cosine, max_prob_diff) in [(DTypeArg::Float16, 0.9999, 1e-3), (DTypeArg::Bfloat16, 0.9999, 5e-3)] {
        for name in [
            "bert-embed-mean",
            "xlmr-embed-cls",
            "mpnet-embed-mean",
            "modernbert-embed-mean",
            "gte-embed-cls",
            "gte-en-v15-tiny",
            "gte-multilingual-tiny",
            "qwen3-embed-last",
            "qwen2-embed-last",
            "electra-embed",
            "ernie-embed",
            "ernie-embed",
            "nomic-embed-mean",
            "nomic-moe-tiny",
            "nomic-moe-tiny",
            "deberta-embed",
            "jina-embed",
            "jina-code-embed",
            "jina-code-embed",
            "llama-embed-last",
            "mistral-embed-window",
            "gemma2-embed-last",
            "gemma3-causal",
            "embeddinggemma-tiny",
            "embeddinggemma2-text",
            "llama-nemotron-embed-tiny",
            "voyage-nano-tiny",
            "gritlm-tiny",
            "jina-v5-small-tiny",
            "jina-v5-nano-tiny",
            // pplx-embed-tiny's output is rounded to int8 steps: a half-precision error that
            // moves a value across a .5 boundary costs a whole step of a 48-wide vector
            // (bf16: 0.99988), which says nothing about the backbone, shared with voyage's.
        ] {
            let worst = worst_embedding_cosine(name, |c| c.models[0].dtype = dtype).await;
            eprintln!("{name} {dtype:?}: worst cosine {worst:.6}");
            assert!(worst >= min_cosine, "{name} {dtype:?}: cosine {worst}");
        }
        for name in ["bert-seqcls", "modernbert-seqcls", "qwen3-seqcls"] {
            let expected = expected(name);
            let engine = engine(&fixture_model(name), |c| c.models[0].dtype = dtype);
            let probs = vectors(&engine, &texts(&expected), &params(&engine, Task::Classify, |_| {})).await;
            let key = if expected["labels"]["num_labels"] == 1 { "sigmoid" } else { "softmax" };
            let worst = probs.iter().enumerate().map(|(i, p)| max_abs_diff(p, &floats(&expected["texts"][i][key]))).fold(0.0, f32::max);
            eprintln!("{name} {dtype:?}: worst probability difference {worst:.2e}");
            assert!(worst <= max_prob_diff, "{name} {dtype:?}: {worst}");
        }
    }
}

/// `--dtype auto` over embedders of several shapes and families: whatever the load-time probe
/// chooses (bfloat16 where the CPU multiplies it natively and the probe stays within 0.9999,
/// else float32), the vectors stay within cosine 0.9999 of the float32 reference, and `/info`'s
/// reason names the choice. Classifiers stay float32 without a probe (their scores are held to
/// 1e-4) and match the reference as float32 does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dtype_auto_keeps_the_reference_whatever_it_chooses() {
    use poolserve::loader::options::DTypeArg;
    let auto = |c: &mut poolserve::config::ServerConfig| c.models[0].dtype = DTypeArg::Auto;
    let mut chose_bf16 = 0;
    let names = ["bert-embed-mean", "xlmr-embed-cls", "modernbert-embed-mean", "qwen3-embed-last", "gemma2-embed-last", "nomic-embed-mean"];
    for name in names {
        let spec = engine(&fixture_model(name), auto).spec().clone();
        let reason = spec.dtype_reason.clone().expect("--dtype auto says why");
        assert_eq!(spec.dtype == "bfloat16", reason.starts_with("bfloat16 on "), "{name}: {reason}");
        chose_bf16 += usize::from(spec.dtype == "bfloat16");
        let worst = worst_embedding_cosine(name, auto).await;
        eprintln!("{name} --dtype auto: {} ({reason}); worst cosine to the reference {worst:.6}", spec.dtype);
        assert!(worst >= 0.9999, "{name} --dtype auto ({}): cosine {worst}", spec.dtype);
    }
    eprintln!("--dtype auto chose bfloat16 for {chose_bf16} of {} embedders", names.len());
    for name in ["bert-seqcls", "qwen3-seqcls"] {
        let engine = engine(&fixture_model(name), auto);
        assert_eq!(engine.spec().dtype, "float32", "{name}");
        let reason = engine.spec().dtype_reason.clone().unwrap_or_default();
        assert_eq!(reason, "float32: its outputs are scores, held to 1e-4, which bf16 moves by up to 2.5e-3", "{name}");
        let expected = expected(name);
        let probs = vectors(&engine, &texts(&expected), &params(&engine, Task::Classify, |_| {})).await;
        let key = if expected["labels"]["num_labels"] == 1 { "sigmoid" } else { "softmax" };
        let worst = probs.iter().enumerate().map(|(i, p)| max_abs_diff(p, &floats(&expected["texts"][i][key]))).fold(0.0, f32::max);
        assert!(worst <= 1e-4, "{name} --dtype auto: probability difference {worst}");
    }
}

/// `--quantization int8` on every backbone family: the quantized layers are wired into each
/// architecture (attention output, plain and gated feed-forward layers) and stay close to the
/// float32 reference. The tiny random fixtures are no accuracy benchmark (the real-model bar,
/// cosine ≥ 0.999, is in tests/suite/minilm.rs); this catches a wrong layer or layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn int8_quantization_runs_every_backbone_close_to_reference() {
    use poolserve::loader::options::Quantization;
    for name in [
        "bert-embed-mean",
        "xlmr-embed-cls",
        "distilbert-embed-mean-dense",
        "mpnet-embed-mean",
        "modernbert-embed-mean",
        "gte-embed-cls",
        "qwen3-embed-last",
        "qwen2-embed-last",
        "electra-embed",
        "nomic-embed-mean",
        "deberta-embed",
        "jina-embed",
        "bge-m3-tiny",
        "llama-embed-last",
        "mistral-embed-window",
        "gemma2-embed-last",
        "gemma3-causal",
        "embeddinggemma-tiny",
        "embeddinggemma2-text",
        "llama-nemotron-embed-tiny",
        "voyage-nano-tiny",
        "pplx-embed-tiny",
        "gritlm-tiny",
        "jina-v5-small-tiny",
        "jina-v5-nano-tiny",
    ] {
        let worst = worst_embedding_cosine(name, |c| c.models[0].quantization = Some(Quantization::Int8)).await;
        eprintln!("{name} int8: worst cosine {worst:.6}");
        assert!(worst >= 0.999, "{name} int8: cosine {worst}");
    }
}
