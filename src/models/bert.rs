//! BERT and RoBERTa / XLM-RoBERTa on the shared encoder ([`super::encoder`]), and BERT's weight
//! names, which other families kept: its embedding tables ([`bert_embeddings`]: ELECTRA,
//! DistilBERT, MPNet, GTE, JinaBERT) and its blocks ([`bert_layer`]: ELECTRA, DeBERTa).
//!
//! The two share every layer; RoBERTa differs only in where positions start
//! (`pad_token_id + 1`) and in having a one-row token-type table.
//!
//! ERNIE (`ErnieModel`, `ErnieForSequenceClassification`, model_type `ernie`: nghuyong's
//! ernie-3.0 / ernie-2.0 conversions, which vLLM served until 0.23) is BERT under `ernie.` with
//! one more table: with `use_task_id`, transformers adds `task_type_embeddings` row 0 (the
//! default task id) to every token before the LayerNorm. That row is folded into the token-type
//! table at load, so the forward pass is BERT's.

use super::encoder::{Embeddings, Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms};
use super::head_weights::{host_linear, on_host, ClassifierWeights, HeadInput, MaskedLmHead, PreClassifier};
use super::weights::{fused_qkv, layer_norm, linear, norm_params};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::{Activation, LayerNorm, Linear};
use candle_core::Result;
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
    Ernie,
}

pub static BERT: BertKind = BertKind::Bert;
pub static ROBERTA: BertKind = BertKind::Roberta;
pub static ERNIE: BertKind = BertKind::Ernie;

impl Architecture for BertKind {
    fn name(&self) -> &'static str {
        match self {
            BertKind::Bert => "BERT",
            BertKind::Roberta => "RoBERTa/XLM-RoBERTa/CamemBERT",
            BertKind::Ernie => "ERNIE",
        }
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        match self {
            BertKind::Bert => &["Bert"],
            BertKind::Roberta => &["Roberta", "XLMRoberta", "Camembert"],
            BertKind::Ernie => &["Ernie"],
        }
    }

    fn model_types(&self) -> &'static [&'static str] {
        match self {
            BertKind::Bert => &["bert"],
            BertKind::Roberta => &["roberta", "xlm-roberta", "camembert"],
            BertKind::Ernie => &["ernie"],
        }
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, *self, vb)?))
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
            BertKind::Bert | BertKind::Ernie => bert_classifier(&vb, h, num_labels),
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
    /// ERNIE: whether `task_type_embeddings` row 0 is added to every token.
    #[serde(default)]
    pub use_task_id: bool,
    #[serde(default = "default_task_types")]
    pub task_type_vocab_size: usize,
}

fn default_task_types() -> usize {
    3
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
    /// The feed-forward's activation, once the config is one this file runs (absolute
    /// positions, heads that divide the width).
    pub(super) fn checked_activation(&self) -> std::result::Result<Activation, ModelError> {
        if let Some(kind) = self.position_embedding_type.as_deref() {
            if kind != "absolute" {
                return Err(ModelError::Config(format!("position_embedding_type `{kind}` is not supported")));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ModelError::Config("hidden_size is not a multiple of num_attention_heads".into()));
        }
        Activation::from_config(&self.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", self.hidden_act)))
    }

    /// First position id: RoBERTa numbers positions after the padding index.
    pub fn position_offset(&self, kind: BertKind) -> u32 {
        match kind {
            BertKind::Roberta => self.pad_token_id.unwrap_or(1) + 1,
            BertKind::Bert | BertKind::Ernie => 0,
        }
    }
}

/// Checkpoints store the encoder at the root (`BertModel`) or under the task model's prefix.
pub(super) fn encoder_root<'a>(vb: VarBuilder<'a>) -> VarBuilder<'a> {
    for prefix in ["bert", "roberta", "ernie", "model"] {
        if vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")) {
            return vb.pp(prefix);
        }
    }
    vb
}

/// The sizes of embedding tables under BERT's names.
pub(super) struct TableSizes {
    pub width: usize,
    pub vocab: usize,
    /// The position table's rows and the first position id; `None`: no table (rotary, ALiBi).
    pub positions: Option<(usize, u32)>,
    /// The token-type table's rows; `None`: no table (DistilBERT, MPNet).
    pub types: Option<usize>,
    pub eps: f64,
}

/// Embedding tables under BERT's names below `emb` (`word_embeddings`, `position_embeddings`,
/// `token_type_embeddings`, `LayerNorm`), as BERT and the families that kept its names store them.
pub(super) fn bert_embeddings(emb: &VarBuilder, sizes: TableSizes) -> Result<Embeddings> {
    let TableSizes { width, vocab, positions, types, eps } = sizes;
    Ok(Embeddings {
        word: emb.get((vocab, width), "word_embeddings.weight")?,
        position: positions.map(|(rows, _)| emb.get((rows, width), "position_embeddings.weight")).transpose()?,
        position_offset: positions.map_or(0, |(_, offset)| offset),
        token_type: types.map(|rows| emb.get((rows, width), "token_type_embeddings.weight")).transpose()?,
        norm: layer_norm(&emb.pp("LayerNorm"), width, eps)?,
        projection: None,
    })
}

/// The `encoder.layer.{i}` stack under BERT's weight names (BERT, RoBERTa, ELECTRA).
pub(super) fn encoder_layers(vb: &VarBuilder, config: &BertConfig, activation: Activation) -> Result<Vec<EncoderLayer>> {
    let sizes = LayerSizes { hidden: config.hidden_size, intermediate: config.intermediate_size, eps: config.layer_norm_eps };
    (0..config.num_hidden_layers)
        .map(|i| {
            let lv = vb.pp(format!("layer.{i}"));
            let sa = lv.pp("attention.self");
            bert_layer(&lv, fused_qkv(sa.pp("query"), sa.pp("key"), sa.pp("value"), sizes.hidden)?, sizes, activation)
        })
        .collect()
}

/// The sizes a BERT block is loaded with.
#[derive(Debug, Clone, Copy)]
pub(super) struct LayerSizes {
    pub hidden: usize,
    pub intermediate: usize,
    pub eps: f64,
}

/// A block under BERT's names below its Q/K/V projection (`attention.output.*`,
/// `intermediate.dense`, `output.*`), with the fused `qkv` its architecture built (BERT's
/// own, or DeBERTa's).
pub(super) fn bert_layer(lv: &VarBuilder, qkv: Linear, sizes: LayerSizes, activation: Activation) -> Result<EncoderLayer> {
    let LayerSizes { hidden: h, intermediate, eps } = sizes;
    Ok(EncoderLayer {
        qkv,
        attention_out: linear(&lv.pp("attention.output.dense"), h, h)?,
        ffn: Ffn::Dense {
            up: linear(&lv.pp("intermediate.dense"), intermediate, h)?,
            feed_forward: FeedForward::Plain(activation),
            down: linear(&lv.pp("output.dense"), h, intermediate)?,
        },
        norms: Norms::Post {
            attention_norm: layer_norm(&lv.pp("attention.output.LayerNorm"), h, eps)?,
            feed_forward_norm: layer_norm(&lv.pp("output.LayerNorm"), h, eps)?,
        },
        local: false,
    })
}

/// BERT's or RoBERTa's backbone: absolute positions (RoBERTa's after its padding index) and
/// segments in the embeddings, then the shared post-norm encoder.
fn load(raw: &Value, kind: BertKind, vb: VarBuilder) -> std::result::Result<EncoderModel, ModelError> {
    let config: BertConfig = parse_config(raw)?;
    let activation = config.checked_activation()?;
    let vb = encoder_root(vb);
    let h = config.hidden_size;
    let emb = vb.pp("embeddings");
    let position_offset = config.position_offset(kind);
    let tables = TableSizes {
        width: h,
        vocab: config.vocab_size,
        positions: Some((config.max_position_embeddings, position_offset)),
        types: Some(config.type_vocab_size),
        eps: config.layer_norm_eps,
    };
    let mut embeddings = bert_embeddings(&emb, tables)?;
    if kind == BertKind::Ernie && config.use_task_id {
        // transformers' default `task_type_ids` are zeros: row 0 joins every token's sum.
        let task = emb.get((config.task_type_vocab_size, h), "task_type_embeddings.weight")?.get(0)?;
        embeddings.token_type = embeddings.token_type.map(|table| table.broadcast_add(&task)).transpose()?;
    }
    let layers = encoder_layers(&vb.pp("encoder"), &config, activation)?;
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder {
            layers,
            num_heads: config.num_attention_heads,
            head_dim: h / config.num_attention_heads,
            rotary: None,
            relative: None,
        },
        final_norm: None,
        sizes: BackboneSizes {
            hidden: h,
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings.saturating_sub(position_offset as usize),
        },
    })
}

/// The masked-LM head of `BertForMaskedLM` (`cls.predictions`) or `RobertaForMaskedLM`
/// (`lm_head`), for SPLADE; the decoder falls back to the tied word embeddings. On the CPU in f32.
fn load_mlm_head(raw: &Value, kind: BertKind, vb: VarBuilder) -> std::result::Result<MaskedLmHead, ModelError> {
    let config: BertConfig = parse_config(raw)?;
    let (h, vocab) = (config.hidden_size, config.vocab_size);
    let (head, dense, norm, activation) = match kind {
        BertKind::Roberta => (vb.pp("lm_head"), "dense", "layer_norm", Activation::Gelu),
        BertKind::Bert | BertKind::Ernie => (
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
