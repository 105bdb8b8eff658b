//! ColModernVBert (`ColModernVBertForRetrieval`, transformers 5.24's
//! `modeling_colmodernvbert.py` over `ModernVBertModel`): a page retriever on a bidirectional
//! encoder, one vector per token (`token_embed`) scored by MaxSim.
//!
//! - **Images:** each page is cut into Idefics3's frames (the processor's image splitting,
//!   [`crate`]'s `input::image::frames`); every frame runs through SigLIP's vision transformer
//!   without its head ([`SiglipVisionEncoder`]), then the connector: a pixel shuffle that folds
//!   each `f × f` block of patches into one token (`f` = `pixel_shuffle_factor`, the block's
//!   patches row by row along the features), and `modality_projection` (no bias) into the text
//!   width. The tokens replace the frame's `<image>` placeholders ([`CropTokenTower`]);
//! - **encoder:** ModernBERT ([`super::modernbert`]) over the whole sequence, the soft tokens in
//!   place of the placeholders' word embeddings before the embedding norm (transformers'
//!   `inputs_embeds`);
//! - **head:** `embedding_proj_layer` (with its bias) on every token; the L2 normalization that
//!   follows is the token_embed head's.
//! - **Prompts** ([`RetrievalPrompts`]), as `ColModernVBertProcessor` builds them, the
//!   tokenizer's `[CLS] … [SEP]` around both: a query is `{query_prefix}{text}` +
//!   `<end_of_utterance>` ×10; a page is `visual_prompt_prefix` (by default
//!   `<|begin_of_text|>User:<image>Describe the image.<end_of_utterance>\nAssistant:`) with its
//!   `<image>` replaced by the frames' text.
//!
//! Three layouts load ([`vlm_config`] and the weight prefixes below):
//! - transformers 5.24's (`vlm_config`; weights under `vlm.` and `embedding_proj_layer`);
//! - colpali-engine's `ColModernVBert` (0.3.18, as its `save_pretrained` writes it on
//!   transformers 5: a `modernvbert` config at the top naming `ColModernVBert`; the text model
//!   and projection under `base_model.model.` — its checkpoint conversion mapping, reversed —
//!   the vision tower and connector under `model.`; `custom_text_proj`);
//! - the hub's merged checkpoint vLLM's `ColModernVBertForRetrieval` reads
//!   (ModernVBERT/colmodernvbert-merged: `vlm_config` with the vision width as `embed_dim`,
//!   weights under `model.`, the word table split into a `DecoupledEmbedding`'s base and
//!   `additional_embedding` rows, the connector at `modality_projection.proj`,
//!   `model.custom_text_proj`).
//!
//! The projection's width is its weight's (colpali-engine's class fixes 128 and writes no
//! `embedding_dim`). vLLM builds no frames (one square frame a page at the start of the sequence,
//! no prompt); the processor's `do_image_splitting: false` gives the frame, not the position.

use super::clip::TowerConfig;
use super::modernbert;
use super::retrieval::{processor_field, root, text_width, Projected, QUERY_AUGMENTATION_TOKENS};
use super::siglip::SiglipVisionEncoder;
use super::weights::linear_with_bias;
use super::{parse_config, Architecture, Backbone, CropTokenTower, ModelError, RetrievalPrompts, SequencePooling};
use crate::kernels::Linear;
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct ColModernVBert;

pub static COLMODERNVBERT: ColModernVBert = ColModernVBert;

/// The processor's image token, in `visual_prompt_prefix` where the frames go.
const IMAGE_TOKEN: &str = "<image>";
/// The processor's query augmentation token.
const END_OF_UTTERANCE: &str = "<end_of_utterance>";

/// The `ModernVBertConfig` of any layout, as transformers would read it: transformers' and the
/// hub's `vlm_config`, or colpali-engine's config itself. The hub's names the vision width
/// `embed_dim` and keeps the sequence length beside the text config (vLLM's
/// `ColModernVBertConfig` reads them so); the rest takes ModernBERT's and SigLIP's defaults, as
/// there.
fn vlm_config(raw: &Value) -> std::result::Result<VlmConfig, ModelError> {
    let mut vlm = raw.get("vlm_config").unwrap_or(raw).clone();
    if let Some(vision) = vlm.get_mut("vision_config").and_then(Value::as_object_mut) {
        if !vision.contains_key("hidden_size") {
            if let Some(width) = vision.get("embed_dim").cloned() {
                vision.insert("hidden_size".into(), width);
            }
        }
    }
    let positions = vlm.get("max_position_embeddings").cloned();
    if let (Some(text), Some(positions)) = (vlm.get_mut("text_config").and_then(Value::as_object_mut), positions) {
        text.entry("max_position_embeddings").or_insert(positions);
    }
    parse_config(&vlm)
}

/// Where each layout keeps its parts (transformers 5, transformers 4.5x, colpali-engine, the hub).
const TEXT: [&str; 4] = ["vlm.text_model", "vlm.model.text_model", "base_model.model.model.text_model", "model.text_model"];
const VISION: [&str; 3] = ["vlm.vision_model.vision_model", "vlm.vision_model", "model.vision_model"];
const CONNECTOR: [&str; 4] = [
    "vlm.connector.modality_projection",
    "vlm.model.connector.modality_projection",
    "model.connector.modality_projection",
    // The hub's keeps the layer one level deeper.
    "model.connector.modality_projection.proj",
];
const PROJECTION: [&str; 3] = ["embedding_proj_layer", "base_model.model.custom_text_proj", "model.custom_text_proj"];

/// `ModernVBertConfig`'s fields the model reads (its defaults where absent).
#[derive(Debug, Deserialize)]
struct VlmConfig {
    text_config: Value,
    #[serde(default)]
    vision_config: TowerConfig,
    #[serde(default = "default_image_token")]
    image_token_id: u32,
    #[serde(default = "default_shuffle")]
    pixel_shuffle_factor: usize,
}

fn default_image_token() -> u32 {
    50_407
}

fn default_shuffle() -> usize {
    4
}

impl Architecture for ColModernVBert {
    fn name(&self) -> &'static str {
        "ColModernVBert"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ColModernVBert"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["colmodernvbert"]
    }

    /// Not used for its own task (token_embed); `--convert embed`-style pooling of its vectors
    /// reads the first token, as vLLM's sequence pooling for it does.
    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::First
    }

    fn multi_vector(&self) -> bool {
        true
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config = vlm_config(raw)?;
        let text = root(&vb, &TEXT, "embeddings.tok_embeddings.weight")?;
        let encoder = modernbert::load(&config.text_config, text)?;
        Ok(Box::new(Projected::load_found(encoder, &vb, &PROJECTION, None)?))
    }

    fn crop_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn CropTokenTower>>, ModelError> {
        let config = vlm_config(raw)?;
        let vision = root(&vb, &VISION, "embeddings.patch_embedding.weight")?;
        let encoder = SiglipVisionEncoder::load(&config.vision_config, vision)?;
        let factor = config.pixel_shuffle_factor;
        let side = encoder.geometry.image_size / encoder.geometry.patch;
        if factor == 0 || !side.is_multiple_of(factor) {
            return Err(ModelError::Config(format!("pixel_shuffle_factor {factor} does not divide the {side}×{side} patch grid")));
        }
        let text_width = text_width(&config.text_config)?;
        let connector = root(&vb, &CONNECTOR, "weight")?;
        let projection = linear_with_bias(&connector, text_width, encoder.hidden_size * factor * factor, false)?;
        Ok(Some(Box::new(ModernVBertVision { encoder, projection, factor, placeholder: config.image_token_id })))
    }

    fn retrieval_prompts(
        &self,
        config: &Value,
        processor: &Value,
        _special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| processor_field(processor, name, default);
        let visual = field("visual_prompt_prefix", "<|begin_of_text|>User:<image>Describe the image.<end_of_utterance>\nAssistant:")?;
        let (image_prefix, image_suffix) = visual.split_once(IMAGE_TOKEN).ok_or_else(|| {
            ModelError::Config(format!("processor_config.json: visual_prompt_prefix has no `{IMAGE_TOKEN}` for the image"))
        })?;
        // The processor writes `image_seq_len` placeholders a frame; the tower makes its own
        // count of tokens, and transformers refuses a mismatch.
        let config = vlm_config(config)?;
        let vision = &config.vision_config;
        let side = vision.image_size.unwrap_or(224) / vision.patch_size.unwrap_or(16).max(1);
        let tokens = side * side / config.pixel_shuffle_factor.max(1).pow(2);
        if let Some(declared) = processor.get("image_seq_len").and_then(Value::as_u64) {
            if declared as usize != tokens {
                return Err(ModelError::Config(format!(
                    "processor_config.json: image_seq_len {declared}, but the vision tower makes {tokens} tokens a frame"
                )));
            }
        }
        Ok(Some(RetrievalPrompts {
            query_prefix: field("query_prefix", "")?,
            query_suffix: END_OF_UTTERANCE.repeat(QUERY_AUGMENTATION_TOKENS),
            image_prefix: image_prefix.to_string(),
            image_suffix: image_suffix.to_string(),
            mixed: false,
            strips_queries: false,
            instruction: None,
            special_tokens: true,
        }))
    }
}

/// SigLIP's patches, pixel-shuffled and projected into the text width.
struct ModernVBertVision {
    encoder: SiglipVisionEncoder,
    projection: Linear,
    factor: usize,
    placeholder: u32,
}

impl ModernVBertVision {
    /// `[frames · side², d]` patch states (row-major per frame) as `[frames · (side/f)², f²·d]`:
    /// token `(i, j)` holds patch `(i·f + m, j·f + k)` at features `(m·f + k)·d ..`, as
    /// `ModernVBertConnector.pixel_shuffle` lays them out. Patch `(i·f + m, j·f + k)` of a row
    /// sits at `(j·f + k)·d`: the `f` patches of a block's row are already one run of `f·d`.
    fn pixel_shuffle(&self, states: &Tensor, frames: usize) -> Result<Tensor> {
        let (f, d) = (self.factor, self.encoder.hidden_size);
        let side = self.encoder.geometry.image_size / self.encoder.geometry.patch;
        let blocks = side / f;
        states
            .reshape((frames, blocks, f, blocks, f * d))?
            .permute((0, 1, 3, 2, 4))?
            .contiguous()?
            .reshape((frames * blocks * blocks, f * f * d))
    }
}

impl CropTokenTower for ModernVBertVision {
    fn forward(&self, pixels: &[f32], images: usize) -> Result<Tensor> {
        let states = self.encoder.forward(pixels, images)?;
        self.projection.forward(&self.pixel_shuffle(&states, images)?)?.to_dtype(DType::F32)
    }

    fn image_size(&self) -> usize {
        self.encoder.geometry.image_size
    }

    fn tokens_per_image(&self) -> usize {
        self.encoder.geometry.patches() / (self.factor * self.factor)
    }

    fn patches_per_image(&self) -> usize {
        self.encoder.geometry.patches()
    }

    fn placeholder(&self) -> u32 {
        self.placeholder
    }
}
