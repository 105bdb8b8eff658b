//! Safetensors weights read tensor by tensor from their memory maps, each tensor's file pages
//! handed back to the kernel once copied out. Reading a mapped file makes its pages resident in
//! this process, so without this, loading held every weight twice (once mapped, once in its
//! tensor) until the maps closed: a 7B model in bfloat16 (14.5 GB) peaked near 29 GB. Weights
//! load in their stored dtype unless another is asked for, so half-precision weights served in
//! half precision never pass through an f32 copy.

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Result, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use std::collections::HashMap;
use std::path::PathBuf;

/// The weight files of one model, memory-mapped.
pub struct MappedWeights {
    files: MmapedSafetensors,
    /// f32 deltas added to tensors as they load (a task adapter merged at load:
    /// `loader::lora::merged`), by tensor name.
    deltas: HashMap<String, Tensor>,
}

impl MappedWeights {
    /// Maps `files` (the shards of one model) read-only.
    ///
    /// # Safety
    /// The files must not change while the model loads, memmap2's contract (and every
    /// safetensors loader's).
    pub unsafe fn open(files: &[PathBuf]) -> Result<Self> {
        // SAFETY: forwarded to the caller, as documented above.
        Ok(Self { files: unsafe { MmapedSafetensors::multi(files)? }, deltas: HashMap::new() })
    }

    /// These weights with `deltas` added to the tensors they name.
    pub fn with_deltas(self, deltas: HashMap<String, Tensor>) -> Self {
        Self { deltas, ..self }
    }

    /// Whether the files hold the tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.files.get(name).is_ok()
    }

    /// The tensor `name` copied out of its file in `dtype` on `device`, its pages released.
    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let view = self.files.get(name)?;
        let tensor = view.load(device)?;
        release(view.data());
        match self.deltas.get(name) {
            // Merged in f32, then stored as asked.
            Some(delta) => (tensor.to_dtype(DType::F32)? + delta.to_device(device)?)?.to_dtype(dtype),
            None => tensor.to_dtype(dtype),
        }
    }
}

/// `--dtype auto` on the CPU: float32, unless the weights are stored in half precision and
/// their float32 copy would not fit in the memory available (more than 80% of it): then their
/// stored dtype (for bfloat16, the packed bf16 kernels), so that a 7B bfloat16 checkpoint serves
/// on a 24 GiB machine instead of failing to allocate. Said in the log when it falls back.
pub fn auto_cpu_dtype(weights: &MappedWeights, files: &[PathBuf], available: Option<u64>) -> DType {
    let stored = weights.files.tensors().iter().filter_map(|(_, view)| DType::try_from(view.dtype()).ok()).find(|d| *d != DType::F32);
    let stored = match stored {
        Some(half @ (DType::BF16 | DType::F16)) => half,
        _ => return DType::F32,
    };
    let bytes: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    match available {
        Some(available) if bytes.saturating_mul(2) > available / 5 * 4 => {
            tracing::warn!(
                "--dtype auto: the float32 copy of these {stored:?} weights ({:.1} GB) would not fit in the {:.1} GB of memory available; serving in {stored:?} as stored",
                bytes as f64 * 2e-9,
                available as f64 * 1e-9
            );
            stored
        }
        _ => DType::F32,
    }
}

/// MemAvailable of /proc/meminfo, in bytes (Linux).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Tells the kernel this process no longer needs the mapped pages that lie wholly inside
/// `bytes`; reading them again would fault them back in from the file.
fn release(bytes: &[u8]) {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let start = (bytes.as_ptr() as usize).div_ceil(page) * page;
        let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
        if end > start {
            // SAFETY: [start, end) lies inside a read-only file mapping that stays mapped;
            // MADV_DONTNEED on a file mapping drops this process's copies of the pages and
            // changes no data (nothing here writes to them), so the bytes read later are the
            // file's, as before. A failure only means the pages stay resident.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(unix))]
    let _ = bytes;
}

/// `tensor` if it has `shape`, else candle's shape-mismatch error naming the weight.
pub(super) fn with_shape(tensor: Tensor, shape: Shape, name: &str) -> Result<Tensor> {
    if tensor.shape() != &shape {
        return Err(candle_core::Error::UnexpectedShape {
            msg: format!("shape mismatch for {name}"),
            expected: shape,
            got: tensor.shape().clone(),
        }
        .bt());
    }
    Ok(tensor)
}

impl SimpleBackend for MappedWeights {
    fn get(&self, shape: Shape, name: &str, _: candle_nn::Init, dtype: DType, device: &Device) -> Result<Tensor> {
        with_shape(self.load(name, dtype, device)?, shape, name)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        self.load(name, dtype, device)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.has(name)
    }
}
