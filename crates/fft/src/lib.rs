//! A forward real FFT of f32 samples behind a trait object, so that the generic planner of
//! realfft and rustfft is instantiated in this crate, compiled once, instead of in every crate
//! that plans an FFT (Cargo.toml says what that cost). Tested where it is used: the log-mel
//! features against transformers' (tests/suite/embedding_gemma2_audio.rs).

pub use realfft::num_complex::Complex;
pub use realfft::RealToComplex;
use std::sync::Arc;

/// The forward transform of `length` real samples (`length / 2 + 1` complex bins), as
/// `RealFftPlanner::<f32>::new().plan_fft_forward(length)` plans it.
pub fn forward(length: usize) -> Arc<dyn RealToComplex<f32>> {
    realfft::RealFftPlanner::<f32>::new().plan_fft_forward(length)
}

