//! The CUDA side of the fused ops (`--features cuda`): our own kernels over the flat,
//! padding-free batch, in `kernels.cu`, compiled by `build.rs` and loaded once per
//! device. candle's composite ops would make several passes (and, for attention, a loop over
//! the sequences from the host); these are one launch each:
//!
//! - [`attention`]: variable-length attention over `cu_seqlens` straight from the fused QKV
//!   rows, QKV bias folded in, online softmax (memory linear in the sequence length), causal /
//!   windowed masks, relative position bias, grouped-query heads. Head dims up to 512.
//! - [`bias_activation`], [`bias_residual`], [`gated`]: the epilogues of a matrix product.
//! - [`layer_norm`] (with the product's bias and the residual folded in), [`rms_norm`],
//!   [`Rotary`] (RoPE in place, optionally after Qwen3's per-head RMSNorm).
//!
//! The kernels are one fat binary (machine code for the build's GPU generation, PTX for later
//! ones; see build.rs), loaded once per device by [`function`].
//!
//! Matrix products stay on candle's cuBLAS path (float32 accumulation in every dtype). Each
//! kernel reads and writes the model's dtype (f32, f16, bf16) and computes in f32.
//!
//! [`self_check`] runs every kernel against candle's composite ops on the device at load: a
//! kernel that disagrees switches the process to the composite path (slower, never wrong), with
//! an error in the log.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::DeviceId;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Device, InplaceOp1, Layout, Result, Shape, Storage, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

mod check;
pub use check::{self_check, KernelMismatch};

const FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/poolserve_kernels.fatbin"));

/// Per device: the kernels' module and the functions looked up in it. candle's own module
/// cache takes PTX text only; a fat binary is bytes.
type Loaded = HashMap<DeviceId, (Arc<CudaModule>, HashMap<&'static str, CudaFunction>)>;
static LOADED: LazyLock<Mutex<Loaded>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The kernel `name` on `dev`, its module loaded on first use.
fn function(dev: &CudaDevice, name: &'static str) -> Result<CudaFunction> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let (module, functions) = match loaded.entry(dev.id()) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let module = dev.cuda_stream().context().load_module(Ptx::from_binary(FATBIN.to_vec())).w()?;
            e.insert((module, HashMap::new()))
        }
    };
    if let Some(f) = functions.get(name) {
        return Ok(f.clone());
    }
    let f = module.load_function(name).w()?;
    functions.insert(name, f.clone());
    Ok(f)
}

/// Cleared by [`self_check`] when a kernel disagrees with the composite ops on this device.
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Switches the process to the composite ops (a kernel failed [`self_check`]).
fn disable() {
    ENABLED.store(false, Ordering::Relaxed);
}

/// Whether `x` takes these kernels: on a CUDA device, in a float dtype, kernels not disabled.
pub(crate) fn takes(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) && ENABLED.load(Ordering::Relaxed)
}

/// Threads per block of the element-wise and row kernels.
const THREADS: u32 = 256;
/// Enough blocks of [`THREADS`] to fill an H100 (132 SMs) several times over; the element-wise
/// kernels stride over anything larger.
const MAX_BLOCKS: u64 = 132 * 16;

fn elementwise(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The kernel `base` instantiated for `dtype` (`name_f32`, `name_f16`, `name_bf16` in kernels.cu).
fn kernel_name(base: &str, dtype: DType) -> Result<&'static str> {
    macro_rules! names {
        ($($base:literal),*) => {
            match (base, dtype) {
                $(($base, DType::F32) => concat!($base, "_f32"),
                  ($base, DType::F16) => concat!($base, "_f16"),
                  ($base, DType::BF16) => concat!($base, "_bf16"),)*
                (_, DType::F32 | DType::F16 | DType::BF16) => bail!("no CUDA kernel named {base}"),
                (_, other) => bail!("CUDA kernels take f32, f16 or bf16, not {other:?}"),
            }
        };
    }
    Ok(names!(
        "bias_activation",
        "bias_residual",
        "gated",
        "layer_norm",
        "rms_norm",
        "rotary",
        "attention_d128",
        "attention_d256",
        "attention_d512"
    ))
}

fn device(t: &Tensor) -> Result<&CudaDevice> {
    t.device().as_cuda_device()
}

/// The device address of a contiguous tensor's first element. The address outlives the
/// storage guard: every launch goes on the device's one stream, so a buffer freed after the
/// launch is freed after the kernel ran.
fn address(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else { bail!("CUDA kernel input is not on a CUDA device") };
    let Some((start, _)) = layout.contiguous_offsets() else { bail!("CUDA kernel input is not contiguous") };
    slice_address(cuda, start)
}

fn slice_address(cuda: &CudaStorage, start: usize) -> Result<u64> {
    let stream = cuda.device.cuda_stream();
    fn at<T>(s: &CudaSlice<T>, stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>, start: usize) -> u64 {
        let (base, _sync) = s.device_ptr(stream);
        base + (start * std::mem::size_of::<T>()) as u64
    }
    Ok(match &cuda.slice {
        CudaStorageSlice::F32(s) => at(s, &stream, start),
        CudaStorageSlice::F16(s) => at(s, &stream, start),
        CudaStorageSlice::BF16(s) => at(s, &stream, start),
        CudaStorageSlice::U32(s) => at(s, &stream, start),
        _ => bail!("CUDA kernel input has an unsupported dtype"),
    })
}

/// `address` of an optional input, 0 (a null pointer for the kernel) when absent.
fn optional(t: Option<&Tensor>) -> Result<u64> {
    t.map(address).transpose().map(|a| a.unwrap_or(0))
}

/// An uninitialized `shape` tensor of `dtype` on `dev`, and its address.
fn empty(dev: &CudaDevice, dtype: DType, shape: Shape) -> Result<(Tensor, u64)> {
    let n = shape.elem_count().max(1);
    // Uninitialized: every kernel below writes each element of its output before anyone reads it.
    let storage = match dtype {
        // SAFETY: as said above, the memory is written before it is read.
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n)? }, dev.clone()),
        // SAFETY: as for F32.
        DType::F16 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(n)? }, dev.clone()),
        // SAFETY: as for F32.
        DType::BF16 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n)? }, dev.clone()),
        other => bail!("CUDA kernels take f32, f16 or bf16, not {other:?}"),
    };
    let address = slice_address(&storage, 0)?;
    Ok((Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false), address))
}

/// Checks that `t` is a contiguous `dtype` tensor of `len` elements on the CUDA device.
fn check(name: &str, t: &Tensor, dtype: DType, len: usize) -> Result<()> {
    if !t.device().is_cuda() || t.dtype() != dtype || t.elem_count() != len || !t.is_contiguous() {
        bail!(
            "{name}: expected a contiguous {dtype:?} CUDA tensor of {len} elements, got {:?} {:?} on {:?}",
            t.dtype(),
            t.shape(),
            t.device().location()
        );
    }
    Ok(())
}

/// An activation as the kernels number it (`act` in kernels.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelActivation {
    Gelu = 0,
    GeluTanh = 1,
    Relu = 2,
    Silu = 3,
    QuickGelu = 4,
}

/// A mask as the attention kernel applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelMask {
    Bidirectional,
    Causal,
    /// `|i − j| ≤ w`.
    Window(usize),
    /// `i − w < j ≤ i`.
    CausalWindow(usize),
}

/// The attention kernel's parameters.
pub(crate) struct KernelAttention<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub cu_seqlens: &'a [usize],
    pub mask: KernelMask,
    /// Per-head bias by relative position: `[heads, 2·max_len − 1]` values and `max_len`.
    pub position_bias: Option<(&'a [f32], usize)>,
}

/// A kernel argument: device addresses as u64, C `int` as i32, `int64_t` as i64, `float` as f32.
enum Arg {
    U64(u64),
    I64(i64),
    I32(i32),
    F32(f32),
}

macro_rules! arg_from {
    ($($ty:ty => $variant:ident),*) => {
        $(impl From<$ty> for Arg {
            fn from(v: $ty) -> Self {
                Arg::$variant(v)
            }
        })*
    };
}
arg_from!(u64 => U64, i64 => I64, i32 => I32, f32 => F32);

/// Launches `name` with the arguments in order.
macro_rules! launch {
    ($dev:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {
        launch_args(&$dev, $name, $cfg, &[$(Arg::from($arg)),*])?
    };
}

fn launch_args(dev: &CudaDevice, name: &'static str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    let func = function(dev, name)?;
    let stream = dev.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    for arg in args {
        match arg {
            Arg::U64(v) => builder.arg(v),
            Arg::I64(v) => builder.arg(v),
            Arg::I32(v) => builder.arg(v),
            Arg::F32(v) => builder.arg(v),
        };
    }
    // SAFETY: callers pass the kernel's parameters of kernels.cu in order and size, and every
    // address points at a live buffer of the size the kernel reads or writes (they check
    // shapes and dtypes first).
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}

/// `act(x + bias)`, `x` `[rows, cols]`, `bias` `[cols]` in `x`'s dtype.
pub(crate) fn bias_activation(x: &Tensor, bias: Option<&Tensor>, act: KernelActivation) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (_, cols) = x.dims2()?;
    if let Some(b) = bias {
        check("bias_activation bias", b, x.dtype(), cols)?;
    }
    let dev = device(&x)?;
    let (out, out_ptr) = empty(dev, x.dtype(), x.shape().clone())?;
    let n = x.elem_count();
    let name = kernel_name("bias_activation", x.dtype())?;
    launch!(dev, name, elementwise(n), address(&x)?, optional(bias)?, out_ptr, n as i64, cols as i32, act as i32);
    Ok(out)
}

/// `x + bias + residual`, `x` and `residual` `[rows, cols]`, `bias` `[cols]`.
pub(crate) fn bias_residual(x: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (_, cols) = x.dims2()?;
    if let Some(b) = bias {
        check("bias_residual bias", b, x.dtype(), cols)?;
    }
    let residual = residual.map(|r| r.contiguous()).transpose()?;
    if let Some(r) = &residual {
        check("bias_residual residual", r, x.dtype(), x.elem_count())?;
    }
    let dev = device(&x)?;
    let (out, out_ptr) = empty(dev, x.dtype(), x.shape().clone())?;
    let n = x.elem_count();
    let name = kernel_name("bias_residual", x.dtype())?;
    launch!(dev, name, elementwise(n), address(&x)?, optional(bias)?, optional(residual.as_ref())?, out_ptr, n as i64, cols as i32);
    Ok(out)
}

/// A gated linear unit over `x` `[rows, 2·cols]`: `act(gate) · up`, `[rows, cols]`.
pub(crate) fn gated(x: &Tensor, act: KernelActivation, act_on_first: bool) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (rows, width) = x.dims2()?;
    if width % 2 != 0 {
        bail!("gated activation: {width} columns do not split in two");
    }
    let cols = width / 2;
    let dev = device(&x)?;
    let (out, out_ptr) = empty(dev, x.dtype(), Shape::from((rows, cols)))?;
    let n = rows * cols;
    let name = kernel_name("gated", x.dtype())?;
    launch!(dev, name, elementwise(n), address(&x)?, out_ptr, n as i64, cols as i32, act as i32, act_on_first as i32);
    Ok(out)
}

/// Largest row a [`layer_norm`] block keeps in shared memory: 48 KiB of f32 less the kernel's
/// 128 static bytes (wider rows take the composite path).
pub(crate) const MAX_NORM_COLS: usize = 12 * 1024 - 64;

/// `LayerNorm(x + bias + residual)` over the last dimension; weights in `x`'s dtype.
pub(crate) fn layer_norm(
    x: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (rows, cols) = x.dims2()?;
    if cols > MAX_NORM_COLS {
        bail!("layer_norm: rows of {cols} exceed the kernel's {MAX_NORM_COLS}");
    }
    for (name, t) in [("bias", bias), ("gamma", Some(gamma)), ("beta", Some(beta))] {
        if let Some(t) = t {
            check(&format!("layer_norm {name}"), t, x.dtype(), cols)?;
        }
    }
    let residual = residual.map(|r| r.contiguous()).transpose()?;
    if let Some(r) = &residual {
        check("layer_norm residual", r, x.dtype(), x.elem_count())?;
    }
    let dev = device(&x)?;
    let (out, out_ptr) = empty(dev, x.dtype(), x.shape().clone())?;
    if rows == 0 {
        return Ok(out);
    }
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: (cols * 4) as u32 };
    let name = kernel_name("layer_norm", x.dtype())?;
    launch!(
        dev,
        name,
        cfg,
        address(&x)?,
        optional(bias)?,
        optional(residual.as_ref())?,
        address(gamma)?,
        address(beta)?,
        out_ptr,
        cols as i32,
        eps
    );
    Ok(out)
}

/// RMSNorm over the last dimension; `weight` in `x`'s dtype.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (rows, cols) = x.dims2()?;
    check("rms_norm weight", weight, x.dtype(), cols)?;
    let dev = device(&x)?;
    let (out, out_ptr) = empty(dev, x.dtype(), x.shape().clone())?;
    if rows == 0 {
        return Ok(out);
    }
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let name = kernel_name("rms_norm", x.dtype())?;
    launch!(dev, name, cfg, address(&x)?, address(weight)?, out_ptr, cols as i32, eps);
    Ok(out)
}

/// RoPE applied in place to a fused QKV tensor on the device: the batch's cos and sin tables
/// (`[tokens, head_dim / 2]` f32, uploaded once per batch by the caller) and, for Qwen3, the
/// per-head RMSNorm weights (query's, then key's, f32; a few hundred floats per call).
pub(crate) struct Rotary {
    pub cos: Tensor,
    pub sin: Tensor,
    pub norm: Option<(Tensor, f32)>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl Rotary {
    pub(crate) fn new(
        device: &Device,
        cos: Tensor,
        sin: Tensor,
        norm: Option<(&[f32], &[f32], f32)>,
        heads: (usize, usize),
        head_dim: usize,
    ) -> Result<Self> {
        let norm = norm
            .map(|(q, k, eps)| Ok::<_, candle_core::Error>((Tensor::from_slice(&[q, k].concat(), 2 * head_dim, device)?, eps)))
            .transpose()?;
        Ok(Self { cos, sin, norm, num_heads: heads.0, num_kv_heads: heads.1, head_dim })
    }
}

impl InplaceOp1 for Rotary {
    fn name(&self) -> &'static str {
        "rotary_cuda"
    }
    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> Result<()> {
        bail!("rotary_cuda runs on CUDA tensors only")
    }
    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> Result<()> {
        let (tokens, width) = layout.shape().dims2()?;
        let Some((start, _)) = layout.contiguous_offsets() else { bail!("rotary: QKV is not contiguous") };
        let (heads, half) = (self.num_heads + self.num_kv_heads, self.head_dim / 2);
        if width < heads * self.head_dim || self.cos.elem_count() != tokens * half || self.sin.elem_count() != tokens * half {
            bail!("rotary: {tokens}×{width} QKV does not fit the {tokens}-token table of {heads} heads of {}", self.head_dim);
        }
        if tokens == 0 {
            return Ok(());
        }
        let dtype = storage.dtype();
        let dev = storage.device.clone();
        let qkv = slice_address(storage, start)?;
        let (norm, eps) = match &self.norm {
            Some((w, eps)) => (address(w)?, *eps),
            None => (0, 0.0),
        };
        let warps_per_block = THREADS as u64 / 32;
        let blocks = (tokens as u64 * heads as u64).div_ceil(warps_per_block).clamp(1, MAX_BLOCKS);
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let name = kernel_name("rotary", dtype)?;
        launch!(
            dev,
            name,
            cfg,
            qkv,
            address(&self.cos)?,
            address(&self.sin)?,
            norm,
            tokens as i32,
            width as i32,
            self.num_heads as i32,
            self.num_kv_heads as i32,
            self.head_dim as i32,
            eps
        );
        Ok(())
    }
}

/// Largest head the attention kernel takes: EmbeddingGemma 2's global layers (512). Its
/// shared-memory tiles grow with the head, to 160 KiB there (Hopper gives a block 227 KiB).
pub(crate) const MAX_HEAD_DIM: usize = 512;
/// Queries per block of the attention kernel (`ATT_QUERIES` in kernels.cu).
const ATTENTION_QUERIES: usize = 16;
/// Keys per shared-memory tile (`ATT_KEYS`).
const ATTENTION_KEYS: usize = 32;
const ATTENTION_THREADS: u32 = 128;
/// Shared memory a block launches without opting in.
const DEFAULT_SHARED_BYTES: usize = 48 * 1024;

/// The attention instantiation for heads of `head_dim` (each lane owns `head_dim / 32` of a
/// query's dims, rounded up to 4, 8 or 16) and the f32 tiles it keeps in shared memory: the
/// block's queries, then a tile of keys (rows padded by one), then one of values.
fn attention_variant(head_dim: usize) -> (&'static str, usize) {
    let base = match head_dim {
        0..=128 => "attention_d128",
        129..=256 => "attention_d256",
        _ => "attention_d512",
    };
    let floats = ATTENTION_QUERIES * head_dim + ATTENTION_KEYS * (head_dim + 1) + ATTENTION_KEYS * head_dim;
    (base, floats * 4)
}

/// Variable-length attention over the fused QKV rows (see the module doc).
pub(crate) fn attention(att: &KernelAttention, qkv: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let qkv = qkv.contiguous()?;
    let (tokens, width) = qkv.dims2()?;
    let (heads, kv_heads, head_dim) = (att.heads, att.kv_heads, att.head_dim);
    if kv_heads == 0 || heads % kv_heads != 0 || head_dim == 0 || head_dim > MAX_HEAD_DIM {
        bail!("attention: {heads} heads over {kv_heads} key/value heads of {head_dim} dims do not fit the CUDA kernel");
    }
    if width != (heads + 2 * kv_heads) * head_dim {
        bail!("attention: {width} columns do not split into q, k, v of {heads}+2×{kv_heads} heads of {head_dim}");
    }
    if att.cu_seqlens.last().copied() != Some(tokens) || att.cu_seqlens.first().copied() != Some(0) {
        bail!("attention: cu_seqlens does not cover the {tokens} tokens");
    }
    if let Some(b) = bias {
        check("attention bias", b, qkv.dtype(), width)?;
    }
    let dev = device(&qkv)?;
    let out_width = heads * head_dim;
    let (out, out_ptr) = empty(dev, qkv.dtype(), Shape::from((tokens, out_width)))?;
    // One upload: cu_seqlens, then (sequence, first query) of every block's query tile.
    let num_seqs = att.cu_seqlens.len() - 1;
    let mut index: Vec<u32> = att.cu_seqlens.iter().map(|&c| c as u32).collect();
    let mut num_tiles = 0usize;
    for (seq, w) in att.cu_seqlens.windows(2).enumerate() {
        for first in (0..w[1] - w[0]).step_by(ATTENTION_QUERIES) {
            index.extend([seq as u32, first as u32]);
            num_tiles += 1;
        }
    }
    if num_tiles == 0 {
        return Ok(out);
    }
    let index = Tensor::from_vec(index, num_seqs + 1 + 2 * num_tiles, qkv.device())?;
    let index_ptr = address(&index)?;
    let tiles_ptr = index_ptr + 4 * (num_seqs as u64 + 1);
    let (position_bias, position_max_len) = match att.position_bias {
        Some((values, max_len)) => {
            let longest = att.cu_seqlens.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            if max_len < longest || values.len() != heads * (2 * max_len - 1) {
                bail!("attention: position bias does not cover sequences of {longest} tokens");
            }
            (Some(Tensor::from_slice(values, values.len(), qkv.device())?), max_len)
        }
        None => (None, 0),
    };
    let (mask, window) = match att.mask {
        KernelMask::Bidirectional => (0, 0),
        KernelMask::Causal => (1, 0),
        // A window wider than the longest sequence sees everything; clamped, `i + w + 1` cannot
        // overflow in the kernel.
        KernelMask::Window(w) => (2, w.min(tokens) as i32),
        KernelMask::CausalWindow(w) => (3, w.min(tokens + 1) as i32),
    };
    let (base, shared_bytes) = attention_variant(head_dim);
    let name = kernel_name(base, qkv.dtype())?;
    if shared_bytes > DEFAULT_SHARED_BYTES {
        // Past 48 KiB a kernel must be opted in; a host-side attribute, no device sync.
        function(dev, name)?
            .set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes as i32)
            .w()?;
    }
    let cfg = LaunchConfig {
        grid_dim: (num_tiles as u32, heads as u32, 1),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: shared_bytes as u32,
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    launch!(
        dev,
        name,
        cfg,
        address(&qkv)?,
        optional(bias)?,
        out_ptr,
        index_ptr,
        tiles_ptr,
        optional(position_bias.as_ref())?,
        position_max_len as i32,
        heads as i32,
        kv_heads as i32,
        head_dim as i32,
        mask,
        window,
        scale
    );
    // `index` and `position_bias` are dropped here; their frees are ordered after the kernel
    // on the device's stream.
    Ok(out)
}
