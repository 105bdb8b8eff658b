//! LoRA adapters on all-MiniLM-L6-v2: what a batch mixing adapters costs over the base alone,
//! and over serving each fine-tune as a merged model of its own.
//!
//! `cargo bench --bench lora [-- RANK]` (default rank 16; model folder from `POOLSERVE_MINILM`,
//! default `models/all-MiniLM-L6-v2`). Writes 8 PEFT adapters with random factors on every
//! dense layer (query, key, value, attention.output.dense, intermediate.dense, output.dense)
//! under target/lora-bench/, then times, in interleaved rounds, one forward pass of 32
//! sequences × 128 tokens:
//!   base          the base model alone
//!   8 adapters    4 consecutive sequences per adapter (8 segments)
//!   interleaved   sequence i on adapter i mod 8 (32 segments: the worst order)
//!   8 models      8 copies of the model (as 8 merged fine-tunes would be), each running its
//!                 4 sequences, all 8 at once on their own threads (8 servers side by side)
//! and prints medians, the ratios, and the memory an adapter takes against a model copy.

use poolserve::config::ServerConfig;
use poolserve::loader::lora::LoraOptions;
use poolserve::models::batch::{Batch, TokenizedInput};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADAPTERS: usize = 8;
const SEQS: usize = 32;
const LEN: usize = 128;

fn inputs(vocab: u32) -> Vec<TokenizedInput> {
    (0..SEQS)
        .map(|s| {
            let mut ids: Vec<u32> = (0..LEN as u32).map(|t| 1000 + (s as u32 * 7919 + t * 104_729) % (vocab - 1000)).collect();
            ids[0] = 101;
            ids[LEN - 1] = 102;
            TokenizedInput { type_ids: vec![0; LEN], ids }
        })
        .collect()
}

/// A PEFT adapter folder for MiniLM with random factors of `rank` on every dense layer.
fn write_adapter(dir: &std::path::Path, rank: usize, seed: u64) {
    std::fs::create_dir_all(dir).expect("adapter folder");
    let config = serde_json::json!({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": ["query", "key", "value", "output.dense", "intermediate.dense"],
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).expect("config");
    let (h, inter) = (384, 1536);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut random = |rows: usize, cols: usize| {
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
            .collect();
        candle_core::Tensor::from_vec(values, (rows, cols), &candle_core::Device::Cpu).expect("tensor")
    };
    let mut tensors = HashMap::new();
    for layer in 0..6 {
        let prefix = format!("base_model.model.encoder.layer.{layer}");
        for (module, inp, out) in [
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", h, inter),
            ("output.dense", inter, h),
        ] {
            tensors.insert(format!("{prefix}.{module}.lora_A.weight"), random(rank, inp));
            tensors.insert(format!("{prefix}.{module}.lora_B.weight"), random(out, rank));
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).expect("weights");
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let dir = std::env::var("POOLSERVE_MINILM").unwrap_or_else(|_| "models/all-MiniLM-L6-v2".into());
    if !std::path::Path::new(&dir).join("model.safetensors").exists() {
        eprintln!("{dir} is missing: run scripts/fetch-minilm.sh models (or set POOLSERVE_MINILM)");
        std::process::exit(1);
    }
    let rank: usize = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(16);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/lora-bench");
    let paths: Vec<String> = (0..ADAPTERS)
        .map(|i| {
            let path = root.join(format!("r{rank}-a{i}"));
            write_adapter(&path, rank, i as u64 + 1);
            path.to_str().expect("utf-8").to_string()
        })
        .collect();

    let mut config = ServerConfig::for_model(dir.clone());
    config.models[0].lora = Some(LoraOptions { modules: Vec::new(), max_loras: ADAPTERS, max_lora_rank: rank });
    let before = rss_kib();
    let model = poolserve::loader::load(&config.models[0]).expect("model loads");
    let model_kib = rss_kib().saturating_sub(before);
    let registry = model.lora.as_ref().expect("lora enabled");
    let before = rss_kib();
    let adapters: Vec<_> = paths.iter().enumerate().map(|(i, p)| registry.load(&format!("a{i}"), p).expect("adapter loads")).collect();
    let adapters_kib = rss_kib().saturating_sub(before);
    let file_bytes: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(std::path::Path::new(p).join("adapter_model.safetensors")).map(|m| m.len()).unwrap_or(0))
        .sum();

    let backbone = model.backbone.as_ref();
    let chunk = poolserve::models::FORWARD_CHUNK_TOKENS;
    let inputs = inputs(backbone.vocab_size() as u32);
    let base = Batch::from_inputs(&inputs);
    let mut grouped = base.clone();
    grouped.adapters = (0..SEQS).map(|s| Some(Arc::clone(&adapters[s / (SEQS / ADAPTERS)].weights))).collect();
    let mut interleaved = base.clone();
    interleaved.adapters = (0..SEQS).map(|s| Some(Arc::clone(&adapters[s % ADAPTERS].weights))).collect();

    // 8 copies of the model, each with its 4 sequences: 8 merged fine-tunes side by side.
    let copies: Vec<_> = (0..ADAPTERS)
        .map(|_| {
            let mut plain = config.models[0].clone();
            plain.lora = None;
            poolserve::loader::load(&plain).expect("copy loads").backbone
        })
        .collect();
    let per_model: Vec<Batch> = inputs.chunks(SEQS / ADAPTERS).map(Batch::from_inputs).collect();

    let forward = |batch: &Batch| {
        poolserve::models::forward_chunked(backbone, batch, chunk).expect("forward");
    };
    let side_by_side = || {
        std::thread::scope(|scope| {
            for (copy, batch) in copies.iter().zip(&per_model) {
                scope.spawn(move || poolserve::models::forward_chunked(copy.as_ref(), batch, chunk).expect("forward"));
            }
        });
    };
    let runs: [(&str, &dyn Fn()); 4] = [
        ("base", &|| forward(&base)),
        ("8 adapters", &|| forward(&grouped)),
        ("interleaved", &|| forward(&interleaved)),
        ("8 models", &side_by_side),
    ];
    for (_, run) in &runs {
        run();
    }
    let rounds = 15;
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); runs.len()];
    for _ in 0..rounds {
        for (i, (_, run)) in runs.iter().enumerate() {
            let start = Instant::now();
            run();
            times[i].push(start.elapsed());
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    println!("all-MiniLM-L6-v2, {SEQS}×{LEN} tokens, {ADAPTERS} adapters of rank {rank} on every dense layer, {rounds} interleaved rounds (median):");
    for ((name, _), m) in runs.iter().zip(&medians) {
        println!("  {name:<12} {:>8.1} ms   {:.2}× base", m.as_secs_f64() * 1e3, m.as_secs_f64() / medians[0].as_secs_f64());
    }
    println!("  8 models / 8 adapters: {:.2}×", medians[3].as_secs_f64() / medians[1].as_secs_f64());
    println!(
        "memory: the model {:.1} MiB RSS; {ADAPTERS} adapters {:.1} MiB RSS for {:.1} MiB of files ({:.2} MiB each)",
        model_kib as f64 / 1024.0,
        adapters_kib as f64 / 1024.0,
        file_bytes as f64 / (1 << 20) as f64,
        adapters_kib as f64 / 1024.0 / ADAPTERS as f64
    );
}
