//! `preprocessor_config.json` (transformers' CLIP / SigLIP image processors, and Idefics3's,
//! which cuts a page into frames): the sizes, filter and normalization an image goes through,
//! with the class defaults filled in, and the checks that refuse what [`super::preprocess`] and
//! [`super::frames`] cannot reproduce exactly.

use super::resample::Filter;
use super::ImageError;
use serde::Deserialize;
use std::path::Path;

/// `{"height": h, "width": w}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeightWidth {
    pub height: usize,
    pub width: usize,
}

/// The resize target: `{"shortest_edge": n}` keeps the aspect ratio, `{"height", "width"}` is
/// exact, and Idefics3's `{"longest_edge": n}` brings the longest side to `n` (up or down),
/// keeping the aspect ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    ShortestEdge(usize),
    Exact(HeightWidth),
    LongestEdge(usize),
}

/// Idefics3's image splitting (`Idefics3ImageProcessor`, which ColModernVBert's processor
/// runs): the image, its longest side brought to `size.longest_edge`, is cut into `tile`-pixel
/// square frames, followed by the whole image at `tile × tile`; without splitting it is one
/// `tile × tile` frame ([`super::frames`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Splitting {
    /// `do_image_splitting`.
    pub enabled: bool,
    /// `max_image_size.longest_edge`: the frames' side, the vision tower's image size.
    pub tile: usize,
}

/// `preprocessor_config.json`, with transformers' class defaults filled in (SigLIP's when
/// `image_processor_type` names SigLIP, CLIP's otherwise).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawConfig")]
pub struct ImageProcessorConfig {
    pub do_convert_rgb: bool,
    pub do_resize: bool,
    pub size: Size,
    /// PIL's numbering: 0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming.
    pub resample: u32,
    pub do_center_crop: bool,
    pub crop_size: Option<HeightWidth>,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: Vec<f64>,
    pub image_std: Vec<f64>,
    /// `image_processor_type`, as saved.
    pub processor_type: Option<String>,
    /// Idefics3's frames; `None` for the processors that make one crop an image.
    pub splitting: Option<Splitting>,
    /// Whose resize and rescale the crop reproduces: Pillow's unless the loader asks for
    /// torchvision's ([`Self::torchvision_unless_pil`]).
    pub backend: CropBackend,
}

/// The image library a transformers processor class runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CropBackend {
    /// The `*ImageProcessorPil` classes: Pillow's resize, then `v · rescale_factor` in f64 and
    /// the normalization in f32 (numpy's order).
    Pillow,
    /// transformers 5's default classes: torchvision's antialiased bicubic resize on the uint8
    /// image, then the fused rescale and normalization `(v − mean/rescale_factor) /
    /// (std/rescale_factor)` in f32.
    Torchvision,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Int(usize),
    Dict { shortest_edge: Option<usize>, longest_edge: Option<usize>, height: Option<usize>, width: Option<usize> },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(f64),
    Many(Vec<f64>),
}

#[derive(Deserialize)]
struct RawConfig {
    image_processor_type: Option<String>,
    do_convert_rgb: Option<bool>,
    do_resize: Option<bool>,
    size: Option<RawSize>,
    resample: Option<u32>,
    do_center_crop: Option<bool>,
    crop_size: Option<RawSize>,
    do_rescale: Option<bool>,
    rescale_factor: Option<f64>,
    do_normalize: Option<bool>,
    image_mean: Option<OneOrMany>,
    image_std: Option<OneOrMany>,
    do_image_splitting: Option<bool>,
    max_image_size: Option<RawSize>,
}

const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// Output sizes above this are refused: no vision tower uses them and they would size allocations.
const MAX_SIDE: usize = 16384;
/// Idefics3's `MAX_IMAGE_SIZE`: no side of its resized image exceeds it.
pub const MAX_RESIZED_SIDE: usize = 4096;

impl TryFrom<RawConfig> for ImageProcessorConfig {
    type Error = ImageError;
    fn try_from(r: RawConfig) -> Result<Self, ImageError> {
        let kind = r.image_processor_type.as_deref().map(str::to_ascii_lowercase).unwrap_or_default();
        let siglip = kind.starts_with("siglip");
        // Idefics3's class defaults: frames of 364, the longest side to 4 × 364, Lanczos, and
        // IMAGENET_STANDARD's mean and std (0.5), no crop.
        let idefics3 = kind.starts_with("idefics3");
        let splitting = match (idefics3, r.max_image_size) {
            (false, None) => None,
            (_, None) => Some(Splitting { enabled: r.do_image_splitting.unwrap_or(true), tile: 364 }),
            (_, Some(RawSize::Dict { longest_edge: Some(tile), shortest_edge: None, height: None, width: None })) => {
                Some(Splitting { enabled: r.do_image_splitting.unwrap_or(true), tile })
            }
            (_, Some(_)) => return Err(ImageError::ConfigField("max_image_size must be {\"longest_edge\"}".into())),
        };
        // Both PIL classes use default_to_square = False, so a bare int `size` is a shortest edge;
        // `crop_size` is always square when given as an int.
        let size = match r.size {
            None if idefics3 => Size::LongestEdge(4 * 364),
            Some(RawSize::Dict { longest_edge: Some(n), shortest_edge: None, height: None, width: None }) if splitting.is_some() => {
                Size::LongestEdge(n)
            }
            None if siglip => Size::Exact(HeightWidth { height: 224, width: 224 }),
            None => Size::ShortestEdge(224),
            Some(RawSize::Int(n)) => Size::ShortestEdge(n),
            Some(RawSize::Dict { shortest_edge: Some(s), longest_edge: None, height: None, width: None }) => Size::ShortestEdge(s),
            Some(RawSize::Dict { shortest_edge: None, longest_edge: None, height: Some(height), width: Some(width) }) => {
                Size::Exact(HeightWidth { height, width })
            }
            Some(_) => return Err(ImageError::ConfigField("size must be {\"shortest_edge\"} or {\"height\", \"width\"}".into())),
        };
        let crop_size = match r.crop_size {
            None if siglip || splitting.is_some() => None,
            None => Some(HeightWidth { height: 224, width: 224 }),
            Some(RawSize::Int(n)) => Some(HeightWidth { height: n, width: n }),
            Some(RawSize::Dict { height: Some(height), width: Some(width), shortest_edge: None, longest_edge: None }) => {
                Some(HeightWidth { height, width })
            }
            Some(_) => return Err(ImageError::ConfigField("crop_size must be {\"height\", \"width\"}".into())),
        };
        let (mean, std) = if siglip || idefics3 { ([0.5; 3], [0.5; 3]) } else { (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD) };
        // transformers broadcasts a scalar mean/std to every channel.
        let channels = |v: Option<OneOrMany>, default: [f64; 3]| match v {
            None => default.to_vec(),
            Some(OneOrMany::One(x)) => vec![x; 3],
            Some(OneOrMany::Many(v)) => v,
        };
        Ok(ImageProcessorConfig {
            do_convert_rgb: r.do_convert_rgb.unwrap_or(true),
            do_resize: r.do_resize.unwrap_or(true),
            size,
            resample: r.resample.unwrap_or(if idefics3 { 1 } else { 3 }),
            do_center_crop: r.do_center_crop.unwrap_or(!siglip && splitting.is_none()),
            crop_size,
            do_rescale: r.do_rescale.unwrap_or(true),
            rescale_factor: r.rescale_factor.unwrap_or(1.0 / 255.0),
            do_normalize: r.do_normalize.unwrap_or(true),
            image_mean: channels(r.image_mean, mean),
            image_std: channels(r.image_std, std),
            processor_type: r.image_processor_type,
            splitting,
            backend: CropBackend::Pillow,
        })
    }
}

impl ImageProcessorConfig {
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ImageError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ImageError::Config(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| ImageError::Config(format!("{}: {e}", path.display())))
    }

    /// The `image_processor` object of a `processor_config.json`, where transformers 5's
    /// `ProcessorMixin.save_pretrained` keeps it (it writes no `preprocessor_config.json`).
    pub fn from_processor_file(path: impl AsRef<Path>) -> Result<Self, ImageError> {
        let path = path.as_ref();
        let bad = |m: String| ImageError::Config(format!("{}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut processor: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let nested =
            processor.get_mut("image_processor").map(serde_json::Value::take).ok_or_else(|| bad("has no `image_processor`".into()))?;
        serde_json::from_value(nested).map_err(|e| bad(format!("image_processor: {e}")))
    }

    /// The backend transformers 5's `AutoImageProcessor` gives this config: torchvision's for a
    /// class named without the `Pil` suffix (its default when torchvision is installed), where
    /// the filter is bicubic or Lanczos, those whose torchvision resize is reproduced here;
    /// Pillow's otherwise. CLIP and SigLIP keep Pillow's (their fixtures' reference); page
    /// retrievers (ColPali, ColModernVBert) take this, as a user loading the folder with
    /// transformers does.
    pub fn torchvision_unless_pil(mut self) -> Self {
        let pil = self.processor_type.as_deref().is_some_and(|t| t.ends_with("Pil"));
        if !pil && super::resample::TorchFilter::from_pil(self.resample).is_some() {
            self.backend = CropBackend::Torchvision;
        }
        self
    }

    /// Refuses what `preprocess` cannot reproduce exactly, and configs whose output size depends on the image
    /// (the towers take one fixed size).
    pub fn check(&self) -> Result<(), ImageError> {
        let bad = |m: String| Err(ImageError::Config(m));
        if Filter::from_pil(self.resample).is_none() {
            return bad(format!("resample filter {} is not implemented (0-5 are)", self.resample));
        }
        let side_ok = |n: usize| (1..=MAX_SIDE).contains(&n);
        match self.size {
            Size::ShortestEdge(s) if !side_ok(s) => return bad(format!("size.shortest_edge {s} is out of range")),
            Size::Exact(hw) if !side_ok(hw.height) || !side_ok(hw.width) => return bad(format!("size {hw:?} is out of range")),
            // Idefics3 caps the resized image at 4096 a side.
            Size::LongestEdge(n) if !(1..=MAX_RESIZED_SIDE).contains(&n) => return bad(format!("size.longest_edge {n} is out of range")),
            _ => {}
        }
        if let Some(split) = self.splitting {
            if !side_ok(split.tile) {
                return bad(format!("max_image_size.longest_edge {} is out of range", split.tile));
            }
            if !matches!(self.size, Size::LongestEdge(_)) || self.do_center_crop || !self.do_resize {
                return bad("Idefics3's frames need do_resize, size {\"longest_edge\"} and no center crop".into());
            }
        }
        match (self.do_center_crop, self.crop_size, self.do_resize, self.size) {
            _ if self.splitting.is_some() => {}
            (true, Some(c), _, _) if side_ok(c.height) && side_ok(c.width) => {}
            (true, c, _, _) => return bad(format!("do_center_crop needs a crop_size in range, got {c:?}")),
            (false, _, true, Size::Exact(_)) => {}
            _ => return bad("the output size would depend on the image (no center crop and no exact resize)".into()),
        }
        if self.image_mean.len() != 3 || self.image_std.len() != 3 {
            return bad(format!("image_mean and image_std need 3 values, got {} and {}", self.image_mean.len(), self.image_std.len()));
        }
        if self.image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) || self.image_mean.iter().any(|m| !m.is_finite()) {
            return bad("image_mean must be finite and image_std finite and non-zero".into());
        }
        if !self.rescale_factor.is_finite() {
            return bad("rescale_factor must be finite".into());
        }
        Ok(())
    }

    /// `(height, width)` of every output (meaningful once `check` passed).
    pub fn output_size(&self) -> (usize, usize) {
        match (self.do_center_crop, self.crop_size, self.size) {
            _ if self.splitting.is_some() => self.splitting.map_or((0, 0), |s| (s.tile, s.tile)),
            (true, Some(c), _) => (c.height, c.width),
            (_, _, Size::Exact(hw)) => (hw.height, hw.width),
            (_, _, Size::ShortestEdge(s) | Size::LongestEdge(s)) => (s, s),
        }
    }
}
