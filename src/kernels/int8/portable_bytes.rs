//! The [`Scheme::Bytes`](super::Scheme) register tile in plain integer arithmetic: what the
//! VNNI kernels are tested against (every CPU that runs bytes has a SIMD kernel for them).

use super::activations::ByteRows;
use super::{Int8Weight, Out, Segments, PANEL};

/// Rows `tile·rows..+rows` × panels `p0..p0+panels` for a kernel's tile `shape` (rows,
/// panels), over `segments`.
///
/// # Safety
/// The caller's contract of [`super::Kernel::tile_bytes`].
pub(super) unsafe fn tile(a: &ByteRows, tile: usize, w: &Int8Weight, p0: usize, segments: Segments, out: Out, shape: (usize, usize)) {
    let (tile_rows, tile_panels) = shape;
    for p in p0..p0 + tile_panels {
        let panel = &w.packed[p * w.panel_bytes()..(p + 1) * w.panel_bytes()];
        for row in tile * tile_rows..((tile + 1) * tile_rows).min(out.rows) {
            let x = &a.data[row * a.stride..(row + 1) * a.stride];
            for segment in segments.clone() {
                let mut acc = [0i32; PANEL];
                for g in w.segment_groups(segment) {
                    let (xs, group) = (&x[g * 4..g * 4 + 4], &panel[g * PANEL * 4..(g + 1) * PANEL * 4]);
                    for (lane, ws) in group.chunks_exact(4).enumerate() {
                        acc[lane] += xs.iter().zip(ws).map(|(&x, &w)| x as i32 * w as i32).sum::<i32>();
                    }
                }
                // SAFETY: row < rows; this call alone writes the tile.
                unsafe { out.store_segment_row(a, w, row, p, segment, &acc) };
            }
        }
    }
}
