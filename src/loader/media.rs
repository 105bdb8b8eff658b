//! A model's media side at load time: the towers its architecture builds (images, pages,
//! audio) and the processor files that say how inputs reach them (`preprocessor_config.json`,
//! `processor_config.json` and its `image_processor`, `video_processor` and
//! `feature_extractor` blocks), checked against the towers they feed; and the retrieval
//! prompts of page retrievers.

use super::hub::ModelSource;
use super::{read_json, AudioInput, LoadError, VisionInput};
use crate::input::image;
use crate::input::tokenizer;
use crate::kernels::{with_cpu_weight_format, WeightFormat};
use crate::models::{self, RetrievalPrompts};
use candle_nn::VarBuilder;
use std::path::PathBuf;

/// What [`towers`] finds.
pub(super) struct Media {
    pub vision: Option<VisionInput>,
    pub retrieval: Option<RetrievalPrompts>,
    pub audio: Option<AudioInput>,
}

/// The architecture's vision tower (pooled images, soft tokens or pages, whichever it has),
/// its retrieval prompts and its audio tower, each with its processor's settings.
pub(super) fn towers(
    source: &ModelSource,
    config: &serde_json::Value,
    architecture: &'static dyn models::Architecture,
    (vb, cpu_weight_format): (&VarBuilder, WeightFormat),
    tokenizer_config: &serde_json::Value,
    text_width: usize,
) -> Result<Media, LoadError> {
    let vision = match with_cpu_weight_format(cpu_weight_format, || architecture.vision_tower(config, vb.clone()))? {
        Some(tower) => {
            if tower.embedding_size() != text_width {
                return Err(LoadError::Invalid(format!(
                    "image embeddings have {} dimensions, text embeddings {}",
                    tower.embedding_size(),
                    text_width
                )));
            }
            Some(VisionInput::Pooled { processor: image_processor(source, tower.image_size())?, tower })
        }
        None => match with_cpu_weight_format(cpu_weight_format, || architecture.soft_token_tower(config, vb.clone()))? {
            Some(tower) => Some(VisionInput::SoftTokens {
                patches: patch_processor(source, tower.as_ref())?,
                video: video_processor(source, tower.as_ref())?,
                tower,
            }),
            None => match with_cpu_weight_format(cpu_weight_format, || architecture.crop_token_tower(config, vb.clone()))? {
                Some(tower) => {
                    Some(VisionInput::Page { processor: image_processor(source, tower.image_size())?.torchvision_unless_pil(), tower })
                }
                None => None,
            },
        },
    };
    let retrieval =
        architecture.retrieval_prompts(config, &processor_json(source)?, &|name| tokenizer::special_token(tokenizer_config, name))?;
    let audio = match with_cpu_weight_format(cpu_weight_format, || architecture.audio_tower(config, vb.clone()))? {
        Some(tower) => Some(AudioInput { features: audio_features(source, tower.as_ref())?, tower }),
        None => None,
    };
    Ok(Media { vision, retrieval, audio })
}

/// `preprocessor_config.json` (transformers 4), or else the `image_processor` inside
/// `processor_config.json` (transformers 5), checked against the tower it feeds.
fn image_processor(source: &ModelSource, image_size: usize) -> Result<image::ImageProcessorConfig, LoadError> {
    let (path, read): (_, fn(&std::path::Path) -> _) = match source.file("preprocessor_config.json")? {
        Some(path) => (path, |p| image::ImageProcessorConfig::from_file(p)),
        None => match source.file("processor_config.json")? {
            Some(path) => (path, |p| image::ImageProcessorConfig::from_processor_file(p)),
            None => return Err(LoadError::NotFound("the model has no preprocessor_config.json or processor_config.json".into())),
        },
    };
    let processor =
        read(&path).and_then(|p| p.check().map(|()| p)).map_err(|e| LoadError::File { path: path.clone(), message: e.to_string() })?;
    let (height, width) = processor.output_size();
    if (height, width) != (image_size, image_size) {
        return Err(LoadError::Invalid(format!(
            "preprocessor_config.json makes {height}x{width} images; the vision tower takes {image_size}x{image_size}"
        )));
    }
    Ok(processor)
}

/// The folder's `processor_config.json` (a retrieval processor's prompts live there), or
/// `Null` when it has none.
fn processor_json(source: &ModelSource) -> Result<serde_json::Value, LoadError> {
    match source.file("processor_config.json")? {
        Some(path) => read_json(&path),
        None => Ok(serde_json::Value::Null),
    }
}

/// The `image_processor` of `processor_config.json` (or `preprocessor_config.json`) of a
/// soft-token model: its patch size, pooling kernel and soft-token budget, checked against the
/// tower.
fn patch_processor(source: &ModelSource, tower: &dyn models::SoftTokenTower) -> Result<image::patches::PatchConfig, LoadError> {
    let (path, nested) = match source.file("processor_config.json")? {
        Some(path) => (path, true),
        None => match source.file("preprocessor_config.json")? {
            Some(path) => (path, false),
            None => return Err(LoadError::NotFound("the model has no processor_config.json or preprocessor_config.json".into())),
        },
    };
    let invalid = |message: String| LoadError::File { path: path.clone(), message };
    let text = std::fs::read_to_string(&path).map_err(|e| invalid(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let processor = if nested { json.get("image_processor").ok_or_else(|| invalid("has no `image_processor`".into()))? } else { &json };
    let (patch_size, kernel) = tower.patch_geometry();
    let field = |name: &str, default: usize| match processor.get(name) {
        None => Ok(default),
        Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| invalid(format!("image_processor.{name} is not a count: {v}"))),
    };
    let type_name = processor.get("image_processor_type").and_then(serde_json::Value::as_str);
    if type_name.is_some_and(|t| t.starts_with("Qwen2VLImageProcessor")) {
        let mut config = qwen2_vl_processor(processor, (patch_size, kernel)).map_err(|e| invalid(e.to_string()))?;
        // ColQwen3's processors convert each image with Pillow before their image processor
        // sees it (TomoroAI's and colpali-engine's `process_images`, ColQwen3.5's, OpenSearch's, NVIDIA's
        // `forward_documents`): transparency dropped rather than composited.
        let pillow_rgb = ["ColQwen3Processor", "ColQwen3_5Processor", "OpsColQwen3Processor", "Qwen3VLNemotronEmbedProcessor"];
        if json.get("processor_class").and_then(serde_json::Value::as_str).is_some_and(|c| pillow_rgb.contains(&c)) {
            config.alpha = image::patches::Alpha::Dropped;
        }
        return Ok(config);
    }
    let backend = image::patches::Backend::of_image_processor(type_name)
        .ok_or_else(|| invalid(format!("image_processor_type `{}` is not a Gemma 4 image processor", type_name.unwrap_or_default())))?;
    if field("resample", 3)? != 3 {
        return Err(invalid("image_processor.resample: only bicubic (3), Gemma 4's, is implemented".into()));
    }
    // Gemma4ImageProcessor's defaults: 280 soft tokens.
    let config = image::patches::PatchConfig {
        patch_size: field("patch_size", patch_size)?,
        pooling_kernel_size: field("pooling_kernel_size", kernel)?,
        max_soft_tokens: field("max_soft_tokens", 280)?,
        backend,
        sizing: image::patches::Sizing::SoftTokenBudget,
        normalize: None,
        alpha: image::patches::Alpha::OverWhite,
    };
    config.check().map_err(|e| invalid(e.to_string()))?;
    if (config.patch_size, config.pooling_kernel_size) != (patch_size, kernel) {
        return Err(LoadError::Invalid(format!(
            "the image processor makes {}px patches pooled {}×{}; the vision tower takes {patch_size}px pooled {kernel}×{kernel}",
            config.patch_size, config.pooling_kernel_size, config.pooling_kernel_size
        )));
    }
    Ok(config)
}

/// `Qwen2VLImageProcessor`'s settings (transformers 5's, the torchvision class; its `Pil`
/// twin resizes with Pillow and is refused): `smart_resize` into `size.shortest_edge ..=
/// size.longest_edge` pixels (older configs: `min_pixels` / `max_pixels`), bicubic, the
/// fused rescale and normalization, patches merged `merge_size`² into a soft token.
fn qwen2_vl_processor(
    processor: &serde_json::Value,
    (patch_size, merge): (usize, usize),
) -> Result<image::patches::PatchConfig, image::ImageError> {
    let bad = image::ImageError::ConfigField;
    let type_name = processor.get("image_processor_type").and_then(serde_json::Value::as_str).unwrap_or_default();
    if type_name.ends_with("Pil") {
        return Err(bad(format!("image_processor_type `{type_name}`: only the torchvision Qwen2VLImageProcessor is implemented")));
    }
    let count = |v: Option<&serde_json::Value>, name: &str, default: usize| match v {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| bad(format!("image_processor.{name} is not a count: {v}"))),
    };
    let flag = |name: &str| processor.get(name).and_then(serde_json::Value::as_bool).unwrap_or(true);
    let size = processor.get("size");
    let min_pixels =
        count(size.and_then(|s| s.get("shortest_edge")).or_else(|| processor.get("min_pixels")), "size.shortest_edge", 56 * 56)?;
    let max_pixels =
        count(size.and_then(|s| s.get("longest_edge")).or_else(|| processor.get("max_pixels")), "size.longest_edge", 28 * 28 * 1280)?;
    if count(processor.get("resample"), "resample", 3)? != 3 || !flag("do_resize") || !flag("do_rescale") || !flag("do_normalize") {
        return Err(bad("image_processor: only bicubic resizing, rescaling and normalizing (Qwen2-VL's defaults) are implemented".into()));
    }
    if processor.get("rescale_factor").and_then(serde_json::Value::as_f64).is_some_and(|f| (f - 1.0 / 255.0).abs() > 1e-12) {
        return Err(bad("image_processor.rescale_factor: only 1/255 is implemented".into()));
    }
    let channels = |name: &str, default: [f32; 3]| -> Result<[f32; 3], image::ImageError> {
        match processor.get(name) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => {
                serde_json::from_value::<[f32; 3]>(v.clone()).map_err(|_| bad(format!("image_processor.{name} is not three numbers: {v}")))
            }
        }
    };
    let normalize = image::patches::Normalize {
        // OpenAI CLIP's, Qwen2VLImageProcessor's defaults (as f32).
        mean: channels("image_mean", [0.481_454_7, 0.457_827_5, 0.408_210_7])?,
        std: channels("image_std", [0.268_629_5, 0.261_302_6, 0.275_777_1])?,
    };
    if normalize.std.iter().any(|&s| s == 0.0 || !s.is_finite()) || normalize.mean.iter().any(|m| !m.is_finite()) {
        return Err(bad("image_processor: image_std must be finite and non-zero".into()));
    }
    let (p, m) = (count(processor.get("patch_size"), "patch_size", patch_size)?, count(processor.get("merge_size"), "merge_size", merge)?);
    if (p, m) != (patch_size, merge) || count(processor.get("temporal_patch_size"), "temporal_patch_size", 2)? != 2 {
        return Err(bad(format!("the image processor makes {p}px patches merged {m}×{m}; the vision tower takes {patch_size}px merged {merge}×{merge} over 2 frames")));
    }
    let config = image::patches::PatchConfig {
        patch_size: p,
        pooling_kernel_size: m,
        max_soft_tokens: max_pixels / (p * p * m * m),
        backend: image::patches::Backend::Torchvision,
        sizing: image::patches::Sizing::SmartResize { min_pixels, max_pixels },
        normalize: Some(normalize),
        alpha: image::patches::Alpha::OverWhite,
    };
    config.check()?;
    Ok(config)
}

/// What of a processor file's JSON is the block wanted, if it holds it.
type PickBlock<'a> = &'a dyn Fn(&serde_json::Value) -> Option<serde_json::Value>;

/// The first of `candidates` (a file of the folder, and what of its JSON is the block wanted)
/// that the folder has and that holds the block, with its path.
fn processor_block(source: &ModelSource, candidates: [(&str, PickBlock); 2]) -> Result<Option<(PathBuf, serde_json::Value)>, LoadError> {
    for (name, pick) in candidates {
        if let Some(path) = source.file(name)? {
            let invalid = |message: String| LoadError::File { path: path.clone(), message };
            let text = std::fs::read_to_string(&path).map_err(|e| invalid(e.to_string()))?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
            if let Some(block) = pick(&json) {
                return Ok(Some((path, block)));
            }
        }
    }
    Ok(None)
}

/// The `video_processor` of `processor_config.json` (or `video_preprocessor_config.json`) of a
/// soft-token model whose tower reads video frames; a folder with neither gets the video
/// processor's defaults (`EmbeddingGemma2VideoProcessor`: 1 frame a second, at most 32, 70
/// soft tokens each).
fn video_processor(
    source: &ModelSource,
    tower: &dyn models::SoftTokenTower,
) -> Result<Option<crate::input::video::VideoConfig>, LoadError> {
    if tower.video_token().is_none() {
        return Ok(None);
    }
    let found = processor_block(
        source,
        [
            ("processor_config.json", &|json| json.get("video_processor").cloned()),
            ("video_preprocessor_config.json", &|json| Some(json.clone())),
        ],
    )?;
    let (path, block) = match found {
        Some((path, block)) => (Some(path), block),
        None => (None, serde_json::json!({})),
    };
    crate::input::video::VideoConfig::from_json(&block, tower.patch_geometry()).map(Some).map_err(|e| match path {
        Some(path) => LoadError::File { path, message: e.to_string() },
        None => LoadError::Invalid(e.to_string()),
    })
}

/// The `feature_extractor` of `processor_config.json` (or a `preprocessor_config.json` that is
/// one) of a model with an audio tower, checked against the tower's mel bins: its
/// `feature_size` is how many the tower gets, as transformers' feature extractor makes them. A folder without
/// one gets `Gemma4AudioFeatureExtractor`'s defaults, which every published one repeats.
fn audio_features(source: &ModelSource, tower: &dyn models::AudioTokenTower) -> Result<crate::input::audio::LogMelConfig, LoadError> {
    let found = processor_block(
        source,
        [
            ("processor_config.json", &|json| json.get("feature_extractor").cloned()),
            ("preprocessor_config.json", &|json| json.get("feature_size").map(|_| json.clone())),
        ],
    )?;
    let (path, block) = match found {
        Some((path, block)) => (Some(path), block),
        None => {
            tracing::warn!("the model's folder has no audio feature extractor config: Gemma4AudioFeatureExtractor's defaults are used");
            (None, serde_json::json!({}))
        }
    };
    let features = crate::input::audio::LogMelConfig::from_json(&block).map_err(|e| match &path {
        Some(path) => LoadError::File { path: path.clone(), message: e.to_string() },
        None => LoadError::Invalid(e.to_string()),
    })?;
    if !tower.takes_mel_bins(features.mel_bins) {
        return Err(LoadError::Invalid(format!(
            "the audio feature extractor makes {} mel bins (feature_size); the audio tower's input projection does not take them (Gemma 4 sizes it for subsampling_conv_channels[0] bins)",
            features.mel_bins
        )));
    }
    Ok(features)
}
