//! Video inputs for models that read frames as soft tokens (EmbeddingGemma 2): an MP4 file in,
//! the frames its processor samples out, each cut into patches like an image.
//!
//! It reproduces `EmbeddingGemma2VideoProcessor` (transformers 5.24) over transformers'
//! PyAV loader:
//! - **sampling** ([`sample_indices`]): `fps` frames a second of the video's duration (1 by
//!   default), frame `⌊i · video_fps / fps⌋`, at most `max_frames` (32) kept by `uniform`
//!   (numpy's `linspace`) or `truncate`;
//! - **decoding** ([`decode`]): H.264 (Baseline, Main, High; 8-bit 4:2:0, progressive) in MP4
//!   ([`mp4`]), through openh264, and YUV to RGB as FFmpeg's swscale does it ([`color`], matrix and range
//!   from the SPS, [`sps`]); other codecs and containers are refused with a clear error;
//! - **frames**: each resized to the video processor's own soft-token budget (`max_soft_tokens`,
//!   70 in published configs) with torchvision's uint8 antialiased bicubic, patched as images
//!   are ([`crate::input::image::patches`]), its bytes divided by 255 (the video processor's
//!   fused rescale and normalize);
//! - **text**: each frame is `<|image>` + its soft tokens as `<|video|>` + `<image|>`, the
//!   frames back to back, or with `add_timestamps` each preceded by its `mm:ss` and joined
//!   with spaces ([`video_text`]).
//!
//! Not read: the audio track (`load_audio_from_video`, off by default in transformers too).
//!
//! **Limits.** Decoding is the cost: every frame up to the last sampled one is decoded, so
//! [`VideoLimits::max_frames`] (`--max-video-frames`) bounds the frames a file's sample table
//! declares, a frame over 1920×1088 counting as several; a file over it, or with frames over
//! [`MAX_FRAME_PIXELS`], is refused from its header before any frame is decoded. Memory is a
//! frame's RGB and the sampled frames' patches.

pub mod color;
pub mod decode;
pub mod mp4;
pub mod sps;

use crate::input::image::patches::{patches_from_rgb, Alpha, Backend, PatchConfig, Patches, Sizing};
use crate::input::image::ImageInfo;
use serde_json::Value;
use std::collections::BTreeMap;

/// The largest frame decoded: DCI 4K with headroom (4096 × 2304).
pub const MAX_FRAME_PIXELS: u64 = 4096 * 2304;
/// The frame the budget counts in: coded 1080p.
const BUDGET_FRAME_PIXELS: u64 = 1920 * 1088;

/// What a server accepts of one video.
#[derive(Debug, Clone, Copy)]
pub struct VideoLimits {
    /// Frames a file may hold, counted in 1080p frames (`--max-video-frames`).
    pub max_frames: usize,
    pub max_frame_pixels: u64,
}

impl Default for VideoLimits {
    fn default() -> Self {
        VideoLimits { max_frames: 1800, max_frame_pixels: MAX_FRAME_PIXELS }
    }
}

impl VideoLimits {
    /// What one frame of `pixels` counts against [`Self::max_frames`].
    pub fn frame_cost(&self, pixels: u64) -> u64 {
        pixels.div_ceil(BUDGET_FRAME_PIXELS).max(1)
    }
}

/// Why a video cannot be used: the client's (400), but [`VideoError::Config`], the model
/// folder's (at load).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VideoError {
    /// A `video_processor` that cannot be used.
    #[error("{0}")]
    Config(String),
    #[error("The video could not be read: {0}. Send H.264 video in an MP4 file")]
    Format(String),
    #[error("The video uses {0}; this server decodes 8-bit 4:2:0 progressive H.264 (Baseline, Main or High profile)")]
    Unsupported(String),
    #[error("The video holds {frames} frames (1080p-sized; larger frames count as several); this server decodes at most {max} (--max-video-frames)")]
    TooManyFrames { frames: u64, max: usize },
    #[error("The video's frames are {width}x{height} pixels, more than the {max_pixels} allowed")]
    TooLarge { width: u32, height: u32, max_pixels: u64 },
    #[error("The video could not be decoded: {0}")]
    Decode(String),
    #[error("The video's frames could not be prepared: {0}")]
    Frame(String),
}

/// How sampled frames beyond `max_frames` are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Evenly spread (`np.linspace`).
    Uniform,
    /// The first `max_frames`.
    Truncate,
}

/// The `video_processor` of a processor config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoConfig {
    pub patches: PatchConfig,
    /// Frames sampled per second; `None` keeps every frame.
    pub fps: Option<f64>,
    pub max_frames: usize,
    pub overflow: Overflow,
    pub add_timestamps: bool,
}

impl VideoConfig {
    /// Reads `EmbeddingGemma2VideoProcessor`'s fields, with its defaults; `patch_geometry` is
    /// the tower's (patch size, pooling kernel), which the block must repeat.
    pub fn from_json(block: &Value, patch_geometry: (usize, usize)) -> Result<Self, VideoError> {
        let bad = VideoError::Config;
        let count = |name: &str, default: usize| match block.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| bad(format!("video_processor.{name} is not a count: {v}"))),
        };
        let flag = |name: &str, default: bool| match block.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| bad(format!("video_processor.{name} is not true or false: {v}"))),
        };
        let patches = PatchConfig {
            patch_size: count("patch_size", patch_geometry.0)?,
            pooling_kernel_size: count("pooling_kernel_size", patch_geometry.1)?,
            max_soft_tokens: count("max_soft_tokens", 70)?,
            backend: Backend::TorchvisionFused,
            sizing: Sizing::SoftTokenBudget,
            normalize: None,
            alpha: Alpha::OverWhite,
        };
        patches.check().map_err(|e| bad(e.to_string()))?;
        if (patches.patch_size, patches.pooling_kernel_size) != patch_geometry {
            return Err(bad(format!(
                "the video processor makes {}px patches pooled {}×{}; the vision tower takes {}px pooled {}×{}",
                patches.patch_size,
                patches.pooling_kernel_size,
                patches.pooling_kernel_size,
                patch_geometry.0,
                patch_geometry.1,
                patch_geometry.1
            )));
        }
        let fps = match (flag("do_sample_frames", true)?, block.get("fps")) {
            (false, _) => None,
            (true, None) => Some(1.0),
            (true, Some(Value::Null)) => None,
            (true, Some(v)) => Some(
                v.as_f64()
                    .filter(|f| *f > 0.0 && f.is_finite())
                    .ok_or_else(|| bad(format!("video_processor.fps is not a positive number: {v}")))?,
            ),
        };
        let overflow = match block.get("overflow_strategy").and_then(Value::as_str).unwrap_or("uniform") {
            "uniform" => Overflow::Uniform,
            "truncate" => Overflow::Truncate,
            other => return Err(bad(format!("video_processor.overflow_strategy `{other}` is not `uniform` or `truncate`"))),
        };
        if count("resample", 3)? != 3 {
            return Err(bad("video_processor.resample: only bicubic (3) is implemented".into()));
        }
        let unit = |name: &str, want: f64| match block.get(name) {
            None | Some(Value::Null) => true,
            Some(Value::Array(values)) => values.iter().all(|v| v.as_f64() == Some(want)),
            Some(v) => v.as_f64() == Some(want),
        };
        if !(flag("do_rescale", true)? && flag("do_normalize", true)? && unit("image_mean", 0.0) && unit("image_std", 1.0)) {
            return Err(bad("video_processor: only rescaling by 1/255 with mean 0 and std 1 (its defaults) is implemented".into()));
        }
        let max_frames = count("max_frames", 32)?;
        if max_frames == 0 {
            return Err(bad("video_processor.max_frames must be positive".into()));
        }
        Ok(VideoConfig { patches, fps, max_frames, overflow, add_timestamps: flag("add_timestamps", false)? })
    }
}

/// The display-order frames the processor samples from a video of `total` frames at
/// `video_fps` lasting `duration` seconds (`EmbeddingGemma2VideoProcessor.sample_frames`).
pub fn sample_indices(total: usize, video_fps: f64, duration: f64, config: &VideoConfig) -> Vec<usize> {
    let mut indices: Vec<usize> = match config.fps {
        None => (0..total).collect(),
        Some(fps) => {
            let step = video_fps / fps;
            let count = ((duration * fps) as usize).max(1);
            (0..count).map(|i| ((i as f64 * step) as usize).min(total.saturating_sub(1))).collect()
        }
    };
    if indices.len() > config.max_frames {
        indices = match config.overflow {
            Overflow::Truncate => indices[..config.max_frames].to_vec(),
            Overflow::Uniform => linspace(indices.len() - 1, config.max_frames).into_iter().map(|i| indices[i]).collect(),
        };
    }
    indices
}

/// `np.linspace(0, last, n, dtype=int)`: `i · step` in f64, truncated, the last exactly `last`.
fn linspace(last: usize, n: usize) -> Vec<usize> {
    if n == 1 {
        return vec![0];
    }
    let step = last as f64 / (n - 1) as f64;
    (0..n).map(|i| if i == n - 1 { last } else { (i as f64 * step) as usize }).collect()
}

/// `EmbeddingGemma2Processor.timestamp_fmt`: seconds rounded half to even, as `mm:ss`.
pub fn timestamp(seconds: f64) -> String {
    let s = seconds.round_ties_even().max(0.0) as u64;
    format!("{:02}:{:02}", s / 60, s % 60)
}

/// A video as the model takes it: its sampled frames' patches, and when each was shown.
#[derive(Debug, Clone)]
pub struct VideoFrames {
    pub frames: Vec<Patches>,
    pub timestamps: Vec<f64>,
}

/// The text that stands for a video: per frame, `begin placeholder×n end`, back to back, or
/// with timestamps `mm:ss begin … end` joined by spaces. `n` is each frame's soft tokens.
pub fn video_text(video: &VideoFrames, config: &VideoConfig, [begin, placeholder, end]: [&str; 3]) -> String {
    let frame = |p: &Patches| format!("{begin}{}{end}", placeholder.repeat(config.patches.soft_tokens(p.positions.len())));
    if config.add_timestamps {
        video.frames.iter().zip(&video.timestamps).map(|(p, &t)| format!("{} {}", timestamp(t), frame(p))).collect::<Vec<_>>().join(" ")
    } else {
        video.frames.iter().map(frame).collect()
    }
}

/// Demuxes, samples, decodes and patches one video.
pub fn preprocess(bytes: &[u8], config: &VideoConfig, limits: &VideoLimits) -> Result<VideoFrames, VideoError> {
    let demuxed = decode::demux(bytes, limits)?;
    let info = demuxed.info.clone();
    let indices = sample_indices(info.frames, info.fps, info.duration, config);
    let mut wanted = indices.clone();
    wanted.dedup(); // ascending already; a video slower than the sampling rate repeats frames
    let source = ImageInfo { width: info.width as u32, height: info.height as u32, format: "h264", bit_depth: 8 };
    let mut patched = BTreeMap::new();
    decode::decode_frames(bytes, &demuxed, &wanted, |index, rgb| {
        let patches =
            patches_from_rgb(rgb, info.width, info.height, &config.patches, source).map_err(|e| VideoError::Frame(e.to_string()))?;
        patched.insert(index, patches);
        Ok(())
    })?;
    let frames = indices
        .iter()
        .map(|i| patched.get(i).cloned().ok_or_else(|| VideoError::Decode(format!("frame {i} was not decoded"))))
        .collect::<Result<_, _>>()?;
    Ok(VideoFrames { frames, timestamps: indices.iter().map(|&i| i as f64 / info.fps).collect() })
}

/// The header checks of [`preprocess`] alone (container, codec, size, frame budget): cheap
/// enough to run over every video of a request before the first is decoded.
pub fn check_header(bytes: &[u8], limits: &VideoLimits) -> Result<decode::VideoInfo, VideoError> {
    decode::demux(bytes, limits).map(|d| d.info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(fps: Option<f64>, max_frames: usize, overflow: Overflow) -> VideoConfig {
        let patches = PatchConfig {
            patch_size: 4,
            pooling_kernel_size: 2,
            max_soft_tokens: 70,
            backend: Backend::TorchvisionFused,
            sizing: Sizing::SoftTokenBudget,
            normalize: None,
            alpha: Alpha::OverWhite,
        };
        VideoConfig { patches, fps, max_frames, overflow, add_timestamps: false }
    }

    #[test]
    fn sampling_follows_the_processor() {
        let c = config(Some(1.0), 32, Overflow::Uniform);
        assert_eq!(sample_indices(75, 25.0, 3.0, &c), [0, 25, 50]);
        // 40 s at 2 fps: 40 sampled, 32 kept by linspace (values from transformers).
        let want =
            [0, 2, 4, 6, 10, 12, 14, 16, 20, 22, 24, 26, 30, 32, 34, 36, 40, 42, 44, 46, 50, 52, 54, 56, 60, 62, 64, 66, 70, 72, 74, 78];
        assert_eq!(sample_indices(80, 2.0, 40.0, &c), want);
        assert_eq!(sample_indices(80, 2.0, 40.0, &config(Some(1.0), 3, Overflow::Truncate)), [0, 2, 4]);
        // Shorter than a second: one frame. Slower than the sampling rate: frames repeat.
        assert_eq!(sample_indices(5, 10.0, 0.5, &c), [0]);
        assert_eq!(sample_indices(3, 0.5, 6.0, &c), [0, 0, 1, 1, 2, 2]);
        assert_eq!(sample_indices(4, 10.0, 0.4, &config(None, 32, Overflow::Uniform)), [0, 1, 2, 3]);
    }

    /// The fixture videos decode to PyAV's RGB frames (their channel sums, every sampled
    /// frame) at the frames transformers samples, and patch to its first frame's pixel values.
    #[test]
    fn fixture_videos_match_pyav_and_the_processor() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{root}/expected/embeddinggemma2-omni.json")).unwrap()).unwrap();
        let c = config(Some(1.0), 32, Overflow::Uniform);
        for record in expected["video"].as_array().unwrap() {
            let file = record["file"].as_str().unwrap();
            let bytes = std::fs::read(format!("{root}/video/{file}")).unwrap();
            let demuxed = decode::demux(&bytes, &VideoLimits::default()).unwrap();
            let info = &demuxed.info;
            assert_eq!(info.frames as u64, record["total_frames"].as_u64().unwrap(), "{file}");
            assert!(
                (info.fps - record["fps"].as_f64().unwrap()).abs() < 1e-9
                    && (info.duration - record["duration"].as_f64().unwrap()).abs() < 1e-9,
                "{file}: {info:?}"
            );
            let indices = sample_indices(info.frames, info.fps, info.duration, &c);
            let want: Vec<usize> = record["frame_indices"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
            assert_eq!(indices, want, "{file}");
            let mut sums = Vec::new();
            decode::decode_frames(&bytes, &demuxed, &indices, |_, rgb| {
                sums.push((0..3).map(|c| rgb.iter().skip(c).step_by(3).map(|&v| v as u64).sum::<u64>()).collect::<Vec<_>>());
                Ok(())
            })
            .unwrap();
            let want_sums: Vec<Vec<u64>> = record["frame_channel_sums"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect())
                .collect();
            assert_eq!(sums, want_sums, "{file}: RGB frames differ from PyAV's");
            let video = preprocess(&bytes, &c, &VideoLimits::default()).unwrap();
            let first = &video.frames[0];
            let positions: Vec<(u32, u32)> = record["first_frame_positions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap() as u32))
                .collect();
            assert_eq!(first.positions, positions, "{file}");
            let values = first.rescaled();
            let want: Vec<f32> =
                record["first_frame_pixel_values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let diff = values.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let off = values.iter().zip(&want).filter(|(a, b)| (*a - *b).abs() > 1e-6).count();
            eprintln!("{file}: first frame's pixel values: max diff {diff:e}, {off} of {} differ", want.len());
            assert_eq!(values.len(), want.len());
            // The reference's values are printed with 7 significant digits.
            assert!(diff <= 1e-6 && off == 0, "{file}: {diff}, {off} values differ");
        }
    }

    /// Damaged files give errors (or frames), never a panic or a crash: bytes flipped all over
    /// (container and bitstream), and cut at every length.
    #[test]
    fn damaged_videos_give_errors_not_crashes() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/video");
        let c = config(Some(1.0), 32, Overflow::Uniform);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for name in ["pattern_96x64_10fps_3s_baseline.mp4", "pattern_100x60_5fps_high_bframes.mp4"] {
            let bytes = std::fs::read(format!("{root}/{name}")).unwrap();
            for len in (0..bytes.len()).step_by(bytes.len() / 40) {
                let _ = preprocess(&bytes[..len], &c, &VideoLimits::default());
            }
            for _ in 0..150 {
                let mut b = bytes.clone();
                for _ in 0..1 + next() % 6 {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                let _ = preprocess(&b, &c, &VideoLimits::default());
            }
        }
    }

    #[test]
    fn timestamps_round_half_to_even() {
        assert_eq!(
            (timestamp(0.0), timestamp(2.5), timestamp(3.5), timestamp(61.2)),
            ("00:00".into(), "00:02".into(), "00:04".into(), "01:01".into())
        );
    }

    #[test]
    fn config_reads_the_processor_block() {
        let block = serde_json::json!({"fps": 1, "max_frames": 32, "max_soft_tokens": 70, "patch_size": 4, "pooling_kernel_size": 2,
            "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "do_normalize": true, "resample": 3});
        assert_eq!(VideoConfig::from_json(&block, (4, 2)).unwrap(), config(Some(1.0), 32, Overflow::Uniform));
        assert!(VideoConfig::from_json(&block, (16, 3)).is_err());
        assert!(VideoConfig::from_json(&serde_json::json!({"overflow_strategy": "drop"}), (16, 3)).is_err());
        assert!(VideoConfig::from_json(&serde_json::json!({"image_mean": 0.5}), (16, 3)).is_err());
    }
}
