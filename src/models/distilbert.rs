//! DistilBERT: BERT's post-LayerNorm encoder under other weight and config names, without
//! segment embeddings. Served by the shared [`Bert`] forward pass.

use super::bert::{fused_qkv, layer_norm, linear, Bert, Embeddings, Layer};
use super::ops::{Activation, Linear};
use crate::pooling::classifier::PreClassifier;
use super::ModelError;
use candle_nn::VarBuilder;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
struct DistilBertConfig {
    vocab_size: usize,
    dim: usize,
    n_layers: usize,
    n_heads: usize,
    hidden_dim: usize,
    #[serde(default = "default_act")]
    activation: String,
    max_position_embeddings: usize,
}

fn default_act() -> String {
    "gelu".into()
}

/// transformers' DistilBERT LayerNorm epsilon (not in config.json).
const EPS: f64 = 1e-12;

pub fn load(raw: &serde_json::Value, vb: VarBuilder) -> Result<Bert, ModelError> {
    let config: DistilBertConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
    if config.dim % config.n_heads != 0 {
        return Err(ModelError::Config("dim is not a multiple of n_heads".into()));
    }
    let activation = Activation::from_config(&config.activation)
        .ok_or_else(|| ModelError::Config(format!("activation `{}` is not supported", config.activation)))?;
    let vb = if vb.contains_tensor("distilbert.embeddings.word_embeddings.weight") { vb.pp("distilbert") } else { vb };
    let h = config.dim;
    let emb = vb.pp("embeddings");
    let embeddings = Embeddings {
        word: emb.get((config.vocab_size, h), "word_embeddings.weight")?,
        position: emb.get((config.max_position_embeddings, h), "position_embeddings.weight")?,
        token_type: None,
        norm: layer_norm(&emb.pp("LayerNorm"), h, EPS)?,
    };
    let mut layers = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        let lv = vb.pp(format!("transformer.layer.{i}"));
        let at = lv.pp("attention");
        layers.push(Layer {
            qkv: fused_qkv(at.pp("q_lin"), at.pp("k_lin"), at.pp("v_lin"), h)?,
            attention_out: linear(&at.pp("out_lin"), h, h)?,
            attention_norm: layer_norm(&lv.pp("sa_layer_norm"), h, EPS)?,
            intermediate: linear(&lv.pp("ffn.lin1"), config.hidden_dim, h)?,
            activation,
            output: linear(&lv.pp("ffn.lin2"), h, config.hidden_dim)?,
            output_norm: layer_norm(&lv.pp("output_layer_norm"), h, EPS)?,
        });
    }
    Ok(Bert {
        embeddings,
        layers,
        num_heads: config.n_heads,
        hidden_size: h,
        vocab_size: config.vocab_size,
        max_positions: config.max_position_embeddings,
        position_offset: 0,
        relative: None,
    })
}

/// `pre_classifier` (ReLU) and `classifier` of `DistilBertForSequenceClassification`, on the CPU.
pub fn load_classifier(raw: &serde_json::Value, vb: VarBuilder, num_labels: usize) -> Result<(PreClassifier, Linear), ModelError> {
    let config: DistilBertConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
    let cpu = candle_core::Device::Cpu;
    let on_cpu = |vb: VarBuilder, out: usize| -> candle_core::Result<Linear> {
        Linear::new(vb.get((out, config.dim), "weight")?.to_device(&cpu)?.to_dtype(candle_core::DType::F32)?, Some(vb.get(out, "bias")?.to_device(&cpu)?.to_dtype(candle_core::DType::F32)?))
    };
    let dense = on_cpu(vb.pp("pre_classifier"), config.dim)?;
    let pooler = PreClassifier { dense, activation: Some(Activation::Relu), norm: None };
    Ok((pooler, on_cpu(vb.pp("classifier"), num_labels)?))
}

/// `DistilBertForMaskedLM`'s head (`vocab_transform` → activation → `vocab_layer_norm` →
/// `vocab_projector`, tied to the word embeddings), for SPLADE. On the CPU in f32.
pub fn load_mlm_head(raw: &serde_json::Value, vb: VarBuilder) -> Result<crate::pooling::sparse::SparseHead, ModelError> {
    let config: DistilBertConfig = serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
    let (h, vocab) = (config.dim, config.vocab_size);
    let activation = Activation::from_config(&config.activation)
        .ok_or_else(|| ModelError::Config(format!("activation `{}` is not supported", config.activation)))?;
    let host = super::on_host;
    let transform = Linear::new(host(vb.pp("vocab_transform").get((h, h), "weight")?)?, Some(host(vb.pp("vocab_transform").get(h, "bias")?)?))?;
    let ln = vb.pp("vocab_layer_norm");
    let norm = super::ops::LayerNorm::new(host(ln.get(h, "weight")?)?, host(ln.get(h, "bias")?)?, EPS)?;
    let weight = if vb.contains_tensor("vocab_projector.weight") {
        vb.get((vocab, h), "vocab_projector.weight")?
    } else {
        vb.get((vocab, h), "distilbert.embeddings.word_embeddings.weight")?
    };
    let decoder = Linear::new(host(weight)?, Some(host(vb.get(vocab, "vocab_projector.bias")?)?))?;
    Ok(crate::pooling::sparse::SparseHead { transform, activation, norm, decoder })
}
