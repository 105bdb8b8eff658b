//! Activations quantized at run time, row by row, for the two [`super::Scheme`]s: unsigned
//! bytes per segment ([`ByteRows`]) and signed 16-bit per row ([`WideRows`]). Rows are padded
//! to whole register tiles and inputs to whole weight groups; the padding is never stored
//! (padded rows) or meets zero weights (padded inputs), so it may hold anything.

use super::quantize::{quantize_segment, quantize_wide};
use super::{Int8Weight, Kernel, PARALLEL_MIN_WORK, SEGMENT};
use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    // The previous product's buffers, reused: a fresh buffer of several MB per product costs
    // a page fault per 4 KiB (2% of an int8 forward pass, measured).
    static BYTES: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    static WIDE: Cell<Vec<i16>> = const { Cell::new(Vec::new()) };
}

/// Quantizes `m` rows of `x` into `data` (rows of `stride`) and `params` (`per_row` each) with
/// `row(x_row, out_row, params_row)`, on threads when the work is large enough.
fn quantize_rows<T: Send, P: Send>(
    x: &[f32],
    m: usize,
    data: &mut [T],
    stride: usize,
    params: &mut [P],
    per_row: usize,
    row: impl Fn(&[f32], &mut [T], &mut [P]) + Sync,
) {
    let k = x.len() / m.max(1);
    if k == 0 {
        return;
    }
    let work = |(x, (out, p)): (&[f32], (&mut [T], &mut [P]))| row(x, out, p);
    if m * k >= PARALLEL_MIN_WORK / 16 {
        x.par_chunks(k).zip(data.par_chunks_mut(stride).zip(params.par_chunks_mut(per_row))).for_each(work);
    } else {
        x.chunks(k).zip(data.chunks_mut(stride).zip(params.chunks_mut(per_row))).for_each(work);
    }
}

/// Activations as unsigned bytes, with a scale and zero point per row and segment.
pub(super) struct ByteRows {
    /// `rows_padded × stride` bytes.
    pub(super) data: Vec<u8>,
    pub(super) stride: usize,
    segments: usize,
    /// `rows_padded × segments` (padded rows: scale 0, so they dequantize to nothing).
    scale: Vec<f32>,
    /// `rows_padded × segments`: the byte that stands for 0.
    zero: Vec<i32>,
}

impl ByteRows {
    /// `x` (`m × k`) quantized in `w`'s segments.
    pub(super) fn quantize(kernel: Kernel, x: &[f32], m: usize, w: &Int8Weight) -> Self {
        let segments = w.segments;
        let stride = w.groups * 4;
        let padded = m.next_multiple_of(kernel.tile_shape().0);
        let mut data = BYTES.take();
        data.resize(padded * stride, 0);
        let mut params = vec![(0.0f32, 0i32); padded * segments];
        quantize_rows(x, m, &mut data, stride, &mut params, segments, |x, out, params| {
            for ((x, out), p) in x.chunks(SEGMENT).zip(out.chunks_mut(SEGMENT)).zip(params) {
                *p = quantize_segment(kernel, x, out);
            }
        });
        let (scale, zero) = params.into_iter().unzip();
        Self { data, stride, segments, scale, zero }
    }

    /// `(scale, zero point)` of `row`'s `segment`.
    pub(super) fn params(&self, row: usize, segment: usize) -> (f32, i32) {
        let i = row * self.segments + segment;
        (self.scale[i], self.zero[i])
    }

    /// Returns the buffer for the thread's next product.
    pub(super) fn recycle(self) {
        BYTES.set(self.data);
    }
}

/// Activations as signed 16-bit values, one scale per row.
pub(super) struct WideRows {
    /// `rows_padded × stride` values.
    pub(super) data: Vec<i16>,
    /// Values per row: k rounded up to whole pairs.
    pub(super) stride: usize,
    /// Per padded row: `max|x| / 32767`, 0 for an all-zero row.
    pub(super) scale: Vec<f32>,
}

impl WideRows {
    /// `x` (`m × k`) quantized for `w`.
    pub(super) fn quantize(kernel: Kernel, x: &[f32], m: usize, w: &Int8Weight) -> Self {
        let stride = w.groups * 2;
        let padded = m.next_multiple_of(kernel.tile_shape().0);
        let mut data = WIDE.take();
        data.resize(padded * stride, 0);
        let mut scale = vec![0.0f32; padded];
        quantize_rows(x, m, &mut data, stride, &mut scale, 1, |x, out, scale| {
            scale[0] = quantize_wide(kernel, x, out);
        });
        Self { data, stride, scale }
    }

    /// Returns the buffer for the thread's next product.
    pub(super) fn recycle(self) {
        WIDE.set(self.data);
    }
}
