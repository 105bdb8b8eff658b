//! The engine: admission, request validation ([`params`]), the batching queue and the model
//! thread ([`scheduler`]), pair scoring ([`score`]), behind one cheap-to-clone [`Engine`]
//! handle. The HTTP layer (and the library API) hand it prompts and validated parameters and
//! get one output per prompt back, in order; the input layer ([`crate::input`]) turns the
//! prompts into model inputs first. It never shows tensors to its callers.

mod batch_budget;
pub mod cache;
pub mod generative;
pub mod literal;
pub mod options;
pub mod params;
pub mod scheduler;
pub mod score;
mod sides;

pub use error::EngineError;
mod error;

use crate::engine::params::ParamsError;
use crate::engine::params::ResolvedParams;
use crate::input::prepare::PreprocessorParts;
use crate::input::tokenizer::EncodeOptions;
use crate::input::{InputError, InputOptions, ModelInput, Preprocessor, Prompt};
use crate::loader::lora::{Adapter, LoraRegistry};
use crate::loader::model_spec::ModelSpec;
use crate::loader::options::ModelOptions;
use crate::loader::LoadedModel;
use crate::models::batch::TokenizedInput;
use crate::pooling::head_runner::HeadRunner;
use crate::pooling::{PoolingOutput, Task, TaskOutput};
use batch_budget::BatchBudget;
pub use options::{
    default_batch_tokens, EngineOptions, SchedulingPolicy, ServingLimits, DEFAULT_MAX_AUDIO_SECONDS, DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_VIDEO_FRAMES,
};
use scheduler::{BatchLimits, Job, ModelThread};
use std::sync::Arc;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

struct Inner {
    spec: ModelSpec,
    /// The input side: tokenizer workers, chat template, images, input limits.
    input: Preprocessor,
    jobs: mpsc::UnboundedSender<Job>,
    /// `--max-output-floats`: the budget of a request's token-level outputs.
    max_output_floats: usize,
    /// Numbers each `run` call, so that the scheduler can take turns between requests.
    next_request: std::sync::atomic::AtomicU64,
    admission: Arc<Semaphore>,
    max_concurrent_requests: usize,
    /// The token budget of a batch, as the scheduler applies it.
    max_batch_tokens: usize,
    tokenizer_workers: usize,
    /// The LoRA adapters it serves (`--enable-lora`).
    lora: Option<Arc<LoraRegistry>>,
    /// `--scheduling-policy`: whether requests may carry a priority.
    scheduling_policy: SchedulingPolicy,
    /// The model runs on a GPU (a response's `x-compute-type`).
    on_gpu: bool,
    /// `--cache-size`: outputs kept by what decides them.
    cache: Option<cache::OutputCache>,
}

/// A model's engine, as a request reaches it: the base model, or one of its LoRA adapters
/// (the same engine with [`Engine::adapter`] set, from [`Engine::with_adapter`]).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    adapter: Option<Arc<Adapter>>,
    /// The adapter was picked by a request's `task` ([`Engine::with_task`]), not by its
    /// `model`: responses keep the model's name.
    by_task: bool,
}

/// Gives the memory an unloaded model freed back to the system. glibc keeps freed heap memory
/// for reuse, and its mmap threshold grows with the large frees that weights make, so without
/// this an unloaded BERT-base stayed in the RSS (425 MB with MiniLM loaded after it, 126 MB
/// for MiniLM alone).
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns glibc's free pages to the kernel; it touches no live
    // allocation, takes glibc's own locks, and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Engine {
    /// Loads the model and starts its engine (blocking: run it off the async runtime).
    pub fn load(model: &ModelOptions, options: &EngineOptions) -> Result<Self, EngineError> {
        let started = std::time::Instant::now();
        tracing::info!(model = %model.served_name, "loading {}", model.source);
        // Named, not `From`: these are start-time errors, and a request's `?` must never become one.
        let loaded = crate::loader::load(model).map_err(|e| EngineError::Load(Arc::new(e)))?;
        crate::metrics::model_loaded(&model.served_name, started.elapsed());
        tracing::info!(
            model = %model.served_name,
            architecture = %loaded.spec.architecture,
            pooling = ?loaded.spec.pooling,
            max_model_len = loaded.spec.max_model_len,
            embedding_size = loaded.spec.embedding_size,
            dtype = loaded.spec.dtype,
            quantization = ?model.quantization,
            "model loaded in {:.2?}",
            started.elapsed()
        );
        Self::start(loaded, options)
    }

    /// Starts the input workers and the model thread.
    pub fn start(model: LoadedModel, options: &EngineOptions) -> Result<Self, EngineError> {
        let LoadedModel {
            spec,
            backbone,
            tokenizer,
            embedding_head,
            classifier,
            sparse_head,
            m3_head,
            next_token,
            instruction,
            device,
            vision,
            audio,
            retrieval,
            chat_template,
            lora,
            identity,
        } = model;
        let on_gpu = !device.is_cpu();
        let max_batch_tokens = options.max_batch_tokens.unwrap_or_else(|| default_batch_tokens(&device));
        let limits = BatchLimits {
            // An input of max_model_len tokens must always fit in one batch.
            max_tokens: max_batch_tokens.max(spec.max_model_len),
            max_seqs: options.max_num_seqs,
            max_loras: lora.as_ref().map_or(1, |l| l.max_loras),
        };
        if limits.max_tokens > max_batch_tokens {
            tracing::warn!("--max-batch-tokens raised to max_model_len ({})", limits.max_tokens);
        }
        let sides = sides::InputSides::new(vision, audio, retrieval, &tokenizer, (&limits, spec.max_model_len), options)?;
        let pooling = match spec.supports(Task::Embed) {
            true => {
                Some(spec.pooling.method().ok_or_else(|| EngineError::Setup(format!("{:?} pooling is not supported yet", spec.pooling)))?)
            }
            false => None,
        };
        let vocab_size = backbone.vocab_size();
        let chunk_tokens = crate::models::forward_chunk_tokens(&device);
        let threads = |e: std::io::Error| EngineError::Threads(Arc::new(e));
        let solo = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "model-solo".into())
            .build()
            .map_err(|e| threads(std::io::Error::other(e)))?;
        let model_thread = ModelThread {
            backbone,
            heads: HeadRunner { pooling, embedding: embedding_head, classifier, sparse: sparse_head, m3: m3_head, next_token, instruction },
            limits,
            chunk_tokens,
            model: spec.served_name.clone(),
            solo,
            on_cpu: device.is_cpu(),
            vision: sides.vision,
            soft_vision: sides.soft_vision,
            page_vision: sides.page_vision,
            soft_audio: sides.soft_audio,
            // Time-sized batches where the token budget is ours to choose, on the CPU.
            budget: BatchBudget::new((device.is_cpu() && options.max_batch_tokens.is_none()).then_some(batch_budget::LATENCY_BATCH)),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        // Linux keeps 15 bytes of a thread's name: `model-` and the served name's start.
        let thread_name: String = format!("model-{}", spec.served_name.rsplit('/').next().unwrap_or_default()).chars().take(15).collect();
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                // The thread ends when the last engine handle is gone (a model on demand
                // unloaded, or the server stopping); the model's weights are dropped with it.
                model_thread.run(rx);
                return_freed_memory();
            })
            .map_err(threads)?;
        let input = Preprocessor::start(PreprocessorParts {
            tokenizer,
            workers: options.tokenizer_workers,
            chat_template,
            images: sides.images,
            audio: sides.audio,
            vocab_size,
            max_model_len: spec.max_model_len,
            pad_text_to: spec.pad_text_to,
            query_frame: sides.query_frame,
            served_name: spec.served_name.clone(),
        })
        .map_err(threads)?;
        let cache = cache::OutputCache::open(&options.cache, &spec.served_name, &identity)
            .map_err(|e| EngineError::Options(format!("--cache-dir: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                spec,
                input,
                jobs: tx,
                next_request: std::sync::atomic::AtomicU64::new(0),
                max_output_floats: options.max_output_floats,
                admission: Arc::new(Semaphore::new(options.max_concurrent_requests)),
                max_concurrent_requests: options.max_concurrent_requests,
                max_batch_tokens: limits.max_tokens,
                tokenizer_workers: options.tokenizer_workers,
                lora: lora.map(Arc::new),
                on_gpu,
                scheduling_policy: options.scheduling_policy,
                cache,
            }),
            adapter: None,
            by_task: false,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.inner.spec
    }

    /// The name responses carry as `model`: the adapter's, or the served model's (vLLM's
    /// `model_name(lora_request)`).
    pub fn served_name(&self) -> &str {
        match &self.adapter {
            Some(adapter) if !self.by_task => &adapter.name,
            _ => &self.inner.spec.served_name,
        }
    }

    /// The adapters this model serves, with `--enable-lora`.
    pub fn lora(&self) -> Option<&LoraRegistry> {
        self.inner.lora.as_deref()
    }

    /// The adapter requests through this handle run with.
    pub fn adapter(&self) -> Option<&Arc<Adapter>> {
        self.adapter.as_ref()
    }

    /// This model with the adapter `name` it serves, if it does.
    pub fn with_adapter(&self, name: &str) -> Option<Engine> {
        let adapter = self.lora()?.get(name)?;
        Some(Engine { inner: Arc::clone(&self.inner), adapter: Some(adapter), by_task: false })
    }

    /// This model with its built-in task adapter `task` (jina-embeddings-v3's
    /// `retrieval.query`, …), as a request's `task` field asks; the published code's message
    /// when it has no such task.
    pub fn with_task(&self, task: &str) -> Result<Engine, ParamsError> {
        let refused = |message: String| ParamsError::new(message, "task");
        let tasks = self.lora().map_or(&[][..], |r| r.tasks());
        if tasks.is_empty() {
            return Err(refused(format!("`task` selects a task adapter; the model `{}` has none", self.inner.spec.served_name)));
        }
        if self.adapter.is_some() && !self.by_task {
            return Err(refused(format!(
                "`task` selects a task adapter of the base model; `{}` is an adapter already",
                self.served_name()
            )));
        }
        match self.lora().and_then(|r| r.get(task)).filter(|_| tasks.iter().any(|t| t == task)) {
            Some(adapter) => Ok(Engine { inner: Arc::clone(&self.inner), adapter: Some(adapter), by_task: true }),
            None => Err(refused(format!("Unsupported task '{task}'. Supported tasks are: {}.", tasks.join(", ")))),
        }
    }

    /// The model's input side ([`crate::input`]): tokenizer, chat template, images, limits.
    pub fn input(&self) -> &Preprocessor {
        &self.inner.input
    }

    /// The limits this engine serves under, as TEI's `/info` reports them.
    pub fn limits(&self) -> ServingLimits {
        ServingLimits {
            max_concurrent_requests: self.inner.max_concurrent_requests,
            max_batch_tokens: self.inner.max_batch_tokens,
            tokenizer_workers: self.inner.tokenizer_workers,
        }
    }

    /// Whether the engine can serve: its model thread is running (input jobs catch their own
    /// panics, so the input workers cannot die). `/health` answers 503 otherwise, so that an
    /// orchestrator restarts the process.
    pub fn check_alive(&self) -> Result<(), EngineError> {
        if self.inner.jobs.is_closed() {
            return Err(EngineError::Dead("the model thread has stopped"));
        }
        Ok(())
    }

    /// Test hook: ends the model thread, as a fatal error would; `/health` must then say 503.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn stop_model_thread(&self) {
        let (reply, _) = tokio::sync::oneshot::channel();
        let input = ModelInput::Text(TokenizedInput { ids: vec![0], type_ids: vec![0] });
        let params = ResolvedParams::plain(Task::Embed);
        let _ = self.inner.jobs.send(Job {
            request: scheduler::STOP_REQUEST,
            input,
            cost: 1,
            params,
            reply,
            enqueued: std::time::Instant::now(),
            adapter: None,
            classifier: None,
        });
    }

    /// Test hook for [`Preprocessor::panic_in_a_worker`].
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn panic_in_a_tokenizer_worker(&self) -> Result<(), EngineError> {
        Ok(self.inner.input.panic_in_a_worker().await?)
    }

    /// A slot for one request, or `Overloaded` at once when all are taken.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, EngineError> {
        Arc::clone(&self.inner.admission).try_acquire_owned().map_err(|_| EngineError::Overloaded(self.inner.max_concurrent_requests))
    }

    /// How a request's prompts become inputs ([`InputOptions`]), from its validated
    /// parameters and the adapter's prompt: the longest input is `max_embed_len` for embeddings with chunked
    /// processing, else `max_model_len`.
    pub fn input_options(&self, params: &ResolvedParams) -> InputOptions {
        let spec = &self.inner.spec;
        let max_len = match (params.task, spec.chunked_up_to) {
            (Task::Embed, Some(limit)) => limit,
            _ => spec.max_model_len,
        };
        InputOptions {
            encode: EncodeOptions {
                add_special_tokens: params.add_special_tokens,
                truncate_to: params.truncate_to,
                side: params.truncation_side,
                pair_limits: params.pair_limits,
            },
            // A built-in task adapter's instruction, unless the request named a prompt.
            prompt: params.prompt.clone().or_else(|| self.adapter.as_ref().and_then(|a| a.prompt.clone())),
            pad_to_max_length: params.pad_to_max_length,
            max_len,
        }
    }

    /// Text prompts (no images) through the input layer ([`Preprocessor::prepare_texts`]).
    pub async fn prepare(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<Vec<TokenizedInput>, EngineError> {
        params.check_priority(self.inner.scheduling_policy)?;
        Ok(self.inner.input.prepare_texts(prompts, &self.input_options(params)).await?)
    }

    /// Cross-encoder pairs through the input layer ([`Preprocessor::prepare_pairs`]).
    pub async fn prepare_pairs(
        &self,
        queries: &[String],
        documents: &[String],
        pairs: Vec<(usize, usize)>,
        params: &ResolvedParams,
    ) -> Result<Vec<TokenizedInput>, EngineError> {
        Ok(self.inner.input.prepare_pairs(queries, documents, pairs, &self.input_options(params)).await?)
    }

    /// Queues every input and waits for all outputs, in input order. Dropping the returned
    /// future (a client disconnect) withdraws the inputs that have not run yet.
    pub async fn run(&self, inputs: Vec<TokenizedInput>, params: &ResolvedParams) -> Result<Vec<PoolingOutput>, EngineError> {
        self.run_inputs(inputs.into_iter().map(ModelInput::Text).collect(), params).await
    }

    /// [`Self::run`] for texts and images.
    async fn run_inputs(&self, inputs: Vec<ModelInput>, params: &ResolvedParams) -> Result<Vec<PoolingOutput>, EngineError> {
        params.check_priority(self.inner.scheduling_policy)?;
        let submitted = std::time::Instant::now();
        let mut cached = cache::Lookup::new(self.inner.cache.as_ref(), &inputs, params, self.adapter.as_ref().map(|a| a.serial));
        let mut receivers = Vec::with_capacity(inputs.len());
        let request = self.inner.next_request.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let adapter = self.adapter.as_ref().map(|a| Arc::clone(&a.weights));
        let classifier = self.adapter.as_ref().and_then(|a| a.classifier.clone());
        let mut tokens = 0;
        for (index, input) in inputs.into_iter().enumerate() {
            if cached.found(index) {
                continue;
            }
            let (reply, rx) = tokio::sync::oneshot::channel();
            let cost = self.inner.input.cost(&input);
            tokens += cost;
            self.inner
                .jobs
                .send(Job {
                    request,
                    input,
                    cost,
                    params: params.clone(),
                    reply,
                    enqueued: std::time::Instant::now(),
                    adapter: adapter.clone(),
                    classifier: classifier.clone(),
                })
                .map_err(|_| EngineError::Stopped)?;
            receivers.push((index, rx));
        }
        crate::metrics::note(|t| {
            t.tokens.set(t.tokens.get() + tokens);
            t.on_gpu.set(self.inner.on_gpu);
        });
        let (mut slowest, mut first_batch_after) = (scheduler::JobTiming::default(), std::time::Duration::MAX);
        for (index, rx) in receivers {
            let (output, timing) = rx.await.map_err(|_| EngineError::Stopped)??;
            slowest.queue = slowest.queue.max(timing.queue);
            slowest.inference = slowest.inference.max(timing.inference);
            first_batch_after = first_batch_after.min(timing.queue);
            cached.ran(index, output);
        }
        // A request's inputs may run in several batches: report its longest wait and batch.
        crate::metrics::note(|t| {
            t.queue.set(t.queue.get().max(slowest.queue));
            t.inference.set(t.inference.get().max(slowest.inference));
        });
        // Its trace: waiting until its last input's batch began; inference from its first
        // batch's start to its last one's end (neither when no input ran).
        if let Some(inference_started) = submitted.checked_add(first_batch_after) {
            crate::metrics::note_phase("queue", submitted, slowest.queue);
            crate::metrics::note_phase("inference", inference_started, inference_started.elapsed());
        }
        Ok(cached.outputs())
    }

    /// Refuses a token-level request whose outputs (one row per token) would exceed
    /// `--max-output-floats`, before the model runs.
    fn check_output_budget(&self, tokens: usize, params: &ResolvedParams) -> Result<(), EngineError> {
        let spec = &self.inner.spec;
        let width = match params.task {
            Task::TokenEmbed => params.dimensions.unwrap_or(spec.embedding_size.max(1)),
            Task::TokenClassify => spec.labels.len().max(1),
            // BGE-M3's ColBERT vectors asked for with other outputs.
            Task::Embed if params.multi.is_some_and(|m| m.colbert) => spec.embedding_size.max(1),
            _ => return Ok(()),
        };
        let floats = tokens.saturating_mul(width);
        let max = self.inner.max_output_floats;
        if floats > max {
            return Err(EngineError::OutputTooLarge { floats, tokens, width, max });
        }
        Ok(())
    }

    /// Runs one short input end to end so that the first real request pays no first-call
    /// costs (the server's start, and each load of a model on demand).
    pub async fn warm_up(&self) -> Result<(), EngineError> {
        let task = self.spec().tasks.first().copied().unwrap_or(Task::Embed);
        let mut params = params::PoolingParams { truncate_prompt_tokens: Some(-1), ..Default::default() }.verify(task, self.spec())?;
        params.use_cache = false;
        let started = std::time::Instant::now();
        self.encode(vec![Prompt::Text("warm up the model".into())], &params).await?;
        tracing::info!(model = %self.spec().served_name, "warm-up done in {:.2?}", started.elapsed());
        Ok(())
    }

    /// [`Self::encode`] for callers that run one task, whose output has one shape: each
    /// output in that form ([`TaskOutput`]), checked here once.
    pub async fn encode_as<T: TaskOutput>(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<(Vec<T>, usize), EngineError> {
        let (outputs, tokens) = self.encode(prompts, params).await?;
        Ok((typed(outputs, params.task)?, tokens))
    }

    /// [`Self::run`] with typed outputs, as [`Self::encode_as`].
    pub async fn run_as<T: TaskOutput>(&self, inputs: Vec<TokenizedInput>, params: &ResolvedParams) -> Result<Vec<T>, EngineError> {
        typed(self.run(inputs, params).await?, params.task)
    }

    /// The input layer's `prepare`, then `run`; also returns the number of tokens the model
    /// processed (an image counts its tower's sequence). Texts and images of an image-text
    /// model go in one request, embedded by their towers into one space.
    pub async fn encode(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<(Vec<PoolingOutput>, usize), EngineError> {
        let (outputs, usage) = self.encode_counted(prompts, params).await?;
        Ok((outputs, usage.tokens))
    }

    /// [`Self::encode_as`], with the tokens the request's image inputs cost counted apart
    /// (Cohere bills them as `image_tokens`).
    pub async fn encode_as_counted<T: TaskOutput>(
        &self,
        prompts: Vec<Prompt>,
        params: &ResolvedParams,
    ) -> Result<(Vec<T>, Usage), EngineError> {
        let (outputs, usage) = self.encode_counted(prompts, params).await?;
        Ok((typed(outputs, params.task)?, usage))
    }

    /// [`Self::encode`], counting the image inputs' share of the tokens.
    async fn encode_counted(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<(Vec<PoolingOutput>, Usage), EngineError> {
        let has_images = prompts.iter().any(|p| p.media_count() > 0);
        if has_images {
            if prompts.iter().any(|p| p.image_count() > 0) && !self.inner.input.takes_images() {
                return Err(InputError::ImagesUnsupported.into());
            }
            if prompts.iter().any(|p| p.audio_count() > 0) && !self.inner.input.takes_audio() {
                return Err(InputError::AudioUnsupported.into());
            }
            if prompts.iter().any(|p| p.video_count() > 0) && !self.inner.input.takes_video() {
                return Err(InputError::VideoUnsupported.into());
            }
            // A page retriever's images give a vector per token, as its texts do; a
            // vision-language classifier (Qwen3-VL-Reranker) classifies and scores them.
            let served = matches!(params.task, Task::TokenEmbed | Task::Classify | Task::Score) && self.inner.spec.supports(params.task);
            if params.task != Task::Embed && !served {
                return Err(EngineError::Params(ParamsError {
                    message: format!(
                        "images, audio and video can only be embedded (task `embed`); this model does not serve task `{}` on them",
                        params.task.as_str()
                    ),
                    param: None,
                }));
            }
            if let Some(adapter) = &self.adapter {
                return Err(EngineError::Params(ParamsError {
                    message: format!("the LoRA adapter `{}` adapts the text tower; send images and audio to the base model", adapter.name),
                    param: Some("model"),
                }));
            }
        }
        if has_images {
            return self.encode_in_waves(prompts, params).await;
        }
        let inputs = self.inner.input.prepare(prompts, &self.input_options(params)).await?;
        let tokens = inputs.iter().map(|input| self.inner.input.cost(input)).sum();
        self.check_output_budget(tokens, params)?;
        let texts: Vec<TokenizedInput> = inputs
            .into_iter()
            .map(|input| match input {
                ModelInput::Text(tokens) => Ok(tokens),
                ModelInput::Image(_) | ModelInput::ImageSequence(_) => Err(EngineError::Model("an image among texts".into())),
            })
            .collect::<Result<_, _>>()?;
        let max = self.inner.spec.max_model_len;
        let usage = Usage { tokens, image_tokens: 0 };
        if texts.iter().any(|i| i.len() > max) {
            return Ok((self.run_chunked(texts, params).await?, usage));
        }
        Ok((self.run(texts, params).await?, usage))
    }

    /// An image request, a [`Preprocessor::waves`] wave at a time: each wave runs while the
    /// next is decoded, so the request holds at most two waves' crops (one batch's) at once
    /// however many images it has, and decoding overlaps the model's work. Each wave queues
    /// behind the requests already waiting, as a new request would.
    async fn encode_in_waves(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<(Vec<PoolingOutput>, Usage), EngineError> {
        let input = &self.inner.input;
        let options = self.input_options(params);
        let mut waves = input.waves(prompts).await?.into_iter();
        let (mut outputs, mut tokens) = (Vec::new(), Usage::default());
        let mut ready = match waves.next() {
            Some(wave) => input.prepare_wave(wave, &options).await?,
            None => return Ok((outputs, tokens)),
        };
        loop {
            for item in &ready {
                let cost = input.cost(item);
                tokens.tokens += cost;
                if !matches!(item, ModelInput::Text(_)) {
                    tokens.image_tokens += cost;
                }
            }
            let next = waves.next();
            let decode_next = async {
                match next {
                    Some(wave) => Ok(Some(input.prepare_wave(wave, &options).await?)),
                    None => Ok::<_, EngineError>(None),
                }
            };
            let (done, next) = tokio::try_join!(self.run_inputs(ready, params), decode_next)?;
            outputs.extend(done);
            match next {
                Some(inputs) => ready = inputs,
                None => return Ok((outputs, tokens)),
            }
        }
    }

    /// Chunked processing (docs/http-api.md, "Long inputs"): every input is cut into consecutive chunks
    /// of `max_model_len` tokens, all chunks run as ordinary inputs (so they batch with
    /// everything else), and each input's embedding is the token-weighted mean of its chunks'
    /// un-normalized embeddings, then sliced and normalized as requested.
    async fn run_chunked(&self, inputs: Vec<TokenizedInput>, params: &ResolvedParams) -> Result<Vec<PoolingOutput>, EngineError> {
        let max = self.inner.spec.max_model_len;
        let mut chunks = Vec::new();
        let mut owners = Vec::new();
        for (owner, input) in inputs.iter().enumerate() {
            for (ids, types) in input.ids.chunks(max).zip(input.type_ids.chunks(max)) {
                chunks.push(TokenizedInput { ids: ids.to_vec(), type_ids: types.to_vec() });
                owners.push(owner);
            }
        }
        let lengths: Vec<usize> = chunks.iter().map(TokenizedInput::len).collect();
        let raw = ResolvedParams { dimensions: None, activation: false, ..params.clone() };
        let outputs: Vec<Vec<f32>> = self.run_as(chunks, &raw).await?;
        let mut sums: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
        for ((v, owner), len) in outputs.into_iter().zip(owners).zip(lengths) {
            let sum = sums[owner].get_or_insert_with(|| vec![0.0; v.len()]);
            sum.iter_mut().zip(&v).for_each(|(s, x)| *s += x * len as f32);
        }
        inputs
            .iter()
            .zip(sums)
            .map(|(input, sum)| {
                let mut mean = sum.ok_or(EngineError::Stopped)?;
                mean.iter_mut().for_each(|x| *x /= input.len() as f32);
                Ok(PoolingOutput::Vector(crate::pooling::embedding_head::finish_embedding(mean, params.dimensions, params.activation)))
            })
            .collect()
    }
}

/// What a request cost the model: all its inputs' tokens, and the part of them its image
/// inputs took (an image's tower sequence; for a soft-token model, its text sequence and
/// patches, interleaved texts included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub tokens: usize,
    pub image_tokens: usize,
}

/// Each output in the form its caller asked for; a task whose output has another shape is a
/// bug (500), named here.
fn typed<T: TaskOutput>(outputs: Vec<PoolingOutput>, task: Task) -> Result<Vec<T>, EngineError> {
    outputs
        .into_iter()
        .map(|output| {
            T::from_output(output).map_err(|other| {
                EngineError::Model(format!("task {task} gave {} where {} was expected", other.shape(), std::any::type_name::<T>()))
            })
        })
        .collect()
}
