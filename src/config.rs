//! The CLI layer's configuration: the `serve` command line (every flag also an environment
//! variable), turned once into a [`ServerConfig`]: the model's [`ModelOptions`] (loader), the
//! engine's [`EngineOptions`], and the HTTP server's own settings.

use crate::engine::EngineOptions;
use crate::loader::lora::{LoraModule, LoraOptions};
use crate::loader::options::{Convert, DTypeArg, DeviceArg, ModelOptions, Quantization};
use crate::pooling::config::PoolerConfig;
use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Runner {
    Pooling,
}

/// `poolserve serve` flags. Each one can also come from the environment variable named in
/// its help (flags win over the environment).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Local model folders or Hugging Face hub ids, each optionally `NAME=MODEL` (the name
    /// clients send as `model`; default: MODEL itself). Several models share the machine.
    #[arg(env = "POOLSERVE_MODEL", required_unless_present = "config", conflicts_with = "config", value_name = "MODEL")]
    pub models: Vec<String>,
    /// A models file (YAML or JSON): `{"models": [{"name", "model", <per-model options>}]}`,
    /// each option under its flag's snake_case name; flags given here are every entry's defaults.
    #[arg(long, env = "POOLSERVE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Only `pooling` is served.
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
    /// Longest input in tokens; at most the model's own limit.
    #[arg(long, env = "POOLSERVE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Name clients send as `model` (default: the MODEL argument); one model only (use
    /// `NAME=MODEL` for several, `name` in a models file).
    #[arg(long, env = "POOLSERVE_SERVED_MODEL_NAME", conflicts_with = "config")]
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
    /// Largest image decoded, in pixels (width × height); larger ones get 400 from their
    /// header, before decoding (decompression bombs).
    #[arg(long, default_value_t = crate::engine::DEFAULT_MAX_IMAGE_PIXELS, env = "POOLSERVE_MAX_IMAGE_PIXELS")]
    pub max_image_pixels: u64,
    /// Hosts whose http(s) image URLs the server fetches (comma-separated, exact host names;
    /// vLLM's flag). Without it only data URLs are accepted.
    #[arg(long, value_delimiter = ',', env = "POOLSERVE_ALLOWED_MEDIA_DOMAINS")]
    pub allowed_media_domains: Vec<String>,
    /// Seconds an image fetch may take (vLLM's VLLM_IMAGE_FETCH_TIMEOUT default); the fetched
    /// size is bounded by --payload-limit.
    #[arg(long, default_value_t = 5, env = "POOLSERVE_MEDIA_FETCH_TIMEOUT")]
    pub media_fetch_timeout: u64,
    /// Seconds that in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30, env = "POOLSERVE_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: u64,
    #[arg(long, value_enum, default_value = "text", env = "POOLSERVE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Serve PEFT LoRA adapters of the models (README "LoRA adapters"): a request's `model`
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

/// Everything the server needs, validated.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The models served, in the order given; names are unique.
    pub models: Vec<ModelOptions>,
    pub engine: EngineOptions,
    pub host: String,
    pub port: u16,
    pub payload_limit: usize,
    pub api_key: Option<String>,
    pub max_client_batch_size: usize,
    /// `--trust-request-chat-template`: requests may bring their own chat template.
    pub trust_request_chat_template: bool,
    pub shutdown_timeout: std::time::Duration,
    pub log_format: LogFormat,
    /// Hosts whose image URLs are fetched, and the fetch's time limit.
    pub allowed_media_domains: Vec<String>,
    pub media_fetch_timeout: std::time::Duration,
    /// `--allow-runtime-lora-updating`: the adapter load/unload routes exist.
    pub allow_runtime_lora_updating: bool,
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

/// The command line's models: `MODEL` or `NAME=MODEL` each, with the flags' options.
fn named_models(models: &[String], served_model_name: Option<&str>, defaults: &ModelOptions) -> Result<Vec<ModelOptions>, ConfigError> {
    if models.len() > 1 && served_model_name.is_some() {
        return Err(ConfigError("--served-model-name names one model; name several with NAME=MODEL".into()));
    }
    let mut out = Vec::with_capacity(models.len());
    for entry in models {
        // `NAME=MODEL`, unless the whole entry is an existing path or what precedes `=` holds a
        // `/` (a folder such as `runs/lr=2e-5` or a hub id): such a MODEL stays whole.
        let split = entry.split_once('=').filter(|(name, _)| !name.contains('/') && !std::path::Path::new(entry).exists());
        let (name, source) = match split {
            Some((name, source)) if !name.is_empty() && !source.is_empty() => {
                if served_model_name.is_some() {
                    return Err(ConfigError(format!("`{entry}` is named already; drop --served-model-name")));
                }
                (name.to_string(), source.to_string())
            }
            Some(_) => return Err(ConfigError(format!("`{entry}`: expected MODEL or NAME=MODEL"))),
            None => (served_model_name.unwrap_or(entry).to_string(), entry.clone()),
        };
        out.push(ModelOptions { served_name: name, source, ..defaults.clone() });
    }
    unique_names(&out)?;
    Ok(out)
}

/// Two models under one name could never both be reached.
fn unique_names(models: &[ModelOptions]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    match models.iter().find(|m| !seen.insert(m.served_name.as_str())) {
        Some(m) => Err(ConfigError(format!("two models are named `{}`; give each a NAME=MODEL of its own", m.served_name))),
        None if models.is_empty() => Err(ConfigError("no model to serve".into())),
        None => Ok(()),
    }
}

/// `--lora-modules`: each adapter to the model its `base_model_name` names (the first model
/// without one), which must serve adapters.
fn assign_lora_modules(models: &mut [ModelOptions], items: &[String]) -> Result<(), ConfigError> {
    for item in items.iter().filter(|i| !i.trim().is_empty()) {
        let module: LoraModule = item.parse().map_err(ConfigError)?;
        let model = match &module.base_model_name {
            Some(base) => models
                .iter_mut()
                .find(|m| &m.served_name == base)
                .ok_or_else(|| ConfigError(format!("--lora-modules `{}`: base_model_name `{base}` is not a served model", module.name)))?,
            None => models.first_mut().ok_or_else(|| ConfigError("no model to serve".into()))?,
        };
        let served_name = model.served_name.clone();
        let lora = model.lora.as_mut().ok_or_else(|| {
            ConfigError(format!("--lora-modules `{}`: model `{served_name}` does not serve adapters (--enable-lora)", module.name))
        })?;
        lora.modules.push(module);
    }
    // An adapter's name is a `model` of its own: unique among models and adapters.
    let mut seen: std::collections::HashSet<&str> = models.iter().map(|m| m.served_name.as_str()).collect();
    for module in models.iter().filter_map(|m| m.lora.as_ref()).flat_map(|l| &l.modules) {
        if !seen.insert(module.name.as_str()) {
            return Err(ConfigError(format!("the LoRA adapter `{}` has the name of another model or adapter", module.name)));
        }
    }
    Ok(())
}

/// A command line written for vLLM, as clap reads ours: flag names with underscores
/// (`--hf_overrides`) take dashes, and vLLM's dotted JSON flags (`--pooler-config.task
/// token_embed`, `--hf-overrides.a.b 1`) become one JSON object per flag, merged over the
/// flag's own JSON when it is given too. A dotted value is read as JSON, else as a string.
pub fn vllm_style_args(args: Vec<String>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::with_capacity(args.len());
    let mut dotted: Vec<(String, serde_json::Map<String, serde_json::Value>)> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--").filter(|f| !f.is_empty()) else {
            out.push(arg);
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name.replace('_', "-"), Some(value.to_string())),
            None => (flag.replace('_', "-"), None),
        };
        let Some((base, path)) = name.split_once('.') else {
            out.push(match inline {
                Some(value) => format!("--{name}={value}"),
                None => format!("--{name}"),
            });
            continue;
        };
        let value = match inline {
            Some(value) => value,
            None => args.next().ok_or_else(|| format!("--{name} needs a value"))?,
        };
        let value = serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value));
        let object = match dotted.iter_mut().find(|(flag, _)| *flag == base) {
            Some((_, object)) => object,
            None => {
                dotted.push((base.to_string(), serde_json::Map::new()));
                &mut dotted.last_mut().expect("just pushed").1
            }
        };
        let keys: Vec<&str> = path.split('.').collect();
        insert_path(object, &keys, value);
    }
    for (flag, object) in dotted {
        // Merged over the flag's own JSON, which then leaves the command line.
        let long = format!("--{flag}");
        let position = out.iter().position(|a| *a == long || a.starts_with(&format!("{long}=")));
        let mut merged = match position {
            Some(i) => {
                let own = match out[i].split_once('=') {
                    Some((_, value)) => value.to_string(),
                    None => out.get(i + 1).cloned().ok_or_else(|| format!("{long} needs a value"))?,
                };
                let taken = if out[i].contains('=') { 1 } else { 2 };
                out.drain(i..i + taken);
                match serde_json::from_str(&own) {
                    Ok(serde_json::Value::Object(map)) => map,
                    _ => return Err(format!("{long} must be a JSON object to take {long}.KEY values")),
                }
            }
            None => serde_json::Map::new(),
        };
        merge(&mut merged, object);
        out.push(long);
        out.push(serde_json::Value::Object(merged).to_string());
    }
    Ok(out)
}

fn insert_path(object: &mut serde_json::Map<String, serde_json::Value>, keys: &[&str], value: serde_json::Value) {
    match keys {
        [] => {}
        [last] => {
            object.insert(last.to_string(), value);
        }
        [first, rest @ ..] => {
            let entry = object.entry(first.to_string()).or_insert_with(|| serde_json::Value::Object(Default::default()));
            if !entry.is_object() {
                *entry = serde_json::Value::Object(Default::default());
            }
            if let serde_json::Value::Object(inner) = entry {
                insert_path(inner, rest, value);
            }
        }
    }
}

fn merge(base: &mut serde_json::Map<String, serde_json::Value>, over: serde_json::Map<String, serde_json::Value>) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(serde_json::Value::Object(inner)), serde_json::Value::Object(more)) => merge(inner, more),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// `--chat-template-content-format`: `auto` (`None`) or a fixed format.
fn content_format(value: &str) -> Result<Option<crate::input::chat_template::ContentFormat>, String> {
    match value {
        "auto" => Ok(None),
        other => other.parse().map(Some).map_err(|e| format!("--chat-template-content-format: {e}")),
    }
}

/// `--config FILE`: the models file. One schema, in YAML or JSON (JSON is read as YAML, of
/// which it is a subset): `models`, a list of entries with `model` (folder or hub id), an
/// optional `name`, and any per-model serve option under its flag's snake_case name. An
/// entry's option replaces the flag's value (objects such as `pooler_config` are not merged).
mod models_file {
    use super::{unique_names, ConfigError};
    use crate::loader::lora::{LoraModule, LoraOptions};
    use crate::loader::options::{Convert, DTypeArg, DeviceArg, ModelOptions, Quantization};
    use crate::pooling::config::PoolerConfig;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ModelsFile {
        models: Vec<Entry>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        name: Option<String>,
        model: String,
        revision: Option<String>,
        convert: Option<Convert>,
        pooler_config: Option<PoolerConfig>,
        hf_overrides: Option<serde_json::Map<String, serde_json::Value>>,
        max_model_len: Option<usize>,
        device: Option<DeviceArg>,
        dtype: Option<DTypeArg>,
        quantization: Option<Quantization>,
        default_prompt_name: Option<String>,
        default_prompt: Option<String>,
        reranker_instruction: Option<String>,
        chat_template: Option<String>,
        chat_template_content_format: Option<String>,
        enable_lora: Option<bool>,
        lora_modules: Option<Vec<LoraEntry>>,
        max_loras: Option<usize>,
        max_lora_rank: Option<usize>,
    }

    /// A `lora_modules` item: `NAME=PATH`, or the object form.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum LoraEntry {
        Text(String),
        Object(LoraModule),
    }

    /// The entry's adapters: its own switch and limits over the flags'.
    fn lora_of(e: &mut Entry, defaults: Option<LoraOptions>) -> Result<Option<LoraOptions>, String> {
        let enabled = e.enable_lora.unwrap_or(defaults.is_some() || e.lora_modules.is_some());
        if !enabled {
            return match e.lora_modules {
                Some(_) => Err("lora_modules needs enable_lora".into()),
                None => Ok(None),
            };
        }
        let mut lora = defaults.unwrap_or_default();
        lora.max_loras = e.max_loras.unwrap_or(lora.max_loras);
        lora.max_lora_rank = e.max_lora_rank.unwrap_or(lora.max_lora_rank);
        for item in e.lora_modules.take().unwrap_or_default() {
            lora.modules.push(match item {
                LoraEntry::Text(text) => text.parse()?,
                LoraEntry::Object(module) => module,
            });
        }
        if lora.max_loras == 0 || lora.max_lora_rank == 0 {
            return Err("max_loras and max_lora_rank must be greater than 0".into());
        }
        Ok(Some(lora))
    }

    pub(super) fn read(path: &std::path::Path, defaults: &ModelOptions) -> Result<Vec<ModelOptions>, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("--config {}: {e}", path.display())))?;
        parse(&text, defaults).map_err(|e| ConfigError(format!("--config {}: {e}", path.display())))
    }

    pub(super) fn parse(text: &str, defaults: &ModelOptions) -> Result<Vec<ModelOptions>, String> {
        let file: ModelsFile = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        if let Some(e) = file.models.iter().find(|e| e.default_prompt_name.is_some() && e.default_prompt.is_some()) {
            return Err(format!(
                "model `{}`: default_prompt_name and default_prompt exclude each other",
                e.name.as_deref().unwrap_or(&e.model)
            ));
        }
        let models: Vec<ModelOptions> = file
            .models
            .into_iter()
            .map(|mut e| -> Result<ModelOptions, String> {
                let d = defaults.clone();
                let lora =
                    lora_of(&mut e, d.lora.clone()).map_err(|m| format!("model `{}`: {m}", e.name.as_deref().unwrap_or(&e.model)))?;
                // An entry that sets a default prompt sets it alone: the flags' prompt defaults
                // do not mix with it (one would silently win).
                let (default_prompt_name, default_prompt) = if e.default_prompt_name.is_some() || e.default_prompt.is_some() {
                    (e.default_prompt_name, e.default_prompt)
                } else {
                    (d.default_prompt_name, d.default_prompt)
                };
                Ok(ModelOptions {
                    served_name: e.name.unwrap_or_else(|| e.model.clone()),
                    source: e.model,
                    revision: e.revision.or(d.revision),
                    convert: e.convert.unwrap_or(d.convert),
                    pooler: e.pooler_config.unwrap_or(d.pooler),
                    hf_overrides: e.hf_overrides.unwrap_or(d.hf_overrides),
                    max_model_len: e.max_model_len.or(d.max_model_len),
                    device: e.device.unwrap_or(d.device),
                    dtype: e.dtype.unwrap_or(d.dtype),
                    quantization: e.quantization.or(d.quantization),
                    reranker_instruction: e.reranker_instruction.or(d.reranker_instruction),
                    default_prompt_name,
                    default_prompt,
                    chat_template: e.chat_template.or(d.chat_template),
                    chat_template_content_format: match e.chat_template_content_format {
                        Some(format) => super::content_format(&format)?,
                        None => d.chat_template_content_format,
                    },
                    lora,
                })
            })
            .collect::<Result<_, String>>()?;
        unique_names(&models).map_err(|e| e.to_string())?;
        Ok(models)
    }
}

impl TryFrom<ServeArgs> for ServerConfig {
    type Error = ConfigError;

    fn try_from(args: ServeArgs) -> Result<Self, ConfigError> {
        let pooler: PoolerConfig = match &args.pooler_config {
            Some(json) => serde_json::from_str(json).map_err(|e| ConfigError(format!("--pooler-config: {e}")))?,
            None => PoolerConfig::default(),
        };
        let hf_overrides = match &args.hf_overrides {
            Some(json) => match serde_json::from_str(json) {
                Ok(serde_json::Value::Object(map)) => map,
                Ok(_) => return Err(ConfigError("--hf-overrides must be a JSON object".into())),
                Err(e) => return Err(ConfigError(format!("--hf-overrides: {e}"))),
            },
            None => Default::default(),
        };
        let defaults = ModelOptions {
            served_name: String::new(),
            source: String::new(),
            revision: args.revision,
            convert: args.convert,
            pooler,
            hf_overrides,
            max_model_len: args.max_model_len,
            device: args.device,
            dtype: args.dtype,
            quantization: args.quantization,
            reranker_instruction: args.reranker_instruction,
            default_prompt_name: args.default_prompt_name,
            default_prompt: args.default_prompt,
            chat_template: args.chat_template,
            chat_template_content_format: content_format(&args.chat_template_content_format).map_err(ConfigError)?,
            lora: args.enable_lora.then(|| LoraOptions {
                modules: Vec::new(),
                max_loras: args.max_loras,
                max_lora_rank: args.max_lora_rank,
            }),
        };
        let mut models = match &args.config {
            Some(path) => models_file::read(path, &defaults)?,
            None => named_models(&args.models, args.served_model_name.as_deref(), &defaults)?,
        };
        assign_lora_modules(&mut models, &args.lora_modules)?;
        for model in &models {
            model.check().map_err(|e| ConfigError(if models.len() > 1 { format!("model `{}`: {e}", model.served_name) } else { e }))?;
        }
        if let Some(n) = args.max_batch_tokens {
            positive("max-batch-tokens", n)?;
        }
        let engine = EngineOptions {
            max_batch_tokens: args.max_batch_tokens,
            max_num_seqs: positive("max-num-seqs", args.max_num_seqs)?,
            max_concurrent_requests: positive("max-concurrent-requests", args.max_concurrent_requests)?,
            tokenizer_workers: positive("tokenizer-workers", args.tokenizer_workers)?,
            max_output_floats: positive("max-output-floats", args.max_output_floats)?,
            max_image_pixels: positive("max-image-pixels", args.max_image_pixels as usize)? as u64,
        };
        if args.enable_lora {
            positive("max-loras", args.max_loras)?;
            positive("max-lora-rank", args.max_lora_rank)?;
        }
        Ok(ServerConfig {
            models,
            engine,
            host: args.host,
            port: args.port,
            payload_limit: positive("payload-limit", args.payload_limit)?,
            api_key: match args.api_key {
                Some(key) if key.is_empty() => return Err(ConfigError("--api-key must not be empty".into())),
                key => key,
            },
            max_client_batch_size: positive("max-client-batch-size", args.max_client_batch_size)?,
            trust_request_chat_template: args.trust_request_chat_template,
            shutdown_timeout: std::time::Duration::from_secs(args.shutdown_timeout),
            log_format: args.log_format,
            allowed_media_domains: args
                .allowed_media_domains
                .iter()
                .map(|d| d.trim().to_ascii_lowercase())
                .filter(|d| !d.is_empty())
                .collect(),
            media_fetch_timeout: std::time::Duration::from_secs(positive("media-fetch-timeout", args.media_fetch_timeout as usize)? as u64),
            allow_runtime_lora_updating: args.allow_runtime_lora_updating || vllm_runtime_lora_updating(),
        })
    }
}

impl ServerConfig {
    /// `serve`'s defaults for a model folder (tests and the library API). Written out rather
    /// than parsed by clap, which would read the process's `POOLSERVE_*` variables (and exit
    /// the host process on a malformed one); a test keeps them equal to the flags' defaults.
    pub fn for_model(model: impl Into<String>) -> Self {
        ServerConfig {
            models: vec![ModelOptions::for_model(model)],
            engine: EngineOptions::default(),
            host: "0.0.0.0".into(),
            port: 8000,
            payload_limit: 2_000_000,
            api_key: None,
            max_client_batch_size: 1024,
            trust_request_chat_template: false,
            shutdown_timeout: std::time::Duration::from_secs(30),
            log_format: LogFormat::Text,
            allowed_media_domains: Vec::new(),
            media_fetch_timeout: std::time::Duration::from_secs(5),
            allow_runtime_lora_updating: false,
        }
    }
}

/// vLLM's switch for the adapter routes: `VLLM_ALLOW_RUNTIME_LORA_UPDATING` set to `1` or
/// `true` (any case), as vLLM's `envs` reads it.
fn vllm_runtime_lora_updating() -> bool {
    std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING").is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(args: &[&str]) -> Vec<String> {
        vllm_style_args(args.iter().map(|a| a.to_string()).collect()).unwrap()
    }

    #[test]
    fn vllm_command_lines_read_as_ours() {
        assert_eq!(
            vllm(&["serve", "m", "--hf_overrides", "{}", "--max_model_len=5"]),
            ["serve", "m", "--hf-overrides", "{}", "--max-model-len=5"]
        );
        assert_eq!(
            vllm(&["serve", "m", "--pooler-config.task", "token_embed"]),
            ["serve", "m", "--pooler-config", r#"{"task":"token_embed"}"#]
        );
        let merged = vllm(&[
            "serve",
            "m",
            "--pooler-config",
            r#"{"use_activation": false, "task": "embed"}"#,
            "--pooler-config.task=token_classify",
            "--hf-overrides.a.b",
            "2",
        ]);
        assert_eq!(
            merged,
            ["serve", "m", "--pooler-config", r#"{"task":"token_classify","use_activation":false}"#, "--hf-overrides", r#"{"a":{"b":2}}"#]
        );
        assert!(vllm_style_args(vec!["--pooler-config.task".into()]).is_err());
    }

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
        assert_eq!(parsed.models.len(), 1);
        assert_eq!(format!("{:?}", ServerConfig::for_model("m")), format!("{parsed:?}"));
    }

    #[test]
    fn defaults_are_valid() {
        let config = ServerConfig::for_model("some/model");
        assert_eq!(config.models[0].served_name, "some/model");
        assert_eq!(config.port, 8000);
    }

    fn parse(args: &[&str]) -> Result<ServerConfig, ConfigError> {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ServeArgs,
        }
        let mut all = vec!["poolserve"];
        all.extend_from_slice(args);
        ServerConfig::try_from(Wrapper::try_parse_from(all).map_err(|e| ConfigError(e.to_string()))?.args)
    }

    #[test]
    fn several_models_on_the_command_line() {
        let config = parse(&["minilm=/m/a", "/m/b", "--dtype", "float32"]).unwrap();
        let names: Vec<_> = config.models.iter().map(|m| (m.served_name.as_str(), m.source.as_str())).collect();
        assert_eq!(names, [("minilm", "/m/a"), ("/m/b", "/m/b")]);
        assert!(config.models.iter().all(|m| m.dtype == DTypeArg::Float32));
        assert!(parse(&["a=/m/a", "a=/m/b"]).unwrap_err().to_string().contains("two models are named `a`"));
        assert!(parse(&["/m/a", "/m/b", "--served-model-name", "x"]).is_err());
        assert!(parse(&["=/m/a"]).is_err());
        assert_eq!(parse(&["/m/a", "--served-model-name", "x"]).unwrap().models[0].served_name, "x");
        assert!(parse(&["a=/m/a", "--served-model-name", "x"]).is_err());
        // A MODEL whose `=` follows a `/` stays whole (a run folder, a hub id).
        let whole = parse(&["runs/lr=2e-5"]).unwrap();
        assert_eq!((whole.models[0].served_name.as_str(), whole.models[0].source.as_str()), ("runs/lr=2e-5", "runs/lr=2e-5"));
    }

    #[test]
    fn models_file_in_yaml_and_json() {
        let defaults = ModelOptions { dtype: DTypeArg::Float32, ..ModelOptions::for_model("") };
        let json = r#"{"models": [{"name": "minilm", "model": "/m/all-MiniLM-L6-v2"},
            {"name": "splade", "model": "/m/splade-tiny", "pooler_config": {"pooling_type": "SPLADE"}, "max_model_len": 128}]}"#;
        let yaml = "models:\n  - name: minilm\n    model: /m/all-MiniLM-L6-v2\n  - name: splade\n    model: /m/splade-tiny\n    pooler_config:\n      pooling_type: SPLADE\n    max_model_len: 128\n";
        for text in [json, yaml] {
            let models = models_file::parse(text, &defaults).unwrap();
            assert_eq!(models.len(), 2);
            assert_eq!((models[0].served_name.as_str(), models[0].dtype), ("minilm", DTypeArg::Float32));
            assert_eq!(models[1].pooler.pooling_type, Some(crate::pooling::PoolingType::Splade));
            assert_eq!(models[1].max_model_len, Some(128));
        }
        let unknown = models_file::parse(r#"{"models": [{"model": "/m/a", "pooler_confg": {}}]}"#, &defaults).unwrap_err();
        assert!(unknown.contains("unknown field"), "{unknown}");
        assert!(models_file::parse(r#"{"models": [{"model": "/m/a"}, {"model": "/m/a"}]}"#, &defaults).is_err());
        assert!(models_file::parse(r#"{"models": []}"#, &defaults).is_err());
        assert!(parse(&["--config", "x.yaml", "/m/a"]).is_err(), "a models file and MODEL arguments are exclusive");
        assert!(parse(&["--config", "x.yaml", "--served-model-name", "n"]).is_err());
        let both =
            models_file::parse(r#"{"models": [{"model": "/m/a", "default_prompt": "q: ", "default_prompt_name": "query"}]}"#, &defaults);
        assert!(both.unwrap_err().contains("exclude each other"));
        let flagged = ModelOptions { default_prompt: Some("flag: ".into()), ..defaults.clone() };
        let entry = models_file::parse(r#"{"models": [{"model": "/m/a", "default_prompt_name": "query"}]}"#, &flagged).unwrap();
        assert_eq!((entry[0].default_prompt_name.as_deref(), entry[0].default_prompt.as_deref()), (Some("query"), None));
    }

    #[test]
    fn lora_flags_and_models_file_keys() {
        let config = parse(&[
            "a=/m/a",
            "b=/m/b",
            "--enable-lora",
            "--max-loras",
            "4",
            "--lora-modules",
            "legal=/ad/legal",
            r#"{"name": "med", "path": "/ad/med", "base_model_name": "b"}"#,
        ])
        .unwrap();
        let lora = |i: usize| config.models[i].lora.as_ref().unwrap();
        assert_eq!(lora(0).modules.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["legal"]);
        assert_eq!(lora(1).modules[0].path, "/ad/med");
        assert_eq!((lora(0).max_loras, lora(0).max_lora_rank), (4, 16));
        let err = parse(&["/m/a", "--lora-modules", "x=/ad/x"]).unwrap_err().to_string();
        assert!(err.contains("does not serve adapters (--enable-lora)"), "{err}");
        let err = parse(&["a=/m/a", "--enable-lora", "--lora-modules", "a=/ad/x"]).unwrap_err().to_string();
        assert!(err.contains("has the name of another model or adapter"), "{err}");
        let err =
            parse(&["/m/a", "--enable-lora", "--lora-modules", r#"{"name": "x", "path": "/p", "base_model_name": "zz"}"#]).unwrap_err();
        assert!(err.to_string().contains("base_model_name `zz` is not a served model"), "{err}");
        assert!(parse(&["/m/a", "--enable-lora", "--max-loras", "0"]).is_err());

        let defaults = ModelOptions::for_model("");
        let models = models_file::parse(
            r#"{"models": [{"name": "a", "model": "/m/a", "lora_modules": ["x=/ad/x", {"name": "y", "path": "/ad/y"}], "max_loras": 2},
                {"name": "b", "model": "/m/b"}]}"#,
            &defaults,
        )
        .unwrap();
        let a = models[0].lora.as_ref().unwrap();
        assert_eq!((a.modules.len(), a.max_loras, a.max_lora_rank), (2, 2, 16));
        assert!(models[1].lora.is_none());
        let err = models_file::parse(r#"{"models": [{"model": "/m/a", "enable_lora": false, "lora_modules": ["x=/p"]}]}"#, &defaults);
        assert!(err.unwrap_err().contains("lora_modules needs enable_lora"));
    }
}
