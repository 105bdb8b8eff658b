//! SigLIP (`SiglipModel`): CLIP's two towers (`clip.rs` holds the shared encoder) with
//! SigLIP's differences.
//!
//! Text: no causal mask, the final LayerNorm, then `head` (a linear layer with bias), read at
//! the last position. SigLIP was trained on texts padded with `pad_token_id` to
//! `max_position_embeddings` and attends to the pads (no attention mask), so the engine pads
//! every text to that length ([`Architecture::pads_text`]) and the last position is a pad for
//! short texts, exactly as transformers computes `get_text_features` from `input_ids`.
//!
//! Vision: the patch convolution has a bias, there is no class token and no pre-LayerNorm;
//! `post_layernorm` runs on every patch, then the attention-pooling head: one learned probe
//! query attends over the patches (a packed `nn.MultiheadAttention`), then `x + mlp(ln(x))`.

use super::clip::{dense_seqlens, patch_rows, PatchGeometry, PreLnEncoder, TextTower, TowerConfig, TowerDefaults};
use super::weights::{layer_norm, linear};
use super::{parse_config, Architecture, Backbone, ModelError, SequencePooling, VisionTower};
use crate::kernels::{Activation, AttentionMask, LayerNorm, Linear};
use candle_core::{DType, Result, Tensor, D};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Siglip;

pub static SIGLIP: Siglip = Siglip;

const SIGLIP_TEXT: TowerDefaults =
    TowerDefaults { hidden_size: 768, intermediate_size: 3072, layers: 12, heads: 12, act: "gelu_pytorch_tanh", eps: 1e-6 };
const SIGLIP_VISION: TowerDefaults = SIGLIP_TEXT;

#[derive(Debug, Deserialize)]
struct SiglipConfig {
    #[serde(default)]
    text_config: TowerConfig,
    #[serde(default)]
    vision_config: TowerConfig,
}

impl Architecture for Siglip {
    fn name(&self) -> &'static str {
        "SigLIP"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["Siglip"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["siglip"]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn pads_text(&self, config: &Value) -> Option<(usize, u32)> {
        let config: SiglipConfig = parse_config(config).ok()?;
        Some((config.text_config.max_position_embeddings.unwrap_or(64), config.text_config.pad_token_id.unwrap_or(1)))
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: SiglipConfig = parse_config(config)?;
        let text = config.text_config.resolve(&SIGLIP_TEXT)?;
        let vocab_size = config.text_config.vocab_size.unwrap_or(32_000);
        let max_positions = config.text_config.max_position_embeddings.unwrap_or(64);
        let tv = vb.pp("text_model");
        let h = text.hidden_size;
        Ok(Box::new(TextTower {
            token_embedding: tv.get((vocab_size, h), "embeddings.token_embedding.weight")?,
            position_embedding: tv.get((max_positions, h), "embeddings.position_embedding.weight")?,
            encoder: PreLnEncoder::load(&tv.pp("encoder"), &text)?,
            final_norm: layer_norm(&tv.pp("final_layer_norm"), h, text.layer_norm_eps)?,
            projection: linear(&tv.pp("head"), config.text_config.projection_size.unwrap_or(h), h)?,
            mask: AttentionMask::Bidirectional,
            vocab_size,
            max_positions,
        }))
    }

    fn vision_tower(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn VisionTower>>, ModelError> {
        let config: SiglipConfig = parse_config(config)?;
        if config.vision_config.vision_use_head == Some(false) {
            return Err(ModelError::NoHead(
                "SigLIP vision towers without their attention-pooling head (vision_use_head: false) are not supported".into(),
            ));
        }
        let encoder = SiglipVisionEncoder::load(&config.vision_config, vb.pp("vision_model"))?;
        let vision = config.vision_config.resolve(&SIGLIP_VISION)?;
        let h = vision.hidden_size;
        let head = vb.pp("vision_model").pp("head");
        let attention = head.pp("attention");
        Ok(Some(Box::new(SiglipVision {
            encoder,
            probe: head.get((1, 1, h), "probe")?.reshape(h)?,
            in_proj: Linear::new(attention.get((3 * h, h), "in_proj_weight")?, Some(attention.get(3 * h, "in_proj_bias")?))?,
            out_proj: linear(&attention.pp("out_proj"), h, h)?,
            head_norm: layer_norm(&head.pp("layernorm"), h, vision.layer_norm_eps)?,
            fc1: linear(&head.pp("mlp.fc1"), vision.intermediate_size, h)?,
            fc2: linear(&head.pp("mlp.fc2"), h, vision.intermediate_size)?,
            activation: vision.activation,
            heads: vision.heads,
        })))
    }
}

/// SigLIP's vision transformer without a head: patches (a convolution with a bias, as one
/// product), the learned position table, the encoder, `post_layernorm` on every patch. SigLIP
/// pools it with its attention head; PaliGemma (ColPali) reads every patch.
pub(super) struct SiglipVisionEncoder {
    patch_embedding: Linear,
    position_embedding: Tensor,
    encoder: PreLnEncoder,
    post_norm: LayerNorm,
    pub(super) geometry: PatchGeometry,
    pub(super) hidden_size: usize,
}

impl SiglipVisionEncoder {
    /// The encoder of `vision_config`, its weights under `vb` (`vision_model`'s names).
    pub(super) fn load(config: &TowerConfig, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let vision = config.resolve(&SIGLIP_VISION)?;
        let geometry = PatchGeometry::of(config, 224, 16)?;
        let h = vision.hidden_size;
        let embeddings = vb.pp("embeddings");
        let patch_weight = embeddings.get((h, geometry.channels, geometry.patch, geometry.patch), "patch_embedding.weight")?;
        Ok(Self {
            patch_embedding: Linear::new(
                patch_weight.reshape((h, geometry.patch_len()))?,
                Some(embeddings.get(h, "patch_embedding.bias")?),
            )?,
            position_embedding: embeddings.get((geometry.patches(), h), "position_embedding.weight")?,
            encoder: PreLnEncoder::load(&vb.pp("encoder"), &vision)?,
            post_norm: layer_norm(&vb.pp("post_layernorm"), h, vision.layer_norm_eps)?,
            geometry,
            hidden_size: h,
        })
    }

    /// Every patch's final state, `[images·patches, hidden]`, of `images` images whose pixel
    /// values (`[3, size, size]` each) lie end to end in `pixels`.
    pub(super) fn forward(&self, pixels: &[f32], images: usize) -> Result<Tensor> {
        let (h, patches) = (self.hidden_size, self.geometry.patches());
        let patches_in = patch_rows(&self.geometry, pixels, images, &self.position_embedding)?;
        let embedded = self.patch_embedding.forward(&patches_in)?.reshape((images, patches, h))?;
        let tokens = embedded.broadcast_add(&self.position_embedding.unsqueeze(0)?)?.reshape((images * patches, h))?.contiguous()?;
        let hidden = self.encoder.forward(tokens, &dense_seqlens(images, patches), AttentionMask::Bidirectional)?;
        self.post_norm.forward(hidden)
    }
}

struct SiglipVision {
    encoder: SiglipVisionEncoder,
    probe: Tensor,
    /// The pooling attention's packed Q, K, V projections.
    in_proj: Linear,
    out_proj: Linear,
    head_norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    activation: Activation,
    heads: usize,
}

impl SiglipVision {
    /// The attention-pooling head over `[images·patches, h]` states: one probe query per
    /// image. Small next to the encoder (one query), so it runs on candle's ops.
    fn pool(&self, states: &Tensor, images: usize) -> Result<Tensor> {
        let (h, patches, heads) = (self.encoder.hidden_size, self.encoder.geometry.patches(), self.heads);
        let d = h / heads;
        let qkv = self.in_proj.forward(&Tensor::cat(&[&self.probe.unsqueeze(0)?, states], 0)?)?;
        let query = qkv.narrow(0, 0, 1)?.narrow(1, 0, h)?.reshape((1, heads, 1, d))?;
        let rows = qkv.narrow(0, 1, images * patches)?;
        let per_head = |offset: usize| rows.narrow(1, offset, h)?.reshape((images, patches, heads, d))?.transpose(1, 2)?.contiguous();
        let (keys, values) = (per_head(h)?, per_head(2 * h)?);
        let scores =
            (query.broadcast_as((images, heads, 1, d))?.contiguous()?.matmul(&keys.transpose(2, 3)?.contiguous()?)? / (d as f64).sqrt())?;
        let weights = candle_nn::ops::softmax(&scores.to_dtype(DType::F32)?, D::Minus1)?.to_dtype(values.dtype())?;
        let pooled = weights.matmul(&values)?.reshape((images, h))?;
        let pooled = self.out_proj.forward(&pooled)?;
        let normed = self.head_norm.forward(pooled.copy()?)?;
        let inner = self.activation.forward_biased(self.fc1.forward_unbiased(&normed)?, self.fc1.bias())?;
        self.fc2.forward_add(&inner, &pooled)
    }
}

impl VisionTower for SiglipVision {
    fn forward(&self, pixels: &[f32], images: usize) -> Result<Tensor> {
        self.pool(&self.encoder.forward(pixels, images)?, images)?.to_dtype(DType::F32)
    }

    fn image_size(&self) -> usize {
        self.encoder.geometry.image_size
    }

    fn tokens_per_image(&self) -> usize {
        self.encoder.geometry.patches()
    }

    fn embedding_size(&self) -> usize {
        self.encoder.hidden_size
    }
}
