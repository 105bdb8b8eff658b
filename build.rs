//! With the `cuda` feature: compiles `src/models/ops/cuda/kernels.cu` to PTX with nvcc (from
//! `$NVCC`, `$CUDA_HOME/bin`, or `PATH`; `scripts/build-cuda.sh` provides one from PyPI) for
//! `compute_$CUDA_COMPUTE_CAP` (default 80: the PTX then loads on A100, H100 and later, JIT
//! compiled once by the driver). Without the feature it does nothing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let source = "src/models/ops/cuda/kernels.cu";
    println!("cargo:rerun-if-changed={source}");
    for var in ["NVCC", "CUDA_HOME", "CUDA_COMPUTE_CAP"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let nvcc = std::env::var_os("NVCC").map(PathBuf::from).unwrap_or_else(|| match std::env::var_os("CUDA_HOME") {
        Some(home) => PathBuf::from(home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("poolserve_kernels.ptx");
    // No --use_fast_math: float32 parity needs erff/expf/division as accurate as PyTorch's.
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", "-std=c++17", &format!("-arch=compute_{cap}"), "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e} (set CUDA_HOME or NVCC, or use scripts/build-cuda.sh)", nvcc.display()));
    assert!(status.success(), "nvcc failed on {source}");
}
