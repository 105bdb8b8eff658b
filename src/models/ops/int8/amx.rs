//! Int8 products on AMX tiles (`TDPBUSD`: unsigned activation bytes × signed weight bytes, 4
//! per 32-bit lane, exact 32-bit sums), in [`Scheme::Bytes`](super::Scheme), the scheme of the
//! VNNI kernels, with the same exactness: the sums are the same integers, dequantized per
//! segment by the same formula.
//!
//! The packed weights are AMX's weight-tile layout already: a group (4 inputs) of a panel is
//! 16 columns × 4 bytes = one 64-byte tile row, so 16 consecutive groups (64 inputs) are one
//! tile. Activation rows (bytes, padded to whole groups and to whole 32-row tiles) are loaded
//! in place. A register tile here is 32 rows × 2 panels: two activation tiles, two weight
//! tiles, four accumulators, run over each segment's groups (32 of them: two steps; the last
//! segment may end with a partial step, configured smaller), then dequantized into the output.

use super::activations::ByteRows;
use super::{Int8Weight, Out, Segments, PANEL};
use crate::models::ops::amx::{TileConfig, Tiles, ROW_BYTES, TILE_ROWS};

/// Rows × panels of one tile call.
pub(super) const TILE_SHAPE: (usize, usize) = (2 * TILE_ROWS, 2);
/// Groups (of 4 inputs) per step: one weight tile's rows.
const STEP: usize = TILE_ROWS;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Accumulator([[i32; PANEL]; TILE_ROWS]);

/// Rows `tile·32..+32` × panels `p0..p0+2`, over `segments` (writing the output at segment 0
/// unless it is read, adding to it after); releases the tiles at the end.
///
/// # Safety
/// `tiles` runs on this CPU (the model anywhere; the native unit where AMX-INT8 is granted);
/// `a` was quantized for `w` with rows padded to whole tiles of [`TILE_SHAPE`], `w` packed with
/// panels rounded to its panels; the tile and panels lie inside them and inside `out`, which no
/// other thread writes there at the same time.
pub(super) unsafe fn tile<T: Tiles>(a: &ByteRows, tile: usize, w: &Int8Weight, p0: usize, segments: Segments, out: Out, tiles: &mut T) {
    let r0 = tile * TILE_SHAPE.0;
    let live = out.rows.saturating_sub(r0).min(TILE_SHAPE.0);
    // Padded rows may be loaded (they are never stored): only a second tile with no live row is
    // left out.
    let a_rows = [TILE_ROWS, if live > TILE_ROWS { TILE_ROWS } else { 0 }];
    let rows_base = a.data.as_ptr();
    let weights = w.packed.as_ptr() as *const u8;
    let panel_bytes = w.panel_bytes();
    let mut acc = [Accumulator([[0; PANEL]; TILE_ROWS]); 4];
    let mut current: Option<TileConfig> = None;
    for segment in segments {
        let groups = w.segment_groups(segment);
        let full = groups.start + (groups.len() / STEP) * STEP;
        // SAFETY: every tile loaded lies inside the activations (rows r0..r0+32 of the padded
        // rows, groups inside the row's stride) or the weights (panels p0, p0+1, groups inside
        // the panel); the accumulators are 16 rows of 64 bytes.
        unsafe {
            let step = |tiles: &mut T, g0: usize| {
                let a0 = rows_base.add(r0 * a.stride + 4 * g0);
                let b0 = weights.add(p0 * panel_bytes + g0 * ROW_BYTES);
                tiles.load::<6>(b0, ROW_BYTES);
                tiles.load::<7>(b0.add(panel_bytes), ROW_BYTES);
                tiles.load::<4>(a0, a.stride);
                tiles.dot_u8s8::<0, 4, 6>();
                tiles.dot_u8s8::<1, 4, 7>();
                if a_rows[1] > 0 {
                    tiles.load::<5>(a0.add(TILE_ROWS * a.stride), a.stride);
                    tiles.dot_u8s8::<2, 5, 6>();
                    tiles.dot_u8s8::<3, 5, 7>();
                }
            };
            if full > groups.start {
                configure(tiles, &mut current, TileConfig::block(a_rows, 2, STEP));
                accumulators::<T, Zero>(tiles, &mut acc, a_rows);
                for g0 in (groups.start..full).step_by(STEP) {
                    step(tiles, g0);
                }
            }
            if full < groups.end {
                if full > groups.start {
                    accumulators::<T, Store>(tiles, &mut acc, a_rows);
                }
                configure(tiles, &mut current, TileConfig::block(a_rows, 2, groups.end - full));
                if full > groups.start {
                    accumulators::<T, Load>(tiles, &mut acc, a_rows);
                } else {
                    accumulators::<T, Zero>(tiles, &mut acc, a_rows);
                }
                step(tiles, full);
            }
            accumulators::<T, Store>(tiles, &mut acc, a_rows);
        }
        for (t, acc) in acc.iter().enumerate() {
            let (ai, bi) = (t / 2, t % 2);
            let p = p0 + bi;
            for r in 0..TILE_ROWS {
                let row = r0 + ai * TILE_ROWS + r;
                if row >= out.rows || a_rows[ai] == 0 {
                    break;
                }
                // SAFETY: row < rows of `out`, a tile only this call writes.
                unsafe { out.store_segment_row(a, w, row, p, segment, &acc.0[r]) };
            }
        }
    }
    // SAFETY: the tiles were configured by this call (or never used).
    unsafe { tiles.release() };
}

/// `LDTILECFG` unless `config` is already in force.
///
/// # Safety
/// As [`Tiles::configure`].
unsafe fn configure<T: Tiles>(tiles: &mut T, current: &mut Option<TileConfig>, config: TileConfig) {
    if *current != Some(config) {
        // SAFETY: a palette-1 configuration of at most 16 × 64-byte tiles.
        unsafe { tiles.configure(&config) };
        *current = Some(config);
    }
}

/// What [`accumulators`] does with the configured accumulators.
trait Move {
    /// # Safety
    /// Tile `C` is configured; `at` is 16 rows of 64 bytes.
    unsafe fn apply<T: Tiles, const C: usize>(tiles: &mut T, at: *mut u8);
}
struct Zero;
struct Store;
struct Load;
impl Move for Zero {
    unsafe fn apply<T: Tiles, const C: usize>(tiles: &mut T, _: *mut u8) {
        // SAFETY: the trait's contract.
        unsafe { tiles.zero::<C>() }
    }
}
impl Move for Store {
    unsafe fn apply<T: Tiles, const C: usize>(tiles: &mut T, at: *mut u8) {
        // SAFETY: the trait's contract.
        unsafe { tiles.store::<C>(at, ROW_BYTES) }
    }
}
impl Move for Load {
    unsafe fn apply<T: Tiles, const C: usize>(tiles: &mut T, at: *mut u8) {
        // SAFETY: the trait's contract.
        unsafe { tiles.load::<C>(at, ROW_BYTES) }
    }
}

/// Zeroes, stores or loads the block's configured accumulators (both panels; the second row
/// tile's only when it is in use).
///
/// # Safety
/// The block's tiles are configured.
unsafe fn accumulators<T: Tiles, M: Move>(tiles: &mut T, acc: &mut [Accumulator; 4], a_rows: [usize; 2]) {
    let at = |acc: &mut [Accumulator; 4], t: usize| acc[t].0.as_mut_ptr() as *mut u8;
    // SAFETY: only configured tiles are named; each accumulator is 16 rows of 64 bytes.
    unsafe {
        M::apply::<T, 0>(tiles, at(acc, 0));
        M::apply::<T, 1>(tiles, at(acc, 1));
        if a_rows[1] > 0 {
            M::apply::<T, 2>(tiles, at(acc, 2));
            M::apply::<T, 3>(tiles, at(acc, 3));
        }
    }
}

/// Whether the native int8 tiles may run in this process: AMX-INT8 is granted, and the native
/// tiles give the model's results exactly (the sums are integers) on a product with partial
/// row tiles, panels and segments. Checked once; a disagreement is logged and the AVX-512 VNNI
/// kernel runs instead.
pub(super) fn ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        if !crate::models::ops::amx::int8_granted() {
            return false;
        }
        let Some(mut native) = crate::models::ops::amx::NativeTiles::new() else { return false };
        let (m, k, n) = (37, 200, 40);
        let value = |i: usize, seed: usize| ((i * seed + 5) % 31) as f32 / 9.0 - 1.5;
        let w: Vec<f32> = (0..k * n).map(|i| value(i, 7)).collect();
        let x: Vec<f32> = (0..m * k).map(|i| value(i, 11)).collect();
        let w = Int8Weight::quantize_for(super::Kernel::Amx, &w, k, n);
        let got = product_on(&mut native, &w, &x, m);
        let want = product_on(&mut crate::models::ops::amx::TileModel::new(), &w, &x, m);
        if got == want {
            tracing::info!("AMX int8 tiles checked against their model: in use");
            true
        } else {
            tracing::error!("AMX int8 self-check failed (results differ from the model): the AVX-512 VNNI kernel runs instead");
            false
        }
    })
}

/// `x·W` for `w` packed for the AMX kernel, every tile on `tiles`, one thread.
pub(super) fn product_on<T: Tiles>(tiles: &mut T, w: &Int8Weight, x: &[f32], m: usize) -> Vec<f32> {
    assert!(w.kernel == super::Kernel::Amx && x.len() == m * w.k, "AMX int8 product: shapes");
    let rows = ByteRows::quantize(super::Kernel::Amx, x, m, w);
    let mut y = vec![0.0f32; m * w.n];
    let out = Out { ptr: y.as_mut_ptr(), rows: m, cols: w.n, read: false };
    for t in 0..m.div_ceil(TILE_SHAPE.0) {
        for p0 in (0..w.panels).step_by(TILE_SHAPE.1) {
            // SAFETY: the rows were quantized for this kernel (padded to its tiles), `w` packed
            // for it; tile t and panels p0.. lie inside both and inside `y` (m × n); one thread.
            unsafe { tile(&rows, t, w, p0, 0..w.segments, out, tiles) };
        }
    }
    rows.recycle();
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ops::amx::TileModel;
    use crate::models::ops::test_util::random_values;

    /// The AMX tile calls on the tile model give exactly the portable byte tiles' results over
    /// the same quantized rows, on every x86 CPU: packing, partial tiles and segments, the
    /// accumulators kept across a partial step's configuration.
    #[test]
    fn amx_tiles_on_the_model_match_the_portable_byte_tiles() {
        for &(m, k, n) in &[(13, 37, 50), (1, 384, 384), (70, 64, 40), (33, 300, 17), (40, 129, 16), (16, 256, 33), (9, 208, 40)] {
            let w = Int8Weight::quantize_for(super::super::Kernel::Amx, &random_values(k * n, 2), k, n);
            let x = random_values(m * k, 1);
            let got = product_on(&mut TileModel::new(), &w, &x, m);
            let rows = ByteRows::quantize(super::super::Kernel::Amx, &x, m, &w);
            let mut want = vec![0.0f32; m * n];
            let out = Out { ptr: want.as_mut_ptr(), rows: m, cols: n, read: false };
            for t in 0..m.div_ceil(TILE_SHAPE.0) {
                for p0 in (0..w.panels).step_by(TILE_SHAPE.1) {
                    // SAFETY: as in `product_on`.
                    unsafe { super::super::portable_bytes::tile(&rows, t, &w, p0, 0..w.segments, out, TILE_SHAPE) };
                }
            }
            assert_eq!(got, want, "{m}×{k}×{n}");
        }
    }
}
