//! The engine: tokenization workers, the batching queue and the model thread, behind one
//! cheap-to-clone [`Engine`] handle. The HTTP layer (and the library API) hand it prompts and
//! validated parameters and get one output per prompt back, in order; it never sees tensors.

pub mod literal;
pub mod params;
pub mod scheduler;
pub mod score;
pub mod tokenize;

use crate::engine::params::ParamsError;
use crate::engine::params::ResolvedParams;
use crate::loader::image::{ImageLimits, ImageProcessorConfig};
use crate::loader::options::ModelOptions;
use crate::loader::spec::ModelSpec;
use crate::loader::tokenizer::{self, EncodeOptions, TextInput};
use crate::loader::LoadedModel;
use crate::models::batch::TokenizedInput;
use crate::pooling::Task;
pub use scheduler::PoolingOutput;
use scheduler::{BatchLimits, Job, JobInput, Runner};
use std::sync::Arc;
use tokenize::TokenizerPool;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// vLLM 0.33's words. A text over the limit reads "at least {max + 1}" there (its
    /// tokenizer stops one token past the limit), so it does here too; `got` keeps the true
    /// length (TEI's routes report it).
    #[error("This model's maximum context length is {max} tokens. However, your prompt contains {} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.", if *from_text { format!("at least {}", max + 1) } else { got.to_string() })]
    InputTooLong { max: usize, got: usize, from_text: bool },
    #[error("Token id {id} is out of vocabulary")]
    InvalidTokenId { id: i64 },
    #[error("The prompt cannot be empty")]
    EmptyPrompt,
    #[error("Input lengths must be either 1:1, 1:N or N:N")]
    InvalidPairing,
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    #[error("The server is at its limit of {0} concurrent requests; retry later")]
    Overloaded(usize),
    #[error("model execution failed: {0}")]
    Model(String),
    #[error("the engine has stopped")]
    Stopped,
    #[error("the engine cannot serve: {0}")]
    Dead(&'static str),
    #[error("This request's output would be {floats} floats ({tokens} tokens × {width}), over the server's limit of {max} (--max-output-floats). Please send fewer or shorter inputs.")]
    OutputTooLarge { floats: usize, tokens: usize, width: usize, max: usize },
    #[error("This model's maximum context length is {max} tokens. However, your prompt contains {bytes} bytes (more than {limit} bytes, which is the upper bound for {max} input tokens). Please reduce the length of the input prompt.")]
    TextTooLong { bytes: usize, limit: usize, max: usize },
    /// An image that cannot be used (undecodable, too large, not an image).
    #[error("{0}")]
    Image(String),
    #[error("This model does not take images: only image-text embedding models (CLIP, SigLIP) embed images")]
    ImagesUnsupported,
    /// A conversation the chat template could not render (the template's reason).
    #[error("{0}")]
    Chat(String),
}

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineStartError {
    #[error(transparent)]
    Load(#[from] crate::loader::LoadError),
    #[error("cannot start the engine's threads: {0}")]
    Threads(#[from] std::io::Error),
}

impl From<crate::loader::tokenizer::TokenizeError> for EngineError {
    fn from(e: crate::loader::tokenizer::TokenizeError) -> Self {
        match e {
            crate::loader::tokenizer::TokenizeError::Failed(message) => EngineError::Tokenizer(message),
            crate::loader::tokenizer::TokenizeError::InvalidPairing => EngineError::InvalidPairing,
        }
    }
}

/// Bytes per token above which a text cannot fit the model (`Engine::max_text_bytes`): real
/// text runs 1–10 bytes per token (CJK about 3, English about 4, indented code up to 10); 32
/// leaves room for any of it while bounding what one request can make the server copy and
/// tokenize.
pub const MAX_BYTES_PER_TOKEN: usize = 32;

/// One input as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// A (query, document) pair for a cross-encoder, tokenized together.
    Pair(String, String),
    /// An encoded image (PNG, JPEG or WebP bytes), for image-text models.
    Image(Vec<u8>),
}

struct Inner {
    spec: ModelSpec,
    tokenizers: TokenizerPool,
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
    vocab_size: usize,
    /// How images become pixel values, for image-text models.
    images: Option<ImageSide>,
    /// How `messages` become text.
    chat_template: Arc<crate::loader::chat_template::ChatTemplate>,
}

/// An image-text model's image preprocessing.
struct ImageSide {
    processor: Arc<ImageProcessorConfig>,
    limits: ImageLimits,
    /// What one image costs in a batch ([`crate::models::VisionTower::tokens_per_image`]).
    tokens_per_image: usize,
}

/// How the engine batches and admits work, whatever the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Token budget of one forward pass; `None`: [`default_batch_tokens`] for the device.
    pub max_batch_tokens: Option<usize>,
    /// Most sequences in one forward pass.
    pub max_num_seqs: usize,
    /// Requests in flight beyond this are refused at once (429).
    pub max_concurrent_requests: usize,
    /// Threads that tokenize.
    pub tokenizer_workers: usize,
    /// Most floats one request may produce in token-level outputs.
    pub max_output_floats: usize,
    /// Largest image (width × height) decoded; larger ones are refused before decoding.
    pub max_image_pixels: u64,
}

impl Default for EngineOptions {
    /// `serve`'s defaults.
    fn default() -> Self {
        EngineOptions {
            max_batch_tokens: None,
            max_num_seqs: 256,
            max_concurrent_requests: 512,
            tokenizer_workers: 1,
            max_output_floats: 1 << 24,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }
}

impl EngineOptions {
    /// The fields that must be positive, by their snake_case names, as a host reports them.
    pub fn check(&self) -> Result<(), String> {
        let fields = [
            ("max_batch_tokens", self.max_batch_tokens.unwrap_or(1)),
            ("max_num_seqs", self.max_num_seqs),
            ("max_concurrent_requests", self.max_concurrent_requests),
            ("tokenizer_workers", self.tokenizer_workers),
            ("max_output_floats", self.max_output_floats),
            ("max_image_pixels", self.max_image_pixels.min(1) as usize),
        ];
        match fields.iter().find(|(_, value)| *value == 0) {
            Some((name, _)) => Err(format!("{name} must be greater than 0")),
            None => Ok(()),
        }
    }
}

/// `--max-image-pixels` by default: a 40-megapixel photo decodes (160 MB as RGBA); a
/// decompression bomb that claims more is refused from its header.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 40_000_000;

/// `--max-batch-tokens` when unset: cache-sized on the CPU (and Metal), TEI's default on CUDA
/// (larger products fill a GPU).
pub fn default_batch_tokens(device: &candle_core::Device) -> usize {
    if device.is_cuda() {
        16_384
    } else {
        4_096
    }
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Loads the model and starts its engine (blocking: run it off the async runtime).
    pub fn load(model: &ModelOptions, options: &EngineOptions) -> Result<Self, EngineStartError> {
        let started = std::time::Instant::now();
        tracing::info!(model = %model.served_name, "loading {}", model.source);
        let loaded = crate::loader::load(model)?;
        crate::metrics::model_loaded(&model.served_name, started.elapsed());
        tracing::info!(
            model = %model.served_name,
            architecture = %loaded.spec.architecture,
            pooling = ?loaded.spec.pooling,
            max_model_len = loaded.spec.max_model_len,
            embedding_size = loaded.spec.embedding_size,
            dtype = ?model.dtype,
            quantization = ?model.quantization,
            "model loaded in {:.2?}",
            started.elapsed()
        );
        Ok(Self::start(loaded, options)?)
    }

    /// Starts the tokenizer workers and the model thread.
    pub fn start(model: LoadedModel, options: &EngineOptions) -> std::io::Result<Self> {
        let LoadedModel { spec, backbone, tokenizer, embedding_head, classifier, sparse_head, device, vision, chat_template } = model;
        let images = vision.as_ref().map(|v| ImageSide {
            processor: Arc::new(v.processor.clone()),
            limits: ImageLimits { max_pixels: options.max_image_pixels },
            tokens_per_image: v.tower.tokens_per_image(),
        });
        let max_batch_tokens = options.max_batch_tokens.unwrap_or_else(|| default_batch_tokens(&device));
        let limits = BatchLimits {
            // An input of max_model_len tokens must always fit in one batch.
            max_tokens: max_batch_tokens.max(spec.max_model_len),
            max_seqs: options.max_num_seqs,
        };
        if limits.max_tokens > max_batch_tokens {
            tracing::warn!("--max-batch-tokens raised to max_model_len ({})", limits.max_tokens);
        }
        let pooling = match spec.supports(Task::Embed) {
            true => Some(spec.pooling.method().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::Unsupported, format!("{:?} pooling is not supported yet", spec.pooling))
            })?),
            false => None,
        };
        let vocab_size = backbone.vocab_size();
        let chunk_tokens = crate::models::forward_chunk_tokens(&device);
        let solo =
            rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "model-solo".into()).build().map_err(std::io::Error::other)?;
        let runner = Runner {
            backbone,
            pooling,
            embedding_head,
            classifier,
            sparse_head,
            limits,
            chunk_tokens,
            model: spec.served_name.clone(),
            solo,
            on_cpu: device.is_cpu(),
            vision: vision.map(|v| v.tower),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        // Linux keeps 15 bytes of a thread's name: `model-` and the served name's start.
        let thread_name: String = format!("model-{}", spec.served_name.rsplit('/').next().unwrap_or_default()).chars().take(15).collect();
        std::thread::Builder::new().name(thread_name).spawn(move || runner.run(rx))?;
        let tokenizers = TokenizerPool::new(Arc::new(tokenizer), options.tokenizer_workers)?;
        Ok(Self {
            inner: Arc::new(Inner {
                spec,
                tokenizers,
                jobs: tx,
                next_request: std::sync::atomic::AtomicU64::new(0),
                max_output_floats: options.max_output_floats,
                admission: Arc::new(Semaphore::new(options.max_concurrent_requests)),
                max_concurrent_requests: options.max_concurrent_requests,
                max_batch_tokens: limits.max_tokens,
                tokenizer_workers: options.tokenizer_workers,
                vocab_size,
                images,
                chat_template: Arc::new(chat_template),
            }),
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.inner.spec
    }

    /// `(max_concurrent_requests, max_batch_tokens, tokenizer_workers)`, as TEI's `/info`
    /// reports them.
    pub fn limits(&self) -> (usize, usize, usize) {
        (self.inner.max_concurrent_requests, self.inner.max_batch_tokens, self.inner.tokenizer_workers)
    }

    /// The size of the model's vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// What one image counts in `usage` (its sequence in the vision tower); 0 for text models.
    pub fn tokens_per_image(&self) -> usize {
        self.inner.images.as_ref().map_or(0, |side| side.tokens_per_image)
    }

    /// Whether the engine can serve: its model thread is running (tokenizer jobs catch their
    /// own panics, so the tokenizer pool cannot die). `/health` answers 503 otherwise, so that
    /// an orchestrator restarts the process.
    pub fn check_alive(&self) -> Result<(), EngineError> {
        if self.inner.jobs.is_closed() {
            return Err(EngineError::Dead("the model thread has stopped"));
        }
        Ok(())
    }

    /// Test hook: ends the model thread, as a fatal error would; `/health` must then say 503.
    #[doc(hidden)]
    pub fn stop_model_thread(&self) {
        let (reply, _) = oneshot::channel();
        let input = JobInput::Text(TokenizedInput { ids: vec![0], type_ids: vec![0] });
        let params = ResolvedParams {
            task: Task::Embed,
            truncate_to: None,
            truncation_side: crate::loader::tokenizer::TruncationSide::Right,
            dimensions: None,
            activation: true,
            add_special_tokens: true,
            pad_to_max_length: false,
            late_chunk: None,
            pair_limits: Default::default(),
            prompt: None,
        };
        let _ = self.inner.jobs.send(Job {
            request: scheduler::STOP_REQUEST,
            input,
            cost: 1,
            params,
            reply,
            enqueued: std::time::Instant::now(),
        });
    }

    /// Test hook for [`TokenizerPool::panic_in_a_worker`].
    #[doc(hidden)]
    pub async fn panic_in_a_tokenizer_worker(&self) -> Result<(), EngineError> {
        self.inner.tokenizers.panic_in_a_worker().await?.into_iter().next().ok_or(EngineError::Stopped)?.map(|_| ())
    }

    pub fn tokenizer(&self) -> &tokenizer::TextTokenizer {
        self.inner.tokenizers.tokenizer()
    }

    /// A slot for one request, or `Overloaded` at once when all are taken.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, EngineError> {
        Arc::clone(&self.inner.admission).try_acquire_owned().map_err(|_| EngineError::Overloaded(self.inner.max_concurrent_requests))
    }

    /// The text of token ids (/detokenize), off the async runtime.
    pub async fn detokenize(&self, ids: Vec<u32>) -> Result<String, EngineError> {
        self.inner.tokenizers.decode(ids, false).await
    }

    /// Each conversation rendered by the chat template into one text, on the worker pool (a
    /// long conversation through a large template is not the async runtime's work).
    /// `template`: a request's own template (the HTTP layer has checked that it may).
    pub async fn render_chat(
        &self,
        conversations: Vec<Vec<serde_json::Value>>,
        options: crate::loader::chat_template::ChatOptions,
        template: Option<String>,
    ) -> Result<Vec<String>, EngineError> {
        let chat = Arc::clone(&self.inner.chat_template);
        self.inner
            .tokenizers
            .execute(move || {
                conversations
                    .iter()
                    .map(|messages| match &template {
                        Some(source) => chat.render_source(source, messages, &options),
                        None => chat.render(messages, &options),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| EngineError::Chat(e.0))
            })
            .await?
    }

    /// The texts of several id lists (TEI's `/decode`), on a blocking thread.
    pub async fn decode_all(&self, ids: Vec<Vec<u32>>, skip_special_tokens: bool) -> Result<Vec<String>, EngineError> {
        let tokenizer = self.inner.tokenizers.shared();
        tokio::task::spawn_blocking(move || ids.iter().map(|i| tokenizer.decode(i, skip_special_tokens)).collect::<Result<Vec<_>, _>>())
            .await
            .map_err(|_| EngineError::Stopped)?
            .map_err(EngineError::from)
    }

    /// TEI's `/tokenize` tokens of each text ([`tokenizer::TextTokenizer::tokens`]), on the
    /// worker pool.
    pub async fn tokens(&self, texts: Vec<String>, add_special_tokens: bool) -> Result<Vec<Vec<tokenizer::TokenInfo>>, EngineError> {
        let tokenizer = self.inner.tokenizers.shared();
        self.inner
            .tokenizers
            .execute(move || texts.iter().map(|t| tokenizer.tokens(t, add_special_tokens)).collect::<Result<Vec<_>, _>>())
            .await?
            .map_err(EngineError::from)
    }

    /// Each token's character range in `text` (late chunking's source ranges), on the worker
    /// pool.
    pub async fn char_offsets(&self, text: String, add_special_tokens: bool) -> Result<Vec<(usize, usize)>, EngineError> {
        let pool = &self.inner.tokenizers;
        let tokenizer = pool.shared();
        pool.execute(move || tokenizer.char_offsets(&text, add_special_tokens)).await?.map_err(EngineError::from)
    }

    /// Tokenizes one text on the worker pool, without length checks (/tokenize).
    pub async fn tokenize(&self, text: String, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        self.inner.tokenizers.encode(vec![TextInput::Single(text)], options).await?.pop().ok_or(EngineError::Stopped)?
    }

    /// Tokenizes (or takes as given) every prompt and checks it against the model's limits.
    pub async fn prepare(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<Vec<TokenizedInput>, EngineError> {
        let started = std::time::Instant::now();
        let inputs = self.tokenize_and_check(prompts, params).await?;
        let elapsed = started.elapsed();
        crate::metrics::tokenized(&self.inner.spec.served_name, elapsed, inputs.iter().map(TokenizedInput::len).sum());
        crate::metrics::note(|t| t.tokenization.set(t.tokenization.get() + elapsed));
        Ok(inputs)
    }

    /// Cross-encoder pairs (`pairs` index `queries` and `documents`), each distinct text
    /// tokenized once, checked against the model's limits like [`Self::prepare`]'s inputs.
    pub async fn prepare_pairs(
        &self,
        queries: &[String],
        documents: &[String],
        pairs: Vec<(usize, usize)>,
        params: &ResolvedParams,
    ) -> Result<Vec<TokenizedInput>, EngineError> {
        let started = std::time::Instant::now();
        let bound = |texts: &[String], side_limit: Option<usize>| {
            texts.iter().map(|t| self.bounded_side(t, params, side_limit).map(|t| t.into_owned())).collect::<Result<Vec<_>, _>>()
        };
        let (queries, documents) = (bound(queries, params.pair_limits.query)?, bound(documents, params.pair_limits.document)?);
        let encoded = self.inner.tokenizers.encode_pairs(queries, documents, pairs, Self::encode_options(params)).await?;
        let inputs = encoded.into_iter().collect::<Result<Vec<_>, _>>()?;
        for input in &inputs {
            self.check_length(input.len(), params, true)?;
        }
        let elapsed = started.elapsed();
        crate::metrics::tokenized(&self.inner.spec.served_name, elapsed, inputs.iter().map(TokenizedInput::len).sum());
        crate::metrics::note(|t| t.tokenization.set(t.tokenization.get() + elapsed));
        Ok(inputs)
    }

    /// Longest text, in bytes, that tokenizing could ever need: [`MAX_BYTES_PER_TOKEN`] per
    /// token of the longest input the model takes (`max_embed_len` with chunked processing).
    pub fn max_text_bytes(&self, params: &ResolvedParams) -> usize {
        let tokens = match (params.task, self.inner.spec.chunked_up_to) {
            (Task::Embed, Some(limit)) => limit,
            _ => self.inner.spec.max_model_len,
        };
        tokens.saturating_mul(MAX_BYTES_PER_TOKEN)
    }

    /// `text`, or its cut to [`Self::max_text_bytes`] when the request truncates (the end the
    /// truncation side drops, at a character boundary), or an error when it does not: no
    /// megabyte text is copied into pairs or tokenized only to be refused afterwards.
    pub fn bounded<'a>(&self, text: &'a str, params: &ResolvedParams) -> Result<std::borrow::Cow<'a, str>, EngineError> {
        self.bounded_side(text, params, None)
    }

    /// [`Self::bounded`] for one side of a cross-encoder pair whose side is cut to
    /// `side_limit` tokens (`max_tokens_per_query` / `_per_doc`): that cut always keeps the
    /// start, so the text is cut from the right to what those tokens could use, whatever the
    /// request's truncation.
    pub fn bounded_side<'a>(
        &self,
        text: &'a str,
        params: &ResolvedParams,
        side_limit: Option<usize>,
    ) -> Result<std::borrow::Cow<'a, str>, EngineError> {
        let limit = self.max_text_bytes(params);
        let side_bytes = side_limit.map(|n| n.saturating_mul(MAX_BYTES_PER_TOKEN));
        if text.len() <= side_bytes.map_or(limit, |s| s.min(limit)) {
            return Ok(std::borrow::Cow::Borrowed(text));
        }
        let keep_start = |bytes: usize| {
            let end = (0..=bytes.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            std::borrow::Cow::Borrowed(&text[..end])
        };
        if let Some(side) = side_bytes {
            return Ok(keep_start(side.min(limit)));
        }
        if params.truncate_to.is_none() {
            return Err(EngineError::TextTooLong { bytes: text.len(), limit, max: self.inner.spec.max_model_len });
        }
        Ok(match params.truncation_side {
            crate::loader::tokenizer::TruncationSide::Right => keep_start(limit),
            crate::loader::tokenizer::TruncationSide::Left => {
                let start = (text.len() - limit..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
                std::borrow::Cow::Borrowed(&text[start..])
            }
        })
    }

    fn encode_options(params: &ResolvedParams) -> EncodeOptions {
        EncodeOptions {
            add_special_tokens: params.add_special_tokens,
            truncate_to: params.truncate_to,
            side: params.truncation_side,
            pair_limits: params.pair_limits,
        }
    }

    async fn tokenize_and_check(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<Vec<TokenizedInput>, EngineError> {
        let options = Self::encode_options(params);
        // A sentence-transformers prompt is prepended to text inputs, as `encode` does.
        let with_prompt = |text: &str| -> Result<String, EngineError> {
            let text = self.bounded(text, params)?;
            Ok(match params.prompt.as_deref() {
                Some(prompt) => format!("{prompt}{text}"),
                None => text.into_owned(),
            })
        };
        let texts: Vec<TextInput> = prompts
            .iter()
            .filter_map(|p| match p {
                Prompt::Text(t) => Some(with_prompt(t).map(TextInput::Single)),
                Prompt::Pair(q, d) => Some(self.bounded_side(q, params, params.pair_limits.query).and_then(|q| {
                    Ok(TextInput::Pair(q.into_owned(), self.bounded_side(d, params, params.pair_limits.document)?.into_owned()))
                })),
                Prompt::Tokens(_) | Prompt::Image(_) => None,
            })
            .collect::<Result<_, _>>()?;
        let mut encoded =
            if texts.is_empty() { Vec::new().into_iter() } else { self.inner.tokenizers.encode(texts, options).await?.into_iter() };
        let mut inputs = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let from_text = !matches!(prompt, Prompt::Tokens(_));
            let input = match prompt {
                Prompt::Text(_) | Prompt::Pair(..) => encoded.next().ok_or(EngineError::Stopped)??,
                Prompt::Tokens(ids) => {
                    if ids.is_empty() {
                        return Err(EngineError::EmptyPrompt);
                    }
                    self.check_token_ids(&ids)?;
                    tokenizer::truncate_ids(ids, options)
                }
                Prompt::Image(_) => return Err(EngineError::Model("an image reached the tokenizer".into())),
            };
            let input = self.padded(input, params)?;
            self.check_length(input.len(), params, from_text)?;
            inputs.push(input);
        }
        Ok(inputs)
    }

    /// Token ids the model can embed: vLLM names the largest id past the vocabulary.
    pub fn check_token_ids(&self, ids: &[u32]) -> Result<(), EngineError> {
        match ids.iter().max() {
            Some(&id) if id as usize >= self.inner.vocab_size => Err(EngineError::InvalidTokenId { id: id as i64 }),
            _ => Ok(()),
        }
    }

    /// `input` padded with the tokenizer's pad token: to `max_model_len` when the request asks
    /// for `padding: "max_length"` (vLLM pads after truncating, before the length check), or
    /// to the model's fixed text length for models trained so (SigLIP).
    fn padded(&self, mut input: TokenizedInput, params: &ResolvedParams) -> Result<TokenizedInput, EngineError> {
        let target = match (params.pad_to_max_length, self.inner.spec.pad_text_to) {
            (true, _) => {
                let pad = self.tokenizer().pad_id().ok_or_else(|| {
                    EngineError::Params(ParamsError::new(
                        "padding: \"max_length\" needs a pad token, and this model's tokenizer has none",
                        "padding",
                    ))
                })?;
                Some((self.inner.spec.max_model_len, pad))
            }
            (false, fixed) => fixed,
        };
        if let Some((len, pad)) = target {
            if input.len() < len {
                input.type_ids.resize(len, 0);
                input.ids.resize(len, pad);
            }
        }
        Ok(input)
    }

    /// Decodes and preprocesses images on the tokenizer workers (as texts are tokenized
    /// there), into the pixel values the vision tower takes.
    pub async fn prepare_images(&self, images: Vec<Vec<u8>>) -> Result<Vec<Vec<f32>>, EngineError> {
        let side = self.inner.images.as_ref().ok_or(EngineError::ImagesUnsupported)?;
        let started = std::time::Instant::now();
        let (processor, limits) = (Arc::clone(&side.processor), side.limits);
        let pixels = self
            .inner
            .tokenizers
            .execute(move || {
                images
                    .iter()
                    .enumerate()
                    .map(|(i, bytes)| {
                        crate::loader::image::preprocess(bytes, &processor, &limits)
                            .map(|p| p.data)
                            .map_err(|e| EngineError::Image(if images.len() > 1 { format!("image {i}: {e}") } else { e.to_string() }))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await??;
        crate::metrics::note(|t| t.tokenization.set(t.tokenization.get() + started.elapsed()));
        Ok(pixels)
    }

    /// [`Self::encode`] for a request holding images: texts and images in one request,
    /// embedded by their towers into one space, outputs in input order.
    async fn encode_with_images(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<(Vec<PoolingOutput>, usize), EngineError> {
        let side = self.inner.images.as_ref().ok_or(EngineError::ImagesUnsupported)?;
        if params.task != Task::Embed {
            return Err(EngineError::Params(ParamsError { message: "images can only be embedded (task `embed`)".into(), param: None }));
        }
        let mut texts = Vec::new();
        let mut images = Vec::new();
        let mut is_image = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            is_image.push(matches!(prompt, Prompt::Image(_)));
            match prompt {
                Prompt::Image(bytes) => images.push(bytes),
                other => texts.push(other),
            }
        }
        let image_count = images.len();
        let pixels = self.prepare_images(images).await?;
        let texts = if texts.is_empty() { Vec::new() } else { self.prepare(texts, params).await? };
        let mut tokens: usize = texts.iter().map(TokenizedInput::len).sum();
        tokens += image_count * side.tokens_per_image;
        let (mut texts, mut pixels) = (texts.into_iter(), pixels.into_iter());
        let inputs = is_image
            .into_iter()
            .map(|image| {
                let next = if image { pixels.next().map(JobInput::Image) } else { texts.next().map(JobInput::Text) };
                next.ok_or(EngineError::Stopped)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((self.run_inputs(inputs, params).await?, tokens))
    }

    /// The input's length against the model's limit (`max_embed_len` for chunked embeddings).
    /// `from_text`: the input was tokenized from text, whose excess vLLM reports as "at least
    /// {limit + 1}" (see [`EngineError::InputTooLong`]).
    fn check_length(&self, len: usize, params: &ResolvedParams, from_text: bool) -> Result<(), EngineError> {
        let max = match (params.task, self.inner.spec.chunked_up_to) {
            (Task::Embed, Some(limit)) => limit,
            _ => self.inner.spec.max_model_len,
        };
        if len > max {
            return Err(EngineError::InputTooLong { max, got: len, from_text });
        }
        if len == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        Ok(())
    }

    /// Queues every input and waits for all outputs, in input order. Dropping the returned
    /// future (a client disconnect) withdraws the inputs that have not run yet.
    pub async fn run(&self, inputs: Vec<TokenizedInput>, params: &ResolvedParams) -> Result<Vec<PoolingOutput>, EngineError> {
        self.run_inputs(inputs.into_iter().map(JobInput::Text).collect(), params).await
    }

    /// [`Self::run`] for texts and images.
    async fn run_inputs(&self, inputs: Vec<JobInput>, params: &ResolvedParams) -> Result<Vec<PoolingOutput>, EngineError> {
        let mut receivers = Vec::with_capacity(inputs.len());
        let request = self.inner.next_request.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let image_cost = self.inner.images.as_ref().map_or(1, |side| side.tokens_per_image);
        for input in inputs {
            let (reply, rx) = oneshot::channel();
            let cost = match &input {
                JobInput::Text(t) => t.len(),
                JobInput::Image(_) => image_cost,
            };
            self.inner
                .jobs
                .send(Job { request, input, cost, params: params.clone(), reply, enqueued: std::time::Instant::now() })
                .map_err(|_| EngineError::Stopped)?;
            receivers.push(rx);
        }
        let mut outputs = Vec::with_capacity(receivers.len());
        let mut slowest = scheduler::JobTiming::default();
        for rx in receivers {
            let (output, timing) = rx.await.map_err(|_| EngineError::Stopped)??;
            slowest.queue = slowest.queue.max(timing.queue);
            slowest.inference = slowest.inference.max(timing.inference);
            outputs.push(output);
        }
        // A request's inputs may run in several batches: report its longest wait and batch.
        crate::metrics::note(|t| {
            t.queue.set(t.queue.get().max(slowest.queue));
            t.inference.set(t.inference.get().max(slowest.inference));
        });
        Ok(outputs)
    }

    /// Refuses a token-level request whose outputs (one row per token) would exceed
    /// `--max-output-floats`, before the model runs.
    fn check_output_budget(&self, tokens: usize, params: &ResolvedParams) -> Result<(), EngineError> {
        let spec = &self.inner.spec;
        let width = match params.task {
            Task::TokenEmbed => params.dimensions.unwrap_or(spec.embedding_size.max(1)),
            Task::TokenClassify => spec.labels.len().max(1),
            _ => return Ok(()),
        };
        let floats = tokens.saturating_mul(width);
        let max = self.inner.max_output_floats;
        if floats > max {
            return Err(EngineError::OutputTooLarge { floats, tokens, width, max });
        }
        Ok(())
    }

    /// `prepare` then `run`; also returns the number of tokens the model processed.
    pub async fn encode(&self, prompts: Vec<Prompt>, params: &ResolvedParams) -> Result<(Vec<PoolingOutput>, usize), EngineError> {
        if prompts.iter().any(|p| matches!(p, Prompt::Image(_))) {
            return self.encode_with_images(prompts, params).await;
        }
        let inputs = self.prepare(prompts, params).await?;
        let tokens = inputs.iter().map(TokenizedInput::len).sum();
        self.check_output_budget(tokens, params)?;
        let max = self.inner.spec.max_model_len;
        if inputs.iter().any(|i| i.len() > max) {
            return Ok((self.run_chunked(inputs, params).await?, tokens));
        }
        Ok((self.run(inputs, params).await?, tokens))
    }

    /// Chunked processing (api.md, "Long inputs"): every input is cut into consecutive chunks
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
        let outputs = self.run(chunks, &raw).await?;
        let mut sums: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
        for ((output, owner), len) in outputs.into_iter().zip(owners).zip(lengths) {
            let PoolingOutput::Vector(v) = output else {
                return Err(EngineError::Model("chunked processing applies to embeddings only".into()));
            };
            let sum = sums[owner].get_or_insert_with(|| vec![0.0; v.len()]);
            sum.iter_mut().zip(&v).for_each(|(s, x)| *s += x * len as f32);
        }
        inputs
            .iter()
            .zip(sums)
            .map(|(input, sum)| {
                let mut mean = sum.ok_or(EngineError::Stopped)?;
                mean.iter_mut().for_each(|x| *x /= input.len() as f32);
                Ok(PoolingOutput::Vector(crate::pooling::head::finish_embedding(mean, params.dimensions, params.activation)))
            })
            .collect()
    }
}
