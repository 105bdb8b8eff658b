//! Multi-head and grouped-query attention over the flat batch: one job per (sequence, head),
//! Q and Kᵀ packed into register tiles, causal / windowed masks and relative position bias;
//! the composite candle path for other devices is also the kernel's test reference.

use super::dispatch::{contiguous, dims2, fma, fused, SharedMut};
use super::linear::Bias;
use super::math::{exp, max_lanes, sum_lanes};
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Which key positions a query may attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionMask {
    /// Every token sees every token of its own sequence (encoders).
    Bidirectional,
    /// Token `i` sees tokens `0..=i` of its sequence (decoders).
    Causal,
    /// Token `i` sees tokens `j` with `|i − j| ≤ w` (local attention).
    Window(usize),
    /// Token `i` sees the `w` tokens `i − w < j ≤ i` (a decoder's sliding window, as
    /// transformers masks Mistral's and Gemma's local layers).
    CausalWindow(usize),
}

impl AttentionMask {
    /// The keys `lo..hi` query `i` of a `len`-token sequence attends to.
    #[inline(always)]
    fn keys(self, i: usize, len: usize) -> (usize, usize) {
        match self {
            Self::Bidirectional => (0, len),
            Self::Causal => (0, i + 1),
            Self::Window(w) => (i.saturating_sub(w), (i + w + 1).min(len)),
            Self::CausalWindow(w) => ((i + 1).saturating_sub(w), i + 1),
        }
    }
}

/// Multi-head (and grouped-query) attention over a flat batch.
///
/// `qkv` is `[tokens, (heads + 2·kv_heads)·head_dim]`: the query heads, then the key heads, then
/// the value heads, side by side; query head `h` uses key/value head `h / (heads / kv_heads)`.
/// `bias` is their bias (added here rather than in a separate pass over `qkv`); `cu_seqlens`
/// holds the cumulative sequence lengths (`[0, l0, l0+l1, …]`). Tokens only attend within their
/// own sequence, so no padding or mask tensor exists at all. Output: `[tokens, heads·head_dim]`.
pub struct Attention<'a> {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub cu_seqlens: &'a [usize],
    pub mask: AttentionMask,
    /// Added to the scaled scores by relative distance (MPNet).
    pub position_bias: Option<&'a PositionBias>,
    /// DeBERTa's content→position and position→content scores, added to the scaled scores.
    pub disentangled: Option<&'a DisentangledBias>,
    /// Gemma 2's soft cap: scaled scores become `cap · tanh(score / cap)` before the mask.
    pub softcap: Option<f32>,
}

/// A learned bias per head and relative distance `j − i`, for one batch: head `h`'s values are
/// `values[h·(2·max_len − 1)..]`, distance `d` at index `max_len − 1 + d`.
#[derive(Debug, Clone)]
pub struct PositionBias {
    pub values: Vec<f32>,
    pub max_len: usize,
}

impl PositionBias {
    fn head(&self, head: usize) -> &[f32] {
        let span = 2 * self.max_len - 1;
        &self.values[head * span..(head + 1) * span]
    }
}

/// DeBERTa's disentangled attention terms for one batch, already scaled: the score of query
/// `i` and key `j` of one sequence gains `c2p[h][i][col(i − j)] + p2c[h][j][col(i − j)]`,
/// where `col` maps a distance to the relative-position bucket column it falls in. Only the
/// columns the batch's distances reach are kept, so the tables are linear in the tokens.
#[derive(Debug, Clone)]
pub struct DisentangledBias {
    /// `[heads, tokens, columns]`: each query against each bucket's key projection.
    pub c2p: Vec<f32>,
    /// `[heads, tokens, columns]`: each key against each bucket's query projection.
    pub p2c: Vec<f32>,
    pub tokens: usize,
    pub columns: usize,
    /// The column of distance `d = i − j` at `column_of[max_len − 1 + d]`.
    pub column_of: Vec<u32>,
    pub max_len: usize,
}

impl DisentangledBias {
    /// One head's tables for the tokens `start..start + len`, with the column map.
    fn head(&self, head: usize, start: usize, len: usize) -> DisentangledRows<'_> {
        let range = (head * self.tokens + start) * self.columns..(head * self.tokens + start + len) * self.columns;
        DisentangledRows {
            c2p: &self.c2p[range.clone()],
            p2c: &self.p2c[range],
            columns: self.columns,
            column_of: &self.column_of,
            center: self.max_len - 1,
        }
    }

    /// The bias of every (query, key) pair of one head and sequence, for the composite path.
    fn pairs(&self, head: usize, start: usize, first: usize, rows: usize, len: usize) -> Vec<f32> {
        let t = self.head(head, start, len);
        (0..rows * len)
            .map(|x| {
                let (i, j) = (first + x / len, x % len);
                t.get(i, j)
            })
            .collect()
    }
}

/// One head's [`DisentangledBias`] over one sequence.
#[derive(Clone, Copy)]
struct DisentangledRows<'a> {
    c2p: &'a [f32],
    p2c: &'a [f32],
    columns: usize,
    column_of: &'a [u32],
    center: usize,
}

impl DisentangledRows<'_> {
    #[inline(always)]
    fn get(&self, i: usize, j: usize) -> f32 {
        let col = self.column_of[self.center + i - j] as usize;
        self.c2p[i * self.columns + col] + self.p2c[j * self.columns + col]
    }
}

struct AttentionOp<'a> {
    attention: &'a Attention<'a>,
    bias: Option<&'a [f32]>,
}

/// Where one head's query, key and value columns sit in a fused QKV row, and its output columns.
#[derive(Clone, Copy)]
struct HeadColumns {
    /// Width of a QKV row.
    width: usize,
    q: usize,
    k: usize,
    v: usize,
    head_dim: usize,
    /// Width of an output row; this head writes columns `q..q + head_dim` of it.
    out_width: usize,
}

impl<'a> Attention<'a> {
    fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    fn columns(&self, head: usize) -> HeadColumns {
        let (qw, kvw) = (self.q_width(), self.kv_width());
        let kv_head = head / (self.num_heads / self.num_kv_heads);
        HeadColumns {
            width: qw + 2 * kvw,
            q: head * self.head_dim,
            k: qw + kv_head * self.head_dim,
            v: qw + kvw + kv_head * self.head_dim,
            head_dim: self.head_dim,
            out_width: qw,
        }
    }

    /// This attention as the CUDA kernel takes it.
    #[cfg(feature = "cuda")]
    pub(crate) fn kernel(&self) -> super::cuda::KernelAttention<'_> {
        use super::cuda::KernelMask;
        super::cuda::KernelAttention {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            cu_seqlens: self.cu_seqlens,
            mask: match self.mask {
                AttentionMask::Bidirectional => KernelMask::Bidirectional,
                AttentionMask::Causal => KernelMask::Causal,
                AttentionMask::Window(w) => KernelMask::Window(w),
                AttentionMask::CausalWindow(w) => KernelMask::CausalWindow(w),
            },
            position_bias: self.position_bias.map(|pb| (pb.values.as_slice(), pb.max_len)),
        }
    }

    pub fn forward(&self, qkv: &Tensor, bias: Option<&Bias>) -> Result<Tensor> {
        if fused(qkv) {
            return qkv.apply_op1_no_bwd(&AttentionOp { attention: self, bias: bias.map(|b| b.host.as_slice()) });
        }
        #[cfg(feature = "cuda")]
        if super::cuda::takes(qkv) && self.head_dim <= super::cuda::MAX_HEAD_DIM && self.disentangled.is_none() && self.softcap.is_none() {
            return super::cuda::attention(&self.kernel(), qkv, bias.map(|b| &b.tensor));
        }
        match bias {
            Some(b) => self.forward_generic(&qkv.broadcast_add(&b.tensor)?),
            None => self.forward_generic(qkv),
        }
    }

    /// Composite candle ops, one sequence at a time: the fallback for other devices (and heads
    /// wider than the CUDA kernel takes), and the reference the kernels are tested against.
    pub fn forward_generic(&self, qkv: &Tensor) -> Result<Tensor> {
        let (qw, kvw, hd) = (self.q_width(), self.kv_width(), self.head_dim);
        let group = self.num_heads / self.num_kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut outputs = Vec::with_capacity(self.cu_seqlens.len().saturating_sub(1));
        for w in self.cu_seqlens.windows(2) {
            let (start, len) = (w[0], w[1] - w[0]);
            let seq = qkv.narrow(0, start, len)?;
            let heads = |offset: usize, n: usize| -> Result<Tensor> {
                seq.narrow(1, offset, n * hd)?.reshape((len, n, hd))?.transpose(0, 1)?.contiguous()
            };
            let q = heads(0, self.num_heads)?;
            // Repeat each key/value head for the query heads of its group.
            let repeat = |t: Tensor| -> Result<Tensor> {
                if group == 1 {
                    return Ok(t);
                }
                t.unsqueeze(1)?.repeat((1, group, 1, 1))?.reshape((self.num_heads, len, hd))
            };
            let k = repeat(heads(qw, self.num_kv_heads)?)?;
            let v = repeat(heads(qw + kvw, self.num_kv_heads)?)?;
            let kt = k.t()?;
            // Queries QUERY_BLOCK at a time: scores are heads × block × len, linear in len.
            let mut blocks = Vec::with_capacity(len.div_ceil(QUERY_BLOCK));
            for first in (0..len).step_by(QUERY_BLOCK) {
                let rows = QUERY_BLOCK.min(len - first);
                // Scores and softmax in f32 (as transformers does for half-precision models).
                let mut scores = (q.narrow(1, first, rows)?.matmul(&kt)?.to_dtype(candle_core::DType::F32)? * scale)?;
                if let Some(bias) = self.position_bias {
                    let center = bias.max_len - 1;
                    let values: Vec<f32> = (0..self.num_heads * rows * len)
                        .map(|x| {
                            let (h, i, j) = (x / (rows * len), first + x / len % rows, x % len);
                            bias.head(h)[center + j - i]
                        })
                        .collect();
                    scores = (scores + Tensor::from_vec(values, (self.num_heads, rows, len), qkv.device())?)?;
                }
                if let Some(bias) = self.disentangled {
                    let values: Vec<f32> = (0..self.num_heads).flat_map(|h| bias.pairs(h, start, first, rows, len)).collect();
                    scores = (scores + Tensor::from_vec(values, (self.num_heads, rows, len), qkv.device())?)?;
                }
                if let Some(cap) = self.softcap {
                    scores = ((scores / cap as f64)?.tanh()? * cap as f64)?;
                }
                if self.mask != AttentionMask::Bidirectional {
                    let mask: Vec<f32> = (0..rows * len)
                        .map(|x| {
                            let (i, j) = (first + x / len, x % len);
                            let (lo, hi) = self.mask.keys(i, len);
                            if (lo..hi).contains(&j) {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            }
                        })
                        .collect();
                    scores = scores.broadcast_add(&Tensor::from_vec(mask, (rows, len), qkv.device())?)?;
                }
                let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
                blocks.push(probs.matmul(&v)?);
            }
            outputs.push(Tensor::cat(&blocks, 1)?.transpose(0, 1)?.reshape((len, qw))?);
        }
        Tensor::cat(&outputs, 0)
    }
}

impl CustomOp1 for AttentionOp<'_> {
    fn name(&self) -> &'static str {
        "flat_attention"
    }
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let this = self.attention;
        let qkv = contiguous(storage, layout)?;
        let (tokens, width) = dims2(layout)?;
        if this.num_kv_heads == 0 || !this.num_heads.is_multiple_of(this.num_kv_heads) {
            bail!("attention: {} heads do not group over {} key/value heads", this.num_heads, this.num_kv_heads);
        }
        if width != this.q_width() + 2 * this.kv_width() {
            bail!(
                "attention: {width} columns do not split into q, k, v of {}+2×{} heads of {}",
                this.num_heads,
                this.num_kv_heads,
                this.head_dim
            );
        }
        if this.cu_seqlens.last().copied() != Some(tokens) {
            bail!("attention: cu_seqlens does not cover the {tokens} tokens");
        }
        let heads = this.num_heads;
        let out_width = this.q_width();
        let scale = 1.0 / (this.head_dim as f32).sqrt();
        let zeros;
        let bias = match self.bias {
            Some(b) if b.len() == width => b,
            Some(b) => bail!("attention: bias has {} elements for {width} columns", b.len()),
            None => {
                zeros = vec![0f32; width];
                &zeros
            }
        };
        // Every head of every sequence writes its columns of its rows, so the output is not
        // zeroed first; its length is set once they all have.
        let mut dst: Vec<f32> = Vec::with_capacity(tokens * out_width);
        let out = SharedMut(dst.as_mut_ptr());
        let num_seqs = this.cu_seqlens.len() - 1;
        if let Some(bias) = this.position_bias {
            let longest = this.cu_seqlens.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            if bias.max_len < longest || bias.values.len() != heads * (2 * bias.max_len - 1) {
                bail!("attention: position bias does not cover sequences of {longest} tokens");
            }
        }
        if let Some(bias) = this.disentangled {
            let longest = this.cu_seqlens.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            let table = heads * tokens * bias.columns;
            if bias.tokens != tokens || bias.c2p.len() != table || bias.p2c.len() != table || bias.max_len < longest {
                bail!("attention: the disentangled bias does not cover this batch");
            }
            if bias.column_of.len() != 2 * bias.max_len - 1 || bias.column_of.iter().any(|&c| c as usize >= bias.columns) {
                bail!("attention: the disentangled bias maps a distance outside its columns");
            }
        }
        (0..num_seqs * heads).into_par_iter().for_each_init(Vec::new, |scratch: &mut Vec<f32>, job| {
            let (seq, head) = (job / heads, job % heads);
            let start = this.cu_seqlens[seq];
            let len = this.cu_seqlens[seq + 1] - start;
            if len == 0 {
                return;
            }
            let rows = &qkv[start * width..(start + len) * width];
            let dst = out;
            // SAFETY: the pointer addresses row `start` of the tokens×out_width output; this job
            // alone writes its rows' columns of this head.
            let out_rows = unsafe { dst.0.add(start * out_width) };
            let relative = this.position_bias.map(|b| (b.head(head), b.max_len - 1));
            let disentangled = this.disentangled.map(|b| b.head(head, start, len));
            let scores = ScoreTerms { relative, disentangled, softcap: this.softcap };
            attention_head(rows, bias, out_rows, this.columns(head), this.mask, scores, scale, scratch);
        });
        // SAFETY: the cu_seqlens checked above cover all tokens, so the jobs wrote every row.
        unsafe { dst.set_len(tokens * out_width) };
        Ok((CpuStorage::F32(dst), Shape::from((tokens, out_width))))
    }
}

/// What one head adds to its scaled scores besides Q·Kᵀ.
#[derive(Clone, Copy)]
struct ScoreTerms<'a> {
    /// A learned bias by distance (head's values, index of distance 0).
    relative: Option<(&'a [f32], usize)>,
    disentangled: Option<DisentangledRows<'a>>,
    softcap: Option<f32>,
}

/// Query rows and key columns of one score tile; the tile's 4×16 accumulators (and the 4×16
/// output tile of P·V) stay in eight AVX registers. With AVX-512 a tile has [`WIDE_TILE_Q`]
/// rows, one zmm register each: four chains of multiply-adds could not hide their latency
/// (attention was 37% of the FMA units' peak with four, measured on Zen 4).
const TILE_Q: usize = 4;
const WIDE_TILE_Q: usize = 8;
const TILE_K: usize = 16;

/// `TQ` query rows × 16 keys of the scores: row `r`, keys `j0..j0+16` of `scores` (rows `lk`
/// apart) get `Σ_d q[r·head_dim + d] · kt[d·lk + j0 + c]`.
///
/// # Safety
/// `q` holds `TQ` rows of `head_dim`; `kt` holds `head_dim` rows of `lk` with `j0 + 16 <= lk`;
/// `scores` holds `TQ` rows of `lk`.
#[inline(always)]
unsafe fn score_tile<const TQ: usize, const FMA: bool>(
    q: *const f32,
    head_dim: usize,
    kt: *const f32,
    lk: usize,
    j0: usize,
    scores: *mut f32,
) {
    let mut acc = [[0f32; TILE_K]; TQ];
    for d in 0..head_dim {
        // SAFETY: row d < head_dim of kt, keys j0..j0+16 inside its lk.
        let kv = unsafe { &*(kt.add(d * lk + j0) as *const [f32; TILE_K]) };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            // SAFETY: row r < TQ of q, column d < head_dim.
            let qv = unsafe { *q.add(r * head_dim + d) };
            for c in 0..TILE_K {
                acc_row[c] = fma::<FMA>(qv, kv[c], acc_row[c]);
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        // SAFETY: row r < TQ of scores, keys j0..j0+16 inside its lk.
        unsafe { std::ptr::copy_nonoverlapping(acc_row.as_ptr(), scores.add(r * lk + j0), TILE_K) };
    }
}

/// The AVX-512 tiles: [`WIDE_TILE_Q`] rows, one zmm accumulator each, written with intrinsics
/// (from the plain loops LLVM vectorized across the rows, with gathers).
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{TILE_K, WIDE_TILE_Q};
    use std::arch::x86_64::*;

    /// [`super::score_tile`] for [`WIDE_TILE_Q`] rows.
    ///
    /// # Safety
    /// The CPU has avx512f; the rest of [`super::score_tile`]'s contract.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn score_tile(q: *const f32, head_dim: usize, kt: *const f32, lk: usize, j0: usize, scores: *mut f32) {
        // SAFETY: the pointers cover the tile (this fn's contract); the feature is enabled.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); WIDE_TILE_Q];
            for d in 0..head_dim {
                let kv = _mm512_loadu_ps(kt.add(d * lk + j0));
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * head_dim + d)), kv, *acc);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(scores.add(r * lk + j0), *acc);
            }
        }
    }

    /// [`super::value_tile`] for [`WIDE_TILE_Q`] rows.
    ///
    /// # Safety
    /// The CPU has avx512f; the rest of [`super::value_tile`]'s contract.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn value_tile(
        p: *const f32,
        lk: usize,
        len: usize,
        v: *const f32,
        width: usize,
        bias: &[f32; TILE_K],
    ) -> [[f32; TILE_K]; WIDE_TILE_Q] {
        // SAFETY: the pointers cover the tile (this fn's contract); the feature is enabled.
        unsafe {
            let mut acc = [_mm512_loadu_ps(bias.as_ptr()); WIDE_TILE_Q];
            for j in 0..len {
                let vv = _mm512_loadu_ps(v.add(j * width));
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(r * lk + j)), vv, *acc);
                }
            }
            let mut out = [[0.0; TILE_K]; WIDE_TILE_Q];
            for (row, acc) in out.iter_mut().zip(&acc) {
                _mm512_storeu_ps(row.as_mut_ptr(), *acc);
            }
            out
        }
    }
}

/// `TQ` query rows × 16 dimensions of P·V + bias: `Σ_j p[r·lk + j] · v[j·width + c]`.
///
/// # Safety
/// `p` holds `TQ` rows of `lk >= len` weights; `v` holds `len` rows `width` apart of at least 16.
#[inline(always)]
unsafe fn value_tile<const TQ: usize, const FMA: bool>(
    p: *const f32,
    lk: usize,
    len: usize,
    v: *const f32,
    width: usize,
    bias: &[f32; TILE_K],
) -> [[f32; TILE_K]; TQ] {
    let mut acc = [*bias; TQ];
    for j in 0..len {
        // SAFETY: row j < len of v, 16 values.
        let vv = unsafe { &*(v.add(j * width) as *const [f32; TILE_K]) };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            // SAFETY: row r < TQ of p, key j < len <= lk.
            let weight = unsafe { *p.add(r * lk + j) };
            for c in 0..TILE_K {
                acc_row[c] = fma::<FMA>(weight, vv[c], acc_row[c]);
            }
        }
    }
    acc
}

/// Queries whose scores exist at once (a multiple of [`TILE_Q`]): working memory per thread is
/// `QUERY_BLOCK × len` scores plus the packed Kᵀ, linear in the sequence length (a 32k-token
/// sequence needs 16 MiB of scores, not the 4 GiB a full `len × len` table would). The key
/// dimension stays whole, so each row's softmax is exact in one pass and results are unchanged;
/// 128 keeps every sequence of up to 128 tokens in one block, as before.
pub(crate) const QUERY_BLOCK: usize = 128;

/// The largest scratch any attention job has used (tests check it stays linear).
#[cfg(test)]
static MAX_SCRATCH_FLOATS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

multiversion! {
    /// One head of one sequence. `rows` are the sequence's fused QKV rows; `cols` says where
    /// the head's columns are; the output rows start at `out`.
    ///
    /// Kᵀ (biased) is packed once; then, [`QUERY_BLOCK`] queries at a time, Q (biased,
    /// pre-scaled) is packed into zero-padded tiles, scores are computed tile by tile,
    /// softmaxed over the keys the mask allows (the others get weight 0), and multiplied into
    /// V straight from the QKV rows.
    #[allow(clippy::too_many_arguments)] // one head's geometry; a struct would be rebuilt per head in the hot loop
    fn attention_head(
        rows: &[f32],
        bias: &[f32],
        out: *mut f32,
        cols: HeadColumns,
        mask: AttentionMask,
        terms: ScoreTerms,
        scale: f32,
        scratch: &mut Vec<f32>,
    ) {
        let ScoreTerms { relative, disentangled, softcap } = terms;
        let HeadColumns { width, q: qc, k: kc, v: vc, head_dim, out_width } = cols;
        let len = rows.len() / width;
        let lk = len.div_ceil(TILE_K) * TILE_K;
        let tile_q = if WIDE { WIDE_TILE_Q } else { TILE_Q };
        let block = QUERY_BLOCK.min(len.div_ceil(WIDE_TILE_Q) * WIDE_TILE_Q);
        scratch.clear();
        scratch.resize(block * head_dim + head_dim * lk + block * lk, 0.0);
        #[cfg(test)]
        MAX_SCRATCH_FLOATS.fetch_max(scratch.len(), std::sync::atomic::Ordering::Relaxed);
        let (q, rest) = scratch.split_at_mut(block * head_dim);
        let (kt, scores) = rest.split_at_mut(head_dim * lk);
        let (q_bias, k_bias, v_bias) = (&bias[qc..qc + head_dim], &bias[kc..kc + head_dim], &bias[vc..vc + head_dim]);
        // Kᵀ (biased), packed once for every query block.
        for i in 0..len {
            if i + PREFETCH_ROWS < len {
                let ahead = (i + PREFETCH_ROWS) * width;
                for c in [qc, kc, vc] {
                    prefetch(&rows[ahead + c..ahead + c + head_dim]);
                }
            }
            let k = &rows[i * width + kc..i * width + kc + head_dim];
            for (d, (&value, b)) in k.iter().zip(k_bias).enumerate() {
                kt[d * lk + i] = value + b;
            }
        }
        let dims_tiled = head_dim / TILE_K * TILE_K;
        for first in (0..len).step_by(block) {
            let n = block.min(len - first);
            let lq = n.div_ceil(tile_q) * tile_q;
            // Q (biased, pre-scaled) of this block; padding rows stay zero.
            q[n * head_dim..].fill(0.0);
            for i in 0..n {
                let src = &rows[(first + i) * width + qc..(first + i) * width + qc + head_dim];
                let dst = &mut q[i * head_dim..(i + 1) * head_dim];
                dst.iter_mut().zip(src).zip(q_bias).for_each(|((d, s), b)| *d = (s + b) * scale);
            }
            // scores = (scale·Q)·Kᵀ, tile by tile.
            for i0 in (0..lq).step_by(tile_q) {
                let (q, scores) = (q[i0 * head_dim..lq * head_dim].as_ptr(), scores[i0 * lk..lq * lk].as_mut_ptr());
                for j0 in (0..lk).step_by(TILE_K) {
                    // SAFETY: rows i0..i0+tile_q ≤ lq of q and scores (checked by the slices
                    // above), keys j0+16 ≤ lk of kt (head_dim × lk).
                    unsafe {
                        #[cfg(target_arch = "x86_64")]
                        if WIDE {
                            wide::score_tile(q, head_dim, kt.as_ptr(), lk, j0, scores);
                            continue;
                        }
                        {
                            score_tile::<TILE_Q, FMA>(q, head_dim, kt.as_ptr(), lk, j0, scores);
                        }
                    }
                }
            }
            for i in 0..n {
                let query = first + i;
                let row = &mut scores[i * lk..i * lk + len];
                if let Some((bias, center)) = relative {
                    // Distance j − query of key j is at center + j − query.
                    row.iter_mut().zip(&bias[center - query..center - query + len]).for_each(|(s, b)| *s += b);
                }
                if let Some(terms) = disentangled {
                    row.iter_mut().enumerate().for_each(|(j, s)| *s += terms.get(query, j));
                }
                let (lo, hi) = mask.keys(query, len);
                if let Some(cap) = softcap {
                    row[lo..hi].iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
                }
                softmax_in_place(&mut row[lo..hi]);
                row[..lo].fill(0.0);
                row[hi..].fill(0.0);
            }
            // out = P·V + v_bias (each row of P sums to 1, so V's bias passes through unchanged),
            // 4 queries × 16 head dims at a time (head_dim is a multiple of 16 for every model we
            // serve; the remainder loop below keeps other sizes correct).
            for i0 in (0..lq).step_by(tile_q) {
                let p = scores[i0 * lk..lq * lk].as_ptr();
                for d0 in (0..dims_tiled).step_by(TILE_K) {
                    let vb: &[f32; TILE_K] = v_bias[d0..d0 + TILE_K].try_into().unwrap();
                    // V's columns d0..d0+16 of every row: the last row's end lies inside `rows`.
                    let v = rows[vc + d0..(len - 1) * width + vc + d0 + TILE_K].as_ptr();
                    let store = |r: usize, acc_row: &[f32; TILE_K]| {
                        // SAFETY: row first+i0+r < len, columns qc+d0.. of this head, inside the output.
                        unsafe { std::ptr::copy_nonoverlapping(acc_row.as_ptr(), out.add((first + i0 + r) * out_width + qc + d0), TILE_K) };
                    };
                    // SAFETY: rows i0..i0+tile_q ≤ lq of the scores (lk ≥ len each, the slice
                    // above), `len` rows of V from `v` (the slice above).
                    unsafe {
                        #[cfg(target_arch = "x86_64")]
                        if WIDE {
                            let acc = wide::value_tile(p, lk, len, v, width, vb);
                            acc.iter().enumerate().take(n.saturating_sub(i0)).for_each(|(r, a)| store(r, a));
                            continue;
                        }
                        {
                            let acc = value_tile::<TILE_Q, FMA>(p, lk, len, v, width, vb);
                            acc.iter().enumerate().take(n.saturating_sub(i0)).for_each(|(r, a)| store(r, a));
                        }
                    }
                }
                for i in i0..(i0 + tile_q).min(n) {
                    for d in dims_tiled..head_dim {
                        let sum = v_bias[d] + (0..len).map(|j| scores[i * lk + j] * rows[j * width + vc + d]).sum::<f32>();
                        // SAFETY: as above.
                        unsafe { *out.add((first + i) * out_width + qc + d) = sum };
                    }
                }
            }
        }
    }
}

/// Rows ahead of the packing loop whose Q, K and V columns are prefetched. A row of fused QKV
/// is several KiB, so consecutive rows sit on different pages, where the hardware prefetchers
/// stop: without this, the first touch of each row's columns was 16% of the attention's time.
const PREFETCH_ROWS: usize = 4;

/// Asks for the cache lines of `values` ahead of their use.
#[inline(always)]
fn prefetch(values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in values.chunks(16) {
        // SAFETY: a prefetch is a hint that never faults; the address is inside `values`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr() as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}

#[inline(always)]
fn softmax_in_place(row: &mut [f32]) {
    let max = max_lanes(row);
    // Separate passes: a loop that both exponentiates and sums would not vectorize.
    row.iter_mut().for_each(|v| *v = exp(*v - max));
    let inv = 1.0 / sum_lanes(row);
    row.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ops::test_util::{max_diff, random};
    use candle_core::DType;

    #[test]
    fn attention_kernel_matches_composite_per_sequence() {
        let cu = [0usize, 5, 6, 17];
        // head_dim 4 exercises the remainder path, 32 the register tiles; with and without bias.
        for (hidden, heads) in [(8, 2), (64, 2)] {
            let qkv = (random((17, 3 * hidden), 9) * 3.0).unwrap();
            let bias = Bias::new((random((1, 3 * hidden), 10).flatten_all().unwrap() * 2.0).unwrap()).unwrap();
            let att = Attention {
                num_heads: heads,
                num_kv_heads: heads,
                head_dim: hidden / heads,
                cu_seqlens: &cu,
                mask: AttentionMask::Bidirectional,
                position_bias: None,
                disentangled: None,
                softcap: None,
            };
            let fast = att.forward(&qkv, None).unwrap();
            assert_eq!(fast.dims(), &[17, hidden]);
            assert_eq!(fast.dtype(), DType::F32);
            assert!(max_diff(&fast, &att.forward_generic(&qkv).unwrap()) < 1e-5);
            let biased = att.forward(&qkv, Some(&bias)).unwrap();
            let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
            assert!(max_diff(&biased, &reference) < 1e-5, "hidden {hidden}");
        }
    }

    #[test]
    fn grouped_query_and_masked_attention_match_composite() {
        let cu = [0usize, 5, 6, 25];
        // 4 query heads over 2 key/value heads of 16 dims: q 64 + k 32 + v 32 columns.
        let qkv = (random((25, 128), 12) * 3.0).unwrap();
        let bias = Bias::new(random((1, 128), 13).flatten_all().unwrap()).unwrap();
        for mask in [AttentionMask::Bidirectional, AttentionMask::Causal, AttentionMask::Window(2), AttentionMask::CausalWindow(3)] {
            let att = Attention {
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 16,
                cu_seqlens: &cu,
                mask,
                position_bias: None,
                disentangled: None,
                softcap: None,
            };
            let fast = att.forward(&qkv, Some(&bias)).unwrap();
            assert_eq!(fast.dims(), &[25, 64]);
            let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
            assert!(max_diff(&fast, &reference) < 1e-5, "{mask:?}");
            // Gemma 2's soft cap (small, so that it bends the scores).
            let capped = Attention { softcap: Some(0.5), ..att };
            let fast = capped.forward(&qkv, Some(&bias)).unwrap();
            let reference = capped.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
            assert!(max_diff(&fast, &reference) < 1e-5, "{mask:?} capped");
            assert!(max_diff(&fast, &att.forward(&qkv, Some(&bias)).unwrap()) > 1e-3, "the cap changes the scores");
        }
        // A relative position bias (MPNet), longer than the longest sequence.
        let max_len = 20;
        let values = random((2, 2 * max_len - 1), 14).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let position_bias = PositionBias { values, max_len };
        let qkv = random((25, 96), 15);
        let att = Attention {
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 16,
            cu_seqlens: &cu,
            mask: AttentionMask::Bidirectional,
            position_bias: Some(&position_bias),
            disentangled: None,
            softcap: None,
        };
        assert!(max_diff(&att.forward(&qkv, None).unwrap(), &att.forward_generic(&qkv).unwrap()) < 1e-5, "position bias");
    }

    #[test]
    fn sequences_longer_than_a_query_block_match_composite() {
        // 300 tokens: three query blocks (the last partial), next to a short sequence.
        let cu = [0usize, 300, 307];
        let qkv = (random((307, 128), 16) * 2.0).unwrap();
        let bias = Bias::new(random((1, 128), 17).flatten_all().unwrap()).unwrap();
        let max_len = 300;
        let values = random((4, 2 * max_len - 1), 18).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let position_bias = PositionBias { values, max_len };
        for mask in [AttentionMask::Bidirectional, AttentionMask::Causal, AttentionMask::Window(150)] {
            for relative in [None, Some(&position_bias)] {
                // 4 query heads over 2 key/value heads of 16 dims.
                let att = Attention {
                    num_heads: 4,
                    num_kv_heads: 2,
                    head_dim: 16,
                    cu_seqlens: &cu,
                    mask,
                    position_bias: relative,
                    disentangled: None,
                    softcap: None,
                };
                let fast = att.forward(&qkv, Some(&bias)).unwrap();
                let reference = att.forward_generic(&qkv.broadcast_add(&bias.tensor).unwrap()).unwrap();
                assert!(max_diff(&fast, &reference) < 1e-5, "{mask:?}, relative bias {}", relative.is_some());
            }
        }
    }

    #[test]
    fn disentangled_bias_matches_composite() {
        // A 300-token sequence (three query blocks) beside a 7-token one; 4 heads of 16 dims,
        // 9 bucket columns reached through an uneven distance → column map.
        let cu = [0usize, 300, 307];
        let (heads, tokens, columns, max_len) = (4, 307, 9, 300);
        let qkv = random((tokens, 3 * heads * 16), 20);
        let table = |seed| random((heads * tokens, columns), seed).flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let column_of = (0..2 * max_len - 1).map(|x| ((x * columns) / (2 * max_len - 1)) as u32).collect();
        let terms = DisentangledBias { c2p: table(21), p2c: table(22), tokens, columns, column_of, max_len };
        let att = Attention {
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: 16,
            cu_seqlens: &cu,
            mask: AttentionMask::Bidirectional,
            position_bias: None,
            disentangled: Some(&terms),
            softcap: None,
        };
        let plain = Attention { disentangled: None, ..att };
        let fast = att.forward(&qkv, None).unwrap();
        assert!(max_diff(&fast, &att.forward_generic(&qkv).unwrap()) < 1e-5);
        assert!(max_diff(&fast, &plain.forward(&qkv, None).unwrap()) > 1e-3, "the terms change the result");
        // A table that does not cover the batch is an error, not a read out of bounds.
        let short = DisentangledBias { tokens: 300, ..terms.clone() };
        assert!(Attention { disentangled: Some(&short), ..plain }.forward(&qkv, None).is_err());
    }

    /// The working memory of one attention job: QUERY_BLOCK × len scores plus Kᵀ and a Q block,
    /// not len × len (a 32k-token sequence would need 4 GiB per thread).
    #[test]
    fn working_memory_is_linear_in_the_sequence_length() {
        let len = 4096;
        let cu = [0usize, len];
        let qkv = random((len, 3 * 64), 19);
        let att = Attention {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 64,
            cu_seqlens: &cu,
            mask: AttentionMask::Causal,
            position_bias: None,
            disentangled: None,
            softcap: None,
        };
        att.forward(&qkv, None).unwrap();
        let floats = MAX_SCRATCH_FLOATS.load(std::sync::atomic::Ordering::Relaxed);
        // Kᵀ and the scores round the length up to a key tile.
        let linear = QUERY_BLOCK * 64 + (64 + QUERY_BLOCK) * len.div_ceil(TILE_K) * TILE_K;
        assert!(floats <= linear, "scratch of {floats} floats for {len} tokens; linear bound {linear}");
        assert!(floats < len * len / 8, "scratch of {floats} floats is quadratic");
    }
}
