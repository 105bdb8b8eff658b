//! Token-level task benchmark on the real models of scripts/fetch-models.sh: SPLADE sparse
//! embeddings (splade-tiny) and token classification (rampart-ner), the 32 documents of
//! `benches/data/rerank.json` as one request through the engine (tokenization, batching,
//! backbone, head). `benches/compare_token_tasks.py` runs the same through transformers.
//!
//! `cargo bench --bench token_tasks` (models under `POOLSERVE_MODELS`, default `models/`).

use poolserve::config::ServerConfig;
use poolserve::engine::params::PoolingParams;
use poolserve::input::Prompt;
use poolserve::pooling::{PoolingType, Task};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn median_of(iterations: usize, mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut tokens = f();
    f();
    let mut times: Vec<Duration> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            tokens = f();
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[times.len() / 2], tokens)
}

fn main() {
    let root = PathBuf::from(std::env::var("POOLSERVE_MODELS").unwrap_or_else(|_| "models".into()));
    let corpus: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("benches/data/rerank.json").expect("corpus")).expect("json");
    let documents: Vec<String> =
        corpus["documents"].as_array().expect("documents").iter().map(|d| d.as_str().expect("text").to_string()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    println!("{} documents per request, {} rayon threads", documents.len(), rayon::current_num_threads());
    for (label, name, task) in [
        ("SPLADE embed_sparse (splade-tiny)", "splade-tiny", Task::EmbedSparse),
        ("token_classify (rampart-ner)", "rampart-ner", Task::TokenClassify),
    ] {
        let dir = root.join(name);
        if !dir.join("model.safetensors").exists() {
            eprintln!("{} is missing: run scripts/fetch-models.sh models splade rampart", dir.display());
            std::process::exit(1);
        }
        let mut config = ServerConfig::for_model(dir.to_str().expect("utf-8"));
        if task == Task::EmbedSparse {
            config.models[0].pooler.pooling_type = Some(PoolingType::Splade);
        }
        let engine = poolserve::engine::Engine::load(&config.models[0], &config.engine).expect("loads");
        let params = PoolingParams::default().verify(task, engine.spec()).expect("params");
        let prompts: Vec<Prompt> = documents.iter().cloned().map(Prompt::Text).collect();
        let (median, tokens) = median_of(20, || runtime.block_on(engine.encode(prompts.clone(), &params)).expect("runs").1);
        println!(
            "{label:<36} median {:>8.2} ms   {:>6.0} texts/s   {:>6.0} tokens/s",
            median.as_secs_f64() * 1e3,
            documents.len() as f64 / median.as_secs_f64(),
            tokens as f64 / median.as_secs_f64()
        );
    }
}
