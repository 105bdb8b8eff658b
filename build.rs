//! With the `cuda` feature: compiles `src/kernels/cuda/kernels.cu` with nvcc (from
//! `$NVCC`, `$CUDA_HOME/bin`, or `PATH`; `scripts/build-cuda.sh` provides one from PyPI) into a
//! fat binary holding machine code for `sm_$CUDA_COMPUTE_CAP` (default 80) and PTX for
//! `compute_$CUDA_COMPUTE_CAP`. The machine code loads at once on that GPU generation; the PTX
//! lets later generations JIT-compile it. PTX alone cost every fresh process (a new container)
//! a driver JIT of about 20 s for these kernels: measured on an H200, the first model load took
//! 46 s, later ones (JIT cache warm) 1.2 s. Without the feature it does nothing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let source = "src/kernels/cuda/kernels.cu";
    println!("cargo:rerun-if-changed={source}");
    for var in ["NVCC", "CUDA_HOME", "CUDA_COMPUTE_CAP"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let nvcc = std::env::var_os("NVCC").map(PathBuf::from).unwrap_or_else(|| match std::env::var_os("CUDA_HOME") {
        Some(home) => PathBuf::from(home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("poolserve_kernels.fatbin");
    // No --use_fast_math: float32 parity needs erff/expf/division as accurate as PyTorch's.
    let status = Command::new(&nvcc)
        .args(["--fatbin", "-O3", "-std=c++17"])
        .arg(format!("-gencode=arch=compute_{cap},code=sm_{cap}"))
        .arg(format!("-gencode=arch=compute_{cap},code=compute_{cap}"))
        .arg("-o")
        .arg(&out)
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e} (set CUDA_HOME or NVCC, or use scripts/build-cuda.sh)", nvcc.display()));
    assert!(status.success(), "nvcc failed on {source}");
}
