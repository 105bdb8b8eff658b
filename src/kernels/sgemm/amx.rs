//! bf16 products on AMX tiles (`TDPBF16PS`), on the packed bf16 panels as they are.
//!
//! The bf16 panel layout is AMX's weight-tile layout already: a panel row holds two consecutive
//! inputs' 16 columns interleaved per column (64 bytes), so 16 consecutive panel rows (32
//! inputs) are one weight tile, loaded with a 64-byte stride. The activations, rounded to bf16
//! pairs once per product (rows of ⌈k/2⌉ pairs), are activation tiles loaded in place: 16 rows,
//! 16 pairs each, the row stride apart. Nothing is repacked.
//!
//! A block is 32 rows × 2 panels ([`Block`]: two activation tiles, two weight tiles, four
//! accumulators) over all inputs in steps of 16 pairs. Edges configure smaller tiles: fewer
//! rows at the last rows, one weight tile at an odd last panel, a last step of fewer pairs. The
//! accumulators come back in memory and are written through [`Out`], which adds to the output
//! when the product accumulates (bias, residual, earlier blocks).

use super::super::amx::block::{Accumulator, Bf16, Block};
use super::super::amx::{NativeTiles, TileModel, Tiles, ROW_BYTES, TILE_ROWS};
use super::{Job, Out, PackedMatrix, WeightFormat, PANEL};
use std::sync::OnceLock;

/// The share `job` of a bf16 product on `tiles`; releases them at the end.
///
/// # Safety
/// `tiles` runs on this CPU (the model anywhere, the native unit where AMX is granted);
/// `job.a` holds the product's rows as bf16 pairs, `job.lda` pairs apart, at least ⌈k/2⌉ each;
/// `job.dst` is `m × n` with the job's rows and panels inside it (initialized when `read_dst`).
pub(super) unsafe fn bf16_block<T: Tiles>(job: &Job, tiles: &mut T) {
    let (steps, n, ldc) = (job.steps, job.n, job.ldc);
    let a_stride = job.lda * 4;
    let mut acc = [Accumulator([[0.0f32; PANEL]; TILE_ROWS]); 4];
    let mut block = Block::default();
    for m0 in job.rows.clone().step_by(2 * TILE_ROWS) {
        let rows = (job.rows.end - m0).min(2 * TILE_ROWS);
        block.a_rows = [rows.min(TILE_ROWS), rows.saturating_sub(TILE_ROWS)];
        for p0 in job.panels.clone().step_by(2) {
            block.b_tiles = (job.panels.end - p0).min(2);
            // SAFETY: rows m0.. (block.a_rows of them) hold ⌈k/2⌉ = steps pairs each from
            // `job.a`; panels p0 and p0 + 1 (when used) hold `steps` pair rows of 64 bytes.
            unsafe {
                let a = (job.a as *const u8).add(m0 * a_stride);
                let b = job.weights.add(p0 * job.panel_stride * ROW_BYTES);
                block.accumulate::<T, Bf16, f32>(tiles, &mut acc, steps, (a, a_stride), (b, job.panel_stride * ROW_BYTES));
            }
            for (t, acc) in acc.iter().enumerate() {
                let (ai, bi) = (t / 2, t % 2);
                if block.a_rows[ai] == 0 || bi >= block.b_tiles {
                    continue;
                }
                let p = p0 + bi;
                // SAFETY: row m0 + 16·ai and panel p lie inside `dst` (the caller's ranges).
                let c = unsafe { job.dst.add((m0 + TILE_ROWS * ai) * ldc + p * PANEL) };
                let out = Out { c, ldc, cols: PANEL.min(n - p * PANEL), accumulate: job.read_dst };
                for r in 0..block.a_rows[ai] {
                    // SAFETY: r < the tile's rows, inside the job's rows.
                    unsafe { out.store(r, &acc.0[r]) };
                }
            }
        }
    }
    // SAFETY: the tiles were configured by this call (or never used).
    unsafe { tiles.release() };
}

/// Whether the native AMX product may run in this process: AMX is granted, and the native tiles
/// agree with [`TileModel`] on a product with every edge (rows, panels and inputs that fill no
/// tile). Checked once; a disagreement is logged and the AVX-512 BF16 kernel runs instead, so
/// a wrong kernel on a CPU nobody tested it on costs speed, never answers.
pub(super) fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let Some(mut native) = NativeTiles::new() else { return false };
        let (got, want) = (self_check_product(&mut native), self_check_product(&mut TileModel::new()));
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0.0f32, f32::max);
        if worst <= 1e-5 {
            tracing::info!("AMX bf16 tiles checked against their model: in use");
            true
        } else {
            tracing::error!("AMX self-check failed (relative difference {worst:e} from the model): the AVX-512 BF16 kernel runs instead");
            false
        }
    })
}

/// A 37 × 77 × 40 bf16 product (two row tiles, the second partial; three panels, the last
/// partial and alone; 39 pairs of inputs, two full steps and a partial one, the last pair
/// half padding) on `tiles`.
fn self_check_product<T: Tiles>(tiles: &mut T) -> Vec<f32> {
    let (m, k, n) = (37, 77, 40);
    let value = |i: usize, seed: usize| ((i * seed + 11) % 29) as f32 / 7.0 - 2.0;
    let w: Vec<f32> = (0..k * n).map(|i| value(i, 13)).collect();
    let x: Vec<f32> = (0..m * k).map(|i| value(i, 17)).collect();
    let packed = PackedMatrix::pack_as(WeightFormat::Bf16, &w, k, n);
    let mut y = vec![0.0f32; m * n];
    product_on(tiles, &packed, &x, m, &mut y, false);
    y
}

/// `y (+)= x·Wᵀ` for bf16 `w` on `tiles`, whole (one thread), `x` rounded to bf16 pairs here.
pub(super) fn product_on<T: Tiles>(tiles: &mut T, w: &PackedMatrix, x: &[f32], m: usize, y: &mut [f32], read_dst: bool) {
    assert!(w.format() == WeightFormat::Bf16 && x.len() == m * w.k && y.len() == m * w.n, "AMX product: shapes");
    let pairs = super::bf16::round_pairs(x, m, w.k);
    let job = Job::of(w, pairs.as_ptr() as *const f32, w.k.div_ceil(2), y.as_mut_ptr(), 0..m, 0..w.panel_count(), read_dst);
    // SAFETY: `pairs` holds m rows of ⌈k/2⌉ pairs and `y` m × n floats (asserted); the ranges
    // cover the product; `tiles` runs here (the model anywhere, the native unit only once granted).
    unsafe { bf16_block(&job, tiles) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The self-check's product on the model equals the plain product on the rounded values:
    /// the check compares the native tiles against something right.
    #[test]
    fn self_check_product_is_the_plain_product() {
        let (m, k, n) = (37, 77, 40);
        let value = |i: usize, seed: usize| ((i * seed + 11) % 29) as f32 / 7.0 - 2.0;
        let bf = |v: f32| super::super::widen(super::super::round(v)) as f64;
        let got = self_check_product(&mut TileModel::new());
        for r in 0..m {
            for c in 0..n {
                let want: f64 = (0..k).map(|i| bf(value(r * k + i, 17)) * bf(value(i * n + c, 13))).sum();
                let g = got[r * n + c] as f64;
                assert!((g - want).abs() <= 1e-4 * want.abs().max(1.0), "[{r}][{c}] {g} vs {want}");
            }
        }
    }
}
