//! `Gemma4AudioFeatureExtractor`'s log-mel spectrogram (transformers 5.24,
//! `feature_extraction_gemma4.py`), for one mono waveform at its rate.
//!
//! - Only the first `max_length` samples count (480,000: 30 s at 16 kHz).
//! - `frame_length / 2` zeros go before the signal ("semicausal" padding). Frame `i` covers
//!   samples `[i·hop − frame_length/2, i·hop + frame_length/2)`, times a periodic Hann window
//!   (float32), optionally pre-emphasised.
//! - `|rfft|` (magnitude, not power) over `fft_length` points (the next power of two, float32).
//! - An HTK-scale triangular mel bank with no area normalisation, in float64; then
//!   `ln(mel + mel_floor)`, optionally standardised per bin.
//! - Frame `i` is real when sample `i·hop + frame_length/2` is. The extractor zeroes the
//!   others and masks them, and the tower never reads them, so only the real frames are made:
//!   `(n − frame_length/2 − 1) / hop + 1` of them.

use super::AudioError;
use poolserve_fft::RealToComplex;
use serde_json::Value;
use std::sync::Arc;

/// The log-mel frames of one audio, row-major `[frames, bins]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    pub frames: usize,
    pub bins: usize,
    pub values: Vec<f32>,
}

/// The extractor's settings, with its window, mel bank and FFT plan made once.
#[derive(Clone)]
pub struct LogMelConfig {
    pub sampling_rate: u32,
    /// The samples the extractor keeps (`max_length` of its call: 480,000).
    pub max_samples: usize,
    pub mel_bins: usize,
    frame_length: usize,
    hop_length: usize,
    fft_length: usize,
    preemphasis: f32,
    htk_preemphasis: bool,
    input_scale: f32,
    mel_floor: f64,
    per_bin: Option<(Vec<f64>, Vec<f64>)>,
    window: Vec<f32>,
    /// Each mel bin's triangle: its first FFT bin and its nonzero weights (a triangle spans a
    /// few FFT bins, so the dense `[fft bins, mel bins]` product would be mostly zeros: 60×
    /// the work, measured).
    filters: Vec<(usize, Vec<f64>)>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl std::fmt::Debug for LogMelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMelConfig")
            .field("sampling_rate", &self.sampling_rate)
            .field("mel_bins", &self.mel_bins)
            .field("frame_length", &self.frame_length)
            .field("hop_length", &self.hop_length)
            .field("fft_length", &self.fft_length)
            .finish_non_exhaustive()
    }
}

/// The call's default `max_length`: 30 s at 16 kHz.
const MAX_LENGTH: usize = 480_000;

impl LogMelConfig {
    /// From the `feature_extractor` object of `processor_config.json` (or a
    /// `preprocessor_config.json`), with `Gemma4AudioFeatureExtractor`'s defaults. As there,
    /// the frame and hop lengths come from `frame_length_ms` / `hop_length_ms` (the stored
    /// `frame_length` and `hop_length` are ignored by its `__init__`).
    pub fn from_json(config: &Value) -> Result<Self, AudioError> {
        let bad = AudioError::Config;
        let number = |name: &str, default: f64| -> Result<f64, AudioError> {
            match config.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| bad(format!("feature_extractor.{name} is not a number: {v}"))),
            }
        };
        let sampling_rate = number("sampling_rate", 16000.0)?;
        let mel_bins = number("feature_size", 128.0)?;
        if !(1000.0..=192_000.0).contains(&sampling_rate) || !(1.0..=1024.0).contains(&mel_bins) {
            return Err(bad(format!("feature_extractor: sampling_rate {sampling_rate} or feature_size {mel_bins} is out of range")));
        }
        let frame_length = (sampling_rate * number("frame_length_ms", 20.0)? / 1000.0).round() as usize;
        let hop_length = (sampling_rate * number("hop_length_ms", 10.0)? / 1000.0).round() as usize;
        if frame_length < 2 || hop_length == 0 || frame_length > 65536 {
            return Err(bad(format!("feature_extractor: frame length {frame_length} or hop {hop_length} samples is out of range")));
        }
        let mut fft_length = frame_length.next_power_of_two();
        if config.get("fft_overdrive").and_then(Value::as_bool).unwrap_or(false) {
            fft_length *= 2;
        }
        if number("dither", 0.0)? != 0.0 {
            return Err(bad("feature_extractor.dither is not 0: dithered features are random, and no server reproduces them".into()));
        }
        let per_bin = match (config.get("per_bin_mean"), config.get("per_bin_stddev")) {
            (None | Some(Value::Null), None | Some(Value::Null)) => None,
            (mean, std) => {
                let list = |v: Option<&Value>, default: f64| -> Result<Vec<f64>, AudioError> {
                    match v {
                        None | Some(Value::Null) => Ok(vec![default; mel_bins as usize]),
                        Some(Value::Array(values)) if values.len() == mel_bins as usize => {
                            values.iter().map(|x| x.as_f64().ok_or_else(|| bad("per_bin values must be numbers".into()))).collect()
                        }
                        Some(_) => Err(bad(format!("feature_extractor.per_bin_* must list {mel_bins} numbers"))),
                    }
                };
                Some((list(mean, 0.0)?, list(std, 1.0)?))
            }
        };
        let mut config = LogMelConfig {
            sampling_rate: sampling_rate as u32,
            max_samples: MAX_LENGTH,
            mel_bins: mel_bins as usize,
            frame_length,
            hop_length,
            fft_length,
            preemphasis: number("preemphasis", 0.0)? as f32,
            htk_preemphasis: config.get("preemphasis_htk_flavor").and_then(Value::as_bool).unwrap_or(true),
            input_scale: number("input_scale_factor", 1.0)? as f32,
            mel_floor: number("mel_floor", 1e-3)?,
            per_bin,
            window: periodic_hann(frame_length),
            filters: Vec::new(),
            fft: poolserve_fft::forward(fft_length),
        };
        config.filters = htk_mel_filters(
            fft_length / 2 + 1,
            config.mel_bins,
            number("min_frequency", 0.0)?,
            number("max_frequency", 8000.0)?,
            sampling_rate,
        );
        Ok(config)
    }

    /// The fewest samples that make one real frame (and so one soft token).
    pub fn min_samples(&self) -> usize {
        self.frame_length / 2 + 1
    }

    /// The real frames of `wave` (its first [`Self::max_samples`] samples).
    pub fn frames(&self, samples: usize) -> usize {
        let n = samples.min(self.max_samples);
        match n.checked_sub(self.frame_length / 2 + 1) {
            Some(rest) => rest / self.hop_length + 1,
            None => 0,
        }
    }

    pub fn log_mel(&self, wave: &[f32]) -> LogMel {
        let wave = &wave[..wave.len().min(self.max_samples)];
        let frames = self.frames(wave.len());
        let (bins, half) = (self.fft_length / 2 + 1, self.frame_length / 2);
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut magnitude = vec![0f32; bins];
        let mut values = Vec::with_capacity(frames * self.mel_bins);
        let sample = |i: isize| if i >= 0 && (i as usize) < wave.len() { wave[i as usize] * self.input_scale } else { 0.0 };
        for frame in 0..frames {
            let start = (frame * self.hop_length) as isize - half as isize;
            input.iter_mut().for_each(|v| *v = 0.0);
            for (j, w) in self.window.iter().enumerate() {
                let x = sample(start + j as isize);
                let x = if self.preemphasis == 0.0 {
                    x
                } else if j == 0 && self.htk_preemphasis {
                    x * (1.0 - self.preemphasis)
                } else {
                    // Without the HTK flavour the window's first sample is emphasised against
                    // the one before it too.
                    x - self.preemphasis * sample(start + j as isize - 1)
                };
                input[j] = x * w;
            }
            // Lengths match the plan by construction (make_*_vec), so this cannot fail.
            let _ = self.fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch);
            for (m, c) in magnitude.iter_mut().zip(&spectrum) {
                *m = c.re.hypot(c.im);
            }
            for (bin, (first, weights)) in self.filters.iter().enumerate() {
                let mel: f64 = magnitude[*first..].iter().zip(weights).map(|(&m, w)| m as f64 * w).sum();
                let mut value = (mel + self.mel_floor).ln();
                if let Some((mean, std)) = &self.per_bin {
                    value = (value - mean[bin]) / std[bin];
                }
                values.push(value as f32);
            }
        }
        LogMel { frames, bins: self.mel_bins, values }
    }
}

/// `np.hanning(n + 1)[:-1]` in float64, stored as float32 (transformers' periodic window).
fn periodic_hann(n: usize) -> Vec<f32> {
    (0..n).map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos()) as f32).collect()
}

/// transformers' `mel_filter_bank(..., norm=None, mel_scale="htk")`: triangles between
/// HTK-mel-spaced edges, built in Hz; each mel bin's first FFT bin and nonzero weights.
fn htk_mel_filters(fft_bins: usize, mel_bins: usize, min_hz: f64, max_hz: f64, sampling_rate: f64) -> Vec<(usize, Vec<f64>)> {
    let mel = |hz: f64| 2595.0 * (1.0 + hz / 700.0).log10();
    let hz = |mel: f64| 700.0 * (10f64.powf(mel / 2595.0) - 1.0);
    let linspace = |start: f64, stop: f64, n: usize| -> Vec<f64> {
        let step = (stop - start) / (n - 1).max(1) as f64;
        (0..n).map(|i| if i == n - 1 { stop } else { start + i as f64 * step }).collect()
    };
    let edges: Vec<f64> = linspace(mel(min_hz), mel(max_hz), mel_bins + 2).into_iter().map(hz).collect();
    let fft_freqs = linspace(0.0, sampling_rate / 2.0, fft_bins);
    (0..mel_bins)
        .map(|j| {
            let weights: Vec<f64> = fft_freqs
                .iter()
                .map(|f| {
                    let down = (f - edges[j]) / (edges[j + 1] - edges[j]);
                    let up = (edges[j + 2] - f) / (edges[j + 2] - edges[j + 1]);
                    down.min(up).max(0.0)
                })
                .collect();
            match (weights.iter().position(|&w| w > 0.0), weights.iter().rposition(|&w| w > 0.0)) {
                (Some(first), Some(last)) => (first, weights[first..=last].to_vec()),
                _ => (0, Vec::new()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_counts_follow_the_extractor() {
        let config = LogMelConfig::from_json(&serde_json::json!({})).unwrap();
        // (N − 1) // 160 for N ≥ 161; none below; capped at 30 s.
        for (samples, frames) in [(16000, 99), (5000, 31), (161, 1), (160, 0), (0, 0), (480_000, 2999), (900_000, 2999)] {
            assert_eq!(config.frames(samples), frames, "{samples} samples");
        }
        assert_eq!(config.fft_length, 512);
        assert_eq!(config.min_samples(), 161);
    }

    #[test]
    fn silence_is_the_log_floor_and_filter_zero_is_empty() {
        let config = LogMelConfig::from_json(&serde_json::json!({})).unwrap();
        let mel = config.log_mel(&[0.0; 1000]);
        assert_eq!(mel.frames, 6);
        assert!(mel.values.iter().all(|&v| (v - (1e-3f64).ln() as f32).abs() < 1e-6));
        // The first HTK filter spans 0–28 Hz, between the 0 Hz and 31.25 Hz bins.
        assert!(config.filters[0].1.is_empty());
        assert!(config.filters[1..].iter().all(|(_, weights)| !weights.is_empty()));
    }

    #[test]
    fn dithered_extractors_are_refused() {
        assert!(LogMelConfig::from_json(&serde_json::json!({"dither": 0.5})).unwrap_err().to_string().contains("dither"));
    }
}
