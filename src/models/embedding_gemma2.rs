//! EmbeddingGemma 2's text encoder (`EmbeddingGemma2TextModel`, and the `language_model` of the
//! multimodal `EmbeddingGemma2Model` folder, served for text), as transformers 5.24's
//! `modeling_embedding_gemma2.py` runs it:
//! - bidirectional attention on every layer; `sliding_attention` layers see `|i − j| ≤
//!   sliding_window` (the config's value is already the radius, unlike EmbeddingGemma-300m's);
//! - RMSNorm scaling by `w` (Gemma 4's, not `1 + w`); per-head q/k norms with weights, a
//!   weightless per-head norm of the values, and no attention scale (`scaling = 1`: the
//!   kernel's `head_dim^-½` is undone in the query norm);
//! - per-layer head shapes: full-attention layers are wider (`per_layer_config`: their
//!   `head_dim` and key/value heads), each layer type with its own rotary base;
//! - projection-only per-layer embeddings (PLE): `norm(W·x / √hidden)` split into one slice per
//!   layer, mixed in after each layer's MLP as `x + norm(P · (gelu(G·x) ⊙ slice))`, then the
//!   layer's `layer_scalar`;
//! - the final norm, then `embedding_projection` to `embedding_dim`, which is what the
//!   published sentence-transformers folder mean-pools and normalizes.
//!
//! The multimodal folder's image tower ([`super::gemma4_vision`]) is its
//! [`SoftTokenTower`]: an image is `<|image> soft tokens <image|>` in the text, and its soft
//! tokens replace the placeholders' embeddings before the PLE and the first layer. Its audio
//! tower ([`super::gemma4_audio`]) is its [`AudioTokenTower`] the same way, with `<|audio>
//! soft tokens <audio|>`. Video inputs are not served yet.

use super::batch::Batch;
use super::gemma4_audio::{self, Gemma4Audio};
use super::gemma4_vision::{default_activation, default_eps, norm, Gemma4Vision, ImagePatches};
use super::llama::{decoder_root, fused_gate_up, fused_qkv, qkv_parts, rope_of};
use super::{
    parse_config, Architecture, AudioTokenTower, Backbone, BackboneSizes, ImageTokens, ModelError, SequencePooling, SoftTokenTower,
};
use crate::kernels::{host_f32, Activation, Attention, AttentionMask, GatedActivation, Linear, QkNorm, RmsNorm, Rotary};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::{json, Value};

pub struct EmbeddingGemma2;

pub static EMBEDDING_GEMMA2: EmbeddingGemma2 = EmbeddingGemma2;

impl Architecture for EmbeddingGemma2 {
    fn name(&self) -> &'static str {
        "EmbeddingGemma2"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["EmbeddingGemma2Text", "EmbeddingGemma2"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["embedding_gemma2_text", "embedding_gemma2"]
    }

    /// The published folder mean-pools (its sentence-transformers Pooling module); a bare
    /// folder pools the same way.
    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Mean
    }

    /// The multimodal folder's Gemma 4 vision tower and `embed_vision`, with the image and
    /// video token ids of its config.
    fn soft_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        let Some(vision) = raw.get("vision_config").filter(|c| c.is_object()) else { return Ok(None) };
        // EmbeddingGemma2Config's defaults.
        let tokens = ImageTokens {
            begin: token_id(raw, "boi_token_id", 255_999)?,
            placeholder: token_id(raw, "image_token_id", 258_880)?,
            end: token_id(raw, "eoi_token_id", 258_882)?,
        };
        let vb = if vb.contains_tensor("model.embed_vision.embedding_projection.weight") { vb.pp("model") } else { vb };
        let tower = Gemma4Vision::load(vision, vb.pp("vision_tower"), vb.pp("embed_vision"), text_hidden(raw))?;
        let video = token_id(raw, "video_token_id", 258_884)?;
        Ok(Some(Box::new(EmbeddingGemma2Vision { tower, tokens, video })))
    }

    /// The multimodal folder's Gemma 4 audio tower and `embed_audio`, with the audio token ids
    /// of its config (`eoa_token_index`, as EmbeddingGemma2Config names it).
    fn audio_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn AudioTokenTower>>, ModelError> {
        let Some(audio) = raw.get("audio_config").filter(|c| c.is_object()) else { return Ok(None) };
        let tokens = ImageTokens {
            begin: token_id(raw, "boa_token_id", 256_000)?,
            placeholder: token_id(raw, "audio_token_id", 258_881)?,
            end: token_id(raw, "eoa_token_index", 258_883)?,
        };
        let vb = if vb.contains_tensor("model.embed_audio.embedding_projection.weight") { vb.pp("model") } else { vb };
        let tower = Gemma4Audio::load(audio, vb.pp("audio_tower"), vb.pp("embed_audio"), text_hidden(raw))?;
        Ok(Some(Box::new(EmbeddingGemma2Audio { tower, tokens })))
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        // The multimodal folder nests the text encoder's config and weights.
        match raw.get("text_config").filter(|c| c.is_object()) {
            Some(text) => {
                let vb = if vb.contains_tensor("model.language_model.embed_tokens.weight") {
                    vb.pp("model.language_model")
                } else {
                    vb.pp("language_model")
                };
                Ok(Box::new(EmbeddingGemma2Text::load(text, vb)?))
            }
            None => Ok(Box::new(EmbeddingGemma2Text::load(raw, decoder_root(vb))?)),
        }
    }
}

/// The text encoder's width, which the towers' embedders map into.
fn text_hidden(raw: &Value) -> usize {
    raw.get("text_config").and_then(|t| t.get("hidden_size")).and_then(Value::as_u64).unwrap_or(512) as usize
}

/// A token id of the multimodal config, or its default there.
fn token_id(raw: &Value, name: &str, default: u32) -> std::result::Result<u32, ModelError> {
    match raw.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().map(|v| v as u32).ok_or_else(|| ModelError::Config(format!("{name} is not a token id: {v}"))),
    }
}

/// The audio side of the multimodal folder.
struct EmbeddingGemma2Audio {
    tower: Gemma4Audio,
    tokens: ImageTokens,
}

impl AudioTokenTower for EmbeddingGemma2Audio {
    fn forward(&self, audio: &[(&[f32], usize)]) -> Result<Tensor> {
        self.tower.forward(audio)
    }

    fn frames_per_token(&self) -> usize {
        gemma4_audio::FRAMES_PER_TOKEN
    }

    fn takes_mel_bins(&self, bins: usize) -> bool {
        self.tower.takes_mel_bins(bins)
    }

    fn audio_tokens(&self) -> ImageTokens {
        self.tokens
    }
}

/// The image side of the multimodal folder.
struct EmbeddingGemma2Vision {
    tower: Gemma4Vision,
    tokens: ImageTokens,
    /// `video_token_id`: video frames run through the same tower, their soft tokens in its
    /// places (`get_video_features`).
    video: u32,
}

impl SoftTokenTower for EmbeddingGemma2Vision {
    fn forward(&self, images: &[&ImagePatches]) -> Result<Tensor> {
        self.tower.forward(images)
    }

    fn patch_geometry(&self) -> (usize, usize) {
        (self.tower.patch_size, self.tower.pooling_kernel_size)
    }

    fn image_tokens(&self) -> ImageTokens {
        self.tokens
    }

    fn video_token(&self) -> Option<u32> {
        Some(self.video)
    }
}

/// The fields of an `embedding_gemma2_text` config the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
struct TextConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: usize,
    #[serde(default = "default_activation")]
    hidden_activation: String,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    attention_bias: bool,
    sliding_window: usize,
    layer_types: Vec<String>,
    hidden_size_per_layer_input: usize,
    embedding_dim: usize,
    /// Sparse per-layer overrides keyed by layer index (transformers' heterogeneous configs):
    /// the full-attention layers' `head_dim` and `num_key_value_heads`.
    #[serde(default)]
    per_layer_config: Option<Value>,
}

impl TextConfig {
    /// `per_layer_config` by layer index. transformers writes the keys zero-padded to the
    /// widest index ("05") and reads them as integers; only the overrides it derives for this
    /// model (`head_dim`, `num_key_value_heads`) are understood, anything else is refused.
    fn layer_overrides(&self) -> std::result::Result<Vec<Option<&Value>>, ModelError> {
        let mut by_layer = vec![None; self.num_hidden_layers];
        let Some(map) = self.per_layer_config.as_ref().filter(|v| !v.is_null()) else { return Ok(by_layer) };
        let map = map.as_object().ok_or_else(|| ModelError::Config("per_layer_config is not an object".into()))?;
        for (key, overrides) in map {
            let i = key.parse::<usize>().ok().filter(|&i| i < self.num_hidden_layers).ok_or_else(|| {
                ModelError::Config(format!("per_layer_config key `{key}` is not a layer index below {}", self.num_hidden_layers))
            })?;
            if let Some(other) = overrides.as_object().and_then(|o| o.keys().find(|k| *k != "head_dim" && *k != "num_key_value_heads")) {
                return Err(ModelError::Config(format!("per_layer_config.{key}.{other} is not supported")));
            }
            by_layer[i] = Some(overrides);
        }
        Ok(by_layer)
    }

    /// Every layer's `(key/value heads, head_dim)`: its override, else the config's.
    fn layer_heads(&self) -> std::result::Result<Vec<(usize, usize)>, ModelError> {
        let overrides = self.layer_overrides()?;
        let mut heads = Vec::with_capacity(self.num_hidden_layers);
        for (i, layer) in overrides.into_iter().enumerate() {
            let field = |name: &str, default: usize| -> std::result::Result<usize, ModelError> {
                match layer.and_then(|l| l.get(name)) {
                    None => Ok(default),
                    Some(v) => v
                        .as_u64()
                        .map(|v| v as usize)
                        .ok_or_else(|| ModelError::Config(format!("per_layer_config.{i}.{name} is not a count: {v}"))),
                }
            };
            let (kv_heads, head_dim) = (field("num_key_value_heads", self.num_key_value_heads)?, field("head_dim", self.head_dim)?);
            if kv_heads == 0 || !self.num_attention_heads.is_multiple_of(kv_heads) || head_dim == 0 || !head_dim.is_multiple_of(2) {
                return Err(ModelError::Config(format!(
                    "layer {i}: {} heads over {kv_heads} key/value heads of {head_dim} dims",
                    self.num_attention_heads
                )));
            }
            heads.push((kv_heads, head_dim));
        }
        Ok(heads)
    }
}

struct Layer {
    input_norm: RmsNorm,
    qkv: Linear,
    qk_norm: QkNorm,
    /// The values' weightless per-head norm.
    v_norm: RmsNorm,
    o_proj: Linear,
    post_attention_norm: RmsNorm,
    pre_mlp_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
    post_mlp_norm: RmsNorm,
    /// The PLE block: gate down to the per-layer width, projection back, norm.
    ple_gate: Linear,
    ple_projection: Linear,
    ple_norm: RmsNorm,
    /// `layer_scalar`, a checkpoint buffer (1 unless trained otherwise).
    scalar: f64,
    local: bool,
    num_kv_heads: usize,
    head_dim: usize,
}

pub struct EmbeddingGemma2Text {
    embed_tokens: Tensor,
    /// √hidden in the model's dtype.
    embed_scale: f64,
    /// `per_layer_model_projection`, with its `hidden^-½` scale folded into the weights.
    ple_projection: Linear,
    ple_norm: RmsNorm,
    ple_width: usize,
    layers: Vec<Layer>,
    norm: RmsNorm,
    embedding_projection: Linear,
    global_rotary: Rotary,
    local_rotary: Rotary,
    gated: GatedActivation,
    activation: Activation,
    window: usize,
    num_heads: usize,
    sizes: BackboneSizes,
}

/// The rotary frequencies of one layer type (`rope_parameters` keyed by layer type) for heads
/// of `head_dim`.
fn rotary_of(raw: &Value, layer_type: &str, head_dim: usize, max_positions: usize) -> std::result::Result<(Rotary, usize), ModelError> {
    let default_theta = if layer_type == "sliding_attention" { 10_000.0 } else { 1_000_000.0 };
    let params = raw
        .get("rope_parameters")
        .and_then(|p| p.get(layer_type))
        .cloned()
        .unwrap_or_else(|| json!({ "rope_type": "default", "rope_theta": default_theta }));
    rope_of(&json!({ "rope_parameters": params }), head_dim, max_positions)
}

impl EmbeddingGemma2Text {
    fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: TextConfig = parse_config(raw)?;
        let activation = Activation::from_config(&config.hidden_activation)
            .ok_or_else(|| ModelError::Config(format!("hidden activation `{}` is not supported", config.hidden_activation)))?;
        let (h, heads, layers_n, ple) =
            (config.hidden_size, config.num_attention_heads, config.num_hidden_layers, config.hidden_size_per_layer_input);
        if config.layer_types.len() != layers_n {
            return Err(ModelError::Config(format!("{} layer_types for {layers_n} layers", config.layer_types.len())));
        }
        if let Some(t) = config.layer_types.iter().find(|t| *t != "sliding_attention" && *t != "full_attention") {
            return Err(ModelError::Config(format!("layer type `{t}` is not supported")));
        }
        let eps = config.rms_norm_eps;
        let layer_heads = config.layer_heads()?;
        // One rotary table per layer type, so every layer of a type must share its head_dim (as
        // transformers requires of a layer type's config).
        let type_head_dim = |kind: &str| -> std::result::Result<usize, ModelError> {
            let mut dims = config.layer_types.iter().zip(&layer_heads).filter(|(t, _)| *t == kind).map(|(_, &(_, d))| d);
            let first = dims.next().unwrap_or(config.head_dim);
            match dims.find(|&d| d != first) {
                Some(other) => Err(ModelError::Config(format!("{kind} layers of head_dim {first} and {other}"))),
                None => Ok(first),
            }
        };
        let (global_rotary, max_positions) =
            rotary_of(raw, "full_attention", type_head_dim("full_attention")?, config.max_position_embeddings)?;
        let (local_rotary, _) = rotary_of(raw, "sliding_attention", type_head_dim("sliding_attention")?, config.max_position_embeddings)?;
        let device = vb.device().clone();
        let mut layers = Vec::with_capacity(layers_n);
        for (i, &(kv_heads, head_dim)) in layer_heads.iter().enumerate() {
            let lv = vb.pp(format!("layers.{i}"));
            let at = lv.pp("self_attn");
            let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
            let (qkv_weight, qkv_bias) = fused_qkv(&at, h, q_out, kv_out, config.attention_bias)?;
            let head_norm = |name: &str, scale: f64| -> Result<Vec<f32>> {
                host_f32(&(at.pp(name).get(head_dim, "weight")?.to_dtype(DType::F32)? * scale)?)
            };
            let o_bias = if config.attention_bias { Some(at.pp("o_proj").get(h, "bias")?) } else { None };
            let mlp = lv.pp("mlp");
            let ple_block = lv.pp("ple_block");
            let scalar = if lv.contains_tensor("layer_scalar") {
                lv.get(1, "layer_scalar")?.to_dtype(DType::F64)?.to_vec1::<f64>()?[0]
            } else {
                1.0
            };
            layers.push(Layer {
                input_norm: norm(lv.pp("input_layernorm"), h, eps)?,
                qkv: Linear::new(qkv_weight, qkv_bias)?.named_parts(&qkv_parts(&at, q_out, kv_out)),
                // The kernel scales scores by head_dim^-½; this model does not scale them.
                qk_norm: QkNorm { q: head_norm("q_norm", (head_dim as f64).sqrt())?, k: head_norm("k_norm", 1.0)?, eps: eps as f32 },
                v_norm: RmsNorm::new(Tensor::ones(head_dim, DType::F32, &device)?, eps)?,
                o_proj: Linear::new(at.pp("o_proj").get((h, q_out), "weight")?, o_bias)?.named(&at.pp("o_proj").prefix()),
                post_attention_norm: norm(lv.pp("post_attention_layernorm"), h, eps)?,
                pre_mlp_norm: norm(lv.pp("pre_feedforward_layernorm"), h, eps)?,
                gate_up: fused_gate_up(&mlp, h, config.intermediate_size, false)?,
                down: Linear::new(mlp.pp("down_proj").get((h, config.intermediate_size), "weight")?, None)?
                    .named(&mlp.pp("down_proj").prefix()),
                post_mlp_norm: norm(lv.pp("post_feedforward_layernorm"), h, eps)?,
                ple_gate: Linear::new(ple_block.pp("per_layer_input_gate").get((ple, h), "weight")?, None)?,
                ple_projection: Linear::new(ple_block.pp("per_layer_projection").get((h, ple), "weight")?, None)?,
                ple_norm: norm(ple_block.pp("post_per_layer_input_norm"), h, eps)?,
                scalar,
                local: config.layer_types[i] == "sliding_attention",
                num_kv_heads: kv_heads,
                head_dim,
            });
        }
        let embed_tokens = vb.get((config.vocab_size, h), "embed_tokens.weight")?;
        // transformers multiplies by √hidden cast to the weights' dtype.
        let embed_scale = Tensor::new((h as f64).sqrt() as f32, &candle_core::Device::Cpu)?
            .to_dtype(embed_tokens.dtype())?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        let ple_vb = vb.pp("ple");
        let ple_weight = (ple_vb.pp("per_layer_model_projection").get((layers_n * ple, h), "weight")? * (h as f64).powf(-0.5))?;
        Ok(Self {
            embed_tokens,
            embed_scale,
            ple_projection: Linear::new(ple_weight, None)?,
            ple_norm: norm(ple_vb.pp("per_layer_projection_norm"), ple, eps)?,
            ple_width: ple,
            layers,
            norm: norm(vb.pp("norm"), h, eps)?,
            embedding_projection: Linear::new(vb.pp("embedding_projection").get((config.embedding_dim, h), "weight")?, None)?,
            global_rotary,
            local_rotary,
            gated: GatedActivation { activation, act_on_first: true },
            activation,
            window: config.sliding_window,
            num_heads: heads,
            sizes: BackboneSizes { hidden: config.embedding_dim, vocab: config.vocab_size, max_positions },
        })
    }
}

impl Layer {
    /// `qkv` with each value head RMS-normalized (no weight), as a copy: for tensors the fused
    /// kernels do not take (on the CPU the heads are normalized in place).
    fn normalize_values(&self, qkv: &Tensor, num_heads: usize) -> Result<Tensor> {
        let tokens = qkv.dim(0)?;
        let qk_width = (num_heads + self.num_kv_heads) * self.head_dim;
        let v_width = self.num_kv_heads * self.head_dim;
        let values = qkv.narrow(1, qk_width, v_width)?.contiguous()?.reshape((tokens * self.num_kv_heads, self.head_dim))?;
        let values = self.v_norm.forward(&values)?.reshape((tokens, v_width))?;
        Tensor::cat(&[&qkv.narrow(1, 0, qk_width)?, &values], 1)
    }
}

impl Backbone for EmbeddingGemma2Text {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.embed_tokens.device();
        let tokens = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, tokens, device)?;
        let mut hidden = (self.embed_tokens.index_select(&ids, 0)? * self.embed_scale)?;
        // Image soft tokens stand in for their placeholders, unscaled; PLE sees them too.
        if let Some(soft) = &batch.soft_tokens {
            hidden = soft.replace(&hidden)?;
        }
        // Every layer's PLE slice, `[tokens, layers, width]`, from the embeddings alone.
        let layers_n = self.layers.len();
        let per_layer = self.ple_projection.forward(&hidden)?.reshape((tokens * layers_n, self.ple_width))?;
        let per_layer = self.ple_norm.forward(&per_layer)?.reshape((tokens, layers_n, self.ple_width))?;
        let global_table = self.global_rotary.table_for_sequences(&batch.cu_seqlens);
        let local_table = self.local_rotary.table_for_sequences(&batch.cu_seqlens);
        for (i, layer) in self.layers.iter().enumerate() {
            let (table, mask) = if layer.local {
                (&local_table, AttentionMask::Window(self.window))
            } else {
                (&global_table, AttentionMask::Bidirectional)
            };
            let attention = Attention {
                num_heads: self.num_heads,
                num_kv_heads: layer.num_kv_heads,
                head_dim: layer.head_dim,
                cu_seqlens: &batch.cu_seqlens,
                mask,
                position_bias: None,
                disentangled: None,
                softcap: None,
            };
            let qkv = layer.qkv.forward(&layer.input_norm.forward(&hidden)?)?;
            let qkv = table.apply(&qkv, self.num_heads, layer.num_kv_heads, Some(&layer.qk_norm))?;
            let values_at = (self.num_heads + layer.num_kv_heads) * layer.head_dim;
            let qkv = match layer.v_norm.forward_heads_in_place(&qkv, values_at, layer.num_kv_heads)? {
                true => qkv,
                false => layer.normalize_values(&qkv, self.num_heads)?,
            };
            let attended = attention.forward(&qkv, None)?;
            hidden = (&hidden + layer.post_attention_norm.forward(&layer.o_proj.forward(&attended)?)?)?;
            let inner = self.gated.forward(&layer.gate_up.forward(&layer.pre_mlp_norm.forward(&hidden)?)?)?;
            hidden = (&hidden + layer.post_mlp_norm.forward(&layer.down.forward(&inner)?)?)?;
            let slice = per_layer.narrow(1, i, 1)?.squeeze(1)?.contiguous()?;
            let gated = (self.activation.forward(&layer.ple_gate.forward(&hidden)?)? * slice)?;
            hidden = (&hidden + layer.ple_norm.forward(&layer.ple_projection.forward(&gated)?)?)?;
            if layer.scalar != 1.0 {
                hidden = (hidden * layer.scalar)?;
            }
        }
        self.embedding_projection.forward(&self.norm.forward(&hidden)?)
    }

    fn sizes(&self) -> BackboneSizes {
        self.sizes
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().flat_map(|l| [&mut l.o_proj, &mut l.gate_up, &mut l.down]).collect()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(per_layer: Value) -> TextConfig {
        parse_config(&json!({
            "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 12,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 16,
            "sliding_window": 2, "layer_types": vec!["full_attention"; 12], "hidden_size_per_layer_input": 4,
            "embedding_dim": 8, "per_layer_config": per_layer,
        }))
        .unwrap()
    }

    #[test]
    fn per_layer_keys_are_read_as_indices_zero_padded_or_not() {
        // transformers pads the keys to the widest index: "05" beside "11".
        let heads = config(json!({"05": {"head_dim": 8, "num_key_value_heads": 1}, "11": {"head_dim": 8}})).layer_heads().unwrap();
        assert_eq!(heads[5], (1, 8));
        assert_eq!(heads[11], (2, 8));
        assert_eq!(heads[0], (2, 4));
        let heads = config(json!({"3": {"num_key_value_heads": 4}})).layer_heads().unwrap();
        assert_eq!(heads[3], (4, 4));
    }

    #[test]
    fn unknown_per_layer_overrides_are_refused() {
        let refused = |v: Value| match config(v).layer_heads() {
            Err(ModelError::Config(message)) => message,
            other => panic!("accepted: {:?}", other.ok()),
        };
        assert!(refused(json!({"12": {"head_dim": 8}})).contains("not a layer index below 12"));
        assert!(refused(json!({"x": {}})).contains("`x`"));
        assert!(refused(json!({"2": {"intermediate_size": 8}})).contains("per_layer_config.2.intermediate_size is not supported"));
        assert!(refused(json!({"2": {"num_key_value_heads": 3}})).contains("layer 2: 4 heads over 3"));
    }
}
