//! Image preprocessing for CLIP / SigLIP vision towers: bytes (PNG, JPEG, WebP) to `[3, H, W]` pixel values.
//!
//! It reproduces transformers' PIL backend (`CLIPImageProcessorPil`, `SiglipImageProcessorPil`, transformers
//! 5.23 with Pillow) step by step, because the towers were trained and are evaluated on exactly those pixels
//! and a "close enough" resize (other filter taps, float instead of Pillow's 22-bit fixed point, no intermediate
//! rounding) moves embeddings visibly. The steps: convert to RGB (alpha composited over white with Pillow's
//! integer `alpha_composite`), `Image.resize` (Pillow's `Resample.c`: separable, horizontal pass first,
//! antialiased support, fixed-point coefficients, uint8 between passes), center crop (zero padding when the
//! image is smaller), rescale in f64 then f32, normalize in f32.
//!
//! The crop is kept as u8 ([`PixelValues`]) until its batch runs: each u8 of a channel maps to
//! one f32 ([`ChannelTables`]), so the f32 pixel values (4 bytes a value) exist only for the
//! images of the batch being run, not for every image queued (a 1,024-image request holds
//! 150 MB of 224×224 crops instead of 600 MB).
//!
//! Known differences from Python: the pass order of some shrink-both-sides resizes (see `resize`); JPEG decoding is zune-jpeg, not libjpeg-turbo (IDCT and chroma upsampling
//! rounding differ by a few levels on some pixels); CMYK JPEGs and lossy WebP go through the `image` crate's
//! own colour conversion. 16-bit images follow Pillow: colour/alpha channels keep the high byte, 16-bit gray
//! (Pillow mode `I;16`) is clamped to 255 as Pillow's `I;16 -> RGB` does (so such images come out near white,
//! as they do in Python). `do_convert_rgb = false` is treated as true: the towers need 3 channels and for RGB
//! input the two are identical.
//!
//! The subjects, a file each: [`config`] (`preprocessor_config.json`), [`decode`] (formats,
//! limits, RGB, data URLs), [`resample`] (Pillow's resize); this file holds the pipeline.

mod config;
mod decode;
pub mod frames;
pub mod patches;
mod resample;

pub use config::{CropBackend, HeightWidth, ImageProcessorConfig, Size, Splitting};
pub use decode::decode_data_url;
use decode::{decode, to_rgb};
use resample::{copy_region, resize, Filter};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the image could not be decoded: {0}")]
    Undecodable(String),
    #[error("the image is {width}x{height} pixels, more than the {max_pixels} allowed")]
    TooLarge { width: u32, height: u32, max_pixels: u64 },
    #[error("the image is {width}x{height} pixels: sides over {MAX_ASPECT}:1 are refused (resampling cost grows with the ratio)")]
    AspectRatio { width: u32, height: u32 },
    #[error("unsupported image format: only PNG, JPEG and WebP are accepted")]
    UnsupportedFormat,
    /// A page whose frames ([`frames`]) would pass the model's length.
    #[error("the image makes {frames} frames ({rows} × {cols} tiles and the whole image), more than the {max} that fit this model's maximum context length")]
    TooManyFrames { frames: usize, rows: usize, cols: usize, max: usize },
    #[error("image processor config: {0}")]
    Config(String),
    /// A field of an image processor's config that cannot be used: raised while serde reads
    /// `preprocessor_config.json` (serde's message then says where; [`ImageError::Config`]
    /// wraps it with the path), or by the loader's reading of a `Qwen2VLImageProcessor` block.
    #[error("{0}")]
    ConfigField(String),
    /// A `data:` URL that is not base64 image data.
    #[error("{0}")]
    DataUrl(String),
}

/// Longest side over shortest side accepted: a 40-megapixel 1-pixel-high strip would make
/// resampling tables of hundreds of megabytes; no photo or scan comes near this.
pub const MAX_ASPECT: usize = 1000;

/// Limits on untrusted input, checked on the header before any pixel is decoded.
#[derive(Debug, Clone, Copy)]
pub struct ImageLimits {
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits { max_pixels: 40_000_000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    pub width: u32,
    pub height: u32,
    pub format: &'static str,
    /// Bits per channel as stored (8 or 16).
    pub bit_depth: u8,
}

/// Per channel, the f32 each u8 becomes: rescaled in f64 then to f32, normalized in f32
/// (numpy's order in transformers).
#[derive(Debug)]
pub struct ChannelTables([[f32; 256]; 3]);

impl ChannelTables {
    pub fn new(config: &ImageProcessorConfig) -> Self {
        let mut tables = [[0f32; 256]; 3];
        for (c, table) in tables.iter_mut().enumerate() {
            // `check` refuses configs without three of each; none reaches here with fewer.
            let (mean, std) =
                (config.image_mean.get(c).copied().unwrap_or(0.0) as f32, config.image_std.get(c).copied().unwrap_or(1.0) as f32);
            for (v, out) in table.iter_mut().enumerate() {
                *out = match (config.backend, config.do_rescale, config.do_normalize) {
                    (config::CropBackend::Torchvision, true, true) => {
                        let to_bytes = (1.0 / config.rescale_factor) as f32;
                        (v as f32 - mean * to_bytes) / (std * to_bytes)
                    }
                    (config::CropBackend::Torchvision, true, false) => v as f32 * config.rescale_factor as f32,
                    _ => {
                        let x = if config.do_rescale { (v as f64 * config.rescale_factor) as f32 } else { v as f32 };
                        if config.do_normalize {
                            (x - mean) / std
                        } else {
                            x
                        }
                    }
                };
            }
        }
        ChannelTables(tables)
    }
}

/// A preprocessed image, `[3, height, width]` channel-first RGB, row-major, still u8; its
/// pixel values are [`PixelValues::normalized_into`].
#[derive(Debug, Clone)]
pub struct PixelValues {
    pub data: Vec<u8>,
    pub height: usize,
    pub width: usize,
    pub source: ImageInfo,
    pub tables: Arc<ChannelTables>,
}

impl PixelValues {
    /// Appends the pixel values the vision tower takes (`3 × height × width` f32) to `out`.
    pub fn normalized_into(&self, out: &mut Vec<f32>) {
        let plane = self.height * self.width;
        for (channel, table) in self.data.chunks(plane.max(1)).zip(&self.tables.0) {
            out.extend(channel.iter().map(|&v| table[v as usize]));
        }
    }

    /// The pixel values as a vector of their own.
    pub fn normalized(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.data.len());
        self.normalized_into(&mut out);
        out
    }
}

/// The checks [`preprocess_with`] makes before decoding (format, truncated JPEG, the pixel
/// limit, the aspect ratio), from the header alone: cheap enough to run over every image of a
/// request before the first is decoded.
pub fn check_header(bytes: &[u8], limits: &ImageLimits) -> Result<ImageInfo, ImageError> {
    decode::header(bytes, limits)
}

/// [`preprocess_with`] and tables made for this one image.
pub fn preprocess(bytes: &[u8], config: &ImageProcessorConfig, limits: &ImageLimits) -> Result<PixelValues, ImageError> {
    config.check()?;
    preprocess_with(bytes, config, limits, &Arc::new(ChannelTables::new(config)))
}

/// Decodes, resizes and crops one image; `tables` (the model's, made once) normalize it later.
pub fn preprocess_with(
    bytes: &[u8],
    config: &ImageProcessorConfig,
    limits: &ImageLimits,
    tables: &Arc<ChannelTables>,
) -> Result<PixelValues, ImageError> {
    config.check()?;
    // `decode` has checked the size and the aspect ratio from the header.
    let (img, source) = decode(bytes, limits)?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    let rgb = to_rgb(img);
    // transformers' get_resize_output_image_size: int(s * long / short) truncates.
    let (rh, rw) = match (config.do_resize, config.size) {
        (false, _) => (h, w),
        (true, Size::Exact(hw)) => (hw.height, hw.width),
        (true, Size::LongestEdge(_)) => return Err(ImageError::Config("an Idefics3 processor cuts images into frames".into())),
        (true, Size::ShortestEdge(s)) => {
            let long = (s as f64 * w.max(h) as f64 / w.min(h) as f64) as usize;
            if w <= h {
                (long, s)
            } else {
                (s, long)
            }
        }
    };
    let (oh, ow) = config.output_size();
    // Crop origin in resized coordinates; negative when transformers pads (image centred, ceil on the
    // leading side), which is floor((resized - crop) / 2) in both cases.
    let (top, left) =
        if config.do_center_crop { ((rh as isize - oh as isize).div_euclid(2), (rw as isize - ow as isize).div_euclid(2)) } else { (0, 0) };
    let span = |o: isize, n: usize, full: usize| o.max(0) as usize..((o + n as isize).max(0) as usize).min(full);
    let (ys, xs) = (span(top, oh, rh), span(left, ow, rw));
    // Only the surviving rows and columns are resampled: each output pixel depends only on its own taps.
    let filter = Filter::from_pil(config.resample).ok_or_else(|| ImageError::Config("resample".into()))?;
    let region = if (rw, rh) == (w, h) {
        copy_region(&rgb, w, xs.clone(), ys.clone())
    } else if config.backend == config::CropBackend::Torchvision {
        // torchvision resizes the whole image, then crops.
        let filter = resample::TorchFilter::from_pil(config.resample).ok_or_else(|| ImageError::Config("resample".into()))?;
        copy_region(&resample::resize_torch(&rgb, (w, h), (rw, rh), filter), rw, xs.clone(), ys.clone())
    } else {
        resize(&rgb, (w, h), (rw, rh), filter, xs.clone(), ys.clone())
    };
    // Channel-first u8; the zero padding of a crop larger than the image is a u8 0 too, which
    // normalizes as transformers' padded zeros do (its pad happens before rescaling).
    let (dy, dx) = ((ys.start as isize - top) as usize, (xs.start as isize - left) as usize);
    let mut data = Vec::with_capacity(3 * oh * ow);
    for c in 0..3 {
        for oy in 0..oh {
            for ox in 0..ow {
                let inside = (dy..dy + ys.len()).contains(&oy) && (dx..dx + xs.len()).contains(&ox);
                data.push(if inside { region[((oy - dy) * xs.len() + ox - dx) * 3 + c] } else { 0 });
            }
        }
    }
    Ok(PixelValues { data, height: oh, width: ow, source, tables: Arc::clone(tables) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/images/{name}")).unwrap()
    }

    fn config(json: &str) -> ImageProcessorConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn fixtures_match_transformers() {
        for model in ["clip-tiny", "siglip-tiny"] {
            let cfg = ImageProcessorConfig::from_file(format!("{FIXTURES}/models/{model}/preprocessor_config.json")).unwrap();
            let text = std::fs::read_to_string(format!("{FIXTURES}/expected/{model}.json")).unwrap();
            let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
            for case in expected["images"].as_array().unwrap() {
                let file = case["file"].as_str().unwrap();
                let bytes = fixture(file);
                let (img, _) = decode(&bytes, &ImageLimits::default()).unwrap();
                let channels = img.color().channel_count() as usize;
                let mut sums = vec![0u64; channels];
                for (i, &v) in img.as_bytes().iter().enumerate() {
                    sums[i % channels] += v as u64;
                }
                let want_sums: Vec<u64> = case["decoded_channel_sums"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
                let px = preprocess(&bytes, &cfg, &ImageLimits::default()).unwrap();
                let want: Vec<f32> = case["pixel_values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
                let values = px.normalized();
                assert_eq!((values.len(), px.height, px.width), (want.len(), cfg.output_size().0, cfg.output_size().1));
                let diff = values.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                eprintln!("{model} {file}: max abs diff {diff:e}, decoded sums {sums:?} (Pillow {want_sums:?})");
                // JPEG: zune-jpeg is not libjpeg-turbo (chroma upsampling/IDCT rounding: up to 4 levels on 27% of
                // pixels here). Both tall images (50x130, 33x77) shrink in both directions, where Pillow 13 sometimes
                // runs the vertical pass first by a rule not reproduced here (see `resize`): one level at most.
                let jpeg = file.ends_with(".jpg");
                let order = jpeg || file.ends_with(".webp");
                assert!(
                    diff <= if jpeg {
                        5e-2
                    } else if order {
                        2e-2
                    } else {
                        1e-6
                    },
                    "{model} {file}: {diff}"
                );
                assert!(jpeg || sums == want_sums, "{file}: decoded sums differ");
            }
        }
    }

    #[test]
    fn config_defaults_and_checks() {
        let clip = config("{}");
        assert_eq!((clip.size, clip.output_size(), clip.resample), (Size::ShortestEdge(224), (224, 224), 3));
        clip.check().unwrap();
        let siglip = config(r#"{"image_processor_type": "SiglipImageProcessor", "image_mean": 0.5, "image_std": 0.5}"#);
        assert_eq!((siglip.do_center_crop, siglip.output_size(), siglip.image_std.len()), (false, (224, 224), 3));
        siglip.check().unwrap();
        for bad in [
            r#"{"resample": 6}"#,
            r#"{"size": {"shortest_edge": 0}}"#,
            r#"{"crop_size": {"height": 0, "width": 3}}"#,
            r#"{"image_mean": [0.5, 0.5]}"#,
            r#"{"image_std": [0.5, 0.0, 0.5]}"#,
            r#"{"do_center_crop": false}"#,
        ] {
            assert!(matches!(config(bad).check(), Err(ImageError::Config(_))), "{bad}");
        }
        assert!(serde_json::from_str::<ImageProcessorConfig>(r#"{"size": {"longest_edge": 3}}"#).is_err());
    }

    #[test]
    fn crop_larger_than_image_pads_with_zeros() {
        // 19x25 gray, no resize, 30x30 crop: transformers pads ceil(5/2) = 3 rows on top, ceil(11/2) = 6 left.
        let cfg = config(r#"{"do_resize": false, "crop_size": 30, "image_mean": 0.5, "image_std": 0.5}"#);
        let px = preprocess(&fixture("gray_19x25.png"), &cfg, &ImageLimits::default()).unwrap();
        let (img, _) = decode(&fixture("gray_19x25.png"), &ImageLimits::default()).unwrap();
        let values = px.normalized();
        let at = |y: usize, x: usize| values[y * 30 + x];
        assert_eq!((at(0, 0), at(2, 10), at(10, 5), at(28, 10), at(10, 25)), (-1.0, -1.0, -1.0, -1.0, -1.0));
        let first = img.as_bytes()[0] as f32;
        assert!((at(3, 6) - ((first as f64 / 255.0) as f32 - 0.5) / 0.5).abs() < 1e-6);
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }

    #[test]
    fn huge_dimensions_are_refused_before_decoding() {
        let limits = ImageLimits { max_pixels: 10_000_000 };
        let cfg = config("{}");
        let mut png = fixture("gradient_97x61.png");
        png[16..24].copy_from_slice(&[0, 1, 0x86, 0xA0, 0, 1, 0x86, 0xA0]); // 100000 x 100000
        let crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        let err = preprocess(&png, &cfg, &limits).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { width: 100_000, height: 100_000, .. }), "{err}");
        let mut jpg = fixture("stripes_50x130.jpg");
        let sof = jpg.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        jpg[sof + 5..sof + 9].copy_from_slice(&[0xEA, 0x60, 0xEA, 0x60]); // 60000 x 60000
        let err = preprocess(&jpg, &cfg, &limits).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { width: 60_000, height: 60_000, .. }), "{err}");
    }

    #[test]
    fn hostile_bytes_give_errors_not_panics() {
        let (cfg, limits) = (config("{}"), ImageLimits::default());
        assert!(matches!(preprocess(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", &cfg, &limits), Err(ImageError::UnsupportedFormat)));
        assert!(matches!(preprocess(b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0", &cfg, &limits), Err(ImageError::UnsupportedFormat)));
        assert!(matches!(preprocess(b"", &cfg, &limits), Err(ImageError::UnsupportedFormat)));
        assert!(matches!(preprocess(b"not an image at all", &cfg, &limits), Err(ImageError::UnsupportedFormat)));
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for name in ["gradient_97x61.png", "stripes_50x130.jpg", "alpha_64x64.png", "checker_33x77.webp", "gray_19x25.png"] {
            let bytes = fixture(name);
            // Truncated inside the pixel data: an error (cutting only PNG's 12-byte IEND may still decode).
            for len in (0..bytes.len() - 12).step_by((bytes.len() / 97).max(1)) {
                assert!(preprocess(&bytes[..len], &cfg, &limits).is_err(), "{name} truncated to {len} decoded");
            }
            // Header kept, body garbage, or random bytes flipped: any result but a panic.
            for _ in 0..200 {
                let mut b = bytes.clone();
                for _ in 0..1 + next() % 8 {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                let _ = preprocess(&b, &cfg, &limits);
                let mut g = bytes[..bytes.len().min(16)].to_vec();
                g.extend((0..next() % 4096).map(|_| next() as u8));
                let _ = preprocess(&g, &cfg, &limits);
            }
        }
    }
}
