//! Server configuration: the `serve` command line (every flag also an environment variable),
//! turned once into a [`ServerConfig`] that the rest of the program reads.

use crate::pooling::PoolingType;
use clap::{Args, ValueEnum};
use serde::Deserialize;

/// `--pooler-config`: server-wide pooling defaults (vLLM's `PoolerConfig`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolerConfig {
    pub pooling_type: Option<PoolingType>,
    pub normalize: Option<bool>,
    pub dimensions: Option<i64>,
    pub use_activation: Option<bool>,
    pub logit_bias: Option<f64>,
    pub step_tag_id: Option<u32>,
    pub returned_token_ids: Option<Vec<u32>>,
    pub enable_chunked_processing: Option<bool>,
    pub max_embed_len: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Runner {
    Pooling,
}

/// `--convert`: which task family to serve the checkpoint as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Convert {
    /// Decide from `architectures`.
    Auto,
    Embed,
    Classify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    Auto,
    Float32,
    Float16,
    Bfloat16,
}

impl DTypeArg {
    /// The tensor type of weights and activations on `device`. `auto` is float16 on CUDA (what
    /// TEI and vLLM serve embedding models in) and float32 elsewhere: our CPU kernels are f32,
    /// and half precision on a CPU without native half arithmetic is slower, not faster.
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

impl DeviceArg {
    /// `--max-batch-tokens` when unset: cache-sized on the CPU, TEI's default on CUDA (larger
    /// products fill a GPU).
    pub fn default_batch_tokens(self) -> usize {
        if self == DeviceArg::Cuda {
            16_384
        } else {
            4_096
        }
    }
}

/// Why `--quantization` cannot apply with this device and dtype, if it cannot.
pub fn quantization_conflict(quantization: Option<Quantization>, device: DeviceArg, dtype: DTypeArg) -> Option<&'static str> {
    let float32_cpu = device == DeviceArg::Cpu && dtype.dtype_on(device) == candle_core::DType::F32;
    (quantization.is_some() && !float32_cpu).then_some("--quantization int8 runs on --device cpu with --dtype float32 only")
}

/// `--quantization`: weight/activation quantization of the transformer blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Quantization {
    /// Int8 weights (per output channel) and activations (per token, at run time) in every
    /// dense layer of the transformer blocks; embeddings, attention, norms and heads stay f32.
    /// CPU and float32 only; needs AVX2 (AVX-VNNI and AVX-512 VNNI are used where present).
    Int8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
    Metal,
}

/// `poolserve serve` flags. Each one can also come from the environment variable named in
/// its help (flags win over the environment).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Local model folder or Hugging Face hub id.
    #[arg(env = "POOLSERVE_MODEL")]
    pub model: String,
    /// Only `pooling` is served.
    #[arg(long, value_enum, default_value = "pooling", env = "POOLSERVE_RUNNER")]
    pub runner: Runner,
    #[arg(long, value_enum, default_value = "auto", env = "POOLSERVE_CONVERT")]
    pub convert: Convert,
    /// JSON object: pooling_type, normalize, dimensions, use_activation, ...
    #[arg(long, env = "POOLSERVE_POOLER_CONFIG")]
    pub pooler_config: Option<String>,
    /// JSON object merged into config.json before anything reads it.
    #[arg(long, env = "POOLSERVE_HF_OVERRIDES")]
    pub hf_overrides: Option<String>,
    /// Hub revision (branch, tag or commit) for hub ids.
    #[arg(long, env = "POOLSERVE_REVISION")]
    pub revision: Option<String>,
    /// Longest input in tokens; at most the model's own limit.
    #[arg(long, env = "POOLSERVE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Name clients send as `model` (default: the MODEL argument).
    #[arg(long, env = "POOLSERVE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    #[arg(long, default_value = "0.0.0.0", env = "POOLSERVE_HOST")]
    pub host: String,
    #[arg(long, default_value_t = 8000, env = "POOLSERVE_PORT")]
    pub port: u16,
    #[arg(long, value_enum, default_value = "auto", env = "POOLSERVE_DTYPE")]
    pub dtype: DTypeArg,
    #[arg(long, value_enum, default_value = "cpu", env = "POOLSERVE_DEVICE")]
    pub device: DeviceArg,
    /// Quantize the transformer blocks (off by default; see README "Precision").
    #[arg(long, short = 'q', value_enum, env = "POOLSERVE_QUANTIZATION")]
    pub quantization: Option<Quantization>,
    /// Name of the sentence-transformers prompt (config_sentence_transformers.json `prompts`)
    /// applied when a request names none; overrides the folder's `default_prompt_name`.
    #[arg(long, env = "POOLSERVE_DEFAULT_PROMPT_NAME", conflicts_with = "default_prompt")]
    pub default_prompt_name: Option<String>,
    /// Text prepended to every text input when a request names no prompt (instead of a named one).
    #[arg(long, env = "POOLSERVE_DEFAULT_PROMPT")]
    pub default_prompt: Option<String>,
    /// Default task description in the Qwen3-Reranker prompt (requests may send `instruction`).
    #[arg(long, env = "POOLSERVE_RERANKER_INSTRUCTION")]
    pub reranker_instruction: Option<String>,
    /// Token budget of one forward pass (sum of the batch's sequence lengths); default 4096 on
    /// the CPU (cache-sized), 16384 on CUDA (TEI's default: larger products fill a GPU).
    #[arg(long, env = "POOLSERVE_MAX_BATCH_TOKENS")]
    pub max_batch_tokens: Option<usize>,
    /// Most sequences in one forward pass.
    #[arg(long, default_value_t = 256, env = "POOLSERVE_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    /// Requests in flight beyond this get 429 at once.
    #[arg(long, default_value_t = 512, env = "POOLSERVE_MAX_CONCURRENT_REQUESTS")]
    pub max_concurrent_requests: usize,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 2_000_000, env = "POOLSERVE_PAYLOAD_LIMIT")]
    pub payload_limit: usize,
    /// Threads that tokenize (default: 1, so the model keeps the other cores).
    #[arg(long, default_value_t = 1, env = "POOLSERVE_TOKENIZER_WORKERS")]
    pub tokenizer_workers: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health, /metrics and /version.
    #[arg(long, env = "POOLSERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Most inputs (texts, token lists, pairs, documents) in one request; more get 400.
    #[arg(long, default_value_t = 1024, env = "POOLSERVE_MAX_CLIENT_BATCH_SIZE")]
    pub max_client_batch_size: usize,
    /// Most floats one request may produce in token-level outputs (token_embed,
    /// token_classify, late-interaction scoring: tokens × width); more get 400 before the
    /// model runs. 2^24 = 64 MiB of f32, about 170 MB of JSON.
    #[arg(long, default_value_t = 1 << 24, env = "POOLSERVE_MAX_OUTPUT_FLOATS")]
    pub max_output_floats: usize,
    /// Seconds that in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30, env = "POOLSERVE_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: u64,
    #[arg(long, value_enum, default_value = "text", env = "POOLSERVE_LOG_FORMAT")]
    pub log_format: LogFormat,
}

/// `--log-format`: human-readable lines, or one JSON object per event (log collectors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Everything the server needs, validated.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub model: String,
    pub revision: Option<String>,
    pub served_model_name: String,
    pub convert: Convert,
    pub pooler: PoolerConfig,
    pub hf_overrides: serde_json::Map<String, serde_json::Value>,
    pub max_model_len: Option<usize>,
    pub host: String,
    pub port: u16,
    pub device: DeviceArg,
    /// Precision of the weights and activations; `auto` is float32.
    pub dtype: DTypeArg,
    pub quantization: Option<Quantization>,
    pub max_batch_tokens: usize,
    pub max_num_seqs: usize,
    pub max_concurrent_requests: usize,
    pub payload_limit: usize,
    pub tokenizer_workers: usize,
    pub reranker_instruction: Option<String>,
    /// `--default-prompt-name`: a prompt of the folder's, used when a request names none.
    pub default_prompt_name: Option<String>,
    /// `--default-prompt`: a literal prompt text, used when a request names none.
    pub default_prompt: Option<String>,
    pub api_key: Option<String>,
    pub max_client_batch_size: usize,
    pub max_output_floats: usize,
    pub shutdown_timeout: std::time::Duration,
    pub log_format: LogFormat,
}

/// A flag value that cannot be used; printed as one line before exiting.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

fn positive(name: &str, value: usize) -> Result<usize, ConfigError> {
    if value == 0 {
        return Err(ConfigError(format!("--{name} must be greater than 0")));
    }
    Ok(value)
}

impl TryFrom<ServeArgs> for ServerConfig {
    type Error = ConfigError;

    fn try_from(args: ServeArgs) -> Result<Self, ConfigError> {
        let pooler: PoolerConfig = match &args.pooler_config {
            Some(json) => serde_json::from_str(json).map_err(|e| ConfigError(format!("--pooler-config: {e}")))?,
            None => PoolerConfig::default(),
        };
        if pooler.max_embed_len.is_some() && pooler.enable_chunked_processing != Some(true) {
            return Err(ConfigError("--pooler-config: max_embed_len needs enable_chunked_processing: true".into()));
        }
        if pooler.pooling_type != Some(PoolingType::Step) && (pooler.step_tag_id.is_some() || pooler.returned_token_ids.is_some()) {
            return Err(ConfigError("--pooler-config: step_tag_id and returned_token_ids need pooling_type STEP".into()));
        }
        let hf_overrides = match &args.hf_overrides {
            Some(json) => match serde_json::from_str(json) {
                Ok(serde_json::Value::Object(map)) => map,
                Ok(_) => return Err(ConfigError("--hf-overrides must be a JSON object".into())),
                Err(e) => return Err(ConfigError(format!("--hf-overrides: {e}"))),
            },
            None => Default::default(),
        };
        match args.device {
            DeviceArg::Cpu => {}
            DeviceArg::Cuda if cfg!(feature = "cuda") => {}
            DeviceArg::Metal if cfg!(feature = "metal") => {}
            DeviceArg::Cuda => return Err(ConfigError("--device cuda: poolserve was built without the `cuda` feature".into())),
            DeviceArg::Metal => return Err(ConfigError("--device metal: poolserve was built without the `metal` feature".into())),
        }
        if let Some(n) = args.max_model_len {
            positive("max-model-len", n)?;
        }
        if let Some(conflict) = quantization_conflict(args.quantization, args.device, args.dtype) {
            return Err(ConfigError(conflict.into()));
        }
        Ok(ServerConfig {
            served_model_name: args.served_model_name.clone().unwrap_or_else(|| args.model.clone()),
            model: args.model,
            revision: args.revision,
            convert: args.convert,
            pooler,
            hf_overrides,
            max_model_len: args.max_model_len,
            host: args.host,
            port: args.port,
            device: args.device,
            dtype: args.dtype,
            quantization: args.quantization,
            max_batch_tokens: positive(
                "max-batch-tokens",
                args.max_batch_tokens.unwrap_or(args.device.default_batch_tokens()),
            )?,
            max_num_seqs: positive("max-num-seqs", args.max_num_seqs)?,
            max_concurrent_requests: positive("max-concurrent-requests", args.max_concurrent_requests)?,
            payload_limit: positive("payload-limit", args.payload_limit)?,
            tokenizer_workers: positive("tokenizer-workers", args.tokenizer_workers)?,
            reranker_instruction: args.reranker_instruction,
            default_prompt_name: args.default_prompt_name,
            default_prompt: args.default_prompt,
            api_key: match args.api_key {
                Some(key) if key.is_empty() => return Err(ConfigError("--api-key must not be empty".into())),
                key => key,
            },
            max_client_batch_size: positive("max-client-batch-size", args.max_client_batch_size)?,
            max_output_floats: positive("max-output-floats", args.max_output_floats)?,
            shutdown_timeout: std::time::Duration::from_secs(args.shutdown_timeout),
            log_format: args.log_format,
        })
    }
}

impl ServerConfig {
    /// `serve`'s defaults for a model folder (tests and the library API). Written out rather
    /// than parsed by clap, which would read the process's `POOLSERVE_*` variables (and exit
    /// the host process on a malformed one); a test keeps them equal to the flags' defaults.
    pub fn for_model(model: impl Into<String>) -> Self {
        let model = model.into();
        ServerConfig {
            served_model_name: model.clone(),
            model,
            revision: None,
            convert: Convert::Auto,
            pooler: PoolerConfig::default(),
            hf_overrides: serde_json::Map::new(),
            max_model_len: None,
            host: "0.0.0.0".into(),
            port: 8000,
            device: DeviceArg::Cpu,
            dtype: DTypeArg::Auto,
            quantization: None,
            max_batch_tokens: 4096,
            max_num_seqs: 256,
            max_concurrent_requests: 512,
            payload_limit: 2_000_000,
            tokenizer_workers: 1,
            reranker_instruction: None,
            default_prompt_name: None,
            default_prompt: None,
            api_key: None,
            max_client_batch_size: 1024,
            max_output_floats: 1 << 24,
            shutdown_timeout: std::time::Duration::from_secs(30),
            log_format: LogFormat::Text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `for_model` spells out the flags' defaults: they must stay equal to what clap gives
    /// (compared field by field through Debug, with none of the flags' variables set).
    #[test]
    fn for_model_matches_the_flags_defaults() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ServeArgs,
        }
        let flag_variables: Vec<String> =
            Wrapper::command().get_arguments().filter_map(|a| a.get_env()).map(|v| v.to_string_lossy().into_owned()).collect();
        assert!(flag_variables.len() > 20, "the flags' variables were not found: {flag_variables:?}");
        let set: Vec<&String> = flag_variables.iter().filter(|v| std::env::var_os(v).is_some()).collect();
        assert!(set.is_empty(), "unset {set:?} to run this test: it compares against clap's defaults");
        let parsed = ServerConfig::try_from(Wrapper::parse_from(["poolserve", "m"]).args).unwrap();
        assert_eq!(format!("{:?}", ServerConfig::for_model("m")), format!("{parsed:?}"));
    }

    #[test]
    fn pooler_config_rejects_unknown_fields() {
        let err = serde_json::from_str::<PoolerConfig>(r#"{"pooling_typ": "MEAN"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"));
        let ok: PoolerConfig = serde_json::from_str(r#"{"pooling_type": "MEAN", "normalize": false}"#).unwrap();
        assert_eq!(ok.pooling_type, Some(PoolingType::Mean));
    }

    #[test]
    fn defaults_are_valid() {
        let config = ServerConfig::for_model("some/model");
        assert_eq!(config.served_model_name, "some/model");
        assert_eq!(config.port, 8000);
    }
}
