//! Int8 matrix products for `--quantization int8`.
//!
//! The inputs of every product are cut into segments of consecutive features (128, or 32 for
//! the AVX2 kernel: see [`Kernel::Avx2`]), and
//! each segment gets its own scales: weights once at load, symmetrically per output column
//! (`s8`, `max|w|/127`); activations per token at run time, asymmetrically (`u8 = round(x/s) +
//! z` over the segment's `[min, max]`). Per-segment scales are what keep all-MiniLM-L6-v2 within
//! cosine 0.999 of float32: its FFN output weights and its hidden states have a few outlier
//! features, and one scale per whole row spends the 8 bits on those (measured with every block
//! layer quantized, 40 texts, cosine to f32: one asymmetric scale per row, worst 0.9935 and
//! typically 0.998; per 128-feature segment, worst 0.9980 and typically 0.9990).
//! Unsigned activations are what AVX-512 VNNI's `vpdpbusd` multiplies by signed bytes (4 of
//! each per 32-bit lane: 64 multiply-adds per instruction against 16 for an f32 FMA). Each
//! segment's exact i32 sum is dequantized — its zero point taken back out with the weights'
//! column sums — and accumulated in f32 in the output.
//!
//! Weights are pre-packed into panels of 16 output columns whose 4-byte groups of consecutive
//! inputs match `vpdpbusd`'s lanes, so the kernel streams each panel linearly. A register tile
//! covers [`TILE_ROWS`] tokens × [`TILE_PANELS`]·16 columns (24 accumulators of the 32 zmm
//! registers); rows are padded to whole tiles and padded columns are never stored. CPUs without
//! AVX-512 VNNI take the same layout in 256-bit registers: AVX-VNNI's `vpdpbusd`, or AVX2's
//! `vpmaddubsw` + `vpmaddwd` (with 7-bit activations, see [`Kernel::Avx2`]), 4 rows × 16
//! columns a register tile. Without AVX2 a portable kernel does the same arithmetic (correct,
//! but slower than f32).

use rayon::prelude::*;

/// Tokens per register tile.
const TILE_ROWS: usize = 8;
/// Output columns per packed panel: the i32 lanes of one zmm register.
const PANEL: usize = 16;
/// Panels per register tile.
const TILE_PANELS: usize = 3;
/// Bytes of one panel row group: 16 columns × 4 consecutive inputs.
const GROUP_BYTES: usize = PANEL * 4;
/// Input features per quantization segment (a multiple of 4).
const SEGMENT: usize = 128;
/// Below this many tokens a product is split over threads by columns, not rows.
const SPLIT_ROWS_MIN: usize = 64;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// A weight matrix `Wᵀ` (`[in, out]`) quantized per segment and output column, packed for the
/// kernel.
#[derive(Debug, Clone)]
pub struct Int8Weight {
    k: usize,
    n: usize,
    /// Groups of 4 inputs (k rounded up to 4, over 4).
    groups: usize,
    /// Inputs per quantization segment (a multiple of 4), the kernel's choice.
    segment_len: usize,
    segments: usize,
    /// Panels, rounded up to whole tiles.
    panels: usize,
    /// `panels × groups × 64` bytes: panel p, group g, column c, input j at
    /// `((p·groups + g)·16 + c)·4 + j`.
    packed: Vec<i8>,
    /// `segments × width` (columns padded to `panels·16`): the dequantization scales.
    scale: Vec<f32>,
    /// `segments × width`: `Σ q[k][c]` over the segment, what a zero point contributes per unit.
    column_sum: Vec<i32>,
}

impl Int8Weight {
    /// Quantizes row-major `w_t` (`k` rows of `n` output columns) for this CPU's kernel.
    pub fn quantize(w_t: &[f32], k: usize, n: usize) -> Self {
        Self::quantize_for(Kernel::detect(), w_t, k, n)
    }

    fn quantize_for(kernel: Kernel, w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "int8: weight is not k×n");
        let groups = k.div_ceil(4);
        let segment_len = kernel.segment_len();
        let segments = k.div_ceil(segment_len);
        let panels = n.div_ceil(PANEL).div_ceil(TILE_PANELS) * TILE_PANELS;
        let width = panels * PANEL;
        let mut scale = vec![0.0f32; segments * width];
        let mut column_sum = vec![0i32; segments * width];
        let mut packed = vec![0i8; panels * groups * GROUP_BYTES];
        // Row by row (`w_t` is row-major): a column-wise walk misses the cache on every element,
        // which adds seconds to the start-up of a large model.
        for segment in 0..segments {
            let rows = segment * segment_len..((segment + 1) * segment_len).min(k);
            let scale = &mut scale[segment * width..segment * width + n];
            let column_sum = &mut column_sum[segment * width..segment * width + n];
            if kernel.sums_byte_pairs() {
                // The scale bounds each pair of consecutive inputs: |q₀| + |q₁| ≤ 128.
                for r in rows.clone().step_by(2) {
                    let next = if r + 1 < rows.end { &w_t[(r + 1) * n..(r + 2) * n] } else { &w_t[r * n..r * n + n] };
                    let pairs = w_t[r * n..(r + 1) * n].iter().zip(next).map(|(a, b)| if r + 1 < rows.end { a.abs() + b.abs() } else { a.abs() });
                    scale.iter_mut().zip(pairs).for_each(|(m, w)| *m = m.max(w));
                }
            } else {
                for r in rows.clone() {
                    scale.iter_mut().zip(&w_t[r * n..(r + 1) * n]).for_each(|(m, w)| *m = m.max(w.abs()));
                }
            }
            scale.iter_mut().for_each(|m| *m = if *m > 0.0 { *m / 127.0 } else { 1.0 });
            for r in rows {
                for (c, (&w, (&s, sum))) in w_t[r * n..(r + 1) * n].iter().zip(scale.iter().zip(column_sum.iter_mut())).enumerate() {
                    let q = (w / s).round_ties_even().clamp(-127.0, 127.0) as i8;
                    *sum += q as i32;
                    packed[(((c / PANEL) * groups + r / 4) * PANEL + c % PANEL) * 4 + r % 4] = q;
                }
            }
        }
        Self { k, n, groups, segment_len, segments, panels, packed, scale, column_sum }
    }

    pub fn in_features(&self) -> usize {
        self.k
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    fn width(&self) -> usize {
        self.panels * PANEL
    }

    /// The 4-input groups of `segment`.
    fn segment_groups(&self, segment: usize) -> std::ops::Range<usize> {
        let groups = self.segment_len / 4;
        segment * groups..((segment + 1) * groups).min(self.groups)
    }

    /// `dst (+)= x·W` for row-major `x` (`m × k`) and `dst` (`m × n`).
    ///
    /// # Safety
    /// `dst` points to `m × n` writable floats, initialized when `read_dst`; otherwise every one
    /// is written (for `k > 0`) and none is read.
    pub unsafe fn matmul(&self, dst: *mut f32, x: &[f32], m: usize, read_dst: bool) {
        assert_eq!(x.len(), m * self.k, "int8: input is not m×k");
        let kernel = Kernel::detect();
        let rows = Activations::quantize(kernel, x, m, self);
        let threads = rayon::current_num_threads();
        let tiles = rows.tiles();
        let out = Out { ptr: dst, rows: m, cols: self.n, read: read_dst };
        let run = |tiles: std::ops::Range<usize>, panels: std::ops::Range<usize>| {
            for tile in tiles {
                for p0 in panels.clone().step_by(TILE_PANELS) {
                    // SAFETY: tile/panel ranges are in bounds of `rows`/`self`; each call writes
                    // only its own rows × columns of dst, disjoint from every other call.
                    unsafe { kernel.tile(&rows, tile, self, p0, out) };
                }
            }
        };
        if m * self.n * self.k < PARALLEL_MIN_WORK || threads < 2 {
            run(0..tiles, 0..self.panels);
        } else if m >= SPLIT_ROWS_MIN {
            let per = tiles.div_ceil(threads);
            (0..threads).into_par_iter().for_each(|t| run((t * per).min(tiles)..((t + 1) * per).min(tiles), 0..self.panels));
        } else {
            let steps = self.panels / TILE_PANELS;
            let per = steps.div_ceil(threads);
            (0..threads).into_par_iter().for_each(|t| {
                run(0..tiles, (t * per).min(steps) * TILE_PANELS..((t + 1) * per).min(steps) * TILE_PANELS)
            });
        }
        SCRATCH.set(rows.data);
    }
}

thread_local! {
    /// The previous product's activation bytes, reused: a fresh buffer of several MB per
    /// product costs a page fault per 4 KiB (2% of an int8 forward pass, measured).
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Activations quantized per row and segment, padded to whole tiles of rows and groups of 4.
struct Activations {
    /// `rows_padded × stride` bytes.
    data: Vec<u8>,
    stride: usize,
    segments: usize,
    /// `rows_padded × segments` (padded rows: scale 0, so they dequantize to nothing).
    scale: Vec<f32>,
    /// `rows_padded × segments`: the byte that stands for 0.
    zero: Vec<i32>,
}

impl Activations {
    /// `x` (`m × k`) quantized in `w`'s segments.
    fn quantize(kernel: Kernel, x: &[f32], m: usize, w: &Int8Weight) -> Self {
        let (k, segments, segment_len) = (w.k, w.segments, w.segment_len);
        let stride = w.groups * 4;
        let padded = m.div_ceil(TILE_ROWS) * TILE_ROWS;
        // Bytes past a row's k inputs and the padded rows keep whatever they held: the weights
        // there are 0 and padded rows are never stored.
        let mut data = SCRATCH.take();
        data.resize(padded * stride, 0);
        let mut params = vec![(0.0f32, 0i32); padded * segments];
        let work = |(row, (out, params)): (&[f32], (&mut [u8], &mut [(f32, i32)]))| {
            for ((x, out), p) in row.chunks(segment_len).zip(out.chunks_mut(segment_len)).zip(params) {
                *p = kernel.quantize_segment(x, out);
            }
        };
        if m * k >= PARALLEL_MIN_WORK / 16 {
            x.par_chunks(k).zip(data.par_chunks_mut(stride).zip(params.par_chunks_mut(segments))).for_each(work);
        } else {
            x.chunks(k).zip(data.chunks_mut(stride).zip(params.chunks_mut(segments))).for_each(work);
        }
        let (scale, zero) = params.into_iter().unzip();
        Self { data, stride, segments, scale, zero }
    }

    fn tiles(&self) -> usize {
        self.scale.len() / self.segments / TILE_ROWS
    }

    fn params(&self, row: usize, segment: usize) -> (f32, i32) {
        let i = row * self.segments + segment;
        (self.scale[i], self.zero[i])
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

/// Where a tile's results go: `rows × cols` row-major f32, accumulated onto when `read`.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    read: bool,
}
// SAFETY: threads sharing an `Out` write disjoint tiles (see `Int8Weight::matmul`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    /// AVX-512 VNNI: `vpdpbusd` on zmm registers, 8 rows × 48 columns a tile.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AVX-VNNI (VEX-encoded, 256-bit `vpdpbusd`), for CPUs with it but no AVX-512.
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX2: `vpmaddubsw` + `vpmaddwd`. Its byte products are summed in pairs into 16-bit
    /// lanes that saturate, so each column's scale is set by its largest pair of consecutive
    /// weights (`|q₀| + |q₁| ≤ 128`, so `255·128` fits in an i16) rather than by its largest
    /// weight: about half a bit of weight resolution instead of the overflow that ONNX
    /// Runtime accepts (saturating, MiniLM falls to cosine 0.94 of f32). Segments are 32
    /// inputs, not 128, to win the rest back (64 kept MiniLM at 0.9992 but the tiny Qwen3
    /// fixture at 0.9989; 32 gives it 0.99904). Measured on MiniLM's 40 texts, worst cosine to
    /// f32: 128-input segments 0.9986; 7-bit activations 0.9970; weights within ±64 0.9980.
    /// The price is a dequantization pass per 32 inputs, which leaves this kernel at about
    /// float32's speed on Zen 3 rather than ahead of it.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Kernel {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vnni")
            {
                return Kernel::Vnni;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                if std::is_x86_feature_detected!("avxvnni") {
                    return Kernel::AvxVnni;
                }
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// Every kernel the running CPU can execute, for tests that compare them.
    #[cfg(test)]
    fn available() -> Vec<Self> {
        let mut all = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                all.push(Kernel::Avx2);
                if std::is_x86_feature_detected!("avxvnni") {
                    all.push(Kernel::AvxVnni);
                }
            }
            if Self::detect() == Kernel::Vnni {
                all.push(Kernel::Vnni);
            }
        }
        all
    }

    /// Inputs per quantization segment.
    fn segment_len(self) -> usize {
        if self.sums_byte_pairs() {
            SEGMENT / 4
        } else {
            SEGMENT
        }
    }

    /// Whether this kernel sums byte products in pairs into saturating 16-bit lanes, so the
    /// weights' scale must bound every pair: `255·(|q₀| + |q₁|)` fits in an i16.
    fn sums_byte_pairs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Kernel::Avx2 {
            return true;
        }
        false
    }

    fn quantize_segment(self, x: &[f32], out: &mut [u8]) -> (f32, i32) {
        match self {
            // SAFETY: `Vnni` is only detected on CPUs with avx512f and avx512bw.
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni => unsafe { vnni::quantize_segment(x, out) },
            _ => quantize_segment_portable(x, out),
        }
    }

    /// One register tile: rows `tile·8..+8` × panels `p0..p0+3`, every segment.
    ///
    /// # Safety
    /// `tile < a.tiles()`, `p0 + TILE_PANELS <= w.panels`, and no other thread writes the same
    /// tile of `out` at the same time.
    unsafe fn tile(self, a: &Activations, tile: usize, w: &Int8Weight, p0: usize, out: Out) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni => unsafe { vnni::tile(a, tile, w, p0, out) },
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => unsafe { avx2::tile_avxvnni(a, tile, w, p0, out) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::tile_avx2(a, tile, w, p0, out) },
            Kernel::Portable => unsafe { portable_tile(a, tile, w, p0, out) },
        }
    }
}

/// Whether `--quantization int8` runs a SIMD kernel here (AVX2 or better).
pub fn accelerated() -> bool {
    !matches!(Kernel::detect(), Kernel::Portable)
}

/// The same tile as the VNNI kernel, in plain integer arithmetic.
unsafe fn portable_tile(a: &Activations, tile: usize, w: &Int8Weight, p0: usize, out: Out) {
    for p in p0..p0 + TILE_PANELS {
        let panel = &w.packed[p * w.groups * GROUP_BYTES..(p + 1) * w.groups * GROUP_BYTES];
        for row in tile * TILE_ROWS..((tile + 1) * TILE_ROWS).min(out.rows) {
            let x = &a.data[row * a.stride..(row + 1) * a.stride];
            for segment in 0..w.segments {
                let mut acc = [0i32; PANEL];
                for g in w.segment_groups(segment) {
                    let (xs, group) = (&x[g * 4..g * 4 + 4], &panel[g * GROUP_BYTES..(g + 1) * GROUP_BYTES]);
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

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{segment_scale, Activations, Int8Weight, Out, GROUP_BYTES, PANEL, TILE_PANELS, TILE_ROWS};
    use std::arch::x86_64::*;

    /// [`super::quantize_segment_portable`], 16 lanes at a time, with the same result.
    ///
    /// # Safety
    /// The CPU has avx512f and avx512bw; `out` is at least as long as `x`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize_segment(x: &[f32], out: &mut [u8]) -> (f32, i32) {
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

    /// # Safety
    /// The CPU has avx512f, avx512bw and avx512vnni; the caller's contract of `Kernel::tile`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(a: &Activations, tile: usize, w: &Int8Weight, p0: usize, out: Out) {
        let panel_bytes = w.groups * GROUP_BYTES;
        let b = w.packed.as_ptr().add(p0 * panel_bytes);
        let x = a.data.as_ptr().add(tile * TILE_ROWS * a.stride);
        for segment in 0..w.segments {
            let mut acc = [[_mm512_setzero_si512(); TILE_PANELS]; TILE_ROWS];
            for g in w.segment_groups(segment) {
                let mut wv = [_mm512_setzero_si512(); TILE_PANELS];
                for (p, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(b.add(p * panel_bytes + g * GROUP_BYTES) as *const _);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi32((x.add(r * a.stride + g * 4) as *const i32).read_unaligned());
                    for (p, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_dpbusd_epi32(*acc, xv, wv[p]);
                    }
                }
            }
            let read = out.read || segment > 0;
            for p in 0..TILE_PANELS {
                let c0 = (p0 + p) * PANEL;
                if c0 >= out.cols {
                    break;
                }
                let valid = (out.cols - c0).min(PANEL);
                let mask: __mmask16 = ((1u32 << valid) - 1) as u16;
                let i = segment * w.width() + c0;
                let column_sum = _mm512_loadu_si512(w.column_sum.as_ptr().add(i) as *const _);
                let scale = _mm512_loadu_ps(w.scale.as_ptr().add(i));
                for (r, acc) in acc.iter().enumerate() {
                    let row = tile * TILE_ROWS + r;
                    if row >= out.rows {
                        break;
                    }
                    let (row_scale, zero) = a.params(row, segment);
                    let offset = _mm512_mullo_epi32(_mm512_set1_epi32(zero), column_sum);
                    let y = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[p], offset));
                    let s = _mm512_mul_ps(scale, _mm512_set1_ps(row_scale));
                    let d = out.ptr.add(row * out.cols + c0);
                    let prior = if read { _mm512_maskz_loadu_ps(mask, d) } else { _mm512_setzero_ps() };
                    _mm512_mask_storeu_ps(d, mask, _mm512_fmadd_ps(y, s, prior));
                }
            }
        }
    }
}

/// The 256-bit kernels: AVX2 (`vpmaddubsw` + `vpmaddwd`) and AVX-VNNI (`vpdpbusd`), one body.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Activations, Int8Weight, Out, GROUP_BYTES, PANEL, TILE_PANELS, TILE_ROWS};
    use std::arch::x86_64::*;

    /// Rows per register tile: 4 rows × 16 columns are 8 ymm accumulators, which leaves
    /// room for the two weight vectors, the broadcast activations and the products.
    const ROWS: usize = 4;

    /// Defines a tile function over `$dot(acc, x, w)`, compiled with `$features`.
    macro_rules! tile_kernel {
        ($name:ident, $features:literal, $dot:ident) => {
            /// Rows `tile·8..+8` × panels `p0..p0+3`: in 4-row halves, one panel at a time.
            ///
            /// # Safety
            /// The CPU has `$features`; the caller's contract of `Kernel::tile`.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(a: &Activations, tile: usize, w: &Int8Weight, p0: usize, out: Out) {
                unsafe {
                    let panel_bytes = w.groups * GROUP_BYTES;
                    for half in 0..TILE_ROWS / ROWS {
                        let row0 = tile * TILE_ROWS + half * ROWS;
                        if row0 >= out.rows {
                            break;
                        }
                        let x = a.data.as_ptr().add(row0 * a.stride);
                        for p in p0..p0 + TILE_PANELS {
                            let c0 = p * PANEL;
                            if c0 >= out.cols {
                                break;
                            }
                            let b = w.packed.as_ptr().add(p * panel_bytes);
                            for segment in 0..w.segments {
                                let mut acc = [[_mm256_setzero_si256(); 2]; ROWS];
                                for g in w.segment_groups(segment) {
                                    let w0 = _mm256_loadu_si256(b.add(g * GROUP_BYTES) as *const _);
                                    let w1 = _mm256_loadu_si256(b.add(g * GROUP_BYTES + 32) as *const _);
                                    for (r, acc) in acc.iter_mut().enumerate() {
                                        let xv = _mm256_set1_epi32((x.add(r * a.stride + g * 4) as *const i32).read_unaligned());
                                        acc[0] = $dot(acc[0], xv, w0);
                                        acc[1] = $dot(acc[1], xv, w1);
                                    }
                                }
                                store(a, w, &acc, row0, c0, segment, out);
                            }
                        }
                    }
                }
            }
        };
    }

    #[inline(always)]
    unsafe fn dot_avx2(acc: __m256i, x: __m256i, w: __m256i) -> __m256i {
        // Pairs of u8·s8 products into i16 (no saturation: |q₀| + |q₁| ≤ 128), then into i32.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), _mm256_set1_epi16(1))) }
    }

    #[inline(always)]
    unsafe fn dot_avxvnni(acc: __m256i, x: __m256i, w: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, x, w) }
    }

    tile_kernel!(tile_avx2, "avx2,fma", dot_avx2);
    tile_kernel!(tile_avxvnni, "avx2,fma,avxvnni", dot_avxvnni);

    /// Dequantizes one segment's sums for `ROWS` rows × 16 columns from `c0` and adds them to
    /// the output (or writes them, for the first segment of a fresh output).
    #[inline(always)]
    unsafe fn store(a: &Activations, w: &Int8Weight, acc: &[[__m256i; 2]; ROWS], row0: usize, c0: usize, segment: usize, out: Out) {
        unsafe {
            let read = out.read || segment > 0;
            let valid = (out.cols - c0).min(PANEL) as i32;
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let i = segment * w.width() + c0;
            for (half, lane0) in [(0usize, 0i32), (1, 8)] {
                // Columns past the last are padding in `scale`/`column_sum` and masked off in
                // the output.
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - lane0), lanes);
                let full = valid - lane0 >= 8;
                let column_sum = _mm256_loadu_si256(w.column_sum.as_ptr().add(i + half * 8) as *const _);
                let scale = _mm256_loadu_ps(w.scale.as_ptr().add(i + half * 8));
                for (r, acc) in acc.iter().enumerate() {
                    let row = row0 + r;
                    if row >= out.rows {
                        break;
                    }
                    let (row_scale, zero) = a.params(row, segment);
                    let offset = _mm256_mullo_epi32(_mm256_set1_epi32(zero), column_sum);
                    let y = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[half], offset));
                    let s = _mm256_mul_ps(scale, _mm256_set1_ps(row_scale));
                    let d = out.ptr.add(row * out.cols + c0 + half * 8);
                    // Masked stores are slow on AMD (microcoded): only at a ragged last panel.
                    if full {
                        let prior = if read { _mm256_loadu_ps(d) } else { _mm256_setzero_ps() };
                        _mm256_storeu_ps(d, _mm256_fmadd_ps(y, s, prior));
                    } else {
                        let prior = if read { _mm256_maskload_ps(d, mask) } else { _mm256_setzero_ps() };
                        _mm256_maskstore_ps(d, mask, _mm256_fmadd_ps(y, s, prior));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; m * n];
        for i in 0..m {
            for r in 0..k {
                for c in 0..n {
                    y[i * n + c] += x[i * k + r] * w[r * n + c];
                }
            }
        }
        y
    }

    /// The product with activations quantized as `quantizer` does it, tiles run by `kernel`.
    fn run(quantizer: Kernel, kernel: Kernel, w: &Int8Weight, x: &[f32], m: usize, prior: &[f32]) -> Vec<f32> {
        let rows = Activations::quantize(quantizer, x, m, w);
        let mut dst = prior.to_vec();
        let out = Out { ptr: dst.as_mut_ptr(), rows: m, cols: w.n, read: true };
        for tile in 0..rows.tiles() {
            for p0 in (0..w.panels).step_by(TILE_PANELS) {
                unsafe { kernel.tile(&rows, tile, w, p0, out) };
            }
        }
        dst
    }

    #[test]
    fn int8_product_is_close_to_f32_and_kernels_agree() {
        let kernels = Kernel::available();
        eprintln!("int8 kernels on this CPU: {kernels:?}");
        #[cfg(target_arch = "x86_64")]
        for (kernel, name) in [(Kernel::Vnni, "AVX-512 VNNI"), (Kernel::AvxVnni, "AVX-VNNI")] {
            if !kernels.contains(&kernel) {
                eprintln!("NOTE: this CPU has no {name}; that int8 kernel is not exercised here");
            }
        }
        // Ragged shapes: rows, columns and inputs that fill no tile, panel or group.
        for &(m, k, n) in &[(13, 37, 50), (1, 384, 384), (70, 64, 1152), (300, 96, 17), (6, 300, 40)] {
            let x = pseudo_random(m * k, 1);
            let w = pseudo_random(k * n, 2);
            let prior = pseudo_random(m * n, 3);
            let exact = reference(&x, &w, m, k, n);
            for &kernel in &kernels {
                let q = Int8Weight::quantize_for(kernel, &w, k, n);
                let portable = run(kernel, Kernel::Portable, &q, &x, m, &prior);
                let mut err = 0.0f64;
                let mut norm = 0.0f64;
                for i in 0..m * n {
                    let y = (portable[i] - prior[i]) as f64;
                    err += (y - exact[i] as f64).powi(2);
                    norm += (exact[i] as f64).powi(2);
                }
                let relative = (err / norm).sqrt();
                assert!(relative < 0.02, "{kernel:?} {m}×{k}×{n}: relative error {relative}");
                let fast = run(kernel, kernel, &q, &x, m, &prior);
                for i in 0..m * n {
                    assert!((fast[i] - portable[i]).abs() <= 1e-4 * (1.0 + portable[i].abs()), "{kernel:?} {m}×{k}×{n} at {i}");
                }
            }
            // The threaded driver gives the same result as the tile loop.
            let kernel = Kernel::detect();
            let q = Int8Weight::quantize(&w, k, n);
            let fast = run(kernel, kernel, &q, &x, m, &prior);
            let mut threaded = prior.clone();
            unsafe { q.matmul(threaded.as_mut_ptr(), &x, m, true) };
            for i in 0..m * n {
                assert!((threaded[i] - fast[i]).abs() <= 1e-5 * (1.0 + fast[i].abs()), "{m}×{k}×{n} threaded at {i}");
            }
        }
    }

    #[test]
    fn fast_activation_quantization_matches_portable() {
        let x: Vec<f32> = pseudo_random(200, 6).iter().map(|v| v * 7.0 + 1.5).collect();
        for kernel in Kernel::available() {
            for len in [1, 15, 16, 17, 128, 200] {
                let (mut fast, mut portable) = (vec![0u8; len], vec![0u8; len]);
                let a = kernel.quantize_segment(&x[..len], &mut fast);
                let b = quantize_segment_portable(&x[..len], &mut portable);
                assert_eq!(a, b, "{kernel:?} len {len}");
                assert_eq!(fast, portable, "{kernel:?} len {len}");
            }
        }
    }

    #[test]
    fn zero_rows_and_columns_stay_zero() {
        let (m, k, n) = (3, 8, 5);
        let mut x = pseudo_random(m * k, 4);
        x[k..2 * k].iter_mut().for_each(|v| *v = 0.0);
        let mut w = pseudo_random(k * n, 5);
        (0..k).for_each(|r| w[r * n + 2] = 0.0);
        let q = Int8Weight::quantize(&w, k, n);
        let mut y: Vec<f32> = Vec::with_capacity(m * n);
        unsafe {
            q.matmul(y.as_mut_ptr(), &x, m, false);
            y.set_len(m * n);
        }
        assert!(y[n..2 * n].iter().all(|&v| v == 0.0));
        assert!((0..m).all(|i| y[i * n + 2] == 0.0));
    }
}
