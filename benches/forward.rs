//! Forward-pass benchmark on all-MiniLM-L6-v2: backbone + pooling + head through the engine's
//! runner, at 32×128 tokens (throughput) and 1×16 tokens (latency of a short query).
//!
//! `cargo bench --bench forward [-- 32x128 1x16 8x128]` (model folder from `POOLSERVE_MINILM`, default
//! `models/all-MiniLM-L6-v2`; fetch it with scripts/fetch-minilm.sh). Prints one line per
//! shape: median and p90 time per forward, tokens/s. `benches/compare.py` runs the same shapes
//! through PyTorch for the ratio. `POOLSERVE_DTYPE=bfloat16` or `POOLSERVE_QUANTIZATION=int8` (the
//! serve flags' variables) measure another precision.

use poolserve::config::ServerConfig;
use poolserve::loader;
use poolserve::models::batch::Batch;
use poolserve::models::batch::TokenizedInput;
use std::time::{Duration, Instant};

fn inputs(seqs: usize, len: usize, vocab: u32) -> Vec<TokenizedInput> {
    // Deterministic ids away from the special tokens, framed like real inputs.
    (0..seqs)
        .map(|s| {
            let mut ids: Vec<u32> = (0..len as u32).map(|t| 1000 + (s as u32 * 7919 + t * 104_729) % (vocab - 1000)).collect();
            ids[0] = 101;
            ids[len - 1] = 102;
            TokenizedInput { type_ids: vec![0; len], ids }
        })
        .collect()
}

fn measure(name: &str, iterations: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..3 {
        f();
    }
    let mut times: Vec<Duration> = (0..iterations)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    let p90 = times[times.len() * 9 / 10];
    let _ = name;
    (median, p90)
}

fn main() {
    // As the server's main does, before any thread starts.
    poolserve::kernels::settle_thread_pools();
    let dir = std::env::var("POOLSERVE_MINILM").unwrap_or_else(|_| "models/all-MiniLM-L6-v2".into());
    if !std::path::Path::new(&dir).join("model.safetensors").exists() {
        eprintln!("{dir} is missing: run scripts/fetch-minilm.sh models (or set POOLSERVE_MINILM)");
        std::process::exit(1);
    }
    let mut config = ServerConfig::for_model(dir.clone());
    // The precision flags' variables, as `serve` reads them.
    use clap::ValueEnum;
    if let Ok(value) = std::env::var("POOLSERVE_QUANTIZATION") {
        config.models[0].quantization = Some(ValueEnum::from_str(&value, true).expect("POOLSERVE_QUANTIZATION: int8"));
    }
    if let Ok(value) = std::env::var("POOLSERVE_DTYPE") {
        config.models[0].dtype = ValueEnum::from_str(&value, true).expect("POOLSERVE_DTYPE: auto, float32, float16 or bfloat16");
    }
    let model = loader::load(&config.models[0]).expect("model loads");
    let vocab = model.backbone.vocab_size() as u32;
    let precision = match config.models[0].quantization {
        Some(q) => format!("{q:?}").to_lowercase(),
        None => format!("{:?}", config.models[0].dtype.dtype()).to_lowercase(),
    };
    let name = std::path::Path::new(&dir).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.clone());
    println!("{name} forward (backbone + mean pooling), {precision}, {} rayon threads", rayon::current_num_threads());
    let chunk: usize =
        std::env::var("POOLSERVE_FORWARD_CHUNK").ok().and_then(|v| v.parse().ok()).unwrap_or(poolserve::models::FORWARD_CHUNK_TOKENS);
    println!("forward chunk: {chunk} tokens");
    // `cargo bench --bench forward -- 1x16` runs only the shapes named.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| a.contains('x')).collect();
    for (seqs, len, iterations) in [(32usize, 128usize, 20usize), (1, 16, 200), (8, 128, 40)] {
        if !only.is_empty() && !only.contains(&format!("{seqs}x{len}")) {
            continue;
        }
        // BENCH_ITERATIONS=N times every shape N times (large models), as benches/compare.py reads it.
        let iterations = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(iterations);
        let batch = Batch::from_inputs(inputs(seqs, len, vocab).iter());
        let (median, p90) = measure("forward", iterations, || {
            let hidden = poolserve::models::forward_chunked(model.backbone.as_ref(), &batch, chunk).expect("forward");
            let _ = hidden.to_dtype(candle_core::DType::F32).and_then(|h| h.to_vec2::<f32>()).expect("to host");
        });
        let tokens = (seqs * len) as f64;
        println!(
            "{seqs:>3}x{len:<4} median {:>8.2} ms   p90 {:>8.2} ms   {:>8.0} tokens/s",
            median.as_secs_f64() * 1e3,
            p90.as_secs_f64() * 1e3,
            tokens / median.as_secs_f64()
        );
    }
}
