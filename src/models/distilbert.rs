//! DistilBERT: BERT's post-LayerNorm encoder under other weight and config names, without
//! segment embeddings, on the shared encoder ([`super::encoder`]).

use super::bert::{bert_embeddings, TableSizes};
use super::encoder::{Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms};
use super::head_weights::{host_linear, on_host, ClassifierWeights, HeadInput, MaskedLmHead, PreClassifier};
use super::weights::{fused_qkv, layer_norm, linear};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::{Activation, LayerNorm, Linear};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct DistilBert;
pub static DISTILBERT: DistilBert = DistilBert;

impl Architecture for DistilBert {
    fn name(&self) -> &'static str {
        "DistilBERT"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["DistilBert"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["distilbert"]
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }

    /// `pre_classifier` (ReLU) and `classifier` of `DistilBertForSequenceClassification`.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> Result<ClassifierWeights, ModelError> {
        let h = parse_config::<DistilBertConfig>(config)?.dim;
        let dense = host_linear(&vb.pp("pre_classifier"), h, h)?;
        Ok(ClassifierWeights {
            pre: Some(PreClassifier { dense, activation: Some(Activation::Relu), norm: None }),
            classifier: host_linear(&vb.pp("classifier"), num_labels, h)?,
            input: HeadInput::First,
            pre_on_tokens: false,
        })
    }

    fn token_classifier(&self, config: &Value, vb: VarBuilder, num_labels: usize) -> Result<ClassifierWeights, ModelError> {
        ClassifierWeights::per_token(&vb, num_labels, parse_config::<DistilBertConfig>(config)?.dim)
    }

    /// `DistilBertForMaskedLM`'s head (`vocab_transform` → activation → `vocab_layer_norm` →
    /// `vocab_projector`, tied to the word embeddings).
    fn masked_lm_head(&self, raw: &Value, vb: VarBuilder) -> Result<MaskedLmHead, ModelError> {
        let config: DistilBertConfig = parse_config(raw)?;
        let (h, vocab) = (config.dim, config.vocab_size);
        let activation = Activation::from_config(&config.activation)
            .ok_or_else(|| ModelError::Config(format!("activation `{}` is not supported", config.activation)))?;
        let transform = host_linear(&vb.pp("vocab_transform"), h, h)?;
        let ln = vb.pp("vocab_layer_norm");
        let norm = LayerNorm::new(on_host(ln.get(h, "weight")?)?, on_host(ln.get(h, "bias")?)?, EPS)?;
        let weight = if vb.contains_tensor("vocab_projector.weight") {
            vb.get((vocab, h), "vocab_projector.weight")?
        } else {
            vb.get((vocab, h), "distilbert.embeddings.word_embeddings.weight")?
        };
        let decoder = Linear::new(on_host(weight)?, Some(on_host(vb.get(vocab, "vocab_projector.bias")?)?))?;
        Ok(MaskedLmHead { transform, activation, norm, decoder })
    }
}

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

fn load(raw: &Value, vb: VarBuilder) -> Result<EncoderModel, ModelError> {
    let config: DistilBertConfig = parse_config(raw)?;
    if !config.dim.is_multiple_of(config.n_heads) {
        return Err(ModelError::Config("dim is not a multiple of n_heads".into()));
    }
    let activation = Activation::from_config(&config.activation)
        .ok_or_else(|| ModelError::Config(format!("activation `{}` is not supported", config.activation)))?;
    let vb = if vb.contains_tensor("distilbert.embeddings.word_embeddings.weight") { vb.pp("distilbert") } else { vb };
    let h = config.dim;
    let emb = vb.pp("embeddings");
    let tables =
        TableSizes { width: h, vocab: config.vocab_size, positions: Some((config.max_position_embeddings, 0)), types: None, eps: EPS };
    let embeddings = bert_embeddings(&emb, tables)?;
    let mut layers = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        let lv = vb.pp(format!("transformer.layer.{i}"));
        let at = lv.pp("attention");
        layers.push(EncoderLayer {
            qkv: fused_qkv(at.pp("q_lin"), at.pp("k_lin"), at.pp("v_lin"), h)?,
            attention_out: linear(&at.pp("out_lin"), h, h)?,
            ffn: Ffn::Dense {
                up: linear(&lv.pp("ffn.lin1"), config.hidden_dim, h)?,
                feed_forward: FeedForward::Plain(activation),
                down: linear(&lv.pp("ffn.lin2"), h, config.hidden_dim)?,
            },
            norms: Norms::Post {
                attention_norm: layer_norm(&lv.pp("sa_layer_norm"), h, EPS)?,
                feed_forward_norm: layer_norm(&lv.pp("output_layer_norm"), h, EPS)?,
            },
            local: false,
        });
    }
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: config.n_heads, head_dim: h / config.n_heads, rotary: None, relative: None },
        final_norm: None,
        sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions: config.max_position_embeddings },
    })
}
