//! JinaBERT (`JinaBertModel`, `JinaBertForMaskedLM`, `JinaBertForSequenceClassification`:
//! jina-embeddings-v2-*, jina-reranker-v1-*), as jinaai/jina-bert-implementation's
//! `modeling_bert.py` runs it: BERT without a position table, whose attention scores gain a
//! symmetric ALiBi bias `-slope_h · |i − j|` instead, and whose feed-forward is gated:
//! `layernorm(x + wo(act(g[..I]) · g[I..]))` with `g = gated_layers(x)` (GEGLU, or ReGLU).
//!
//! The published checkpoints say `model_type: bert` with `position_embedding_type: alibi` and
//! name a `JinaBert*` class, which is how they are told from BERT. The embedders are published as
//! `JinaBertForMaskedLM` and embed by mean pooling (their `emb_pooler`, and vLLM's default for
//! JinaBERT). Since ALiBi needs no table, inputs run up to `max_position_embeddings` (8,192).
//! The later `jina-bert-v2-qk-post-norm` variant (jina-embeddings-v2-base-code: LayerNorm on Q
//! and K, `up_gated_layer`) is refused at load with its name.

use super::bert::{bert_classifier, bert_embeddings, encoder_root, TableSizes};
use super::encoder::{Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms, QkPostNorms, RelativeBias};
use super::head_weights::ClassifierWeights;
use super::weights::{fused_qkv, layer_norm, linear, linear_with_bias};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError, SequencePooling};
use crate::kernels::{Activation, GatedActivation, PositionBias};
use candle_core::Result;
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct JinaBert;
pub static JINA_BERT: JinaBert = JinaBert;

/// The fields of a JinaBERT `config.json` (BERT's, plus `feed_forward_type`).
#[derive(Debug, Clone, Deserialize)]
struct JinaBertConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    type_vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    position_embedding_type: Option<String>,
    #[serde(default)]
    feed_forward_type: Option<String>,
}

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}

impl JinaBertConfig {
    /// The gate's activation: GEGLU (every published checkpoint) or ReGLU.
    fn gate_activation(&self) -> std::result::Result<Activation, ModelError> {
        match self.feed_forward_type.as_deref() {
            Some("geglu") => Ok(Activation::Gelu),
            Some("reglu") => Ok(Activation::Relu),
            other => Err(ModelError::Config(format!(
                "JinaBERT with feed_forward_type `{}` is not supported (geglu and reglu are)",
                other.unwrap_or("original")
            ))),
        }
    }
}

impl Architecture for JinaBert {
    fn name(&self) -> &'static str {
        "JinaBERT"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["JinaBert"]
    }

    /// Published folders say `bert`; only their architecture name tells them apart.
    fn model_types(&self) -> &'static [&'static str] {
        &[]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Mean
    }

    fn masked_lm_embeds(&self) -> bool {
        true
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }

    /// BERT's pooler (dense, tanh on the first token) and classifier.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        bert_classifier(&vb, parse_config::<JinaBertConfig>(config)?.hidden_size, num_labels)
    }

    fn token_classifier(&self, config: &Value, vb: VarBuilder, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
        ClassifierWeights::per_token(&vb, num_labels, parse_config::<JinaBertConfig>(config)?.hidden_size)
    }
}

/// ALiBi: `-slope_h · |i − j|` on every attention score, one slope per head.
struct Alibi {
    slopes: Vec<f32>,
}

impl RelativeBias for Alibi {
    fn bias(&self, max_len: usize) -> PositionBias {
        let reach = max_len.max(1) as i64 - 1;
        let values = self.slopes.iter().flat_map(|&slope| (-reach..=reach).map(move |d| -slope * d.unsigned_abs() as f32)).collect();
        PositionBias { values, max_len: max_len.max(1) }
    }
}

/// ALiBi's head slopes: `2^(−8(h+1)/n)` for `n` heads a power of two; otherwise those of the
/// power of two below, then every other slope of the power of two above (the ALiBi paper's
/// rule, as the published code computes it).
fn alibi_slopes(heads: usize) -> Vec<f32> {
    fn power_of_two(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0))));
        (0..n).map(|i| start * start.powi(i as i32)).collect()
    }
    fn slopes(n: usize) -> Vec<f64> {
        if n.is_power_of_two() {
            return power_of_two(n);
        }
        let closest = 1usize << n.ilog2();
        let mut out = power_of_two(closest);
        out.extend(slopes(2 * closest).into_iter().step_by(2).take(n - closest));
        out
    }
    // The published code keeps the slopes as f32 (`torch.Tensor(list)`).
    slopes(heads).into_iter().map(|s| s as f32).collect()
}

/// JinaBERT's backbone: BERT's embeddings without a position table, then the shared
/// post-norm encoder with ALiBi on the scores and the gated feed-forward.
fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<EncoderModel, ModelError> {
    let config: JinaBertConfig = parse_config(raw)?;
    match config.position_embedding_type.as_deref() {
        Some("alibi") => {}
        other => {
            return Err(ModelError::Config(format!(
                "JinaBERT with position_embedding_type `{}` is not supported (alibi is)",
                other.unwrap_or("absolute")
            )))
        }
    }
    let activation = config.gate_activation()?;
    if !config.hidden_size.is_multiple_of(config.num_attention_heads) {
        return Err(ModelError::Config("hidden_size is not a multiple of num_attention_heads".into()));
    }
    let vb = encoder_root(vb);
    let qk_post_norm = vb.contains_tensor("encoder.layer.0.attention.self.layer_norm_q.weight");
    let (h, inner, eps) = (config.hidden_size, config.intermediate_size, config.layer_norm_eps);
    // `gated_layers` is `[2·I, h]` without a bias, the activated half first;
    // `up_gated_layer` (qk-post-norm) the same with the activated half second.
    let gate = GatedActivation { activation, act_on_first: !qk_post_norm };
    let layers = (0..config.num_hidden_layers)
        .map(|i| {
            let lv = vb.pp(format!("encoder.layer.{i}"));
            let sa = lv.pp("attention.self");
            if qk_post_norm {
                return Ok(EncoderLayer {
                    qkv: fused_qkv(sa.pp("query"), sa.pp("key"), sa.pp("value"), h)?,
                    attention_out: linear(&lv.pp("attention.output.dense"), h, h)?,
                    ffn: Ffn::Dense {
                        up: linear_with_bias(&lv.pp("mlp.up_gated_layer"), 2 * inner, h, false)?,
                        feed_forward: FeedForward::Gated(gate),
                        down: linear(&lv.pp("mlp.down_layer"), h, inner)?,
                    },
                    norms: Norms::PostQk(Box::new(QkPostNorms {
                        q_norm: layer_norm(&sa.pp("layer_norm_q"), h, eps)?,
                        k_norm: layer_norm(&sa.pp("layer_norm_k"), h, eps)?,
                        attention_norm: layer_norm(&lv.pp("attention.output.LayerNorm"), h, eps)?,
                        block_norm: layer_norm(&lv.pp("layer_norm_1"), h, eps)?,
                        feed_forward_norm: layer_norm(&lv.pp("layer_norm_2"), h, eps)?,
                    })),
                    local: false,
                });
            }
            Ok(EncoderLayer {
                qkv: fused_qkv(sa.pp("query"), sa.pp("key"), sa.pp("value"), h)?,
                attention_out: linear(&lv.pp("attention.output.dense"), h, h)?,
                ffn: Ffn::Dense {
                    up: linear_with_bias(&lv.pp("mlp.gated_layers"), 2 * inner, h, false)?,
                    feed_forward: FeedForward::Gated(gate),
                    down: linear(&lv.pp("mlp.wo"), h, inner)?,
                },
                norms: Norms::Post {
                    attention_norm: layer_norm(&lv.pp("attention.output.LayerNorm"), h, eps)?,
                    feed_forward_norm: layer_norm(&lv.pp("mlp.layernorm"), h, eps)?,
                },
                local: false,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let emb = vb.pp("embeddings");
    let tables = TableSizes { width: h, vocab: config.vocab_size, positions: None, types: Some(config.type_vocab_size), eps };
    let embeddings = bert_embeddings(&emb, tables)?;
    let heads = config.num_attention_heads;
    let alibi: Box<dyn RelativeBias> = Box::new(Alibi { slopes: alibi_slopes(heads) });
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: None, relative: Some(alibi) },
        final_norm: None,
        // ALiBi needs no position table: the length the checkpoint declares.
        sizes: BackboneSizes { hidden: h, vocab: config.vocab_size, max_positions: config.max_position_embeddings },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published code's slopes: a power of two, and 12 heads (jina-embeddings-v2-base),
    /// which take the interleaving rule.
    #[test]
    fn alibi_slopes_follow_the_paper() {
        let eight = alibi_slopes(8);
        let want: Vec<f32> = (1..=8).map(|i| 2f32.powi(-i)).collect();
        assert_eq!(eight, want);
        let twelve = alibi_slopes(12);
        assert_eq!(twelve.len(), 12);
        assert_eq!(&twelve[..8], &want[..]);
        // Every other slope of 16 heads, from the first: 2^(-0.5), 2^(-1.5), …
        for (i, slope) in twelve[8..].iter().enumerate() {
            assert!((slope - 2f32.powf(-0.5 - i as f32)).abs() < 1e-6, "{i}: {slope}");
        }
    }
}
