//! The CPU attention kernel: one (sequence, head) at a time, Kᵀ packed once (16 keys at a
//! time), queries a block at a time into register tiles (AVX-512 tiles of eight rows by 32 keys
//! or 32 value dimensions where the CPU has it), scores softmaxed in place and multiplied into
//! the packed V. Each block of queries goes over only the keys its mask lets it see (a causal
//! block stops at its last query), in chunks that keep their Kᵀ and V in L2.

use super::{AttentionMask, DisentangledRows, HeadColumns};
use crate::kernels::dispatch::fma;
use crate::kernels::math::{exp, max_lanes, sum_lanes};

/// What one head adds to its scaled scores besides Q·Kᵀ.
#[derive(Clone, Copy)]
pub(super) struct ScoreTerms<'a> {
    /// A learned bias by distance (head's values, index of distance 0).
    pub relative: Option<(&'a [f32], usize)>,
    pub disentangled: Option<DisentangledRows<'a>>,
    pub softcap: Option<f32>,
}

/// Query rows and key columns of one score tile; the tile's 4×16 accumulators (and the 4×16
/// output tile of P·V) stay in eight AVX registers. With AVX-512 a tile has [`WIDE_TILE_Q`]
/// rows, one zmm register each: four chains of multiply-adds could not hide their latency
/// (attention was 37% of the FMA units' peak with four, measured on Zen 4).
const TILE_Q: usize = 4;
const WIDE_TILE_Q: usize = 8;
pub(super) const TILE_K: usize = 16;

/// Where dimension `d` of keys `j0..j0 + 16` (`j0` a multiple of 16) sits in the packed Kᵀ:
/// panels of 16 keys, each `head_dim` lines of 16 floats, one after the other. A tile's loads
/// walk one 4 KiB panel (for 64 dims) in order; in a row-major Kᵀ of a long sequence its 64
/// lines were `lk` floats apart, 64 KiB at 16k tokens, all in one set of the 8-way L1 cache.
#[inline(always)]
pub(super) const fn kt_index(head_dim: usize, j0: usize, d: usize) -> usize {
    j0 * head_dim + d * TILE_K
}

/// `TQ` query rows × 16 keys of the scores: row `r`, keys `j0..j0+16` of `scores` (rows `lk`
/// apart) get `Σ_d q[r·head_dim + d] · kt[kt_index(head_dim, j0, d) + c]`.
///
/// # Safety
/// `q` holds `TQ` rows of `head_dim`; `kt` holds the packed panels of `lk` keys with
/// `j0 + 16 <= lk`; `scores` holds `TQ` rows of `lk`.
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
        // SAFETY: dimension d < head_dim of the panel of keys j0..j0+16, inside lk.
        let kv = unsafe { &*(kt.add(kt_index(head_dim, j0, d)) as *const [f32; TILE_K]) };
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
    use super::{kt_index, TILE_K, WIDE_TILE_Q};
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
                let kv = _mm512_loadu_ps(kt.add(kt_index(head_dim, j0, d)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * head_dim + d)), kv, *acc);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(scores.add(r * lk + j0), *acc);
            }
        }
    }

    /// [`score_tile`] for 32 keys (`j0 + 32 <= lk`): each query broadcast feeds two
    /// accumulators, so a step loads 10 operands for 16 multiply-adds, not 9 for 8.
    ///
    /// # Safety
    /// As [`score_tile`], with 32 keys from `j0`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn score_tile_pair(q: *const f32, head_dim: usize, kt: *const f32, lk: usize, j0: usize, scores: *mut f32) {
        // SAFETY: the pointers cover the tile (this fn's contract); the feature is enabled.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; WIDE_TILE_Q];
            for d in 0..head_dim {
                let k0 = _mm512_loadu_ps(kt.add(kt_index(head_dim, j0, d)));
                let k1 = _mm512_loadu_ps(kt.add(kt_index(head_dim, j0 + TILE_K, d)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm512_set1_ps(*q.add(r * head_dim + d));
                    acc[0] = _mm512_fmadd_ps(qv, k0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(qv, k1, acc[1]);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(scores.add(r * lk + j0), acc[0]);
                _mm512_storeu_ps(scores.add(r * lk + j0 + TILE_K), acc[1]);
            }
        }
    }

    /// [`value_tile`] for 32 dimensions, the second 16 of row `j` at `v + j·width + second`
    /// (the next panel of the packed V): each weight broadcast feeds two accumulators.
    ///
    /// # Safety
    /// As [`value_tile`], for the 16 columns at `v` and the 16 at `v + second` of each row.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)] // the tile's geometry, as `value_tile` has it, and one offset
    pub(super) unsafe fn value_tile_pair(
        p: *const f32,
        lk: usize,
        len: usize,
        v: *const f32,
        width: usize,
        second: usize,
        init: &[[f32; 2 * TILE_K]; WIDE_TILE_Q],
    ) -> [[f32; 2 * TILE_K]; WIDE_TILE_Q] {
        // SAFETY: the pointers cover the tile (this fn's contract); the feature is enabled.
        unsafe {
            let mut acc = init.map(|row| [_mm512_loadu_ps(row.as_ptr()), _mm512_loadu_ps(row.as_ptr().add(TILE_K))]);
            for j in 0..len {
                let v0 = _mm512_loadu_ps(v.add(j * width));
                let v1 = _mm512_loadu_ps(v.add(j * width + second));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let weight = _mm512_set1_ps(*p.add(r * lk + j));
                    acc[0] = _mm512_fmadd_ps(weight, v0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(weight, v1, acc[1]);
                }
            }
            let mut out = [[0.0; 2 * TILE_K]; WIDE_TILE_Q];
            for (row, acc) in out.iter_mut().zip(&acc) {
                _mm512_storeu_ps(row.as_mut_ptr(), acc[0]);
                _mm512_storeu_ps(row.as_mut_ptr().add(TILE_K), acc[1]);
            }
            out
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
        init: &[[f32; TILE_K]; WIDE_TILE_Q],
    ) -> [[f32; TILE_K]; WIDE_TILE_Q] {
        // SAFETY: the pointers cover the tile (this fn's contract); the feature is enabled.
        unsafe {
            let mut acc = init.map(|row| _mm512_loadu_ps(row.as_ptr()));
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

/// `TQ` query rows × 16 dimensions of P·V added to `init`: row `r` gets
/// `init[r][c] + Σ_j p[r·lk + j] · v[j·width + c]`, the sum in key order (so a span of keys split
/// into chunks, each continuing from the last one's sums, gives the same floats as one pass).
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
    init: &[[f32; TILE_K]; TQ],
) -> [[f32; TILE_K]; TQ] {
    let mut acc = *init;
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
pub(super) static MAX_SCRATCH_FLOATS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

multiversion! {
    /// One head of one sequence. `rows` are the sequence's fused QKV rows; `cols` says where
    /// the head's columns are; the output rows start at `out`.
    ///
    /// Kᵀ (biased) and V are packed once; then, [`QUERY_BLOCK`] queries at a time, Q (biased,
    /// pre-scaled) is packed into zero-padded tiles, scores are computed tile by tile over the
    /// block's span of keys ([`block_keys`]), softmaxed over the keys the mask allows (the others
    /// in the span get weight 0), and the span multiplied into the packed V.
    #[allow(clippy::too_many_arguments)] // one head's geometry; a struct would be rebuilt per head in the hot loop
    pub(super) fn attention_head(
        rows: &[f32],
        bias: &[f32],
        out: *mut f32,
        cols: HeadColumns,
        mask: AttentionMask,
        terms: ScoreTerms,
        scale: f32,
        scratch: &mut Vec<f32>,
    ) {
        let head = Head::new(rows, bias, cols);
        let (len, lk, head_dim) = (head.len, head.lk, cols.head_dim);
        let tile_q = if WIDE { WIDE_TILE_Q } else { TILE_Q };
        let block = QUERY_BLOCK.min(len.div_ceil(WIDE_TILE_Q) * WIDE_TILE_Q);
        // Not cleared: every float a head reads is written first (packed queries with their
        // padding rows, Kᵀ with its padding keys, the scores of the keys that exist).
        let needed = block * head_dim + head_dim * lk + len * head_dim + block * lk;
        if scratch.len() < needed {
            scratch.resize(needed, 0.0);
        }
        let scratch = &mut scratch[..needed];
        #[cfg(test)]
        MAX_SCRATCH_FLOATS.fetch_max(scratch.len(), std::sync::atomic::Ordering::Relaxed);
        let (q, rest) = scratch.split_at_mut(block * head_dim);
        let (kt, rest) = rest.split_at_mut(head_dim * lk);
        let (values, scores) = rest.split_at_mut(len * head_dim);
        head.pack_keys_and_values(kt, values);
        for first in (0..len).step_by(block) {
            let n = block.min(len - first);
            let lq = n.div_ceil(tile_q) * tile_q;
            let keys = block_keys(mask, first, n, len);
            head.pack_queries(first, n, scale, q);
            head.scores::<FMA, WIDE>(&q[..lq * head_dim], kt, &mut scores[..lq * lk], keys.clone());
            for i in 0..n {
                weigh_keys(&mut scores[i * lk + keys.start..i * lk + keys.end], keys.start, first + i, len, mask, terms);
            }
            // SAFETY: `out` is this head's output rows as the caller hands them over (row 0 of
            // the sequence; this job alone writes this head's columns of them).
            unsafe { head.weighted_values::<FMA, WIDE>(&scores[..lq * lk], values, first, n, keys, out) };
        }
    }
}

/// The keys some query of `first..first + n` attends to, the start rounded down to a whole tile
/// (the scores are computed in tiles of [`TILE_K`] keys from it; keys inside the span that a
/// query's mask excludes get weight 0). Every [`AttentionMask`] is monotone in the query, so the
/// first query's lowest key and the last one's highest bound the block's. A causal block skips the
/// keys after its last query: for one long decoder input, half of both products and the softmax,
/// as PyTorch's flash attention skips the blocks above the diagonal. The span always holds the
/// block's own positions, so it is never empty.
#[inline(always)]
pub(super) fn block_keys(mask: AttentionMask, first: usize, n: usize, len: usize) -> std::ops::Range<usize> {
    let lo = mask.keys(first, len).0.min(first);
    let hi = mask.keys(first + n - 1, len).1.max(first + n).min(len);
    lo / TILE_K * TILE_K..hi
}

/// One head of one sequence, as [`attention_head`] walks it.
pub(super) struct Head<'a> {
    rows: &'a [f32],
    cols: HeadColumns,
    pub(super) q_bias: &'a [f32],
    pub(super) k_bias: &'a [f32],
    pub(super) v_bias: &'a [f32],
    pub(super) len: usize,
    /// Keys rounded up to whole tiles: the row length of Kᵀ and of the scores.
    pub(super) lk: usize,
}

impl<'a> Head<'a> {
    #[inline(always)]
    pub(super) fn new(rows: &'a [f32], bias: &'a [f32], cols: HeadColumns) -> Self {
        let HeadColumns { width, q, k, v, head_dim, .. } = cols;
        let len = rows.len() / width;
        Head {
            rows,
            cols,
            q_bias: &bias[q..q + head_dim],
            k_bias: &bias[k..k + head_dim],
            v_bias: &bias[v..v + head_dim],
            len,
            lk: len.div_ceil(TILE_K) * TILE_K,
        }
    }

    /// Kᵀ (biased) into `kt`, panels of 16 keys ([`kt_index`]) over `lk` keys, and V (unbiased)
    /// into `values`, panels of 16 dimensions over the `len` keys ([`v_index`]), prefetching the
    /// rows ahead. V is read once per block of queries:
    /// straight from the QKV rows, a long sequence's rows (one page or more apart for a wide
    /// model) missed the TLB on every key, and the products over V took twice those over Kᵀ.
    #[inline(always)]
    fn pack_keys_and_values(&self, kt: &mut [f32], values: &mut [f32]) {
        let HeadColumns { width, q: qc, k: kc, v: vc, head_dim, .. } = self.cols;
        let rows = self.rows;
        let dims_tiled = head_dim / TILE_K * TILE_K;
        // A block of keys at a time, dimension by dimension: the block's K rows stay in L1 and
        // each dimension's 16 keys fill one line of Kᵀ. (Key by key, every value went to
        // another line of a Kᵀ larger than L1: 40% of a wide head's attention time.)
        for i0 in (0..self.len).step_by(TILE_K) {
            let keys = TILE_K.min(self.len - i0);
            for i in i0 + PREFETCH_ROWS..(i0 + keys + PREFETCH_ROWS).min(self.len) {
                for c in [qc, kc, vc] {
                    prefetch(&rows[i * width + c..i * width + c + head_dim]);
                }
            }
            let block = &rows[i0 * width + kc..(i0 + keys - 1) * width + kc + head_dim];
            for (d, &b) in self.k_bias.iter().enumerate() {
                let line = &mut kt[kt_index(head_dim, i0, d)..kt_index(head_dim, i0, d) + TILE_K];
                line.iter_mut().enumerate().for_each(|(j, slot)| *slot = if j < keys { block[j * width + d] + b } else { 0.0 });
            }
            for i in i0..i0 + keys {
                let src = &rows[i * width + vc..i * width + vc + head_dim];
                for d0 in (0..dims_tiled).step_by(TILE_K) {
                    let at = v_index(self.len, head_dim, i, d0);
                    values[at..at + TILE_K].copy_from_slice(&src[d0..d0 + TILE_K]);
                }
                let at = v_index(self.len, head_dim, i, dims_tiled);
                values[at..at + head_dim - dims_tiled].copy_from_slice(&src[dims_tiled..]);
            }
        }
        // The padding keys of the last panel are 0 (above): they score 0, never weighed, but
        // finite.
    }

    /// Q (biased, pre-scaled) of queries `first..first + n` into `q`; its padding rows zero.
    #[inline(always)]
    fn pack_queries(&self, first: usize, n: usize, scale: f32, q: &mut [f32]) {
        let HeadColumns { width, q: qc, head_dim, .. } = self.cols;
        q[n * head_dim..].fill(0.0);
        for i in 0..n {
            let src = &self.rows[(first + i) * width + qc..(first + i) * width + qc + head_dim];
            let dst = &mut q[i * head_dim..(i + 1) * head_dim];
            dst.iter_mut().zip(src).zip(self.q_bias).for_each(|((d, s), b)| *d = (s + b) * scale);
        }
    }

    /// `scores = (scale·Q)·Kᵀ` for the packed queries (whole tiles of rows), tile by tile, over
    /// `keys` (its start a multiple of [`TILE_K`], its end rounded up to one); the other columns
    /// are left as they were.
    #[inline(always)]
    fn scores<const FMA: bool, const WIDE: bool>(&self, q: &[f32], kt: &[f32], scores: &mut [f32], keys: std::ops::Range<usize>) {
        let (head_dim, lk) = (self.cols.head_dim, self.lk);
        let tile_q = if WIDE { WIDE_TILE_Q } else { TILE_Q };
        let lq = q.len() / head_dim;
        let kt = &kt[..head_dim * lk];
        // Whole tiles inside lk (a multiple of TILE_K), whatever the range says.
        let (start, end) = (keys.start / TILE_K * TILE_K, (keys.end.div_ceil(TILE_K) * TILE_K).min(lk));
        // A chunk of keys at a time over every tile of queries, so that the chunk's Kᵀ stays in
        // L2 ([`key_chunk`]); the floats are the same in any order.
        let chunk = key_chunk(head_dim);
        for c0 in (start..end).step_by(chunk) {
            let c1 = (c0 + chunk).min(end);
            for i0 in (0..lq).step_by(tile_q) {
                // One tile of rows each: a buffer shorter than whole tiles panics here.
                let q = q[i0 * head_dim..(i0 + tile_q) * head_dim].as_ptr();
                let scores = scores[i0 * lk..(i0 + tile_q) * lk].as_mut_ptr();
                let mut j0 = c0;
                while j0 < c1 {
                    // SAFETY: tile_q rows of q and of scores (the slices above), keys j0+16 ≤ c1 ≤
                    // lk of kt (head_dim × lk, sliced above; j0 and c1 multiples of 16), j0+32 ≤ c1
                    // for the pair.
                    unsafe {
                        #[cfg(target_arch = "x86_64")]
                        if WIDE {
                            if j0 + 2 * TILE_K <= c1 {
                                wide::score_tile_pair(q, head_dim, kt.as_ptr(), lk, j0, scores);
                                j0 += 2 * TILE_K;
                            } else {
                                wide::score_tile(q, head_dim, kt.as_ptr(), lk, j0, scores);
                                j0 += TILE_K;
                            }
                            continue;
                        }
                        {
                            score_tile::<TILE_Q, FMA>(q, head_dim, kt.as_ptr(), lk, j0, scores);
                        }
                    }
                    j0 += TILE_K;
                }
            }
        }
    }

    /// `out = P·V + v_bias` for queries `first..first + n` (each row of P sums to 1, so V's bias
    /// passes through unchanged), `tile_q` queries × 16 head dims at a time (head_dim is a
    /// multiple of 16 for every model we serve; the remainder loop keeps other sizes correct).
    /// `values` is V packed ([`v_index`]); only the weights of `keys` (a nonempty
    /// range of the sequence's keys, outside which every weight of these rows is 0) are read.
    ///
    /// The keys go by in chunks of [`key_chunk`], each over every tile of rows, so a chunk of V
    /// stays in L2 while it is used; the output rows keep the sums between chunks, and each
    /// tile's sums go on in key order, so the floats are those of one pass over all keys.
    ///
    /// # Safety
    /// `out` addresses the sequence's `len` output rows, `out_width` apart, and nothing else
    /// writes this head's columns of them meanwhile.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // one block's geometry, as `attention_head` has it
    unsafe fn weighted_values<const FMA: bool, const WIDE: bool>(
        &self,
        scores: &[f32],
        values: &[f32],
        first: usize,
        n: usize,
        keys: std::ops::Range<usize>,
        out: *mut f32,
    ) {
        let HeadColumns { q: qc, head_dim, out_width, .. } = self.cols;
        let lk = self.lk;
        let keys = keys.start..keys.end.min(self.len);
        assert!(!keys.is_empty(), "an empty span of keys");
        // In a panel of the packed V, a key's 16 values follow the previous key's.
        let (seq_len, width) = (self.len, TILE_K);
        let tile_q = if WIDE { WIDE_TILE_Q } else { TILE_Q };
        let lq = scores.len() / lk;
        let dims_tiled = head_dim / TILE_K * TILE_K;
        let chunk = key_chunk(head_dim);
        for k0 in keys.clone().step_by(chunk) {
            // This chunk's keys k0..k0 + len; the first chunk starts from V's bias.
            let len = chunk.min(keys.end - k0);
            let from_bias = k0 == keys.start;
            for i0 in (0..lq).step_by(tile_q) {
                // One tile of rows from key k0: a buffer shorter than whole tiles panics here.
                let p = scores[i0 * lk + k0..(i0 + tile_q) * lk].as_ptr();
                // The rows of the tile that are queries (the others are padding).
                let real = n.saturating_sub(i0).min(tile_q);
                let out_row = |r: usize, d0: usize| {
                    // SAFETY: row first+i0+r < len of the sequence (r < real), columns qc+d0.. of
                    // this head, inside the output (this fn's contract).
                    unsafe { out.add((first + i0 + r) * out_width + qc + d0) }
                };
                #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
                let mut d0 = 0;
                #[cfg(target_arch = "x86_64")]
                while WIDE && d0 + 2 * TILE_K <= dims_tiled {
                    // SAFETY: the previous chunk wrote these 32 columns of the real rows.
                    let init = unsafe {
                        tile_start::<WIDE_TILE_Q, { 2 * TILE_K }>(from_bias.then(|| &self.v_bias[d0..]), real, |r| out_row(r, d0))
                    };
                    // V's dims d0..d0+32 of the chunk's keys: two panels, the second `second` on.
                    let second = v_index(seq_len, head_dim, 0, d0 + TILE_K) - v_index(seq_len, head_dim, 0, d0);
                    let v =
                        values[v_index(seq_len, head_dim, k0, d0)..v_index(seq_len, head_dim, k0 + len - 1, d0 + TILE_K) + TILE_K].as_ptr();
                    // SAFETY: tile_q rows of the scores from key k0 (the slice `p` above, k0 + len ≤
                    // lk each), `len` keys of V's two panels from `v` (the slice above, from the
                    // first panel's first key to the second's last), 16 values each.
                    // SAFETY (store): as `out_row`, 32 columns.
                    unsafe { store_tile(&wide::value_tile_pair(p, lk, len, v, width, second, &init), real, |r| out_row(r, d0)) };
                    d0 += 2 * TILE_K;
                }
                for d0 in (d0..dims_tiled).step_by(TILE_K) {
                    // V's dims d0..d0+16 of the chunk's keys, in their panel.
                    let v = values[v_index(seq_len, head_dim, k0, d0)..v_index(seq_len, head_dim, k0 + len - 1, d0) + TILE_K].as_ptr();
                    // SAFETY: tile_q rows of the scores from key k0 (the slice `p` above, k0 + len ≤
                    // lk each), `len` rows of V from `v` (the slice above); the output as `out_row`,
                    // 16 columns, written by the previous chunk where read.
                    unsafe {
                        #[cfg(target_arch = "x86_64")]
                        if WIDE {
                            let init = tile_start::<WIDE_TILE_Q, TILE_K>(from_bias.then(|| &self.v_bias[d0..]), real, |r| out_row(r, d0));
                            store_tile(&wide::value_tile(p, lk, len, v, width, &init), real, |r| out_row(r, d0));
                            continue;
                        }
                        {
                            let init = tile_start::<TILE_Q, TILE_K>(from_bias.then(|| &self.v_bias[d0..]), real, |r| out_row(r, d0));
                            store_tile(&value_tile::<TILE_Q, FMA>(p, lk, len, v, width, &init), real, |r| out_row(r, d0));
                        }
                    }
                }
                for r in 0..real {
                    let i = i0 + r;
                    for d in dims_tiled..head_dim {
                        let sum = (k0..k0 + len).map(|j| scores[i * lk + j] * values[v_index(seq_len, head_dim, j, d)]).sum::<f32>();
                        // SAFETY: as `out_row`; column d was written by the previous chunk where read.
                        unsafe {
                            let slot = out_row(r, d);
                            *slot = if from_bias { self.v_bias[d] } else { *slot } + sum;
                        }
                    }
                }
            }
        }
    }
}

/// The sums a tile of `TQ` rows × `W` dims starts a chunk of keys from: the first `W` of
/// `bias` (V's bias from the tile's first dim) in the first chunk, else what the previous chunk
/// left in the output (`row(r)`, the tile's first column in row `r`); 0 for the padding rows
/// from `real` on.
///
/// # Safety
/// Without `bias`, `row(r)` for each `r < real` points at `W` floats written before.
#[inline(always)]
unsafe fn tile_start<const TQ: usize, const W: usize>(
    bias: Option<&[f32]>,
    real: usize,
    row: impl Fn(usize) -> *mut f32,
) -> [[f32; W]; TQ] {
    let mut init = [[0f32; W]; TQ];
    for (r, sums) in init.iter_mut().enumerate().take(real) {
        match bias {
            Some(bias) => sums.copy_from_slice(&bias[..W]),
            // SAFETY: W floats written before at row(r) (this fn's contract).
            None => unsafe { std::ptr::copy_nonoverlapping(row(r), sums.as_mut_ptr(), W) },
        }
    }
    init
}

/// The first `real` rows of a tile's sums into the output, row `r` at `row(r)`.
///
/// # Safety
/// `row(r)` for each `r < real` points at `W` floats this thread alone may write.
#[inline(always)]
unsafe fn store_tile<const TQ: usize, const W: usize>(sums: &[[f32; W]; TQ], real: usize, row: impl Fn(usize) -> *mut f32) {
    for (r, sums) in sums.iter().enumerate().take(real) {
        // SAFETY: W writable floats at row(r) (this fn's contract).
        unsafe { std::ptr::copy_nonoverlapping(sums.as_ptr(), row(r), W) };
    }
}

/// Where dimension `d` of key `j` sits in the packed V of a `len`-key head: the dimensions in
/// panels of 16 (each `len` keys × 16 floats, a key's 16 after the previous key's), then the
/// dimensions past the last whole panel, key by key. A tile of P·V reads its panel in order;
/// with V row-major, its 16 values of each key were `head_dim` floats apart, and a chunk's keys
/// fell on 16 sets of the L1 cache.
#[inline(always)]
pub(super) const fn v_index(len: usize, head_dim: usize, j: usize, d: usize) -> usize {
    let tiled = head_dim / TILE_K * TILE_K;
    if d < tiled {
        d / TILE_K * len * TILE_K + j * TILE_K + d % TILE_K
    } else {
        tiled * len + j * (head_dim - tiled) + (d - tiled)
    }
}

/// Keys per chunk of P·V and of the scores: a chunk of Kᵀ or V (`head_dim` × chunk floats)
/// fills 64 KiB, which stays in L2 while every tile of a block's queries goes over it (a whole
/// long sequence's Kᵀ or V, several MiB, came from L3 or memory again for each tile of rows).
/// A multiple of 32 keys, the pair tiles' width.
#[inline(always)]
pub(super) fn key_chunk(head_dim: usize) -> usize {
    ((16 * 1024 / head_dim.max(1)) / (2 * TILE_K) * (2 * TILE_K)).max(2 * TILE_K)
}

multiversion! {
    /// Rows of `scores` (`lk` apart: queries `first..` of a `len`-token sequence), over the
    /// block's span of keys `keys` ([`block_keys`]), into their softmax's numerators rounded to
    /// bf16 into the same columns of `weights` (zero where the mask excludes a key, and from the
    /// span's end to `span_end`, whole tiles), and each row's `1 / Σ` into `inverse_sums`: the
    /// P·V sums are scaled by it afterwards, as flash attention does, which saves a pass
    /// over each row. [`score_terms`] and `exp`
    /// compiled for this CPU, for the bf16 kernel, which runs outside [`attention_head`].
    #[allow(clippy::too_many_arguments)] // the block's geometry and the head's score terms
    pub(super) fn weigh_and_round_rows(
        scores: &mut [f32],
        weights: &mut [u16],
        inverse_sums: &mut [f32],
        lk: usize,
        keys: std::ops::Range<usize>,
        span_end: usize,
        len: usize,
        first: usize,
        mask: AttentionMask,
        terms: ScoreTerms,
    ) {
        for (i, ((row, rounded), inverse)) in scores.chunks_mut(lk).zip(weights.chunks_mut(lk)).zip(inverse_sums).enumerate() {
            let row = &mut row[keys.clone()];
            let rounded = &mut rounded[keys.start..span_end];
            let (lo, hi) = score_terms(row, keys.start, first + i, len, mask, terms);
            // Separate passes over the row, in L1: a loop that both exponentiates and sums (or
            // rounds) did not vectorize, and ran 2.7× slower.
            let (row, out) = (&mut row[lo..hi], &mut rounded[lo..hi]);
            let max = max_lanes(row);
            row.iter_mut().for_each(|v| *v = exp(*v - max));
            let sum = sum_lanes(row);
            out.iter_mut().zip(row.iter()).for_each(|(o, &e)| *o = crate::kernels::sgemm::round(e));
            *inverse = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            rounded[..lo].fill(0);
            rounded[hi..].fill(0);
        }
    }
}

/// One query's scores into its weights over the keys: the score terms added, the soft cap,
/// softmax over the keys the mask allows, 0 for the others. `row` holds the scores of keys
/// `key0..key0 + row.len()` of a `len`-token sequence, a span that holds every key the mask lets
/// this query see.
#[inline(always)]
fn weigh_keys(row: &mut [f32], key0: usize, query: usize, len: usize, mask: AttentionMask, terms: ScoreTerms) {
    let (lo, hi) = score_terms(row, key0, query, len, mask, terms);
    softmax_in_place(&mut row[lo..hi]);
    row[..lo].fill(0.0);
    row[hi..].fill(0.0);
}

/// The score terms and the soft cap added to one query's scores (`row`, keys `key0..` as in
/// [`weigh_keys`]); returns the part of `row` the mask allows.
#[inline(always)]
fn score_terms(row: &mut [f32], key0: usize, query: usize, len: usize, mask: AttentionMask, terms: ScoreTerms) -> (usize, usize) {
    let span = row.len();
    if let Some((bias, center)) = terms.relative {
        // Distance j − query of key j is at center + j − query.
        row.iter_mut().zip(&bias[center + key0 - query..center + key0 - query + span]).for_each(|(s, b)| *s += b);
    }
    if let Some(terms) = terms.disentangled {
        row.iter_mut().enumerate().for_each(|(j, s)| *s += terms.get(query, key0 + j));
    }
    let (lo, hi) = mask.keys(query, len);
    let (lo, hi) = (lo.saturating_sub(key0).min(span), hi.saturating_sub(key0).min(span));
    if let Some(cap) = terms.softcap {
        row[lo..hi].iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
    }
    (lo, hi)
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
