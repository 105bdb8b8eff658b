//! Idefics3's image splitting (transformers 5.24's `Idefics3ImageProcessor`, which
//! ColModernVBert's processor runs on every page), and the text its processor writes for the
//! frames: a page becomes `rows × cols` square frames of the tower's size plus the whole page
//! at that size, each its own run of `<image>` placeholders.
//!
//! The steps, each a torchvision resize of the uint8 image (Lanczos, antialiased: PyTorch's
//! int16 taps, [`super::resample::resize_torch`]) or Pillow's for an `…Pil` class:
//! 1. the longest side to `size.longest_edge` (up or down), the other by the aspect ratio,
//!    truncated and made even, then capped at 4096 a side;
//! 2. each side up to a multiple of the frame side (`max_image_size.longest_edge`): the longer
//!    rounded up, the shorter from it by the aspect ratio, rounded up;
//! 3. cut row by row into frames; the whole image resized to one frame comes last. An image of
//!    one frame is that frame alone, grid `0 × 0`.
//!
//! Without splitting (`do_image_splitting: false`, how vLLM runs ColModernVBert) the image is
//! resized to one square frame, grid `0 × 0`.

use super::config::{CropBackend, ImageProcessorConfig, Size, MAX_RESIZED_SIDE};
use super::decode::{decode, without_alpha};
use super::resample::{copy_region, resize, resize_torch, Filter, TorchFilter};
use super::{ChannelTables, ImageError, ImageLimits, PixelValues};
use std::sync::Arc;

/// The processor's `fake_image_token`: around each frame's placeholders.
const FRAME_BOUNDARY: &str = "<fake_token_around_image>";
/// The processor's `global_image_tag`: before the whole image's placeholders.
const GLOBAL_IMAGE: &str = "<global-img>";

/// A page's frames (each `[3, tile, tile]`, tiles row by row, then the whole page) and the grid
/// they were cut on (`0 × 0`: one frame, no tiles).
#[derive(Debug, Clone)]
pub struct Frames {
    pub frames: Vec<PixelValues>,
    pub rows: usize,
    pub cols: usize,
}

/// `(height, width)` after step 1 (`_resize_output_size_rescale_to_max_len`, then
/// `_resize_output_size_scale_below_upper_bound`), Python's float arithmetic and truncation.
fn longest_edge_size(h: usize, w: usize, longest: usize) -> (usize, usize) {
    let aspect = w as f64 / h as f64;
    let (mut h, mut w) = if w >= h {
        let h = (longest as f64 / aspect) as usize;
        (h + h % 2, longest)
    } else {
        let w = (longest as f64 * aspect) as usize;
        (longest, w + w % 2)
    };
    (h, w) = (h.max(1), w.max(1));
    let aspect = w as f64 / h as f64;
    let max = MAX_RESIZED_SIDE;
    if w >= h && w > max {
        (h, w) = ((max as f64 / aspect) as usize, max);
    } else if h > w && h > max {
        (h, w) = (max, (max as f64 * aspect) as usize);
    }
    (h.max(1), w.max(1))
}

/// `(height, width)` after step 2 (`resize_for_vision_encoder`).
fn whole_frames_size(h: usize, w: usize, tile: usize) -> (usize, usize) {
    let aspect = w as f64 / h as f64;
    if w >= h {
        let w2 = w.div_ceil(tile) * tile;
        (((w2 as f64 / aspect) as usize).div_ceil(tile) * tile, w2)
    } else {
        let h2 = h.div_ceil(tile) * tile;
        (h2, ((h2 as f64 * aspect) as usize).div_ceil(tile) * tile)
    }
}

/// The sizes a `width × height` image goes through and the grid it is cut on:
/// (after step 1, after step 2, rows, cols). Cheap: the frame count is known before a pixel
/// is decoded.
pub fn plan(width: usize, height: usize, config: &ImageProcessorConfig) -> Result<FramePlan, ImageError> {
    let split = config.splitting.ok_or_else(|| ImageError::Config("this image processor makes no frames".into()))?;
    let Size::LongestEdge(longest) = config.size else {
        return Err(ImageError::Config("Idefics3's frames need size {\"longest_edge\"}".into()));
    };
    let resized = longest_edge_size(height, width, longest);
    if !split.enabled {
        return Ok(FramePlan { resized, whole: (split.tile, split.tile), rows: 0, cols: 0, tile: split.tile });
    }
    let whole = whole_frames_size(resized.0, resized.1, split.tile);
    let (rows, cols) = if whole.0 > split.tile || whole.1 > split.tile { (whole.0 / split.tile, whole.1 / split.tile) } else { (0, 0) };
    Ok(FramePlan { resized, whole, rows, cols, tile: split.tile })
}

/// What [`plan`] decides for one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramePlan {
    /// `(height, width)` after step 1.
    pub resized: (usize, usize),
    /// `(height, width)` after step 2 (the frame itself when not splitting).
    pub whole: (usize, usize),
    pub rows: usize,
    pub cols: usize,
    tile: usize,
}

impl FramePlan {
    /// Frames the tower runs: the tiles and the whole image, or the one frame.
    pub fn frames(&self) -> usize {
        if self.rows == 0 {
            1
        } else {
            self.rows * self.cols + 1
        }
    }
}

/// Decodes one page and cuts it into its frames; `max_frames` refuses a page whose frames
/// would not fit the model before any pixel is resampled.
pub fn preprocess_frames(
    bytes: &[u8],
    config: &ImageProcessorConfig,
    limits: &ImageLimits,
    tables: &Arc<ChannelTables>,
    max_frames: usize,
) -> Result<Frames, ImageError> {
    config.check()?;
    let (img, source) = decode(bytes, limits)?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    let plan = plan(w, h, config)?;
    if plan.frames() > max_frames {
        return Err(ImageError::TooManyFrames { frames: plan.frames(), rows: plan.rows, cols: plan.cols, max: max_frames });
    }
    // ColModernVBert's processor converts every page with Pillow's `convert("RGB")` first: an
    // alpha channel is dropped, not composited.
    let rgb = without_alpha(img);
    let resize_to = |src: &[u8], (sw, sh): (usize, usize), (dw, dh): (usize, usize)| -> Result<Vec<u8>, ImageError> {
        if (sw, sh) == (dw, dh) {
            return Ok(src.to_vec());
        }
        Ok(match (config.backend, TorchFilter::from_pil(config.resample)) {
            (CropBackend::Torchvision, Some(filter)) => resize_torch(src, (sw, sh), (dw, dh), filter),
            _ => {
                let filter = Filter::from_pil(config.resample).ok_or_else(|| ImageError::Config("resample".into()))?;
                resize(src, (sw, sh), (dw, dh), filter, 0..dw, 0..dh)
            }
        })
    };
    let (rh, rw) = plan.resized;
    let step1 = resize_to(&rgb, (w, h), (rw, rh))?;
    drop(rgb);
    let tile = plan.tile;
    let frame = |region: Vec<u8>| PixelValues {
        data: channels_first(&region, tile * tile),
        height: tile,
        width: tile,
        source,
        tables: Arc::clone(tables),
    };
    if plan.rows == 0 {
        // One frame: the resized image is it (splitting), or is resized to it.
        return Ok(Frames { frames: vec![frame(resize_to(&step1, (rw, rh), (tile, tile))?)], rows: 0, cols: 0 });
    }
    let (wh, ww) = plan.whole;
    let whole = resize_to(&step1, (rw, rh), (ww, wh))?;
    drop(step1);
    let mut frames = Vec::with_capacity(plan.frames());
    for r in 0..plan.rows {
        for c in 0..plan.cols {
            frames.push(frame(copy_region(&whole, ww, c * tile..(c + 1) * tile, r * tile..(r + 1) * tile)));
        }
    }
    frames.push(frame(resize_to(&whole, (ww, wh), (tile, tile))?));
    Ok(Frames { frames, rows: plan.rows, cols: plan.cols })
}

/// Packed RGB (`pixels × 3`) as three planes.
fn channels_first(rgb: &[u8], pixels: usize) -> Vec<u8> {
    let mut out = vec![0u8; 3 * pixels];
    for (i, px) in rgb.chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * pixels + i] = px[c];
        }
    }
    out
}

/// The text the processor puts in place of a page's `<image>` (`replace_image_token`): each
/// tile `<fake_token_around_image><row_r_col_c>` and its placeholders, a newline after each
/// row, then a newline and the whole image `<fake_token_around_image><global-img>`,
/// placeholders, `<fake_token_around_image>`; one frame alone is only the latter.
pub fn frames_text(rows: usize, cols: usize, placeholder: &str, per_frame: usize) -> String {
    let run = placeholder.repeat(per_frame);
    let mut text = String::new();
    if rows > 0 {
        for r in 1..=rows {
            for c in 1..=cols {
                text.push_str(&format!("{FRAME_BOUNDARY}<row_{r}_col_{c}>{run}"));
            }
            text.push('\n');
        }
        text.push('\n');
    }
    text.push_str(&format!("{FRAME_BOUNDARY}{GLOBAL_IMAGE}{run}{FRAME_BOUNDARY}"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idefics3(longest: usize, tile: usize, split: bool) -> ImageProcessorConfig {
        serde_json::from_value(serde_json::json!({
            "image_processor_type": "Idefics3ImageProcessor",
            "size": {"longest_edge": longest},
            "max_image_size": {"longest_edge": tile},
            "do_image_splitting": split,
        }))
        .unwrap()
    }

    #[test]
    fn plans_follow_the_processor() {
        let config = idefics3(2048, 512, true);
        config.check().unwrap();
        // A portrait A4 scan: 2048 high, 1448 wide → 2048 × 1536 → 4 × 3 tiles and the whole page.
        let p = plan(1240, 1754, &config).unwrap();
        assert_eq!((p.resized, p.whole, p.rows, p.cols, p.frames()), ((2048, 1448), (2048, 1536), 4, 3, 13));
        // Upscaled too: a small image's longest side goes to 2048.
        let p = plan(97, 61, &config).unwrap();
        assert_eq!((p.resized, p.rows, p.cols), ((1288, 2048), 3, 4));
        let off = plan(97, 61, &idefics3(2048, 512, false)).unwrap();
        assert_eq!((off.rows, off.cols, off.frames()), (0, 0, 1));
        // The class defaults: 4 × 364 and frames of 364.
        let defaults: ImageProcessorConfig =
            serde_json::from_value(serde_json::json!({"image_processor_type": "Idefics3ImageProcessor"})).unwrap();
        assert_eq!((defaults.size, defaults.output_size(), defaults.resample), (Size::LongestEdge(1456), (364, 364), 1));
    }

    #[test]
    fn frames_text_is_the_processors() {
        assert_eq!(frames_text(0, 0, "<image>", 2), "<fake_token_around_image><global-img><image><image><fake_token_around_image>");
        assert_eq!(
            frames_text(1, 2, "<i>", 1),
            "<fake_token_around_image><row_1_col_1><i><fake_token_around_image><row_1_col_2><i>\n\n\
             <fake_token_around_image><global-img><i><fake_token_around_image>"
        );
    }
}
