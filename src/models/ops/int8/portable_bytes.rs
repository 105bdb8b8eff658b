//! The [`Scheme::Bytes`](super::Scheme) register tile in plain integer arithmetic: what the
//! VNNI kernels are tested against (every CPU that runs bytes has a SIMD kernel for them).

use super::activations::ByteRows;
use super::{Int8Weight, Out, Segments, BYTES_TILE_PANELS, BYTES_TILE_ROWS, PANEL};

/// Rows `tile·8..+8` × panels `p0..p0+3`, over `segments`.
///
/// # Safety
/// The caller's contract of [`super::Kernel::tile_bytes`].
pub(super) unsafe fn tile(a: &ByteRows, tile: usize, w: &Int8Weight, p0: usize, segments: Segments, out: Out) {
    for p in p0..p0 + BYTES_TILE_PANELS {
        let panel = &w.packed[p * w.panel_bytes()..(p + 1) * w.panel_bytes()];
        for row in tile * BYTES_TILE_ROWS..((tile + 1) * BYTES_TILE_ROWS).min(out.rows) {
            let x = &a.data[row * a.stride..(row + 1) * a.stride];
            for segment in segments.clone() {
                let mut acc = [0i32; PANEL];
                for g in w.segment_groups(segment) {
                    let (xs, group) = (&x[g * 4..g * 4 + 4], &panel[g * PANEL * 4..(g + 1) * PANEL * 4]);
                    for (lane, ws) in group.chunks_exact(4).enumerate() {
                        acc[lane] += xs.iter().zip(ws).map(|(&x, &w)| x as i32 * w as i32).sum::<i32>();
                    }
                }
                let (row_scale, zero) = a.params(row, segment);
                for (lane, &v) in acc.iter().enumerate() {
                    let c = p * PANEL + lane;
                    if c >= out.cols {
                        break;
                    }
                    let i = segment * w.width() + c;
                    let y = (v - zero * w.column_sum[i]) as f32 * (row_scale * w.scale[i]);
                    // SAFETY: row < rows and c < cols.
                    unsafe {
                        let d = out.ptr.add(row * out.cols + c);
                        *d = if out.read || segment > 0 { *d + y } else { y };
                    }
                }
            }
        }
    }
}
