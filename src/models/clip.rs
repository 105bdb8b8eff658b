//! CLIP (`CLIPModel`: OpenAI CLIP and OpenCLIP-converted folders): a text tower and a vision
//! tower that embed into one space, and the pre-LayerNorm transformer both towers (and
//! SigLIP's, in `siglip.rs`) are made of.
//!
//! Text: token + learned position embeddings, a causal pre-LN encoder, the final LayerNorm,
//! then `text_projection`, read at the end-of-text token. Our flat batch has no padding and
//! the tokenizer ends every text with `<|endoftext|>`, so that token is each sequence's last:
//! LAST pooling. The projection is linear and per token, so the backbone applies it to every
//! row and its "hidden states" are already in the shared space (the extra work is one
//! `hidden × projection` product per token, under 1/12 of one layer's).
//!
//! Vision: the image cut into `patch × patch` squares (the stride-`patch` convolution is a
//! product over those squares), a class token in front, learned positions, `pre_layrnorm`,
//! the encoder, `post_layernorm` on the class token, then `visual_projection`. Images all
//! have the processor's size, so a batch of images is dense: every sequence has the same
//! length.

use super::batch::Batch;
use super::weights::{fused_qkv, layer_norm, linear};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError, SequencePooling, VisionTower};
use crate::kernels::{Activation, Attention, AttentionMask, LayerNorm, Linear};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Clip;

pub static CLIP: Clip = Clip;

impl Architecture for Clip {
    fn name(&self) -> &'static str {
        "CLIP"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["CLIP"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["clip"]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: ClipConfig = parse_config(config)?;
        let text = config.text_config.resolve(&TowerDefaults::CLIP_TEXT)?;
        let vocab_size = config.text_config.vocab_size.unwrap_or(49_408);
        let max_positions = config.text_config.max_position_embeddings.unwrap_or(77);
        let tv = vb.pp("text_model");
        let h = text.hidden_size;
        Ok(Box::new(TextTower {
            token_embedding: tv.get((vocab_size, h), "embeddings.token_embedding.weight")?,
            position_embedding: tv.get((max_positions, h), "embeddings.position_embedding.weight")?,
            encoder: PreLnEncoder::load(&tv.pp("encoder"), &text)?,
            final_norm: layer_norm(&tv.pp("final_layer_norm"), h, text.layer_norm_eps)?,
            projection: Linear::new(vb.get((config.projection_dim, h), "text_projection.weight")?, None)?,
            mask: AttentionMask::Causal,
            vocab_size,
            max_positions,
        }))
    }

    fn vision_tower(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn VisionTower>>, ModelError> {
        let config: ClipConfig = parse_config(config)?;
        let vision = config.vision_config.resolve(&TowerDefaults::CLIP_VISION)?;
        let geometry = PatchGeometry::of(&config.vision_config, 224, 32)?;
        let vv = vb.pp("vision_model");
        let h = vision.hidden_size;
        let embeddings = vv.pp("embeddings");
        let patch_weight = embeddings.get((h, geometry.channels, geometry.patch, geometry.patch), "patch_embedding.weight")?;
        Ok(Some(Box::new(ClipVision {
            patch_embedding: Linear::new(patch_weight.reshape((h, geometry.patch_len()))?, None)?,
            class_embedding: embeddings.get(h, "class_embedding")?,
            position_embedding: embeddings.get((geometry.patches() + 1, h), "position_embedding.weight")?,
            pre_norm: layer_norm(&vv.pp("pre_layrnorm"), h, vision.layer_norm_eps)?,
            encoder: PreLnEncoder::load(&vv.pp("encoder"), &vision)?,
            post_norm: layer_norm(&vv.pp("post_layernorm"), h, vision.layer_norm_eps)?,
            projection: Linear::new(vb.get((config.projection_dim, h), "visual_projection.weight")?, None)?,
            geometry,
            hidden_size: h,
        })))
    }
}

#[derive(Debug, Deserialize)]
struct ClipConfig {
    #[serde(default)]
    text_config: TowerConfig,
    #[serde(default)]
    vision_config: TowerConfig,
    #[serde(default = "default_projection_dim")]
    projection_dim: usize,
}

fn default_projection_dim() -> usize {
    512
}

/// One tower's `text_config` / `vision_config`; absent fields take the defaults of
/// transformers' config classes ([`TowerDefaults`]).
#[derive(Debug, Default, Deserialize)]
pub(super) struct TowerConfig {
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub hidden_act: Option<String>,
    pub layer_norm_eps: Option<f64>,
    pub vocab_size: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    pub pad_token_id: Option<u32>,
    pub image_size: Option<usize>,
    pub patch_size: Option<usize>,
    pub num_channels: Option<usize>,
    pub vision_use_head: Option<bool>,
    /// SigLIP's text `head` output size.
    pub projection_size: Option<usize>,
}

/// transformers' defaults for a tower's shape.
pub(super) struct TowerDefaults {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub act: &'static str,
    pub eps: f64,
}

impl TowerDefaults {
    const CLIP_TEXT: TowerDefaults =
        TowerDefaults { hidden_size: 512, intermediate_size: 2048, layers: 12, heads: 8, act: "quick_gelu", eps: 1e-5 };
    const CLIP_VISION: TowerDefaults =
        TowerDefaults { hidden_size: 768, intermediate_size: 3072, layers: 12, heads: 12, act: "quick_gelu", eps: 1e-5 };
}

/// A tower's encoder shape, resolved.
pub(super) struct Tower {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub activation: Activation,
    pub layer_norm_eps: f64,
}

impl TowerConfig {
    pub(super) fn resolve(&self, defaults: &TowerDefaults) -> std::result::Result<Tower, ModelError> {
        let act = self.hidden_act.as_deref().unwrap_or(defaults.act);
        let tower = Tower {
            hidden_size: self.hidden_size.unwrap_or(defaults.hidden_size),
            intermediate_size: self.intermediate_size.unwrap_or(defaults.intermediate_size),
            layers: self.num_hidden_layers.unwrap_or(defaults.layers),
            heads: self.num_attention_heads.unwrap_or(defaults.heads),
            activation: Activation::from_config(act).ok_or_else(|| ModelError::Config(format!("hidden_act `{act}` is not supported")))?,
            layer_norm_eps: self.layer_norm_eps.unwrap_or(defaults.eps),
        };
        if tower.heads == 0 || !tower.hidden_size.is_multiple_of(tower.heads) {
            return Err(ModelError::Config("hidden_size is not a multiple of num_attention_heads".into()));
        }
        Ok(tower)
    }
}

/// How a vision config cuts an image into patches.
#[derive(Debug, Clone, Copy)]
pub(super) struct PatchGeometry {
    pub image_size: usize,
    pub patch: usize,
    pub channels: usize,
}

impl PatchGeometry {
    pub(super) fn of(config: &TowerConfig, image_size: usize, patch: usize) -> std::result::Result<Self, ModelError> {
        let geometry = PatchGeometry {
            image_size: config.image_size.unwrap_or(image_size),
            patch: config.patch_size.unwrap_or(patch),
            channels: config.num_channels.unwrap_or(3),
        };
        if geometry.patch == 0 || !geometry.image_size.is_multiple_of(geometry.patch) || geometry.channels != 3 {
            return Err(ModelError::Config(format!(
                "vision_config: image_size {} must be a multiple of patch_size {} with 3 channels",
                geometry.image_size, geometry.patch
            )));
        }
        Ok(geometry)
    }

    pub(super) fn patches(&self) -> usize {
        (self.image_size / self.patch).pow(2)
    }

    /// Values in one patch: the convolution's input size.
    pub(super) fn patch_len(&self) -> usize {
        self.channels * self.patch * self.patch
    }

    /// `[images, channels·size·size]` pixels (CHW per image) → `[images·patches, patch_len]`,
    /// patches row-major, each patch's values in the convolution weight's `(c, y, x)` order.
    pub(super) fn patchify(&self, pixels: &[f32], images: usize) -> Vec<f32> {
        let (size, p, grid) = (self.image_size, self.patch, self.image_size / self.patch);
        let mut out = Vec::with_capacity(images * self.patches() * self.patch_len());
        for image in pixels.chunks_exact(self.channels * size * size).take(images) {
            for py in 0..grid {
                for px in 0..grid {
                    for c in 0..self.channels {
                        for y in 0..p {
                            let row = c * size * size + (py * p + y) * size + px * p;
                            out.extend_from_slice(&image[row..row + p]);
                        }
                    }
                }
            }
        }
        out
    }
}

/// One pre-LayerNorm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
struct PreLnLayer {
    norm1: LayerNorm,
    qkv: Linear,
    out_proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The encoder of CLIP's and SigLIP's towers (`encoder.layers.{i}`).
pub(super) struct PreLnEncoder {
    layers: Vec<PreLnLayer>,
    heads: usize,
    hidden_size: usize,
    activation: Activation,
}

impl PreLnEncoder {
    pub(super) fn load(vb: &VarBuilder, tower: &Tower) -> Result<Self> {
        let (h, eps) = (tower.hidden_size, tower.layer_norm_eps);
        let layers = (0..tower.layers)
            .map(|i| {
                let lv = vb.pp(format!("layers.{i}"));
                let attn = lv.pp("self_attn");
                Ok(PreLnLayer {
                    norm1: layer_norm(&lv.pp("layer_norm1"), h, eps)?,
                    qkv: fused_qkv(attn.pp("q_proj"), attn.pp("k_proj"), attn.pp("v_proj"), h)?,
                    out_proj: linear(&attn.pp("out_proj"), h, h)?,
                    norm2: layer_norm(&lv.pp("layer_norm2"), h, eps)?,
                    fc1: linear(&lv.pp("mlp.fc1"), tower.intermediate_size, h)?,
                    fc2: linear(&lv.pp("mlp.fc2"), h, tower.intermediate_size)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers, heads: tower.heads, hidden_size: h, activation: tower.activation })
    }

    pub(super) fn forward(&self, mut hidden: Tensor, cu_seqlens: &[usize], mask: AttentionMask) -> Result<Tensor> {
        let attention = Attention {
            num_heads: self.heads,
            num_kv_heads: self.heads,
            head_dim: self.hidden_size / self.heads,
            cu_seqlens,
            mask,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        for layer in &self.layers {
            let normed = layer.norm1.forward(hidden.copy()?)?;
            let context = attention.forward(&layer.qkv.forward_unbiased(&normed)?, layer.qkv.bias())?;
            hidden = layer.out_proj.forward_add(&context, &hidden)?;
            let normed = layer.norm2.forward(hidden.copy()?)?;
            let inner = self.activation.forward_biased(layer.fc1.forward_unbiased(&normed)?, layer.fc1.bias())?;
            hidden = layer.fc2.forward_add(&inner, &hidden)?;
        }
        Ok(hidden)
    }

    fn linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().flat_map(|l| [&mut l.out_proj, &mut l.fc1, &mut l.fc2]).collect()
    }

    fn attention_inputs(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}

/// CLIP's and SigLIP's text tower as a [`Backbone`]: its rows are the projected states of
/// every token (see the module doc), read at the last token.
pub(super) struct TextTower {
    pub token_embedding: Tensor,
    pub position_embedding: Tensor,
    pub encoder: PreLnEncoder,
    pub final_norm: LayerNorm,
    pub projection: Linear,
    pub mask: AttentionMask,
    pub vocab_size: usize,
    pub max_positions: usize,
}

impl Backbone for TextTower {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.token_embedding.device();
        let n = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, n, device)?;
        let positions = Tensor::from_vec(batch.positions(0), n, device)?;
        let embedded = (self.token_embedding.index_select(&ids, 0)? + self.position_embedding.index_select(&positions, 0)?)?;
        let hidden = self.encoder.forward(embedded, &batch.cu_seqlens, self.mask)?;
        self.projection.forward(&self.final_norm.forward(hidden)?)
    }

    /// Its rows are already projected into the shared space: the projection's width.
    fn sizes(&self) -> BackboneSizes {
        BackboneSizes { hidden: self.projection.out_features(), vocab: self.vocab_size, max_positions: self.max_positions }
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.encoder.linears()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.encoder.attention_inputs()
    }
}

/// Pixels `[images, 3·size·size]` in as a tensor of patch rows on the model's device.
pub(super) fn patch_rows(geometry: &PatchGeometry, pixels: &[f32], images: usize, like: &Tensor) -> Result<Tensor> {
    let rows = geometry.patchify(pixels, images);
    Tensor::from_vec(rows, (images * geometry.patches(), geometry.patch_len()), &Device::Cpu)?
        .to_dtype(like.dtype())?
        .to_device(like.device())
}

/// Equal-length sequences laid end to end.
pub(super) fn dense_seqlens(images: usize, len: usize) -> Vec<usize> {
    (0..=images).map(|i| i * len).collect()
}

struct ClipVision {
    patch_embedding: Linear,
    class_embedding: Tensor,
    position_embedding: Tensor,
    pre_norm: LayerNorm,
    encoder: PreLnEncoder,
    post_norm: LayerNorm,
    projection: Linear,
    geometry: PatchGeometry,
    hidden_size: usize,
}

impl VisionTower for ClipVision {
    fn forward(&self, pixels: &[f32], images: usize) -> Result<Tensor> {
        let (h, patches) = (self.hidden_size, self.geometry.patches());
        let patches_in = patch_rows(&self.geometry, pixels, images, &self.class_embedding)?;
        let embedded = self.patch_embedding.forward(&patches_in)?.reshape((images, patches, h))?;
        let class = self.class_embedding.reshape((1, 1, h))?.broadcast_as((images, 1, h))?;
        let tokens = Tensor::cat(&[&class, &embedded], 1)?.broadcast_add(&self.position_embedding.unsqueeze(0)?)?;
        let len = patches + 1;
        let hidden = self.pre_norm.forward(tokens.reshape((images * len, h))?.contiguous()?)?;
        let hidden = self.encoder.forward(hidden, &dense_seqlens(images, len), AttentionMask::Bidirectional)?;
        let first: Vec<u32> = (0..images as u32).map(|i| i * len as u32).collect();
        let class_states = hidden.index_select(&Tensor::new(first.as_slice(), hidden.device())?, 0)?;
        self.projection.forward(&self.post_norm.forward(class_states)?)?.to_dtype(DType::F32)
    }

    fn image_size(&self) -> usize {
        self.geometry.image_size
    }

    fn tokens_per_image(&self) -> usize {
        self.geometry.patches() + 1
    }

    fn embedding_size(&self) -> usize {
        self.projection.out_features()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_follow_the_convolution_weight_order() {
        let geometry = PatchGeometry { image_size: 4, patch: 2, channels: 3 };
        // pixel value = c·100 + y·10 + x
        let pixels: Vec<f32> = (0..3).flat_map(|c| (0..4).flat_map(move |y| (0..4).map(move |x| (c * 100 + y * 10 + x) as f32))).collect();
        let rows = geometry.patchify(&pixels, 1);
        assert_eq!(rows.len(), 4 * 12);
        // second patch (py 0, px 1): channel 0 rows y 0..2, x 2..4, then channels 1 and 2
        assert_eq!(&rows[12..24], &[2., 3., 12., 13., 102., 103., 112., 113., 202., 203., 212., 213.]);
        assert_eq!(dense_seqlens(2, 5), vec![0, 5, 10]);
    }
}
