//! poolserve: an inference server for pooling models (embeddings first; classification,
//! scoring and token tasks plug into the same engine).
//!
//! Layers, each importing only those below it (docs/ARCHITECTURE.md, enforced by
//! tests/suite/layers.rs): [`kernels`] (the CPU, AMX, int8 and CUDA kernels and the layers built
//! on them) ← [`models`] (architectures, the shared encoder, the flat batch) ← [`pooling`] (tasks, methods, head math) ← [`input`] (prompts → model inputs:
//! tokenization, chat templates, images) ← [`loader`] (files → spec, tokenizer, backbone,
//! heads) ← [`engine`] (validation, tokenization, batching, the model thread) ← [`api`] (HTTP),
//! [`commands`] (the batch commands), [`library`] (the in-process library API), [`server`] and
//! [`config`] (the CLI).

pub mod api;
pub mod commands;
pub mod config;
pub mod engine;
pub mod input;
pub mod kernels;
pub mod library;
pub mod loader;
pub mod metrics;
pub mod models;
pub mod plugin;
pub mod pooling;
pub mod server;
pub mod telemetry;
