//! The library API: load a model once and run pooling tasks in-process, through the same
//! engine as the HTTP server (tokenization workers, batching, the model thread) and the same
//! parameter validation, with typed results.
//!
//! ```no_run
//! use poolserve::pooler::{Pooler, PoolerOptions};
//! use poolserve::engine::params::PoolingParams;
//!
//! let pooler = Pooler::load(PoolerOptions::for_model("models/all-MiniLM-L6-v2"))?;
//! let vectors = pooler.embed(&["A man is eating food.", "A man is riding a horse."], &PoolingParams::default())?;
//! assert_eq!(vectors[0].len(), 384);
//! # Ok::<(), poolserve::pooler::PoolerError>(())
//! ```
//!
//! Every method blocks the calling thread; `*_async` variants return futures for callers that
//! already run an async runtime.

use crate::config::{Convert, DTypeArg, DeviceArg, PoolerConfig, Quantization, ServerConfig};
use crate::engine::{Engine, EngineError, PoolingOutput, Prompt};
use crate::loader::spec::ModelSpec;
use crate::engine::params::ParamsError;
use crate::pooling::Task;
use crate::engine::params::PoolingParams;

/// How to load a model in a host program: the model-shaping settings of `poolserve serve`
/// (no host, port, API key or log format). Built from code only, never from the process's
/// `POOLSERVE_*` variables or arguments: [`PoolerOptions::for_model`] gives `serve`'s
/// defaults; adjust fields, and [`Pooler::load`] checks them (an unusable value is an error,
/// never an exit or a panic of the host).
#[derive(Debug, Clone)]
pub struct PoolerOptions {
    /// Local folder or hub id.
    pub model: String,
    pub revision: Option<String>,
    pub convert: Convert,
    pub pooler: PoolerConfig,
    pub hf_overrides: serde_json::Map<String, serde_json::Value>,
    pub max_model_len: Option<usize>,
    pub device: DeviceArg,
    pub dtype: DTypeArg,
    pub quantization: Option<Quantization>,
    /// `None`: 4096 on the CPU, 16384 on CUDA.
    pub max_batch_tokens: Option<usize>,
    pub max_num_seqs: usize,
    pub max_concurrent_requests: usize,
    pub max_output_floats: usize,
    pub tokenizer_workers: usize,
    pub reranker_instruction: Option<String>,
    pub default_prompt_name: Option<String>,
    pub default_prompt: Option<String>,
}

impl PoolerOptions {
    /// `poolserve serve`'s defaults for `model`.
    pub fn for_model(model: impl Into<String>) -> Self {
        let server = ServerConfig::for_model(model);
        PoolerOptions {
            model: server.model,
            revision: server.revision,
            convert: server.convert,
            pooler: server.pooler,
            hf_overrides: server.hf_overrides,
            max_model_len: server.max_model_len,
            device: server.device,
            dtype: server.dtype,
            quantization: server.quantization,
            max_batch_tokens: None,
            max_num_seqs: server.max_num_seqs,
            max_concurrent_requests: server.max_concurrent_requests,
            max_output_floats: server.max_output_floats,
            tokenizer_workers: server.tokenizer_workers,
            reranker_instruction: server.reranker_instruction,
            default_prompt_name: server.default_prompt_name,
            default_prompt: server.default_prompt,
        }
    }

    /// The engine's configuration, after the checks `serve` makes on its flags.
    fn into_config(self) -> Result<ServerConfig, PoolerError> {
        let positive = |name: &str, value: usize| if value == 0 { Err(PoolerError::Load(format!("{name} must be greater than 0"))) } else { Ok(value) };
        let mut config = ServerConfig::for_model(self.model.clone());
        config.max_batch_tokens = positive("max_batch_tokens", self.max_batch_tokens.unwrap_or(self.device.default_batch_tokens()))?;
        config.max_num_seqs = positive("max_num_seqs", self.max_num_seqs)?;
        config.max_concurrent_requests = positive("max_concurrent_requests", self.max_concurrent_requests)?;
        config.max_output_floats = positive("max_output_floats", self.max_output_floats)?;
        config.tokenizer_workers = positive("tokenizer_workers", self.tokenizer_workers)?;
        if let Some(n) = self.max_model_len {
            positive("max_model_len", n)?;
        }
        if let Some(conflict) = crate::config::quantization_conflict(self.quantization, self.device, self.dtype) {
            return Err(PoolerError::Load(conflict.into()));
        }
        config.served_model_name = self.model.clone();
        config.model = self.model;
        config.revision = self.revision;
        config.convert = self.convert;
        config.pooler = self.pooler;
        config.hf_overrides = self.hf_overrides;
        config.max_model_len = self.max_model_len;
        config.device = self.device;
        config.dtype = self.dtype;
        config.quantization = self.quantization;
        config.reranker_instruction = self.reranker_instruction;
        config.default_prompt_name = self.default_prompt_name;
        config.default_prompt = self.default_prompt;
        Ok(config)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolerError {
    #[error("{0}")]
    Load(String),
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("The model does not support the {0} task")]
    Unsupported(Task),
    #[error("cannot start the runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// One input's classification: the winning label and every class's probability (or logit).
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    pub label: String,
    pub probs: Vec<f32>,
}

/// A loaded model. Cheap to share across threads (`&Pooler` is `Sync`).
pub struct Pooler {
    engine: Engine,
    runtime: tokio::runtime::Runtime,
}

impl Pooler {
    /// Loads the model and starts its engine (no warm-up request is run).
    pub fn load(options: PoolerOptions) -> Result<Self, PoolerError> {
        Self::start(&options.into_config()?)
    }

    /// Loads from the CLI's validated configuration (the batch commands).
    pub(crate) fn start(config: &ServerConfig) -> Result<Self, PoolerError> {
        let engine = crate::server::start_engine(config).map_err(|e| PoolerError::Load(format!("{e:#}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(Pooler { engine, runtime })
    }

    /// What was decided about the model at load time (tasks, max length, sizes, labels).
    pub fn spec(&self) -> &ModelSpec {
        self.engine.spec()
    }

    /// The engine, for callers that drive it directly (the batch commands do).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Any task over text or token-id inputs; one output per input, in order.
    pub async fn encode_async(&self, task: Task, inputs: Vec<Prompt>, params: &PoolingParams) -> Result<Vec<PoolingOutput>, PoolerError> {
        if !self.engine.spec().supports(task) {
            return Err(PoolerError::Unsupported(task));
        }
        let params = params.verify(task, self.engine.spec())?;
        Ok(self.engine.encode(inputs, &params).await?.0)
    }

    pub fn encode(&self, task: Task, inputs: Vec<Prompt>, params: &PoolingParams) -> Result<Vec<PoolingOutput>, PoolerError> {
        self.runtime.block_on(self.encode_async(task, inputs, params))
    }

    /// One embedding per text (normalized unless `params.normalize` is false).
    pub fn embed(&self, texts: &[&str], params: &PoolingParams) -> Result<Vec<Vec<f32>>, PoolerError> {
        let outputs = self.encode(Task::Embed, texts_to_prompts(texts), params)?;
        outputs.into_iter().map(vector).collect()
    }

    /// Label and probabilities per text.
    pub fn classify(&self, texts: &[&str], params: &PoolingParams) -> Result<Vec<Classification>, PoolerError> {
        let outputs = self.encode(Task::Classify, texts_to_prompts(texts), params)?;
        let labels = &self.engine.spec().labels;
        outputs
            .into_iter()
            .map(|o| {
                let probs = vector(o)?;
                let best = crate::pooling::classifier::argmax(&probs);
                Ok(Classification { label: labels.get(best).cloned().unwrap_or_default(), probs })
            })
            .collect()
    }

    /// Relevance of each (query, document) pair, paired 1:1, 1:N or N:N as `/score` does, by
    /// whatever the model scores with (cross-encoder, bi-encoder cosine, MaxSim).
    pub async fn score_async(&self, queries: &[String], documents: &[String], params: &PoolingParams) -> Result<Vec<f32>, PoolerError> {
        if self.engine.score_mode().is_none() {
            return Err(PoolerError::Unsupported(Task::Score));
        }
        let params = params.verify(Task::Score, self.engine.spec())?;
        Ok(self.engine.score(queries, documents, &params, None).await?.0)
    }

    pub fn score(&self, queries: &[&str], documents: &[&str], params: &PoolingParams) -> Result<Vec<f32>, PoolerError> {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        self.runtime.block_on(self.score_async(&owned(queries), &owned(documents), params))
    }
}

fn texts_to_prompts(texts: &[&str]) -> Vec<Prompt> {
    texts.iter().map(|t| Prompt::Text(t.to_string())).collect()
}

fn vector(output: PoolingOutput) -> Result<Vec<f32>, PoolerError> {
    match output {
        PoolingOutput::Vector(v) => Ok(v),
        _ => Err(PoolerError::Engine(EngineError::Model("expected one vector per input".into()))),
    }
}
