//! Audio inputs for models that read sound as soft tokens in their text (EmbeddingGemma 2's
//! Gemma 4 audio tower): encoded bytes in, the log-mel frames the tower takes out.
//!
//! - [`decode`]: WAV, FLAC, MP3 and OGG/Vorbis through symphonia, mixed down to mono and
//!   resampled to the feature extractor's rate, decoding only as much as the model reads;
//! - [`features`]: `Gemma4AudioFeatureExtractor`'s log-mel spectrogram;
//! - [`screen`]: the header lengths symphonia would allocate unchecked, checked first.
//!
//! **Limits, and why they look as they do.** The feature extractor keeps the first
//! `max_length` samples (30 s at 16 kHz) and drops the rest, so decoding stops there: an
//! hour-long file, or a tiny file that decodes to hours (an audio bomb), costs at most 30 s of
//! decoding and memory. A file whose header declares more than `--max-audio-seconds` (default
//! 300) is refused before any decoding, so that nobody uploads an hour expecting it all to
//! count; between 30 s and that limit, the model hears the first 30 s, as transformers' does.

pub mod decode;
pub mod features;
mod screen;

pub use features::{LogMel, LogMelConfig};

/// What a server accepts of one audio input.
#[derive(Debug, Clone, Copy)]
pub struct AudioLimits {
    /// The longest duration a file may declare (`--max-audio-seconds`).
    pub max_declared_seconds: f64,
}

impl Default for AudioLimits {
    fn default() -> Self {
        AudioLimits { max_declared_seconds: 300.0 }
    }
}

/// Why an audio input cannot be used: the client's (400), but [`AudioError::Config`], the
/// model folder's (at load).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AudioError {
    /// A `feature_extractor` that cannot be used.
    #[error("{0}")]
    Config(String),
    #[error("The audio could not be read: {0}. Send WAV, FLAC, MP3 or OGG/Vorbis")]
    Format(String),
    #[error("The audio could not be decoded: {0}")]
    Decode(String),
    #[error("The audio is {seconds:.1} s long; this server accepts at most {max:.0} s (--max-audio-seconds), and the model hears the first {heard:.0} s")]
    TooLong { seconds: f64, max: f64, heard: f64 },
    #[error("The audio's {what} ({value}) is outside what this server decodes ({limit})")]
    Unsupported { what: &'static str, value: u64, limit: &'static str },
    #[error("The audio is {samples} samples at {rate} Hz; the model needs at least {min} ({min_ms:.0} ms) to make one token of it")]
    TooShort { samples: usize, rate: u32, min: usize, min_ms: f64 },
}

/// One audio input as the tower takes it: decoded, resampled, and turned into log-mel frames.
pub fn preprocess(bytes: &[u8], config: &LogMelConfig, limits: &AudioLimits) -> Result<LogMel, AudioError> {
    let wave = decode::decode_mono(bytes, config.sampling_rate, config.max_samples, limits)?;
    let min = config.min_samples();
    if wave.len() < min {
        return Err(AudioError::TooShort {
            samples: wave.len(),
            rate: config.sampling_rate,
            min,
            min_ms: min as f64 * 1000.0 / config.sampling_rate as f64,
        });
    }
    Ok(config.log_mel(&wave))
}
