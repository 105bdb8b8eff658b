//! BERT and RoBERTa / XLM-RoBERTa encoders on the flat batch, and the post-LayerNorm encoder
//! they share with DistilBERT and MPNet (whose loaders live in their own files).
//!
//! The two share every layer; RoBERTa differs only in where positions start
//! (`pad_token_id + 1`) and in having a one-row token-type table. Q, K and V are fused into one
//! projection at load time so attention reads them from one matrix.

use super::batch::Batch;
use super::heads::{host_linear, on_host, ClassifierWeights, HeadInput, MaskedLmHead, PreClassifier};
use super::ops::{Activation, Attention, AttentionMask, LayerNorm, Linear, PositionBias};
use super::{parse_config, Architecture, Backbone, ModelError};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

/// BERT, and RoBERTa with its kin (XLM-RoBERTa, CamemBERT): the same layers under the same
/// names; RoBERTa numbers positions after the padding index, has a one-row token-type table,
/// and keeps its classifier and masked-LM head under other names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BertKind {
    Bert,
    Roberta,
}

pub static BERT: BertKind = BertKind::Bert;
pub static ROBERTA: BertKind = BertKind::Roberta;

impl Architecture for BertKind {
    fn name(&self) -> &'static str {
        match self {
            BertKind::Bert => "BERT",
            BertKind::Roberta => "RoBERTa/XLM-RoBERTa/CamemBERT",
        }
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        match self {
            BertKind::Bert => &["Bert"],
            BertKind::Roberta => &["Roberta", "XLMRoberta", "Camembert"],
        }
    }

    fn model_types(&self) -> &'static [&'static str] {
        match self {
            BertKind::Bert => &["bert"],
            BertKind::Roberta => &["roberta", "xlm-roberta", "camembert"],
        }
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(Bert::load(config, *self, vb)?))
    }

    /// BERT's pooler (`bert.pooler.dense`) and `classifier`, or RoBERTa's `classifier.dense`
    /// and `classifier.out_proj`; both apply tanh after the first layer and read the first token.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        let h = parse_config::<BertConfig>(config)?.hidden_size;
        match self {
            BertKind::Roberta => roberta_classifier(&vb, h, num_labels),
            BertKind::Bert => bert_classifier(&vb, h, num_labels),
        }
    }

    fn token_classifier(&self, config: &Value, vb: VarBuilder, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
        ClassifierWeights::per_token(&vb, num_labels, parse_config::<BertConfig>(config)?.hidden_size)
    }

    fn masked_lm_head(&self, config: &Value, vb: VarBuilder) -> std::result::Result<MaskedLmHead, ModelError> {
        load_mlm_head(config, *self, vb)
    }
}

/// BERT's sequence-classification head (also JinaBERT's): the pooler (`pooler.dense`, tanh on
/// the first token, beside the encoder) and `classifier`.
pub(super) fn bert_classifier(vb: &VarBuilder, h: usize, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
    Ok(ClassifierWeights {
        pre: Some(PreClassifier::tanh(host_linear(&encoder_root(vb.clone()).pp("pooler.dense"), h, h)?)),
        classifier: host_linear(&vb.pp("classifier"), num_labels, h)?,
        input: HeadInput::First,
        pre_on_tokens: false,
    })
}

/// RoBERTa's (and MPNet's) sequence-classification head: `classifier.dense` (tanh) and
/// `classifier.out_proj` on the first token.
pub(super) fn roberta_classifier(vb: &VarBuilder, h: usize, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
    Ok(ClassifierWeights {
        pre: Some(PreClassifier::tanh(host_linear(&vb.pp("classifier.dense"), h, h)?)),
        classifier: host_linear(&vb.pp("classifier.out_proj"), num_labels, h)?,
        input: HeadInput::First,
        pre_on_tokens: true,
    })
}

/// The fields of a BERT/RoBERTa `config.json` that the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}

impl BertConfig {
    /// First position id: RoBERTa numbers positions after the padding index.
    pub fn position_offset(&self, kind: BertKind) -> u32 {
        match kind {
            BertKind::Roberta => self.pad_token_id.unwrap_or(1) + 1,
            BertKind::Bert => 0,
        }
    }
}

pub(super) struct Embeddings {
    pub word: Tensor,
    pub position: Tensor,
    /// Segment embeddings; `None` for models without them (DistilBERT, MPNet).
    pub token_type: Option<Tensor>,
    pub norm: LayerNorm,
    /// ELECTRA's `embeddings_project`, from its narrower embedding width to the hidden size.
    pub projection: Option<Linear>,
}

/// One post-LayerNorm encoder layer: attention → add & norm → FFN → add & norm.
pub(super) struct Layer {
    pub qkv: Linear,
    pub attention_out: Linear,
    pub attention_norm: LayerNorm,
    pub intermediate: Linear,
    pub activation: Activation,
    pub output: Linear,
    pub output_norm: LayerNorm,
}

/// A learned bias by relative position, added to every attention score (MPNet's buckets).
pub trait RelativeBias: Send + Sync {
    /// The per-head bias for every distance a batch with sequences up to `max_len` needs.
    fn bias(&self, max_len: usize) -> PositionBias;
}

/// The BERT-shaped encoder that BERT, RoBERTa, DistilBERT and MPNet share; each has its own
/// loader (its weight names and config fields) that fills this in.
pub struct Bert {
    pub(super) embeddings: Embeddings,
    pub(super) layers: Vec<Layer>,
    pub(super) num_heads: usize,
    pub(super) hidden_size: usize,
    pub(super) vocab_size: usize,
    /// Positions the table allows after the offset.
    pub(super) max_positions: usize,
    pub(super) position_offset: u32,
    /// MPNet's relative position bias.
    pub(super) relative: Option<Box<dyn RelativeBias>>,
}

pub(super) fn linear(vb: &VarBuilder, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear::new(vb.get((out, inp), "weight")?, Some(vb.get(out, "bias")?))?.named(&vb.prefix()))
}

/// A LayerNorm's (weight, bias), also under the `gamma` / `beta` names of older checkpoints
/// (transformers renames them on load).
pub(super) fn norm_params(vb: &VarBuilder, size: usize) -> Result<(Tensor, Tensor)> {
    if !vb.contains_tensor("weight") && vb.contains_tensor("gamma") {
        return Ok((vb.get(size, "gamma")?, vb.get(size, "beta")?));
    }
    Ok((vb.get(size, "weight")?, vb.get(size, "bias")?))
}

pub(super) fn layer_norm(vb: &VarBuilder, size: usize, eps: f64) -> Result<LayerNorm> {
    let (weight, bias) = norm_params(vb, size)?;
    LayerNorm::new(weight, bias, eps)
}

/// Q, K and V projections fused into one `[3h, h]` layer.
pub(super) fn fused_qkv(q: VarBuilder, k: VarBuilder, v: VarBuilder, h: usize) -> Result<Linear> {
    let weight = Tensor::cat(&[q.get((h, h), "weight")?, k.get((h, h), "weight")?, v.get((h, h), "weight")?], 0)?;
    let bias = Tensor::cat(&[q.get(h, "bias")?, k.get(h, "bias")?, v.get(h, "bias")?], 0)?;
    Ok(Linear::new(weight, Some(bias))?.named_parts(&[(q.prefix(), h), (k.prefix(), h), (v.prefix(), h)]))
}

/// Checkpoints store the encoder at the root (`BertModel`) or under the task model's prefix.
pub(super) fn encoder_root<'a>(vb: VarBuilder<'a>) -> VarBuilder<'a> {
    for prefix in ["bert", "roberta", "model"] {
        if vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")) {
            return vb.pp(prefix);
        }
    }
    vb
}

/// The `encoder.layer.{i}` stack under BERT's weight names (BERT, RoBERTa, ELECTRA).
pub(super) fn encoder_layers(vb: &VarBuilder, config: &BertConfig, activation: Activation) -> Result<Vec<Layer>> {
    let sizes = LayerSizes { hidden: config.hidden_size, intermediate: config.intermediate_size, eps: config.layer_norm_eps };
    (0..config.num_hidden_layers)
        .map(|i| {
            let lv = vb.pp(format!("layer.{i}"));
            let sa = lv.pp("attention.self");
            Layer::load(&lv, fused_qkv(sa.pp("query"), sa.pp("key"), sa.pp("value"), sizes.hidden)?, sizes, activation)
        })
        .collect()
}

/// The sizes a [`Layer`] is loaded with.
#[derive(Debug, Clone, Copy)]
pub(super) struct LayerSizes {
    pub hidden: usize,
    pub intermediate: usize,
    pub eps: f64,
}

impl Layer {
    /// A layer under BERT's names below its Q/K/V projection (`attention.output.*`,
    /// `intermediate.dense`, `output.*`), with the fused `qkv` its architecture built.
    pub(super) fn load(lv: &VarBuilder, qkv: Linear, sizes: LayerSizes, activation: Activation) -> Result<Layer> {
        let LayerSizes { hidden: h, intermediate, eps } = sizes;
        Ok(Layer {
            qkv,
            attention_out: linear(&lv.pp("attention.output.dense"), h, h)?,
            attention_norm: layer_norm(&lv.pp("attention.output.LayerNorm"), h, eps)?,
            intermediate: linear(&lv.pp("intermediate.dense"), intermediate, h)?,
            activation,
            output: linear(&lv.pp("output.dense"), h, intermediate)?,
            output_norm: layer_norm(&lv.pp("output.LayerNorm"), h, eps)?,
        })
    }

    /// Everything after attention: add & norm, the feed-forward (its bias folded into the
    /// activation), add & norm.
    pub(super) fn after_attention(&self, context: &Tensor, hidden: &Tensor) -> Result<Tensor> {
        let attended = self.attention_norm.forward_add(&self.attention_out, context, hidden)?;
        let inner = self.activation.forward_biased(self.intermediate.forward_unbiased(&attended)?, self.intermediate.bias())?;
        self.output_norm.forward_add(&self.output, &inner, &attended)
    }

    /// [`Backbone::int8_linears`] of a stack of these layers.
    pub(super) fn int8_linears(layers: &mut [Layer]) -> Vec<&mut Linear> {
        layers.iter_mut().flat_map(|l| [&mut l.attention_out, &mut l.intermediate, &mut l.output]).collect()
    }

    /// [`Backbone::attention_input_linears`] of a stack of these layers.
    pub(super) fn qkv_linears(layers: &mut [Layer]) -> Vec<&mut Linear> {
        layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}

impl Bert {
    pub fn load(raw: &Value, kind: BertKind, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: BertConfig = parse_config(raw)?;
        if let Some(kind) = config.position_embedding_type.as_deref() {
            if kind != "absolute" {
                return Err(ModelError::Config(format!("position_embedding_type `{kind}` is not supported")));
            }
        }
        if !config.hidden_size.is_multiple_of(config.num_attention_heads) {
            return Err(ModelError::Config("hidden_size is not a multiple of num_attention_heads".into()));
        }
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
        let vb = encoder_root(vb);
        let h = config.hidden_size;
        let emb = vb.pp("embeddings");
        let embeddings = Embeddings {
            word: emb.get((config.vocab_size, h), "word_embeddings.weight")?,
            position: emb.get((config.max_position_embeddings, h), "position_embeddings.weight")?,
            token_type: Some(emb.get((config.type_vocab_size, h), "token_type_embeddings.weight")?),
            norm: layer_norm(&emb.pp("LayerNorm"), h, config.layer_norm_eps)?,
            projection: None,
        };
        let layers = encoder_layers(&vb.pp("encoder"), &config, activation)?;
        let position_offset = config.position_offset(kind);
        Ok(Self {
            embeddings,
            layers,
            num_heads: config.num_attention_heads,
            hidden_size: h,
            vocab_size: config.vocab_size,
            max_positions: config.max_position_embeddings.saturating_sub(position_offset as usize),
            position_offset,
            relative: None,
        })
    }

    fn embed(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.embeddings.word.device();
        let n = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, n, device)?;
        let positions = Tensor::from_vec(batch.positions(self.position_offset), n, device)?;
        let word = self.embeddings.word.index_select(&ids, 0)?;
        let position = self.embeddings.position.index_select(&positions, 0)?;
        let summed = match &self.embeddings.token_type {
            Some(table) if table.dim(0)? > 1 && batch.token_type_ids.iter().any(|&t| t != 0) => {
                let types = Tensor::from_slice(&batch.token_type_ids, n, device)?;
                ((word + position)? + table.index_select(&types, 0)?)?
            }
            // All segment ids are 0: add row 0 once instead of gathering n copies of it.
            Some(table) => (word + position)?.broadcast_add(&table.get(0)?)?,
            None => (word + position)?,
        };
        let normed = self.embeddings.norm.forward(summed)?;
        match &self.embeddings.projection {
            Some(projection) => projection.forward(&normed),
            None => Ok(normed),
        }
    }
}

impl Backbone for Bert {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let mut hidden = self.embed(batch)?;
        let position_bias = self.relative.as_ref().map(|r| r.bias(batch.max_len));
        let attention = Attention {
            num_heads: self.num_heads,
            num_kv_heads: self.num_heads,
            head_dim: self.hidden_size / self.num_heads,
            cu_seqlens: &batch.cu_seqlens,
            mask: AttentionMask::Bidirectional,
            position_bias: position_bias.as_ref(),
            disentangled: None,
            softcap: None,
        };
        for layer in &self.layers {
            // Biases of QKV and of the intermediate layer are folded into attention and GELU.
            let context = attention.forward(&layer.qkv.forward_unbiased(&hidden)?, layer.qkv.bias())?;
            hidden = layer.after_attention(&context, &hidden)?;
        }
        Ok(hidden)
    }

    fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        Layer::int8_linears(&mut self.layers)
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        Layer::qkv_linears(&mut self.layers)
    }
}

/// The masked-LM head of `BertForMaskedLM` (`cls.predictions`) or `RobertaForMaskedLM`
/// (`lm_head`), for SPLADE; the decoder falls back to the tied word embeddings. On the CPU in f32.
fn load_mlm_head(raw: &Value, kind: BertKind, vb: VarBuilder) -> std::result::Result<MaskedLmHead, ModelError> {
    let config: BertConfig = parse_config(raw)?;
    let (h, vocab) = (config.hidden_size, config.vocab_size);
    let (head, dense, norm, activation) = match kind {
        BertKind::Roberta => (vb.pp("lm_head"), "dense", "layer_norm", Activation::Gelu),
        BertKind::Bert => (
            vb.pp("cls.predictions"),
            "transform.dense",
            "transform.LayerNorm",
            Activation::from_config(&config.hidden_act)
                .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?,
        ),
    };
    let host = on_host;
    let transform = host_linear(&head.pp(dense), h, h)?;
    let (norm_weight, norm_bias) = norm_params(&head.pp(norm), h)?;
    let norm = LayerNorm::new(host(norm_weight)?, host(norm_bias)?, config.layer_norm_eps)?;
    let decoder_weight = if head.contains_tensor("decoder.weight") {
        head.get((vocab, h), "decoder.weight")?
    } else {
        encoder_root(vb.clone()).get((vocab, h), "embeddings.word_embeddings.weight")?
    };
    let bias = if head.contains_tensor("bias") { head.get(vocab, "bias")? } else { head.get(vocab, "decoder.bias")? };
    Ok(MaskedLmHead { transform, activation, norm, decoder: Linear::new(host(decoder_weight)?, Some(host(bias)?))? })
}
