//! Qwen2-VL's two halves, as transformers 5.24's `modeling_qwen2_vl.py` runs them, for the
//! models built on it (ColQwen2):
//! - **the vision tower** ([`Qwen2VlVision`], a [`SoftTokenTower`]): an image of any size,
//!   resized by the processor to a multiple of `patch_size × spatial_merge_size`, is cut into
//!   `patch_size`² patches (the processor repeats the image over `temporal_patch_size` frames;
//!   the patch convolution's temporal slices are summed at load, which computes the same);
//!   pre-LayerNorm blocks whose attention turns queries and keys by each patch's row and column
//!   (axial 2-D RoPE) and sees the whole image; then `merger`: LayerNorm, each 2×2 block of
//!   patches concatenated, Linear → GELU → Linear into the language model's width: one soft
//!   token per block, blocks in row-major order;
//! - **the language model** ([`Qwen2VlText`]): Qwen2's decoder, its tokens placed by one of
//!   two rules ([`TokenPositions`]): one position per token in sequence order, or M-RoPE: a text
//!   token's position is one number on three axes; an image's soft tokens take (temporal, row,
//!   column) positions counted from where the image starts, and the text after the image
//!   resumes past its larger side (`get_rope_index`). Frequency pairs turn by the axis of their
//!   `mrope_section`.

use super::batch::{Batch, ImageGrid};
use super::gemma4_vision::ImagePatches;
use super::llama::{Decoder, DecoderConfig, DecoderLayout};
use super::weights::{layer_norm, linear};
use super::{parse_config, Backbone, BackboneSizes, ImageTokens, ModelError, SoftTokenTower};
use crate::kernels::{Activation, Attention, AttentionMask, LayerNorm, Linear, Rotary, RotaryTable};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

/// `Qwen2VLVisionConfig`'s fields (its defaults where absent).
#[derive(Debug, Deserialize)]
struct VisionConfig {
    #[serde(default = "default_depth")]
    depth: usize,
    #[serde(default = "default_embed_dim")]
    embed_dim: usize,
    /// The language model's width, which the merger maps into.
    hidden_size: usize,
    #[serde(default = "default_vision_act")]
    hidden_act: String,
    #[serde(default = "default_mlp_ratio")]
    mlp_ratio: f64,
    #[serde(default = "default_heads")]
    num_heads: usize,
    #[serde(default = "default_patch")]
    patch_size: usize,
    #[serde(default = "default_merge")]
    spatial_merge_size: usize,
    #[serde(default = "default_temporal")]
    temporal_patch_size: usize,
}

fn default_depth() -> usize {
    32
}
fn default_embed_dim() -> usize {
    1280
}
fn default_vision_act() -> String {
    "quick_gelu".into()
}
fn default_mlp_ratio() -> f64 {
    4.0
}
fn default_heads() -> usize {
    16
}
fn default_patch() -> usize {
    14
}
fn default_merge() -> usize {
    2
}
fn default_temporal() -> usize {
    2
}

/// Patch indices in the merger's order, and each one's (row, column).
type BlockOrder = (Vec<usize>, Vec<(u32, u32)>);

/// Vision blocks' LayerNorms and the mergers' (`eps=1e-6` in both towers' modeling code).
pub(super) const VISION_EPS: f64 = 1e-6;

/// A pre-LayerNorm vision block of the Qwen-VL towers: attention whose queries and keys turn
/// by each patch's row and column, then an MLP (Qwen2-VL's `mlp.fc1`/`mlp.fc2`, Qwen3-VL's
/// `mlp.linear_fc1`/`mlp.linear_fc2`).
pub(super) struct VisionBlock {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl VisionBlock {
    /// Block `b`'s weights: `e` wide, its MLP `inner` wide under `mlp.{fc1}` and `mlp.{fc2}`.
    pub(super) fn load(b: &VarBuilder, e: usize, inner: usize, [fc1, fc2]: [&str; 2]) -> Result<Self> {
        Ok(Self {
            norm1: layer_norm(&b.pp("norm1"), e, VISION_EPS)?,
            qkv: linear(&b.pp("attn.qkv"), 3 * e, e)?,
            proj: linear(&b.pp("attn.proj"), e, e)?,
            norm2: layer_norm(&b.pp("norm2"), e, VISION_EPS)?,
            fc1: linear(&b.pp(format!("mlp.{fc1}")), inner, e)?,
            fc2: linear(&b.pp(format!("mlp.{fc2}")), e, inner)?,
        })
    }

    /// `hidden` (`[patches, e]`) through the block: `table` the patches' 2-D rotary angles,
    /// `attention` over each image's patches, `heads` of them.
    pub(super) fn forward(
        &self,
        hidden: Tensor,
        table: &RotaryTable,
        attention: &Attention,
        heads: usize,
        activation: Activation,
    ) -> Result<Tensor> {
        // The norms work in place: on copies, as the residual goes on with `hidden`.
        let qkv = self.qkv.forward(&self.norm1.forward(hidden.copy()?)?)?;
        let qkv = table.apply(&qkv, heads, heads, None)?;
        let hidden = self.proj.forward_add(&attention.forward(&qkv, None)?, &hidden)?;
        let normed = self.norm2.forward(hidden.copy()?)?;
        let inner = activation.forward_biased(self.fc1.forward_unbiased(&normed)?, self.fc1.bias())?;
        self.fc2.forward_add(&inner, &hidden)
    }
}

/// The vision tower and the token ids that frame an image in the text.
pub struct Qwen2VlVision {
    patch_embed: Linear,
    blocks: Vec<VisionBlock>,
    rotary: Rotary,
    merge_norm: LayerNorm,
    merge_fc1: Linear,
    merge_fc2: Linear,
    activation: Activation,
    heads: usize,
    embed_dim: usize,
    patch_size: usize,
    merge: usize,
    tokens: ImageTokens,
}

impl Qwen2VlVision {
    /// The tower of a `qwen2_vl` config (`vision_config` and the image token ids), its weights
    /// under `vb` (`visual`'s names).
    pub fn load(vlm: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: VisionConfig = parse_config(vlm.get("vision_config").unwrap_or(&Value::Null))?;
        let (e, heads) = (config.embed_dim, config.num_heads);
        if heads == 0 || !e.is_multiple_of(heads) || !(e / heads).is_multiple_of(4) {
            return Err(ModelError::Config(format!("vision_config: embed_dim {e} over {heads} heads")));
        }
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("vision hidden_act `{}` is not supported", config.hidden_act)))?;
        let (p, t) = (config.patch_size, config.temporal_patch_size);
        // The processor repeats a picture over the temporal patch, so the convolution's temporal
        // slices act on the same pixels: their sum, laid out as our patches are (row by row,
        // channels innermost).
        let conv = vb.pp("patch_embed.proj").get((e, 3, t, p, p), "weight")?;
        let patch_embed = conv.sum(2)?.permute((0, 2, 3, 1))?.reshape((e, p * p * 3))?;
        let inner = (e as f64 * config.mlp_ratio) as usize;
        let blocks = (0..config.depth)
            .map(|i| VisionBlock::load(&vb.pp(format!("blocks.{i}")), e, inner, ["fc1", "fc2"]))
            .collect::<Result<Vec<_>>>()?;
        let merged = e * config.spatial_merge_size * config.spatial_merge_size;
        let merger = vb.pp("merger");
        let theta = vlm.pointer("/vision_config/rope_parameters/rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0);
        Ok(Self {
            patch_embed: Linear::new(patch_embed, None)?,
            blocks,
            // Frequencies over half a head: rows turn its first half, columns its second.
            rotary: Rotary::new(e / heads / 2, theta),
            merge_norm: layer_norm(&merger.pp("ln_q"), e, VISION_EPS)?,
            merge_fc1: linear(&merger.pp("mlp.0"), merged, merged)?,
            merge_fc2: linear(&merger.pp("mlp.2"), config.hidden_size, merged)?,
            activation,
            heads,
            embed_dim: e,
            patch_size: p,
            merge: config.spatial_merge_size,
            tokens: image_tokens(vlm)?,
        })
    }
}

/// Each image's patches in the merger's order: 2×2 blocks row-major, the block's patches
/// row-major inside it (the processor's `patchify` order), with each patch's (row, column).
pub(super) fn merge_blocks(image: &ImagePatches, m: usize) -> Result<BlockOrder> {
    let cols = image.positions.iter().map(|&(x, _)| x as usize + 1).max().unwrap_or(0);
    let rows = image.positions.len() / cols.max(1);
    let row_major = image.positions.iter().enumerate().all(|(i, &(x, y))| (x as usize, y as usize) == (i % cols, i / cols));
    if !row_major || rows * cols != image.positions.len() || !rows.is_multiple_of(m) || !cols.is_multiple_of(m) {
        candle_core::bail!("an image's {} patches are not a {m}-aligned row-major grid", image.positions.len());
    }
    let (mut order, mut places) = (Vec::with_capacity(rows * cols), Vec::with_capacity(rows * cols));
    for by in 0..rows / m {
        for bx in 0..cols / m {
            for dy in 0..m {
                for dx in 0..m {
                    let (y, x) = (by * m + dy, bx * m + dx);
                    order.push(y * cols + x);
                    places.push((y as u32, x as u32));
                }
            }
        }
    }
    Ok((order, places))
}

/// The tokens that frame an image in a Qwen-VL text (`vision_start_token_id`, `image_token_id`,
/// `vision_end_token_id` of the config; Qwen2VLConfig's defaults where absent).
pub(super) fn image_tokens(vlm: &Value) -> std::result::Result<ImageTokens, ModelError> {
    let token = |name: &str, default: u32| -> std::result::Result<u32, ModelError> {
        match vlm.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_u64().map(|v| v as u32).ok_or_else(|| ModelError::Config(format!("{name} is not a token id: {v}"))),
        }
    };
    Ok(ImageTokens {
        begin: token("vision_start_token_id", 151_652)?,
        placeholder: token("image_token_id", 151_655)?,
        end: token("vision_end_token_id", 151_653)?,
    })
}

impl SoftTokenTower for Qwen2VlVision {
    fn forward(&self, images: &[&ImagePatches]) -> Result<Tensor> {
        let (device, dtype) = self.patch_embed.device_and_dtype();
        let (mut pixels, mut places, mut cu_seqlens) = (Vec::new(), Vec::new(), vec![0usize]);
        let patch_len = self.patch_size * self.patch_size * 3;
        for image in images {
            let (order, image_places) = merge_blocks(image, self.merge)?;
            for i in order {
                pixels.extend_from_slice(&image.pixels[i * patch_len..(i + 1) * patch_len]);
            }
            places.extend(image_places);
            cu_seqlens.push(places.len());
        }
        let n = places.len();
        let mut hidden = self.patch_embed.forward(&Tensor::from_vec(pixels, (n, patch_len), &device)?.to_dtype(dtype)?)?;
        let table = self.rotary.table_2d(&places);
        let head_dim = self.embed_dim / self.heads;
        let attention = Attention {
            num_heads: self.heads,
            num_kv_heads: self.heads,
            head_dim,
            cu_seqlens: &cu_seqlens,
            mask: AttentionMask::Bidirectional,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        for block in &self.blocks {
            hidden = block.forward(hidden, &table, &attention, self.heads, self.activation)?;
        }
        let blocks = n / (self.merge * self.merge);
        let merged = self.merge_norm.forward(hidden)?.reshape((blocks, self.embed_dim * self.merge * self.merge))?;
        let inner = Activation::Gelu.forward_biased(self.merge_fc1.forward_unbiased(&merged)?, self.merge_fc1.bias())?;
        self.merge_fc2.forward(&inner)?.to_dtype(DType::F32)
    }

    fn patch_geometry(&self) -> (usize, usize) {
        (self.patch_size, self.merge)
    }

    fn image_tokens(&self) -> ImageTokens {
        self.tokens
    }

    /// Soft tokens in row-major order over the image's blocks, which M-RoPE places by row
    /// and column ([`ImageGrid`]).
    fn places_soft_tokens(&self) -> bool {
        true
    }
}

/// How the language model places its tokens for the rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPositions {
    /// Position `i` for the `i`-th token of a sequence on all three axes, image tokens
    /// included: what transformers 5.24's `ColQwen2ForRetrieval` computes, as it calls its
    /// backbone without `input_ids` and `Qwen2VLModel` cannot place the image then.
    Sequence,
    /// Qwen2-VL's M-RoPE (`get_rope_index`): image tokens by row and column.
    Mrope,
}

/// Qwen2's decoder with M-RoPE.
pub struct Qwen2VlText {
    decoder: Decoder,
    /// The axis (0 temporal, 1 row, 2 column) each frequency pair turns by.
    axes: Vec<usize>,
    positions: TokenPositions,
}

impl Qwen2VlText {
    /// The language model of a `qwen2_vl` config's `text_config`, its weights under `vb`,
    /// placing its tokens by `positions`.
    pub fn load(text: &Value, vb: VarBuilder, positions: TokenPositions) -> std::result::Result<Self, ModelError> {
        let config: DecoderConfig = parse_config(text)?;
        let head_dim = config.head_dim.unwrap_or(config.hidden_size / config.num_attention_heads.max(1));
        let section = mrope_section(text, head_dim, [16, 24, 24])?;
        if text.pointer("/rope_parameters/mrope_interleaved").and_then(Value::as_bool) == Some(true) {
            return Err(ModelError::Config("interleaved M-RoPE is Qwen3-VL's (model_type qwen3_vl), not Qwen2-VL's".into()));
        }
        let axes = section.iter().enumerate().flat_map(|(axis, &n)| std::iter::repeat_n(axis, n)).collect();
        let layout = DecoderLayout { qkv_bias: true, mlp_bias: false, qk_norm: false, sliding_window: None };
        Ok(Self { decoder: Decoder::load(text, layout, vb)?, axes, positions })
    }
}

/// `mrope_section` of a text config (`rope_parameters`, or `rope_scaling` before transformers
/// 5): how many of a head's frequency pairs turn by the temporal, row and column axes.
pub(super) fn mrope_section(text: &Value, head_dim: usize, default: [usize; 3]) -> std::result::Result<[usize; 3], ModelError> {
    let section: [usize; 3] = match text.pointer("/rope_parameters/mrope_section").or_else(|| text.pointer("/rope_scaling/mrope_section")) {
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| ModelError::Config(format!("mrope_section: {e}")))?,
        None => default,
    };
    if section.iter().sum::<usize>() != head_dim / 2 {
        return Err(ModelError::Config(format!("mrope_section {section:?} must be three parts of head_dim / 2 = {}", head_dim / 2)));
    }
    Ok(section)
}

/// Every token's (temporal, row, column) position: text counts on from the sequence's
/// start, an image's grid starts where it stands and the text after it resumes past its
/// larger side, as `get_rope_index` places them.
pub(super) fn mrope_positions(batch: &Batch) -> Vec<[u32; 3]> {
    let grids: &[ImageGrid] = batch.soft_tokens.as_ref().map_or(&[], |s| &s.grids);
    let mut positions = Vec::with_capacity(batch.num_tokens());
    let mut next_grid = grids.iter().peekable();
    for (start, len) in batch.spans() {
        let (mut token, mut at) = (start, 0u32);
        while token < start + len {
            match next_grid.peek() {
                Some(grid) if grid.first == token => {
                    for r in 0..grid.rows {
                        for c in 0..grid.cols {
                            positions.push([at, at + r as u32, at + c as u32]);
                        }
                    }
                    token += grid.rows * grid.cols;
                    at += grid.rows.max(grid.cols) as u32;
                    next_grid.next();
                }
                _ => {
                    positions.push([at; 3]);
                    token += 1;
                    at += 1;
                }
            }
        }
    }
    positions.truncate(batch.num_tokens());
    positions
}

impl Backbone for Qwen2VlText {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let table = match self.positions {
            // The three axes agree, so every frequency pair turns by the token's index.
            TokenPositions::Sequence => self.decoder.rotary().table_for_sequences(&batch.cu_seqlens),
            TokenPositions::Mrope => {
                let axes = &self.axes;
                self.decoder.rotary().table_axes(&mrope_positions(batch), |k| axes.get(k).copied().unwrap_or(0))
            }
        };
        self.decoder.forward_with(batch, &table)
    }

    fn sizes(&self) -> BackboneSizes {
        self.decoder.sizes()
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.decoder.int8_linears()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.decoder.attention_input_linears()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::batch::{SoftTokens, TokenizedInput};

    #[test]
    fn image_tokens_take_grid_positions_and_text_resumes_past_the_larger_side() {
        // "a b [2×3 image] c" then "d e".
        let inputs = [TokenizedInput { ids: vec![0; 9], type_ids: vec![0; 9] }, TokenizedInput { ids: vec![0; 2], type_ids: vec![0; 2] }];
        let mut batch = Batch::from_inputs(&inputs);
        let mut soft = SoftTokens::new((2..8).collect(), Tensor::zeros((6, 4), DType::F32, &candle_core::Device::Cpu).unwrap()).unwrap();
        soft.grids = vec![ImageGrid { first: 2, rows: 2, cols: 3 }];
        batch.soft_tokens = Some(soft);
        let p = mrope_positions(&batch);
        assert_eq!(&p[..2], &[[0; 3], [1; 3]]);
        assert_eq!(&p[2..8], &[[2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4]]);
        assert_eq!(p[8], [5; 3], "text resumes at 2 + max(2, 3)");
        assert_eq!(&p[9..], &[[0; 3], [1; 3]], "each sequence counts from 0");
    }
}
