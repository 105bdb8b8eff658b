//! Pillow's `Image.resize` (`Resample.c`), reproduced exactly: separable passes, horizontal
//! first, antialiased supports, 22-bit fixed-point coefficients, uint8 between passes; only the
//! rows and columns a crop keeps are computed. And torchvision's resize of a uint8 tensor with
//! antialiased bicubic or Lanczos ([`resize_torch`]), which PyTorch ported from Pillow but with
//! int16 coefficients at a precision chosen per axis: the two round differently on some pixels.

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Filter {
    Nearest,
    Lanczos,
    Bilinear,
    Bicubic,
    Box,
    Hamming,
}

impl Filter {
    pub(super) fn from_pil(n: u32) -> Option<Filter> {
        [Filter::Nearest, Filter::Lanczos, Filter::Bilinear, Filter::Bicubic, Filter::Box, Filter::Hamming].get(n as usize).copied()
    }

    /// Pillow's `Resample.c` kernels and supports, same expressions (including Hamming's float constants).
    fn kernel(self) -> (fn(f64) -> f64, f64) {
        fn sinc(x: f64) -> f64 {
            if x == 0.0 {
                1.0
            } else {
                (x * std::f64::consts::PI).sin() / (x * std::f64::consts::PI)
            }
        }
        match self {
            Filter::Box | Filter::Nearest => (|x| if x > -0.5 && x <= 0.5 { 1.0 } else { 0.0 }, 0.5),
            Filter::Bilinear => (|x: f64| if x.abs() < 1.0 { 1.0 - x.abs() } else { 0.0 }, 1.0),
            Filter::Hamming => (
                |x: f64| {
                    let x = x.abs();
                    if x == 0.0 {
                        1.0
                    } else if x >= 1.0 {
                        0.0
                    } else {
                        let x = x * std::f64::consts::PI;
                        x.sin() / x * (0.54f32 as f64 + 0.46f32 as f64 * x.cos())
                    }
                },
                1.0,
            ),
            Filter::Bicubic => (
                |x: f64| {
                    let (a, x) = (-0.5, x.abs());
                    if x < 1.0 {
                        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                    } else if x < 2.0 {
                        (((x - 5.0) * x + 8.0) * x - 4.0) * a
                    } else {
                        0.0
                    }
                },
                2.0,
            ),
            Filter::Lanczos => (|x| if (-3.0..3.0).contains(&x) { sinc(x) * sinc(x / 3.0) } else { 0.0 }, 3.0),
        }
    }
}

const PRECISION_BITS: u32 = 22;

/// Pillow's `clip8` (and PyTorch's uint8 store): the accumulator has `precision` fractional
/// bits; the arithmetic shift floors.
fn clip8(v: i32, precision: u32) -> u8 {
    (v >> precision).clamp(0, 255) as u8
}

/// PyTorch's antialiased bicubic filter (`HelperInterpCubic::aa_filter`, a = −0.5, with
/// `cubic_convolution1/2`'s operation order, which differs from Pillow's in the last bits).
fn torch_cubic(x: f64) -> f64 {
    let (a, x) = (-0.5, x.abs());
    if x < 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

/// Fixed-point taps for the outputs in `outs` along one axis (`precompute_coeffs` + `normalize_coeffs_8bpc`).
struct Taps {
    bounds: Vec<(usize, usize)>,
    k: Vec<i32>,
    stride: usize,
    /// Fractional bits of the coefficients.
    precision: u32,
}

impl Taps {
    /// PyTorch's `_compute_index_ranges_int16_weights` for an antialiased filter: Pillow's
    /// supports and centres, weights normalized in f64, then rounded to int16 at the largest
    /// precision (at most 22 bits) under which the axis's largest weight still fits. Bicubic
    /// has PyTorch's own kernel ([`torch_cubic`]); Lanczos is Pillow's (torch 2.15, checked
    /// against torchvision 0.29 on random images: identical).
    fn torch(in_size: usize, out_size: usize, filter: TorchFilter) -> Taps {
        let (kernel, radius): (fn(f64) -> f64, f64) = match filter {
            TorchFilter::Bicubic => (torch_cubic, 2.0),
            TorchFilter::Lanczos => Filter::Lanczos.kernel(),
        };
        let scale = in_size as f64 / out_size as f64;
        let support = if scale >= 1.0 { radius * scale } else { radius };
        let stride = support.ceil() as usize * 2 + 1;
        let inv = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let (mut bounds, mut weights) = (Vec::with_capacity(out_size), vec![0f64; out_size * stride]);
        let mut largest = 0f64;
        for i in 0..out_size {
            let center = scale * (i as f64 + 0.5);
            let xmin = ((center - support + 0.5) as i64).max(0);
            let n = (((center + support + 0.5) as i64).min(in_size as i64) - xmin).clamp(0, stride as i64) as usize;
            let w = &mut weights[i * stride..i * stride + n];
            let mut total = 0.0;
            for (j, wj) in w.iter_mut().enumerate() {
                *wj = kernel((j as f64 + xmin as f64 - center + 0.5) * inv);
                total += *wj;
            }
            if total != 0.0 {
                for wj in w.iter_mut() {
                    *wj /= total;
                    largest = largest.max(*wj);
                }
            }
            bounds.push((xmin as usize, n));
        }
        let mut precision = 0;
        while precision < 22 && ((0.5 + largest * (1u32 << (precision + 1)) as f64) as i32) < (1 << 15) {
            precision += 1;
        }
        let k = weights
            .iter()
            .map(|&w| {
                let v = w * (1u32 << precision) as f64;
                (if v < 0.0 { -0.5 + v } else { 0.5 + v }) as i32 as i16 as i32
            })
            .collect();
        Taps { bounds, k, stride, precision }
    }

    fn new(in_size: usize, out_size: usize, filter: Filter, outs: Range<usize>) -> Taps {
        let (f, support) = filter.kernel();
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = support * filterscale;
        let stride = support.ceil() as usize * 2 + 1;
        let inv = 1.0 / filterscale;
        let (mut bounds, mut k) = (Vec::with_capacity(outs.len()), vec![0i32; outs.len() * stride]);
        let mut w = vec![0f64; stride];
        for (i, xx) in outs.enumerate() {
            let center = (xx as f64 + 0.5) * scale;
            // C's (int) truncation, then clamped to the image.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64).max(xmin as i64) as usize;
            let n = (xmax - xmin).min(stride);
            let mut total = 0.0;
            for (x, wx) in w[..n].iter_mut().enumerate() {
                *wx = f(((x + xmin) as f64 - center + 0.5) * inv);
                total += *wx;
            }
            for (wx, kx) in w[..n].iter().zip(&mut k[i * stride..]) {
                let wx = if total != 0.0 { wx / total } else { *wx };
                let scaled = wx * (1u32 << PRECISION_BITS) as f64;
                *kx = if wx < 0.0 { (scaled - 0.5) as i32 } else { (scaled + 0.5) as i32 };
            }
            bounds.push((xmin, n));
        }
        Taps { bounds, k, stride, precision: PRECISION_BITS }
    }

    fn taps(&self, i: usize) -> (usize, &[i32]) {
        let (start, n) = self.bounds[i];
        (start, &self.k[i * self.stride..i * self.stride + n])
    }
}

// Sums stay inside i32: normalized taps have |sum| < 2, so |acc| < 2 * 255 * 2^22 + 2^21 < 2^31 (Pillow's
// bound; PyTorch's precision is at most 22 bits too).

/// The filters torchvision resizes a uint8 tensor with, as reproduced here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TorchFilter {
    Bicubic,
    Lanczos,
}

impl TorchFilter {
    /// The PIL filter number's torchvision counterpart, where reproduced (3 bicubic, 1 Lanczos).
    pub(crate) fn from_pil(n: u32) -> Option<TorchFilter> {
        match n {
            3 => Some(TorchFilter::Bicubic),
            1 => Some(TorchFilter::Lanczos),
            _ => None,
        }
    }
}

/// torchvision's `resize(uint8 tensor, (dh, dw), filter, antialias=True)` on packed RGB: a
/// pass along each axis whose size changes, horizontal first, uint8 between them.
pub(crate) fn resize_torch(src: &[u8], (sw, sh): (usize, usize), (dw, dh): (usize, usize), filter: TorchFilter) -> Vec<u8> {
    let hor = (dw != sw).then(|| Taps::torch(sw, dw, filter));
    let vert = (dh != sh).then(|| Taps::torch(sh, dh, filter));
    let mid = horizontal(src, sw, 0..sh, hor.as_ref(), 0..dw);
    vertical(&mid, dw, 0, vert.as_ref(), dh)
}

/// `Image.resize((dw, dh), filter)` on packed RGB, returning only columns `xs` and rows `ys` of the result.
pub(super) fn resize(
    src: &[u8],
    (sw, sh): (usize, usize),
    (dw, dh): (usize, usize),
    filter: Filter,
    xs: Range<usize>,
    ys: Range<usize>,
) -> Vec<u8> {
    if filter == Filter::Nearest {
        return nearest(src, (sw, sh), (dw, dh), xs, ys);
    }
    // Pillow skips a pass whose size does not change, and (13.0) runs the vertical pass first when only the
    // height shrinks; the uint8 rounding between passes makes the order visible in the output. KNOWN GAP:
    // when both sides shrink, Pillow 13.0 also goes vertical-first in some cases (about 1 in 4, often tall
    // images) by a rule not identified yet; those outputs differ by a level or two on some pixels.
    let hor = (dw != sw).then(|| Taps::new(sw, dw, filter, xs.clone()));
    let vert = (dh != sh).then(|| Taps::new(sh, dh, filter, ys.clone()));
    if dw >= sw && dh < sh {
        let mid = vertical(src, sw, 0, vert.as_ref(), ys.len());
        return horizontal(&mid, sw, 0..ys.len(), hor.as_ref(), xs);
    }
    // The vertical taps say which source rows the horizontal pass must produce.
    let rows = match &vert {
        Some(t) => {
            let first = t.bounds.first().map_or(0, |b| b.0);
            first..t.bounds.iter().map(|b| b.0 + b.1).max().unwrap_or(first)
        }
        None => ys.clone(),
    };
    let mid = horizontal(src, sw, rows.clone(), hor.as_ref(), xs.clone());
    match vert {
        Some(_) => vertical(&mid, xs.len(), rows.start, vert.as_ref(), ys.len()),
        None => mid,
    }
}

/// Horizontal pass over `rows` of a `width`-pixel image: output columns are the taps' outputs, or `xs`
/// copied when there is no pass.
fn horizontal(src: &[u8], width: usize, rows: Range<usize>, taps: Option<&Taps>, xs: Range<usize>) -> Vec<u8> {
    let Some(t) = taps else { return copy_region(src, width, xs, rows) };
    let mut out = Vec::with_capacity(rows.len() * t.bounds.len() * 3);
    for y in rows {
        let row = &src[y * width * 3..(y + 1) * width * 3];
        for i in 0..t.bounds.len() {
            let (start, k) = t.taps(i);
            let half = 1 << (t.precision.max(1) - 1);
            let (mut r, mut g, mut b) = (half, half, half);
            for (p, &kk) in row[start * 3..].chunks_exact(3).zip(k) {
                r += p[0] as i32 * kk;
                g += p[1] as i32 * kk;
                b += p[2] as i32 * kk;
            }
            out.extend([clip8(r, t.precision), clip8(g, t.precision), clip8(b, t.precision)]);
        }
    }
    out
}

/// Vertical pass over a `width`-pixel image whose first stored row is source row `first_row`; without a
/// pass the `n` stored rows are the output.
fn vertical(src: &[u8], width: usize, first_row: usize, taps: Option<&Taps>, n: usize) -> Vec<u8> {
    let row_len = width * 3;
    let Some(t) = taps else { return src[..n * row_len].to_vec() };
    let mut acc = vec![0i32; row_len];
    let mut out = Vec::with_capacity(t.bounds.len() * row_len);
    for i in 0..t.bounds.len() {
        let (start, k) = t.taps(i);
        acc.fill(1 << (t.precision.max(1) - 1));
        // Row-at-a-time accumulation keeps the inner loop contiguous (it vectorizes); integer sums are exact,
        // so the order does not change the result.
        for (j, &kk) in k.iter().enumerate() {
            let row = &src[(start + j - first_row) * row_len..][..row_len];
            for (a, &p) in acc.iter_mut().zip(row) {
                *a += p as i32 * kk;
            }
        }
        out.extend(acc.iter().map(|&a| clip8(a, t.precision)));
    }
    out
}

pub(super) fn copy_region(src: &[u8], sw: usize, xs: Range<usize>, ys: Range<usize>) -> Vec<u8> {
    ys.flat_map(|y| &src[(y * sw + xs.start) * 3..(y * sw + xs.end) * 3]).copied().collect()
}

/// Pillow's NEAREST resize is an affine transform (`ImagingScaleAffine`): positions start at half a step
/// and are accumulated in f64, truncated; a position outside the image stays black.
fn nearest(src: &[u8], (sw, sh): (usize, usize), (dw, dh): (usize, usize), xs: Range<usize>, ys: Range<usize>) -> Vec<u8> {
    let table = |n_in: usize, n_out: usize| {
        let step = n_in as f32 as f64 / n_out as f64;
        let mut pos = step * 0.5;
        (0..n_out)
            .map(|_| {
                let i = if pos < 0.0 { None } else { Some(pos as usize).filter(|&i| i < n_in) };
                pos += step;
                i
            })
            .collect::<Vec<_>>()
    };
    let (tx, ty) = (table(sw, dw), table(sh, dh));
    let mut out = Vec::with_capacity(xs.len() * ys.len() * 3);
    for y in ys {
        for x in xs.clone() {
            match (ty[y], tx[x]) {
                (Some(sy), Some(sx)) => out.extend_from_slice(&src[(sy * sw + sx) * 3..][..3]),
                _ => out.extend([0; 3]),
            }
        }
    }
    out
}
