//! Qwen3-VL (`Qwen3VLForConditionalGeneration`, transformers 5.24's `modeling_qwen3_vl.py`),
//! served as the Qwen3-VL-Embedding embedder: texts, images and both together in one input,
//! one vector each (the last token's final state, L2-normalized).
//!
//! - **The vision tower** ([`Qwen3VlVision`], a [`SoftTokenTower`]): Qwen2-VL's
//!   ([`super::qwen2_vl`]) with a bias on the patch convolution, a learned square table of
//!   absolute positions resampled to each image's grid (bilinear, corners aligned), MLP blocks
//!   `linear_fc1 → gelu → linear_fc2`, and **DeepStack**: after the blocks of
//!   `deepstack_visual_indexes`, a merger of its own (LayerNorm over the 2×2 block's
//!   concatenation) turns the patches into extra features for the same soft tokens. The tower
//!   returns them beside the input embeddings, `[embedding | feature 0 | feature 1 | …]` per
//!   soft token.
//! - **The language model** ([`Qwen3VlText`]): Qwen3's decoder (q/k norms) with *interleaved*
//!   M-RoPE (frequency pair `k` turns by the row for `k ≡ 1 (mod 3)`, the column for `k ≡ 2`,
//!   within three times their `mrope_section`, the temporal axis otherwise); DeepStack feature
//!   `i` joins the residual stream at the image's tokens after decoder layer `i`.
//! - **Prompts** ([`RetrievalPrompts`]), as Qwen3-VL-Embedding's embedder builds them
//!   (`format_model_input` + the chat template with `add_generation_prompt`):
//!   `<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{parts}<|im_end|>\n
//!   <|im_start|>assistant\n`, the instruction "Represent the user's input." (its default), the
//!   parts (`<|vision_start|><|image_pad|>×n<|vision_end|>` for an image, texts as they are)
//!   one after another. vLLM tokenizes a plain text input without this frame; we build it, as
//!   the published embedder does, so that a text and an image land in the same space.

use super::batch::Batch;
use super::gemma4_vision::ImagePatches;
use super::head_weights::{ClassifierWeights, RerankTemplate};
use super::llama::{last_token_classifier, Decoder, DecoderConfig, DecoderLayout};
use super::qwen2_vl::{image_tokens, merge_blocks, mrope_positions, mrope_section, VisionBlock, VISION_EPS};
use super::retrieval::root;
use super::weights::{layer_norm, linear};
use super::{
    parse_config, Architecture, Backbone, BackboneSizes, ImageTokens, ModelError, RetrievalPrompts, SequencePooling, SoftTokenTower,
};
use crate::kernels::{host_f32, Activation, Attention, AttentionMask, LayerNorm, Linear, Rotary};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Qwen3Vl;

pub static QWEN3_VL: Qwen3Vl = Qwen3Vl;

/// Qwen3-VL-Embedding's default instruction (its `format_model_input`).
const DEFAULT_INSTRUCTION: &str = "Represent the user's input.";

impl Architecture for Qwen3Vl {
    fn name(&self) -> &'static str {
        "Qwen3VL"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["Qwen3VL"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3_vl"]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let text = root(&vb, &["model.language_model", "language_model", "model"], "embed_tokens.weight")?;
        Ok(Box::new(Qwen3VlText::load(raw.get("text_config").unwrap_or(&Value::Null), deepstack_features(raw)?, text)?))
    }

    fn soft_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        let visual = root(&vb, &["model.visual", "visual"], "patch_embed.proj.weight")?;
        Ok(Some(Box::new(Qwen3VlVision::load(raw, visual)?)))
    }

    /// Qwen3-VL-Reranker's pairs are written by its rerank template ([`Self::rerank_template`]),
    /// their parts one after another, with nothing around them.
    fn retrieval_prompts(
        &self,
        config: &Value,
        _processor: &Value,
        _special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        if is_reranker(config) {
            let none = String::new;
            return Ok(Some(RetrievalPrompts {
                query_prefix: none(),
                query_suffix: none(),
                image_prefix: none(),
                image_suffix: none(),
                mixed: true,
                strips_queries: false,
                instruction: None,
                special_tokens: false,
            }));
        }
        let prefix = "<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n".to_string();
        let suffix = "<|im_end|>\n<|im_start|>assistant\n".to_string();
        Ok(Some(RetrievalPrompts {
            query_prefix: prefix.clone(),
            query_suffix: suffix.clone(),
            image_prefix: prefix,
            image_suffix: suffix,
            mixed: true,
            strips_queries: false,
            instruction: Some(DEFAULT_INSTRUCTION.into()),
            special_tokens: false,
        }))
    }

    /// Qwen3-VL-Reranker converted as vLLM converts it (`--hf-overrides '{"architectures":
    /// ["Qwen3VLForSequenceClassification"], "classifier_from_token": ["no", "yes"],
    /// "is_original_qwen3_reranker": true}'`): the LM head's `yes − no` row on the last token.
    fn classifier(
        &self,
        raw: &Value,
        vb: VarBuilder,
        num_labels: usize,
        from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        // The text model's sizes, with the conversion's fields of the top level.
        let mut config = raw.get("text_config").cloned().unwrap_or(Value::Null);
        if let (Some(text), Some(top)) = (config.as_object_mut(), raw.as_object()) {
            for key in ["is_original_qwen3_reranker", "method", "classifier_from_token"] {
                if let Some(value) = top.get(key) {
                    text.insert(key.into(), value.clone());
                }
            }
        }
        // A converted LM head: `lm_head.weight` when untied, else the text model's embeddings
        // (under `model.language_model`, where the decoder's reader looks at the root). A
        // `*ForSequenceClassification` checkpoint's `score` is at the top.
        let vb = match from_tokens.is_some() && !vb.contains_tensor("lm_head.weight") {
            true => root(&vb, &["model.language_model", "language_model", "model"], "embed_tokens.weight")?,
            false => vb,
        };
        last_token_classifier(&config, vb, num_labels, from_tokens)
    }

    fn rerank_template(&self, _config: &Value, num_labels: usize) -> Option<RerankTemplate> {
        (num_labels == 1).then(RerankTemplate::qwen3_vl)
    }
}

/// A config served as a classifier (Qwen3-VL-Reranker's `--hf-overrides` name
/// `Qwen3VLForSequenceClassification`), by the name test the loader decides its tasks with
/// (`loader::model_spec::is_sequence_classifier`, a layer above this one).
fn is_reranker(config: &Value) -> bool {
    config.pointer("/architectures/0").and_then(Value::as_str).is_some_and(|a| a.ends_with("ForSequenceClassification"))
}

/// `Qwen3VLVisionConfig`'s fields (its defaults where absent).
#[derive(Debug, Deserialize)]
struct VisionConfig {
    #[serde(default = "default_depth")]
    depth: usize,
    #[serde(default = "default_hidden")]
    hidden_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_intermediate")]
    intermediate_size: usize,
    #[serde(default = "default_heads")]
    num_heads: usize,
    #[serde(default = "default_patch")]
    patch_size: usize,
    #[serde(default = "default_merge")]
    spatial_merge_size: usize,
    #[serde(default = "default_temporal")]
    temporal_patch_size: usize,
    /// The language model's width, which the mergers map into.
    #[serde(default = "default_out")]
    out_hidden_size: usize,
    #[serde(default = "default_positions")]
    num_position_embeddings: usize,
    #[serde(default = "default_deepstack")]
    deepstack_visual_indexes: Vec<usize>,
}

fn default_depth() -> usize {
    27
}
fn default_hidden() -> usize {
    1152
}
fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}
fn default_intermediate() -> usize {
    4304
}
fn default_heads() -> usize {
    16
}
fn default_patch() -> usize {
    16
}
fn default_merge() -> usize {
    2
}
fn default_temporal() -> usize {
    2
}
fn default_out() -> usize {
    3584
}
fn default_positions() -> usize {
    2304
}
fn default_deepstack() -> Vec<usize> {
    vec![8, 16, 24]
}

fn vision_config(raw: &Value) -> std::result::Result<VisionConfig, ModelError> {
    let vision = raw.get("vision_config").unwrap_or(&Value::Null);
    let mut config: VisionConfig = parse_config(vision)?;
    // Qwen3.5's tower is this one without DeepStack (`Qwen3_5VisionConfig` has no such field).
    if vision.get("model_type").and_then(Value::as_str) == Some("qwen3_5_vision") && vision.get("deepstack_visual_indexes").is_none() {
        config.deepstack_visual_indexes.clear();
    }
    Ok(config)
}

/// How many DeepStack features the tower of a config with a top-level `vision_config` gives
/// each soft token (the language model adds them after as many layers).
pub(super) fn deepstack_features(raw: &Value) -> std::result::Result<usize, ModelError> {
    Ok(vision_config(raw)?.deepstack_visual_indexes.len())
}

/// A patch merger: LayerNorm (per patch, or over the 2×2 block's concatenation after the
/// shuffle for DeepStack's), Linear → GELU → Linear into the language model's width.
struct Merger {
    norm: LayerNorm,
    post_shuffle: bool,
    fc1: Linear,
    fc2: Linear,
}

impl Merger {
    fn load(vb: &VarBuilder, e: usize, merge: usize, out: usize, post_shuffle: bool) -> Result<Self> {
        let merged = e * merge * merge;
        Ok(Self {
            norm: layer_norm(&vb.pp("norm"), if post_shuffle { merged } else { e }, VISION_EPS)?,
            post_shuffle,
            fc1: linear(&vb.pp("linear_fc1"), merged, merged)?,
            fc2: linear(&vb.pp("linear_fc2"), out, merged)?,
        })
    }

    /// `patches` (`[n, e]`, 2×2 blocks consecutive; normalized in place) into one row per
    /// block.
    fn forward(&self, patches: Tensor, blocks: usize) -> Result<Tensor> {
        let merged = if self.post_shuffle {
            self.norm.forward(patches.reshape((blocks, ()))?)?
        } else {
            self.norm.forward(patches)?.reshape((blocks, ()))?
        };
        let inner = Activation::Gelu.forward_biased(self.fc1.forward_unbiased(&merged)?, self.fc1.bias())?;
        self.fc2.forward(&inner)
    }
}

/// The vision tower, its DeepStack mergers and the token ids that frame an image in the text.
pub struct Qwen3VlVision {
    patch_embed: Linear,
    /// The learned positions, `side × side` rows of `e` (host f32: resampled per image).
    positions: Vec<f32>,
    side: usize,
    blocks: Vec<VisionBlock>,
    rotary: Rotary,
    merger: Merger,
    /// (block index, its merger), in block order.
    deepstack: Vec<(usize, Merger)>,
    activation: Activation,
    heads: usize,
    embed_dim: usize,
    patch_size: usize,
    merge: usize,
    tokens: ImageTokens,
}

impl Qwen3VlVision {
    /// The tower of a `qwen3_vl` config, its weights under `vb` (`visual`'s names).
    pub fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config = vision_config(raw)?;
        let (e, heads) = (config.hidden_size, config.num_heads);
        if heads == 0 || !e.is_multiple_of(heads) || !(e / heads).is_multiple_of(4) {
            return Err(ModelError::Config(format!("vision_config: hidden_size {e} over {heads} heads")));
        }
        let side = (config.num_position_embeddings as f64).sqrt() as usize;
        if side * side != config.num_position_embeddings || side < 2 {
            return Err(ModelError::Config(format!(
                "vision_config: num_position_embeddings {} is not a square",
                config.num_position_embeddings
            )));
        }
        if let Some(&bad) = config.deepstack_visual_indexes.iter().find(|&&i| i >= config.depth) {
            return Err(ModelError::Config(format!("vision_config: deepstack index {bad} past the tower's {} blocks", config.depth)));
        }
        let mut indexes = config.deepstack_visual_indexes.clone();
        indexes.sort_unstable();
        indexes.dedup();
        if indexes != config.deepstack_visual_indexes {
            return Err(ModelError::Config(format!(
                "vision_config: deepstack_visual_indexes {:?} must ascend without repeats",
                config.deepstack_visual_indexes
            )));
        }
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("vision hidden_act `{}` is not supported", config.hidden_act)))?;
        let (p, t, m) = (config.patch_size, config.temporal_patch_size, config.spatial_merge_size);
        // The processor repeats a picture over the temporal patch, so the convolution's temporal
        // slices act on the same pixels: their sum, laid out as our patches are (row by row,
        // channels innermost).
        let conv = vb.pp("patch_embed.proj");
        let weight = conv.get((e, 3, t, p, p), "weight")?.sum(2)?.permute((0, 2, 3, 1))?.reshape((e, p * p * 3))?;
        let blocks = (0..config.depth)
            .map(|i| VisionBlock::load(&vb.pp(format!("blocks.{i}")), e, config.intermediate_size, ["linear_fc1", "linear_fc2"]))
            .collect::<Result<Vec<_>>>()?;
        let out = config.out_hidden_size;
        let deepstack = config
            .deepstack_visual_indexes
            .iter()
            .enumerate()
            .map(|(k, &block)| Ok((block, Merger::load(&vb.pp(format!("deepstack_merger_list.{k}")), e, m, out, true)?)))
            .collect::<Result<Vec<_>>>()?;
        let theta = raw.pointer("/vision_config/rope_parameters/rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0);
        Ok(Self {
            patch_embed: Linear::new(weight, Some(conv.get(e, "bias")?))?,
            positions: host_f32(&vb.get((side * side, e), "pos_embed.weight")?)?,
            side,
            blocks,
            // Frequencies over half a head: rows turn its first half, columns its second.
            rotary: Rotary::new(e / heads / 2, theta),
            merger: Merger::load(&vb.pp("merger"), e, m, out, false)?,
            deepstack,
            activation,
            heads,
            embed_dim: e,
            patch_size: p,
            merge: m,
            tokens: image_tokens(raw)?,
        })
    }

    /// The learned positions resampled to a `rows × cols` grid at each of `places`: bilinear
    /// with the corners aligned (`F.interpolate(align_corners=True)`, as
    /// `get_vision_interpolation_indices_and_weights` computes it, in f32), the four taps summed
    /// in its order.
    fn interpolated_positions(&self, places: &[(u32, u32)], (rows, cols): (usize, usize), out: &mut Vec<f32>) {
        let (side, e) = (self.side, self.embed_dim);
        let taps = |index: u32, size: usize| -> [(usize, f32); 2] {
            let source = index as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
            let floor = source.floor();
            let at = |offset: f32| ((floor + offset) as usize).min(side - 1);
            let weight = |offset: f32| (1.0 - (source - floor - offset).abs()).max(0.0);
            [(at(0.0), weight(0.0)), (at(1.0), weight(1.0))]
        };
        for &(row, col) in places {
            let start = out.len();
            out.resize(start + e, 0.0);
            for (h, hw) in taps(row, rows) {
                for (w, ww) in taps(col, cols) {
                    let (weight, table) = (hw * ww, &self.positions[(h * side + w) * e..(h * side + w + 1) * e]);
                    out[start..].iter_mut().zip(table).for_each(|(o, &v)| *o += v * weight);
                }
            }
        }
    }
}

impl SoftTokenTower for Qwen3VlVision {
    fn forward(&self, images: &[&ImagePatches]) -> Result<Tensor> {
        let (device, dtype) = self.patch_embed.device_and_dtype();
        let (mut pixels, mut places, mut cu_seqlens, mut positions) = (Vec::new(), Vec::new(), vec![0usize], Vec::new());
        let patch_len = self.patch_size * self.patch_size * 3;
        for image in images {
            let (order, image_places) = merge_blocks(image, self.merge)?;
            for i in order {
                pixels.extend_from_slice(&image.pixels[i * patch_len..(i + 1) * patch_len]);
            }
            let rows = image_places.iter().map(|p| p.0 as usize + 1).max().unwrap_or(0);
            let cols = image_places.iter().map(|p| p.1 as usize + 1).max().unwrap_or(0);
            self.interpolated_positions(&image_places, (rows, cols), &mut positions);
            places.extend(image_places);
            cu_seqlens.push(places.len());
        }
        let n = places.len();
        let patches = self.patch_embed.forward(&Tensor::from_vec(pixels, (n, patch_len), &device)?.to_dtype(dtype)?)?;
        let mut hidden = (patches + Tensor::from_vec(positions, (n, self.embed_dim), &device)?.to_dtype(dtype)?)?;
        let table = self.rotary.table_2d(&places);
        let attention = Attention {
            num_heads: self.heads,
            num_kv_heads: self.heads,
            head_dim: self.embed_dim / self.heads,
            cu_seqlens: &cu_seqlens,
            mask: AttentionMask::Bidirectional,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        let blocks = n / (self.merge * self.merge);
        let mut features = Vec::with_capacity(self.deepstack.len());
        for (i, block) in self.blocks.iter().enumerate() {
            hidden = block.forward(hidden, &table, &attention, self.heads, self.activation)?;
            if let Some((_, merger)) = self.deepstack.iter().find(|(at, _)| *at == i) {
                // The mergers' norms work in place: on a copy, as the blocks go on.
                features.push(merger.forward(hidden.copy()?, blocks)?);
            }
        }
        let mut columns = vec![self.merger.forward(hidden, blocks)?];
        columns.extend(features);
        Tensor::cat(&columns, 1)?.to_dtype(DType::F32)
    }

    fn patch_geometry(&self) -> (usize, usize) {
        (self.patch_size, self.merge)
    }

    fn image_tokens(&self) -> ImageTokens {
        self.tokens
    }

    /// Soft tokens in row-major order over the image's blocks, which M-RoPE places by row
    /// and column.
    fn places_soft_tokens(&self) -> bool {
        true
    }
}

/// Qwen3's decoder with interleaved M-RoPE and DeepStack.
pub struct Qwen3VlText {
    decoder: Decoder,
    /// The axis (0 temporal, 1 row, 2 column) each frequency pair turns by.
    axes: Vec<usize>,
    /// How many DeepStack features each soft token brings beside its embedding.
    deepstack: usize,
}

impl Qwen3VlText {
    /// The language model of a `qwen3_vl` config's `text_config`, its weights under `vb`;
    /// `deepstack`: the vision tower's DeepStack features per soft token.
    pub fn load(text: &Value, deepstack: usize, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: DecoderConfig = parse_config(text)?;
        let (_, _, head_dim) = config.heads()?;
        // Qwen3VLTextConfig's default.
        let section = mrope_section(text, head_dim, [24, 20, 20])?;
        let interleaved = text.pointer("/rope_parameters/mrope_interleaved").or_else(|| text.pointer("/rope_scaling/mrope_interleaved"));
        if interleaved.and_then(Value::as_bool) == Some(false) {
            return Err(ModelError::Config("Qwen3-VL's M-RoPE is interleaved; mrope_interleaved is false".into()));
        }
        let axes = interleaved_axes(section, head_dim / 2);
        let layout =
            DecoderLayout { qkv_bias: config.attention_bias.unwrap_or(false), mlp_bias: false, qk_norm: true, sliding_window: None };
        let decoder = Decoder::load(text, layout, vb)?;
        if deepstack > config.num_hidden_layers {
            return Err(ModelError::Config(format!("{deepstack} DeepStack features for {} decoder layers", config.num_hidden_layers)));
        }
        Ok(Self { decoder, axes, deepstack })
    }

    /// [`Decoder::into_bidirectional_without_final_norm`] (nemotron-colembed's language model).
    pub fn into_bidirectional_without_final_norm(self) -> Self {
        Self { decoder: self.decoder.into_bidirectional_without_final_norm(), ..self }
    }
}

/// The axis (0 temporal, 1 row, 2 column) each of `pairs` frequency pairs turns by under
/// interleaved M-RoPE: T H W T H W … within three times their `section`, then T.
pub(super) fn interleaved_axes(section: [usize; 3], pairs: usize) -> Vec<usize> {
    (0..pairs)
        .map(|k| match k % 3 {
            1 if k < 3 * section[1] => 1,
            2 if k < 3 * section[2] => 2,
            _ => 0,
        })
        .collect()
}

impl Backbone for Qwen3VlText {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let axes = &self.axes;
        let table = self.decoder.rotary().table_axes(&mrope_positions(batch), |k| axes.get(k).copied().unwrap_or(0));
        let Some(soft) = &batch.soft_tokens else {
            return self.decoder.forward_stacked(batch, &table, None, &[]);
        };
        // The tower's rows: the soft tokens' embeddings, then each DeepStack feature.
        let hidden = self.decoder.sizes().hidden;
        if soft.width()? != hidden * (1 + self.deepstack) {
            candle_core::bail!("soft tokens of width {} for {hidden} × (1 + {} DeepStack features)", soft.width()?, self.deepstack);
        }
        let embeddings = soft.columns(0, hidden)?;
        let stacked = (1..=self.deepstack).map(|k| soft.columns(k * hidden, hidden)).collect::<Result<Vec<_>>>()?;
        self.decoder.forward_stacked(batch, &table, Some(&embeddings), &stacked)
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

    #[test]
    fn interleaved_axes_cycle_through_the_sections_then_stay_temporal() {
        // Qwen3-VL's [24, 20, 20] over 64 pairs: T H W T H W … for 60 pairs, then T.
        let text = serde_json::json!({
            "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 0, "num_attention_heads": 1, "head_dim": 128,
            "intermediate_size": 8, "max_position_embeddings": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": true}
        });
        let vb = VarBuilder::from_tensors(
            [
                ("embed_tokens.weight".to_string(), Tensor::zeros((8, 8), DType::F32, &candle_core::Device::Cpu).unwrap()),
                ("norm.weight".to_string(), Tensor::ones(8, DType::F32, &candle_core::Device::Cpu).unwrap()),
            ]
            .into_iter()
            .collect(),
            DType::F32,
            &candle_core::Device::Cpu,
        );
        let model = Qwen3VlText::load(&text, 0, vb).unwrap();
        assert_eq!(&model.axes[..7], &[0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(&model.axes[57..], &[0, 1, 2, 0, 0, 0, 0]);
        assert_eq!(model.axes.iter().filter(|&&a| a == 1).count(), 20);
    }
}
