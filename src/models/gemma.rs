//! Gemma, Gemma 2 and Gemma 3 (text) decoders on the flat batch, as transformers' classes run
//! them:
//! - RMSNorm scaling by `1 + w` (folded into the weights at load);
//! - embeddings scaled by √hidden (rounded to the model's dtype, as transformers rounds it);
//! - GeGLU MLP (tanh GELU), grouped-query attention with rotary positions;
//! - Gemma 2 and 3: a norm after attention and after the MLP as well as before, attention
//!   scaled by `query_pre_attn_scalar^-½` (folded into the queries), and local (sliding-window)
//!   layers between global ones, by `layer_types` or the published pattern;
//! - Gemma 2: attention-score soft-capping, `cap · tanh(s / cap)`;
//! - Gemma 3: per-head q/k norms, a rotary base per layer type (`rope_parameters` keyed by
//!   layer type, or `rope_theta` + `rope_local_base_freq`), and, where the config sets
//!   `use_bidirectional_attention` (EmbeddingGemma), bidirectional attention whose local layers
//!   see `|i − j| ≤ sliding_window / 2`, transformers' reading of the published window.
//!
//! Gemma 2's final logit soft-cap belongs to the LM head, which pooling never runs: converted
//! rerankers read raw LM-head rows, as vLLM's conversion does. Gemma and Gemma 2 configs asking
//! for bidirectional attention are refused: transformers' own masks for them disagree between
//! padded and unpadded batches, so there is no reference to match.

use super::batch::Batch;
use super::head_weights::{ClassifierWeights, LmHeadWeights, RerankTemplate};
use super::llama::{causal_lm_head, decoder_root, fused_gate_up, fused_qkv, grouped_heads, last_token_classifier, qkv_parts, rope_of};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError, SequencePooling};
use crate::kernels::{host_f32, Activation, Attention, AttentionMask, GatedActivation, Linear, QkNorm, RmsNorm, Rotary};
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::{json, Value};

pub static GEMMA: GemmaVersion = GemmaVersion::Gemma;
pub static GEMMA2: GemmaVersion = GemmaVersion::Gemma2;
pub static GEMMA3: GemmaVersion = GemmaVersion::Gemma3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmaVersion {
    Gemma,
    Gemma2,
    Gemma3,
}

impl Architecture for GemmaVersion {
    fn name(&self) -> &'static str {
        match self {
            GemmaVersion::Gemma => "Gemma",
            GemmaVersion::Gemma2 => "Gemma2",
            GemmaVersion::Gemma3 => "Gemma3Text",
        }
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        match self {
            GemmaVersion::Gemma => &["Gemma"],
            GemmaVersion::Gemma2 => &["Gemma2"],
            // `Gemma3ForCausalLM` (text-only checkpoints) and `Gemma3TextModel` (EmbeddingGemma).
            GemmaVersion::Gemma3 => &["Gemma3Text", "Gemma3"],
        }
    }

    fn model_types(&self) -> &'static [&'static str] {
        match self {
            GemmaVersion::Gemma => &["gemma"],
            GemmaVersion::Gemma2 => &["gemma2"],
            GemmaVersion::Gemma3 => &["gemma3_text"],
        }
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(Gemma::load(raw, *self, vb)?))
    }

    fn classifier(
        &self,
        raw: &Value,
        vb: VarBuilder,
        num_labels: usize,
        from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        last_token_classifier(raw, vb, num_labels, from_tokens)
    }

    fn lm_head(&self, config: &Value, vb: VarBuilder) -> std::result::Result<LmHeadWeights, ModelError> {
        causal_lm_head(config, vb)
    }

    /// A Gemma causal LM read at its "Yes" token is BAAI/bge-reranker-v2-gemma, served as vLLM
    /// serves it (`--hf-overrides '{"architectures": ["GemmaForSequenceClassification"],
    /// "classifier_from_token": ["Yes"], "method": "no_post_processing"}'`): its pairs are
    /// wrapped in FlagEmbedding's prompt.
    fn rerank_template(&self, config: &Value, num_labels: usize) -> Option<RerankTemplate> {
        let reads_yes = config.get("classifier_from_token").and_then(Value::as_array).is_some_and(|t| t.len() == 1 && t[0] == "Yes");
        (*self == GemmaVersion::Gemma && num_labels == 1 && reads_yes).then(RerankTemplate::bge_reranker_gemma)
    }
}

/// The fields of a Gemma `config.json` the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
struct GemmaConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    intermediate_size: usize,
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default)]
    hidden_activation: Option<String>,
    #[serde(default)]
    hidden_act: Option<String>,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    sliding_window_pattern: Option<usize>,
    #[serde(default)]
    attn_logit_softcapping: Option<f32>,
    #[serde(default)]
    use_bidirectional_attention: Option<bool>,
}

fn default_eps() -> f64 {
    1e-6
}

impl GemmaConfig {
    /// The activation: `hidden_activation`, else `hidden_act`; Gemma's legacy `"gelu"` is the
    /// tanh approximation, as transformers reads it.
    fn activation(&self) -> std::result::Result<Activation, ModelError> {
        let name = self.hidden_activation.as_deref().or(self.hidden_act.as_deref()).unwrap_or("gelu_pytorch_tanh");
        let name = if name == "gelu" { "gelu_pytorch_tanh" } else { name };
        Activation::from_config(name).ok_or_else(|| ModelError::Config(format!("hidden activation `{name}` is not supported")))
    }

    /// Whether layer `i` is local (sliding-window): `layer_types`, else Gemma 2's alternation
    /// (even layers local) or Gemma 3's pattern (every `sliding_window_pattern`-th layer
    /// global, 6 by default); Gemma's layers are all global.
    fn is_local(&self, version: GemmaVersion, i: usize) -> bool {
        if self.sliding_window.is_none() {
            return false;
        }
        if let Some(types) = &self.layer_types {
            return types.get(i).is_some_and(|t| t == "sliding_attention");
        }
        match version {
            GemmaVersion::Gemma => false,
            GemmaVersion::Gemma2 => !(i + 1).is_multiple_of(2),
            GemmaVersion::Gemma3 => !(i + 1).is_multiple_of(self.sliding_window_pattern.unwrap_or(6).max(1)),
        }
    }
}

/// The config a layer type's rotary frequencies come from, for [`rope_of`]: Gemma 3's
/// `rope_parameters` keyed by layer type (transformers 5), or `rope_theta` / `rope_scaling` for
/// global layers and `rope_local_base_freq` for local ones (earlier); other versions have one.
fn rope_config(raw: &Value, version: GemmaVersion, local: bool) -> Value {
    let nested = raw.get("rope_parameters").filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
    if let Some(params) = nested {
        let key = if local { "sliding_attention" } else { "full_attention" };
        return json!({ "rope_parameters": params.get(key).cloned().unwrap_or(json!({})) });
    }
    if version == GemmaVersion::Gemma3 && local {
        return json!({ "rope_theta": raw.get("rope_local_base_freq").and_then(Value::as_f64).unwrap_or(10_000.0) });
    }
    let mut global = json!({ "rope_theta": raw.get("rope_theta").and_then(Value::as_f64).unwrap_or(if version == GemmaVersion::Gemma3 { 1_000_000.0 } else { 10_000.0 }) });
    for key in ["rope_parameters", "rope_scaling"] {
        if let Some(params) = raw.get(key).filter(|v| v.is_object()) {
            global[key] = params.clone();
        }
    }
    global
}

struct Layer {
    input_norm: RmsNorm,
    qkv: Linear,
    qk_norm: Option<QkNorm>,
    o_proj: Linear,
    /// Gemma 2 and 3: the norm of the attention's output, before the residual.
    post_attention_norm: Option<RmsNorm>,
    /// The norm before the MLP (Gemma's `post_attention_layernorm`, later `pre_feedforward_layernorm`).
    pre_mlp_norm: RmsNorm,
    /// Gemma 2 and 3: the norm of the MLP's output, before the residual.
    post_mlp_norm: Option<RmsNorm>,
    gate_up: Linear,
    down: Linear,
    local: bool,
}

pub struct Gemma {
    embed_tokens: Tensor,
    /// √hidden in the model's dtype.
    embed_scale: f64,
    layers: Vec<Layer>,
    norm: RmsNorm,
    global_rotary: Rotary,
    local_rotary: Rotary,
    gated: GatedActivation,
    global_mask: AttentionMask,
    local_mask: AttentionMask,
    softcap: Option<f32>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    hidden_size: usize,
    vocab_size: usize,
    max_positions: usize,
}

/// A Gemma RMSNorm: its stored `w` scales by `1 + w`, computed in f32 as transformers does.
fn gemma_norm(vb: VarBuilder, size: usize, eps: f64) -> Result<RmsNorm> {
    RmsNorm::new((vb.get(size, "weight")?.to_dtype(DType::F32)? + 1.0)?, eps)
}

impl Gemma {
    /// PaliGemma's language model (ColPali): Gemma 1 attending over the whole sequence, as
    /// PaliGemma runs its prefix (`token_type_ids` all 0: one bidirectional block), image soft
    /// tokens in place of `<image>` ([`Batch::soft_tokens`]). PaliGemma counts positions from 1
    /// where we count from 0; rotary scores depend only on the distance between two positions,
    /// so the outputs are the same.
    pub(super) fn load_prefix_lm(raw: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("gemma");
        if model_type != "gemma" {
            return Err(ModelError::Config(format!(
                "a PaliGemma language model of type `{model_type}` is not supported (Gemma 1 only: ColPali v1.x)"
            )));
        }
        let mut raw = raw.clone();
        if let Some(config) = raw.as_object_mut() {
            config.remove("use_bidirectional_attention");
        }
        let mut gemma = Self::load(&raw, GemmaVersion::Gemma, vb)?;
        gemma.global_mask = AttentionMask::Bidirectional;
        Ok(gemma)
    }

    fn load(raw: &Value, version: GemmaVersion, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        if raw.get("text_config").is_some() {
            return Err(ModelError::Config(
                "Gemma 3 image-text checkpoints are not supported; serve the text model (Gemma3ForCausalLM / Gemma3TextModel)".into(),
            ));
        }
        let config: GemmaConfig = parse_config(raw)?;
        let bidirectional = config.use_bidirectional_attention.unwrap_or(false);
        if bidirectional && version != GemmaVersion::Gemma3 {
            return Err(ModelError::Config(format!("use_bidirectional_attention is supported for Gemma 3 only, not {}", version.name())));
        }
        let activation = config.activation()?;
        let h = config.hidden_size;
        let (heads, kv_heads, head_dim) = grouped_heads(config.num_attention_heads, config.num_key_value_heads, config.head_dim, h)?;
        let (global_rotary, max_positions) = rope_of(&rope_config(raw, version, false), head_dim, config.max_position_embeddings)?;
        let (local_rotary, _) = rope_of(&rope_config(raw, version, true), head_dim, config.max_position_embeddings)?;
        // The attention kernel scales by head_dim^-½; Gemma 2 and 3 by query_pre_attn_scalar^-½.
        let query_scale = match (version, config.query_pre_attn_scalar) {
            (GemmaVersion::Gemma, _) | (_, None) => 1.0,
            (_, Some(scalar)) => (head_dim as f64 / scalar).sqrt(),
        };
        let eps = config.rms_norm_eps;
        let vb = decoder_root(vb);
        let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("layers.{i}"));
            let at = lv.pp("self_attn");
            let (mut qkv_weight, mut qkv_bias) = fused_qkv(&at, h, q_out, kv_out, config.attention_bias)?;
            // LoRA names Q/K/V only where their weights are the checkpoint's: Gemma 1 and 2
            // fold the query scale into the query rows below, which an adapter's addition lacks.
            let mut qkv_names = Some(qkv_parts(&at, q_out, kv_out));
            let qk_norm = if version == GemmaVersion::Gemma3 {
                let norm = |name: &str, scale: f64| -> Result<Vec<f32>> {
                    host_f32(&((at.pp(name).get(head_dim, "weight")?.to_dtype(DType::F32)? + 1.0)? * scale)?)
                };
                // The queries' scale goes into their norm, which the rotation follows.
                Some(QkNorm { q: norm("q_norm", query_scale)?, k: norm("k_norm", 1.0)?, eps: eps as f32 })
            } else {
                if query_scale != 1.0 {
                    qkv_names = None;
                    qkv_weight = scale_rows(&qkv_weight, q_out, query_scale)?;
                    qkv_bias = qkv_bias.map(|b| scale_rows(&b, q_out, query_scale)).transpose()?;
                }
                None
            };
            let o_bias = if config.attention_bias { Some(at.pp("o_proj").get(h, "bias")?) } else { None };
            let later = version != GemmaVersion::Gemma;
            let mlp = lv.pp("mlp");
            let inter = config.intermediate_size;
            layers.push(Layer {
                input_norm: gemma_norm(lv.pp("input_layernorm"), h, eps)?,
                qkv: match &qkv_names {
                    Some(names) => Linear::new(qkv_weight, qkv_bias)?.named_parts(names),
                    None => Linear::new(qkv_weight, qkv_bias)?,
                },
                qk_norm,
                o_proj: Linear::new(at.pp("o_proj").get((h, q_out), "weight")?, o_bias)?.named(&at.pp("o_proj").prefix()),
                post_attention_norm: later.then(|| gemma_norm(lv.pp("post_attention_layernorm"), h, eps)).transpose()?,
                pre_mlp_norm: gemma_norm(lv.pp(if later { "pre_feedforward_layernorm" } else { "post_attention_layernorm" }), h, eps)?,
                post_mlp_norm: later.then(|| gemma_norm(lv.pp("post_feedforward_layernorm"), h, eps)).transpose()?,
                gate_up: fused_gate_up(&mlp, h, inter, false)?,
                down: Linear::new(mlp.pp("down_proj").get((h, inter), "weight")?, None)?.named(&mlp.pp("down_proj").prefix()),
                local: config.is_local(version, i),
            });
        }
        let embed_tokens = vb.get((config.vocab_size, h), "embed_tokens.weight")?;
        // transformers multiplies by √hidden cast to the weights' dtype.
        let embed_scale = Tensor::new((h as f64).sqrt() as f32, &candle_core::Device::Cpu)?
            .to_dtype(embed_tokens.dtype())?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        let window = config.sliding_window.unwrap_or(usize::MAX);
        Ok(Self {
            embed_tokens,
            embed_scale,
            norm: gemma_norm(vb.pp("norm"), h, eps)?,
            global_rotary,
            local_rotary,
            gated: GatedActivation { activation, act_on_first: true },
            global_mask: if bidirectional { AttentionMask::Bidirectional } else { AttentionMask::Causal },
            // transformers keeps `window // 2 + 1` as an exclusive bound for bidirectional
            // layers: |i − j| < window/2 + 1.
            local_mask: if bidirectional { AttentionMask::Window(window / 2) } else { AttentionMask::CausalWindow(window) },
            softcap: if version == GemmaVersion::Gemma2 { config.attn_logit_softcapping } else { None },
            layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            hidden_size: h,
            vocab_size: config.vocab_size,
            max_positions,
        })
    }
}

/// `t` with its first `rows` rows (a weight's query outputs, or a bias's) multiplied by `scale`.
fn scale_rows(t: &Tensor, rows: usize, scale: f64) -> Result<Tensor> {
    let total = t.dim(0)?;
    Tensor::cat(&[(t.narrow(0, 0, rows)? * scale)?, t.narrow(0, rows, total - rows)?], 0)
}

impl Backbone for Gemma {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.embed_tokens.device();
        let ids = Tensor::from_slice(&batch.input_ids, batch.num_tokens(), device)?;
        let mut hidden = (self.embed_tokens.index_select(&ids, 0)? * self.embed_scale)?;
        // Image soft tokens (PaliGemma's) stand in for their placeholders, unscaled.
        if let Some(soft) = &batch.soft_tokens {
            hidden = soft.replace(&hidden)?;
        }
        let global_table = self.global_rotary.table_for_sequences(&batch.cu_seqlens);
        let local_table = self.local_rotary.table_for_sequences(&batch.cu_seqlens);
        let attention = |mask| Attention {
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            cu_seqlens: &batch.cu_seqlens,
            mask,
            position_bias: None,
            disentangled: None,
            softcap: self.softcap,
        };
        let (global, local) = (attention(self.global_mask), attention(self.local_mask));
        for layer in &self.layers {
            let (table, attention) = if layer.local { (&local_table, &local) } else { (&global_table, &global) };
            let qkv = layer.qkv.forward(&layer.input_norm.forward(&hidden)?)?;
            let qkv = table.apply(&qkv, self.num_heads, self.num_kv_heads, layer.qk_norm.as_ref())?;
            let attended = attention.forward(&qkv, None)?;
            hidden = match &layer.post_attention_norm {
                Some(norm) => (&hidden + norm.forward(&layer.o_proj.forward(&attended)?)?)?,
                None => layer.o_proj.forward_add(&attended, &hidden)?,
            };
            let inner = self.gated.forward(&layer.gate_up.forward(&layer.pre_mlp_norm.forward(&hidden)?)?)?;
            hidden = match &layer.post_mlp_norm {
                Some(norm) => (&hidden + norm.forward(&layer.down.forward(&inner)?)?)?,
                None => layer.down.forward_add(&inner, &hidden)?,
            };
        }
        self.norm.forward(&hidden)
    }

    fn sizes(&self) -> BackboneSizes {
        BackboneSizes { hidden: self.hidden_size, vocab: self.vocab_size, max_positions: self.max_positions }
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().flat_map(|l| [&mut l.o_proj, &mut l.gate_up, &mut l.down]).collect()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}
