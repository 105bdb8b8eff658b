//! Run-time kernel dispatch and the plumbing every CPU kernel shares: the `multiversion!`
//! macro (AVX2+FMA or portable, chosen per CPU), fused multiply-add, the test for "this
//! tensor takes the fused kernels", raw access to candle's CPU storage, and the threads'
//! settings ([`settle_thread_pools`]).

use candle_core::{bail, CpuStorage, Layout, Result, Tensor};

/// Defines `fn $name` three times: as written, compiled with AVX2+FMA, and with AVX-512 (chosen
/// at run time, so one binary stays portable; AVX-512 doubles the vector width of the
/// element-wise kernels, which is what they are bound by once the products run in bf16). The kernels are plain loops; this is
/// what lets LLVM turn them into 8-wide code, with `floor` as one instruction. Inside the body,
/// the const `FMA` says whether fused multiply-add is native (use [`fma`]), and `WIDE` whether
/// there are 32 vector registers of 16 floats (AVX-512), for kernels that size register tiles.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])* $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            // The inner versions take the wrapped fn's arguments, however many it has.
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn portable<const FMA: bool, const WIDE: bool>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU has avx512f, avx512bw, avx512vl, avx2 and fma.
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    portable::<true, true>($($arg),*)
                }
                /// # Safety
                /// The CPU has avx2 and fma.
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    portable::<true, false>($($arg),*)
                }
                if $crate::kernels::dispatch::has_avx512() {
                    // SAFETY: the running CPU has the features `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::kernels::dispatch::max_isa() >= $crate::kernels::dispatch::IsaLevel::Avx2
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the running CPU has the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable::<{ cfg!(target_arch = "aarch64") }, false>($($arg),*)
        }
    };
}

/// Instruction-set levels of the CPU kernels, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum IsaLevel {
    Portable,
    Avx2,
    /// AVX-512 F/BW/VL (and VNNI for int8), without BF16.
    Avx512,
    Avx512Bf16,
    /// AMX tiles (bf16 products; Sapphire Rapids and later).
    Amx,
}

/// The highest level the kernels may use: whatever the CPU has, unless `POOLSERVE_MAX_CPU_ISA`
/// (`portable`, `avx2`, `avx512`, `avx512_bf16`, `amx`) caps it, as oneDNN's `ONEDNN_MAX_CPU_ISA`
/// does: it measures and tests the kernels of older CPUs on a newer one.
pub(crate) fn max_isa() -> IsaLevel {
    static CAP: std::sync::OnceLock<IsaLevel> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("POOLSERVE_MAX_CPU_ISA").ok().as_deref() {
        None | Some("amx") => IsaLevel::Amx,
        Some("avx512_bf16") => IsaLevel::Avx512Bf16,
        Some("avx512") => IsaLevel::Avx512,
        Some("avx2") => IsaLevel::Avx2,
        Some("portable") => IsaLevel::Portable,
        Some(other) => {
            tracing::warn!("POOLSERVE_MAX_CPU_ISA={other:?} is not portable, avx2, avx512, avx512_bf16 or amx: ignored");
            IsaLevel::Amx
        }
    })
}

/// Whether the CPU runs the AVX-512 versions `multiversion!` compiles (F, BW, VL, with AVX2+FMA).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    max_isa() >= IsaLevel::Avx512
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
}

/// `a·b + c`, fused when the kernel was compiled with native FMA (a software fused
/// multiply-add would be far slower than the two plain operations).
#[inline(always)]
pub(crate) fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Whether `x` takes the fused CPU kernels (f32 on the CPU); anything else takes candle's
/// composite ops (GPUs, and float16/bfloat16 on the CPU).
pub(crate) fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == candle_core::DType::F32
}

/// A small parameter vector as host f32, whatever the checkpoint's dtype.
pub(crate) fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()
}

pub(crate) fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("fused op expects a contiguous f32 tensor"),
    }
}

pub(crate) fn contiguous_mut<'a>(storage: &'a mut CpuStorage, layout: &Layout) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(data) = storage else { bail!("fused op expects an f32 tensor") };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&mut data[start..end]),
        None => bail!("fused op expects a contiguous f32 tensor"),
    }
}

pub(crate) fn dims2(layout: &Layout) -> Result<(usize, usize)> {
    layout.shape().dims2()
}

/// Raw output pointers that rayon tasks may share because each writes a disjoint region.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(pub(crate) *mut f32);
// SAFETY: a `SharedMut` goes only to tasks that each write their own disjoint region of a buffer that outlives them (sgemm's row or panel split); nothing else touches the pointer.
unsafe impl Send for SharedMut {}
// SAFETY: as for `Send`: concurrent users write disjoint regions and never read each other's.
unsafe impl Sync for SharedMut {}

#[derive(Clone, Copy)]
pub(crate) struct SharedConst(pub(crate) *const f32);
// SAFETY: the pointee is only read while the tasks that share it run, and outlives them.
unsafe impl Send for SharedConst {}
// SAFETY: as for `Send`: shared reads of memory nobody writes meanwhile.
unsafe impl Sync for SharedConst {}

/// How long candle's element-wise workers spin after each op before they sleep, unless
/// `CANDLE_BARRIER_POOL_SPIN_LIMIT` says otherwise: 100 rounds (microseconds), not candle's
/// 25,000. Our products run on rayon's threads, one per core, and candle's element-wise ops
/// (residual adds over 64 Ki values and more) on its own pool of `cores - 1` threads; a worker
/// spinning after a residual add held a core the next product's threads wanted (4.6% of a bf16
/// EmbeddingGemma 2 forward on 2 cores, 3-10% of its time), while waking a parked one costs a
/// few microseconds against the ~100 µs such an op takes.
pub const CANDLE_SPIN_LIMIT: &str = "100";

/// Applies [`CANDLE_SPIN_LIMIT`] where the environment does not set one. Call it first thing in
/// `main`, before any thread starts (candle reads the variable once, when its pool starts, and
/// setting an environment variable races with other threads reading the environment).
pub fn settle_thread_pools() {
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", CANDLE_SPIN_LIMIT);
    }
}
