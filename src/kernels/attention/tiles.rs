//! Attention's two products on AMX tiles, for models whose linears run in bf16 on AMX (the
//! backbone's forward under [`super::with_bf16_tiles`]), on sequences of at least
//! `TILES_MIN_LEN` tokens (`attention/mod.rs` says why): Q·Kᵀ and P·V as `TDPBF16PS` on bf16
//! operands with f32 sums, as OpenVINO runs its attention on such CPUs. The score terms, the
//! mask and the softmax stay f32 ([`super::kernel::weigh_keys`]), and so does everything a
//! float32 model runs.
//!
//! Per (sequence, head): Kᵀ and V are packed once as weight tiles (the bf16 panel layout of
//! `sgemm`: a 64-byte row holds 16 columns × a pair of the reduced dimension), then
//! [`QUERY_BLOCK`] queries at a time the queries (biased, pre-scaled) and then the weights P
//! are rounded to bf16 rows and run through the same [`Block`] as the bf16 products: 32 rows ×
//! 2 panels per block. Keys past the sequence are zero in K and V and weigh 0 in P, so whole
//! tiles never mix them in.

use super::kernel::{weigh_rows, Head, ScoreTerms, QUERY_BLOCK};
use super::{AttentionMask, HeadColumns};
use crate::kernels::amx::block::{Accumulator, Bf16, Block};
use crate::kernels::amx::{Tiles, ROW_BYTES, TILE_ROWS};
use crate::kernels::sgemm::round as bf16;

/// Columns of a weight tile (and of a panel): 16 f32 accumulator lanes.
const PANEL: usize = 16;

/// Each thread's bf16 scratch, reused across heads.
#[derive(Default)]
pub(super) struct Scratch {
    f32s: Vec<f32>,
    /// Kᵀ panels, V panels, the query rows and the weight rows, in bf16.
    halves: Vec<u16>,
}

impl Scratch {
    /// Whether the scratch is small enough to keep for the next head (`floats` of each kind).
    pub(super) fn kept(&self, floats: usize) -> bool {
        self.f32s.capacity() <= floats && self.halves.capacity() <= 2 * floats
    }
}

/// Whether a head of `head_dim` runs here: the pairs of the reduced dimension must not mix two
/// heads' columns.
pub(super) fn takes(head_dim: usize) -> bool {
    head_dim.is_multiple_of(2)
}

multiversion! {
    /// The head's keys (columns `kc..kc + head_dim` of the `len` QKV rows, `width` apart, plus
    /// `k_bias`) as weight panels of Kᵀ: 16 keys over pairs of dimensions,
    /// `dst[(p·pairs + g)·32 + 2c + t] = K[16p + c][2g + t]`, zero for keys past `len`. Each
    /// panel's 16 keys are rounded row by row into `staged` (16 × head_dim, contiguous, so the
    /// rounding vectorizes), then transposed pair by pair.
    fn pack_keys(rows: &[f32], width: usize, kc: usize, k_bias: &[f32], len: usize, staged: &mut [u16], dst: &mut [u16]) {
        let head_dim = k_bias.len();
        let pairs = head_dim / 2;
        for p in 0..len.div_ceil(PANEL) {
            let keys = PANEL.min(len - p * PANEL);
            for c in 0..keys {
                let key = p * PANEL + c;
                let src = &rows[key * width + kc..key * width + kc + head_dim];
                let out = &mut staged[c * head_dim..(c + 1) * head_dim];
                out.iter_mut().zip(src).zip(k_bias).for_each(|((o, &s), &b)| *o = bf16(s + b));
            }
            staged[keys * head_dim..PANEL * head_dim].fill(0);
            let panel = &mut dst[p * pairs * 2 * PANEL..(p + 1) * pairs * 2 * PANEL];
            for (g, line) in panel.chunks_exact_mut(2 * PANEL).enumerate() {
                for (c, pair) in line.chunks_exact_mut(2).enumerate() {
                    pair.copy_from_slice(&staged[c * head_dim + 2 * g..c * head_dim + 2 * g + 2]);
                }
            }
        }
    }
}

multiversion! {
    /// The head's values (columns `vc..vc + head_dim` of the `len` QKV rows, without their
    /// bias) as weight panels of V: 16 dimensions over pairs of keys,
    /// `dst[(p·pairs + g)·32 + 2c + t] = V[2g + t][16p + c]`, `pairs` of them (zero past `len`
    /// keys and past `head_dim` columns): each line interleaves two keys' 16 values.
    fn pack_values(rows: &[f32], width: usize, vc: usize, head_dim: usize, len: usize, pairs: usize, dst: &mut [u16]) {
        let no_key: &[f32] = &[];
        for g in 0..pairs {
            let (even, odd) = (2 * g, 2 * g + 1);
            let even = if even < len { &rows[even * width + vc..even * width + vc + head_dim] } else { no_key };
            let odd = if odd < len { &rows[odd * width + vc..odd * width + vc + head_dim] } else { no_key };
            for p in 0..head_dim.div_ceil(PANEL) {
                let line = &mut dst[(p * pairs + g) * 2 * PANEL..(p * pairs + g + 1) * 2 * PANEL];
                let value = |row: &[f32], c: usize| row.get(p * PANEL + c).copied().unwrap_or(0.0);
                for (c, pair) in line.chunks_exact_mut(2).enumerate() {
                    pair[0] = bf16(value(even, c));
                    pair[1] = bf16(value(odd, c));
                }
            }
        }
    }
}

multiversion! {
    /// Queries `first..first + n` (columns `qc..` of the QKV rows, plus `q_bias`, times
    /// `scale`) as bf16 rows of `head_dim`.
    #[allow(clippy::too_many_arguments)] // the rows' geometry and the block's, as the caller has them
    fn pack_queries(rows: &[f32], width: usize, qc: usize, q_bias: &[f32], first: usize, n: usize, scale: f32, dst: &mut [u16]) {
        let head_dim = q_bias.len();
        for (i, out) in dst.chunks_mut(head_dim).take(n).enumerate() {
            let src = &rows[(first + i) * width + qc..(first + i) * width + qc + head_dim];
            out.iter_mut().zip(src).zip(q_bias).for_each(|((o, &s), &b)| *o = bf16((s + b) * scale));
        }
    }
}

multiversion! {
    /// `src` rounded to bf16 into `dst` (as long), ties to even: vectorized where the CPU has
    /// AVX2 or AVX-512.
    fn round_into(src: &[f32], dst: &mut [u16]) {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = bf16(s));
    }
}

/// `c (rows × 16·panels, f32, ldc apart) = a · b`: `a` holds `rows` rows of `groups` bf16 pairs
/// (`a_stride` bytes apart), `b` `panels` weight panels of `groups` 64-byte rows.
///
/// # Safety
/// `tiles` runs on this CPU; the operands hold what is said above; `c` holds `rows` rows of
/// `ldc ≥ 16·panels` floats.
unsafe fn product<T: Tiles>(
    tiles: &mut T,
    block: &mut Block,
    (a, a_stride, rows): (*const u8, usize, usize),
    (b, panels, groups): (*const u8, usize, usize),
    (c, ldc): (*mut f32, usize),
) {
    let mut acc = [Accumulator([[0.0f32; PANEL]; TILE_ROWS]); 4];
    for m0 in (0..rows).step_by(2 * TILE_ROWS) {
        let block_rows = (rows - m0).min(2 * TILE_ROWS);
        block.a_rows = [block_rows.min(TILE_ROWS), block_rows.saturating_sub(TILE_ROWS)];
        for p0 in (0..panels).step_by(2) {
            block.b_tiles = (panels - p0).min(2);
            // SAFETY: rows m0.. of a and panels p0.. of b lie inside them (this fn's contract).
            unsafe {
                block.accumulate::<T, Bf16, f32>(
                    tiles,
                    &mut acc,
                    groups,
                    (a.add(m0 * a_stride), a_stride),
                    (b.add(p0 * groups * ROW_BYTES), groups * ROW_BYTES),
                );
            }
            for (t, acc) in acc.iter().enumerate() {
                let (ai, bi) = (t / 2, t % 2);
                if block.a_rows[ai] == 0 || bi >= block.b_tiles {
                    continue;
                }
                for r in 0..block.a_rows[ai] {
                    // SAFETY: row m0 + 16·ai + r < rows, columns of panel p0 + bi < panels.
                    unsafe {
                        let at = c.add((m0 + TILE_ROWS * ai + r) * ldc + (p0 + bi) * PANEL);
                        std::ptr::copy_nonoverlapping(acc.0[r].as_ptr(), at, PANEL);
                    }
                }
            }
        }
    }
}

/// One head of one sequence on `tiles`, as [`super::kernel::attention_head`] computes it in
/// f32 (its arguments), with Q, K, P and V rounded to bf16. Releases the tiles at the end.
///
/// # Safety
/// `tiles` runs on this CPU; `out` is as [`super::kernel::attention_head`] takes it.
#[allow(clippy::too_many_arguments)] // attention_head's geometry, and the tiles
pub(super) unsafe fn attention_head<T: Tiles>(
    tiles: &mut T,
    rows: &[f32],
    bias: &[f32],
    out: *mut f32,
    cols: HeadColumns,
    mask: AttentionMask,
    terms: ScoreTerms,
    scale: f32,
    scratch: &mut Scratch,
) {
    let head = Head::new(rows, bias, cols);
    let (len, lk, head_dim) = (head.len, head.lk, cols.head_dim);
    let block_queries = QUERY_BLOCK.min(len.div_ceil(TILE_ROWS) * TILE_ROWS);
    let (dim_pairs, dim_panels, key_pairs) = (head_dim / 2, head_dim.div_ceil(PANEL), lk / 2);
    let vw = dim_panels * PANEL;
    // f32: the block's scores, then its P·V sums.
    let needed = block_queries * lk + block_queries * vw;
    if scratch.f32s.len() < needed {
        scratch.f32s.resize(needed, 0.0);
    }
    let (scores, rest) = scratch.f32s.split_at_mut(block_queries * lk);
    let pv = &mut rest[..block_queries * vw];
    // bf16: K's panels (lk/16 over the head's pairs), V's (head_dim/16 over the keys' pairs),
    // the block's query rows and weight rows.
    let (k_size, v_size) = ((lk / PANEL) * dim_pairs * 2 * PANEL, dim_panels * key_pairs * 2 * PANEL);
    let halves = k_size + v_size + block_queries * head_dim + block_queries * lk + PANEL * head_dim;
    if scratch.halves.len() < halves {
        scratch.halves.resize(halves, 0);
    }
    let (k_panels, rest) = scratch.halves.split_at_mut(k_size);
    let (v_panels, rest) = rest.split_at_mut(v_size);
    let (q_rows, rest) = rest.split_at_mut(block_queries * head_dim);
    let (p_rows, rest) = rest.split_at_mut(block_queries * lk);
    let staged = &mut rest[..PANEL * head_dim];
    let width = cols.width;
    pack_keys(rows, width, cols.k, head.k_bias, len, staged, k_panels);
    pack_values(rows, width, cols.v, head_dim, len, key_pairs, v_panels);
    let mut block = Block::default();
    for first in (0..len).step_by(block_queries) {
        let n = block_queries.min(len - first);
        pack_queries(rows, width, cols.q, head.q_bias, first, n, scale, q_rows);
        // SAFETY: n query rows of dim_pairs pairs; lk/16 panels of dim_pairs rows; n rows of lk
        // scores; `tiles` runs here (this fn's contract).
        unsafe {
            product(
                tiles,
                &mut block,
                (q_rows.as_ptr() as *const u8, head_dim * 2, n),
                (k_panels.as_ptr() as *const u8, lk / PANEL, dim_pairs),
                (scores.as_mut_ptr(), lk),
            );
        }
        weigh_rows(&mut scores[..n * lk], lk, len, first, mask, terms);
        round_into(&scores[..n * lk], &mut p_rows[..n * lk]);
        // SAFETY: n weight rows of lk/2 pairs; dim_panels panels of lk/2 rows; n rows of vw.
        unsafe {
            product(
                tiles,
                &mut block,
                (p_rows.as_ptr() as *const u8, lk * 2, n),
                (v_panels.as_ptr() as *const u8, dim_panels, key_pairs),
                (pv.as_mut_ptr(), vw),
            );
        }
        for i in 0..n {
            let sums = &pv[i * vw..i * vw + head_dim];
            // SAFETY: row first + i < len of the output, this head's columns (the caller's
            // contract: this job alone writes them).
            let dst = unsafe { std::slice::from_raw_parts_mut(out.add((first + i) * cols.out_width + cols.q), head_dim) };
            dst.iter_mut().zip(sums).zip(head.v_bias).for_each(|((d, s), b)| *d = s + b);
        }
    }
    // SAFETY: the tiles were configured by this call.
    unsafe { tiles.release() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::amx::{NativeTiles, TileModel};

    #[test]
    fn value_panels_hold_sixteen_dimensions_over_pairs_of_keys() {
        let (len, width, head_dim) = (3, 40, 18);
        let rows: Vec<f32> = (0..len * width).map(|i| i as f32).collect();
        let mut dst = vec![7u16; 2 * 2 * 2 * PANEL];
        pack_values(&rows, width, 20, head_dim, len, 2, &mut dst);
        let at = |p: usize, g: usize, c: usize, t: usize| crate::kernels::sgemm::widen(dst[(p * 2 + g) * 32 + 2 * c + t]);
        assert_eq!(at(0, 0, 5, 1), rows[width + 20 + 5]);
        assert_eq!(at(1, 1, 1, 0), rows[2 * width + 20 + 17]);
        assert_eq!(at(1, 1, 1, 1), 0.0, "past the keys");
        assert_eq!(at(1, 0, 2, 0), 0.0, "past the head's dimensions");
    }

    #[test]
    fn key_panels_hold_sixteen_keys_over_pairs_of_dimensions() {
        let (len, width, head_dim) = (17, 8, 4);
        let rows: Vec<f32> = (0..len * width).map(|i| (i % 97) as f32).collect();
        let bias = [0.5, 1.0, 0.0, 2.0];
        let mut dst = vec![7u16; 2 * 2 * 2 * PANEL];
        pack_keys(&rows, width, 4, &bias, len, &mut vec![0; PANEL * head_dim], &mut dst);
        let at = |p: usize, g: usize, c: usize, t: usize| crate::kernels::sgemm::widen(dst[(p * 2 + g) * 32 + 2 * c + t]);
        assert_eq!(at(0, 1, 3, 1), rows[3 * width + 4 + 3] + 2.0);
        assert_eq!(at(1, 0, 0, 0), rows[16 * width + 4] + 0.5);
        assert_eq!(at(1, 1, 1, 0), 0.0, "past the keys");
    }

    /// The tiles' head (on the model of the instructions) against the f32 kernel, over head
    /// sizes, sequence lengths that fill no tile, the masks and the score terms.
    #[test]
    fn the_tile_head_matches_the_f32_head_within_bf16_rounding() {
        for (head_dim, len, mask) in [
            (32, 1, AttentionMask::Bidirectional),
            (32, 45, AttentionMask::Bidirectional),
            (64, 17, AttentionMask::Causal),
            (48, 130, AttentionMask::CausalWindow(7)),
            (18, 33, AttentionMask::Window(5)),
            (64, 300, AttentionMask::Causal),
        ] {
            let (heads, width) = (2, 6 * head_dim);
            let rows = crate::kernels::test_util::random_values(len * width, 11 + len as u64);
            let bias = crate::kernels::test_util::random_values(width, 5);
            let scale = 1.0 / (head_dim as f32).sqrt();
            let relative: Vec<f32> = (0..2 * len - 1).map(|i| (i as f32 * 0.37).sin()).collect();
            let terms = ScoreTerms { relative: Some((&relative, len - 1)), disentangled: None, softcap: Some(5.0) };
            for head in 0..heads {
                let cols = HeadColumns {
                    width,
                    q: head * head_dim,
                    k: 2 * head_dim + head * head_dim,
                    v: 4 * head_dim + head * head_dim,
                    head_dim,
                    out_width: 2 * head_dim,
                };
                let mut want = vec![0f32; len * 2 * head_dim];
                let mut got = vec![0f32; len * 2 * head_dim];
                super::super::kernel::attention_head(&rows, &bias, want.as_mut_ptr(), cols, mask, terms, scale, &mut Vec::new());
                // SAFETY: the model runs anywhere; `got` holds the len output rows.
                unsafe {
                    attention_head(&mut TileModel::new(), &rows, &bias, got.as_mut_ptr(), cols, mask, terms, scale, &mut Scratch::default())
                };
                if let Some(mut native) = NativeTiles::new() {
                    let mut on_chip = vec![0f32; len * 2 * head_dim];
                    // SAFETY: AMX is granted (a NativeTiles exists); `on_chip` holds the rows.
                    unsafe {
                        attention_head(&mut native, &rows, &bias, on_chip.as_mut_ptr(), cols, mask, terms, scale, &mut Scratch::default())
                    };
                    for (i, (n, m)) in on_chip.chunks(2 * head_dim).zip(got.chunks(2 * head_dim)).enumerate() {
                        let (n, m) = (&n[cols.q..cols.q + head_dim], &m[cols.q..cols.q + head_dim]);
                        // The hardware may sum a row's pair products in another order.
                        assert!(n.iter().zip(m).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0)), "native vs model, row {i}");
                    }
                } else if head == 0 && len == 1 {
                    eprintln!("NOTE: this CPU has no AMX (or Linux refused it): attention on native AMX tiles is NOT exercised here");
                }
                for i in 0..len {
                    let (w, g) = (&want[i * 2 * head_dim + cols.q..][..head_dim], &got[i * 2 * head_dim + cols.q..][..head_dim]);
                    let worst = w.iter().zip(g).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                    assert!(worst < 2e-2, "head_dim {head_dim}, len {len}, {mask:?}, row {i}: {worst}");
                    let dot: f32 = w.iter().zip(g).map(|(a, b)| a * b).sum();
                    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
                    let cosine = dot / (norm(w) * norm(g));
                    assert!(cosine > 0.9995, "head_dim {head_dim}, len {len}, {mask:?}, row {i}: cosine {cosine}");
                }
            }
        }
    }
}
