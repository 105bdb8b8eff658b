//! vLLM 0.33's own pooling tests (`tests/entrypoints/pooling/` of its release), their requests
//! and their checks, against the real binary over HTTP, one test per group of vLLM's test files. The
//! models are our fixtures, so checks of the original checkpoints' token ids become checks
//! against transformers' outputs for the fixtures (tests/fixtures/make_vllm_compat.py).

use crate::common;

use crate::common::server::{post, request, run_to_exit, serve, Server};
use crate::common::{cosine, expected, fixture_model, floats};
use serde_json::{json, Value};

/// vLLM's test template (`DUMMY_CHAT_TEMPLATE` of its embed and reward tests).
const DUMMY_CHAT_TEMPLATE: &str = "{% for message in messages %}{{message['role'] + ': ' + message['content'] + '\\n'}}{% endfor %}";

fn model(name: &str) -> String {
    fixture_model(name).to_str().unwrap().to_string()
}

fn serve_model(name: &str, flags: &[&str]) -> Server {
    let path = model(name);
    let mut args = vec![path.as_str(), "--served-model-name", name];
    args.extend_from_slice(flags);
    serve(&args)
}

fn messages() -> Value {
    json!([
        {"role": "user", "content": "The cat sat on the mat."},
        {"role": "assistant", "content": "A feline was resting on a rug."},
        {"role": "user", "content": "Stars twinkle brightly in the night sky."}
    ])
}

fn ok(answer: &common::server::Answer) -> Value {
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

fn error_message(answer: &common::server::Answer, status: u16) -> String {
    assert_eq!(answer.status, status, "{}", answer.text());
    answer.message()
}

/// Group 1: `--pooler-config '{"task": …}'` (and vLLM's `--pooler-config.task X`) picks the
/// model's one pooling task; a sequence classifier classifies each token with its classifier
/// (vLLM's `DispatchPooler.for_seq_cls`), checked against transformers.
#[test]
fn pooler_config_task_serves_token_classify() {
    let reference = &expected("vllm-compat")["token_classify"]["bert-seqcls"];
    let server = serve_model("bert-seqcls", &["--pooler-config.task", "token_classify"]);
    let inputs = &reference["inputs"];
    let body = ok(&post(
        server.port,
        "/pooling",
        json!({"model": "bert-seqcls", "input": inputs[0]["text"], "encoding_format": "float", "task": "token_classify"}),
    ));
    let rows = body["data"][0]["data"].as_array().unwrap();
    let want = inputs[0]["probs"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for (row, want) in rows.iter().zip(want) {
        let (row, want) = (floats(row), floats(want));
        assert_eq!(row.len(), 3);
        assert!(row.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-4), "{row:?} vs {want:?}");
    }
    // vLLM's test_pooling_not_supported of token_classify/test_online.py.
    for (task, start) in [
        ("classify", "Try switching the model's pooling_task via"),
        ("embed", "Unsupported task: 'embed'"),
        ("token_embed", "Unsupported task: 'token_embed'"),
        ("plugin", "No IOProcessor plugin installed."),
    ] {
        let answer = post(server.port, "/pooling", json!({"model": "bert-seqcls", "input": "a", "encoding_format": "float", "task": task}));
        assert_eq!(answer.json()["error"]["type"], "BadRequestError");
        let message = error_message(&answer, 400);
        assert!(message.starts_with(start), "{task}: {message}");
    }
    // /classify exists (the model has the task) but is not this pooling task: vLLM's 501.
    let answer = post(server.port, "/classify", json!({"input": "a"}));
    assert_eq!(error_message(&answer, 501), "The model does not support Classification API");
    // The JSON form of the flag, and the tasks vLLM removed.
    drop(server);
    let (ok_start, stderr) = run_to_exit(&["serve", &model("bert-embed-mean"), "--pooler-config", r#"{"task": "classify"}"#]);
    assert!(!ok_start && stderr.contains("Unsupported task: 'classify' Supported tasks: ('embed', 'token_embed')"), "{stderr}");
    let (ok_start, stderr) = run_to_exit(&["serve", &model("bert-embed-mean"), "--pooler-config", r#"{"task": "score"}"#]);
    assert!(!ok_start && stderr.contains("`score` task was removed; use `classify` instead."), "{stderr}");
}

/// vLLM's token_classify/test_online.py as its `test_pooling_not_supported` runs it: a
/// Qwen sequence classifier switched to token_classify with `--pooler-config '{"pooling_task":
/// …}'` (the key that test uses for `task`), its other tasks refused in vLLM's words; and a
/// model that is a token classifier only, whose tasks hold no `classify` (vLLM's
/// `pooler_for_token_classify` supports token_classify alone).
#[test]
fn token_classify_refusals_word_for_word() {
    let server = serve_model("qwen3-seqcls", &["--pooler-config", r#"{"pooling_task": "token_classify"}"#]);
    let body = ok(&post(
        server.port,
        "/pooling",
        json!({"input": "This product was excellent", "encoding_format": "float", "task": "token_classify"}),
    ));
    assert!(!body["data"][0]["data"].as_array().unwrap().is_empty());
    for (task, message) in [
        ("classify", "Try switching the model's pooling_task via --pooler-config.task classify."),
        ("embed", "Unsupported task: 'embed' Supported tasks: "),
        ("token_embed", "Unsupported task: 'token_embed' Supported tasks: "),
        ("plugin", "No IOProcessor plugin installed. Please refer to the documentation and to the 'prithvi_geospatial_mae_io_processor' offline inference example for more details."),
    ] {
        let answer = post(server.port, "/pooling", json!({"input": "a", "encoding_format": "float", "task": task}));
        assert_eq!(answer.json()["error"]["type"], "BadRequestError");
        let said = error_message(&answer, 400);
        // vLLM's test checks the start; the tuple of tasks follows for the unsupported ones.
        assert!(said == message || (message.ends_with(": ") && said.starts_with(message)), "{task}: {said}");
    }
    drop(server);
    let server = serve_model("bert-tokcls", &[]);
    let answer = post(server.port, "/pooling", json!({"input": "a", "task": "classify"}));
    assert_eq!(error_message(&answer, 400), "Unsupported task: 'classify' Supported tasks: ('token_classify',)");
}

/// Groups 1, 13 and 14 on a token_embed model: /v1/embeddings answers token embeddings,
/// `request_id` names the response, late chunking matches transformers (chunk means before
/// the Dense layer) with the tokenizer's character ranges, and vLLM's refusals.
#[test]
fn token_embed_models_answer_token_embeddings_and_late_chunks() {
    let reference = &expected("vllm-compat")["late_chunking"];
    let server = serve_model("distilbert-embed-mean-dense", &["--pooler-config", r#"{"task": "token_embed"}"#]);
    let port = server.port;
    // test_pooling_token_embed: the id is pooling-{request_id}.
    let body = ok(&post(port, "/pooling", json!({"input": "hello there", "task": "token_embed", "request_id": "client-request-id"})));
    assert_eq!(body["id"], "pooling-client-request-id");
    let tokens = body["data"][0]["data"].as_array().unwrap().len();
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    // test_embeddings_without_chunking_match_pooling: the same rows on /v1/embeddings.
    for input in [json!("hello there"), json!(["hello there", "Short."])] {
        let raw = ok(&post(port, "/pooling", json!({"input": input, "task": "token_embed", "use_activation": false})));
        let embedded = ok(&post(port, "/v1/embeddings", json!({"input": input, "use_activation": false})));
        assert_eq!(raw["usage"], embedded["usage"]);
        for (a, b) in raw["data"].as_array().unwrap().iter().zip(embedded["data"].as_array().unwrap()) {
            assert_eq!(a["data"], b["embedding"]);
            assert!(b.get("late_chunking").is_none());
        }
    }
    // test_late_chunking_vectors_and_source_ranges against transformers.
    for case in reference["cases"].as_array().unwrap() {
        let body =
            ok(&post(port, "/v1/embeddings", json!({"input": case["text"], "late_chunking_params": {"chunk_size": case["chunk_size"]}})));
        let item = &body["data"][0];
        let vectors = item["embedding"].as_array().unwrap();
        let want = case["vectors"].as_array().unwrap();
        assert_eq!(vectors.len(), want.len(), "{case}");
        for (v, w) in vectors.iter().zip(want) {
            let c = cosine(&floats(v), &floats(w));
            assert!(c >= 0.9999, "late chunk of {}: cosine {c}", case["text"]);
        }
        let meta = &item["late_chunking"];
        assert_eq!(meta["strategy"], "fixed_tokens");
        assert_eq!(meta["chunk_size"], case["chunk_size"]);
        assert_eq!(meta["input_tokens"], case["input_tokens"]);
        assert_eq!(meta["chunks"], case["chunks"], "{}", case["text"]);
    }
    // test_late_chunking_http_rejects_unsupported_requests.
    for overrides in [
        json!({"input": [0, 581, 2]}),
        json!({"input": ""}),
        json!({"truncate_prompt_tokens": 4}),
        json!({"padding": "max_length"}),
        json!({"input": "word ".repeat(600)}),
        json!({"late_chunking_params": {"chunk_size": 18446744073709551616u128 as f64}}),
    ] {
        let mut body = json!({"input": "The best thing about vLLM", "late_chunking_params": {"chunk_size": 5}});
        for (k, v) in overrides.as_object().unwrap() {
            body[k] = v.clone();
        }
        let answer = post(port, "/v1/embeddings", body);
        assert!(!error_message(&answer, 400).is_empty(), "{overrides}");
    }
    // token_embed's own refusals: /pooling embed, /v2/embed, other encodings.
    let answer = post(port, "/pooling", json!({"input": "a", "task": "embed"}));
    assert!(error_message(&answer, 400).starts_with("Try switching the model's pooling_task via --pooler-config.task embed."));
    let answer = post(port, "/v2/embed", json!({"texts": ["a"]}));
    assert_eq!((answer.status, answer.json()), (404, json!({"detail": "Not Found"})));
    assert!(error_message(&post(port, "/v1/embeddings", json!({"input": "a", "encoding_format": "base64"})), 400)
        .contains("Input should be 'float'"));
}

/// Groups 2, 3, 6, 7, 8: an embedding model with vLLM's test chat template.
#[test]
fn embedding_model_takes_chat_invocations_and_vllm_errors() {
    let server = serve_model("bert-embed-mean", &["--chat-template", DUMMY_CHAT_TEMPLATE, "--max-model-len", "100"]);
    let port = server.port;
    // test_chat_request: messages equal the rendered prompt sent as input without special tokens.
    let chat = ok(&post(port, "/v1/embeddings", json!({"messages": messages(), "encoding_format": "float"})));
    let rendered =
        "user: The cat sat on the mat.\nassistant: A feline was resting on a rug.\nuser: Stars twinkle brightly in the night sky.\n";
    let plain = ok(&post(port, "/v1/embeddings", json!({"input": rendered, "add_special_tokens": false})));
    assert!(cosine(&floats(&chat["data"][0]["embedding"]), &floats(&plain["data"][0]["embedding"])) > 0.99999);
    assert_eq!(chat["usage"], plain["usage"]);
    let count = chat["usage"]["prompt_tokens"].as_u64().unwrap();
    let with_special = ok(&post(port, "/v1/embeddings", json!({"messages": messages(), "add_special_tokens": true})));
    assert_eq!(with_special["usage"]["prompt_tokens"], count + 2);
    let open = ok(&post(port, "/v1/embeddings", json!({"messages": messages(), "continue_final_message": true})));
    // The final newline goes, which BERT's tokenizer does not count (vLLM's test: 33 both ways).
    assert_eq!(open["usage"]["prompt_tokens"], count);
    let both = post(port, "/v1/embeddings", json!({"messages": messages(), "continue_final_message": true, "add_generation_prompt": true}));
    assert!(error_message(&both, 400).contains("Cannot set both `continue_final_message` and `add_generation_prompt` to True."));
    // A request's own template needs --trust-request-chat-template.
    let own = post(port, "/v1/embeddings", json!({"messages": messages(), "chat_template": "{{ messages[0].content }}"}));
    assert!(error_message(&own, 400).starts_with("Chat template is passed with request, but --trust-request-chat-template is not set."));
    // test_invocations_completion_request / _chat_request: /invocations answers as /v1/embeddings.
    for body in [json!({"input": "hello", "encoding_format": "float"}), json!({"messages": messages()})] {
        let direct = ok(&post(port, "/v1/embeddings", body.clone()));
        let invoked = ok(&post(port, "/invocations", body));
        assert_eq!(direct.as_object().unwrap().keys().collect::<Vec<_>>(), invoked.as_object().unwrap().keys().collect::<Vec<_>>());
        assert_eq!(direct["data"][0]["embedding"], invoked["data"][0]["embedding"]);
    }
    let unknown = post(port, "/invocations", json!({"prompt": "a"}));
    assert!(error_message(&unknown, 400).starts_with("Cannot find suitable handler for request. Expected one of:"));
    assert_eq!(request(port, "GET", "/ping", None, &[]).unwrap().status, 200);
    // test_params_not_supported: pydantic's literal_error, naming the bad value.
    for param in ["encoding_format", "embed_dtype", "endianness"] {
        let answer = post(port, "/v1/embeddings", json!({"input": "a", "encoding_format": "base64", param: format!("bad_{param}")}));
        let message = error_message(&answer, 400);
        assert!(message.contains("literal_error") && message.contains(&format!("bad_{param}")), "{message}");
    }
    // test_negative_token_ids and the out-of-vocabulary message.
    assert_eq!(error_message(&post(port, "/v1/embeddings", json!({"input": [-1]})), 400), "Token id -1 is out of vocabulary");
    assert_eq!(error_message(&post(port, "/v1/embeddings", json!({"input": [5, 100000]})), 400), "Token id 100000 is out of vocabulary");
    // basic/test_truncation: vLLM's exact words.
    assert_eq!(
        error_message(&post(port, "/v1/embeddings", json!({"input": "a", "truncate_prompt_tokens": 101})), 400),
        "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size."
    );
    let long = error_message(&post(port, "/v1/embeddings", json!({"input": "word ".repeat(200)})), 400);
    assert_eq!(long, "This model's maximum context length is 100 tokens. However, your prompt contains at least 101 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.");
    // test_pooling_not_supported (embed/test_online.py) and group 7: token_embed needs the task.
    for (task, start) in [
        ("classify", "Unsupported task: 'classify'"),
        ("token_classify", "Unsupported task: 'token_classify'"),
        ("token_embed", "Try switching the model's pooling_task via"),
        ("plugin", "No IOProcessor plugin installed."),
    ] {
        let message = error_message(&post(port, "/pooling", json!({"input": "test", "encoding_format": "float", "task": task})), 400);
        assert!(message.starts_with(start), "{task}: {message}");
    }
    // test_padding: max_length pads to max_model_len; do_not_pad is the default; others refused.
    let tokens = |extra: Value| {
        let mut body = json!({"input": ["Hello"]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        ok(&post(port, "/v1/embeddings", body))["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let unpadded = tokens(json!({}));
    assert_eq!(tokens(json!({"padding": "max_length"})), 100);
    assert_eq!(tokens(json!({"padding": "do_not_pad"})), unpadded);
    assert!(error_message(&post(port, "/v1/embeddings", json!({"input": "a", "padding": "longest"})), 400).contains("literal_error"));
    // /classify and /score: a model without those tasks has no such routes (FastAPI's 404).
    for path in ["/classify", "/rerank"] {
        let answer = post(port, path, json!({"input": "a", "query": "a", "documents": ["b"]}));
        if path == "/classify" {
            assert_eq!((answer.status, answer.json()), (404, json!({"detail": "Not Found"})));
        } else {
            assert_eq!(answer.status, 200, "embedding models rerank by cosine: {}", answer.text());
        }
    }
}

/// Groups 4 and 5: bytes, bytes_only and base64 with every embed_dtype and endianness, on
/// /v1/embeddings and on /pooling (a reward model's per-token rewards).
#[test]
fn binary_encodings_on_embeddings_and_pooling() {
    let decode = |bytes: &[u8], dtype: &str, big: bool| -> Vec<f32> {
        let size = match dtype {
            "float32" => 4,
            "float16" | "bfloat16" => 2,
            _ => 1,
        };
        bytes
            .chunks(size)
            .map(|c| {
                let mut c = c.to_vec();
                if big {
                    c.reverse();
                }
                match dtype {
                    "float32" => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    "float16" => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    "bfloat16" => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
                    "fp8_e4m3" => fp8(c[0], 3, 7),
                    _ => fp8(c[0], 2, 15),
                }
            })
            .collect()
    };
    let close = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-2 * (1.0 + y.abs()));
    let dtypes = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"];
    let server = serve_model("bert-embed-mean", &[]);
    let port = server.port;
    let texts = json!(["The best thing about vLLM", "is that it supports many different models"]);
    let float = ok(&post(port, "/v1/embeddings", json!({"input": texts})));
    let reference: Vec<Vec<f32>> = float["data"].as_array().unwrap().iter().map(|d| floats(&d["embedding"])).collect();
    for dtype in dtypes {
        for endianness in ["native", "little", "big"] {
            let big = endianness == "big";
            let answer = post(
                port,
                "/v1/embeddings",
                json!({"input": texts, "encoding_format": "bytes", "embed_dtype": dtype, "endianness": endianness}),
            );
            assert_eq!(answer.status, 200);
            assert_eq!(answer.header("content-type"), Some("application/octet-stream"));
            let metadata: Value = serde_json::from_str(answer.header("metadata").expect("metadata header")).unwrap();
            assert_eq!(metadata["usage"], float["usage"]);
            for (item, want) in metadata["data"].as_array().unwrap().iter().zip(&reference) {
                assert_eq!((item["embed_dtype"].as_str(), item["endianness"].as_str()), (Some(dtype), Some(endianness)));
                assert_eq!(item["shape"], json!([want.len()]));
                let (start, end) = (item["start"].as_u64().unwrap() as usize, item["end"].as_u64().unwrap() as usize);
                let got = decode(&answer.body[start..end], dtype, big);
                assert!(dtype.starts_with("fp8") || close(&got, want), "{dtype} {endianness}: {got:?}");
                assert!(cosine(&got, want) > 0.99, "{dtype} {endianness}");
            }
            let only = post(
                port,
                "/v1/embeddings",
                json!({"input": texts, "encoding_format": "bytes_only", "embed_dtype": dtype, "endianness": endianness}),
            );
            assert!(only.header("metadata").is_none());
            let size = only.body.len() / reference.len();
            for (i, want) in reference.iter().enumerate() {
                assert!(cosine(&decode(&only.body[i * size..(i + 1) * size], dtype, big), want) > 0.99);
            }
        }
    }
    drop(server);
    // A reward model: /pooling honours and validates the same fields on per-token outputs.
    let server = serve_model("qwen2-reward", &[]);
    let port = server.port;
    let input = json!(["The chef prepared a delicious meal.", "A second, longer text to score here."]);
    let float = ok(&post(port, "/pooling", json!({"input": input, "encoding_format": "float"})));
    assert!(float["id"].as_str().unwrap().starts_with("pooling-"));
    let rows: Vec<Vec<f32>> =
        float["data"].as_array().unwrap().iter().map(|d| d["data"].as_array().unwrap().iter().flat_map(floats).collect()).collect();
    for dtype in dtypes {
        let base64 =
            ok(&post(port, "/pooling", json!({"input": input, "encoding_format": "base64", "embed_dtype": dtype, "endianness": "big"})));
        for (item, want) in base64["data"].as_array().unwrap().iter().zip(&rows) {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD.decode(item["data"].as_str().unwrap()).unwrap();
            let got = decode(&bytes, dtype, true);
            assert!(dtype.starts_with("fp8") || close(&got, want), "{dtype}");
        }
        let bytes = post(port, "/pooling", json!({"input": input, "encoding_format": "bytes", "embed_dtype": dtype}));
        let metadata: Value = serde_json::from_str(bytes.header("metadata").unwrap()).unwrap();
        let first = &metadata["data"][0];
        assert_eq!(first["shape"], json!([rows[0].len(), 1]));
        let got = decode(&bytes.body[first["start"].as_u64().unwrap() as usize..first["end"].as_u64().unwrap() as usize], dtype, false);
        assert!(dtype.starts_with("fp8") || close(&got, &rows[0]));
    }
    for param in ["encoding_format", "embed_dtype", "endianness"] {
        let message =
            error_message(&post(port, "/pooling", json!({"input": "a", "encoding_format": "base64", param: format!("bad_{param}")})), 400);
        assert!(message.contains("literal_error") && message.contains(&format!("bad_{param}")), "{message}");
    }
    // test_chat_request of the reward tests: messages through --chat-template on /pooling.
    drop(server);
    let server = serve_model("qwen2-reward", &["--chat-template", DUMMY_CHAT_TEMPLATE]);
    let chat = ok(&post(server.port, "/pooling", json!({"messages": messages()})));
    let rendered =
        "user: The cat sat on the mat.\nassistant: A feline was resting on a rug.\nuser: Stars twinkle brightly in the night sky.\n";
    let plain = ok(&post(server.port, "/pooling", json!({"input": rendered, "add_special_tokens": false})));
    assert_eq!(chat["data"], plain["data"]);
    let invoked = ok(&post(server.port, "/invocations", json!({"messages": messages()})));
    assert_eq!(invoked["data"], chat["data"]);
}

/// Groups 6, 10, 11, 12 and 13 on scoring: a one-label cross-encoder scores and reranks; a
/// classifier with more labels has no such routes.
#[test]
fn scoring_routes_follow_vllm() {
    let server = serve_model("bert-reranker", &["--max-model-len", "100"]);
    let port = server.port;
    let texts_1 = json!(["What is the capital of France?", "What is the capital of Germany?"]);
    let texts_2 = json!(["The capital of France is Paris.", "The capital of Germany is Berlin."]);
    let documents = ok(&post(port, "/score", json!({"queries": texts_1, "documents": texts_2})));
    let items = ok(&post(port, "/score", json!({"queries": texts_1, "items": texts_2, "request_id": "r1"})));
    assert_eq!(documents["data"], items["data"]);
    assert_eq!(items["id"], "score-r1");
    let long = post(port, "/rerank", json!({"query": "What is the capital of France?".repeat(100), "documents": ["a", "b"]}));
    assert!(error_message(&long, 400).contains("Please reduce the length of the input prompt"));
    let long = post(
        port,
        "/score",
        json!({"queries": "What is the capital of France?".repeat(20), "documents": ["a"], "truncate_prompt_tokens": 101}),
    );
    assert!(error_message(&long, 400).contains("Please request a smaller truncation size."));
    // test_rerank_max_tokens_per_doc(_validation): 0 is no limit, a limit cuts, negative refused.
    let doc = "The capital of France is Paris. ".repeat(10);
    let unlimited =
        ok(&post(port, "/rerank", json!({"query": "What is the capital of France?", "documents": [doc], "truncate_prompt_tokens": 99})));
    let limited =
        ok(&post(port, "/rerank", json!({"query": "What is the capital of France?", "documents": [doc], "max_tokens_per_doc": 10})));
    assert!(limited["usage"]["prompt_tokens"].as_u64() < unlimited["usage"]["prompt_tokens"].as_u64());
    ok(&post(port, "/rerank", json!({"query": "q", "documents": ["d"], "max_tokens_per_doc": 0})));
    let negative = post(port, "/rerank", json!({"query": "q", "documents": ["d"], "max_tokens_per_doc": -5}));
    assert!(error_message(&negative, 400).contains("max_tokens_per_doc must be a non-negative integer"));
    // test_invocations: a rerank body on /invocations answers as /rerank.
    let body = json!({"query": "What is the capital of France?", "documents": ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]});
    let direct = ok(&post(port, "/rerank", body.clone()));
    let invoked = ok(&post(port, "/invocations", body));
    assert_eq!(direct["results"], invoked["results"]);
    // test_pooling_not_supported (cross-encoder): its own token_classify says how to switch.
    for (task, start) in [
        ("embed", "Unsupported task: 'embed'"),
        ("token_embed", "Unsupported task: 'token_embed'"),
        ("token_classify", "Try switching the model's pooling_task via"),
        ("plugin", "No IOProcessor plugin installed."),
    ] {
        let message = error_message(&post(port, "/pooling", json!({"input": "a", "task": task})), 400);
        assert!(message.starts_with(start), "{task}: {message}");
    }
    let pooled = ok(&post(port, "/pooling", json!({"input": "a", "task": "classify"})));
    assert_eq!(pooled["data"][0]["data"].as_array().unwrap().len(), 1);
    drop(server);
    // classify/test_online.py test_score / test_rerank: scoring needs exactly one label.
    let server = serve_model("bert-seqcls", &[]);
    for (path, body) in
        [("/score", json!({"queries": "ping", "documents": "pong"})), ("/rerank", json!({"query": "ping", "documents": ["pong"]}))]
    {
        let answer = post(server.port, path, body);
        assert_eq!(answer.status, 404);
        assert_eq!(answer.json()["detail"], "Not Found");
    }
    let answer = post(server.port, "/v1/embeddings", json!({"input": "a"}));
    assert_eq!((answer.status, answer.json()), (404, json!({"detail": "Not Found"})));
    // test_chat_request of classify/test_online.py, with the model's --chat-template.
    drop(server);
    let server = serve_model("bert-seqcls", &["--chat-template", DUMMY_CHAT_TEMPLATE]);
    let chat = ok(&post(server.port, "/classify", json!({"messages": messages()})));
    let generation = ok(&post(server.port, "/classify", json!({"messages": messages(), "add_generation_prompt": true})));
    assert_eq!(chat["usage"], generation["usage"], "this template has no generation prompt");
    let invoked = ok(&post(server.port, "/invocations", json!({"messages": messages()})));
    assert_eq!(chat["data"], invoked["data"]);
    assert!(invoked["id"].as_str().unwrap().starts_with("classify-"));
}

/// Group 6 and 9 on Cohere's /v2/embed.
#[test]
fn cohere_input_types_and_billed_units() {
    let server = serve_model("bert-embed-prompts", &[]);
    let body = ok(&post(server.port, "/v2/embed", json!({"texts": ["hello world"], "embedding_types": ["float"]})));
    assert!(body["meta"]["billed_units"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(body["meta"]["billed_units"]["image_tokens"], 0);
    // A prompt name of the model is an input_type too; others are refused in vLLM's words.
    ok(&post(server.port, "/v2/embed", json!({"texts": ["a"], "input_type": "passage"})));
    let refused = post(server.port, "/v2/embed", json!({"texts": ["a"], "input_type": "nonexistent_type"}));
    assert_eq!(error_message(&refused, 400), "Unsupported input_type 'nonexistent_type'. Supported values: classification, passage, query");
    drop(server);
    let server = serve_model("bert-embed-mean", &[]);
    let refused = post(server.port, "/v2/embed", json!({"texts": ["a"], "input_type": "nonexistent_type"}));
    assert!(error_message(&refused, 400).contains("This model does not define any input_type task instructions."));
    drop(server);
    // An image bills image tokens, not input tokens.
    let server = serve_model("clip-tiny", &[]);
    let png = std::fs::read(first_png()).unwrap();
    use base64::Engine as _;
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png));
    let body = ok(&post(server.port, "/v2/embed", json!({"images": [url], "input_type": "image", "embedding_types": ["float"]})));
    assert_eq!(body["meta"]["billed_units"]["input_tokens"], 0);
    assert!(body["meta"]["billed_units"]["image_tokens"].as_u64().unwrap() > 0);
}

/// A float8 byte as torch reads it (`mantissa` bits, exponent `bias`; e4m3fn has no
/// infinities, which these tests never produce).
fn fp8(byte: u8, mantissa: u32, bias: i32) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = ((byte & 0x7f) >> mantissa) as i32;
    let fraction = (byte & ((1 << mantissa) - 1)) as f32 / (1 << mantissa) as f32;
    match exponent {
        0 => sign * fraction * 2f32.powi(1 - bias),
        e => sign * (1.0 + fraction) * 2f32.powi(e - bias),
    }
}

fn first_png() -> std::path::PathBuf {
    let dir = fixture_model("../images");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "png"))
        .expect("a png fixture image")
}
