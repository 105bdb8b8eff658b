//! Activations quantized at run time, row by row, for the two [`super::Scheme`]s: unsigned
//! bytes per segment ([`ByteRows`]) and signed 16-bit per row ([`WideRows`]). Rows are padded
//! to whole register tiles and inputs to whole weight groups; the padding is never stored
//! (padded rows) or meets zero weights (padded inputs), so it may hold anything.

use super::{Int8Weight, Kernel, PARALLEL_MIN_WORK, SEGMENT};
use rayon::prelude::*;
use std::cell::Cell;

/// The largest magnitude of a [`WideRows`] value. A segment's sum of 128 products with weights
/// within ±127 stays below 2³¹ (`128·127·32767 ≈ 5.3·10⁸`), and so does `vpmaddwd`'s pair.
const WIDE_MAX: f32 = 32767.0;

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
        let padded = m.next_multiple_of(kernel.scheme().tile_shape().0);
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

fn quantize_segment(kernel: Kernel, x: &[f32], out: &mut [u8]) -> (f32, i32) {
    match kernel {
        // SAFETY: `Vnni` is only detected on CPUs with avx512f and avx512bw.
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => unsafe { super::x86::quantize_segment(x, out) },
        _ => quantize_segment_portable(x, out),
    }
}

/// A segment's range, which includes 0 so that the zero point is a byte: `(scale, 1/scale,
/// zero point)`, or `None` for an all-zero segment.
pub(super) fn segment_scale(min: f32, max: f32) -> Option<(f32, f32, f32)> {
    if max == min {
        return None;
    }
    let scale = (max - min) / 255.0;
    let inv = 1.0 / scale;
    Some((scale, inv, (-min * inv).round_ties_even()))
}

multiversion! {
    /// Writes `round(x/s) + z` for `s = (max − min)/255` and returns `(s, z)`.
    fn quantize_segment_portable(x: &[f32], out: &mut [u8]) -> (f32, i32) {
        let (min, max) = x.iter().fold((0.0f32, 0.0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let Some((scale, inv, zero)) = segment_scale(min, max) else { return (0.0, 0) };
        for (o, v) in out.iter_mut().zip(x) {
            *o = (v * inv + zero).round_ties_even().clamp(0.0, 255.0) as u8;
        }
        (scale, zero as i32)
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
        let padded = m.next_multiple_of(kernel.scheme().tile_shape().0);
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

fn quantize_wide(kernel: Kernel, x: &[f32], out: &mut [i16]) -> f32 {
    match kernel {
        // SAFETY: `Avx2` is only detected on CPUs with avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { super::x86::quantize_wide(x, out) },
        _ => quantize_wide_portable(x, out),
    }
}

/// The multiplier and scale of a row whose largest magnitude is `max`: `(32767/max,
/// max/32767)`, or `None` for an all-zero row.
pub(super) fn wide_scale(max: f32) -> Option<(f32, f32)> {
    (max > 0.0).then(|| (WIDE_MAX / max, max / WIDE_MAX))
}

/// Writes `round(x·32767/max|x|)` and returns the row's scale (0 for an all-zero row, whose
/// values are written as 0).
fn quantize_wide_portable(x: &[f32], out: &mut [i16]) -> f32 {
    let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let Some((inv, scale)) = wide_scale(max) else {
        out[..x.len()].fill(0);
        return 0.0;
    };
    for (o, v) in out.iter_mut().zip(x) {
        *o = (v * inv).round_ties_even() as i16;
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ops::test_util::random_values;

    #[test]
    fn fast_activation_quantization_matches_portable() {
        let x: Vec<f32> = random_values(200, 6).iter().map(|v| v * 7.0 + 1.5).collect();
        for kernel in Kernel::available() {
            for len in [1, 15, 16, 17, 128, 200] {
                let (mut fast, mut portable) = (vec![0u8; len], vec![0u8; len]);
                let a = quantize_segment(kernel, &x[..len], &mut fast);
                let b = quantize_segment_portable(&x[..len], &mut portable);
                assert_eq!(a, b, "{kernel:?} len {len}");
                assert_eq!(fast, portable, "{kernel:?} len {len}");
                let (mut fast, mut portable) = (vec![7i16; len], vec![7i16; len]);
                let a = quantize_wide(kernel, &x[..len], &mut fast);
                let b = quantize_wide_portable(&x[..len], &mut portable);
                assert_eq!(a, b, "{kernel:?} len {len}");
                assert_eq!(fast, portable, "{kernel:?} len {len}");
                assert!(portable.iter().any(|&q| q.unsigned_abs() == 32767), "{kernel:?} len {len}: the largest maps to ±32767");
            }
            let zeros = [0.0f32; 20];
            let mut out = [5i16; 20];
            assert_eq!(quantize_wide(kernel, &zeros, &mut out), 0.0);
            assert_eq!(out, [0i16; 20]);
        }
    }
}
