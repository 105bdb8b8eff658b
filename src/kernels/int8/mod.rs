//! Int8 matrix products for `--quantization int8`.
//!
//! Weights are quantized once at load to signed bytes, symmetrically per output column and per
//! segment of [`SEGMENT`] consecutive input features (`max|w|/127` each), and packed into
//! panels of 16 output columns for the kernel the CPU runs. Per-segment weight scales are what
//! keep all-MiniLM-L6-v2 within cosine 0.999 of float32: its feed-forward output weights have
//! a few outlier input features, and one scale per whole column spends the 8 bits on those
//! (measured with every block layer but Q/K/V quantized, 40 texts, worst cosine to f32 with
//! exact activations: one scale per column 0.9974; per 256 inputs 0.9995; per 128 0.9996).
//!
//! Activations are quantized per token at run time in one of two [`Scheme`]s:
//! - [`Scheme::Bytes`], for the VNNI instructions (`vpdpbusd`: 4 unsigned × signed byte
//!   products per 32-bit lane, 64 multiply-adds per zmm instruction) and AMX's `TDPBUSD` (the
//!   same products on 16 × 64-byte tiles, [`amx`]): unsigned bytes with a
//!   scale and zero point per segment, whose sums are dequantized per segment with the weights'
//!   column sums taking the zero point back out.
//! - [`Scheme::Wide`], for AVX2 (and the portable fallback): signed 16-bit activations with one
//!   scale per token, multiplied by the sign-extended weights with `vpmaddwd` (pairs of 16-bit
//!   products summed into 32-bit lanes, which cannot saturate). With 15 bits the activations'
//!   rounding is negligible (worst cosine 0.99957 vs 0.99958 with exact activations), where
//!   AVX2's byte instruction (`vpmaddubsw`) would sum pairs of byte products into *saturating*
//!   16-bit lanes: ONNX Runtime accepts the overflow (its int8 MiniLM falls to cosine 0.91 of
//!   f32), and avoiding it costs weight bits or short segments. `vpmaddwd` takes as many
//!   multiplier cycles per product as `vpmaddubsw` + `vpmaddwd` do, so nothing is lost.
//!
//! Each segment's exact i32 sums are dequantized and accumulated in f32 in the output. The
//! products run over blocks of rows small enough to stay in the L2 cache, panel by panel,
//! so each weight panel is read from memory once per block (see [`Int8Weight::matmul`]).

mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
mod portable;
#[cfg(test)]
mod portable_bytes;
mod quantize;
#[cfg(target_arch = "x86_64")]
mod x86;

use activations::{ByteRows, WideRows};
use rayon::prelude::*;

/// Output columns per packed panel: the i32 lanes of one zmm register, two ymm.
const PANEL: usize = 16;
/// Register tiles, rows × panels: [`Scheme::Bytes`] 8 × 3 (24 zmm accumulators for AVX-512
/// VNNI), [`Scheme::Wide`] 6 × 1 (12 ymm accumulators for AVX2).
const BYTES_TILE_ROWS: usize = 8;
const BYTES_TILE_PANELS: usize = 3;
const WIDE_TILE_ROWS: usize = 6;
/// Input features per quantization segment (a multiple of 4).
const SEGMENT: usize = 128;
/// Below this many tokens a product is split over threads by columns, not rows.
const SPLIT_ROWS_MIN: usize = 64;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;
/// Activation bytes per block of rows and segments: a block stays in the L2 cache while every
/// weight panel passes over it (Zen 3 and 4 have 512 KiB or 1 MiB per core).
const ROW_BLOCK_BYTES: usize = 192 << 10;
/// Segments per block: a panel's 256 inputs × 16 columns of weights (4 KiB) and a tile's
/// activations for them stay in the L1 cache. Without it, the 1536-input products ran at 70%
/// of the 384-input ones' speed (their 24 KiB panels and 18 KiB of a tile's rows overflowed it).
const BLOCK_SEGMENTS: usize = 2;

/// How activations are quantized and which instructions multiply them: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scheme {
    /// Unsigned bytes per segment, weights in groups of 4 consecutive inputs (`vpdpbusd`).
    Bytes,
    /// Signed 16-bit per token, weights in pairs of consecutive inputs (`vpmaddwd`).
    Wide,
}

impl Scheme {
    /// Consecutive inputs per packed weight group: what one 32-bit lane multiplies.
    fn group(self) -> usize {
        match self {
            Scheme::Bytes => 4,
            Scheme::Wide => 2,
        }
    }
}

/// A weight matrix `Wᵀ` (`[in, out]`) quantized per segment and output column, packed for the
/// kernel it was quantized for.
#[derive(Debug, Clone)]
pub struct Int8Weight {
    kernel: Kernel,
    k: usize,
    n: usize,
    /// Groups of `kernel.scheme().group()` inputs (k rounded up, over the group).
    groups: usize,
    segments: usize,
    /// Panels, rounded up to whole register tiles.
    panels: usize,
    /// `panels × groups × 16 × group` bytes: panel p, group g, column c, input j at
    /// `((p·groups + g)·16 + c)·group + j`.
    packed: Vec<i8>,
    /// `segments × width` (columns padded to `panels·16`): the dequantization scales.
    scale: Vec<f32>,
    /// [`Scheme::Bytes`] only, `segments × width`: `Σ q[k][c]` over the segment, what a zero
    /// point contributes per unit.
    column_sum: Vec<i32>,
}

impl Int8Weight {
    /// Quantizes row-major `w_t` (`k` rows of `n` output columns) for this CPU's kernel.
    pub fn quantize(w_t: &[f32], k: usize, n: usize) -> Self {
        Self::quantize_for(Kernel::detect(), w_t, k, n)
    }

    fn quantize_for(kernel: Kernel, w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "int8: weight is not k×n");
        let scheme = kernel.scheme();
        let group = scheme.group();
        let groups = k.div_ceil(group);
        let segments = k.div_ceil(SEGMENT);
        let tile_panels = kernel.tile_shape().1;
        let panels = n.div_ceil(PANEL).div_ceil(tile_panels) * tile_panels;
        let width = panels * PANEL;
        let mut scale = vec![0.0f32; segments * width];
        let mut column_sum = vec![0i32; if scheme == Scheme::Bytes { segments * width } else { 0 }];
        let mut packed = vec![0i8; panels * groups * PANEL * group];
        // Row by row (`w_t` is row-major): a column-wise walk misses the cache on every element,
        // which adds seconds to the start-up of a large model.
        for segment in 0..segments {
            let rows = segment * SEGMENT..((segment + 1) * SEGMENT).min(k);
            let scale = &mut scale[segment * width..segment * width + n];
            for r in rows.clone() {
                scale.iter_mut().zip(&w_t[r * n..(r + 1) * n]).for_each(|(m, w)| *m = m.max(w.abs()));
            }
            scale.iter_mut().for_each(|m| *m = if *m > 0.0 { *m / 127.0 } else { 1.0 });
            for r in rows {
                for (c, (&w, &s)) in w_t[r * n..(r + 1) * n].iter().zip(scale.iter()).enumerate() {
                    let q = (w / s).round_ties_even().clamp(-127.0, 127.0) as i8;
                    if scheme == Scheme::Bytes {
                        column_sum[segment * width + c] += q as i32;
                    }
                    packed[(((c / PANEL) * groups + r / group) * PANEL + c % PANEL) * group + r % group] = q;
                }
            }
        }
        Self { kernel, k, n, groups, segments, panels, packed, scale, column_sum }
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

    /// Bytes of one panel's packed weights.
    fn panel_bytes(&self) -> usize {
        self.groups * PANEL * self.kernel.scheme().group()
    }

    /// The input groups of `segment`.
    fn segment_groups(&self, segment: usize) -> std::ops::Range<usize> {
        let per = SEGMENT / self.kernel.scheme().group();
        segment * per..((segment + 1) * per).min(self.groups)
    }

    /// `dst (+)= x·W` for row-major `x` (`m × k`) and `dst` (`m × n`).
    ///
    /// # Safety
    /// `dst` points to `m × n` writable floats, initialized when `read_dst`; otherwise every one
    /// is written (for `k > 0`) and none is read.
    pub unsafe fn matmul(&self, dst: *mut f32, x: &[f32], m: usize, read_dst: bool) {
        assert_eq!(x.len(), m * self.k, "int8: input is not m×k");
        let out = Out { ptr: dst, rows: m, cols: self.n, read: read_dst };
        let kernel = self.kernel;
        match kernel.scheme() {
            Scheme::Bytes => {
                let rows = ByteRows::quantize(kernel, x, m, self);
                // SAFETY: the driver passes tiles and panels in bounds, each to one thread.
                self.run_tiles(m, 1, |tile, p0, segments| unsafe { kernel.tile_bytes(&rows, tile, self, p0, segments, out) });
                rows.recycle();
            }
            Scheme::Wide => {
                let rows = WideRows::quantize(kernel, x, m, self);
                // SAFETY: as above.
                self.run_tiles(m, 2, |tile, p0, segments| unsafe { kernel.tile_wide(&rows, tile, self, p0, segments, out) });
                rows.recycle();
            }
        }
    }

    /// Calls `tile(row tile, first panel, segments)` so that every register tile meets every
    /// segment exactly once, in order: split over threads by rows (tall products) or by panels
    /// (short ones); on each thread, over blocks of rows and of [`BLOCK_SEGMENTS`] segments,
    /// panel by panel, so that a panel's slice of weights stays in the L1 cache over the
    /// block's tiles and the block's activations (`bytes_per_input` each) in the L2 cache over
    /// the panels.
    fn run_tiles(&self, m: usize, bytes_per_input: usize, tile: impl Fn(usize, usize, std::ops::Range<usize>) + Sync) {
        let (tile_rows, tile_panels) = self.kernel.tile_shape();
        let tiles = m.div_ceil(tile_rows);
        let steps = self.panels / tile_panels;
        let block = (ROW_BLOCK_BYTES / (bytes_per_input * SEGMENT * BLOCK_SEGMENTS * tile_rows)).max(1);
        let segments = self.segments;
        let run = |tiles: std::ops::Range<usize>, steps: std::ops::Range<usize>| {
            for first in tiles.clone().step_by(block) {
                for s0 in (0..segments).step_by(BLOCK_SEGMENTS) {
                    for step in steps.clone() {
                        for t in first..(first + block).min(tiles.end) {
                            tile(t, step * tile_panels, s0..(s0 + BLOCK_SEGMENTS).min(segments));
                        }
                    }
                }
            }
        };
        let threads = rayon::current_num_threads();
        if m * self.n * self.k < PARALLEL_MIN_WORK || threads < 2 {
            run(0..tiles, 0..steps);
        } else if m >= SPLIT_ROWS_MIN {
            let per = tiles.div_ceil(threads);
            (0..threads).into_par_iter().for_each(|t| run((t * per).min(tiles)..((t + 1) * per).min(tiles), 0..steps));
        } else {
            let per = steps.div_ceil(threads);
            (0..threads).into_par_iter().for_each(|t| run(0..tiles, (t * per).min(steps)..((t + 1) * per).min(steps)));
        }
    }
}

/// The input segments one tile call covers.
type Segments = std::ops::Range<usize>;

/// Where a tile's results go: `rows × cols` row-major f32, accumulated onto when `read`.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    read: bool,
}
impl Out {
    /// Writes (at segment 0 unless the output is read) or adds one row's exact sums over
    /// `segment` for the 16 columns of panel `p`, dequantized: `(sum − zero·column_sum) ·
    /// row scale · weight scale`; only the valid columns.
    ///
    /// # Safety
    /// `row` < `rows`; no other thread writes this row of the panel at the same time.
    unsafe fn store_segment_row(
        self,
        a: &activations::ByteRows,
        w: &Int8Weight,
        row: usize,
        p: usize,
        segment: usize,
        sums: &[i32; PANEL],
    ) {
        let (row_scale, zero) = a.params(row, segment);
        for (lane, &v) in sums.iter().enumerate() {
            let c = p * PANEL + lane;
            if c >= self.cols {
                break;
            }
            let i = segment * w.width() + c;
            let y = (v - zero * w.column_sum[i]) as f32 * (row_scale * w.scale[i]);
            // SAFETY: row < rows and c < cols.
            unsafe {
                let d = self.ptr.add(row * self.cols + c);
                *d = if self.read || segment > 0 { *d + y } else { y };
            }
        }
    }
}

// SAFETY: threads sharing an `Out` write disjoint tiles (see `Int8Weight::run_tiles`).
unsafe impl Send for Out {}
// SAFETY: as for `Send`: threads sharing an `Out` write disjoint tiles.
unsafe impl Sync for Out {}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    /// AMX-INT8: `TDPBUSD` on tiles, 32 rows × 32 columns a tile call ([`Scheme::Bytes`]),
    /// where Linux grants AMX and the tiles passed their self-check ([`amx::ready`]).
    #[cfg(target_arch = "x86_64")]
    Amx,
    /// AVX-512 VNNI: `vpdpbusd` on zmm registers, 8 rows × 48 columns a tile ([`Scheme::Bytes`]).
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AVX-VNNI (VEX-encoded, 256-bit `vpdpbusd`), for CPUs with it but no AVX-512: the same
    /// tiles in 4-row halves ([`Scheme::Bytes`]).
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX2: `vpmaddwd` on 16-bit activations and sign-extended weights, 6 rows × 16 columns a
    /// tile ([`Scheme::Wide`]).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Plain integer loops in [`Scheme::Wide`]: correct, but slower than f32.
    Portable,
}

/// AVX-512 F, BW and VNNI: what the VNNI kernel and the activations' byte quantizer need.
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vnni")
}

impl Kernel {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use super::dispatch::{max_isa, IsaLevel};
            if max_isa() >= IsaLevel::Avx512 && has_vnni() {
                if max_isa() >= IsaLevel::Amx && amx::ready() {
                    return Kernel::Amx;
                }
                return Kernel::Vnni;
            }
            if max_isa() >= IsaLevel::Avx2 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
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
            if has_vnni() {
                all.push(Kernel::Vnni);
                if amx::ready() {
                    all.push(Kernel::Amx);
                }
            }
        }
        all
    }

    /// A register tile: rows × panels of 16 columns.
    fn tile_shape(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => amx::TILE_SHAPE,
            _ => match self.scheme() {
                Scheme::Bytes => (BYTES_TILE_ROWS, BYTES_TILE_PANELS),
                Scheme::Wide => (WIDE_TILE_ROWS, 1),
            },
        }
    }

    fn scheme(self) -> Scheme {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni | Kernel::AvxVnni | Kernel::Amx => Scheme::Bytes,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => Scheme::Wide,
            Kernel::Portable => Scheme::Wide,
        }
    }

    /// One [`Scheme::Bytes`] register tile: rows `tile·8..+8` × panels `p0..p0+3`, over
    /// `segments` (writing the output at segment 0 unless it is read, adding to it after).
    ///
    /// # Safety
    /// `self` runs on this CPU and uses `Scheme::Bytes`; `tile` and `p0` are in bounds of `a`
    /// and `w`, and no other thread writes the same tile of `out` at the same time.
    unsafe fn tile_bytes(self, a: &ByteRows, tile: usize, w: &Int8Weight, p0: usize, segments: Segments, out: Out) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Vnni` is detected only on CPUs with avx512f/bw/vnni; the tile bounds are this fn's contract.
            Kernel::Vnni => unsafe { x86::tile_vnni(a, tile, w, p0, segments, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `AvxVnni` is detected only on CPUs with avx2, fma and avxvnni; bounds as above.
            Kernel::AvxVnni => unsafe { x86::tile_avxvnni(a, tile, w, p0, segments, out) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => match crate::kernels::amx::NativeTiles::new() {
                // SAFETY: `Amx` is detected only where AMX-INT8 is granted and self-checked; bounds as above.
                Some(mut tiles) => unsafe { amx::tile(a, tile, w, p0, segments, out, &mut tiles) },
                None => unreachable!("the AMX kernel is detected only where AMX is granted"),
            },
            _ => unreachable!("{self:?} does not use Scheme::Bytes"),
        }
    }

    /// One [`Scheme::Wide`] register tile: rows `tile·6..+6` × the 16 columns of panel `p`,
    /// over `segments`, as [`Kernel::tile_bytes`].
    ///
    /// # Safety
    /// As [`Kernel::tile_bytes`], for `Scheme::Wide`.
    unsafe fn tile_wide(self, a: &WideRows, tile: usize, w: &Int8Weight, p: usize, segments: Segments, out: Out) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is detected only on CPUs with avx2 and fma; the tile bounds are this fn's contract.
            Kernel::Avx2 => unsafe { x86::tile_avx2(a, tile, w, p, segments, out) },
            // SAFETY: the portable tile needs no CPU feature; the tile bounds are this fn's contract.
            Kernel::Portable => unsafe { portable::tile_wide(a, tile, w, p, segments, out) },
            #[cfg(target_arch = "x86_64")]
            _ => unreachable!("{self:?} does not use Scheme::Wide"),
        }
    }
}

/// Whether this CPU's kernel quantizes activations to 16 bits, accurate enough for the
/// attention inputs (see `Backbone::attention_input_linears`).
pub fn quantizes_attention_inputs() -> bool {
    Kernel::detect().scheme() == Scheme::Wide
}

/// Whether `--quantization int8` runs a SIMD kernel here (AVX2 or better).
pub fn accelerated() -> bool {
    !matches!(Kernel::detect(), Kernel::Portable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::random_values;

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

    /// `prior + x·W` by `kernel`'s tiles, one after another; with `reference`, by the portable
    /// tiles of the same scheme over the same quantized activations.
    fn run(kernel: Kernel, w: &Int8Weight, x: &[f32], m: usize, prior: &[f32], reference: bool) -> Vec<f32> {
        let mut dst = prior.to_vec();
        let out = Out { ptr: dst.as_mut_ptr(), rows: m, cols: w.n, read: true };
        let (tile_rows, tile_panels) = kernel.tile_shape();
        let tiles = m.div_ceil(tile_rows);
        match kernel.scheme() {
            Scheme::Bytes => {
                let rows = ByteRows::quantize(kernel, x, m, w);
                for tile in 0..tiles {
                    for p0 in (0..w.panels).step_by(tile_panels) {
                        if reference {
                            // SAFETY: `tile` < tiles and the panels are in range of `rows`, `w` and `out` (m × n); one thread.
                            unsafe { portable_bytes::tile(&rows, tile, w, p0, 0..w.segments, out, kernel.tile_shape()) };
                        } else {
                            // SAFETY: `tile` < tiles and the panels are in range of `rows`, `w` and `out` (m × n); one thread.
                            unsafe { kernel.tile_bytes(&rows, tile, w, p0, 0..w.segments, out) };
                        }
                    }
                }
            }
            Scheme::Wide => {
                let rows = WideRows::quantize(kernel, x, m, w);
                for tile in 0..tiles {
                    for p in 0..w.panels {
                        if reference {
                            // SAFETY: `tile` < tiles and the panels are in range of `rows`, `w` and `out` (m × n); one thread.
                            unsafe { portable::tile_wide(&rows, tile, w, p, 0..w.segments, out) };
                        } else {
                            // SAFETY: `tile` < tiles and the panels are in range of `rows`, `w` and `out` (m × n); one thread.
                            unsafe { kernel.tile_wide(&rows, tile, w, p, 0..w.segments, out) };
                        }
                    }
                }
            }
        }
        dst
    }

    #[test]
    fn int8_product_is_close_to_f32_and_kernels_agree() {
        let kernels = Kernel::available();
        eprintln!("int8 kernels on this CPU: {kernels:?}");
        #[cfg(target_arch = "x86_64")]
        for (kernel, name) in
            [(Kernel::Vnni, "AVX-512 VNNI"), (Kernel::AvxVnni, "AVX-VNNI"), (Kernel::Amx, "AMX-INT8 (granted, self-checked)")]
        {
            if !kernels.contains(&kernel) {
                eprintln!("NOTE: this CPU has no {name}; that int8 kernel is not exercised here");
            }
        }
        // Ragged shapes: rows, columns and inputs that fill no tile, panel, group or segment.
        for &(m, k, n) in &[(13, 37, 50), (1, 384, 384), (70, 64, 1152), (300, 96, 17), (6, 300, 40), (7, 129, 16)] {
            let x = random_values(m * k, 1);
            let w = random_values(k * n, 2);
            let prior = random_values(m * n, 3);
            let exact = reference(&x, &w, m, k, n);
            for &kernel in &kernels {
                let q = Int8Weight::quantize_for(kernel, &w, k, n);
                let slow = run(kernel, &q, &x, m, &prior, true);
                let (mut err, mut norm) = (0.0f64, 0.0f64);
                for i in 0..m * n {
                    err += ((slow[i] - prior[i]) as f64 - exact[i] as f64).powi(2);
                    norm += (exact[i] as f64).powi(2);
                }
                let relative = (err / norm).sqrt();
                assert!(relative < 0.02, "{kernel:?} {m}×{k}×{n}: relative error {relative}");
                let fast = run(kernel, &q, &x, m, &prior, false);
                for i in 0..m * n {
                    assert!((fast[i] - slow[i]).abs() <= 1e-4 * (1.0 + slow[i].abs()), "{kernel:?} {m}×{k}×{n} at {i}");
                }
                // The threaded driver gives the same result as the tile loop.
                let mut threaded = prior.clone();
                // SAFETY: the output holds m × n initialized floats.
                unsafe { q.matmul(threaded.as_mut_ptr(), &x, m, true) };
                for i in 0..m * n {
                    assert!((threaded[i] - fast[i]).abs() <= 1e-5 * (1.0 + fast[i].abs()), "{kernel:?} {m}×{k}×{n} threaded at {i}");
                }
            }
        }
    }

    #[test]
    fn wide_activations_lose_almost_nothing() {
        // With exact activations the error is the weights' alone; 15-bit activations add a
        // tenth of that at most, even with outliers 20 times the typical value.
        let (m, k, n) = (8, 384, 64);
        let x: Vec<f32> = random_values(m * k, 7).iter().enumerate().map(|(i, v)| if i % 97 == 0 { v * 20.0 } else { *v }).collect();
        let w = random_values(k * n, 8);
        let q = Int8Weight::quantize_for(Kernel::Portable, &w, k, n);
        let exact = reference(&x, &w, m, k, n);
        let mut y = vec![0.0f32; m * n];
        // SAFETY: the output holds m × n initialized floats.
        unsafe { q.matmul(y.as_mut_ptr(), &x, m, false) };
        let dequantized = {
            let mut d = vec![0.0f32; k * n];
            for r in 0..k {
                for c in 0..n {
                    let (p, g, j) = (c / PANEL, r / 2, r % 2);
                    let s = q.scale[(r / SEGMENT) * q.width() + c];
                    d[r * n + c] = q.packed[((p * q.groups + g) * PANEL + c % PANEL) * 2 + j] as f32 * s;
                }
            }
            d
        };
        let weights_only = reference(&x, &dequantized, m, k, n);
        let norm = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
        let (activations_error, weights_error) = (norm(&y, &weights_only), norm(&weights_only, &exact));
        assert!(activations_error < 0.1 * weights_error, "activations add {activations_error}, weights {weights_error}");
    }

    #[test]
    fn zero_rows_and_columns_stay_zero() {
        let (m, k, n) = (3, 8, 5);
        let mut x = random_values(m * k, 4);
        x[k..2 * k].iter_mut().for_each(|v| *v = 0.0);
        let mut w = random_values(k * n, 5);
        (0..k).for_each(|r| w[r * n + 2] = 0.0);
        for kernel in Kernel::available() {
            let q = Int8Weight::quantize_for(kernel, &w, k, n);
            let mut y: Vec<f32> = Vec::with_capacity(m * n);
            // SAFETY: `y` has capacity m × n and `matmul` writes every element (read_dst false) before `set_len`.
            unsafe {
                q.matmul(y.as_mut_ptr(), &x, m, false);
                y.set_len(m * n);
            }
            assert!(y[n..2 * n].iter().all(|&v| v == 0.0), "{kernel:?}");
            assert!((0..m).all(|i| y[i * n + 2] == 0.0), "{kernel:?}");
        }
    }
}
