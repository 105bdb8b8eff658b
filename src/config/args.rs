//! The `serve` command line: every flag, its default and its environment variable.

use crate::loader::options::{Convert, DTypeArg, DeviceArg, Quantization, Runner};
use clap::{Args, ValueEnum};

/// `poolserve serve` flags. Each one can also come from the environment variable named in
/// its help (flags win over the environment).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Local model folders or Hugging Face hub ids, each optionally `NAME=MODEL` (the name
    /// clients send as `model`; default: MODEL itself). Several models share the machine.
    #[arg(
        env = "POOLSERVE_MODEL",
        required_unless_present_any = ["config", "models_dir"],
        conflicts_with_all = ["config", "models_dir"],
        value_name = "MODEL"
    )]
    pub models: Vec<String>,
    /// A models file (YAML or JSON): `{"models": [{"name", "model", <per-model options>}]}`,
    /// each option under its flag's snake_case name; flags given here are every entry's defaults.
    #[arg(long, env = "POOLSERVE_CONFIG", conflicts_with = "models_dir")]
    pub config: Option<std::path::PathBuf>,
    /// Serve every model folder in DIR on demand, each under its folder's name: a model loads
    /// at its first request, and unloads by --max-loaded-models and --model-idle-timeout
    /// (llama.cpp's router, Ollama's keep_alive; docs/operations.md "Models on demand").
    #[arg(long, env = "POOLSERVE_MODELS_DIR")]
    pub models_dir: Option<std::path::PathBuf>,
    /// With --models-dir: the most models loaded at once (the least recently used one that no
    /// request is using is unloaded for a newcomer). Default: no limit.
    #[arg(long, env = "POOLSERVE_MAX_LOADED_MODELS", requires = "models_dir")]
    pub max_loaded_models: Option<usize>,
    /// With --models-dir: the weights loaded at once at most, counted as each model's weight
    /// files (least recently used models no request is using are unloaded for a newcomer; a
    /// model larger than this alone cannot load): MiB, or a size with its unit (`8GiB`, `8Gi`,
    /// `500MB`, `512KiB`). Default: no limit.
    #[arg(long, env = "POOLSERVE_MAX_LOADED_MEMORY", requires = "models_dir")]
    pub max_loaded_memory: Option<String>,
    /// With --models-dir: unload a model no request has used for this many seconds.
    #[arg(long, env = "POOLSERVE_MODEL_IDLE_TIMEOUT", requires = "models_dir")]
    pub model_idle_timeout: Option<u64>,
    /// With --models-dir: seconds a request waits for its model to load (or for room to load
    /// it) before 503 with Retry-After.
    #[arg(long, default_value_t = 300, env = "POOLSERVE_MODEL_LOAD_TIMEOUT")]
    pub model_load_timeout: u64,
    /// `pooling`: the model's pooling task. `generate`: a causal LM (Llama, Mistral, Qwen2/3,
    /// Gemma) also loads its LM head and answers vLLM's `/generative_scoring` (no text is
    /// generated).
    #[arg(long, value_enum, default_value = "pooling", env = "POOLSERVE_RUNNER")]
    pub runner: Runner,
    #[arg(long, value_enum, default_value = "auto", env = "POOLSERVE_CONVERT")]
    pub convert: Convert,
    /// JSON object: task, pooling_type, use_activation, dimensions, ... (vLLM's PoolerConfig;
    /// also as `--pooler-config.KEY VALUE`).
    #[arg(long, env = "POOLSERVE_POOLER_CONFIG")]
    pub pooler_config: Option<String>,
    /// JSON object merged into config.json before anything reads it (also as
    /// `--hf-overrides.KEY VALUE`).
    #[arg(long, env = "POOLSERVE_HF_OVERRIDES")]
    pub hf_overrides: Option<String>,
    /// The chat template that renders `messages`: a file, or the Jinja template itself
    /// (default: the model folder's).
    #[arg(long, env = "POOLSERVE_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// How the template reads a message's content: `string` (text parts joined), `openai`
    /// (a list of parts) or `auto` (decided from the template).
    #[arg(long, default_value = "auto", env = "POOLSERVE_CHAT_TEMPLATE_CONTENT_FORMAT")]
    pub chat_template_content_format: String,
    /// Let requests send their own `chat_template` (rendered under the same work limit).
    #[arg(long, env = "POOLSERVE_TRUST_REQUEST_CHAT_TEMPLATE")]
    pub trust_request_chat_template: bool,
    /// vLLM flags that a command line written for vLLM may carry and that change nothing
    /// here (no GPU memory pool, no CUDA graphs, no custom model code): accepted, ignored.
    #[arg(long, hide = true)]
    pub enforce_eager: bool,
    #[arg(long, hide = true)]
    pub trust_remote_code: bool,
    #[arg(long, hide = true)]
    pub gpu_memory_utilization: Option<f64>,
    #[arg(long, hide = true)]
    pub disable_log_requests: bool,
    #[arg(long, hide = true)]
    pub disable_log_stats: bool,
    /// Hub revision (branch, tag or commit) for hub ids.
    #[arg(long, env = "POOLSERVE_REVISION")]
    pub revision: Option<String>,
    /// Hugging Face hub token for gated and private models (TEI's flag). Without it:
    /// `HF_TOKEN`, then `HUGGING_FACE_HUB_TOKEN`, then the token file `$HF_HOME/token`.
    /// `HF_ENDPOINT` points the hub at a mirror or proxy.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub hf_token: Option<String>,
    /// Longest input in tokens; at most the model's own limit.
    #[arg(long, env = "POOLSERVE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Cut inputs over --max-model-len when a request names no truncation (TEI's flag) on the
    /// OpenAI and vLLM routes, which otherwise refuse them with 400 as vLLM does (TEI's,
    /// Cohere's and Ollama's routes cut by default; Cohere's `truncate: NONE` is cut too with
    /// this flag). Not with chunked processing, which embeds long inputs whole.
    #[arg(long, env = "POOLSERVE_AUTO_TRUNCATE")]
    pub auto_truncate: bool,
    /// Name clients send as `model` (default: the MODEL argument); one model only (use
    /// `NAME=MODEL` for several, `name` in a models file).
    #[arg(long, env = "POOLSERVE_SERVED_MODEL_NAME", conflicts_with = "config")]
    pub served_model_name: Option<String>,
    /// Serve every route under this path (Infinity's flag), for ingresses that route by path:
    /// `--url-prefix /embed-svc` answers `/embed-svc/v1/embeddings`, `/embed-svc/health`, …
    /// (gRPC stays at its protocol's paths).
    #[arg(long, env = "POOLSERVE_URL_PREFIX")]
    pub url_prefix: Option<String>,
    /// The path a proxy in front strips before forwarding (vLLM's and FastAPI's
    /// `--root-path`): routes stay where they are; the OpenAPI description names it as its
    /// server, and /docs fetches the description through it.
    #[arg(long, env = "POOLSERVE_ROOT_PATH")]
    pub root_path: Option<String>,
    /// Listen on this Unix socket instead of --host and --port (vLLM's flag; TEI's
    /// `--uds-path`). A socket file left by an earlier run is replaced.
    #[arg(long, alias = "uds-path", env = "POOLSERVE_UDS")]
    pub uds: Option<std::path::PathBuf>,
    #[arg(long, default_value = "0.0.0.0", env = "POOLSERVE_HOST")]
    pub host: String,
    #[arg(long, default_value_t = 8000, env = "POOLSERVE_PORT")]
    pub port: u16,
    #[arg(long, value_enum, default_value = "auto", env = "POOLSERVE_DTYPE")]
    pub dtype: DTypeArg,
    #[arg(long, value_enum, default_value = "cpu", env = "POOLSERVE_DEVICE")]
    pub device: DeviceArg,
    /// Quantize the transformer blocks (off by default; see docs/models.md "Precision").
    #[arg(long, short = 'q', value_enum, env = "POOLSERVE_QUANTIZATION")]
    pub quantization: Option<Quantization>,
    /// Name of the sentence-transformers prompt (config_sentence_transformers.json `prompts`)
    /// applied when a request names none; overrides the folder's `default_prompt_name`.
    #[arg(long, env = "POOLSERVE_DEFAULT_PROMPT_NAME", conflicts_with = "default_prompt")]
    pub default_prompt_name: Option<String>,
    /// Text prepended to every text input when a request names no prompt (instead of a named one).
    #[arg(long, env = "POOLSERVE_DEFAULT_PROMPT")]
    pub default_prompt: Option<String>,
    /// The sentence-transformers Dense module to use instead of the one modules.json lists (TEI's
    /// flag): a folder of the model, e.g. `2_Dense_256` of stella_en_400M_v5, which ships one
    /// `2_Dense_<dims>` per output width. Without modules.json it is the Dense applied after
    /// pooling. A modules.json with several Dense modules is refused with it (TEI ignores it
    /// there, which would silently keep the other width).
    #[arg(long, env = "POOLSERVE_DENSE_PATH")]
    pub dense_path: Option<String>,
    /// vLLM's IO-processor plugin for `/pooling` requests that send `data` (docs/plugins.md):
    /// a folder of `--plugin-path` or an installed entry point, by name. Without it, the model's
    /// config.json key `io_processor_plugin` names one.
    #[arg(long, env = "POOLSERVE_IO_PROCESSOR_PLUGIN")]
    pub io_processor_plugin: Option<String>,
    /// Where plugins are found by name (repeatable; before `POOLSERVE_PLUGIN_PATH` and
    /// `./plugins`).
    #[arg(long = "plugin-path")]
    pub plugin_paths: Vec<std::path::PathBuf>,
    /// The Python that runs plugins.
    #[arg(long, default_value = "python3", env = "POOLSERVE_PLUGIN_PYTHON")]
    pub plugin_python: std::path::PathBuf,
    /// Seconds a plugin may take in one step before its process is stopped (504).
    #[arg(long, default_value_t = 30, env = "POOLSERVE_PLUGIN_TIMEOUT")]
    pub plugin_timeout: u64,
    /// MiB a plugin process may allocate; past it the plugin's allocation fails (500).
    #[arg(long, default_value_t = 2048, env = "POOLSERVE_PLUGIN_MEMORY_LIMIT")]
    pub plugin_memory_limit: u64,
    /// Plugin processes per model at most (requests beyond wait for one).
    #[arg(long, default_value_t = 4, env = "POOLSERVE_PLUGIN_PROCESSES")]
    pub plugin_processes: usize,
    /// Default task description in the Qwen3-Reranker prompt (requests may send `instruction`).
    #[arg(long, env = "POOLSERVE_RERANKER_INSTRUCTION")]
    pub reranker_instruction: Option<String>,
    /// Token budget of one forward pass (sum of the batch's sequence lengths); default 4096 on
    /// the CPU (cache-sized), 16384 on CUDA (TEI's default: larger products fill a GPU).
    /// vLLM's `--max-num-batched-tokens` is the same setting.
    #[arg(long, env = "POOLSERVE_MAX_BATCH_TOKENS", alias = "max-num-batched-tokens")]
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
    /// Require `Authorization: Bearer KEY` on every route but /health, /ping, GET /, /version,
    /// /metrics, /openapi.json and /docs.
    /// Repeat the flag for several keys (any is accepted).
    #[arg(long, env = "POOLSERVE_API_KEY", hide_env_values = true)]
    pub api_key: Vec<String>,
    /// More keys, one a line (blank lines and `#` comments skipped): a mounted secret.
    #[arg(long, env = "POOLSERVE_API_KEY_FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Browsers on these origins may call the API (CORS; vLLM's flag): a JSON list
    /// (`'["https://app.example.com"]'`) or a comma-separated one, `*` for any. Off when not
    /// given (vLLM allows any origin by default; a server not meant for browsers should not).
    #[arg(long, alias = "cors-allow-origin", env = "POOLSERVE_ALLOWED_ORIGINS")]
    pub allowed_origins: Option<String>,
    /// The methods CORS allows (vLLM's flag and default: `*`); with --allowed-origins.
    #[arg(long, env = "POOLSERVE_ALLOWED_METHODS", requires = "allowed_origins")]
    pub allowed_methods: Option<String>,
    /// The request headers CORS allows (vLLM's flag and default: `*`); with --allowed-origins.
    #[arg(long, env = "POOLSERVE_ALLOWED_HEADERS", requires = "allowed_origins")]
    pub allowed_headers: Option<String>,
    /// CORS requests may carry cookies and `Authorization` (vLLM's flag); `*` lists then
    /// answer with the request's own origin, method and headers, as Starlette does.
    #[arg(long, env = "POOLSERVE_ALLOW_CREDENTIALS", requires = "allowed_origins")]
    pub allow_credentials: bool,
    /// Most inputs (texts, token lists, pairs, documents) in one request; more get 400.
    #[arg(long, default_value_t = 1024, env = "POOLSERVE_MAX_CLIENT_BATCH_SIZE")]
    pub max_client_batch_size: usize,
    /// Most floats one request may produce in token-level outputs (token_embed,
    /// token_classify, late-interaction scoring: tokens × width); more get 400 before the
    /// model runs. 2^24 = 64 MiB of f32, about 170 MB of JSON.
    #[arg(long, default_value_t = 1 << 24, env = "POOLSERVE_MAX_OUTPUT_FLOATS")]
    pub max_output_floats: usize,
    /// Largest image decoded, in pixels (width × height); larger ones get 400 from their
    /// header, before decoding (decompression bombs).
    #[arg(long, default_value_t = crate::engine::DEFAULT_MAX_IMAGE_PIXELS, env = "POOLSERVE_MAX_IMAGE_PIXELS")]
    pub max_image_pixels: u64,
    /// Longest audio a file may declare, in seconds; longer ones get 400 from their header,
    /// before decoding. The model hears at most the first 30 s of any audio (its feature
    /// extractor's window), and decoding stops there.
    #[arg(long, default_value_t = crate::engine::DEFAULT_MAX_AUDIO_SECONDS, env = "POOLSERVE_MAX_AUDIO_SECONDS")]
    pub max_audio_seconds: u64,
    /// Most frames a video file may hold, counted in 1080p frames (a 4K frame counts as 4);
    /// more get 400 from the file's sample table, before decoding. Every frame up to the last
    /// one the processor samples is decoded.
    #[arg(long, default_value_t = crate::engine::DEFAULT_MAX_VIDEO_FRAMES, env = "POOLSERVE_MAX_VIDEO_FRAMES")]
    pub max_video_frames: usize,
    /// vLLM's scheduling policy: `fcfs` (arrival order; requests take turns within a batch, and
    /// a request's `priority` must be 0) or `priority` (lower `priority` first, ties in arrival
    /// order).
    #[arg(long, value_enum, default_value = "fcfs", env = "POOLSERVE_SCHEDULING_POLICY")]
    pub scheduling_policy: crate::engine::SchedulingPolicy,
    /// MiB of each model's outputs kept by their token ids and parameters, so that an input
    /// run again skips the model (0, the default: off). See docs/operations.md.
    #[arg(long, default_value_t = 0, env = "POOLSERVE_CACHE_SIZE")]
    pub cache_size: u64,
    /// Keep the cached outputs in this folder too (a file per model), read back at start.
    #[arg(long, env = "POOLSERVE_CACHE_DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Hosts whose http(s) image URLs the server fetches (comma-separated, exact host names;
    /// vLLM's flag). Without it only data URLs are accepted.
    #[arg(long, value_delimiter = ',', env = "POOLSERVE_ALLOWED_MEDIA_DOMAINS")]
    pub allowed_media_domains: Vec<String>,
    /// Seconds an image fetch may take (vLLM's VLLM_IMAGE_FETCH_TIMEOUT default); the fetched
    /// size is bounded by --payload-limit.
    #[arg(long, default_value_t = 5, env = "POOLSERVE_MEDIA_FETCH_TIMEOUT")]
    pub media_fetch_timeout: u64,
    /// Serve HTTPS (HTTP/1.1 and HTTP/2, gRPC included) with this private key (PEM; vLLM's
    /// flag). Needs --ssl-certfile.
    #[arg(long, env = "POOLSERVE_SSL_KEYFILE", requires = "ssl_certfile")]
    pub ssl_keyfile: Option<std::path::PathBuf>,
    /// The server's certificate chain (PEM, the server's first). Needs --ssl-keyfile.
    #[arg(long, env = "POOLSERVE_SSL_CERTFILE", requires = "ssl_keyfile")]
    pub ssl_certfile: Option<std::path::PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to (mutual TLS, with
    /// --ssl-cert-reqs).
    #[arg(long, env = "POOLSERVE_SSL_CA_CERTS", requires = "ssl_certfile")]
    pub ssl_ca_certs: Option<std::path::PathBuf>,
    /// Client certificates, as Python's ssl module numbers it (vLLM's flag): 0 not asked for,
    /// 1 checked when sent (CERT_OPTIONAL), 2 required (CERT_REQUIRED).
    #[arg(long, default_value_t = 0, env = "POOLSERVE_SSL_CERT_REQS")]
    pub ssl_cert_reqs: u8,
    /// Send a trace of every request (a span with tokenize, queue, inference and postprocess
    /// children) to this OpenTelemetry collector, OTLP over gRPC, e.g. `http://collector:4317`
    /// (TEI's flag; vLLM's `--otlp-traces-endpoint` is the same).
    #[arg(long, alias = "otlp-traces-endpoint", env = "POOLSERVE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the traces (TEI's flag).
    #[arg(long, default_value = "poolserve", env = "POOLSERVE_OTLP_SERVICE_NAME")]
    pub otlp_service_name: String,
    /// Seconds that in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30, env = "POOLSERVE_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: u64,
    #[arg(long, value_enum, default_value = "text", env = "POOLSERVE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Serve PEFT LoRA adapters of the models (docs/models.md "LoRA adapters"): a request's `model`
    /// may name an adapter, and sequences of different adapters share a batch.
    #[arg(long, env = "POOLSERVE_ENABLE_LORA")]
    pub enable_lora: bool,
    /// Adapters loaded at start: `NAME=PATH`, or vLLM's JSON
    /// `{"name": …, "path": …, "base_model_name": …}` (the served model it adapts; default the
    /// first). Several values, or the flag repeated.
    #[arg(long, num_args = 1.., value_name = "NAME=PATH")]
    pub lora_modules: Vec<String>,
    /// Most distinct adapters in one forward pass; requests for more wait for the next batch.
    #[arg(long, default_value_t = 1, env = "POOLSERVE_MAX_LORAS")]
    pub max_loras: usize,
    /// Largest adapter rank accepted.
    #[arg(long, default_value_t = 16, env = "POOLSERVE_MAX_LORA_RANK")]
    pub max_lora_rank: usize,
    /// Register `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (behind
    /// --api-key). vLLM's switch, the environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING,
    /// is honoured too.
    #[arg(long, env = "POOLSERVE_ALLOW_RUNTIME_LORA_UPDATING")]
    pub allow_runtime_lora_updating: bool,
}

/// `--log-format`: human-readable lines, or one JSON object per event (log collectors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
