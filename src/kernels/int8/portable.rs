//! The [`Scheme::Wide`](super::Scheme) register tile in plain integer arithmetic: the kernel of
//! CPUs without AVX2, and the reference the AVX2 kernel is tested against.

use super::activations::WideRows;
use super::{Int8Weight, Out, Segments, PANEL, WIDE_TILE_ROWS};

/// Rows `tile·6..+6` × the 16 columns of panel `p`, over `segments`.
///
/// # Safety
/// The caller's contract of [`super::Kernel::tile_wide`].
pub(super) unsafe fn tile_wide(a: &WideRows, tile: usize, w: &Int8Weight, p: usize, segments: Segments, out: Out) {
    let c0 = p * PANEL;
    if c0 >= out.cols {
        return;
    }
    let panel = &w.packed[p * w.panel_bytes()..(p + 1) * w.panel_bytes()];
    for row in tile * WIDE_TILE_ROWS..((tile + 1) * WIDE_TILE_ROWS).min(out.rows) {
        let x = &a.data[row * a.stride..(row + 1) * a.stride];
        for segment in segments.clone() {
            let mut acc = [0i32; PANEL];
            for g in w.segment_groups(segment) {
                let (x0, x1) = (x[2 * g] as i32, x[2 * g + 1] as i32);
                let group = &panel[g * PANEL * 2..(g + 1) * PANEL * 2];
                for (acc, pair) in acc.iter_mut().zip(group.chunks_exact(2)) {
                    *acc += x0 * pair[0] as i32 + x1 * pair[1] as i32;
                }
            }
            for (lane, &v) in acc.iter().enumerate().take(out.cols - c0) {
                let s = w.scale[segment * w.width() + c0 + lane] * a.scale[row];
                // SAFETY: row < rows and c0 + lane < cols.
                unsafe {
                    let d = out.ptr.add(row * out.cols + c0 + lane);
                    let prior = if out.read || segment > 0 { *d } else { 0.0 };
                    *d = prior + v as f32 * s;
                }
            }
        }
    }
}
