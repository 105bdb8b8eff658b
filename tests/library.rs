//! The library API (`poolserve::library::LocalModel`) against the same references as the HTTP path.

mod common;

use common::*;
use poolserve::library::PoolingParams;
use poolserve::library::{LibraryError, LocalModel, LocalModelOptions};
use poolserve::pooling::Task;

/// `name` in float32: the references are float32, and `--dtype auto` may choose bfloat16 on
/// CPUs with native bf16 products (tested in tests/suite/minilm.rs and parity.rs).
fn load(name: &str) -> LocalModel {
    let mut options = LocalModelOptions::for_model(fixture_model(name).to_str().unwrap());
    options.model.dtype = poolserve::loader::options::DTypeArg::Float32;
    LocalModel::load(options).expect("loads")
}

#[test]
fn embed_classify_and_score_match_the_references() {
    let reference = expected("bert-embed-mean");
    let texts: Vec<&str> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();
    let embedder = load("bert-embed-mean");
    let vectors = embedder.embed(&texts, &PoolingParams::default()).unwrap();
    for (i, v) in vectors.iter().enumerate() {
        assert_close(v, &floats(&reference["texts"][i]["embedding"]), &format!("library text {i}"));
    }
    let raw = embedder.embed(&texts[..1], &PoolingParams { normalize: Some(false), ..Default::default() }).unwrap();
    assert_close(&raw[0], &floats(&reference["texts"][0]["embedding_unnormalized"]), "unnormalized");
    // Bi-encoder scores are the cosines of the embeddings.
    let scores = embedder.score(&texts[..1], &texts[2..4], &PoolingParams::default()).unwrap();
    assert!((scores[0] as f64 - cosine(&vectors[0], &vectors[2])).abs() < 1e-5);

    let classifier_ref = expected("bert-seqcls");
    let classifier = load("bert-seqcls");
    let results = classifier.classify(&texts, &PoolingParams::default()).unwrap();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.label, classifier_ref["texts"][i]["label"].as_str().unwrap());
        assert!(max_abs_diff(&r.probs, &floats(&classifier_ref["texts"][i]["softmax"])) <= 1e-4);
    }

    let reranker_ref = expected("bert-reranker");
    let reranker = load("bert-reranker");
    let pair = &reranker_ref["pairs"][0];
    let score =
        reranker.score(&[pair["query"].as_str().unwrap()], &[pair["document"].as_str().unwrap()], &PoolingParams::default()).unwrap();
    assert!((score[0] as f64 - pair["score"].as_f64().unwrap()).abs() <= 1e-4);
}

#[test]
fn errors_are_typed() {
    let embedder = load("bert-embed-mean");
    assert!(matches!(embedder.classify(&["a"], &PoolingParams::default()), Err(LibraryError::Unsupported(Task::Classify))));
    let bad = PoolingParams { dimensions: Some(7), ..Default::default() };
    assert!(matches!(embedder.embed(&["a"], &bad), Err(LibraryError::Params(_))));
    let long = "word ".repeat(300);
    assert!(matches!(embedder.embed(&[long.as_str()], &PoolingParams::default()), Err(LibraryError::Engine(_))));
    assert!(matches!(LocalModel::load(LocalModelOptions::for_model("./no/such/model")), Err(LibraryError::Load(_))));
}

/// The library neither reads the process's POOLSERVE_* variables nor exits or panics its host:
/// malformed ones are ignored, and unusable options are an error.
#[test]
fn options_come_from_code_only_and_bad_ones_are_errors() {
    // SAFETY (edition 2021: set_var is safe): the variables are this test's; nothing in this
    // binary reads them once the library ignores them.
    std::env::set_var("POOLSERVE_MAX_NUM_SEQS", "0");
    std::env::set_var("POOLSERVE_PORT", "not a port");
    let model = LocalModel::load(LocalModelOptions::for_model(fixture_model("bert-embed-mean").to_str().unwrap()))
        .expect("loads despite the variables");
    assert_eq!(model.embed(&["a"], &PoolingParams::default()).unwrap().len(), 1);
    let mut zero = LocalModelOptions::for_model(fixture_model("bert-embed-mean").to_str().unwrap());
    zero.engine.max_num_seqs = 0;
    assert!(matches!(LocalModel::load(zero), Err(LibraryError::Load(message)) if message.contains("max_num_seqs")));
}

/// Several models in one host program: one `LocalModel` each, used from several threads at once,
/// sharing the process's compute pool; each keeps its reference answers.
#[test]
fn several_poolers_share_the_process() {
    let embed_ref = expected("bert-embed-mean");
    let classify_ref = expected("bert-seqcls");
    let embedder = load("bert-embed-mean");
    let classifier = load("bert-seqcls");
    std::thread::scope(|scope| {
        for round in 0..4 {
            let (embedder, classifier, embed_ref, classify_ref) = (&embedder, &classifier, &embed_ref, &classify_ref);
            scope.spawn(move || {
                let i = round % 4;
                let text = embed_ref["texts"][i]["text"].as_str().unwrap();
                let vector = embedder.embed(&[text], &PoolingParams::default()).unwrap();
                assert_close(&vector[0], &floats(&embed_ref["texts"][i]["embedding"]), "embedder beside a classifier");
                let text = classify_ref["texts"][i]["text"].as_str().unwrap();
                let result = classifier.classify(&[text], &PoolingParams::default()).unwrap();
                assert!(max_abs_diff(&result[0].probs, &floats(&classify_ref["texts"][i]["softmax"])) <= 1e-4);
            });
        }
    });
}

#[test]
fn image_text_models_embed_images() {
    let reference = expected("clip-tiny");
    let model = load("clip-tiny");
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    let files: Vec<&str> = reference["images"].as_array().unwrap().iter().map(|i| i["file"].as_str().unwrap()).collect();
    let bytes: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(dir.join(f)).unwrap()).collect();
    let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let vectors = model.embed_images(&slices, &PoolingParams::default()).unwrap();
    for (i, v) in vectors.iter().enumerate() {
        let cos = cosine(v, &floats(&reference["images"][i]["image_embeds_normalized"]));
        assert!(cos >= 0.999, "library image {}: cosine {cos}", files[i]);
    }
    let text = reference["texts"][1]["text"].as_str().unwrap();
    assert_close(
        &model.embed(&[text], &PoolingParams::default()).unwrap()[0],
        &floats(&reference["texts"][1]["text_embeds_normalized"]),
        "library text",
    );
    // A text model refuses images with a typed error.
    let err = load("bert-embed-mean").embed_images(&slices[..1], &PoolingParams::default()).unwrap_err();
    assert!(err.to_string().contains("image"), "{err}");
}
