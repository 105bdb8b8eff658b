//! Video-input benchmark: what the input workers do for one video of a request, per file:
//! demuxing, decoding every frame up to the last sampled one (openh264), YUV to RGB, and
//! resizing and patching the sampled frames (EmbeddingGemma 2's video processor defaults).
//!
//! `cargo bench --bench video -- FILE...`; `benches/compare_video.py` writes the files and runs
//! transformers' loader (`load_video`, PyAV) and video processor on the same files, rounds
//! interleaved. Prints one `FILE: … ms, … frames decoded, … sampled` line per file.

use poolserve::input::video::{self, VideoConfig, VideoLimits};

#[path = "common/timing.rs"]
mod timing;
use timing::median_of;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if files.is_empty() {
        eprintln!("usage: cargo bench --bench video -- FILE... (benches/compare_video.py writes them)");
        std::process::exit(1);
    }
    let iterations: usize = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    // EmbeddingGemma2VideoProcessor's defaults: patch 16, kernel 3, 70 soft tokens, 1 fps, 32 frames.
    let config = VideoConfig::from_json(&serde_json::json!({}), (16, 3)).expect("default video processor");
    let limits = VideoLimits::default();
    for file in files {
        let bytes = std::fs::read(&file).expect("video file");
        let info = video::check_header(&bytes, &limits).expect("readable video");
        let sampled = video::sample_indices(info.frames, info.fps, info.duration, &config);
        let time = median_of(1, iterations, || {
            std::hint::black_box(video::preprocess(&bytes, &config, &limits).unwrap());
        });
        println!(
            "{file}: {:.1} ms, {} frames decoded, {} sampled, {}x{}",
            time.as_secs_f64() * 1e3,
            sampled.last().map_or(0, |l| l + 1),
            sampled.len(),
            info.width,
            info.height
        );
    }
}
