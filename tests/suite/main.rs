//! The integration tests as one binary: each file here was a test target of its own, and each
//! linked the whole crate, which was where the test command's build time went. Tests that
//! touch process-wide state stay binaries of their own: `tests/logs.rs` (installs the global
//! log subscriber), `tests/hardening.rs` (measures the process's RSS) and `tests/library.rs`
//! (sets environment variables). Run one file's tests with `cargo test --test suite lora::`.

#[path = "../common/mod.rs"]
mod common;

mod batch;
mod bidirectional_decoders;
mod cache;
mod chat_templates;
mod classify_parity;
mod cli;
mod decoder_families;
mod documented_messages;
mod embedding_gemma2_audio;
mod embedding_gemma2_chat;
mod embedding_gemma2_images;
mod embedding_gemma2_video;
mod encoder_families;
mod generative_scoring;
mod grpc;
mod http;
mod http_ops;
mod http_plumbing;
mod http_pooling;
mod http_scoring;
mod hub;
mod image_models;
mod jina_v5;
mod layers;
mod long_inputs;
mod lora;
mod minilm;
mod models_on_demand;
mod multi_model;
mod ollama;
mod page_retrievers;
mod parity;
mod plugins;
mod qwen3_vl;
mod real_token_models;
mod reward_models;
mod scheduling;
mod sentence_folders;
mod tei_compat;
mod token_parity;
mod vllm_compat;
