//! Audio-input benchmark: decoding (symphonia, with resampling to 16 kHz where the file's rate
//! differs) and `Gemma4AudioFeatureExtractor`'s log-mel features, per file, as the input
//! workers run them for one request.
//!
//! `cargo bench --bench audio -- FILE...`; `benches/compare_audio.py` writes the files (30 s
//! of WAV at 16 kHz mono and 44.1 kHz stereo, MP3, FLAC) and runs transformers' loader and
//! extractor on the same files, rounds interleaved. Prints one `FILE: decode … ms, features …
//! ms, … s of audio per s` line per file.

use poolserve::input::audio::{decode::decode_mono, AudioLimits, LogMelConfig};

#[path = "common/timing.rs"]
mod timing;
use timing::median_of;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if files.is_empty() {
        eprintln!("usage: cargo bench --bench audio -- FILE... (benches/compare_audio.py writes them)");
        std::process::exit(1);
    }
    let iterations: usize = std::env::var("BENCH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    // Gemma4AudioFeatureExtractor's defaults (EmbeddingGemma 2's processor_config.json).
    let config = LogMelConfig::from_json(&serde_json::json!({})).expect("default extractor");
    let limits = AudioLimits::default();
    for file in files {
        let bytes = std::fs::read(&file).expect("audio file");
        let wave = decode_mono(&bytes, config.sampling_rate, config.max_samples, &limits).expect("decodable audio");
        let seconds = wave.len() as f64 / config.sampling_rate as f64;
        let decode = median_of(1, iterations, || {
            std::hint::black_box(decode_mono(&bytes, config.sampling_rate, config.max_samples, &limits).unwrap());
        });
        let features = median_of(1, iterations, || {
            std::hint::black_box(config.log_mel(&wave));
        });
        let total = (decode + features).as_secs_f64();
        println!(
            "{file}: decode {:.2} ms, features {:.2} ms, {:.0} s of audio per s ({seconds:.1} s heard)",
            decode.as_secs_f64() * 1e3,
            features.as_secs_f64() * 1e3,
            seconds / total
        );
    }
}
