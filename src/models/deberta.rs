//! DeBERTa-v2 and -v3 (`DebertaV2Model`, `DebertaV2ForSequenceClassification`,
//! `DebertaV2ForTokenClassification`): a post-LayerNorm encoder whose attention is
//! disentangled, as transformers' `modeling_deberta_v2.py` computes it. Besides content ×
//! content, each score gains content → position (`c2p`: the query against the key projection
//! of the relative position's embedding) and position → content (`p2c`: the key against its
//! query projection), relative positions log-bucketed beyond `position_buckets / 2`, all
//! scaled by `1/√(head_dim · 3)`.
//!
//! On the flat batch: per layer the two projections of the bucket embeddings the batch's
//! distances reach are computed once, then `c2p` and `p2c` as `[heads, tokens, buckets]`
//! products (linear in the tokens), which the attention kernel adds by each pair's bucket
//! ([`DisentangledBias`]). The `1/√3` is folded into the query projection at load, so the
//! kernel's own `1/√head_dim` scaling gives content × content's.

use super::batch::Batch;
use super::bert::{bert_layer, LayerSizes};
use super::encoder::EncoderLayer;
use super::head_weights::{host_linear, ClassifierWeights, HeadInput, PreClassifier};
use super::weights::{layer_norm, linear};
use super::{parse_config, Architecture, Backbone, BackboneSizes, ModelError};
use crate::kernels::{Activation, Attention, AttentionMask, DisentangledBias, LayerNorm, Linear};
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct Deberta;
pub static DEBERTA: Deberta = Deberta;

/// The fields of a DeBERTa-v2 `config.json`, with `DebertaV2Config`'s defaults.
#[derive(Debug, Clone, Deserialize)]
struct DebertaConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    type_vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    embedding_size: Option<usize>,
    #[serde(default)]
    relative_attention: bool,
    #[serde(default = "minus_one")]
    max_relative_positions: i64,
    #[serde(default = "minus_one")]
    position_buckets: i64,
    #[serde(default = "yes")]
    position_biased_input: bool,
    #[serde(default)]
    pos_att_type: Option<PosAttType>,
    #[serde(default)]
    share_att_key: bool,
    #[serde(default)]
    norm_rel_ebd: Option<String>,
    #[serde(default)]
    conv_kernel_size: usize,
    #[serde(default)]
    attention_head_size: Option<usize>,
    #[serde(default)]
    pooler_hidden_size: Option<usize>,
    #[serde(default = "default_act")]
    pooler_hidden_act: String,
}

/// `pos_att_type`: `"p2c|c2p"` in older configs, `["p2c", "c2p"]` in newer ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PosAttType {
    Joined(String),
    List(Vec<String>),
}

impl PosAttType {
    fn kinds(&self) -> Vec<String> {
        match self {
            PosAttType::Joined(s) => s.split('|').map(|k| k.trim().to_lowercase()).collect(),
            PosAttType::List(v) => v.iter().map(|k| k.trim().to_lowercase()).collect(),
        }
    }
}

fn default_act() -> String {
    "gelu".into()
}
fn default_positions() -> usize {
    512
}
fn default_eps() -> f64 {
    1e-7
}
fn minus_one() -> i64 {
    -1
}
fn yes() -> bool {
    true
}

impl DebertaConfig {
    fn pos_att_kinds(&self) -> Vec<String> {
        self.pos_att_type.as_ref().map(PosAttType::kinds).unwrap_or_default()
    }

    /// `1 + ` one per relative term: the scores' scaling is `1/√(head_dim · scale_factor)`,
    /// counted from `pos_att_type` whether or not relative attention is on (as transformers does).
    fn scale_factor(&self) -> usize {
        let kinds = self.pos_att_kinds();
        1 + ["c2p", "p2c"].iter().filter(|k| kinds.iter().any(|x| x == *k)).count()
    }

    /// transformers' rule: a `max_relative_positions` below 1 means the position table's size.
    fn max_relative_positions(&self) -> i64 {
        if self.max_relative_positions < 1 {
            self.max_position_embeddings as i64
        } else {
            self.max_relative_positions
        }
    }

    /// Half the number of relative-position embeddings: `position_buckets`, else
    /// `max_relative_positions`.
    fn attention_span(&self) -> i64 {
        if self.position_buckets > 0 {
            self.position_buckets
        } else {
            self.max_relative_positions()
        }
    }

    fn refuse_unsupported(&self) -> std::result::Result<(), ModelError> {
        let refuse = |m: String| Err(ModelError::Config(m));
        if self.conv_kernel_size > 0 {
            return refuse("DeBERTa's convolution layer (conv_kernel_size > 0, deberta-v2-xlarge/xxlarge) is not supported".into());
        }
        if self.attention_head_size.is_some_and(|s| s * self.num_attention_heads != self.hidden_size) {
            return refuse("attention_head_size × num_attention_heads must be hidden_size".into());
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return refuse("hidden_size is not a multiple of num_attention_heads".into());
        }
        let kinds = self.pos_att_kinds();
        if let Some(kind) = kinds.iter().find(|k| !matches!(k.as_str(), "c2p" | "p2c")) {
            return refuse(format!("pos_att_type `{kind}` is not supported (c2p and p2c are)"));
        }
        if self.relative_attention && kinds.len() != 2 {
            return refuse("relative attention with only one of c2p and p2c is not supported (every published DeBERTa has both)".into());
        }
        Ok(())
    }
}

/// `make_log_bucket_position`: distances up to `bucket_size / 2` stay as they are; longer ones
/// fall into logarithmically wider buckets, computed in f32 as transformers does.
fn log_bucket(relative: i64, bucket_size: i64, max_position: i64) -> i64 {
    let mid = bucket_size / 2;
    let abs = if relative < mid && relative > -mid { mid - 1 } else { relative.abs() };
    if abs <= mid {
        return relative;
    }
    let scale = (((max_position - 1) as f64 / mid as f64) as f32).ln();
    let log_pos = ((abs as f32 / mid as f32).ln() / scale * (mid - 1) as f32).ceil() + mid as f32;
    (log_pos * relative.signum() as f32) as i64
}

/// One layer's relative-position projections: the key side (c2p) and the query side (p2c).
struct PositionProjections {
    key: Linear,
    query: Linear,
}

/// The relative-position machinery shared by every layer.
struct Relative {
    /// `rel_embeddings`, LayerNorm'ed once at load where `norm_rel_ebd` says so:
    /// `[2 · span, hidden]`.
    embeddings: Tensor,
    span: i64,
    buckets: i64,
    max_relative: i64,
    /// Per layer.
    projections: Vec<PositionProjections>,
}

impl Relative {
    /// The embedding row (after clamping to the table) of distance `i − j`.
    fn row(&self, distance: i64) -> i64 {
        let bucketed = if self.buckets > 0 { log_bucket(distance, self.buckets, self.max_relative) } else { distance };
        (bucketed + self.span).clamp(0, 2 * self.span - 1)
    }
}

pub struct DebertaModel {
    word: Tensor,
    position: Option<Tensor>,
    token_type: Option<Tensor>,
    embed_proj: Option<Linear>,
    norm: LayerNorm,
    layers: Vec<EncoderLayer>,
    relative: Option<Relative>,
    num_heads: usize,
    hidden_size: usize,
    vocab_size: usize,
    max_positions: usize,
    /// `1/√(head_dim · scale_factor)`, for c2p and p2c (the query side is folded already).
    term_scale: f64,
}

/// Checkpoints store the encoder at the root (`DebertaV2Model`) or under `deberta.`.
fn encoder_root(vb: VarBuilder) -> VarBuilder {
    if vb.contains_tensor("deberta.embeddings.word_embeddings.weight") {
        vb.pp("deberta")
    } else {
        vb
    }
}

impl DebertaModel {
    fn load(raw: &Value, vb: VarBuilder) -> std::result::Result<Self, ModelError> {
        let config: DebertaConfig = parse_config(raw)?;
        config.refuse_unsupported()?;
        let activation = Activation::from_config(&config.hidden_act)
            .ok_or_else(|| ModelError::Config(format!("hidden_act `{}` is not supported", config.hidden_act)))?;
        let vb = encoder_root(vb);
        let (h, eps, heads) = (config.hidden_size, config.layer_norm_eps, config.num_attention_heads);
        let e = config.embedding_size.unwrap_or(h);
        let emb = vb.pp("embeddings");
        let head_dim = h / heads;
        // The query side carries the extra 1/√scale_factor, so the kernel's 1/√head_dim
        // scaling of Q·Kᵀ gives transformers' 1/√(head_dim · scale_factor).
        let fold = 1.0 / (config.scale_factor() as f64).sqrt();
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        let mut projections = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let lv = vb.pp(format!("encoder.layer.{i}"));
            let sa = lv.pp("attention.self");
            let (q, k, v) = (sa.pp("query_proj"), sa.pp("key_proj"), sa.pp("value_proj"));
            let weight = Tensor::cat(&[(q.get((h, h), "weight")? * fold)?, k.get((h, h), "weight")?, v.get((h, h), "weight")?], 0)?;
            let bias = Tensor::cat(&[(q.get(h, "bias")? * fold)?, k.get(h, "bias")?, v.get(h, "bias")?], 0)?;
            let sizes = LayerSizes { hidden: h, intermediate: config.intermediate_size, eps };
            layers.push(bert_layer(&lv, Linear::new(weight, Some(bias))?, sizes, activation)?);
            if config.relative_attention {
                let (key, query) = if config.share_att_key { (k, q) } else { (sa.pp("pos_key_proj"), sa.pp("pos_query_proj")) };
                projections.push(PositionProjections { key: linear(&key, h, h)?, query: linear(&query, h, h)? });
            }
        }
        let relative = if config.relative_attention {
            let span = config.attention_span();
            let table_rows = 2 * span as usize;
            let stored = vb.pp("encoder").get((table_rows, h), "rel_embeddings.weight")?;
            let normalized = config.norm_rel_ebd.as_deref().unwrap_or("none").to_lowercase().split('|').any(|k| k.trim() == "layer_norm");
            let embeddings = if normalized { layer_norm(&vb.pp("encoder.LayerNorm"), h, eps)?.forward(stored)? } else { stored };
            Some(Relative {
                embeddings,
                span,
                buckets: config.position_buckets,
                max_relative: config.max_relative_positions(),
                projections,
            })
        } else {
            None
        };
        Ok(Self {
            word: emb.get((config.vocab_size, e), "word_embeddings.weight")?,
            position: if config.position_biased_input {
                Some(emb.get((config.max_position_embeddings, e), "position_embeddings.weight")?)
            } else {
                None
            },
            token_type: if config.type_vocab_size > 0 {
                Some(emb.get((config.type_vocab_size, e), "token_type_embeddings.weight")?)
            } else {
                None
            },
            embed_proj: if e != h { Some(Linear::new(emb.get((h, e), "embed_proj.weight")?, None)?) } else { None },
            norm: layer_norm(&emb.pp("LayerNorm"), h, eps)?,
            layers,
            relative,
            num_heads: heads,
            hidden_size: h,
            vocab_size: config.vocab_size,
            // Relative positions need no table: absolute ones (v2's position_biased_input) do.
            max_positions: config.max_position_embeddings,
            term_scale: 1.0 / ((head_dim * config.scale_factor()) as f64).sqrt(),
        })
    }

    fn embed(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.word.device();
        let n = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, n, device)?;
        let mut x = self.word.index_select(&ids, 0)?;
        if let Some(position) = &self.position {
            let positions = Tensor::from_vec(batch.positions(0), n, device)?;
            x = (x + position.index_select(&positions, 0)?)?;
        }
        if let Some(types) = &self.token_type {
            let ids = Tensor::from_slice(&batch.token_type_ids, n, device)?;
            x = (x + types.index_select(&ids, 0)?)?;
        }
        if let Some(projection) = &self.embed_proj {
            x = projection.forward(&x)?;
        }
        self.norm.forward(x)
    }

    /// Each batch distance's embedding row, as the columns the terms keep: the rows
    /// `lo..=hi` the distances reach, and the column of every distance.
    fn columns(relative: &Relative, max_len: usize) -> (usize, usize, Vec<u32>) {
        let reach = max_len as i64 - 1;
        let (lo, hi) = (relative.row(-reach), relative.row(reach));
        let column_of = (-reach..=reach).map(|d| (relative.row(d) - lo) as u32).collect();
        (lo as usize, (hi - lo + 1) as usize, column_of)
    }

    /// `x [tokens, heads·d]` against `positions [columns, heads·d]`, head by head, scaled:
    /// `[heads, tokens, columns]`.
    fn per_head_products(&self, x: &Tensor, positions: &Tensor, scale: f64) -> Result<Vec<f32>> {
        let (heads, d) = (self.num_heads, self.hidden_size / self.num_heads);
        let tokens = x.dim(0)?;
        let columns = positions.dim(0)?;
        let x = x.reshape((tokens, heads, d))?.transpose(0, 1)?.contiguous()?;
        let p = positions.reshape((columns, heads, d))?.permute((1, 2, 0))?.contiguous()?;
        (x.matmul(&p)? * scale)?.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()
    }
}

impl Backbone for DebertaModel {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let mut hidden = self.embed(batch)?;
        let h = self.hidden_size;
        let columns = self.relative.as_ref().map(|r| Self::columns(r, batch.max_len));
        for (index, layer) in self.layers.iter().enumerate() {
            let qkv = layer.qkv.forward(&hidden)?;
            let terms = match (&self.relative, &columns) {
                (Some(relative), Some((lo, count, column_of))) => {
                    let rows = relative.embeddings.narrow(0, *lo, *count)?;
                    let projections = &relative.projections[index];
                    let (pos_key, pos_query) = (projections.key.forward(&rows)?, projections.query.forward(&rows)?);
                    // c2p: the (already 1/√scale_factor-folded) query against the position keys,
                    // scaled by 1/√head_dim; p2c: the key against the position queries.
                    let d = (h / self.num_heads) as f64;
                    let c2p = self.per_head_products(&qkv.narrow(1, 0, h)?, &pos_key, 1.0 / d.sqrt())?;
                    let p2c = self.per_head_products(&qkv.narrow(1, h, h)?, &pos_query, self.term_scale)?;
                    Some(DisentangledBias {
                        c2p,
                        p2c,
                        tokens: batch.num_tokens(),
                        columns: *count,
                        column_of: column_of.clone(),
                        max_len: batch.max_len,
                    })
                }
                _ => None,
            };
            let attention = Attention {
                num_heads: self.num_heads,
                num_kv_heads: self.num_heads,
                head_dim: h / self.num_heads,
                cu_seqlens: &batch.cu_seqlens,
                mask: AttentionMask::Bidirectional,
                position_bias: None,
                disentangled: terms.as_ref(),
                softcap: None,
            };
            hidden = layer.after_attention(&attention.forward(&qkv, None)?, &hidden)?;
        }
        Ok(hidden)
    }

    fn sizes(&self) -> BackboneSizes {
        BackboneSizes { hidden: self.hidden_size, vocab: self.vocab_size, max_positions: self.max_positions }
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        EncoderLayer::int8_linears(&mut self.layers)
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        EncoderLayer::qkv_linears(&mut self.layers)
    }
}

impl Architecture for Deberta {
    fn name(&self) -> &'static str {
        "DeBERTa-v2/v3"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["DebertaV2"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["deberta-v2"]
    }

    fn backbone(&self, config: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        Ok(Box::new(DebertaModel::load(config, vb)?))
    }

    /// `ContextPooler` (`pooler.dense` on the first token, then `pooler_hidden_act`) and
    /// `classifier`.
    fn classifier(
        &self,
        config: &Value,
        vb: VarBuilder,
        num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> std::result::Result<ClassifierWeights, ModelError> {
        let config: DebertaConfig = parse_config(config)?;
        let pooled = config.pooler_hidden_size.unwrap_or(config.hidden_size);
        let activation = Activation::from_config(&config.pooler_hidden_act)
            .ok_or_else(|| ModelError::Config(format!("pooler_hidden_act `{}` is not supported", config.pooler_hidden_act)))?;
        Ok(ClassifierWeights {
            pre: Some(PreClassifier {
                dense: host_linear(&vb.pp("pooler.dense"), pooled, config.hidden_size)?,
                activation: Some(activation),
                norm: None,
            }),
            classifier: host_linear(&vb.pp("classifier"), num_labels, pooled)?,
            input: HeadInput::First,
            pre_on_tokens: false,
        })
    }

    fn token_classifier(&self, config: &Value, vb: VarBuilder, num_labels: usize) -> std::result::Result<ClassifierWeights, ModelError> {
        ClassifierWeights::per_token(&vb, num_labels, parse_config::<DebertaConfig>(config)?.hidden_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `make_log_bucket_position(…, 256, 512)` (deberta-v3-base's setting) at
    /// distances around the bucket edges, as transformers 5.24 computed them: exact up to 128,
    /// logarithmic beyond.
    #[test]
    fn log_buckets_match_transformers() {
        let cases = [
            (0, 0),
            (1, 1),
            (-5, -5),
            (127, 127),
            (128, 128),
            (-128, -128),
            (129, 129),
            (130, 130),
            (200, 169),
            (-200, -169),
            (511, 255),
            (300, 207),
            (-511, -255),
        ];
        for (distance, bucket) in cases {
            assert_eq!(log_bucket(distance, 256, 512), bucket, "distance {distance}");
        }
        // The deberta fixtures' setting (position_buckets 8, 128 positions), distances -43..=43.
        let small: Vec<i64> = (-43..=43).map(|d| log_bucket(d, 8, 128)).collect();
        let reference = [
            -7, -7, -7, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -6, -5,
            -5, -5, -5, -5, -5, -5, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
            6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7,
        ];
        assert_eq!(small, reference);
    }
}
