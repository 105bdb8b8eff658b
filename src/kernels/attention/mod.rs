//! Multi-head and grouped-query attention over the flat batch: one job per (sequence, head),
//! Q and Kᵀ packed into register tiles, causal / windowed masks and relative position bias;
//! the composite candle path for other devices is also the kernel's test reference.
//!
//! Here: the attention a model describes ([`Attention`], its masks and score biases), the
//! composite path, and the checks before the CPU kernel runs; `kernel` is the CPU kernel.

mod kernel;
#[cfg(test)]
mod tests;
mod tiles;

use super::dispatch::{contiguous, dims2, fused, SharedMut};
use super::linear::Bias;
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use kernel::{ScoreTerms, QUERY_BLOCK};
use rayon::prelude::*;
use std::cell::Cell;

/// The shortest sequence whose heads a bf16 model runs in bf16 ([`tiles`]; decision, from two
/// measurements on a 2-vCPU Xeon with AMX): on all-MiniLM-L6-v2's corpus of ~80-token texts the
/// tiles were no faster end to end than the f32 kernel (packing Q, K and V into tile layouts
/// costs what the products save) and round Q, K, P and V to bf16; on a 16k-token input they made
/// the forward pass 3× faster. Shorter sequences keep the f32 kernel and its exactness. The
/// `vdpbf16ps` unit keeps the same bound (docs/performance.md has its long-input numbers).
const TILES_MIN_LEN: usize = 256;

/// The most scratch floats a thread keeps between heads.
const MAX_KEPT_SCRATCH_FLOATS: usize = 1 << 22;

thread_local! {
    /// Each thread's attention scratch (queries, packed keys, scores), reused across heads.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The same for the heads in bf16.
    static TILE_SCRATCH: Cell<tiles::Scratch> = Cell::new(tiles::Scratch::default());
    /// Whether this thread's attention runs its products in bf16 where it can
    /// ([`with_bf16_tiles`]).
    static BF16_TILES: Cell<bool> = const { Cell::new(false) };
}

/// Runs `forward` (a bf16 model's forward pass, on this thread) with attention's two products
/// in bf16 where the bf16 linears run on native bf16 instructions, AMX tiles or AVX-512 BF16
/// (`tiles`), as OpenVINO runs a bf16 model's attention; elsewhere, and for float32 models,
/// attention stays f32.
pub fn with_bf16_tiles<R>(forward: impl FnOnce() -> R) -> R {
    /// Puts the previous setting back, also when `forward` unwinds.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BF16_TILES.set(self.0);
        }
    }
    let _restore = Restore(BF16_TILES.replace(true));
    forward()
}

/// The unit a bf16 model's long heads run their two products on ([`tiles`]).
#[derive(Clone, Copy)]
enum Bf16Unit {
    /// AMX tiles, where the bf16 linears run on them.
    Amx,
    /// AVX-512 BF16's `vdpbf16ps`, where the bf16 linears run on it (Zen 4 and 5; Intel
    /// without AMX; never chosen on other architectures).
    Dot,
}

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
    pub(super) fn keys(self, i: usize, len: usize) -> (usize, usize) {
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
    pub(super) fn head(&self, head: usize) -> &[f32] {
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
    pub(super) fn head(&self, head: usize, start: usize, len: usize) -> DisentangledRows<'_> {
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
pub(super) struct DisentangledRows<'a> {
    c2p: &'a [f32],
    p2c: &'a [f32],
    columns: usize,
    column_of: &'a [u32],
    center: usize,
}

impl DisentangledRows<'_> {
    #[inline(always)]
    pub(super) fn get(&self, i: usize, j: usize) -> f32 {
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
pub(super) struct HeadColumns {
    /// Width of a QKV row.
    pub width: usize,
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub head_dim: usize,
    /// Width of an output row; this head writes columns `q..q + head_dim` of it.
    pub out_width: usize,
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
        // Where a bf16 model's long heads run their products: where its linears do.
        let bf16_unit = if BF16_TILES.get() && tiles::takes(this.head_dim) {
            if super::sgemm::amx_in_use() {
                Some(Bf16Unit::Amx)
            } else if super::sgemm::dot_in_use() {
                Some(Bf16Unit::Dot)
            } else {
                None
            }
        } else {
            None
        };
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
        (0..num_seqs * heads).into_par_iter().for_each(|job| {
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
            if let Some(kind) = bf16_unit.filter(|_| len >= TILES_MIN_LEN) {
                let mut scratch = TILE_SCRATCH.take();
                let (columns, mask) = (this.columns(head), this.mask);
                let ran = match kind {
                    Bf16Unit::Amx => match super::amx::NativeTiles::new() {
                        Some(mut native) => {
                            // SAFETY: AMX is granted (a NativeTiles exists) and its products
                            // passed their self-check (`amx_in_use`); the output rows are this
                            // job's, as below.
                            unsafe {
                                let mut unit = tiles::OnTiles::new(&mut native);
                                tiles::attention_head(&mut unit, rows, bias, out_rows, columns, mask, scores, scale, &mut scratch)
                            };
                            true
                        }
                        None => false,
                    },
                    #[cfg(target_arch = "x86_64")]
                    Bf16Unit::Dot => {
                        // SAFETY: the bf16 linears run on `vdpbf16ps` here (`dot_in_use`), so the
                        // CPU has AVX-512 BF16; the output rows are this job's, as below.
                        unsafe { tiles::attention_head(&mut tiles::Dot, rows, bias, out_rows, columns, mask, scores, scale, &mut scratch) };
                        true
                    }
                    // `dot_in_use` is false off x86.
                    #[cfg(not(target_arch = "x86_64"))]
                    Bf16Unit::Dot => false,
                };
                if scratch.kept(MAX_KEPT_SCRATCH_FLOATS) {
                    TILE_SCRATCH.set(scratch);
                }
                if ran {
                    return;
                }
            }
            // The thread's scratch from its previous head, kept: a fresh one per rayon split
            // was a page fault per 4 KiB and a memset of every float, each layer.
            let mut scratch = SCRATCH.take();
            kernel::attention_head(rows, bias, out_rows, this.columns(head), this.mask, scores, scale, &mut scratch);
            // Up to 16 MiB stays with the thread (a head of 256 over ~10k tokens); a longer
            // sequence's scratch goes back to the allocator.
            if scratch.capacity() <= MAX_KEPT_SCRATCH_FLOATS {
                SCRATCH.set(scratch);
            }
        });
        // SAFETY: the cu_seqlens checked above cover all tokens, so the jobs wrote every row.
        unsafe { dst.set_len(tokens * out_width) };
        Ok((CpuStorage::F32(dst), Shape::from((tokens, out_width))))
    }
}
