//! MPNet (all-mpnet-base-v2 and its kin): BERT's post-LayerNorm encoder with RoBERTa-style
//! positions and a learned relative position bias, bucketed by distance and shared by all
//! layers, added to every attention score.

use super::bert::{bert_embeddings, roberta_classifier, TableSizes};
use super::encoder::{Encoder, EncoderLayer, EncoderModel, FeedForward, Ffn, Norms, RelativeBias};
use super::head_weights::ClassifierWeights;
use super::weights::{fused_qkv, layer_norm, linear};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::{Activation, PositionBias};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Mpnet;
pub static MPNET: Mpnet = Mpnet;

impl Architecture for Mpnet {
    fn name(&self) -> &'static str {
        "MPNet"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["MPNet"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["mpnet"]
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(load(config, vb)?))
    }

    /// RoBERTa's head names: `classifier.dense` (tanh) and `classifier.out_proj`.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> Result<ClassifierWeights, ModelError> {
        roberta_classifier(&vb, parse_config::<MpnetConfig>(config)?.hidden_size, num_labels)
    }

    fn token_classifier(&self, config: &Value, vb: VarBuilder, num_labels: usize) -> Result<ClassifierWeights, ModelError> {
        ClassifierWeights::per_token(&vb, num_labels, parse_config::<MpnetConfig>(config)?.hidden_size)
    }
}

#[derive(Debug, Clone, Deserialize)]
struct MpnetConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default)]
    pad_token_id: Option<u32>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_eps() -> f64 {
    1e-12
}
fn default_buckets() -> usize {
    32
}

/// transformers' MPNet bucketing distance (not in config.json).
const MAX_DISTANCE: usize = 128;

/// The relative position table, `[buckets, heads]`.
pub struct RelativePositions {
    table: Vec<f32>,
    heads: usize,
    num_buckets: usize,
}

impl RelativePositions {
    /// transformers' `relative_position_bucket` for distance `d = j − i`: half the buckets
    /// for each sign, exact up to a quarter of them, logarithmic beyond, in f32 as torch does.
    fn bucket(&self, d: i64) -> usize {
        let half = (self.num_buckets / 2) as i64;
        let n = -d;
        let mut bucket = if n < 0 { half } else { 0 };
        let n = n.abs();
        let max_exact = half / 2;
        bucket += if n < max_exact {
            n
        } else {
            let scaled =
                (n as f32 / max_exact as f32).ln() / ((MAX_DISTANCE as f64 / max_exact as f64).ln() as f32) * (half - max_exact) as f32;
            (max_exact + scaled as i64).min(half - 1)
        };
        bucket as usize
    }
}

impl RelativeBias for RelativePositions {
    fn bias(&self, max_len: usize) -> PositionBias {
        let max_len = max_len.max(1);
        let span = 2 * max_len - 1;
        let mut values = vec![0f32; self.heads * span];
        for (k, d) in (-(max_len as i64 - 1)..max_len as i64).enumerate() {
            let row = &self.table[self.bucket(d) * self.heads..][..self.heads];
            for (h, value) in row.iter().enumerate() {
                values[h * span + k] = *value;
            }
        }
        PositionBias { values, max_len }
    }
}

fn load(raw: &Value, vb: VarBuilder) -> Result<EncoderModel, ModelError> {
    let config: MpnetConfig = parse_config(raw)?;
    if !config.hidden_size.is_multiple_of(config.num_attention_heads) {
        return Err(ModelError::Config("hidden_size is not a multiple of num_attention_heads".into()));
    }
    let activation = Activation::from_config(&config.hidden_act)
        .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
    let vb = if vb.contains_tensor("mpnet.embeddings.word_embeddings.weight") { vb.pp("mpnet") } else { vb };
    let (h, eps) = (config.hidden_size, config.layer_norm_eps);
    let emb = vb.pp("embeddings");
    let position_offset = config.pad_token_id.unwrap_or(1) + 1;
    let positions = Some((config.max_position_embeddings, position_offset));
    let embeddings = bert_embeddings(&emb, TableSizes { width: h, vocab: config.vocab_size, positions, types: None, eps })?;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let lv = vb.pp(format!("encoder.layer.{i}"));
        let at = lv.pp("attention.attn");
        layers.push(EncoderLayer {
            qkv: fused_qkv(at.pp("q"), at.pp("k"), at.pp("v"), h)?,
            attention_out: linear(&at.pp("o"), h, h)?,
            ffn: Ffn::Dense {
                up: linear(&lv.pp("intermediate.dense"), config.intermediate_size, h)?,
                feed_forward: FeedForward::Plain(activation),
                down: linear(&lv.pp("output.dense"), h, config.intermediate_size)?,
            },
            norms: Norms::Post {
                attention_norm: layer_norm(&lv.pp("attention.LayerNorm"), h, eps)?,
                feed_forward_norm: layer_norm(&lv.pp("output.LayerNorm"), h, eps)?,
            },
            local: false,
        });
    }
    let heads = config.num_attention_heads;
    let buckets = config.relative_attention_num_buckets;
    let table = crate::kernels::host_f32(&vb.get((buckets, heads), "encoder.relative_attention_bias.weight")?)?;
    let relative: Box<dyn RelativeBias> = Box::new(RelativePositions { table, heads, num_buckets: buckets });
    Ok(EncoderModel {
        embeddings,
        encoder: Encoder { layers, num_heads: heads, head_dim: h / heads, rotary: None, relative: Some(relative) },
        final_norm: None,
        sizes: BackboneSizes {
            hidden: h,
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings.saturating_sub(position_offset as usize),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_transformers() {
        let r = RelativePositions { table: vec![], heads: 1, num_buckets: 32 };
        // Values from transformers' MPNet relative_position_bucket(num_buckets=32, max_distance=128).
        let cases = [(0, 0), (-1, 1), (1, 17), (-7, 7), (-8, 8), (-20, 10), (-127, 15), (-500, 15), (8, 24), (300, 31)];
        for (d, want) in cases {
            assert_eq!(r.bucket(d), want, "distance {d}");
        }
    }
}
