//! Llama and Mistral, and the pre-norm decoder they share with Qwen2/3: RMSNorm, rotary
//! positions (with the scalings their configs carry: `linear`, `dynamic`, `yarn`, `llama3`),
//! grouped-query causal attention (Mistral's within a sliding window), SwiGLU MLP.
//!
//! Every sequence starts at position 0 at its first token, so left or right padding in the
//! client's tokenizer cannot matter: there is no padding. Q, K and V are fused into one
//! projection and gate/up into another at load time.
//!
//! Decoders embed with their last token (the EOS the published tokenizer appends, e.g.
//! e5-mistral's), classify with `*ForSequenceClassification`'s `score` on the rightmost
//! non-padding token, and, converted with `classifier_from_token`, read rows of the LM head.

use super::batch::{Batch, SoftTokens};
use super::head_weights::{on_host, ClassifierWeights, HeadInput, LmHeadWeights};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError, SequencePooling};
use crate::kernels::{
    host_f32, Activation, Attention, AttentionMask, GatedActivation, Linear, QkNorm, RmsNorm, RopeScaling, Rotary, RotaryTable,
};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub static LLAMA: LlamaFamily = LlamaFamily::Llama;
pub static MISTRAL: LlamaFamily = LlamaFamily::Mistral;
pub static LLAMA_BIDIRECTIONAL: LlamaFamily = LlamaFamily::LlamaBidirectional;
pub static GRITLM: LlamaFamily = LlamaFamily::GritLm;

/// Llama, Mistral (Llama with a sliding attention window), NVIDIA's LlamaBidirectional
/// (llama-nemotron-embed, the nv-embedqa / nv-rerankqa models: Llama attending both ways,
/// pooled as its config's `pooling` says), or GritLM as vLLM serves it for embeddings
/// (parasail-ai/GritLM-7B-vllm: a `mistral` config named `GritLM`, attending both ways with no
/// sliding window, its mean skipping the instruction: [`Architecture::embeds_after_instruction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlamaFamily {
    Llama,
    Mistral,
    LlamaBidirectional,
    GritLm,
}

/// How NVIDIA's `LlamaBidirectionalConfig` pools: its `pooling` field (`avg` by default), as
/// vLLM maps it (`avg` → MEAN, `cls` → CLS, `last` → LAST); anything else (the published
/// code's `weighted_avg`) is refused as vLLM refuses it.
fn nemotron_pooling(raw: &Value) -> std::result::Result<SequencePooling, ModelError> {
    match raw.get("pooling").and_then(Value::as_str).unwrap_or("avg") {
        "avg" => Ok(SequencePooling::Mean),
        "cls" => Ok(SequencePooling::First),
        "last" => Ok(SequencePooling::Last),
        other => Err(ModelError::Config(format!("pool_type {other:?} not supported (avg, cls or last)"))),
    }
}

impl Architecture for LlamaFamily {
    fn name(&self) -> &'static str {
        match self {
            LlamaFamily::Llama => "Llama",
            LlamaFamily::Mistral => "Mistral",
            LlamaFamily::LlamaBidirectional => "LlamaBidirectional",
            LlamaFamily::GritLm => "GritLM",
        }
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        match self {
            LlamaFamily::Llama => &["Llama"],
            LlamaFamily::Mistral => &["Mistral"],
            LlamaFamily::LlamaBidirectional => &["LlamaBidirectional"],
            LlamaFamily::GritLm => &["GritLM"],
        }
    }

    fn model_types(&self) -> &'static [&'static str] {
        match self {
            LlamaFamily::Llama => &["llama"],
            LlamaFamily::Mistral => &["mistral"],
            LlamaFamily::LlamaBidirectional => &["llama_bidirec"],
            // Its config says `mistral`: only its architecture name tells it apart.
            LlamaFamily::GritLm => &[],
        }
    }

    /// The last token, but for the configs that attend both ways: NVIDIA's pool as their
    /// `pooling` says, and a plain Llama/Mistral with `use_bidirectional_attention` averages.
    fn default_pooling(&self, config: &Value) -> SequencePooling {
        match self {
            LlamaFamily::LlamaBidirectional => nemotron_pooling(config).unwrap_or(SequencePooling::Mean),
            LlamaFamily::GritLm => SequencePooling::Mean,
            _ if parse_config::<DecoderConfig>(config).is_ok_and(|c| c.bidirectional()) => SequencePooling::Mean,
            _ => SequencePooling::Last,
        }
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: DecoderConfig = parse_config(raw)?;
        let layout = DecoderLayout {
            qkv_bias: config.attention_bias.unwrap_or(false),
            mlp_bias: config.mlp_bias,
            qk_norm: false,
            // Llama has no window; Mistral's is `sliding_window` (null in v0.2 and later);
            // GritLM's embedding mode drops it, as vLLM does.
            sliding_window: match self {
                LlamaFamily::Llama | LlamaFamily::LlamaBidirectional | LlamaFamily::GritLm => None,
                LlamaFamily::Mistral => config.sliding_window,
            },
        };
        let decoder = Decoder::load(raw, layout, vb)?;
        Ok(Box::new(match self {
            LlamaFamily::LlamaBidirectional => {
                nemotron_pooling(raw)?;
                decoder.into_bidirectional()
            }
            LlamaFamily::GritLm => decoder.into_bidirectional(),
            _ => decoder,
        }))
    }

    fn classifier(
        &self,
        raw: &Value,
        vb: VarBuilder,
        num_labels: usize,
        from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        if *self == LlamaFamily::LlamaBidirectional && from_tokens.is_none() {
            return nemotron_classifier(raw, vb, num_labels);
        }
        last_token_classifier(raw, vb, num_labels, from_tokens)
    }

    fn lm_head(&self, config: &Value, vb: VarBuilder) -> std::result::Result<LmHeadWeights, ModelError> {
        match self {
            LlamaFamily::GritLm => {
                Err(ModelError::NoHead("GritLM is served as an embedder (attending both ways); its generative mode is not".into()))
            }
            _ => causal_lm_head(config, vb),
        }
    }

    fn embeds_after_instruction(&self) -> bool {
        *self == LlamaFamily::GritLm
    }
}

/// `LlamaBidirectionalForSequenceClassification` (the nv-rerankqa models): `score` (no bias) on
/// the sequence pooled as the config's `pooling` says, divided by its `temperature`, as the
/// published `llama_bidirectional_model.py` computes it. vLLM's adapter leaves `temperature`
/// out; the published checkpoints keep it at 1, where both agree.
fn nemotron_classifier(raw: &Value, vb: VarBuilder, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
    let h = parse_config::<DecoderConfig>(raw)?.hidden_size;
    let temperature = raw.get("temperature").and_then(Value::as_f64).unwrap_or(1.0);
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(ModelError::Config(format!("temperature {temperature} must be positive")));
    }
    let input = match nemotron_pooling(raw)? {
        SequencePooling::Mean => HeadInput::Mean,
        SequencePooling::First => HeadInput::First,
        SequencePooling::Last => HeadInput::Last,
    };
    let weight = (on_host(vb.pp("score").get((num_labels, h), "weight")?)? / temperature)?;
    Ok(ClassifierWeights { pre: None, classifier: Linear::new(weight, None)?, input, pre_on_tokens: false })
}

/// The fields of a decoder's `config.json` (Llama, Mistral, Qwen2/3) the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub struct DecoderConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    pub intermediate_size: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Every token attends to its whole sequence (TEI's switch for Llama, Mistral and Qwen3:
    /// voyage-4-nano's and pplx-embed's configs set it).
    #[serde(default)]
    pub use_bidirectional_attention: bool,
    /// `false`: bidirectional (the field vLLM sets on the configs of its bidirectional models).
    #[serde(default)]
    pub is_causal: Option<bool>,
}

fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}

impl DecoderConfig {
    /// Whether the config asks for attention over the whole sequence.
    pub fn bidirectional(&self) -> bool {
        self.use_bidirectional_attention || self.is_causal == Some(false)
    }

    /// `(query heads, key/value heads, head_dim)`, checked to group evenly.
    pub fn heads(&self) -> std::result::Result<(usize, usize, usize), ModelError> {
        grouped_heads(self.num_attention_heads, self.num_key_value_heads, self.head_dim, self.hidden_size)
    }
}

/// `(query heads, key/value heads, head_dim)` of a config (key/value heads default to the query
/// heads, head_dim to hidden / heads), checked to group evenly into rotatable heads.
pub fn grouped_heads(
    heads: usize,
    kv_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden: usize,
) -> std::result::Result<(usize, usize, usize), ModelError> {
    let kv_heads = kv_heads.unwrap_or(heads);
    let head_dim = head_dim.unwrap_or(hidden / heads.max(1));
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || !head_dim.is_multiple_of(2) {
        return Err(ModelError::Config(format!("{heads} heads over {kv_heads} key/value heads of {head_dim} dims")));
    }
    Ok((heads, kv_heads, head_dim))
}

/// What varies between the decoders built on [`Decoder`].
#[derive(Debug, Clone, Copy)]
pub struct DecoderLayout {
    /// Biases on q/k/v (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Biases on the MLP's projections (Llama with `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm of queries and keys before the rotation (Qwen3).
    pub qk_norm: bool,
    /// Each token attends to the last `w` tokens, itself included (Mistral).
    pub sliding_window: Option<usize>,
}

/// The rotary frequencies a decoder's config asks for, and the longest sequence they serve:
/// `max_position_embeddings`, stretched by the factor of a `linear` or `dynamic` scaling, or
/// YaRN's `original_max_position_embeddings × factor` (as vLLM derives its max_model_len).
/// `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (earlier).
pub fn rope_of(raw: &Value, head_dim: usize, max_positions: usize) -> std::result::Result<(Rotary, usize), ModelError> {
    rope_with_default_theta(raw, head_dim, max_positions, 10_000.0)
}

/// [`rope_of`] for a family whose config class defaults `rope_theta` to another base (LFM2's
/// 1e6) when the file names none.
pub fn rope_with_default_theta(
    raw: &Value,
    head_dim: usize,
    max_positions: usize,
    default_theta: f64,
) -> std::result::Result<(Rotary, usize), ModelError> {
    let params = raw.get("rope_parameters").or_else(|| raw.get("rope_scaling")).filter(|v| v.is_object());
    let field = |name: &str| params.and_then(|p| p.get(name)).and_then(Value::as_f64);
    let theta = field("rope_theta").or_else(|| raw.get("rope_theta").and_then(Value::as_f64)).unwrap_or(default_theta);
    if field("partial_rotary_factor").is_some_and(|f| f != 1.0) {
        return Err(ModelError::Config("partial_rotary_factor is not supported".into()));
    }
    let kind = params.and_then(|p| p.get("rope_type").or_else(|| p.get("type"))).and_then(Value::as_str).unwrap_or("default");
    let required = |name: &str| field(name).ok_or_else(|| ModelError::Config(format!("rope_type `{kind}` needs `{name}`")));
    let original = field("original_max_position_embeddings").map(|v| v as usize);
    let (scaling, longest) = match kind {
        "default" => (RopeScaling::Default, max_positions),
        "linear" => {
            let factor = required("factor")?;
            (RopeScaling::Linear { factor }, (max_positions as f64 * factor) as usize)
        }
        // Alibaba GTE's fixed NTK (gte-multilingual-base, gte-*-en-v1.5).
        "ntk" => (RopeScaling::Ntk { factor: required("factor")?, mixed_b: field("mixed_b") }, max_positions),
        "dynamic" => {
            let factor = required("factor")?;
            (RopeScaling::Dynamic { factor, max_positions }, (max_positions as f64 * factor) as usize)
        }
        "llama3" => {
            let scaling = RopeScaling::Llama3 {
                factor: required("factor")?,
                low_freq_factor: required("low_freq_factor")?,
                high_freq_factor: required("high_freq_factor")?,
                original_max_positions: original.unwrap_or(max_positions),
            };
            (scaling, max_positions)
        }
        "yarn" => {
            let original_max_positions =
                original.ok_or_else(|| ModelError::Config("rope_type `yarn` needs `original_max_position_embeddings`".into()))?;
            let factor = field("factor").unwrap_or(max_positions as f64 / original_max_positions as f64);
            let scaling = RopeScaling::Yarn {
                factor,
                original_max_positions,
                attention_factor: field("attention_factor"),
                beta_fast: field("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: field("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
                mscale: field("mscale"),
                mscale_all_dim: field("mscale_all_dim"),
                truncate: params.and_then(|p| p.get("truncate")).and_then(Value::as_bool).unwrap_or(true),
            };
            (scaling, ((original_max_positions as f64 * factor) as usize).max(max_positions))
        }
        other => return Err(ModelError::Config(format!("rope_type `{other}` is not supported"))),
    };
    Ok((Rotary::scaled(head_dim, theta, &scaling), longest))
}

struct Layer {
    input_norm: RmsNorm,
    qkv: Linear,
    qk_norm: Option<QkNorm>,
    o_proj: Linear,
    post_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
}

/// A pre-norm decoder on the flat batch (Llama's block; Qwen2/3 and Mistral are its layouts).
pub struct Decoder {
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rotary: Rotary,
    gated: GatedActivation,
    mask: AttentionMask,
    /// Whether the final norm runs (NVIDIA's nemotron-colembed reads the last layer's states
    /// before it).
    final_norm: bool,
    /// A per-token projection after the final norm ([`Decoder::with_projection`]).
    projection: Option<Linear>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    max_positions: usize,
    config: DecoderConfig,
}

/// Task checkpoints (`*ForSequenceClassification`, `*ForCausalLM`) keep the decoder under `model.`.
pub fn decoder_root<'a>(vb: VarBuilder<'a>) -> VarBuilder<'a> {
    if vb.contains_tensor("model.embed_tokens.weight") {
        vb.pp("model")
    } else {
        vb
    }
}

/// `[q; k; v]` of one attention block, fused into one `[q_out + 2·kv_out, hidden]` weight (and
/// bias), as the attention kernel takes them.
pub fn fused_qkv(at: &VarBuilder, h: usize, q_out: usize, kv_out: usize, bias: bool) -> Result<(Tensor, Option<Tensor>)> {
    let weight = |name: &str, out: usize| at.pp(name).get((out, h), "weight");
    let qkv = Tensor::cat(&[weight("q_proj", q_out)?, weight("k_proj", kv_out)?, weight("v_proj", kv_out)?], 0)?;
    let bias = if bias {
        let bias = |name: &str, out: usize| at.pp(name).get(out, "bias");
        Some(Tensor::cat(&[bias("q_proj", q_out)?, bias("k_proj", kv_out)?, bias("v_proj", kv_out)?], 0)?)
    } else {
        None
    };
    Ok((qkv, bias))
}

/// `[gate; up]` of one MLP fused into one `[2·inter, hidden]` projection.
pub fn fused_gate_up(mlp: &VarBuilder, h: usize, inter: usize, bias: bool) -> Result<Linear> {
    super::weights::stacked_linear(&[(mlp.pp("gate_proj"), inter), (mlp.pp("up_proj"), inter)], h, bias)
}

/// The module names of a fused `[q; k; v]` layer, for LoRA.
pub fn qkv_parts(at: &VarBuilder, q_out: usize, kv_out: usize) -> [(String, usize); 3] {
    [(at.pp("q_proj").prefix(), q_out), (at.pp("k_proj").prefix(), kv_out), (at.pp("v_proj").prefix(), kv_out)]
}

impl Decoder {
    pub fn load(raw: &Value, layout: DecoderLayout, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: DecoderConfig = parse_config(raw)?;
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
        let h = config.hidden_size;
        let (heads, kv_heads, head_dim) = config.heads()?;
        let (rotary, max_positions) = rope_of(raw, head_dim, config.max_position_embeddings)?;
        let vb = decoder_root(vb);
        let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("layers.{i}"));
            let at = lv.pp("self_attn");
            let (qkv_weight, qkv_bias) = fused_qkv(&at, h, q_out, kv_out, layout.qkv_bias)?;
            let qk_norm = if layout.qk_norm {
                Some(QkNorm {
                    q: host_f32(&at.pp("q_norm").get(head_dim, "weight")?)?,
                    k: host_f32(&at.pp("k_norm").get(head_dim, "weight")?)?,
                    eps: config.rms_norm_eps as f32,
                })
            } else {
                None
            };
            let mlp = lv.pp("mlp");
            let inter = config.intermediate_size;
            let linear = |vb: VarBuilder, out: usize, inp: usize, bias: bool| -> Result<Linear> {
                Ok(Linear::new(vb.get((out, inp), "weight")?, if bias { Some(vb.get(out, "bias")?) } else { None })?.named(&vb.prefix()))
            };
            layers.push(Layer {
                input_norm: RmsNorm::new(lv.pp("input_layernorm").get(h, "weight")?, config.rms_norm_eps)?,
                qkv: Linear::new(qkv_weight, qkv_bias)?.named_parts(&qkv_parts(&at, q_out, kv_out)),
                qk_norm,
                o_proj: linear(
                    at.pp("o_proj"),
                    h,
                    q_out,
                    layout.qkv_bias && raw.get("attention_bias").and_then(Value::as_bool) == Some(true),
                )?,
                post_norm: RmsNorm::new(lv.pp("post_attention_layernorm").get(h, "weight")?, config.rms_norm_eps)?,
                gate_up: fused_gate_up(&mlp, h, inter, layout.mlp_bias)?,
                down: linear(mlp.pp("down_proj"), h, inter, layout.mlp_bias)?,
            });
        }
        Ok(Self {
            embed_tokens: vb.get((config.vocab_size, h), "embed_tokens.weight")?,
            norm: RmsNorm::new(vb.pp("norm").get(h, "weight")?, config.rms_norm_eps)?,
            rotary,
            gated: GatedActivation { activation, act_on_first: true },
            mask: if config.bidirectional() {
                AttentionMask::Bidirectional
            } else {
                layout.sliding_window.map_or(AttentionMask::Causal, AttentionMask::CausalWindow)
            },
            final_norm: true,
            projection: None,
            layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            max_positions,
            config,
        })
    }
}

impl Decoder {
    /// The decoder read as an encoder, as NVIDIA's nemotron-colembed reads Qwen3-VL's: every
    /// token attends to its whole sequence (each layer's `is_causal` false, the padding mask
    /// only), and the last layer's states come out without the final norm.
    pub fn into_bidirectional_without_final_norm(mut self) -> Self {
        self.mask = AttentionMask::Bidirectional;
        self.final_norm = false;
        self
    }

    /// The decoder read as an encoder, final norm kept: NVIDIA's LlamaBidirectionalModel,
    /// GritLM's embedding mode, and the configs that ask for it ([`DecoderConfig::bidirectional`]).
    pub fn into_bidirectional(mut self) -> Self {
        self.mask = AttentionMask::Bidirectional;
        self
    }

    /// Whether every token attends to its whole sequence.
    pub fn is_bidirectional(&self) -> bool {
        self.mask == AttentionMask::Bidirectional
    }

    /// A linear layer (no bias) on every token after the final norm, which then gives the
    /// backbone's width: voyage-4-nano's `linear` (hidden → `num_labels`), as vLLM's
    /// VoyageQwen3BidirectionalEmbedModel and TEI apply it before pooling.
    pub fn with_projection(mut self, weight: Tensor) -> Result<Self> {
        self.projection = Some(Linear::new(weight, None)?);
        Ok(self)
    }

    /// The rotary frequencies, for a model that places its tokens itself (Qwen2-VL's M-RoPE).
    pub fn rotary(&self) -> &Rotary {
        &self.rotary
    }

    /// [`Backbone::forward`] with the rotary table given: each token's angles, in batch order.
    /// Soft tokens ([`Batch::soft_tokens`]) replace their placeholders' embeddings.
    pub fn forward_with(&self, batch: &Batch, table: &RotaryTable) -> Result<Tensor> {
        self.forward_stacked(batch, table, batch.soft_tokens.as_ref(), &[])
    }

    /// [`Self::forward_with`] with the soft tokens given apart from the batch (`soft`), and
    /// `stacked[i]` added to the residual stream after layer `i` (Qwen3-VL's DeepStack).
    pub fn forward_stacked(&self, batch: &Batch, table: &RotaryTable, soft: Option<&SoftTokens>, stacked: &[SoftTokens]) -> Result<Tensor> {
        let device = self.embed_tokens.device();
        let ids = Tensor::from_slice(&batch.input_ids, batch.num_tokens(), device)?;
        let mut hidden = self.embed_tokens.index_select(&ids, 0)?;
        if let Some(soft) = soft {
            hidden = soft.replace(&hidden)?;
        }
        let attention = Attention {
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            cu_seqlens: &batch.cu_seqlens,
            mask: self.mask,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let qkv = layer.qkv.forward(&layer.input_norm.forward(&hidden)?)?;
            let qkv = table.apply(&qkv, self.num_heads, self.num_kv_heads, layer.qk_norm.as_ref())?;
            hidden = layer.o_proj.forward_add(&attention.forward(&qkv, None)?, &hidden)?;
            let inner = self.gated.forward(&layer.gate_up.forward(&layer.post_norm.forward(&hidden)?)?)?;
            hidden = layer.down.forward_add(&inner, &hidden)?;
            if let Some(features) = stacked.get(i) {
                hidden = features.add_to(&hidden)?;
            }
        }
        if self.final_norm {
            hidden = self.norm.forward(&hidden)?;
        }
        match &self.projection {
            Some(projection) => projection.forward(&hidden),
            None => Ok(hidden),
        }
    }
}

impl Backbone for Decoder {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        self.forward_with(batch, &self.rotary.table_for_sequences(&batch.cu_seqlens))
    }

    fn sizes(&self) -> BackboneSizes {
        let hidden = self.projection.as_ref().map_or(self.config.hidden_size, Linear::out_features);
        BackboneSizes { hidden, vocab: self.config.vocab_size, max_positions: self.max_positions }
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().flat_map(|l| [&mut l.o_proj, &mut l.gate_up, &mut l.down]).collect()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}

/// A decoder's LM head `[vocab, hidden]` as stored: `lm_head.weight`, else the input embeddings
/// it is tied to.
fn lm_head_weight(raw: &Value, vb: &VarBuilder) -> std::result::Result<Tensor, ModelError> {
    let field = |name: &str| {
        raw.get(name).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| ModelError::Config(format!("missing field `{name}`")))
    };
    let (vocab, h) = (field("vocab_size")?, field("hidden_size")?);
    Ok(match vb.contains_tensor("lm_head.weight") {
        true => vb.get((vocab, h), "lm_head.weight")?,
        false => decoder_root(vb.clone()).get((vocab, h), "embed_tokens.weight")?,
    })
}

/// A causal LM's head for every decoder family: the LM head (tied to the embeddings unless
/// `lm_head.weight` exists), with Gemma 2's `final_logit_softcapping` where the config sets it,
/// as transformers' `*ForCausalLM` computes the next token's logits.
pub fn causal_lm_head(raw: &Value, vb: VarBuilder) -> std::result::Result<LmHeadWeights, ModelError> {
    let softcap = raw.get("final_logit_softcapping").and_then(Value::as_f64).map(|c| c as f32);
    if softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
        return Err(ModelError::Config("final_logit_softcapping must be positive".into()));
    }
    Ok(LmHeadWeights { weight: on_host(lm_head_weight(raw, &vb)?)?, softcap })
}

/// A decoder's classifier on its last token, for every decoder family:
/// - `*ForSequenceClassification`: `score` (no bias) on the rightmost non-padding token, as
///   transformers reads it (the last token when the config has no `pad_token_id`);
/// - a causal LM converted with `classifier_from_token` (vLLM's `--hf-overrides`): rows of the
///   LM head (tied to the embeddings unless `lm_head.weight` exists) on the last token; the
///   difference `row(tokens[1]) − row(tokens[0])` for vLLM's `from_2_way_softmax`
///   (`is_original_qwen3_reranker`), else one row per token (`no_post_processing`).
///
/// Gemma 2's final logit soft-cap is not applied to these rows, as vLLM's conversion does not.
pub fn last_token_classifier(
    raw: &Value,
    vb: VarBuilder,
    num_labels: usize,
    from_tokens: Option<&[u32]>,
) -> std::result::Result<ClassifierWeights, ModelError> {
    let field = |name: &str| raw.get(name).and_then(Value::as_u64).map(|v| v as usize);
    let h = field("hidden_size").ok_or_else(|| ModelError::Config("missing field `hidden_size`".into()))?;
    let Some(tokens) = from_tokens else {
        let input = match raw.get("pad_token_id").and_then(Value::as_u64) {
            Some(pad) => HeadInput::LastNonPad { pad_token_id: pad as u32 },
            None => HeadInput::Last,
        };
        let classifier = Linear::new(on_host(vb.pp("score").get((num_labels, h), "weight")?)?, None)?;
        return Ok(ClassifierWeights { pre: None, classifier, input, pre_on_tokens: false });
    };
    let lm_head = lm_head_weight(raw, &vb)?;
    let ids = Tensor::from_slice(tokens, tokens.len(), lm_head.device())?;
    let rows = on_host(lm_head.index_select(&ids, 0)?)?;
    let two_way = raw.get("is_original_qwen3_reranker").and_then(Value::as_bool).unwrap_or(false)
        || raw.get("method").and_then(Value::as_str) == Some("from_2_way_softmax");
    let weight = if two_way && tokens.len() == 2 { (rows.get(1)? - rows.get(0)?)?.unsqueeze(0)? } else { rows };
    Ok(ClassifierWeights { pre: None, classifier: Linear::new(weight, None)?, input: HeadInput::Last, pre_on_tokens: false })
}
