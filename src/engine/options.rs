//! How an engine batches and admits work, whatever the model: [`EngineOptions`] (the `serve`
//! flags' values, checked), their defaults, and the [`ServingLimits`] an engine reports.

use super::EngineError;

/// How the engine batches and admits work, whatever the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Token budget of one forward pass; `None`: [`default_batch_tokens`] for the device.
    pub max_batch_tokens: Option<usize>,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
    /// Requests in flight beyond this are refused at once (429).
    pub max_concurrent_requests: usize,
    /// Threads that tokenize.
    pub tokenizer_workers: usize,
    /// Most floats one request may produce in token-level outputs.
    pub max_output_floats: usize,
    /// Largest image (width × height) decoded; larger ones are refused before decoding.
    pub max_image_pixels: u64,
    /// Longest audio (seconds) a file may declare; longer ones are refused before decoding.
    pub max_audio_seconds: u64,
    /// Most frames (1080p-sized) a video file may hold; more are refused before decoding.
    pub max_video_frames: usize,
    pub scheduling_policy: SchedulingPolicy,
    /// `--cache-size` and `--cache-dir`: the output cache (off at 0 bytes).
    pub cache: super::cache::CacheOptions,
}

impl Default for EngineOptions {
    /// `serve`'s defaults.
    fn default() -> Self {
        EngineOptions {
            max_batch_tokens: None,
            max_num_seqs: 256,
            max_concurrent_requests: 512,
            tokenizer_workers: 1,
            max_output_floats: 1 << 24,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
            max_audio_seconds: DEFAULT_MAX_AUDIO_SECONDS,
            max_video_frames: DEFAULT_MAX_VIDEO_FRAMES,
            scheduling_policy: SchedulingPolicy::Fcfs,
            cache: super::cache::CacheOptions::default(),
        }
    }
}

/// vLLM's `--scheduling-policy`: which waiting inputs a batch takes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// First come, first served (requests take turns within a batch); a request's `priority`
    /// must be 0.
    #[default]
    Fcfs,
    /// Lower `priority` first; equal priorities as fcfs.
    Priority,
}

impl EngineOptions {
    /// The fields that must be positive, by their snake_case names, as a host reports them.
    pub fn check(&self) -> Result<(), EngineError> {
        let fields = [
            ("max_batch_tokens", self.max_batch_tokens.unwrap_or(1)),
            ("max_num_seqs", self.max_num_seqs),
            ("max_concurrent_requests", self.max_concurrent_requests),
            ("tokenizer_workers", self.tokenizer_workers),
            ("max_output_floats", self.max_output_floats),
            ("max_image_pixels", self.max_image_pixels.min(1) as usize),
            ("max_audio_seconds", self.max_audio_seconds.min(1) as usize),
            ("max_video_frames", self.max_video_frames),
        ];
        match fields.iter().find(|(_, value)| *value == 0) {
            Some((name, _)) => Err(EngineError::Options(format!("{name} must be greater than 0"))),
            None => Ok(()),
        }
    }
}

/// `--max-image-pixels` by default: a 40-megapixel photo decodes (160 MB as RGBA); a
/// decompression bomb that claims more is refused from its header.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 40_000_000;

/// `--max-audio-seconds` by default: five minutes. A file that declares more is refused
/// before decoding; up to it, the model hears the first 30 s, as transformers' extractor keeps.
pub const DEFAULT_MAX_AUDIO_SECONDS: u64 = 300;

/// `--max-video-frames` by default: a minute at 30 fps in 1080p. Every frame up to the last
/// sampled one is decoded (H.264 predicts from earlier frames), so this bounds a video's
/// decoding work (a few seconds of one core) before it starts; a file holding more is
/// refused from its sample table.
pub const DEFAULT_MAX_VIDEO_FRAMES: usize = 1800;

/// `--max-batch-tokens` when unset: cache-sized on the CPU (and Metal), TEI's default on CUDA
/// (larger products fill a GPU).
pub fn default_batch_tokens(device: &candle_core::Device) -> usize {
    if device.is_cuda() {
        16_384
    } else {
        4_096
    }
}

/// The limits an engine serves under (its [`EngineOptions`] after the model's own bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingLimits {
    /// Requests in flight at once; more get 429.
    pub max_concurrent_requests: usize,
    /// Tokens in one batch.
    pub max_batch_tokens: usize,
    /// Threads tokenizing (and decoding images) for this model.
    pub tokenizer_workers: usize,
}
