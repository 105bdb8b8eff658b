//! Branch-free f32 approximations (`exp`, `erf`, `tanh`) and lane-parallel reductions, written
//! so that the loops calling them vectorize.

use super::dispatch::fma;

/// `e^x` in f32 without branches (so loops over it vectorize): range reduction to
/// `x = k·ln2 + r`, a degree-6 polynomial for `e^r`, and the exponent bits for `2^k`.
/// Relative error below 3e-7 over the clamped range.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let k = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_888_9)))));
    // 2^k from the exponent bits. k + 127 is an integer in 1..=254 after the clamp; adding 2^23
    // puts it in the low mantissa bits, so plain bit operations build 2^k. (`k as i32` would
    // be a saturating, NaN-checking conversion that LLVM does one lane at a time: measured as
    // most of the time of GELU.)
    let biased = (k + 127.0 + 8_388_608.0).to_bits() & 0xff;
    p * f32::from_bits(biased << 23)
}

/// torch's `softplus` (β 1, threshold 20: above it, `x` itself).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The error function, Abramowitz & Stegun 7.1.26 (absolute error below 5e-7 in f32).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp(-a * a);
    y.copysign(x)
}

#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let e = exp(-2.0 * x.abs());
    ((1.0 - e) / (1.0 + e)).copysign(x)
}

/// Sum with eight independent accumulators, so the loop vectorizes (a single running sum is a
/// serial chain that LLVM may not reorder).
#[inline(always)]
pub(crate) fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Σ x² with eight independent accumulators (see [`sum_lanes`]).
#[inline(always)]
pub(crate) fn sum_squares<const FMA: bool>(x: &[f32]) -> f32 {
    let mut squares = [0f32; 8];
    for c in x.chunks_exact(8) {
        for l in 0..8 {
            squares[l] = fma::<FMA>(c[l], c[l], squares[l]);
        }
    }
    squares.iter().sum::<f32>() + x.chunks_exact(8).remainder().iter().map(|v| v * v).sum::<f32>()
}

#[inline(always)]
pub(crate) fn max_lanes(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for l in 0..8 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    acc.iter().copied().fold(tail, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_and_exp_match_libm() {
        let mut worst_erf = 0f32;
        let mut worst_exp = 0f32;
        for i in -4000..4000 {
            let x = i as f32 / 500.0;
            worst_erf = worst_erf.max((erf(x) as f64 - reference_erf(x as f64)).abs() as f32);
            worst_exp = worst_exp.max(((exp(x) - x.exp()) / x.exp()).abs());
        }
        assert!(worst_erf < 5e-7, "erf error {worst_erf}");
        assert!(worst_exp < 3e-7, "exp error {worst_exp}");
    }

    /// erf by its Taylor series in f64, accurate for |x| ≤ 5 when summed long enough.
    fn reference_erf(x: f64) -> f64 {
        if x.abs() > 5.0 {
            return x.signum();
        }
        let mut sum = 0.0;
        let mut term = x;
        let mut n = 0.0;
        while term.abs() > 1e-17 || n < 5.0 {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -x * x / n;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
