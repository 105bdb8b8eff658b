//! How one activation segment or row is quantized, for the two [`super::Scheme`]s: the scale
//! rules (bytes with a zero point per segment, signed 16-bit per row), the portable
//! quantizers, and their x86 versions (AVX-512BW, AVX2), which give the same result and are
//! chosen per [`Kernel`]. [`super::activations`] runs them over whole matrices.

use super::Kernel;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The largest magnitude of a [`WideRows`] value. A segment's sum of 128 products with weights
/// within ±127 stays below 2³¹ (`128·127·32767 ≈ 5.3·10⁸`), and so does `vpmaddwd`'s pair.
const WIDE_MAX: f32 = 32767.0;

pub(super) fn quantize_segment(kernel: Kernel, x: &[f32], out: &mut [u8]) -> (f32, i32) {
    match kernel {
        // SAFETY: `Vnni` is only detected on CPUs with avx512f and avx512bw.
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => unsafe { quantize_segment_avx512(x, out) },
        // SAFETY: `Amx` is detected only with them too (`has_vnni`); its tests also run it on
        // other CPUs, hence the check.
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx if super::has_vnni() => unsafe { quantize_segment_avx512(x, out) },
        _ => quantize_segment_portable(x, out),
    }
}

/// A segment's range, which includes 0 so that the zero point is a byte: `(scale, 1/scale,
/// zero point)`, or `None` for an all-zero segment.
fn segment_scale(min: f32, max: f32) -> Option<(f32, f32, f32)> {
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

pub(super) fn quantize_wide(kernel: Kernel, x: &[f32], out: &mut [i16]) -> f32 {
    match kernel {
        // SAFETY: `Avx2` is only detected on CPUs with avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { quantize_wide_avx2(x, out) },
        _ => quantize_wide_portable(x, out),
    }
}

/// The multiplier and scale of a row whose largest magnitude is `max`: `(32767/max,
/// max/32767)`, or `None` for an all-zero row.
fn wide_scale(max: f32) -> Option<(f32, f32)> {
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

/// [`quantize_segment_portable`], 16 lanes at a time, with the same result.
///
/// # Safety
/// The CPU has avx512f and avx512bw; `out` is at least as long as `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_segment_avx512(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    let lanes = |i: usize| ((1u32 << (x.len() - i).min(16)) - 1) as u16;
    let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for i in (0..x.len()).step_by(16) {
        let v = _mm512_maskz_loadu_ps(lanes(i), x.as_ptr().add(i));
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    let Some((scale, inv, zero)) = segment_scale(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi)) else {
        return (0.0, 0);
    };
    let (inv_v, zero_v) = (_mm512_set1_ps(inv), _mm512_set1_ps(zero));
    for i in (0..x.len()).step_by(16) {
        let mask = lanes(i);
        let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i));
        // Round to nearest even (the default MXCSR mode), clamp to 0..=255, narrow.
        let q = _mm512_cvtps_epi32(_mm512_add_ps(_mm512_mul_ps(v, inv_v), zero_v));
        let q = _mm512_max_epi32(q, _mm512_setzero_si512());
        _mm512_mask_cvtusepi32_storeu_epi8(out.as_mut_ptr().add(i) as *mut _, mask, q);
    }
    (scale, zero as i32)
}

/// [`quantize_wide_portable`], 16 values at a time, with the same result.
///
/// # Safety
/// The CPU has avx2 and fma; `out` is at least as long as `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_wide_avx2(x: &[f32], out: &mut [i16]) -> f32 {
    // SAFETY: this fn's contract (avx2 and fma present, `out` as long as `x`) covers every load and store below, all within `x` and `out`.
    unsafe {
        let (n, body) = (x.len(), x.len() / 16 * 16);
        let sign = _mm256_set1_ps(-0.0);
        let mut hi = _mm256_setzero_ps();
        for i in (0..body).step_by(8) {
            hi = _mm256_max_ps(hi, _mm256_andnot_ps(sign, _mm256_loadu_ps(x.as_ptr().add(i))));
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), hi);
        let max = x[body..].iter().chain(&lanes).fold(0.0f32, |m, v| m.max(v.abs()));
        let Some((inv, scale)) = wide_scale(max) else {
            out[..n].fill(0);
            return 0.0;
        };
        let inv_v = _mm256_set1_ps(inv);
        for i in (0..body).step_by(16) {
            // Round to nearest even (the default MXCSR mode); `packs` saturates to i16 and
            // interleaves the two halves by 128-bit lane, which the permute undoes.
            let a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), inv_v));
            let b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i + 8)), inv_v));
            let q = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
            _mm256_storeu_si256(out.as_mut_ptr().add(i) as *mut _, q);
        }
        for (o, v) in out[body..n].iter_mut().zip(&x[body..]) {
            *o = (v * inv).round_ties_even() as i16;
        }
        scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::random_values;

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
