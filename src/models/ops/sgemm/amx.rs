//! bf16 products on AMX tiles (`TDPBF16PS`), on the packed bf16 panels as they are.
//!
//! The bf16 panel layout is AMX's weight-tile layout already: a panel row holds two consecutive
//! inputs' 16 columns interleaved per column (64 bytes), so 16 consecutive panel rows (32
//! inputs) are one weight tile, loaded with a 64-byte stride. The activations, rounded to bf16
//! pairs once per product (rows of ⌈k/2⌉ pairs), are activation tiles loaded in place: 16 rows,
//! 16 pairs each, the row stride apart. Nothing is repacked.
//!
//! A block is 32 rows × 2 panels: two activation tiles, two weight tiles, four accumulators
//! (`TileConfig::block`), over all inputs in steps of 16 pairs. Edges configure smaller tiles:
//! fewer rows at the last rows, one weight tile at an odd last panel, and a last step of fewer
//! pairs (configuring zeroes the tiles, so the accumulators go through memory across that
//! change). The accumulators are stored to a scratch block and written through [`Out`], which
//! adds to the output when the product accumulates (bias, residual, earlier blocks).

use super::super::amx::{NativeTiles, TileConfig, TileModel, Tiles, ROW_BYTES, TILE_ROWS};
use super::{Job, Out, PackedMatrix, Panels, WeightFormat, PANEL};
use std::sync::OnceLock;

/// Pairs (4-byte groups) of inputs per step: one weight tile's rows.
const STEP: usize = TILE_ROWS;

/// A 16 × 16 f32 accumulator in memory.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Accumulator([[f32; PANEL]; TILE_ROWS]);

/// The share `job` of a bf16 product on `tiles`; releases them at the end.
///
/// # Safety
/// `tiles` runs on this CPU (the model anywhere, the native unit where AMX is granted);
/// `job.a` holds the product's rows as bf16 pairs, `job.lda` pairs apart, at least ⌈k/2⌉ each;
/// `job.dst` is `m × n` with the job's rows and panels inside it (initialized when `read_dst`).
pub(super) unsafe fn bf16_block<T: Tiles>(job: &Job, tiles: &mut T) {
    let w = job.w;
    let Panels::Bf16(panels) = &w.panels else { unreachable!("the AMX kernel is chosen for bf16 weights only") };
    let (steps, n) = (w.steps(), w.n);
    let full = steps / STEP * STEP;
    let a_stride = job.lda * 4;
    let a = job.a as *const u8;
    let mut acc = [Accumulator([[0.0; PANEL]; TILE_ROWS]); 4];
    let mut current: Option<TileConfig> = None;
    let mut configure = |tiles: &mut T, config: TileConfig| {
        if current != Some(config) {
            // SAFETY: a palette-1 configuration of at most 16 × 64-byte tiles.
            unsafe { tiles.configure(&config) };
            current = Some(config);
        }
    };
    for m0 in job.rows.clone().step_by(2 * TILE_ROWS) {
        let rows = (job.rows.end - m0).min(2 * TILE_ROWS);
        let a_rows = [rows.min(TILE_ROWS), rows.saturating_sub(TILE_ROWS)];
        for p0 in job.panels.clone().step_by(2) {
            let b_tiles = (job.panels.end - p0).min(2);
            let weights = |s0: usize| panels[p0 * steps + s0..].as_ptr() as *const u8;
            // SAFETY: every configured tile is loaded from rows inside the activations (rows
            // m0.., pairs s0..s0+kd ≤ steps ≤ lda) or the weights (panel p0 or p0+1, pair rows
            // s0..s0+kd ≤ steps), and the accumulators are 16 rows of 64 bytes.
            unsafe {
                if full > 0 {
                    configure(tiles, TileConfig::block(a_rows, b_tiles, STEP));
                    zero_accumulators(tiles, a_rows, b_tiles);
                    for s0 in (0..full).step_by(STEP) {
                        step(tiles, a.add(m0 * a_stride + 4 * s0), a_stride, weights(s0), steps * ROW_BYTES, a_rows, b_tiles);
                    }
                }
                if full < steps {
                    if full > 0 {
                        move_accumulators::<T, false>(tiles, &mut acc, a_rows, b_tiles);
                    }
                    configure(tiles, TileConfig::block(a_rows, b_tiles, steps - full));
                    if full > 0 {
                        move_accumulators::<T, true>(tiles, &mut acc, a_rows, b_tiles);
                    } else {
                        zero_accumulators(tiles, a_rows, b_tiles);
                    }
                    step(tiles, a.add(m0 * a_stride + 4 * full), a_stride, weights(full), steps * ROW_BYTES, a_rows, b_tiles);
                }
                move_accumulators::<T, false>(tiles, &mut acc, a_rows, b_tiles);
            }
            for (t, acc) in acc.iter().enumerate() {
                let (ai, bi) = (t / 2, t % 2);
                if a_rows[ai] == 0 || bi >= b_tiles {
                    continue;
                }
                let p = p0 + bi;
                // SAFETY: row m0 + 16·ai and panel p lie inside `dst` (the caller's ranges).
                let c = unsafe { job.dst.add((m0 + TILE_ROWS * ai) * n + p * PANEL) };
                let out = Out { c, ldc: n, cols: PANEL.min(n - p * PANEL), accumulate: job.read_dst };
                for r in 0..a_rows[ai] {
                    // SAFETY: r < the tile's rows, inside the job's rows.
                    unsafe { out.store(r, &acc.0[r]) };
                }
            }
        }
    }
    // SAFETY: the tiles were configured by this call (or never used).
    unsafe { tiles.release() };
}

/// One step: loads the block's activation and weight tiles and runs its dot products.
///
/// # Safety
/// As [`bf16_block`]'s loop: the configured tiles' rows lie inside the buffers; weight tile B1
/// is `panel_bytes` after B0.
#[inline(always)]
unsafe fn step<T: Tiles>(
    tiles: &mut T,
    a: *const u8,
    a_stride: usize,
    b: *const u8,
    panel_bytes: usize,
    a_rows: [usize; 2],
    b_tiles: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        tiles.load::<6>(b, ROW_BYTES);
        if b_tiles == 2 {
            tiles.load::<7>(b.add(panel_bytes), ROW_BYTES);
        }
        tiles.load::<4>(a, a_stride);
        tiles.dot_bf16::<0, 4, 6>();
        if b_tiles == 2 {
            tiles.dot_bf16::<1, 4, 7>();
        }
        if a_rows[1] > 0 {
            tiles.load::<5>(a.add(TILE_ROWS * a_stride), a_stride);
            tiles.dot_bf16::<2, 5, 6>();
            if b_tiles == 2 {
                tiles.dot_bf16::<3, 5, 7>();
            }
        }
    }
}

/// Zeroes the block's accumulators.
///
/// # Safety
/// The block's tiles are configured.
#[inline(always)]
unsafe fn zero_accumulators<T: Tiles>(tiles: &mut T, a_rows: [usize; 2], b_tiles: usize) {
    // SAFETY: only configured tiles are named.
    unsafe {
        tiles.zero::<0>();
        if b_tiles == 2 {
            tiles.zero::<1>();
        }
        if a_rows[1] > 0 {
            tiles.zero::<2>();
            if b_tiles == 2 {
                tiles.zero::<3>();
            }
        }
    }
}

/// Stores the block's accumulators to `acc` (`LOAD` false) or loads them from it (true).
///
/// # Safety
/// The block's tiles are configured.
#[inline(always)]
unsafe fn move_accumulators<T: Tiles, const LOAD: bool>(tiles: &mut T, acc: &mut [Accumulator; 4], a_rows: [usize; 2], b_tiles: usize) {
    let at = |acc: &mut [Accumulator; 4], t: usize| acc[t].0.as_mut_ptr() as *mut u8;
    // SAFETY: each accumulator is 16 rows of 64 bytes; only configured tiles are named.
    unsafe {
        macro_rules! one {
            ($t:literal) => {
                if LOAD {
                    tiles.load::<$t>(at(acc, $t), ROW_BYTES)
                } else {
                    tiles.store::<$t>(at(acc, $t), ROW_BYTES)
                }
            };
        }
        one!(0);
        if b_tiles == 2 {
            one!(1);
        }
        if a_rows[1] > 0 {
            one!(2);
            if b_tiles == 2 {
                one!(3);
            }
        }
    }
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
    let job = Job {
        w,
        a: pairs.as_ptr() as *const f32,
        lda: w.k.div_ceil(2),
        dst: y.as_mut_ptr(),
        rows: 0..m,
        panels: 0..w.panel_count(),
        read_dst,
    };
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
