//! f32 matrix products on weights packed once at load, the way ONNX Runtime's MLAS and BLIS do
//! it: a weight `Wᵀ` (`[in, out]`) is stored as panels of [`PANEL`] output columns, each panel
//! `in` rows of 16 floats one cache line apart, zero-padded past the last column. A product
//! then streams each panel linearly, and a 16-token query no longer re-packs every weight on
//! every call (what the `gemm` crate does, and what made short requests bandwidth-bound).
//!
//! The microkernel keeps a tile of `MR` rows × 16 columns in registers: per input feature it
//! loads one panel row, broadcasts one activation per row and issues `MR` 16-wide fused
//! multiply-adds. It is one generic loop compiled per CPU at run time: AVX-512F (`MR` = 12, a
//! zmm register per row, 12 of the 32 registers as accumulators), AVX2+FMA (`MR` = 6, two ymm
//! registers per row: 12 of 16), and portable. Activations are not packed (they are read in
//! place, row-major), so the only per-call work besides the arithmetic is the output.
//!
//! Blocking: inputs in blocks of [`KC`] features and rows in blocks of [`MC`], so that a block
//! of activations (MC × KC floats, 120 KiB) stays in L2 while every panel slice passes over it,
//! and a panel slice (KC × 16 floats, 16 KiB) stays in L1 while every row tile reuses it.
//! Threads split tall products by rows and short ones by panels (each thread then streams only
//! its share of the weights, which dominate the traffic there).

use super::dispatch::{SharedConst, SharedMut};
use rayon::prelude::*;

/// Output columns per packed panel: 16 floats, one cache line, one zmm or two ymm registers.
pub const PANEL: usize = 16;
/// Input features per block.
const KC: usize = 256;
/// Rows per block (a multiple of both kernels' tile heights).
const MC: usize = 120;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 17;
/// From this many rows on, threads split a product by rows rather than by panels.
const SPLIT_ROWS_MIN: usize = 192;

/// One panel row: 16 floats on one cache line.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct PanelRow([f32; PANEL]);

/// `Wᵀ` (`k × n`) packed in panels of 16 columns: panel `p`, input `i` at `rows[p·k + i]`.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    k: usize,
    n: usize,
    rows: Vec<PanelRow>,
}

impl PackedMatrix {
    /// Packs row-major `w_t` (`k` rows of `n` output columns).
    pub fn pack(w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "sgemm: weight is not k×n");
        let panels = n.div_ceil(PANEL);
        let mut rows = vec![PanelRow([0.0; PANEL]); panels * k];
        for (i, src) in w_t.chunks_exact(n.max(1)).enumerate().take(k) {
            for (p, cols) in src.chunks(PANEL).enumerate() {
                rows[p * k + i].0[..cols.len()].copy_from_slice(cols);
            }
        }
        Self { k, n, rows }
    }

    /// Packs a checkpoint's `W` (`n` rows of `k` inputs, `[out, in]`) directly, without a
    /// transposed copy.
    pub fn pack_out_in(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), k * n, "sgemm: weight is not n×k");
        let mut rows = vec![PanelRow([0.0; PANEL]); n.div_ceil(PANEL) * k];
        for (o, src) in w.chunks_exact(k.max(1)).enumerate().take(n) {
            let (p, c) = (o / PANEL, o % PANEL);
            for (i, &v) in src.iter().enumerate() {
                rows[p * k + i].0[c] = v;
            }
        }
        Self { k, n, rows }
    }

    pub fn in_features(&self) -> usize {
        self.k
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Back to row-major `Wᵀ` (`k × n`), for quantizing a layer after load.
    pub fn unpack(&self) -> Vec<f32> {
        let mut w_t = vec![0.0f32; self.k * self.n];
        for (i, dst) in w_t.chunks_exact_mut(self.n.max(1)).enumerate().take(self.k) {
            for (p, cols) in dst.chunks_mut(PANEL).enumerate() {
                let len = cols.len();
                cols.copy_from_slice(&self.rows[p * self.k + i].0[..len]);
            }
        }
        w_t
    }

    /// `dst (+)= x·Wᵀ` for row-major `x` (`m × k`) and `dst` (`m × n`).
    ///
    /// # Safety
    /// `dst` points to `m × n` writable floats, initialized when `read_dst`; otherwise every
    /// one is written (for `k > 0`) and none is read.
    pub unsafe fn matmul(&self, dst: *mut f32, x: &[f32], m: usize, read_dst: bool) {
        assert_eq!(x.len(), m * self.k, "sgemm: input is not m×k");
        if m == 0 || self.n == 0 || self.k == 0 {
            return;
        }
        let isa = Isa::detect();
        let panels = self.panels();
        let threads = rayon::current_num_threads();
        let (out, input) = (SharedMut(dst), SharedConst(x.as_ptr()));
        // SAFETY (every call below): the row and panel ranges lie inside the product, and no two
        // concurrent calls share an output row × panel.
        let run = |rows: std::ops::Range<usize>, panels: std::ops::Range<usize>| {
            let (out, input) = (out, input);
            // SAFETY: see above: ranges inside the product, disjoint between concurrent calls.
            unsafe { isa.run(self, out.0, input.0, rows, panels, read_dst) }
        };
        if m * self.n * self.k < PARALLEL_MIN_WORK || threads < 2 {
            run(0..m, 0..panels);
        } else if m >= SPLIT_ROWS_MIN {
            // Whole row blocks per thread where possible, so no block is cut in two.
            let per = m.div_ceil(threads).div_ceil(12) * 12;
            (0..m.div_ceil(per)).into_par_iter().for_each(|t| run(t * per..((t + 1) * per).min(m), 0..panels));
        } else {
            let per = panels.div_ceil(threads);
            (0..panels.div_ceil(per)).into_par_iter().for_each(|t| run(0..m, t * per..((t + 1) * per).min(panels)));
        }
    }
}

/// The kernel this CPU runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every kernel the running CPU can execute, for tests that compare them.
    #[cfg(test)]
    fn available() -> Vec<Self> {
        let best = Self::detect();
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if (best == Isa::Avx512 || best == Isa::Avx2) && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                all.push(Isa::Avx2);
            }
            if best == Isa::Avx512 {
                all.push(Isa::Avx512);
            }
        }
        all
    }

    /// # Safety
    /// `self` runs on this CPU; see [`block`].
    unsafe fn run(
        self,
        w: &PackedMatrix,
        dst: *mut f32,
        x: *const f32,
        rows: std::ops::Range<usize>,
        panels: std::ops::Range<usize>,
        read_dst: bool,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` is detected only on CPUs with avx512f, avx2 and fma; bounds are the caller's.
            Isa::Avx512 => unsafe { block_avx512(w, dst, x, rows, panels, read_dst) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is detected only on CPUs with avx2 and fma; bounds are the caller's.
            Isa::Avx2 => unsafe { block_avx2(w, dst, x, rows, panels, read_dst) },
            // SAFETY: the portable kernel needs no CPU feature; bounds are the caller's.
            Isa::Portable => unsafe { block::<Portable, 6>(w, dst, x, rows, panels, read_dst) },
        }
    }
}

/// # Safety
/// The CPU has avx512f, avx2 and fma; the rest of [`block`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn block_avx512(
    w: &PackedMatrix,
    dst: *mut f32,
    x: *const f32,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    read_dst: bool,
) {
    // SAFETY: the features `block` needs are this fn's target features; bounds are the caller's.
    unsafe { block::<x86::Avx512, 12>(w, dst, x, rows, panels, read_dst) }
}

/// # Safety
/// The CPU has avx2 and fma; the rest of [`block`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(
    w: &PackedMatrix,
    dst: *mut f32,
    x: *const f32,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    read_dst: bool,
) {
    // SAFETY: the features `block` needs are this fn's target features; bounds are the caller's.
    unsafe { block::<x86::Avx2, 6>(w, dst, x, rows, panels, read_dst) }
}

/// A register-tile kernel: `c (+)= a·b` for `R` rows of a tile (`R` up to its height).
trait Micro {
    /// # Safety
    /// The CPU has the kernel's features; the tile's pointers cover `R` rows, `kc` inputs.
    unsafe fn tile<const R: usize>(t: &Tile);
}

/// Rows `rows` × panels `panels` of the product, blocked as the module describes, in tiles of
/// `MR` rows (the last tile of a block takes a kernel of its own height).
///
/// # Safety
/// `K` runs on this CPU; `x` is `m × k` and `dst` `m × n` row-major with `rows.end <= m`,
/// `panels.end <= w.panels()`; `dst` is initialized there when `read_dst`.
#[inline(always)]
unsafe fn block<K: Micro, const MR: usize>(
    w: &PackedMatrix,
    dst: *mut f32,
    x: *const f32,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    read_dst: bool,
) {
    let (k, n) = (w.k, w.n);
    for m0 in rows.clone().step_by(MC) {
        let m1 = (m0 + MC).min(rows.end);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let accumulate = read_dst || k0 > 0;
            for p in panels.clone() {
                // SAFETY: panel `p` < panels and `k0` < k: inside the packed weights.
                let b = unsafe { w.rows.as_ptr().add(p * k + k0) };
                let cols = PANEL.min(n - p * PANEL);
                let mut r0 = m0;
                while r0 < m1 {
                    // SAFETY: `r0` < rows.end <= m and `p·PANEL` < n: inside `x` and `dst`.
                    let (a, c) = unsafe { (x.add(r0 * k + k0), dst.add(r0 * n + p * PANEL)) };
                    let tile = Tile { a, lda: k, b, kc, c, ldc: n, cols, accumulate };
                    let left = (m1 - r0).min(MR);
                    // SAFETY: `left` rows from r0 lie inside the block.
                    unsafe {
                        match left {
                            1 => K::tile::<1>(&tile),
                            2 => K::tile::<2>(&tile),
                            3 => K::tile::<3>(&tile),
                            4 => K::tile::<4>(&tile),
                            5 => K::tile::<5>(&tile),
                            6 => K::tile::<6>(&tile),
                            7 => K::tile::<7>(&tile),
                            8 => K::tile::<8>(&tile),
                            9 => K::tile::<9>(&tile),
                            10 => K::tile::<10>(&tile),
                            11 => K::tile::<11>(&tile),
                            _ => K::tile::<12>(&tile),
                        }
                    }
                    r0 += left;
                }
            }
        }
    }
}

/// One register tile's operands: `a` (rows `lda` apart), a panel slice `b` of `kc` rows, and
/// the output `c` (rows `ldc` apart, `cols` valid columns, added to when `accumulate`).
struct Tile {
    a: *const f32,
    lda: usize,
    b: *const PanelRow,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
}

impl Tile {
    /// Writes (or adds) row `r`'s 16 results, only the valid columns.
    ///
    /// # Safety
    /// `r` < the tile's rows; `c` covers them, `cols` columns each.
    #[inline(always)]
    unsafe fn store(&self, r: usize, acc: &[f32; PANEL]) {
        // SAFETY: row r of the tile, `cols` ≤ 16 valid columns.
        let c = unsafe { std::slice::from_raw_parts_mut(self.c.add(r * self.ldc), self.cols) };
        if self.accumulate {
            c.iter_mut().zip(acc).for_each(|(c, a)| *c += a);
        } else {
            c.copy_from_slice(&acc[..self.cols]);
        }
    }
}

/// Plain loops, for CPUs without the x86 kernels.
struct Portable;

impl Micro for Portable {
    /// # Safety
    /// As [`Micro::tile`]: the tile's pointers cover it (no CPU feature needed).
    #[inline(always)]
    unsafe fn tile<const R: usize>(t: &Tile) {
        let mut acc = [[0.0f32; PANEL]; R];
        for i in 0..t.kc {
            // SAFETY: i < kc rows of the panel slice and of each of the R activation rows.
            let b = unsafe { &(*t.b.add(i)).0 };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r` < R rows and `i` < kc inputs of the tile's activation rows.
                let a = unsafe { *t.a.add(r * t.lda + i) };
                for (acc, &b) in acc.iter_mut().zip(b) {
                    *acc = super::dispatch::fma::<{ cfg!(target_arch = "aarch64") }>(a, b, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: `r` < R, the rows the tile covers.
            unsafe { t.store(r, acc) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Micro, Tile, PANEL};
    use std::arch::x86_64::*;

    /// Two ymm accumulators per row (16 columns), one broadcast per row and input.
    pub(super) struct Avx2;

    impl Micro for Avx2 {
        /// # Safety
        /// As [`Micro::tile`]: the CPU has avx2 and fma; the tile's pointers cover it.
        #[inline(always)]
        unsafe fn tile<const R: usize>(t: &Tile) {
            // SAFETY: `Micro::tile`'s contract (the CPU has avx2 and fma; pointers cover the tile).
            unsafe { avx2_tile::<R>(t) }
        }
    }

    /// # Safety
    /// The CPU has avx2 and fma; `t`'s pointers cover its `R` rows, `kc` inputs and 16 columns.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn avx2_tile<const R: usize>(t: &Tile) {
        // SAFETY: the tile's pointers cover its `R` rows × `kc` inputs and 16 columns (this fn's contract); the features are enabled.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            let mut b = t.b as *const f32;
            let mut a = t.a;
            for _ in 0..t.kc {
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
                let c = t.c.add(r * t.ldc);
                if t.cols == PANEL {
                    let (mut y0, mut y1) = (acc[0], acc[1]);
                    if t.accumulate {
                        y0 = _mm256_add_ps(y0, _mm256_loadu_ps(c));
                        y1 = _mm256_add_ps(y1, _mm256_loadu_ps(c.add(8)));
                    }
                    _mm256_storeu_ps(c, y0);
                    _mm256_storeu_ps(c.add(8), y1);
                } else {
                    let mut row = [0.0f32; PANEL];
                    _mm256_storeu_ps(row.as_mut_ptr(), acc[0]);
                    _mm256_storeu_ps(row.as_mut_ptr().add(8), acc[1]);
                    t.store(r, &row);
                }
            }
        }
    }

    /// One zmm accumulator per row, the broadcast folded into the multiply-add.
    pub(super) struct Avx512;

    impl Micro for Avx512 {
        /// # Safety
        /// As [`Micro::tile`]: the CPU has avx512f; the tile's pointers cover it.
        #[inline(always)]
        unsafe fn tile<const R: usize>(t: &Tile) {
            // SAFETY: `Micro::tile`'s contract (the CPU has avx512f; pointers cover the tile).
            unsafe { avx512_tile::<R>(t) }
        }
    }

    /// # Safety
    /// The CPU has avx512f, avx2 and fma; `t`'s pointers cover its `R` rows, `kc` inputs and 16 columns.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn avx512_tile<const R: usize>(t: &Tile) {
        // SAFETY: the tile's pointers cover its `R` rows × `kc` inputs and 16 columns (this fn's contract); the features are enabled.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); R];
            let mut b = t.b as *const f32;
            let mut a = t.a;
            for _ in 0..t.kc {
                let bv = _mm512_load_ps(b);
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r * t.lda)), bv, *acc);
                }
                b = b.add(PANEL);
                a = a.add(1);
            }
            let mask: __mmask16 = ((1u32 << t.cols) - 1) as u16;
            for (r, acc) in acc.iter().enumerate() {
                let c = t.c.add(r * t.ldc);
                let y = if t.accumulate { _mm512_add_ps(*acc, _mm512_maskz_loadu_ps(mask, c)) } else { *acc };
                _mm512_mask_storeu_ps(c, mask, y);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ops::test_util::random_values as pseudo_random;

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, prior: &[f32]) -> Vec<f32> {
        let mut y = prior.to_vec();
        for i in 0..m {
            for r in 0..k {
                for c in 0..n {
                    y[i * n + c] += x[i * k + r] * w[r * n + c];
                }
            }
        }
        y
    }

    #[test]
    fn packing_round_trips() {
        let w = pseudo_random(37 * 50, 1);
        let packed = PackedMatrix::pack(&w, 37, 50);
        assert_eq!(packed.unpack(), w);
        // The same panels from the checkpoint's [out, in] layout.
        let w_out_in: Vec<f32> = (0..50).flat_map(|o| (0..37).map(move |i| (i, o))).map(|(i, o)| w[i * 50 + o]).collect();
        assert_eq!(PackedMatrix::pack_out_in(&w_out_in, 50, 37).unpack(), w);
    }

    #[test]
    fn every_kernel_matches_the_plain_product() {
        let isas = Isa::available();
        if !isas.contains(&Isa::Avx512) {
            eprintln!("NOTE: this CPU has no AVX-512F; the AVX-512 sgemm kernel is not exercised here");
        }
        // Ragged shapes: rows that fill no tile or block, columns no panel, inputs spanning
        // several KC blocks.
        for &(m, k, n) in &[(1, 5, 3), (13, 37, 50), (16, 384, 384), (125, 600, 17), (250, 64, 130)] {
            let x = pseudo_random(m * k, 2);
            let w = pseudo_random(k * n, 3);
            let prior = pseudo_random(m * n, 4);
            let packed = PackedMatrix::pack(&w, k, n);
            let expected = reference(&x, &w, m, k, n, &prior);
            let fresh = reference(&x, &w, m, k, n, &vec![0.0; m * n]);
            for &isa in &isas {
                let mut y = prior.clone();
                // SAFETY: `isa` is one this CPU has; `y` holds m × n floats and the ranges cover the product.
                unsafe { isa.run(&packed, y.as_mut_ptr(), x.as_ptr(), 0..m, 0..packed.panels(), true) };
                let worst = y.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(worst < 1e-4 * k as f32, "{isa:?} {m}×{k}×{n}: {worst}");
                let mut y = vec![f32::NAN; m * n];
                // SAFETY: `isa` is one this CPU has; `y` holds m × n floats and the ranges cover the product.
                unsafe { isa.run(&packed, y.as_mut_ptr(), x.as_ptr(), 0..m, 0..packed.panels(), false) };
                let worst = y.iter().zip(&fresh).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(worst < 1e-4 * k as f32, "{isa:?} {m}×{k}×{n} fresh: {worst}");
            }
            // The threaded driver (rows or panels split) gives the same result.
            let mut y = prior.clone();
            // SAFETY: `y` holds m × n initialized floats.
            unsafe { packed.matmul(y.as_mut_ptr(), &x, m, true) };
            let worst = y.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-4 * k as f32, "threaded {m}×{k}×{n}: {worst}");
        }
    }
}
