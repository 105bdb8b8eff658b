//! bfloat16 for the packed products: the activations each kernel reads, and the
//! portable kernel on bf16 panels (the x86 ones are in [`super::x86`]).

use super::{widen, Kernel, Micro, PairRow, Tile, PANEL};
use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    // The previous product's converted activations, reused: a fresh buffer of several MB per
    // product costs a page fault per 4 KiB (as in `int8::activations`).
    static PAIRS: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    static PADDED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Below this many activations they are converted on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 15;

/// The activations of one product as its kernel reads them.
pub(super) enum Activations<'a> {
    /// `x` itself (rows of `k` floats).
    F32(&'a [f32], usize),
    /// `x` copied into rows of `k + 1` floats, the last one 0: the bf16 kernels on f32
    /// activations read inputs in pairs, and a row of odd length would end mid-pair.
    Padded(Vec<f32>, usize),
    /// `x` rounded to bf16, rows of ⌈k/2⌉ pairs (the last one padded with 0), for `vdpbf16ps`.
    Pairs(Vec<u32>, usize),
}

impl<'a> Activations<'a> {
    /// `x` (`m × k`) for `kernel`.
    pub(super) fn prepare(kernel: Kernel, x: &'a [f32], m: usize, k: usize) -> Self {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Bf16Dot | Kernel::Bf16Amx => {
                let stride = k.div_ceil(2);
                let mut pairs = PAIRS.take();
                pairs.clear();
                pairs.resize(m * stride, 0);
                let row = |(x, out): (&[f32], &mut [u32])| {
                    // SAFETY: `Bf16Dot` and `Bf16Amx` are detected only on CPUs with avx512f and avx512bf16;
                    // `out` holds ⌈len/2⌉ pairs for the row's `len` values.
                    unsafe { super::x86::round_row(x, out) }
                };
                if m * k >= PARALLEL_MIN_VALUES {
                    x.par_chunks(k).zip(pairs.par_chunks_mut(stride)).for_each(row);
                } else {
                    x.chunks(k).zip(pairs.chunks_mut(stride)).for_each(row);
                }
                Activations::Pairs(pairs, stride)
            }
            Kernel::Bf16Portable if k % 2 == 1 => Self::padded(x, m, k),
            #[cfg(target_arch = "x86_64")]
            Kernel::Bf16Avx512 | Kernel::Bf16Avx2 if k % 2 == 1 => Self::padded(x, m, k),
            _ => Activations::F32(x, k),
        }
    }

    fn padded(x: &[f32], m: usize, k: usize) -> Self {
        let mut padded = PADDED.take();
        padded.clear();
        padded.reserve(m * (k + 1));
        for row in x.chunks(k) {
            padded.extend_from_slice(row);
            padded.push(0.0);
        }
        Activations::Padded(padded, k + 1)
    }

    /// The first activation, as the kernel's pointer type expects it cast.
    pub(super) fn as_ptr(&self) -> *const f32 {
        match self {
            Activations::F32(x, _) => x.as_ptr(),
            Activations::Padded(x, _) => x.as_ptr(),
            Activations::Pairs(x, _) => x.as_ptr() as *const f32,
        }
    }

    /// Elements of the kernel's activation type from one row to the next.
    pub(super) fn lda(&self) -> usize {
        match self {
            Activations::F32(_, lda) | Activations::Padded(_, lda) | Activations::Pairs(_, lda) => *lda,
        }
    }

    /// Hands the buffer back for the next product on this thread.
    pub(super) fn recycle(self) {
        match self {
            Activations::F32(..) => {}
            Activations::Padded(x, _) => PADDED.set(x),
            Activations::Pairs(x, _) => PAIRS.set(x),
        }
    }
}

/// `x` (`m × k`) rounded to bf16 pairs, rows of ⌈k/2⌉ (the last one padded with 0): what
/// [`Activations::prepare`] makes with `vcvtneps2bf16`, in plain Rust.
pub(super) fn round_pairs(x: &[f32], m: usize, k: usize) -> Vec<u32> {
    let stride = k.div_ceil(2);
    let mut pairs = vec![0u32; m * stride];
    for (row, out) in x.chunks(k).zip(pairs.chunks_mut(stride)) {
        for (i, pair) in out.iter_mut().enumerate() {
            let lo = super::round(row[2 * i]) as u32;
            let hi = row.get(2 * i + 1).map_or(0, |&v| super::round(v) as u32);
            *pair = hi << 16 | lo;
        }
    }
    pairs
}

/// The portable kernel on bf16 panels: each weight widened to f32, f32 activations.
pub(super) struct Portable;

impl Micro for Portable {
    type A = f32;
    type B = PairRow;
    const A_PER_STEP: usize = 2;

    /// # Safety
    /// As [`Micro::tile`]: the tile's pointers cover it (no CPU feature needed).
    #[inline(always)]
    unsafe fn tile<const R: usize>(t: &Tile<f32, PairRow>) {
        let mut acc = [[0.0f32; PANEL]; R];
        for s in 0..t.steps {
            // SAFETY: s < steps rows of the panel slice.
            let b = unsafe { &(*t.b.add(s)).0 };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r` < R rows; the row holds 2 activations per panel row.
                let (a0, a1) = unsafe { (*t.a.add(r * t.lda + 2 * s), *t.a.add(r * t.lda + 2 * s + 1)) };
                for (c, acc) in acc.iter_mut().enumerate() {
                    let fma = super::super::dispatch::fma::<{ cfg!(target_arch = "aarch64") }>;
                    *acc = fma(a1, widen(b[2 * c + 1]), fma(a0, widen(b[2 * c]), *acc));
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: `r` < R, the rows the tile covers.
            unsafe { t.out.store(r, acc) };
        }
    }
}
