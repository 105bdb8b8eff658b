//! What decides how one model is loaded: [`ModelOptions`], built once by whoever hosts the model
//! (the `serve` flags, the library's `LocalModelOptions`, the batch commands) and read by the loader.
//! Its enums are the values of the matching `serve` flags; they parse from the command line
//! (clap's `ValueEnum`) and from JSON (serde), so the CLI needs no mirror types.

use super::LoadError;
use crate::pooling::config::PoolerConfig;
use serde::Deserialize;

/// `--convert`: which task family to serve the checkpoint as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Convert {
    /// Decide from `architectures`.
    Auto,
    Embed,
    Classify,
}

/// `--runner` (vLLM's): what the model is run for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// Its pooling tasks.
    Pooling,
    /// A causal LM with its LM head as well, for vLLM's `/generative_scoring` (the next
    /// token's probabilities of chosen label tokens). poolserve does not generate text; the
    /// model keeps serving its pooling task beside it.
    Generate,
}

/// `--dtype`: precision of the weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DTypeArg {
    Auto,
    Float32,
    Float16,
    Bfloat16,
}

impl DTypeArg {
    /// The tensor type of weights and activations on `device`. `auto` is float16 on CUDA (what
    /// TEI and vLLM serve embedding models in) and float32 on the CPU here; on a CPU with native
    /// bf16 products the loader may then run an embedder in bfloat16 after its load-time probe
    /// (`loader::auto_dtype`; scores stay float32). On the CPU `bfloat16` means bf16 weights and
    /// matrix products with f32 activations (the loader's rule), 1.3-2.5× faster where the CPU
    /// has AVX-512 BF16 or AMX (docs/models.md, "Precision").
    pub fn dtype_on(self, device: DeviceArg) -> candle_core::DType {
        match (self, device) {
            (DTypeArg::Auto, DeviceArg::Cuda) => candle_core::DType::F16,
            _ => self.dtype(),
        }
    }

    /// The tensor type `auto` aside (`auto` is float32 here; see [`DTypeArg::dtype_on`]).
    pub fn dtype(self) -> candle_core::DType {
        match self {
            DTypeArg::Auto | DTypeArg::Float32 => candle_core::DType::F32,
            DTypeArg::Float16 => candle_core::DType::F16,
            DTypeArg::Bfloat16 => candle_core::DType::BF16,
        }
    }
}

/// `--device`: where the backbone runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceArg {
    Cpu,
    Cuda,
    Metal,
}

/// `--quantization`: weight/activation quantization of the transformer blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quantization {
    /// Int8 weights (per output channel) and activations (per token, at run time) in every
    /// dense layer of the transformer blocks; embeddings, attention, norms and heads stay f32.
    /// CPU only; needs AVX2 (AVX-VNNI and AVX-512 VNNI are used where present). With
    /// `--dtype bfloat16` the dense layers int8 leaves alone (Q/K/V on VNNI CPUs) run in bf16.
    Int8,
}

/// How to load and serve one model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Local folder or Hugging Face hub id.
    pub source: String,
    /// The name clients send as `model`.
    pub served_name: String,
    /// Hub revision (branch, tag or commit) for hub ids.
    pub revision: Option<String>,
    /// `--hf-token` / `HF_TOKEN`: the hub token for gated and private models (else the
    /// environment's, then the token file: [`super::hub`]).
    pub hub_token: Option<super::hub::HubToken>,
    pub runner: Runner,
    pub convert: Convert,
    pub pooler: PoolerConfig,
    /// Merged into config.json before anything reads it (vLLM's `--hf-overrides`).
    pub hf_overrides: serde_json::Map<String, serde_json::Value>,
    /// Longest input in tokens; at most the model's own limit.
    pub max_model_len: Option<usize>,
    /// `--auto-truncate`: requests without truncation are cut to the limit, not refused.
    pub auto_truncate: bool,
    pub device: DeviceArg,
    pub dtype: DTypeArg,
    pub quantization: Option<Quantization>,
    /// Default task description in the Qwen3-Reranker prompt.
    pub reranker_instruction: Option<String>,
    /// `--dense-path`: the Dense module folder used instead of modules.json's one.
    pub dense_path: Option<String>,
    /// vLLM's `--io-processor-plugin`: the plugin `/pooling` runs `data` requests through
    /// (wins over config.json's `io_processor_plugin`).
    pub io_processor_plugin: Option<String>,
    /// A prompt of the folder's, used when a request names none.
    pub default_prompt_name: Option<String>,
    /// A literal prompt text, used when a request names none.
    pub default_prompt: Option<String>,
    /// `--chat-template`: a template file, or the template itself (vLLM's rule, see
    /// [`crate::input::chat_template::read_flag`]); `None`: the folder's.
    pub chat_template: Option<String>,
    /// `--chat-template-content-format`: `None` decides from the template (`auto`).
    pub chat_template_content_format: Option<crate::input::chat_template::ContentFormat>,
    /// `--enable-lora`: the adapters it serves and their limits.
    pub lora: Option<super::lora::LoraOptions>,
}

impl ModelOptions {
    /// `serve`'s defaults for `source`, served under its own name.
    pub fn for_model(source: impl Into<String>) -> Self {
        let source = source.into();
        ModelOptions {
            served_name: source.clone(),
            source,
            revision: None,
            hub_token: None,
            runner: Runner::Pooling,
            convert: Convert::Auto,
            pooler: PoolerConfig::default(),
            hf_overrides: serde_json::Map::new(),
            max_model_len: None,
            auto_truncate: false,
            device: DeviceArg::Cpu,
            dtype: DTypeArg::Auto,
            quantization: None,
            reranker_instruction: None,
            dense_path: None,
            io_processor_plugin: None,
            default_prompt_name: None,
            default_prompt: None,
            chat_template: None,
            chat_template_content_format: None,
            lora: None,
        }
    }

    /// The checks any host makes before loading: combinations that cannot work, in the words of
    /// the `serve` flag that set them.
    pub fn check(&self) -> Result<(), LoadError> {
        let refused = |message: &str| Err(LoadError::Options(message.into()));
        self.pooler.check().map_err(|e| LoadError::Options(format!("--pooler-config: {e}")))?;
        match self.device {
            DeviceArg::Cpu => {}
            DeviceArg::Cuda if cfg!(feature = "cuda") => {}
            DeviceArg::Metal if cfg!(feature = "metal") => {}
            DeviceArg::Cuda => return refused("--device cuda: poolserve was built without the `cuda` feature"),
            DeviceArg::Metal => return refused("--device metal: poolserve was built without the `metal` feature"),
        }
        if self.max_model_len == Some(0) {
            return refused("--max-model-len must be greater than 0");
        }
        let cpu_dtype =
            self.device == DeviceArg::Cpu && matches!(self.dtype.dtype_on(self.device), candle_core::DType::F32 | candle_core::DType::BF16);
        if self.quantization.is_some() && !cpu_dtype {
            return refused("--quantization int8 runs on --device cpu with --dtype float32 or bfloat16 only");
        }
        Ok(())
    }
}
