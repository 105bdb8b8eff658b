//! BERT and RoBERTa / XLM-RoBERTa encoders on the flat batch, and the post-LayerNorm encoder
//! they share with DistilBERT and MPNet (whose loaders live in their own files).
//!
//! The two share every layer; RoBERTa differs only in where positions start
//! (`pad_token_id + 1`) and in having a one-row token-type table. Q, K and V are fused into one
//! projection at load time so attention reads them from one matrix.

use super::ops::{Activation, Attention, AttentionMask, LayerNorm, Linear};
use super::{Backbone, ModelError};
use crate::models::batch::Batch;
use crate::loader::spec::Family;
use crate::pooling::sparse::SparseHead;
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

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
    pub fn position_offset(&self, family: Family) -> u32 {
        match family {
            Family::Roberta => self.pad_token_id.unwrap_or(1) + 1,
            _ => 0,
        }
    }
}

pub(super) struct Embeddings {
    pub word: Tensor,
    pub position: Tensor,
    /// Segment embeddings; `None` for models without them (DistilBERT, MPNet).
    pub token_type: Option<Tensor>,
    pub norm: LayerNorm,
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
    /// MPNet's relative position buckets.
    pub(super) relative: Option<super::mpnet::RelativePositions>,
}

pub(super) fn linear(vb: &VarBuilder, out: usize, inp: usize) -> Result<Linear> {
    Linear::new(vb.get((out, inp), "weight")?, Some(vb.get(out, "bias")?))
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
    Linear::new(weight, Some(bias))
}

/// Checkpoints store the encoder at the root (`BertModel`) or under the task model's prefix.
fn encoder_root<'a>(vb: VarBuilder<'a>) -> VarBuilder<'a> {
    for prefix in ["bert", "roberta", "model"] {
        if vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")) {
            return vb.pp(prefix);
        }
    }
    vb
}

/// The sequence-classification weights on top of the encoder: BERT's pooler (`bert.pooler.dense`)
/// and `classifier`, or RoBERTa's `classifier.dense` and `classifier.out_proj`. Both apply tanh
/// after the first layer. Returns `(pooler, classifier)`, on the CPU where heads run.
pub fn load_classifier(
    raw: &serde_json::Value,
    family: Family,
    vb: VarBuilder,
    num_labels: usize,
) -> std::result::Result<(Linear, Linear), ModelError> {
    let config: BertConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
    let h = config.hidden_size;
    let on_cpu = |vb: VarBuilder, out: usize| -> Result<Linear> {
        let cpu = candle_core::Device::Cpu;
        Linear::new(vb.get((out, h), "weight")?.to_device(&cpu)?.to_dtype(candle_core::DType::F32)?, Some(vb.get(out, "bias")?.to_device(&cpu)?.to_dtype(candle_core::DType::F32)?))
    };
    let (pooler, classifier) = match family {
        Family::Roberta | Family::Mpnet => (vb.pp("classifier.dense"), vb.pp("classifier.out_proj")),
        _ => (encoder_root(vb.clone()).pp("pooler.dense"), vb.pp("classifier")),
    };
    Ok((on_cpu(pooler, h)?, on_cpu(classifier, num_labels)?))
}

impl Bert {
    pub fn load(raw: &serde_json::Value, family: Family, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: BertConfig =
            serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
        if let Some(kind) = config.position_embedding_type.as_deref() {
            if kind != "absolute" {
                return Err(ModelError::Config(format!("position_embedding_type `{kind}` is not supported")));
            }
        }
        if config.hidden_size % config.num_attention_heads != 0 {
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
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("encoder.layer.{i}"));
            let sa = lv.pp("attention.self");
            layers.push(Layer {
                qkv: fused_qkv(sa.pp("query"), sa.pp("key"), sa.pp("value"), h)?,
                attention_out: linear(&lv.pp("attention.output.dense"), h, h)?,
                attention_norm: layer_norm(&lv.pp("attention.output.LayerNorm"), h, config.layer_norm_eps)?,
                intermediate: linear(&lv.pp("intermediate.dense"), config.intermediate_size, h)?,
                activation,
                output: linear(&lv.pp("output.dense"), h, config.intermediate_size)?,
                output_norm: layer_norm(&lv.pp("output.LayerNorm"), h, config.layer_norm_eps)?,
            });
        }
        let position_offset = config.position_offset(family);
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
        self.embeddings.norm.forward(summed)
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
        };
        for layer in &self.layers {
            // Biases of QKV and of the intermediate layer are folded into attention and GELU.
            let context = attention.forward(&layer.qkv.forward_unbiased(&hidden)?, layer.qkv.bias())?;
            let attended = layer.attention_norm.forward_add(&layer.attention_out, &context, &hidden)?;
            let inner = layer.activation.forward_biased(layer.intermediate.forward_unbiased(&attended)?, layer.intermediate.bias())?;
            hidden = layer.output_norm.forward_add(&layer.output, &inner, &attended)?;
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
        self.layers.iter_mut().flat_map(|l| [&mut l.attention_out, &mut l.intermediate, &mut l.output]).collect()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}

/// The masked-LM head of `BertForMaskedLM` (`cls.predictions`) or `RobertaForMaskedLM`
/// (`lm_head`), for SPLADE; the decoder falls back to the tied word embeddings. On the CPU in f32.
pub fn load_mlm_head(raw: &serde_json::Value, family: Family, vb: VarBuilder) -> std::result::Result<SparseHead, ModelError> {
    let config: BertConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
    let (h, vocab) = (config.hidden_size, config.vocab_size);
    let (head, dense, norm, activation) = match family {
        Family::Roberta => (vb.pp("lm_head"), "dense", "layer_norm", Activation::Gelu),
        _ => (
            vb.pp("cls.predictions"),
            "transform.dense",
            "transform.LayerNorm",
            Activation::from_config(&config.hidden_act)
                .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?,
        ),
    };
    let host = super::on_host;
    let transform = Linear::new(host(head.pp(dense).get((h, h), "weight")?)?, Some(host(head.pp(dense).get(h, "bias")?)?))?;
    let (norm_weight, norm_bias) = norm_params(&head.pp(norm), h)?;
    let norm = LayerNorm::new(host(norm_weight)?, host(norm_bias)?, config.layer_norm_eps)?;
    let decoder_weight = if head.contains_tensor("decoder.weight") {
        head.get((vocab, h), "decoder.weight")?
    } else {
        encoder_root(vb.clone()).get((vocab, h), "embeddings.word_embeddings.weight")?
    };
    let bias = if head.contains_tensor("bias") { head.get(vocab, "bias")? } else { head.get(vocab, "decoder.bias")? };
    Ok(SparseHead { transform, activation, norm, decoder: Linear::new(host(decoder_weight)?, Some(host(bias)?))? })
}
