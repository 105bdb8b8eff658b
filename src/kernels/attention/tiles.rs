//! Attention's two products in bf16, for models whose linears run in bf16 on native bf16
//! instructions (the backbone's forward under [`super::with_bf16_tiles`]), on sequences of at
//! least `TILES_MIN_LEN` tokens (`attention/mod.rs` says why): Q·Kᵀ and P·V on bf16 operands
//! with f32 sums, as OpenVINO runs its attention on such CPUs, on one of two [`PairProducts`]:
//! AMX tiles (`TDPBF16PS`, [`OnTiles`]) or AVX-512 BF16's `vdpbf16ps` through the bf16 linears'
//! register tiles ([`Dot`]; Zen 4 and 5, Intel without AMX). The score terms, the mask and the
//! softmax's exponentials stay f32; the exponentials are rounded to bf16 unnormalized and each
//! row's P·V sums divided by their sum afterwards, as flash attention does
//! ([`super::kernel::weigh_and_round_rows`]). Everything a float32 model runs stays f32.
//!
//! Per (sequence, head): Kᵀ and V are packed once as weight panels (the bf16 panel layout of
//! `sgemm`: a 64-byte row holds 16 columns × a pair of the reduced dimension), then
//! a block of queries at a time ([`block_rows`]) the queries (biased, pre-scaled) and then the
//! weights P are rounded to bf16 rows and multiplied over the block's span of keys
//! ([`block_keys`]: a causal block stops at its last query), as the f32 kernel does. Keys past the sequence are
//! zero in K and V and weigh 0 in P, so whole tiles never mix them in.

use super::kernel::{block_keys, weigh_and_round_rows, Head, ScoreTerms, QUERY_BLOCK};
use super::{AttentionMask, HeadColumns};
use crate::kernels::amx::block::{Accumulator, Bf16, Block};
use crate::kernels::amx::{Tiles, ROW_BYTES, TILE_ROWS};
use crate::kernels::sgemm::round as bf16;
use crate::kernels::sgemm::{PairProduct, PairRow};

/// Columns of a weight tile (and of a panel): 16 f32 accumulator lanes.
const PANEL: usize = 16;

/// The bytes of a block's scores and bf16 weights (6 per query and key) that stay in the L2
/// cache (1 MiB a core on Zen 4, 2 MiB on Sapphire Rapids) between the two products.
const BLOCK_BYTES: usize = 1 << 20;

/// Queries per block for `lk` keys: [`QUERY_BLOCK`], fewer (down to two tiles' 32) where its
/// scores would not stay in L2 ([`BLOCK_BYTES`]). A 16k-token head's 128 rows of scores were
/// 8 MiB, read and written three times from L3 between the products; a smaller block reads
/// each Kᵀ and V panel more often instead, 4 KiB per key panel.
fn block_rows(lk: usize) -> usize {
    (BLOCK_BYTES / (6 * lk)).clamp(2 * TILE_ROWS, QUERY_BLOCK) / TILE_ROWS * TILE_ROWS
}

/// Each thread's bf16 scratch, reused across heads.
#[derive(Default)]
pub(super) struct Scratch {
    f32s: Vec<f32>,
    /// Kᵀ panels, V panels, the query rows and the weight rows, in bf16: in cache lines, as the
    /// `vdpbf16ps` kernel loads its panels (every part is a whole number of lines).
    lines: Vec<PairRow>,
}

impl Scratch {
    /// Whether the scratch is small enough to keep for the next head (`floats` of each kind).
    pub(super) fn kept(&self, floats: usize) -> bool {
        self.f32s.capacity() <= floats && self.lines.capacity() * 2 * PANEL <= 2 * floats
    }
}

/// Where a head's two bf16 products run.
pub(super) trait PairProducts {
    /// `p.c = p.a · p.b` ([`PairProduct`]; `p.cols` a multiple of 16).
    ///
    /// # Safety
    /// The unit runs on this CPU; `p`'s pointers cover what [`PairProduct`] says.
    unsafe fn product(&mut self, p: &PairProduct);
    /// After the head's last product.
    fn finish(&mut self) {}
}

/// The products on AMX tiles (the native unit, or the model of the instructions in tests).
pub(super) struct OnTiles<'t, T: Tiles> {
    tiles: &'t mut T,
    block: Block,
}

impl<'t, T: Tiles> OnTiles<'t, T> {
    pub(super) fn new(tiles: &'t mut T) -> Self {
        OnTiles { tiles, block: Block::default() }
    }
}

impl<T: Tiles> PairProducts for OnTiles<'_, T> {
    unsafe fn product(&mut self, p: &PairProduct) {
        // SAFETY: the tiles run here and `p` covers its operands (this fn's contract).
        unsafe { tile_product(self.tiles, &mut self.block, p) }
    }

    fn finish(&mut self) {
        // SAFETY: back to the unconfigured state; the tiles were configured by this head's
        // products (or never used).
        unsafe { self.tiles.release() };
    }
}

/// The products on AVX-512 BF16's `vdpbf16ps`, the bf16 linears' kernel (`sgemm`).
#[cfg(target_arch = "x86_64")]
pub(super) struct Dot;

#[cfg(target_arch = "x86_64")]
impl PairProducts for Dot {
    unsafe fn product(&mut self, p: &PairProduct) {
        // SAFETY: a `Dot` is used only where the CPU has AVX-512 BF16 (`sgemm::dot_in_use`, or
        // the tests' detection); `p` covers its operands (this fn's contract).
        unsafe { crate::kernels::sgemm::dot_pairs(p) }
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

/// [`PairProducts::product`] on AMX tiles, 32 rows × 2 panels per [`Block`].
///
/// # Safety
/// `tiles` runs on this CPU; `p`'s pointers cover what [`PairProduct`] says, `p.cols` a
/// multiple of 16.
unsafe fn tile_product<T: Tiles>(tiles: &mut T, block: &mut Block, p: &PairProduct) {
    let (a, a_stride, b, b_stride) = (p.a as *const u8, p.lda * 4, p.b as *const u8, p.panel_stride * ROW_BYTES);
    let panels = p.cols / PANEL;
    let mut acc = [Accumulator([[0.0f32; PANEL]; TILE_ROWS]); 4];
    for m0 in (0..p.rows).step_by(2 * TILE_ROWS) {
        let block_rows = (p.rows - m0).min(2 * TILE_ROWS);
        block.a_rows = [block_rows.min(TILE_ROWS), block_rows.saturating_sub(TILE_ROWS)];
        for p0 in (0..panels).step_by(2) {
            block.b_tiles = (panels - p0).min(2);
            // SAFETY: rows m0.. of a and panels p0.. of b lie inside them (this fn's contract).
            unsafe {
                block.accumulate::<T, Bf16, f32>(
                    tiles,
                    &mut acc,
                    p.steps,
                    (a.add(m0 * a_stride), a_stride),
                    (b.add(p0 * b_stride), b_stride),
                );
            }
            for (t, acc) in acc.iter().enumerate() {
                let (ai, bi) = (t / 2, t % 2);
                if block.a_rows[ai] == 0 || bi >= block.b_tiles {
                    continue;
                }
                for r in 0..block.a_rows[ai] {
                    // SAFETY: row m0 + 16·ai + r < rows, columns of panel p0 + bi < cols/16.
                    unsafe {
                        let at = p.c.add((m0 + TILE_ROWS * ai + r) * p.ldc + (p0 + bi) * PANEL);
                        std::ptr::copy_nonoverlapping(acc.0[r].as_ptr(), at, PANEL);
                    }
                }
            }
        }
    }
}

/// One head of one sequence on `unit`, as [`super::kernel::attention_head`] computes it in
/// f32 (its arguments), with Q, K, P and V rounded to bf16.
///
/// # Safety
/// `unit` runs on this CPU; `out` is as [`super::kernel::attention_head`] takes it.
#[allow(clippy::too_many_arguments)] // attention_head's geometry, and the unit
pub(super) unsafe fn attention_head<P: PairProducts>(
    unit: &mut P,
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
    let block_queries = block_rows(head.lk).min(len.div_ceil(TILE_ROWS) * TILE_ROWS);
    let (dim_pairs, dim_panels, key_pairs) = (head_dim / 2, head_dim.div_ceil(PANEL), lk / 2);
    let vw = dim_panels * PANEL;
    // f32: the block's scores, its P·V sums and its rows' 1 / Σ of their softmax.
    let needed = block_queries * lk + block_queries * vw + block_queries;
    if scratch.f32s.len() < needed {
        scratch.f32s.resize(needed, 0.0);
    }
    let (scores, rest) = scratch.f32s.split_at_mut(block_queries * lk);
    let (pv, rest) = rest.split_at_mut(block_queries * vw);
    let inverse_sums = &mut rest[..block_queries];
    // bf16, in lines of 32: K's panels (lk/16 over the head's pairs), V's (head_dim/16 over the
    // keys' pairs), the block's query rows (16·k of them, of an even head_dim) and weight rows
    // (of lk, a multiple of 16), and one panel's keys staged.
    let line = 2 * PANEL;
    let (k_size, v_size) = ((lk / PANEL) * dim_pairs * line, dim_panels * key_pairs * line);
    let halves = k_size + v_size + block_queries * head_dim + block_queries * lk + PANEL * head_dim;
    if scratch.lines.len() * line < halves {
        scratch.lines.resize(halves.div_ceil(line), PairRow::default());
    }
    let all = PairRow::halves_mut(&mut scratch.lines);
    let (k_panels, rest) = all.split_at_mut(k_size);
    let (v_panels, rest) = rest.split_at_mut(v_size);
    let (q_rows, rest) = rest.split_at_mut(block_queries * head_dim);
    let (p_rows, rest) = rest.split_at_mut(block_queries * lk);
    let staged = &mut rest[..PANEL * head_dim];
    let width = cols.width;
    pack_keys(rows, width, cols.k, head.k_bias, len, staged, k_panels);
    pack_values(rows, width, cols.v, head_dim, len, key_pairs, v_panels);
    for first in (0..len).step_by(block_queries) {
        let n = block_queries.min(len - first);
        // The span's first key is a multiple of 16 (a panel, and a whole pair of keys); its end
        // rounded up to whole panels stays inside lk.
        let keys = block_keys(mask, first, n, len);
        let span_end = keys.end.div_ceil(PANEL) * PANEL;
        let span = span_end - keys.start;
        pack_queries(rows, width, cols.q, head.q_bias, first, n, scale, q_rows);
        // SAFETY: n query rows of dim_pairs pairs; the span's span/16 panels of Kᵀ, dim_pairs
        // lines each, from panel keys.start/16; n rows of lk scores from column keys.start, the
        // span inside them; every offset a whole number of lines; `unit` runs here (this fn's
        // contract).
        unsafe {
            unit.product(&PairProduct {
                a: q_rows.as_ptr() as *const u32,
                lda: dim_pairs,
                rows: n,
                b: k_panels.as_ptr().add(keys.start / PANEL * dim_pairs * line) as *const PairRow,
                panel_stride: dim_pairs,
                steps: dim_pairs,
                cols: span,
                c: scores.as_mut_ptr().add(keys.start),
                ldc: lk,
            });
        }
        let inverse_sums = &mut inverse_sums[..n];
        weigh_and_round_rows(
            &mut scores[..n * lk],
            &mut p_rows[..n * lk],
            inverse_sums,
            lk,
            keys.clone(),
            span_end,
            len,
            first,
            mask,
            terms,
        );
        // SAFETY: n weight rows of lk/2 pairs, the span's span/2 from pair keys.start/2; V's
        // dim_panels panels of key_pairs lines, from line keys.start/2 of each; n rows of vw.
        unsafe {
            unit.product(&PairProduct {
                a: p_rows.as_ptr().add(keys.start) as *const u32,
                lda: lk / 2,
                rows: n,
                b: v_panels.as_ptr().add(keys.start / 2 * line) as *const PairRow,
                panel_stride: key_pairs,
                steps: span / 2,
                cols: vw,
                c: pv.as_mut_ptr(),
                ldc: vw,
            });
        }
        for i in 0..n {
            let sums = &pv[i * vw..i * vw + head_dim];
            // SAFETY: row first + i < len of the output, this head's columns (the caller's
            // contract: this job alone writes them).
            let dst = unsafe { std::slice::from_raw_parts_mut(out.add((first + i) * cols.out_width + cols.q), head_dim) };
            let inverse = inverse_sums[i];
            dst.iter_mut().zip(sums).zip(head.v_bias).for_each(|((d, s), b)| *d = s * inverse + b);
        }
    }
    unit.finish();
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
            // Several query blocks, each over its own span of keys: causal (each block to its
            // last query), windowed (a span that starts past key 0) and a long sum (P·V over
            // more than 256 pairs of keys, the `vdpbf16ps` kernel's block).
            (32, 700, AttentionMask::Causal),
            (48, 520, AttentionMask::CausalWindow(150)),
            (16, 600, AttentionMask::Window(40)),
            (24, 530, AttentionMask::Bidirectional),
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
                let mut model = TileModel::new();
                // SAFETY: the model runs anywhere; `got` holds the len output rows.
                unsafe {
                    attention_head(
                        &mut OnTiles::new(&mut model),
                        &rows,
                        &bias,
                        got.as_mut_ptr(),
                        cols,
                        mask,
                        terms,
                        scale,
                        &mut Scratch::default(),
                    )
                };
                // The same products on the units this CPU has, against the model: the hardware
                // may sum a row's pair products in another order, and `vdpbf16ps` splits long
                // sums into blocks of 256 pairs. Each output is an f32 sum of up to hundreds of
                // unnormalized weights (each ≤ 1) before its 1 / Σ, so the orders differ by
                // about 2⁻²⁴ of the sum per term: 4e-5 of the output, 1.6e-5 seen.
                let close = |unit: &str, other: &[f32]| {
                    for (i, (n, m)) in other.chunks(2 * head_dim).zip(got.chunks(2 * head_dim)).enumerate() {
                        let (n, m) = (&n[cols.q..cols.q + head_dim], &m[cols.q..cols.q + head_dim]);
                        let worst = n.iter().zip(m).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f32::max);
                        assert!(worst <= 4e-5, "{unit} vs the model, head_dim {head_dim}, len {len}, {mask:?}, row {i}: {worst}");
                    }
                };
                if let Some(mut native) = NativeTiles::new() {
                    let mut on_chip = vec![0f32; len * 2 * head_dim];
                    // SAFETY: AMX is granted (a NativeTiles exists); `on_chip` holds the rows.
                    unsafe {
                        let mut unit = OnTiles::new(&mut native);
                        attention_head(&mut unit, &rows, &bias, on_chip.as_mut_ptr(), cols, mask, terms, scale, &mut Scratch::default())
                    };
                    close("native AMX", &on_chip);
                } else if head == 0 && len == 1 {
                    eprintln!("NOTE: this CPU has no AMX (or Linux refused it): attention on native AMX tiles is NOT exercised here");
                }
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16") {
                    let mut on_dot = vec![0f32; len * 2 * head_dim];
                    // SAFETY: the CPU has AVX-512 BF16; `on_dot` holds the rows.
                    unsafe {
                        attention_head(&mut Dot, &rows, &bias, on_dot.as_mut_ptr(), cols, mask, terms, scale, &mut Scratch::default())
                    };
                    close("vdpbf16ps", &on_dot);
                } else if head == 0 && len == 1 {
                    eprintln!("NOTE: this CPU has no AVX-512 BF16: attention on vdpbf16ps is NOT exercised here");
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
