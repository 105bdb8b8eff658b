//! Published sentence-transformers folders as users bring them, through the real router:
//! a folder whose config.json names the masked-LM head it was trained with, prompts
//! (`prompt_name`, the folder's default, the server flags), and Cohere's `/v2/embed` and
//! `/v1/embed` with every embedding type. References: sentence-transformers
//! (tests/fixtures/make_st_variants.py).

use crate::common;

use crate::common::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

fn texts(expected: &Value) -> Vec<String> {
    expected["inputs"]["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

fn assert_error(reply: &Reply, status: StatusCode, part: &str) {
    assert_eq!(reply.status, status, "{}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(part), "message {message:?} lacks {part:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_lm_architecture_with_a_pooling_module_is_an_embedder() {
    let expected = expected("mpnet-embed-masked-lm");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_model("mpnet-embed-masked-lm").join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "MPNetForMaskedLM");
    let engine = engine(&fixture_model("mpnet-embed-masked-lm"), |_| {});
    assert_eq!(engine.spec().tasks, vec![poolserve::pooling::Task::Embed, poolserve::pooling::Task::TokenEmbed]);
    let router = router(engine, 2_000_000);
    let texts = texts(&expected);
    let reply = post(&router, "/v1/embeddings", json!({"input": texts})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // The same embeddings as the bare-backbone fixture it was made from, and as sentence-transformers.
    let bare = common::expected("mpnet-embed-mean");
    for i in 0..texts.len() {
        let ours = floats(&reply.body["data"][i]["embedding"]);
        assert_close(&ours, &floats(&expected["texts"][i]["embedding"]), &format!("text {i}"));
        assert_close(&ours, &floats(&bare["texts"][i]["embedding"]), &format!("text {i} vs mpnet-embed-mean"));
    }
    // Token embeddings once the pooler config makes token_embed the pooling task.
    let router = common::router(
        common::engine(&fixture_model("mpnet-embed-masked-lm"), |c| c.models[0].pooler.task = Some("token_embed".into())),
        2_000_000,
    );
    let reply = post(&router, "/pooling", json!({"input": texts[0], "task": "token_embed", "normalize": false})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for (t, row) in reply.body["data"][0]["data"].as_array().unwrap().iter().enumerate() {
        assert_close(&floats(row), &floats(&expected["texts"][0]["last_hidden_state"][t]), &format!("token {t}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_match_sentence_transformers() {
    let expected = expected("bert-embed-prompts");
    let router = router(engine(&fixture_model("bert-embed-prompts"), |_| {}), 2_000_000);
    let texts = texts(&expected);
    // (request field, case of the reference): no field → the folder's default ("query").
    let cases = [(None, "default"), (Some("query"), "query"), (Some("passage"), "passage"), (Some("classification"), "classification")];
    for (name, case) in cases {
        let mut body = json!({"input": texts});
        if let Some(name) = name {
            body["prompt_name"] = json!(name);
        }
        for route in ["/v1/embeddings", "/pooling"] {
            let reply = post(&router, route, body.clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{route} {case}: {}", reply.body);
            let mut tokens = 0;
            for (i, reference) in expected["cases"][case].as_array().unwrap().iter().enumerate() {
                let item = &reply.body["data"][i];
                let ours = if route == "/pooling" { floats(&item["data"]) } else { floats(&item["embedding"]) };
                assert_close(&ours, &floats(&reference["embedding"]), &format!("{route} {case} text {i}"));
                tokens += reference["input_ids"].as_array().unwrap().len();
            }
            // Prompt tokens count in usage.
            assert_eq!(reply.body["usage"]["prompt_tokens"], tokens, "{route} {case}");
        }
        let mut tokenize = json!({"prompt": texts[0]});
        if let Some(name) = name {
            tokenize["prompt_name"] = json!(name);
        }
        let reply = post(&router, "/tokenize", tokenize).await;
        assert_eq!(ids(&reply.body["tokens"]), ids(&expected["cases"][case][0]["input_ids"]), "/tokenize {case}");
    }
    let reply = post(&router, "/v1/embeddings", json!({"input": "x", "prompt_name": "doc"})).await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Unknown prompt_name 'doc'; the model's prompts are ['classification', 'passage', 'query']",
    );
    assert_eq!(reply.body["error"]["param"], "prompt_name");
    assert_error(
        &post(&router, "/tokenize", json!({"prompt": "x", "prompt_name": "doc"})).await,
        StatusCode::BAD_REQUEST,
        "Unknown prompt_name",
    );
    assert_error(&post(&router, "/pooling", json!({"input": "x", "prompt_name": 3})).await, StatusCode::BAD_REQUEST, "Invalid JSON body");
    // Token-id inputs are taken as given: no prompt.
    let ids_only = ids(&expected["cases"]["none"][0]["input_ids"]);
    let reply = post(&router, "/v1/embeddings", json!({"input": ids_only})).await;
    assert_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&expected["cases"]["none"][0]["embedding"]), "token ids");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_flags_override_the_folder_default() {
    let expected = expected("bert-embed-prompts");
    let texts = texts(&expected);
    let by_name =
        router(engine(&fixture_model("bert-embed-prompts"), |c| c.models[0].default_prompt_name = Some("passage".into())), 2_000_000);
    let reply = post(&by_name, "/v1/embeddings", json!({"input": texts[0]})).await;
    assert_close(
        &floats(&reply.body["data"][0]["embedding"]),
        &floats(&expected["cases"]["passage"][0]["embedding"]),
        "--default-prompt-name",
    );
    // A literal prompt: "" is no prompt at all.
    let literal = router(engine(&fixture_model("bert-embed-prompts"), |c| c.models[0].default_prompt = Some(String::new())), 2_000_000);
    let reply = post(&literal, "/v1/embeddings", json!({"input": texts[0]})).await;
    assert_close(&floats(&reply.body["data"][0]["embedding"]), &floats(&expected["cases"]["none"][0]["embedding"]), "--default-prompt ''");
    // A request's prompt_name still wins.
    let reply = post(&literal, "/v1/embeddings", json!({"input": texts[0], "prompt_name": "query"})).await;
    assert_close(
        &floats(&reply.body["data"][0]["embedding"]),
        &floats(&expected["cases"]["query"][0]["embedding"]),
        "prompt_name over the flag",
    );
    // A default name the folder lacks stops the load.
    let config = config_for(&fixture_model("bert-embed-prompts"), |c| c.models[0].default_prompt_name = Some("nope".into()));
    let err = poolserve::engine::Engine::load(&config.models[0], &config.engine).err().expect("load fails").to_string();
    assert!(err.contains("--default-prompt-name `nope`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_and_batch_routes_take_prompt_names() {
    let plain = common::router(engine(&fixture_model("bert-splade-st"), |_| {}), 2_000_000);
    let plain = post(&plain, "/tokenize", json!({"prompt": "query: a man"})).await;
    let router = router(engine(&fixture_model("bert-splade-st"), |c| c.models[0].default_prompt = Some("query: ".into())), 2_000_000);
    let prompted = post(&router, "/tokenize", json!({"prompt": "a man"})).await;
    assert_eq!(plain.body["tokens"], prompted.body["tokens"], "the default prompt is prepended before tokenization");
    // The SparseEncoder folder defines empty `query` and `document` prompts.
    assert_tei_error(
        &post(&router, "/embed_sparse", json!({"inputs": "a", "prompt_name": "nope"})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "Validation",
        "Available prompts: [\"document\", \"query\"]",
    );
    let empty_prompt = post(&router, "/embed_sparse", json!({"inputs": "query: a man", "prompt_name": "query"})).await;
    let with_default = post(&router, "/embed_sparse", json!({"inputs": "a man"})).await;
    let spelled_out = post(&router, "/pooling", json!({"input": plain.body["tokens"], "task": "embed_sparse"})).await;
    assert_eq!(with_default.status, StatusCode::OK, "{}", with_default.body["error"]);
    assert_eq!(spelled_out.status, StatusCode::OK, "{}", spelled_out.body["error"]);
    assert_eq!(with_default.body[0], spelled_out.body["data"][0]["data"]);
    assert_eq!(empty_prompt.body[0], spelled_out.body["data"][0]["data"], "a named empty prompt replaces the default");
}

// ---- Cohere /v2/embed and /v1/embed ----

fn packbits_positive(v: &[f32]) -> Vec<u64> {
    v.chunks(8).map(|c| c.iter().enumerate().fold(0u64, |b, (i, &x)| if x > 0.0 { b | (0x80 >> i) } else { b })).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_embed_returns_every_type_and_picks_prompts() {
    let expected = expected("bert-embed-prompts");
    let router = router(engine(&fixture_model("bert-embed-prompts"), |_| {}), 2_000_000);
    let texts = texts(&expected);
    let body = json!({"texts": texts, "model": fixture_model("bert-embed-prompts").to_str().unwrap(), "input_type": "search_query",
        "embedding_types": ["float", "int8", "uint8", "binary", "ubinary", "base64"]});
    let reply = post(&router, "/v2/embed", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["response_type"], "embeddings_by_type");
    assert_eq!(reply.body["texts"], json!(texts));
    assert_eq!(reply.body["meta"]["api_version"]["version"], "2");
    let tokens: usize = expected["cases"]["query"].as_array().unwrap().iter().map(|r| r["input_ids"].as_array().unwrap().len()).sum();
    assert_eq!(reply.body["meta"]["billed_units"]["input_tokens"], tokens);
    let embeddings = &reply.body["embeddings"];
    for (i, reference) in expected["cases"]["query"].as_array().unwrap().iter().enumerate() {
        let float = floats(&embeddings["float"][i]);
        assert_close(&float, &floats(&reference["embedding"]), &format!("float {i}"));
        let ubinary = ids(&embeddings["ubinary"][i]);
        assert_eq!(ubinary, packbits_positive(&floats(&reference["embedding"])), "ubinary {i}");
        let binary: Vec<i64> = embeddings["binary"][i].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        assert_eq!(binary, ubinary.iter().map(|&u| u as i64 - 128).collect::<Vec<_>>(), "binary {i}");
        let int8: Vec<f32> = embeddings["int8"][i].as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as f32).collect();
        assert!(cosine(&int8, &float) >= 0.999, "int8 {i} tracks the float vector: {}", cosine(&int8, &float));
        let uint8: Vec<f32> = embeddings["uint8"][i].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as f32 - 127.5).collect();
        assert!(cosine(&uint8, &float) >= 0.999, "uint8 {i}: {}", cosine(&uint8, &float));
        let bytes = base64_decode(embeddings["base64"][i].as_str().unwrap());
        let decoded: Vec<f32> = bytes.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(decoded, float, "base64 {i}");
    }
    // input_type → prompt: search_document falls back to "passage", classification has its own,
    // clustering has none (no prompt at all), no input_type is the default.
    for (input_type, case) in
        [(Some("search_document"), "passage"), (Some("classification"), "classification"), (Some("clustering"), "none"), (None, "default")]
    {
        let mut body = json!({"texts": [texts[0]]});
        if let Some(t) = input_type {
            body["input_type"] = json!(t);
        }
        let reply = post(&router, "/v2/embed", body).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body["embeddings"].as_object().unwrap().keys().collect::<Vec<_>>(), vec!["float"], "float by default");
        assert_close(
            &floats(&reply.body["embeddings"]["float"][0]),
            &floats(&expected["cases"][case][0]["embedding"]),
            &format!("{input_type:?}"),
        );
    }
    // v1 without embedding_types: a plain list of floats.
    let reply = post(&router, "/v1/embed", json!({"texts": [texts[0]], "input_type": "search_query"})).await;
    assert_eq!(reply.body["response_type"], "embeddings_floats", "{}", reply.body);
    assert_close(&floats(&reply.body["embeddings"][0]), &floats(&expected["cases"]["query"][0]["embedding"]), "v1 floats");
    let reply = post(&router, "/v1/embed", json!({"texts": [texts[0]], "embedding_types": ["ubinary"]})).await;
    assert_eq!(reply.body["response_type"], "embeddings_by_type");
    assert_eq!(reply.body["embeddings"]["ubinary"][0].as_array().unwrap().len(), 4);
    // inputs with text content parts.
    let reply =
        post(&router, "/v2/embed", json!({"inputs": [{"content": [{"type": "text", "text": texts[0]}]}], "input_type": "search_query"}))
            .await;
    assert_close(&floats(&reply.body["embeddings"]["float"][0]), &floats(&expected["cases"]["query"][0]["embedding"]), "inputs");
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_embed_truncation_dimensions_and_refusals() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let long = "word ".repeat(300);
    assert_error(
        &post(&router, "/v2/embed", json!({"texts": [long], "truncate": "NONE"})).await,
        StatusCode::BAD_REQUEST,
        "maximum context length is 128 tokens",
    );
    for truncate in ["START", "END"] {
        let reply = post(&router, "/v2/embed", json!({"texts": [long], "truncate": truncate})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body["meta"]["billed_units"]["input_tokens"], 128);
    }
    let reply = post(&router, "/v2/embed", json!({"texts": [long], "max_tokens": 10})).await;
    assert_eq!(reply.body["meta"]["billed_units"]["input_tokens"], 10, "{}", reply.body);
    // The default truncation (END) keeps the start, as /v1/embeddings with truncate_prompt_tokens.
    let cut = post(&router, "/v1/embeddings", json!({"input": long, "truncate_prompt_tokens": 128})).await;
    let reply = post(&router, "/v2/embed", json!({"texts": [long]})).await;
    assert_eq!(reply.body["embeddings"]["float"][0], cut.body["data"][0]["embedding"]);
    // output_dimension follows the Matryoshka rules of `dimensions`.
    assert_error(
        &post(&router, "/v2/embed", json!({"texts": ["a"], "output_dimension": 16})).await,
        StatusCode::BAD_REQUEST,
        "does not support Matryoshka embeddings",
    );
    let matryoshka = common::router(
        engine(&fixture_model("bert-embed-mean"), |c| {
            c.models[0].hf_overrides.insert("matryoshka_dimensions".into(), json!([16, 32]));
        }),
        2_000_000,
    );
    let reply = post(&matryoshka, "/v2/embed", json!({"texts": ["a"], "output_dimension": 16})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["embeddings"]["float"][0].as_array().unwrap().len(), 16);
    let sliced = post(&matryoshka, "/v1/embeddings", json!({"input": "a", "dimensions": 16})).await;
    assert_eq!(reply.body["embeddings"]["float"][0], sliced.body["data"][0]["embedding"]);
    assert_error(
        &post(&matryoshka, "/v2/embed", json!({"texts": ["a"], "output_dimension": 0})).await,
        StatusCode::BAD_REQUEST,
        "only supports dimensions in range [1, ",
    );
    assert_error(&post(&router, "/v2/embed", json!({"texts": []})).await, StatusCode::BAD_REQUEST, "texts must not be empty");
    assert_error(&post(&router, "/v2/embed", json!({})).await, StatusCode::BAD_REQUEST, "exactly one of texts, images or inputs");
    assert_error(
        &post(&router, "/v2/embed", json!({"images": ["data:image/png;base64,AAAA"], "input_type": "image"})).await,
        StatusCode::BAD_REQUEST,
        "image model",
    );
    assert_error(
        &post(&router, "/v2/embed", json!({"texts": ["a"], "embedding_types": ["float64"]})).await,
        StatusCode::BAD_REQUEST,
        "unknown variant",
    );
    assert_error(
        &post(&router, "/v2/embed", json!({"texts": ["a"], "input_type": "search"})).await,
        StatusCode::BAD_REQUEST,
        "Unsupported input_type 'search'.",
    );
    assert_error(&post(&router, "/v2/embed", json!({"texts": ["a"], "model": "other"})).await, StatusCode::NOT_FOUND, "does not exist");
    let classifier = common::router(engine(&fixture_model("bert-seqcls"), |_| {}), 2_000_000);
    assert_route_not_registered(&post(&classifier, "/v2/embed", json!({"texts": ["a"]})).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_base64_in_vllm_embed_dtypes() {
    let router = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 2_000_000);
    let float = post(&router, "/v1/embeddings", json!({"input": "a man"})).await;
    let float = floats(&float.body["data"][0]["embedding"]);
    let get = |body: Value| {
        let router = router.clone();
        async move {
            let reply = post(&router, "/v1/embeddings", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            base64_decode(reply.body["data"][0]["embedding"].as_str().unwrap())
        }
    };
    let little = get(json!({"input": "a man", "encoding_format": "base64"})).await;
    assert_eq!(little.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect::<Vec<_>>(), float);
    let big = get(json!({"input": "a man", "encoding_format": "base64", "embed_dtype": "float32", "endianness": "big"})).await;
    assert_eq!(big.chunks(4).map(|b| f32::from_be_bytes([b[0], b[1], b[2], b[3]])).collect::<Vec<_>>(), float);
    let half = get(json!({"input": "a man", "encoding_format": "base64", "embed_dtype": "float16"})).await;
    let half: Vec<f32> = half.chunks(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
    assert!(max_abs_diff(&half, &float) < 1e-3);
    let bf = get(json!({"input": "a man", "encoding_format": "base64", "embed_dtype": "bfloat16"})).await;
    assert_eq!(bf.len(), float.len() * 2);
    let fp8 = get(json!({"input": "a man", "encoding_format": "base64", "embed_dtype": "fp8_e4m3"})).await;
    assert_eq!(fp8.len(), float.len());
    assert_error(
        &post(&router, "/v1/embeddings", json!({"input": "a", "encoding_format": "base64", "embed_dtype": "int4"})).await,
        StatusCode::BAD_REQUEST,
        "literal_error",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_path_picks_one_of_the_published_dense_widths() {
    // stella_en_400M_v5's layout: modules.json lists 2_Dense_24; 2_Dense_40 sits beside it.
    let expected = expected("bert-embed-dense-dims");
    let texts = texts(&expected);
    for (flag, folder) in [(None, "2_Dense_24"), (Some("2_Dense_40"), "2_Dense_40"), (Some("2_Dense_24"), "2_Dense_24")] {
        let engine = engine(&fixture_model("bert-embed-dense-dims"), |c| c.models[0].dense_path = flag.map(String::from));
        let router = router(engine, 2_000_000);
        let reply = post(&router, "/v1/embeddings", json!({"input": texts})).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        for (i, reference) in expected["dense"][folder].as_array().unwrap().iter().enumerate() {
            let ours = floats(&reply.body["data"][i]["embedding"]);
            assert_eq!(ours.len(), reference["embedding"].as_array().unwrap().len(), "{folder} text {i}");
            // The folder has no Normalize module; the embeddings route normalizes by default.
            let reference = floats(&reference["embedding"]);
            let norm = reference.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert_close(&ours, &reference.iter().map(|x| x / norm).collect::<Vec<_>>(), &format!("{folder} text {i}"));
        }
    }
}
