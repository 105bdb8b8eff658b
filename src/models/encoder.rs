//! The bidirectional encoder that BERT and most encoder families share, on the flat batch:
//! embeddings, then a stack of blocks, each an attention sub-layer (fused Q/K/V → attention →
//! output projection) and a feed-forward sub-layer (up → activation or gate → down), each
//! with its residual and LayerNorm. What differs between the families is data, chosen when
//! their files load their checkpoints, not code:
//!
//! | family | norms | positions | feed-forward |
//! |---|---|---|---|
//! | BERT, RoBERTa, DistilBERT, ELECTRA | after each sub-layer | a table in the embeddings | plain |
//! | MPNet | after | a table, and relative buckets on the scores | plain |
//! | JinaBERT | after | ALiBi on the scores | gated (GEGLU, or ReGLU) |
//! | JinaBERT qk-post-norm | after, on Q and K too, and the block input added twice | ALiBi | gated |
//! | GTE, NomicBERT | after | rotary | gated |
//! | jina-embeddings-v3 | after | rotary | plain |
//! | ModernBERT | before each sub-layer, and a final norm | rotary, global and sliding-window layers with a base each | gated (GeGLU) |
//!
//! DeBERTa runs its own disentangled attention and shares the block's second half
//! ([`EncoderLayer::after_attention`]). Each family's file keeps what is its own: its config,
//! its weight names, its embeddings where they differ (jina-embeddings-v3's task adapters on
//! the tables) and its heads.

use super::batch::Batch;
use super::{Backbone, BackboneSizes};
use crate::kernels::moe::Experts;
use crate::kernels::{Activation, Attention, AttentionMask, GatedActivation, LayerNorm, Linear, PositionBias, Rotary, RotaryTable};
use candle_core::{Result, Tensor};

/// Token embeddings: word, plus an absolute position (where the family has a table), plus a
/// token type (where it has segments), then a LayerNorm, then ELECTRA's projection to the
/// hidden size.
pub(super) struct Embeddings {
    pub word: Tensor,
    /// The absolute position table; `None` where attention sees positions (rotary, ALiBi).
    pub position: Option<Tensor>,
    /// First position id: RoBERTa numbers positions after the padding index.
    pub position_offset: u32,
    /// Segment embeddings; `None` for models without them (DistilBERT, MPNet, ModernBERT).
    pub token_type: Option<Tensor>,
    pub norm: LayerNorm,
    /// ELECTRA's `embeddings_project`, from its narrower embedding width to the hidden size.
    pub projection: Option<Linear>,
}

impl Embeddings {
    /// `word + position + token type` of every token, before the norm; an image's soft
    /// tokens ([`Batch::soft_tokens`], ColModernVBert's frames) stand in for their
    /// placeholders' word embeddings, as transformers' `inputs_embeds` do.
    pub fn sum(&self, batch: &Batch) -> Result<Tensor> {
        let device = self.word.device();
        let n = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, n, device)?;
        let mut summed = self.word.index_select(&ids, 0)?;
        if let Some(soft) = &batch.soft_tokens {
            summed = soft.replace(&summed)?;
        }
        if let Some(table) = &self.position {
            let positions = Tensor::from_vec(batch.positions(self.position_offset), n, device)?;
            summed = (summed + table.index_select(&positions, 0)?)?;
        }
        match &self.token_type {
            Some(table) if table.dim(0)? > 1 && batch.token_type_ids.iter().any(|&t| t != 0) => {
                let types = Tensor::from_slice(&batch.token_type_ids, n, device)?;
                summed + table.index_select(&types, 0)?
            }
            // All segment ids are 0: add row 0 once instead of gathering n copies of it.
            Some(table) => summed.broadcast_add(&table.get(0)?),
            None => Ok(summed),
        }
    }

    /// The normalized (and projected) embeddings the first block takes.
    pub fn finish(&self, summed: Tensor) -> Result<Tensor> {
        let normed = self.norm.forward(summed)?;
        match &self.projection {
            Some(projection) => projection.forward(&normed),
            None => Ok(normed),
        }
    }
}

/// What turns a batch into the first block's input: [`Embeddings`] for every family but
/// jina-embeddings-v3, whose tables carry task adapters.
pub(super) trait Embed: Send + Sync {
    fn embed(&self, batch: &Batch) -> Result<Tensor>;
}

impl Embed for Embeddings {
    fn embed(&self, batch: &Batch) -> Result<Tensor> {
        self.finish(self.sum(batch)?)
    }
}

/// A learned or fixed bias by relative position, added to every attention score (MPNet's
/// buckets, JinaBERT's ALiBi).
pub trait RelativeBias: Send + Sync {
    /// The per-head bias for every distance a batch with sequences up to `max_len` needs.
    fn bias(&self, max_len: usize) -> PositionBias;
}

/// The feed-forward sub-layer between its `up` and `down` projections.
#[derive(Debug, Clone, Copy)]
pub(super) enum FeedForward {
    /// `down(act(up(x)))`.
    Plain(Activation),
    /// `down(act(gate) · up)`, from one fused `[gate; up]` (or `[up; gate]`) projection.
    Gated(GatedActivation),
}

impl FeedForward {
    fn forward(self, up: &Linear, x: &Tensor) -> Result<Tensor> {
        match self {
            // The up projection's bias is folded into the activation's pass.
            FeedForward::Plain(activation) => activation.forward_biased(up.forward_unbiased(x)?, up.bias()),
            FeedForward::Gated(gate) => gate.forward(&up.forward(x)?),
        }
    }
}

/// A block's feed-forward sub-layer.
pub(super) enum Ffn {
    /// `up` is its up projection, or for a gated one the fused `[gate; up]` (or `[up; gate]`)
    /// pair [`FeedForward::Gated`] splits.
    Dense { up: Linear, feed_forward: FeedForward, down: Linear },
    /// A mixture of experts (NomicBERT MoE's layers).
    Experts(Box<Experts>),
}

impl Ffn {
    /// `x + ffn(x)`: the down projection accumulates onto the residual.
    fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        match self {
            Ffn::Dense { up, feed_forward, down } => down.forward_add(&feed_forward.forward(up, x)?, residual),
            Ffn::Experts(experts) => experts.forward(x)? + residual,
        }
    }

    /// `norm(x + ffn(x))`, the down projection and the residual folded into the norm's pass.
    fn forward_add_norm(&self, norm: &LayerNorm, x: &Tensor) -> Result<Tensor> {
        match self {
            Ffn::Dense { up, feed_forward, down } => norm.forward_add(down, &feed_forward.forward(up, x)?, x),
            Ffn::Experts(experts) => norm.forward((experts.forward(x)? + x)?),
        }
    }

    fn linears(&mut self) -> Vec<&mut Linear> {
        match self {
            Ffn::Dense { up, down, .. } => vec![up, down],
            Ffn::Experts(experts) => experts.linears().collect(),
        }
    }
}

/// Where a block's LayerNorms stand.
pub(super) enum Norms {
    /// After each sub-layer's residual: `norm1(x + attn(x))`, then `norm2(h + ffn(h))`.
    Post { attention_norm: LayerNorm, feed_forward_norm: LayerNorm },
    /// Before each sub-layer: `x + attn(norm1(x))`, then `h + ffn(norm2(h))`. ModernBERT's first
    /// block has no `norm1`: its input is the normalized embedding already.
    Pre { attention_norm: Option<LayerNorm>, feed_forward_norm: LayerNorm },
    /// jina-bert-v2-qk-post-norm (jina-embeddings-v2-base-code): `q_norm` and `k_norm` on the
    /// projected queries and keys (over the full width, before the heads split), then
    /// `a = attention_norm(x + attn(x))`, `h = block_norm(x + a)` (the block input added once
    /// more), and `feed_forward_norm(h + ffn(h))`.
    PostQk(Box<QkPostNorms>),
}

/// The five norms of a [`Norms::PostQk`] block (boxed: the other layouts have two).
pub(super) struct QkPostNorms {
    pub q_norm: LayerNorm,
    pub k_norm: LayerNorm,
    pub attention_norm: LayerNorm,
    pub block_norm: LayerNorm,
    pub feed_forward_norm: LayerNorm,
}

/// One encoder block.
pub(super) struct EncoderLayer {
    /// Q, K and V as one product (the query heads, then the key heads, then the value heads).
    pub qkv: Linear,
    pub attention_out: Linear,
    pub ffn: Ffn,
    pub norms: Norms,
    /// A sliding-window layer with the local rotary base (ModernBERT); global otherwise.
    pub local: bool,
}

impl EncoderLayer {
    fn forward(&self, hidden: Tensor, attention: &Attention, rotary: Option<&RotaryTable>) -> Result<Tensor> {
        let input = match &self.norms {
            Norms::Pre { attention_norm: Some(norm), .. } => norm.forward(hidden.copy()?)?,
            _ => hidden.clone(),
        };
        let heads = attention.num_heads;
        if let Norms::PostQk(norms) = &self.norms {
            let QkPostNorms { q_norm, k_norm, .. } = norms.as_ref();
            // The norms need the biased Q and K, so the product adds the bias; no family with
            // them rotates.
            let qkv = self.qkv.forward(&input)?;
            let width = qkv.dim(1)? / 3;
            let q = q_norm.forward(qkv.narrow(1, 0, width)?.contiguous()?)?;
            let k = k_norm.forward(qkv.narrow(1, width, width)?.contiguous()?)?;
            let qkv = Tensor::cat(&[q, k, qkv.narrow(1, 2 * width, width)?], 1)?;
            return self.after_attention(&attention.forward(&qkv, None)?, &hidden);
        }
        let context = match rotary {
            // The Q/K bias must be in before they are rotated, so the product adds it.
            Some(table) => attention.forward(&table.apply(&self.qkv.forward(&input)?, heads, attention.num_kv_heads, None)?, None)?,
            // Unrotated, the bias is folded into the attention kernel's pass.
            None => attention.forward(&self.qkv.forward_unbiased(&input)?, self.qkv.bias())?,
        };
        self.after_attention(&context, &hidden)
    }

    /// Everything after attention: the output projection with its residual, then the
    /// feed-forward with its own, each normalized where [`Norms`] says.
    pub fn after_attention(&self, context: &Tensor, hidden: &Tensor) -> Result<Tensor> {
        match &self.norms {
            Norms::Post { attention_norm, feed_forward_norm } => {
                let attended = attention_norm.forward_add(&self.attention_out, context, hidden)?;
                self.ffn.forward_add_norm(feed_forward_norm, &attended)
            }
            Norms::PostQk(norms) => {
                let QkPostNorms { attention_norm, block_norm, feed_forward_norm, .. } = norms.as_ref();
                let attended = attention_norm.forward_add(&self.attention_out, context, hidden)?;
                let block = block_norm.forward((hidden + &attended)?)?;
                self.ffn.forward_add_norm(feed_forward_norm, &block)
            }
            Norms::Pre { feed_forward_norm, .. } => {
                let attended = self.attention_out.forward_add(context, hidden)?;
                self.ffn.forward_add(&feed_forward_norm.forward(attended.copy()?)?, &attended)
            }
        }
    }

    /// [`Backbone::int8_linears`] of a stack of blocks: what follows attention.
    pub fn int8_linears(layers: &mut [EncoderLayer]) -> Vec<&mut Linear> {
        layers.iter_mut().flat_map(|l| std::iter::once(&mut l.attention_out).chain(l.ffn.linears())).collect()
    }

    /// [`Backbone::attention_input_linears`] of a stack of blocks.
    pub fn qkv_linears(layers: &mut [EncoderLayer]) -> Vec<&mut Linear> {
        layers.iter_mut().map(|l| &mut l.qkv).collect()
    }
}

/// Rotary positions on Q and K, numbered from 0 in each sequence.
pub(super) struct RotaryPositions {
    pub global: Rotary,
    /// ModernBERT's sliding-window layers: their rotary, and how far each token sees
    /// (`|i − j| ≤ window`).
    pub local: Option<(Rotary, usize)>,
}

/// The block stack and how its attention sees positions.
pub(super) struct Encoder {
    pub layers: Vec<EncoderLayer>,
    pub num_heads: usize,
    pub head_dim: usize,
    /// `None`: positions are in the embeddings, or in `relative`.
    pub rotary: Option<RotaryPositions>,
    pub relative: Option<Box<dyn RelativeBias>>,
}

impl Encoder {
    pub fn forward(&self, mut hidden: Tensor, batch: &Batch) -> Result<Tensor> {
        let bias = self.relative.as_ref().map(|r| r.bias(batch.max_len));
        let attention = |mask| Attention {
            num_heads: self.num_heads,
            num_kv_heads: self.num_heads,
            head_dim: self.head_dim,
            cu_seqlens: &batch.cu_seqlens,
            mask,
            position_bias: bias.as_ref(),
            disentangled: None,
            softcap: None,
        };
        let global = attention(AttentionMask::Bidirectional);
        let positions = self.rotary.as_ref().map(|_| batch.positions(0)).unwrap_or_default();
        let global_table = self.rotary.as_ref().map(|r| r.global.table(&positions));
        let local = self
            .rotary
            .as_ref()
            .and_then(|r| r.local.as_ref())
            .map(|(rotary, window)| (rotary.table(&positions), attention(AttentionMask::Window(*window))));
        for layer in &self.layers {
            hidden = match (&local, layer.local) {
                (Some((table, attention)), true) => layer.forward(hidden, attention, Some(table))?,
                _ => layer.forward(hidden, &global, global_table.as_ref())?,
            };
        }
        Ok(hidden)
    }
}

/// An encoder family's backbone: its embeddings, the shared block stack, and ModernBERT's
/// final norm.
pub(super) struct EncoderModel<E: Embed = Embeddings> {
    pub embeddings: E,
    pub encoder: Encoder,
    pub final_norm: Option<LayerNorm>,
    pub sizes: BackboneSizes,
}

impl<E: Embed> Backbone for EncoderModel<E> {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        let hidden = self.encoder.forward(self.embeddings.embed(batch)?, batch)?;
        match &self.final_norm {
            Some(norm) => norm.forward(hidden),
            None => Ok(hidden),
        }
    }

    fn sizes(&self) -> BackboneSizes {
        self.sizes
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        EncoderLayer::int8_linears(&mut self.encoder.layers)
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        EncoderLayer::qkv_linears(&mut self.encoder.layers)
    }
}
