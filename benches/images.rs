//! Image-embedding benchmark: the vision tower alone on preprocessed pixels (in
//! the cache-sized groups the model thread runs), at
//! batch 1 (latency) and batch 32 (throughput), and one image through the whole path
//! (PNG decode, resize, crop, normalize, tower) via the engine.
//!
//! `cargo bench --bench images` on the ViT-B/32-sized random-weight CLIP folder that
//! `benches/compare_images.py` makes (`POOLSERVE_IMAGE_MODEL`, default
//! `target/clip-vit-b32-random`); that script runs transformers on the same shapes for the ratio.
//! Prints `batch N: median … ms, … images/s` lines.

use poolserve::config::ServerConfig;
use poolserve::engine::params::PoolingParams;
use poolserve::engine::Engine;
use poolserve::input::Prompt;
use poolserve::loader;
use poolserve::models;
use poolserve::pooling::Task;

#[path = "common/timing.rs"]
mod timing;
use timing::median_of;

fn main() {
    let dir = std::env::var("POOLSERVE_IMAGE_MODEL").unwrap_or_else(|_| "target/clip-vit-b32-random".into());
    if !std::path::Path::new(&dir).join("model.safetensors").exists() {
        eprintln!("{dir} is missing: run benches/compare_images.py --make-only (or set POOLSERVE_IMAGE_MODEL)");
        std::process::exit(1);
    }
    let config = ServerConfig::for_model(dir.clone());
    let model = loader::load(&config.models[0]).expect("model loads");
    let Some(loader::VisionInput::Pooled { tower, .. }) = model.vision.as_ref() else { panic!("a CLIP or SigLIP model") };
    let size = tower.image_size();
    let pixels_of = |n: usize| -> Vec<f32> { (0..n * 3 * size * size).map(|i| ((i * 7919) % 255) as f32 / 127.5 - 1.0).collect() };
    println!("vision tower, {size}x{size}, {} tokens per image, {} rayon threads", tower.tokens_per_image(), rayon::current_num_threads());
    for (batch, iterations) in [(1usize, 30usize), (32, 5)] {
        let pixels = pixels_of(batch);
        let median = median_of(2, iterations, || {
            models::forward_images_chunked(tower.as_ref(), &pixels, batch, models::FORWARD_CHUNK_TOKENS).expect("forward");
        });
        println!("batch {batch}: median {:.2} ms, {:.1} images/s", median.as_secs_f64() * 1e3, batch as f64 / median.as_secs_f64());
    }

    // The whole path for one 640x480 PNG: decode, resize, crop, normalize, tower, normalize.
    let engine = Engine::load(&config.models[0], &config.engine).expect("engine starts");
    let png = std::fs::read(std::env::var("POOLSERVE_BENCH_IMAGE").unwrap_or_else(|_| format!("{dir}/bench.png"))).expect("bench image");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let params = PoolingParams::default().verify(Task::Embed, engine.spec()).expect("params");
    let median = median_of(2, 30, || {
        runtime.block_on(engine.encode(vec![Prompt::Image(png.clone())], &params)).expect("embeds");
    });
    println!("end to end (640x480 PNG → embedding): median {:.2} ms", median.as_secs_f64() * 1e3);
}
