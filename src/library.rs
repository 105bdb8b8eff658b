//! The library API: load a model once and run pooling tasks in-process, through the same
//! engine as the HTTP server (tokenization workers, batching, the model thread) and the same
//! parameter validation, with typed results.
//!
//! ```no_run
//! use poolserve::library::{LocalModel, LocalModelOptions};
//! use poolserve::library::PoolingParams;
//!
//! let model = LocalModel::load(LocalModelOptions::for_model("models/all-MiniLM-L6-v2"))?;
//! let vectors = model.embed(&["A man is eating food.", "A man is riding a horse."], &PoolingParams::default())?;
//! assert_eq!(vectors[0].len(), 384);
//! # Ok::<(), poolserve::library::LibraryError>(())
//! ```
//!
//! Every method blocks the calling thread; `*_async` variants return futures for callers that
//! already run an async runtime.

use crate::engine::params::ParamsError;
pub use crate::engine::params::PoolingParams;
use crate::engine::{Engine, EngineError, EngineOptions};
use crate::input::Prompt;
use crate::loader::model_spec::ModelSpec;
use crate::loader::options::ModelOptions;
use crate::plugin::{IoProcessor, PluginError, PluginOptions};
use crate::pooling::Task;
use crate::pooling::{PoolingOutput, TaskOutput};

/// How to load a model in a host program: the model's options and the engine's, as `serve`
/// has them (no host, port, API key or log format). Built from code only, never from the
/// process's `POOLSERVE_*` variables or arguments: [`LocalModelOptions::for_model`] gives `serve`'s
/// defaults; adjust fields, and [`LocalModel::load`] checks them (an unusable value is an error,
/// never an exit or a panic of the host).
#[derive(Debug, Clone)]
pub struct LocalModelOptions {
    pub model: ModelOptions,
    pub engine: EngineOptions,
    /// How the model's IO-processor plugin runs, when `model.io_processor_plugin` (or its
    /// config.json) names one.
    pub plugins: PluginOptions,
}

impl LocalModelOptions {
    /// `poolserve serve`'s defaults for `model` (a folder or hub id).
    pub fn for_model(model: impl Into<String>) -> Self {
        LocalModelOptions { model: ModelOptions::for_model(model), engine: EngineOptions::default(), plugins: PluginOptions::default() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
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
    #[error(transparent)]
    /// A LoRA adapter that could not be loaded (vLLM's messages).
    Adapter(crate::loader::LoadError),
    /// The model's IO-processor plugin failed to start or refused a request.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// A plugin request to a model without a plugin (vLLM's message).
    #[error("No IOProcessor plugin installed. Please refer to the documentation and to the 'prithvi_geospatial_mae_io_processor' offline inference example for more details.")]
    NoPlugin,
}

/// One input's classification: the winning label and every class's probability (or logit).
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    pub label: String,
    pub probs: Vec<f32>,
}

/// A loaded model, or one of its LoRA adapters ([`LocalModel::with_adapter`]). Cheap to share
/// across threads (`&LocalModel` is `Sync`).
pub struct LocalModel {
    engine: Engine,
    runtime: std::sync::Arc<tokio::runtime::Runtime>,
    /// The model's IO-processor plugin, its processes driven by `runtime`.
    plugin: Option<std::sync::Arc<IoProcessor>>,
}

impl LocalModel {
    /// Loads the model and starts its engine (no warm-up request is run).
    pub fn load(options: LocalModelOptions) -> Result<Self, LibraryError> {
        options.model.check().map_err(|e| LibraryError::Load(e.to_string()))?;
        options.engine.check().map_err(|e| LibraryError::Load(e.to_string()))?;
        let engine = Engine::load(&options.model, &options.engine).map_err(|e| LibraryError::Load(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let plugin = match &engine.spec().io_processor_plugin {
            Some(name) => Some(runtime.block_on(IoProcessor::start(name, &options.plugins, &engine))?),
            None => None,
        };
        Ok(LocalModel { engine, runtime: std::sync::Arc::new(runtime), plugin })
    }

    /// The same model running the LoRA adapter `name` (loaded with the model, from
    /// `options.model.lora`, or by [`LocalModel::load_adapter`]): every method then answers with
    /// it. Sharing the base's engine, adapters and the base batch together.
    pub fn with_adapter(&self, name: &str) -> Result<LocalModel, LibraryError> {
        let engine = self.engine.with_adapter(name).ok_or_else(|| LibraryError::Load(format!("no LoRA adapter `{name}` is loaded")))?;
        Ok(LocalModel { engine, runtime: std::sync::Arc::clone(&self.runtime), plugin: self.plugin.clone() })
    }

    /// Reads the PEFT adapter at `path` as `name` (the model must have been loaded with
    /// `options.model.lora` set, as `--enable-lora`).
    pub fn load_adapter(&self, name: &str, path: &str) -> Result<(), LibraryError> {
        let registry = self.engine.lora().ok_or_else(|| LibraryError::Load("LoRA is not enabled: set options.model.lora".into()))?;
        registry.load(name, path).map_err(LibraryError::Adapter)?;
        Ok(())
    }

    /// What was decided about the model at load time (tasks, max length, sizes, labels).
    pub fn spec(&self) -> &ModelSpec {
        self.engine.spec()
    }

    /// The engine, for callers that drive it directly (the batch commands do).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Any task over text, token-id or (for image-text models, `embed`) image inputs; one
    /// output per input, in order.
    pub async fn encode_async(&self, task: Task, inputs: Vec<Prompt>, params: &PoolingParams) -> Result<Vec<PoolingOutput>, LibraryError> {
        self.encode_as(task, inputs, params).await
    }

    pub fn encode(&self, task: Task, inputs: Vec<Prompt>, params: &PoolingParams) -> Result<Vec<PoolingOutput>, LibraryError> {
        self.runtime.block_on(self.encode_async(task, inputs, params))
    }

    /// Whether the model runs an IO-processor plugin.
    pub fn has_plugin(&self) -> bool {
        self.plugin.is_some()
    }

    /// vLLM's offline plugin request (`LLM.encode({"data": data}, pooling_task="plugin")`):
    /// `data` through the model's IO-processor plugin, as `/pooling` runs it, with no request
    /// id (a vLLM plugin's offline path). Blocking only: the plugin's processes belong to this
    /// model's runtime.
    pub fn plugin(&self, data: serde_json::Value) -> Result<serde_json::Value, LibraryError> {
        let plugin = self.plugin.as_ref().ok_or(LibraryError::NoPlugin)?;
        Ok(self.runtime.block_on(plugin.process(&self.engine, data, None))?)
    }

    /// One task's outputs in the shape it has ([`TaskOutput`]).
    async fn encode_as<T: TaskOutput>(&self, task: Task, inputs: Vec<Prompt>, params: &PoolingParams) -> Result<Vec<T>, LibraryError> {
        if !self.engine.spec().supports(task) {
            return Err(LibraryError::Unsupported(task));
        }
        let params = params.verify(task, self.engine.spec())?;
        Ok(self.engine.encode_as(inputs, &params).await?.0)
    }

    fn encode_blocking<T: TaskOutput>(&self, task: Task, inputs: Vec<Prompt>, params: &PoolingParams) -> Result<Vec<T>, LibraryError> {
        self.runtime.block_on(self.encode_as(task, inputs, params))
    }

    /// One embedding per text (normalized unless `params.normalize` is false).
    pub fn embed(&self, texts: &[&str], params: &PoolingParams) -> Result<Vec<Vec<f32>>, LibraryError> {
        self.encode_blocking(Task::Embed, texts_to_prompts(texts), params)
    }

    /// One embedding per encoded image (PNG, JPEG or WebP bytes), in the space of the texts'
    /// embeddings: image-text models (CLIP, SigLIP) only. Mixed texts and images go through
    /// [`Self::encode`] with [`Prompt::Image`].
    pub fn embed_images(&self, images: &[&[u8]], params: &PoolingParams) -> Result<Vec<Vec<f32>>, LibraryError> {
        self.encode_blocking(Task::Embed, images.iter().map(|bytes| Prompt::Image(bytes.to_vec())).collect(), params)
    }

    /// Per-token outputs of a reward model, vLLM's `LLM.reward`: one row per token (raw
    /// rewards for `Qwen2ForRewardModel`), or one row per step for a process reward model
    /// (STEP pooling: softmax over the kept columns at each step tag). Any token classifier
    /// answers the same way (its per-token probabilities).
    pub fn reward(&self, texts: &[&str], params: &PoolingParams) -> Result<Vec<Vec<Vec<f32>>>, LibraryError> {
        self.encode_blocking(Task::TokenClassify, texts_to_prompts(texts), params)
    }

    /// Label and probabilities per text.
    pub fn classify(&self, texts: &[&str], params: &PoolingParams) -> Result<Vec<Classification>, LibraryError> {
        let outputs: Vec<Vec<f32>> = self.encode_blocking(Task::Classify, texts_to_prompts(texts), params)?;
        let labels = &self.engine.spec().labels;
        Ok(outputs
            .into_iter()
            .map(|probs| {
                let best = crate::pooling::classifier::argmax(&probs);
                Classification { label: labels.get(best).cloned().unwrap_or_default(), probs }
            })
            .collect())
    }

    /// Relevance of each (query, document) pair, paired 1:1, 1:N or N:N as `/score` does, by
    /// whatever the model scores with (cross-encoder, bi-encoder cosine, MaxSim).
    pub async fn score_async(&self, queries: &[String], documents: &[String], params: &PoolingParams) -> Result<Vec<f32>, LibraryError> {
        if self.engine.score_mode().is_none() {
            return Err(LibraryError::Unsupported(Task::Score));
        }
        let params = params.verify(Task::Score, self.engine.spec())?;
        Ok(self.engine.score(queries, documents, &params, None).await?.0)
    }

    pub fn score(&self, queries: &[&str], documents: &[&str], params: &PoolingParams) -> Result<Vec<f32>, LibraryError> {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        self.runtime.block_on(self.score_async(&owned(queries), &owned(documents), params))
    }
}

fn texts_to_prompts(texts: &[&str]) -> Vec<Prompt> {
    texts.iter().map(|t| Prompt::Text(t.to_string())).collect()
}
