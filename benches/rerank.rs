//! Rerank benchmark: one query against the 32 documents of `benches/data/rerank.json` through
//! the engine's scoring path (pair tokenization on the worker pool, batching, backbone,
//! classifier head), on a MiniLM-sized cross-encoder (see tests/common/cross_encoder.rs), and
//! the same documents scored by the bi-encoder path on all-MiniLM-L6-v2 itself.
//!
//! `cargo bench --bench rerank` (MiniLM folder from `POOLSERVE_MINILM`, default
//! `models/all-MiniLM-L6-v2`). `benches/compare_rerank.py` runs the same pairs through
//! sentence-transformers' `CrossEncoder.predict` for the ratio.

#[path = "../tests/common/cross_encoder.rs"]
mod cross_encoder;

use poolserve::engine::params::PoolingParams;
use poolserve::pooling::Task;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn median_of(iterations: usize, mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut tokens = 0;
    for _ in 0..2 {
        tokens = f();
    }
    let mut times: Vec<Duration> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    (times[times.len() / 2], tokens)
}

fn main() {
    let minilm = PathBuf::from(std::env::var("POOLSERVE_MINILM").unwrap_or_else(|_| "models/all-MiniLM-L6-v2".into()));
    if !minilm.join("model.safetensors").exists() {
        eprintln!("{} is missing: run scripts/fetch-minilm.sh models (or set POOLSERVE_MINILM)", minilm.display());
        std::process::exit(1);
    }
    let corpus: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("benches/data/rerank.json").expect("corpus")).expect("json");
    let query = vec![corpus["query"].as_str().expect("query").to_string()];
    let documents: Vec<String> =
        corpus["documents"].as_array().expect("documents").iter().map(|d| d.as_str().expect("text").to_string()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let cross = cross_encoder::minilm_cross_encoder(&minilm, Path::new("target"));
    println!("rerank 1 query x {} documents, {} rayon threads", documents.len(), rayon::current_num_threads());
    for (label, folder, task) in
        [("cross-encoder (MiniLM-L6 size)", cross, Task::Score), ("bi-encoder (all-MiniLM-L6-v2)", minilm, Task::Score)]
    {
        let engine = poolserve::engine::Engine::load(
            &poolserve::loader::options::ModelOptions::for_model(folder.to_str().expect("utf-8")),
            &Default::default(),
        )
        .expect("loads");
        let params = PoolingParams::default().verify(task, engine.spec()).expect("params");
        let (median, tokens) = median_of(20, || {
            let (scores, tokens) = runtime.block_on(engine.score(&query, &documents, &params, None)).expect("scores");
            assert_eq!(scores.len(), documents.len());
            tokens
        });
        println!(
            "{label:<32} median {:>8.2} ms   {:>6.0} pairs/s   {:>6.0} tokens/s",
            median.as_secs_f64() * 1e3,
            documents.len() as f64 / median.as_secs_f64(),
            tokens as f64 / median.as_secs_f64()
        );
    }
}
