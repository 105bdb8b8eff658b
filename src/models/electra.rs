//! ELECTRA (`ElectraModel`, `ElectraForSequenceClassification`, `ElectraForTokenClassification`,
//! the discriminator `ElectraForPreTraining` as an embedder): BERT's encoder under BERT's
//! weight names, with embeddings of their own width (`embedding_size`) projected to the hidden
//! size by `embeddings_project` when the two differ, on the shared encoder ([`super::encoder`]).
//!
//! Its sequence classifier is RoBERTa-shaped but with GELU instead of tanh:
//! `out_proj(gelu(dense(h[CLS])))` (transformers' `ElectraClassificationHead`).

use super::bert::{bert_embeddings, encoder_layers, BertConfig, TableSizes};
use super::encoder::{Encoder, EncoderModel};
use super::head_weights::{host_linear, ClassifierWeights, HeadInput, PreClassifier};
use super::weights::linear;
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::Activation;
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Electra;
pub static ELECTRA: Electra = Electra;

/// What ELECTRA's config adds to BERT's.
#[derive(Debug, Deserialize)]
struct ElectraExtra {
    /// transformers' `ElectraConfig` default when config.json leaves it out.
    #[serde(default = "default_embedding_size")]
    embedding_size: usize,
}

fn default_embedding_size() -> usize {
    128
}

impl Architecture for Electra {
    fn name(&self) -> &'static str {
        "ELECTRA"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["Electra"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["electra"]
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }

    /// `classifier.dense` → GELU → `classifier.out_proj` on the first token. vLLM runs
    /// RoBERTa's identically shaped `classifier.dense` on every token for token_classify, so
    /// this one does too.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> Result<ClassifierWeights, ModelError> {
        let h = parse_config::<BertConfig>(config)?.hidden_size;
        Ok(ClassifierWeights {
            pre: Some(PreClassifier {
                dense: host_linear(&vb.pp("classifier.dense"), h, h)?,
                activation: Some(Activation::Gelu),
                norm: None,
            }),
            classifier: host_linear(&vb.pp("classifier.out_proj"), num_labels, h)?,
            input: HeadInput::First,
            pre_on_tokens: true,
        })
    }

    fn token_classifier(&self, config: &Value, vb: VarBuilder, num_labels: usize) -> Result<ClassifierWeights, ModelError> {
        ClassifierWeights::per_token(&vb, num_labels, parse_config::<BertConfig>(config)?.hidden_size)
    }
}

fn load(raw: &Value, vb: VarBuilder) -> Result<EncoderModel, ModelError> {
    let config: BertConfig = parse_config(raw)?;
    let ElectraExtra { embedding_size } = parse_config(raw)?;
    let activation = config.checked_activation()?;
    let vb = if vb.contains_tensor("electra.embeddings.word_embeddings.weight") { vb.pp("electra") } else { vb };
    let (h, e) = (config.hidden_size, embedding_size);
    let emb = vb.pp("embeddings");
    let tables = TableSizes {
        width: e,
        vocab: config.vocab_size,
        positions: Some((config.max_position_embeddings, 0)),
        types: Some(config.type_vocab_size),
        eps: config.layer_norm_eps,
    };
    let mut embeddings = bert_embeddings(&emb, tables)?;
    // transformers creates the projection only when the widths differ.
    if e != h {
        embeddings.projection = Some(linear(&vb.pp("embeddings_project"), h, e)?);
    }
    let layers = encoder_layers(&vb.pp("encoder"), &config, activation)?;
    let heads = config.num_attention_heads;
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: None, relative: None },
        final_norm: None,
        sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions: config.max_position_embeddings },
    })
}
