//! The x86 kernels: each format's microkernels for AVX-512 and AVX2, and the entry points that
//! compile [`Job::block`] with their features (chosen at run time by [`super::Kernel`]).

use super::{Job, Micro, Out, PairRow, PanelRow, Tile, PANEL};
use std::arch::x86_64::*;

/// Defines an entry point: `Job::block` for `$micro` with `$mr`-row tiles, compiled with
/// `$features`.
macro_rules! entry {
    ($name:ident, $features:literal, $micro:ty, $mr:literal) => {
        /// # Safety
        /// The CPU has the features this fn is compiled with; the rest of [`Job::block`]'s contract.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(job: &Job) {
            // SAFETY: the features `block` needs are this fn's target features; bounds are the caller's.
            unsafe { job.block::<$micro, $mr>() }
        }
    };
}

entry!(f32_avx512, "avx512f,avx2,fma", F32Avx512, 12);
entry!(f32_avx2, "avx2,fma", F32Avx2, 6);
entry!(bf16_dot, "avx512f,avx512bf16,avx2,fma", Bf16Dot, 12);
entry!(bf16_avx512, "avx512f,avx2,fma", Bf16Avx512, 12);
entry!(bf16_avx2, "avx2,fma", Bf16Avx2, 4);

/// `x` rounded to bf16 into `out`'s pairs (the last one padded with 0 for an odd length),
/// 16 at a time with `vcvtneps2bf16` (round to nearest even, as [`super::round`]).
///
/// # Safety
/// The CPU has avx512f and avx512bf16; `out` holds at least `⌈x.len()/2⌉` pairs.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn round_row(x: &[f32], out: &mut [u32]) {
    assert!(out.len() * 2 >= x.len());
    let dst = out.as_mut_ptr() as *mut u16;
    let mut i = 0;
    // SAFETY: 16 floats from `i` lie in `x` and 16 halves from `i` in `out` (asserted above).
    unsafe {
        while i + 16 <= x.len() {
            let b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, std::mem::transmute::<__m256bh, __m256i>(b));
            i += 16;
        }
    }
    for (j, &v) in x.iter().enumerate().skip(i) {
        // SAFETY: j < x.len() ≤ 2·out.len().
        unsafe { *dst.add(j) = super::round(v) };
    }
    if x.len() % 2 == 1 {
        // SAFETY: the odd row's last pair has room for its padding half.
        unsafe { *dst.add(x.len()) = 0 };
    }
}

/// Writes (or adds) a zmm accumulator as row `r` of `out`, only the valid columns.
///
/// # Safety
/// The CPU has avx512f; `r` < the tile's rows.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_zmm(out: &Out, r: usize, acc: __m512) {
    let mask: __mmask16 = ((1u32 << out.cols) - 1) as u16;
    // SAFETY: row r of the tile, its `cols` valid columns (the mask).
    unsafe {
        let c = out.c.add(r * out.ldc);
        let y = if out.accumulate { _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, c)) } else { acc };
        _mm512_mask_storeu_ps(c, mask, y);
    }
}

/// Writes (or adds) two ymm accumulators (16 columns) as row `r` of `out`.
///
/// # Safety
/// The CPU has avx2; `r` < the tile's rows.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store_ymm2(out: &Out, r: usize, acc: [__m256; 2]) {
    // SAFETY: row r of the tile, its `cols` valid columns.
    unsafe {
        let c = out.c.add(r * out.ldc);
        if out.cols == PANEL {
            let (mut y0, mut y1) = (acc[0], acc[1]);
            if out.accumulate {
                y0 = _mm256_add_ps(y0, _mm256_loadu_ps(c));
                y1 = _mm256_add_ps(y1, _mm256_loadu_ps(c.add(8)));
            }
            _mm256_storeu_ps(c, y0);
            _mm256_storeu_ps(c.add(8), y1);
        } else {
            let mut row = [0.0f32; PANEL];
            _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
            out.store(r, &row);
        }
    }
}

/// Declares a microkernel type whose tile is the `#[target_feature]` fn `$tile`.
macro_rules! micro {
    ($(#[$doc:meta])* $name:ident, $a:ty, $b:ty, $per_step:literal, $tile:ident) => {
        micro!($(#[$doc])* $name, $a, $b, $per_step, $tile, 1);
    };
    ($(#[$doc:meta])* $name:ident, $a:ty, $b:ty, $per_step:literal, $tile:ident, $panels:literal) => {
        $(#[$doc])*
        pub(super) struct $name;

        impl Micro for $name {
            type A = $a;
            type B = $b;
            const A_PER_STEP: usize = $per_step;
            const PANELS: usize = $panels;
            /// # Safety
            /// As [`Micro::tile`]: the CPU has the kernel's features; the tile's pointers cover it.
            #[inline(always)]
            unsafe fn tile<const R: usize>(t: &Tile<$a, $b>) {
                // SAFETY: `Micro::tile`'s contract (features present; pointers cover the tile).
                unsafe { $tile::<R>(t) }
            }
        }
    };
}

micro!(
    /// f32: one zmm accumulator per row, the broadcast folded into the multiply-add.
    F32Avx512, f32, PanelRow, 1, f32_avx512_tile
);
micro!(
    /// f32: two ymm accumulators per row (16 columns), one broadcast per row and input.
    F32Avx2, f32, PanelRow, 1, f32_avx2_tile
);
micro!(
    /// bf16 × bf16 with `vdpbf16ps`, two panels (32 columns) per tile: per panel row, one
    /// activation pair broadcast per row feeds both panels' accumulators (24 of the 32
    /// registers), so a step loads 14 operands for 24 instructions, not 13 for 12.
    Bf16Dot, u32, PairRow, 1, bf16_dot_wide_tile, 2
);
micro!(
    /// bf16 weights widened in registers × f32 activations, one zmm accumulator per row.
    Bf16Avx512, f32, PairRow, 2, bf16_avx512_tile
);
micro!(
    /// bf16 weights widened in registers × f32 activations, two ymm accumulators per row, in
    /// tiles of 4 rows (with 6, LLVM spilled the accumulators and it ran at 70% of f32).
    Bf16Avx2, f32, PairRow, 2, bf16_avx2_tile
);

/// # Safety
/// The CPU has avx512f, avx2 and fma; `t`'s pointers cover its `R` rows, `steps` inputs.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn f32_avx512_tile<const R: usize>(t: &Tile<f32, PanelRow>) {
    // SAFETY: the tile's pointers cover its `R` rows × `steps` inputs and 16 columns (this fn's contract); the features are enabled.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = t.b as *const f32;
        let mut a = t.a;
        for _ in 0..t.steps {
            let bv = _mm512_load_ps(b);
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r * t.lda)), bv, *acc);
            }
            b = b.add(PANEL);
            a = a.add(1);
        }
        for (r, acc) in acc.iter().enumerate() {
            store_zmm(&t.out, r, *acc);
        }
    }
}

/// # Safety
/// The CPU has avx2 and fma; `t`'s pointers cover its `R` rows, `steps` inputs.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn f32_avx2_tile<const R: usize>(t: &Tile<f32, PanelRow>) {
    // SAFETY: the tile's pointers cover its `R` rows × `steps` inputs and 16 columns (this fn's contract); the features are enabled.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut b = t.b as *const f32;
        let mut a = t.a;
        for _ in 0..t.steps {
            let (b0, b1) = (_mm256_load_ps(b), _mm256_load_ps(b.add(8)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*a.add(r * t.lda));
                acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
            }
            b = b.add(PANEL);
            a = a.add(1);
        }
        for (r, acc) in acc.iter().enumerate() {
            store_ymm2(&t.out, r, *acc);
        }
    }
}

/// Two panels' tile (one when `t.out.cols` ≤ 16, the share's last panel alone).
///
/// # Safety
/// The CPU has avx512f and avx512bf16; `t`'s pointers cover its `R` rows of pairs, `steps`
/// panel rows of each panel its columns reach.
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
#[inline]
unsafe fn bf16_dot_wide_tile<const R: usize>(t: &Tile<u32, PairRow>) {
    if t.out.cols <= PANEL {
        // SAFETY: one panel, this fn's contract.
        return unsafe { bf16_dot_tile::<R>(t) };
    }
    // SAFETY: the tile's pointers cover its `R` rows × `steps` pairs, and both panels `steps`
    // rows each, `panel_stride` apart (this fn's contract); the features are enabled.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let mut b = t.b as *const __m512i;
        let mut a = t.a;
        for _ in 0..t.steps {
            let w0 = std::mem::transmute::<__m512i, __m512bh>(_mm512_load_si512(b));
            let w1 = std::mem::transmute::<__m512i, __m512bh>(_mm512_load_si512(b.add(t.panel_stride)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*a.add(r * t.lda) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], w0, x);
                acc[1] = _mm512_dpbf16_ps(acc[1], w1, x);
            }
            b = b.add(1);
            a = a.add(1);
        }
        let second = Out { c: t.out.c.add(PANEL), ldc: t.out.ldc, cols: t.out.cols - PANEL, accumulate: t.out.accumulate };
        let first = Out { cols: PANEL, ..t.out };
        for (r, acc) in acc.iter().enumerate() {
            store_zmm(&first, r, acc[0]);
            store_zmm(&second, r, acc[1]);
        }
    }
}

/// # Safety
/// The CPU has avx512f and avx512bf16; `t`'s pointers cover its `R` rows of pairs, `steps` panel rows.
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
#[inline]
unsafe fn bf16_dot_tile<const R: usize>(t: &Tile<u32, PairRow>) {
    // SAFETY: the tile's pointers cover its `R` rows × `steps` pairs and one cache line per panel row (this fn's contract); the features are enabled.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = t.b as *const __m512i;
        let mut a = t.a;
        for _ in 0..t.steps {
            let w = std::mem::transmute::<__m512i, __m512bh>(_mm512_load_si512(b));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*a.add(r * t.lda) as i32));
                // The broadcast operand last: it folds into the instruction as `m32bcst`, where
                // a separate `vbroadcastss` would take a vector pipe the products need.
                *acc = _mm512_dpbf16_ps(*acc, w, x);
            }
            b = b.add(1);
            a = a.add(1);
        }
        for (r, acc) in acc.iter().enumerate() {
            store_zmm(&t.out, r, *acc);
        }
    }
}

/// # Safety
/// The CPU has avx512f, avx2 and fma; `t`'s pointers cover its `R` rows, `2·steps` inputs.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn bf16_avx512_tile<const R: usize>(t: &Tile<f32, PairRow>) {
    // SAFETY: the tile's pointers cover its `R` rows × `2·steps` inputs and one cache line per panel row (this fn's contract); the features are enabled.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = t.b as *const __m512i;
        let mut a = t.a;
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        for _ in 0..t.steps {
            // Lane c holds column c's pair: input 2s in its low half, 2s+1 in its high half.
            let pair = _mm512_load_si512(b);
            let (even, odd) = (_mm512_castsi512_ps(_mm512_slli_epi32(pair, 16)), _mm512_castsi512_ps(_mm512_and_si512(pair, high)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = a.add(r * t.lda);
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(*x), even, *acc);
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(1)), odd, *acc);
            }
            b = b.add(1);
            a = a.add(2);
        }
        for (r, acc) in acc.iter().enumerate() {
            store_zmm(&t.out, r, *acc);
        }
    }
}

/// # Safety
/// The CPU has avx2 and fma; `t`'s pointers cover its `R` rows, `2·steps` inputs.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn bf16_avx2_tile<const R: usize>(t: &Tile<f32, PairRow>) {
    // SAFETY: the tile's pointers cover its `R` rows × `2·steps` inputs and one cache line per panel row (this fn's contract); the features are enabled.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut b = t.b as *const __m256i;
        let mut a = t.a;
        for _ in 0..t.steps {
            // Columns 0-7 and 8-15, each lane a column's pair (input 2s low, 2s+1 high), one
            // input at a time so that few registers hold weights.
            let even = [_mm256_slli_epi32(_mm256_load_si256(b), 16), _mm256_slli_epi32(_mm256_load_si256(b.add(1)), 16)];
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*a.add(r * t.lda));
                acc[0] = _mm256_fmadd_ps(x, _mm256_castsi256_ps(even[0]), acc[0]);
                acc[1] = _mm256_fmadd_ps(x, _mm256_castsi256_ps(even[1]), acc[1]);
            }
            let odd = [
                _mm256_slli_epi32(_mm256_srli_epi32(_mm256_load_si256(b), 16), 16),
                _mm256_slli_epi32(_mm256_srli_epi32(_mm256_load_si256(b.add(1)), 16), 16),
            ];
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*a.add(r * t.lda + 1));
                acc[0] = _mm256_fmadd_ps(x, _mm256_castsi256_ps(odd[0]), acc[0]);
                acc[1] = _mm256_fmadd_ps(x, _mm256_castsi256_ps(odd[1]), acc[1]);
            }
            b = b.add(2);
            a = a.add(2);
        }
        for (r, acc) in acc.iter().enumerate() {
            store_ymm2(&t.out, r, *acc);
        }
    }
}
