//! Matrix products on weights packed once at load, the way ONNX Runtime's MLAS and BLIS do it:
//! a weight `Wᵀ` (`[in, out]`) is stored as panels of [`PANEL`] output columns, each panel one
//! cache line per step of inputs, zero-padded past the last column. A product then streams each
//! panel linearly, and a 16-token query no longer re-packs every weight on every call (what the
//! `gemm` crate does, and what made short requests bandwidth-bound).
//!
//! Two [`WeightFormat`]s:
//! - **f32**: a panel row is one input's 16 floats. The microkernel keeps a tile of `MR` rows ×
//!   16 columns in registers: per input it loads one panel row, broadcasts one activation per
//!   row and issues `MR` 16-wide fused multiply-adds.
//! - **bfloat16** (`--dtype bfloat16` on the CPU): a panel row is two consecutive inputs' 16
//!   columns, interleaved per column (`[c][j]`, 32 × 16 bits, one cache line), which is the
//!   operand layout of AVX-512 BF16's `vdpbf16ps` (per 32-bit lane, two bf16 products summed
//!   into an f32 accumulator). On CPUs with it ([`bf16`]), activations are rounded to bf16
//!   once per product and one instruction does 32 multiply-adds, twice an f32 FMA's. On other
//!   CPUs the kernels widen each pair to two f32 vectors in registers (a shift and a mask) and
//!   multiply the f32 activations exactly: the same arithmetic as f32, half the weight traffic.
//!
//! Each format has its kernels compiled per CPU and chosen at run time ([`Kernel`]): AVX-512
//! (`MR` = 12, a zmm accumulator per row, 12 of the 32 registers; `vdpbf16ps` spans two panels,
//! 24 accumulators, so that each activation broadcast feeds two instructions), AVX2+FMA
//! (`MR` = 6, two ymm per row: 12 of 16), and portable. Row blocks of 240 instead of [`MC`]
//! were measured neutral on the bf16 forward (±3%, Zen 5), so they were not kept. Activations are read in place, row-major (bf16 pairs are
//! converted once per product), so the only other per-call work is the output.
//!
//! Blocking: inputs in blocks of [`KC`] panel rows, rows in blocks of [`MC`] and panels in
//! blocks of [`NC`], so that a block of activations (at most 120 × 512 × 4 bytes) stays in L2
//! while every panel slice passes over it, a panel slice (KC × 64 bytes, 16 KiB) stays in L1
//! while every row tile reuses it, and the block of outputs stays in L2 across the input blocks.
//! Threads split tall products by rows and short ones by panels (each thread then streams only
//! its share of the weights, which dominate the traffic there).

mod amx;
mod bf16;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::dispatch::{IsaLevel, SharedConst, SharedMut};
use rayon::prelude::*;
use std::ops::Range;

/// Output columns per packed panel: 16 floats, one cache line, one zmm or two ymm registers.
pub const PANEL: usize = 16;
/// Panel rows (inputs, or pairs of inputs) per block.
const KC: usize = 256;
/// Rows per block (a multiple of both kernels' tile heights).
const MC: usize = 120;
/// Panels per block (a multiple of the widest tile's panels): the block of outputs a row block
/// accumulates over the input blocks, at most 120 × 512 × 4 bytes (240 KiB), stays in L2. Without
/// it a wide product streamed its whole row block of outputs (15.7 MiB for Gemma-2B's 32,768
/// gate and up columns) through memory once per input block: that product went from 492 to
/// 634 GFLOP/s in bf16 (the down projection from 670 to 782), Zen 5, `benches/ops.rs`; 16 and 64
/// panels measured the same as 32.
const NC: usize = 32;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 17;
/// From this many rows on, threads split a product by rows rather than by panels.
const SPLIT_ROWS_MIN: usize = 192;

/// How a packed weight stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    /// bfloat16, rounded to nearest even (as `torch.Tensor.to(torch.bfloat16)` rounds).
    Bf16,
}

/// The kernel that multiplies bf16 weights natively on this CPU (within
/// `POOLSERVE_MAX_CPU_ISA`), by name: AMX tiles or AVX-512 BF16's `vdpbf16ps`; `None` where bf16
/// weights are widened to f32 (no faster than f32 on large batches), which `--dtype auto` reads.
pub fn native_bf16() -> Option<&'static str> {
    match Kernel::detect(WeightFormat::Bf16) {
        #[cfg(target_arch = "x86_64")]
        Kernel::Bf16Amx => Some("AMX tiles"),
        #[cfg(target_arch = "x86_64")]
        Kernel::Bf16Dot => Some("AVX-512 BF16"),
        _ => None,
    }
}

/// Whether bf16 products run on AMX tiles here (within `POOLSERVE_MAX_CPU_ISA`): attention's
/// products follow the linears onto them.
pub(crate) fn amx_in_use() -> bool {
    #[cfg(target_arch = "x86_64")]
    return Kernel::detect(WeightFormat::Bf16) == Kernel::Bf16Amx;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether bf16 products run on AVX-512 BF16's `vdpbf16ps` here (within
/// `POOLSERVE_MAX_CPU_ISA`; not where AMX tiles take them): attention's products follow the
/// linears onto it ([`dot_pairs`]).
pub(crate) fn dot_in_use() -> bool {
    #[cfg(target_arch = "x86_64")]
    return Kernel::detect(WeightFormat::Bf16) == Kernel::Bf16Dot;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A product on bf16 operands packed by its caller (attention's Q·Kᵀ and P·V,
/// `attention/tiles.rs`): `c` (`rows` × `cols`, rows `ldc` floats apart) `= a · b`, where `a`
/// holds `rows` rows of `steps` bf16 pairs (`lda` pairs apart) and `b` ⌈cols/16⌉ panels of
/// `steps` [`PairRow`]s, `panel_stride` rows from one panel to the next.
pub(crate) struct PairProduct {
    pub a: *const u32,
    pub lda: usize,
    pub rows: usize,
    pub b: *const PairRow,
    pub panel_stride: usize,
    pub steps: usize,
    pub cols: usize,
    pub c: *mut f32,
    pub ldc: usize,
}

/// Runs `p` on this thread with the `vdpbf16ps` kernel and blocking of the bf16 linears.
///
/// # Safety
/// The CPU has AVX-512 BF16 ([`dot_in_use`]); `p`'s pointers cover what [`PairProduct`] says.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn dot_pairs(p: &PairProduct) {
    let job = Job {
        weights: p.b as *const u8,
        panel_stride: p.panel_stride,
        steps: p.steps,
        n: p.cols,
        ldc: p.ldc,
        a: p.a as *const f32,
        lda: p.lda,
        dst: p.c,
        rows: 0..p.rows,
        panels: 0..p.cols.div_ceil(PANEL),
        read_dst: false,
    };
    // SAFETY: the CPU has AVX-512 BF16 and the operands cover the job (this fn's contract).
    unsafe { x86::bf16_dot(&job) }
}

/// `x` rounded to the nearest bfloat16, ties to even (NaN stays NaN), for the tile tests.
#[cfg(test)]
pub(crate) fn round_bf16(x: f32) -> u16 {
    round(x)
}

/// `x` rounded to the nearest bfloat16, ties to even (NaN stays NaN).
#[inline(always)]
pub(crate) fn round(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// A bfloat16 as the f32 it stands for (exact).
pub(crate) fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// One f32 panel row: one input's 16 columns, one cache line.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct PanelRow([f32; PANEL]);

/// One bf16 panel row: two consecutive inputs' 16 columns, column `c` input `j` at `2c + j`.
/// Attention packs its bf16 operands in these too (`attention/tiles.rs`): the kernels load
/// them as aligned cache lines.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub(crate) struct PairRow([u16; 2 * PANEL]);

impl PairRow {
    /// The bf16 halves of `rows`, 32 a row, in order.
    pub(crate) fn halves_mut(rows: &mut [PairRow]) -> &mut [u16] {
        // SAFETY: a PairRow is exactly 32 u16s (repr(C), 64 bytes, no padding), so the rows are
        // 32·len initialized u16s, aligned beyond u16's need; the borrow of `rows` covers them.
        unsafe { std::slice::from_raw_parts_mut(rows.as_mut_ptr() as *mut u16, rows.len() * 2 * PANEL) }
    }
}

#[derive(Debug, Clone)]
enum Panels {
    /// Panel `p`, input `i` at `[p·k + i]`.
    F32(Vec<PanelRow>),
    /// Panel `p`, inputs `2s, 2s+1` at `[p·⌈k/2⌉ + s]`.
    Bf16(Vec<PairRow>),
}

/// `Wᵀ` (`k × n`) packed in panels of 16 columns, in one [`WeightFormat`].
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Panels,
}

impl PackedMatrix {
    /// Packs row-major `w_t` (`k` rows of `n` output columns) in f32.
    pub fn pack(w_t: &[f32], k: usize, n: usize) -> Self {
        Self::pack_as(WeightFormat::F32, w_t, k, n)
    }

    /// Packs row-major `w_t` (`k` rows of `n` output columns) in `format`.
    pub fn pack_as(format: WeightFormat, w_t: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w_t.len(), k * n, "sgemm: weight is not k×n");
        let each = |f: &mut dyn FnMut(usize, usize, f32)| {
            for (i, row) in w_t.chunks_exact(n.max(1)).enumerate().take(k) {
                row.iter().enumerate().for_each(|(o, &v)| f(i, o, v));
            }
        };
        Self::pack_from(format, k, n, each)
    }

    /// Packs a checkpoint's `W` (`n` rows of `k` inputs, `[out, in]`) in `format` directly,
    /// without a transposed copy.
    pub fn pack_out_in(format: WeightFormat, w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), k * n, "sgemm: weight is not n×k");
        let each = |f: &mut dyn FnMut(usize, usize, f32)| {
            for (o, row) in w.chunks_exact(k.max(1)).enumerate().take(n) {
                row.iter().enumerate().for_each(|(i, &v)| f(i, o, v));
            }
        };
        Self::pack_from(format, k, n, each)
    }

    /// Packs the weights `each` visits as (input, output, value), in the order they lie in memory.
    fn pack_from(format: WeightFormat, k: usize, n: usize, each: impl FnOnce(&mut dyn FnMut(usize, usize, f32))) -> Self {
        let panel_count = n.div_ceil(PANEL);
        let panels = match format {
            WeightFormat::F32 => {
                let mut rows = vec![PanelRow([0.0; PANEL]); panel_count * k];
                each(&mut |i, o, v| rows[(o / PANEL) * k + i].0[o % PANEL] = v);
                Panels::F32(rows)
            }
            WeightFormat::Bf16 => {
                let steps = k.div_ceil(2);
                let mut rows = vec![PairRow([0; 2 * PANEL]); panel_count * steps];
                each(&mut |i, o, v| rows[(o / PANEL) * steps + i / 2].0[(o % PANEL) * 2 + i % 2] = round(v));
                Panels::Bf16(rows)
            }
        };
        Self { k, n, panels }
    }

    pub fn in_features(&self) -> usize {
        self.k
    }

    pub fn out_features(&self) -> usize {
        self.n
    }

    pub fn format(&self) -> WeightFormat {
        match self.panels {
            Panels::F32(_) => WeightFormat::F32,
            Panels::Bf16(_) => WeightFormat::Bf16,
        }
    }

    fn panel_count(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Panel rows per panel: inputs, or pairs of inputs.
    fn steps(&self) -> usize {
        match self.panels {
            Panels::F32(_) => self.k,
            Panels::Bf16(_) => self.k.div_ceil(2),
        }
    }

    /// Weight (input `i`, output `o`) as f32.
    fn get(&self, i: usize, o: usize) -> f32 {
        let (p, c) = (o / PANEL, o % PANEL);
        match &self.panels {
            Panels::F32(rows) => rows[p * self.k + i].0[c],
            Panels::Bf16(rows) => widen(rows[p * self.steps() + i / 2].0[2 * c + i % 2]),
        }
    }

    /// Back to row-major `Wᵀ` (`k × n`) in f32, for quantizing a layer after load.
    pub fn unpack(&self) -> Vec<f32> {
        (0..self.k).flat_map(|i| (0..self.n).map(move |o| (i, o))).map(|(i, o)| self.get(i, o)).collect()
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
        let kernel = Kernel::detect(self.format());
        let activations = bf16::Activations::prepare(kernel, x, m, self.k);
        let panels = self.panel_count();
        let threads = rayon::current_num_threads();
        let (out, input, lda) = (SharedMut(dst), SharedConst(activations.as_ptr()), activations.lda());
        let run = |rows: Range<usize>, panels: Range<usize>| {
            let (out, input) = (out, input);
            let job = Job::of(self, input.0, lda, out.0, rows, panels, read_dst);
            // SAFETY: the row and panel ranges lie inside the product, no two concurrent calls
            // share an output row × panel, and `kernel` was detected on this CPU for this format.
            unsafe { kernel.run(&job) }
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
        activations.recycle();
    }
}

/// The kernel this CPU runs for a format.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    F32Avx512,
    #[cfg(target_arch = "x86_64")]
    F32Avx2,
    F32Portable,
    /// AMX tiles (`TDPBF16PS`) on bf16 activations, where Linux grants AMX and the tiles
    /// passed their self-check ([`amx::ready`]).
    #[cfg(target_arch = "x86_64")]
    Bf16Amx,
    /// `vdpbf16ps` on bf16 activations (AVX-512 BF16).
    #[cfg(target_arch = "x86_64")]
    Bf16Dot,
    /// bf16 weights widened to f32 in registers, f32 activations.
    #[cfg(target_arch = "x86_64")]
    Bf16Avx512,
    #[cfg(target_arch = "x86_64")]
    Bf16Avx2,
    Bf16Portable,
}

impl Kernel {
    /// The fastest kernel of `format` this CPU has, within `POOLSERVE_MAX_CPU_ISA`.
    fn detect(format: WeightFormat) -> Self {
        let cap = super::dispatch::max_isa();
        let mut kernels = Self::available(format);
        kernels.retain(|k| k.level() <= cap);
        kernels.pop().unwrap_or(match format {
            WeightFormat::F32 => Kernel::F32Portable,
            WeightFormat::Bf16 => Kernel::Bf16Portable,
        })
    }

    /// The instruction-set level the kernel needs.
    fn level(self) -> IsaLevel {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::F32Avx512 | Kernel::Bf16Avx512 => IsaLevel::Avx512,
            #[cfg(target_arch = "x86_64")]
            Kernel::Bf16Dot => IsaLevel::Avx512Bf16,
            #[cfg(target_arch = "x86_64")]
            Kernel::Bf16Amx => IsaLevel::Amx,
            #[cfg(target_arch = "x86_64")]
            Kernel::F32Avx2 | Kernel::Bf16Avx2 => IsaLevel::Avx2,
            Kernel::F32Portable | Kernel::Bf16Portable => IsaLevel::Portable,
        }
    }

    /// Every kernel of `format` the running CPU can execute, fastest last (whatever the cap: the
    /// tests compare them all).
    fn available(format: WeightFormat) -> Vec<Self> {
        let mut all = vec![match format {
            WeightFormat::F32 => Kernel::F32Portable,
            WeightFormat::Bf16 => Kernel::Bf16Portable,
        }];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            let avx512 = avx2 && std::is_x86_feature_detected!("avx512f");
            let dot = avx512 && std::is_x86_feature_detected!("avx512bf16");
            let x86 = match format {
                WeightFormat::F32 => [(avx2, Kernel::F32Avx2), (avx512, Kernel::F32Avx512), (false, Kernel::F32Avx512)],
                WeightFormat::Bf16 => [(avx2, Kernel::Bf16Avx2), (avx512, Kernel::Bf16Avx512), (dot, Kernel::Bf16Dot)],
            };
            all.extend(x86.into_iter().filter_map(|(has, kernel)| has.then_some(kernel)));
            if format == WeightFormat::Bf16 && dot && amx::ready() {
                all.push(Kernel::Bf16Amx);
            }
        }
        all
    }

    /// # Safety
    /// `self` was detected on this CPU for the format of `job`'s weights; see [`Job::block`].
    unsafe fn run(self, job: &Job) {
        // SAFETY: (every arm) `self` runs on this CPU and matches the weight's format; the
        // bounds are the caller's.
        unsafe {
            match self {
                #[cfg(target_arch = "x86_64")]
                Kernel::F32Avx512 => x86::f32_avx512(job),
                #[cfg(target_arch = "x86_64")]
                Kernel::F32Avx2 => x86::f32_avx2(job),
                Kernel::F32Portable => job.block::<Portable, 6>(),
                #[cfg(target_arch = "x86_64")]
                Kernel::Bf16Dot => x86::bf16_dot(job),
                #[cfg(target_arch = "x86_64")]
                Kernel::Bf16Amx => match super::amx::NativeTiles::new() {
                    Some(mut tiles) => amx::bf16_block(job, &mut tiles),
                    None => unreachable!("Bf16Amx is detected only where AMX is granted"),
                },
                #[cfg(target_arch = "x86_64")]
                Kernel::Bf16Avx512 => x86::bf16_avx512(job),
                #[cfg(target_arch = "x86_64")]
                Kernel::Bf16Avx2 => x86::bf16_avx2(job),
                Kernel::Bf16Portable => job.block::<bf16::Portable, 6>(),
            }
        }
    }
}

/// One thread's share of a product: rows `rows` × panels `panels`, activations `a` (rows `lda`
/// of the kernel's activation type apart), weight panels from `weights` (`steps` panel rows
/// used of each, `panel_stride` apart), `n` output columns in rows `ldc` apart.
struct Job {
    weights: *const u8,
    panel_stride: usize,
    steps: usize,
    n: usize,
    ldc: usize,
    a: *const f32,
    lda: usize,
    dst: *mut f32,
    rows: Range<usize>,
    panels: Range<usize>,
    read_dst: bool,
}

impl Job {
    /// A share of `dst (m × n) (+)= a·Wᵀ` for the packed `w`.
    fn of(w: &PackedMatrix, a: *const f32, lda: usize, dst: *mut f32, rows: Range<usize>, panels: Range<usize>, read_dst: bool) -> Self {
        let steps = w.steps();
        Job { weights: w.panel_base(), panel_stride: steps, steps, n: w.n, ldc: w.n, a, lda, dst, rows, panels, read_dst }
    }

    /// The share blocked as the module describes, in tiles of `MR` rows (the last tile of a
    /// block takes a kernel of its own height).
    ///
    /// # Safety
    /// `K` runs on this CPU and reads the weights' format; `a` holds `m` rows of `lda` `K::A`s,
    /// at least `K::A_PER_STEP` per panel row; `dst` holds `m` rows of `ldc ≥ n` floats with
    /// `rows.end <= m`, `panels.end <= ⌈n/16⌉` panels there, initialized when `read_dst`.
    #[inline(always)]
    unsafe fn block<K: Micro, const MR: usize>(&self) {
        let (steps, n, lda, ldc) = (self.steps, self.n, self.lda, self.ldc);
        let (weights, a, dst) = (self.weights as *const K::B, self.a as *const K::A, self.dst);
        for m0 in self.rows.clone().step_by(MC) {
            let m1 = (m0 + MC).min(self.rows.end);
            for p0 in self.panels.clone().step_by(NC) {
                let p1 = (p0 + NC).min(self.panels.end);
                for s0 in (0..steps).step_by(KC) {
                    let kc = KC.min(steps - s0);
                    let accumulate = self.read_dst || s0 > 0;
                    for p in (p0..p1).step_by(K::PANELS) {
                        // SAFETY: panel `p` < panels and `s0` < steps: inside the packed weights.
                        let b = unsafe { weights.add(p * self.panel_stride + s0) };
                        // The tile's panels: `K::PANELS`, or the share's last one alone.
                        let cols = (K::PANELS.min(self.panels.end - p) * PANEL).min(n - p * PANEL);
                        let mut r0 = m0;
                        while r0 < m1 {
                            // SAFETY: `r0` < rows.end <= m and `p·PANEL` < n: inside `a` and `dst`.
                            let (a, c) = unsafe { (a.add(r0 * lda + s0 * K::A_PER_STEP), dst.add(r0 * ldc + p * PANEL)) };
                            let tile =
                                Tile { a, lda, b, panel_stride: self.panel_stride, steps: kc, out: Out { c, ldc, cols, accumulate } };
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
    }
}

impl PackedMatrix {
    /// The first panel row, whatever the format.
    fn panel_base(&self) -> *const u8 {
        match &self.panels {
            Panels::F32(rows) => rows.as_ptr() as *const u8,
            Panels::Bf16(rows) => rows.as_ptr() as *const u8,
        }
    }
}

/// A register-tile kernel: `c (+)= a·b` for `R` rows of a tile (`R` up to its height).
trait Micro {
    /// The activation element it reads (`f32`, or a pair of bf16 as `u32`).
    type A;
    /// The panel row it reads.
    type B;
    /// Activation elements per panel row.
    const A_PER_STEP: usize;
    /// Panels one tile spans (the tile's `out.cols` says how many of them are there).
    const PANELS: usize = 1;
    /// # Safety
    /// The CPU has the kernel's features; the tile's pointers cover `R` rows, `steps` panel rows.
    unsafe fn tile<const R: usize>(t: &Tile<Self::A, Self::B>);
}

/// One register tile's operands: `a` (rows `lda` apart), a panel slice `b` of `steps` rows, and
/// the output.
struct Tile<A, B> {
    a: *const A,
    lda: usize,
    b: *const B,
    /// Panel rows from one panel to the next (`b`'s second panel, for two-panel tiles).
    panel_stride: usize,
    steps: usize,
    out: Out,
}

/// A tile's output: `c` (rows `ldc` apart, `cols` valid columns, added to when `accumulate`).
struct Out {
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
}

impl Out {
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

/// Plain loops on f32 panels, for CPUs without the x86 kernels.
struct Portable;

impl Micro for Portable {
    type A = f32;
    type B = PanelRow;
    const A_PER_STEP: usize = 1;

    /// # Safety
    /// As [`Micro::tile`]: the tile's pointers cover it (no CPU feature needed).
    #[inline(always)]
    unsafe fn tile<const R: usize>(t: &Tile<f32, PanelRow>) {
        let mut acc = [[0.0f32; PANEL]; R];
        for i in 0..t.steps {
            // SAFETY: i < steps rows of the panel slice and of each of the R activation rows.
            let b = unsafe { &(*t.b.add(i)).0 };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r` < R rows and `i` < steps inputs of the tile's activation rows.
                let a = unsafe { *t.a.add(r * t.lda + i) };
                for (acc, &b) in acc.iter_mut().zip(b) {
                    *acc = super::dispatch::fma::<{ cfg!(target_arch = "aarch64") }>(a, b, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: `r` < R, the rows the tile covers.
            unsafe { t.out.store(r, acc) };
        }
    }
}

#[cfg(test)]
mod tests;
