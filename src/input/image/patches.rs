//! Gemma 4's image preprocessing (`Gemma4ImageProcessor`, transformers 5.24, and its video
//! processor's frames), used by EmbeddingGemma 2: no fixed size and no crop; the image is
//! resized, keeping its aspect ratio, to the largest size whose sides are multiples of
//! `pooling_kernel_size · patch_size` and whose patches fit the budget
//! `max_soft_tokens · pooling_kernel_size²`, with the bicubic filter of the processor's backend
//! ([`Backend`]: torchvision's, which `AutoProcessor` loads when torchvision is installed, or
//! Pillow's for a config naming `Gemma4ImageProcessorPil`; transformers saves both classes
//! under the first name, so a folder as saved gets torchvision's, as transformers gives it);
//! rescaled by 1/255 (no normalization); and cut into `patch_size`² patches, row-major over the
//! patch grid, each patch's pixels row by row with the channels innermost, each with its
//! `(x, y)` grid position. Padding to the budget, which the processor adds for a dense batch,
//! is left out: the tower runs each image's real patches as one sequence.

use super::decode::{decode, to_rgb, without_alpha};
use super::resample::{copy_region, resize, resize_torch, Filter, TorchFilter};
use super::{ImageError, ImageInfo, ImageLimits};

/// The soft-token budgets the processor accepts (`_SUPPORTED_SOFT_TOKENS`).
pub const SUPPORTED_SOFT_TOKENS: [usize; 5] = [70, 140, 280, 560, 1120];

/// What the processor's config sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PatchConfig {
    pub patch_size: usize,
    /// Patches pooled (Gemma 4) or merged (Qwen2-VL) into one soft token, per side.
    pub pooling_kernel_size: usize,
    pub max_soft_tokens: usize,
    /// The processor class the patches reproduce (its resize and rescale).
    pub backend: Backend,
    /// How the image's size is chosen.
    pub sizing: Sizing,
    /// The processor's normalization, where it normalizes (Qwen2-VL; Gemma 4 only rescales).
    pub normalize: Option<Normalize>,
    /// What becomes of the image's transparency.
    pub alpha: Alpha,
}

/// How a transparent image becomes RGB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpha {
    /// Composited over white: transformers' `convert_to_rgb`, which the image processors run.
    OverWhite,
    /// Dropped, the colours kept as they are: Pillow's `Image.convert("RGB")`, which some
    /// processors call before their image processor (ColQwen3's `process_images`).
    Dropped,
}

/// How a patch processor sizes an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// Gemma 4's: the largest aspect-preserving size whose patches fit `max_soft_tokens`.
    SoftTokenBudget,
    /// Qwen2-VL's `smart_resize`: sides rounded to multiples of `patch_size ×
    /// pooling_kernel_size`, then scaled into `min_pixels..=max_pixels`.
    SmartResize { min_pixels: usize, max_pixels: usize },
}

/// `image_mean` and `image_std`, applied as torchvision's processors fuse them with the
/// rescale: `(v − mean·255) / (std·255)` in f32 on the byte value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl PatchConfig {
    pub fn check(&self) -> Result<(), ImageError> {
        if let Sizing::SmartResize { min_pixels, max_pixels } = self.sizing {
            let factor = self.patch_size * self.pooling_kernel_size;
            if factor == 0 || min_pixels > max_pixels || max_pixels < factor * factor || max_pixels > 1 << 28 {
                return Err(ImageError::Config(format!(
                    "size: shortest_edge {min_pixels} and longest_edge {max_pixels} pixels do not fit {factor}px blocks"
                )));
            }
            return Ok(());
        }
        if !SUPPORTED_SOFT_TOKENS.contains(&self.max_soft_tokens) {
            return Err(ImageError::Config(format!(
                "max_soft_tokens must be one of {SUPPORTED_SOFT_TOKENS:?}, got {}",
                self.max_soft_tokens
            )));
        }
        if self.patch_size == 0 || self.pooling_kernel_size == 0 {
            return Err(ImageError::Config("patch_size and pooling_kernel_size must be positive".into()));
        }
        Ok(())
    }

    /// Patches pooled into one soft token.
    pub fn patches_per_token(&self) -> usize {
        self.pooling_kernel_size * self.pooling_kernel_size
    }

    /// The soft tokens `patches` patches become.
    pub fn soft_tokens(&self, patches: usize) -> usize {
        patches / self.patches_per_token()
    }

    /// The most patches an image may have.
    pub fn max_patches(&self) -> usize {
        self.max_soft_tokens * self.patches_per_token()
    }

    /// The `(height, width)` an image is resized to: Gemma 4's
    /// `get_aspect_ratio_preserving_size`, or Qwen2-VL's `smart_resize`.
    pub fn target_size(&self, height: usize, width: usize) -> Result<(usize, usize), ImageError> {
        match self.sizing {
            Sizing::SoftTokenBudget => self.budget_size(height, width),
            Sizing::SmartResize { min_pixels, max_pixels } => {
                smart_resize(height, width, self.patch_size * self.pooling_kernel_size, min_pixels, max_pixels)
            }
        }
    }

    fn budget_size(&self, height: usize, width: usize) -> Result<(usize, usize), ImageError> {
        let target_px = (self.max_patches() * self.patch_size * self.patch_size) as f64;
        let factor = (target_px / (height * width) as f64).sqrt();
        let side = self.pooling_kernel_size * self.patch_size;
        let floor_to_side = |ideal: f64| (ideal / side as f64).floor() as usize * side;
        let (mut th, mut tw) = (floor_to_side(factor * height as f64), floor_to_side(factor * width as f64));
        if th == 0 && tw == 0 {
            return Err(ImageError::Config(format!("a {height}x{width} image resizes to 0x0")));
        }
        let max_side = self.soft_tokens(self.max_patches()) * side;
        if th == 0 {
            th = side;
            tw = ((width / height) * side).min(max_side);
        } else if tw == 0 {
            tw = side;
            th = ((height / width) * side).min(max_side);
        }
        if (th * tw) as f64 > target_px {
            return Err(ImageError::Config(format!(
                "a {height}x{width} image resizes to {th}x{tw}, over the {} patches of {}px",
                self.max_patches(),
                self.patch_size
            )));
        }
        Ok((th, tw))
    }
}

/// Qwen2-VL's `smart_resize`: each side rounded to a multiple of `factor` (Python's `round`,
/// ties to even), then, when the area leaves `min_pixels..=max_pixels`, both sides scaled by
/// the area's square root (down with `floor`, up with `ceil`).
fn smart_resize(height: usize, width: usize, factor: usize, min_pixels: usize, max_pixels: usize) -> Result<(usize, usize), ImageError> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if height == 0 || width == 0 || h.max(w) / h.min(w) > 200.0 {
        return Err(ImageError::Config(format!("absolute aspect ratio must be smaller than 200, got {width}x{height}")));
    }
    let (mut hb, mut wb) = ((h / f).round_ties_even() * f, (w / f).round_ties_even() * f);
    if hb * wb > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    Ok((hb as usize, wb as usize))
}

/// One image's (or video frame's) patches, as the vision tower takes them.
#[derive(Debug, Clone)]
pub struct Patches {
    /// `[patches, patch_size² · 3]`, u8 until the batch runs (the f32 values are `v / 255`).
    pub data: Vec<u8>,
    /// Each patch's `(x, y)` in the patch grid.
    pub positions: Vec<(u32, u32)>,
    pub source: ImageInfo,
    /// Which processor made them, which says how a byte becomes a value.
    pub backend: Backend,
    /// The processor's normalization, where it has one.
    pub normalize: Option<Normalize>,
}

/// The transformers processor a picture's patches reproduce. Pillow and torchvision resize
/// differently (a level on a few pixels), and the three turn a byte into a value differently
/// (in the last bit, for about half of the 256).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `Gemma4ImageProcessorPil`: Pillow's bicubic resize, then `v · (1/255)` in f64, then f32.
    Pil,
    /// `Gemma4ImageProcessor` (torchvision): torchvision's uint8 antialiased bicubic resize,
    /// then its rescale, a float32 tensor times `1/255` as float32.
    Torchvision,
    /// `EmbeddingGemma2VideoProcessor` (torchvision): the same resize, then its fused
    /// rescale-and-normalize (mean 0, std 1): `v / 255` in f32.
    TorchvisionFused,
}

impl Backend {
    /// The processor class a config's `image_processor_type` names; a config without one is
    /// the class `AutoImageProcessor` picks, torchvision's.
    pub fn of_image_processor(type_name: Option<&str>) -> Option<Backend> {
        match type_name {
            None | Some("Gemma4ImageProcessor") => Some(Backend::Torchvision),
            Some("Gemma4ImageProcessorPil") => Some(Backend::Pil),
            Some(_) => None,
        }
    }
}

impl Patches {
    /// The pixel values, rescaled (and normalized) as transformers makes them.
    pub fn rescaled(&self) -> Vec<f32> {
        if let Some(Normalize { mean, std }) = self.normalize {
            let (mean, std) = (mean.map(|m| m * 255.0), std.map(|s| s * 255.0));
            return self.data.iter().enumerate().map(|(i, &v)| (v as f32 - mean[i % 3]) / std[i % 3]).collect();
        }
        match self.backend {
            Backend::Pil => self.data.iter().map(|&v| (v as f64 * (1.0 / 255.0)) as f32).collect(),
            Backend::Torchvision => self.data.iter().map(|&v| v as f32 * (1.0 / 255.0) as f32).collect(),
            Backend::TorchvisionFused => self.data.iter().map(|&v| v as f32 / 255.0).collect(),
        }
    }
}

/// Decodes, resizes and patches one image.
pub fn preprocess_patches(bytes: &[u8], config: &PatchConfig, limits: &ImageLimits) -> Result<Patches, ImageError> {
    config.check()?;
    let (img, source) = decode(bytes, limits)?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    let rgb = match config.alpha {
        Alpha::OverWhite => to_rgb(img),
        Alpha::Dropped => without_alpha(img),
    };
    patches_from_rgb(&rgb, w, h, config, source)
}

/// Resizes an RGB picture (`w × h × 3` bytes, row-major) to its budget's size with the
/// backend's bicubic filter and cuts it into patches.
pub fn patches_from_rgb(rgb: &[u8], w: usize, h: usize, config: &PatchConfig, source: ImageInfo) -> Result<Patches, ImageError> {
    let (th, tw) = config.target_size(h, w)?;
    let backend = config.backend;
    let resized = match backend {
        _ if (tw, th) == (w, h) => copy_region(rgb, w, 0..w, 0..h),
        Backend::Pil => resize(rgb, (w, h), (tw, th), Filter::Bicubic, 0..tw, 0..th),
        Backend::Torchvision | Backend::TorchvisionFused => resize_torch(rgb, (w, h), (tw, th), TorchFilter::Bicubic),
    };
    let p = config.patch_size;
    let (grid_h, grid_w) = (th / p, tw / p);
    let mut data = Vec::with_capacity(grid_h * grid_w * p * p * 3);
    let mut positions = Vec::with_capacity(grid_h * grid_w);
    for gy in 0..grid_h {
        for gx in 0..grid_w {
            for row in 0..p {
                let start = ((gy * p + row) * tw + gx * p) * 3;
                data.extend_from_slice(&resized[start..start + p * 3]);
            }
            positions.push((gx as u32, gy as u32));
        }
    }
    Ok(Patches { data, positions, source, backend, normalize: config.normalize })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_sizes_follow_the_processor() {
        // Gemma 4's defaults: patch 16, kernel 3, 280 soft tokens (2,520 patches).
        let config = PatchConfig {
            patch_size: 16,
            pooling_kernel_size: 3,
            max_soft_tokens: 280,
            backend: Backend::Pil,
            sizing: Sizing::SoftTokenBudget,
            normalize: None,
            alpha: Alpha::OverWhite,
        };
        // Values from transformers' get_aspect_ratio_preserving_size.
        assert_eq!(config.target_size(768, 1024).unwrap(), (672, 912));
        assert_eq!(config.target_size(1000, 1000).unwrap(), (768, 768));
        // A strip too thin for one row of pooled patches keeps one and is capped.
        assert_eq!(config.target_size(10, 100_000).unwrap(), (48, 13440));
        assert!(PatchConfig { max_soft_tokens: 100, ..config }.check().is_err());
    }

    #[test]
    fn smart_resize_follows_qwen2_vl() {
        // Values from transformers' smart_resize (factor 28).
        let (min, max) = (56 * 56, 28 * 28 * 16);
        assert_eq!(smart_resize(61, 97, 28, min, max).unwrap(), (56, 84));
        assert_eq!(smart_resize(130, 50, 28, min, max).unwrap(), (140, 56));
        assert_eq!(smart_resize(25, 19, 28, min, max).unwrap(), (84, 56));
        // Over the budget: scaled down by the area, floored.
        assert_eq!(smart_resize(1000, 1000, 28, min, max).unwrap(), (112, 112));
        // Python's round: 70 / 28 = 2.5 rounds to 2, 98 / 28 = 3.5 to 4.
        assert_eq!(smart_resize(70, 98, 28, 0, 1 << 20).unwrap(), (56, 112));
        assert!(smart_resize(1, 300, 28, min, max).is_err());
    }
}
