//! Int8 products on AMX tiles (`TDPBUSD`: unsigned activation bytes × signed weight bytes, 4
//! per 32-bit lane, exact 32-bit sums), in [`Scheme::Bytes`](super::Scheme), the scheme of the
//! VNNI kernels, with the same exactness: the sums are the same integers, dequantized per
//! segment by the same formula.
//!
//! The packed weights are AMX's weight-tile layout already: a group (4 inputs) of a panel is
//! 16 columns × 4 bytes = one 64-byte tile row, so 16 consecutive groups (64 inputs) are one
//! tile. Activation rows (bytes, padded to whole groups and to whole 32-row tiles) are loaded
//! in place. A register tile here is 32 rows × 2 panels (the shared
//! [`Block`]), run over each segment's groups (32 of them: two steps; the last segment may end
//! with a partial step, configured smaller), then dequantized into the output.

use super::activations::ByteRows;
use super::{Int8Weight, Out, Segments, PANEL};
use crate::kernels::amx::block::{Accumulator, Block, U8S8};
use crate::kernels::amx::{Tiles, ROW_BYTES, TILE_ROWS};

/// Rows × panels of one tile call.
pub(super) const TILE_SHAPE: (usize, usize) = (2 * TILE_ROWS, 2);

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
    let mut block = Block::default();
    // Padded rows may be loaded (they are never stored): only a second tile with no live row
    // is left out. Panels are padded to pairs, so both weight tiles are always there.
    block.a_rows = [TILE_ROWS, if live > TILE_ROWS { TILE_ROWS } else { 0 }];
    let mut acc = [Accumulator([[0i32; PANEL]; TILE_ROWS]); 4];
    for segment in segments {
        let groups = w.segment_groups(segment);
        // SAFETY: rows r0..r0+32 of the padded rows hold the segment's groups (inside the row
        // stride); panels p0 and p0 + 1 hold them as 64-byte rows.
        unsafe {
            let a0 = a.data.as_ptr().add(r0 * a.stride + 4 * groups.start);
            let b0 = (w.packed.as_ptr() as *const u8).add(p0 * w.panel_bytes() + groups.start * ROW_BYTES);
            block.accumulate::<T, U8S8, i32>(tiles, &mut acc, groups.len(), (a0, a.stride), (b0, w.panel_bytes()));
        }
        for (t, acc) in acc.iter().enumerate() {
            let (ai, bi) = (t / 2, t % 2);
            for r in 0..TILE_ROWS {
                let row = r0 + ai * TILE_ROWS + r;
                if row >= out.rows || block.a_rows[ai] == 0 {
                    break;
                }
                // SAFETY: row < rows of `out`, a tile only this call writes.
                unsafe { out.store_segment_row(a, w, row, p0 + bi, segment, &acc.0[r]) };
            }
        }
    }
    // SAFETY: the tiles were configured by this call (or never used).
    unsafe { tiles.release() };
}

/// Whether the native int8 tiles may run in this process: AMX-INT8 is granted, and the native
/// tiles give the model's results exactly (the sums are integers) on a product with partial
/// row tiles, panels and segments. Checked once; a disagreement is logged and the AVX-512 VNNI
/// kernel runs instead.
pub(super) fn ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        if !crate::kernels::amx::int8_granted() {
            return false;
        }
        let Some(mut native) = crate::kernels::amx::NativeTiles::new() else { return false };
        let (m, k, n) = (37, 200, 40);
        let value = |i: usize, seed: usize| ((i * seed + 5) % 31) as f32 / 9.0 - 1.5;
        let w: Vec<f32> = (0..k * n).map(|i| value(i, 7)).collect();
        let x: Vec<f32> = (0..m * k).map(|i| value(i, 11)).collect();
        let w = Int8Weight::quantize_for(super::Kernel::Amx, &w, k, n);
        let got = product_on(&mut native, &w, &x, m);
        let want = product_on(&mut crate::kernels::amx::TileModel::new(), &w, &x, m);
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
    use crate::kernels::amx::TileModel;
    use crate::kernels::test_util::random_values;

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
