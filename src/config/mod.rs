//! The CLI layer's configuration: the `serve` command line (every flag also an environment
//! variable), turned once into a [`ServerConfig`]: the model's [`ModelOptions`] (loader), the
//! engine's [`EngineOptions`], and the HTTP server's own settings.
//!
//! A file a subject: `args` (the flags), `vllm_args` (vLLM's spellings of them), `models_file`
//! (`--config FILE`); here, their values checked and turned into a [`ServerConfig`].

mod args;
mod cors;
mod models_file;
mod vllm_args;

pub use args::{LogFormat, ServeArgs};
pub use cors::{CorsList, CorsOptions};
pub use vllm_args::vllm_style_args;

use crate::engine::EngineOptions;
use crate::loader::lora::{LoraModule, LoraOptions};
use crate::loader::options::ModelOptions;
use crate::pooling::config::PoolerConfig;

/// Everything the server needs, validated.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The models served, in the order given; names are unique.
    pub models: Vec<ModelOptions>,
    pub engine: EngineOptions,
    /// How IO-processor plugins run (every model's).
    pub plugins: crate::plugin::PluginOptions,
    pub host: String,
    pub port: u16,
    /// `--uds`: a Unix socket instead of host and port.
    pub uds: Option<std::path::PathBuf>,
    /// `--url-prefix`: every route under this path ("" for none).
    pub url_prefix: String,
    /// `--root-path`: the path a proxy strips ("" for none).
    pub root_path: String,
    pub payload_limit: usize,
    /// `--api-key` (repeated) and `--api-key-file`: the keys accepted.
    pub api_keys: Vec<String>,
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
    /// `--ssl-keyfile` and the rest: serve HTTPS.
    pub tls: Option<TlsOptions>,
    /// `--otlp-endpoint`: trace requests to an OpenTelemetry collector.
    pub telemetry: Option<crate::telemetry::TelemetryOptions>,
    /// `--allowed-origins` and the rest: answer browsers' CORS requests.
    pub cors: Option<CorsOptions>,
    /// `--models-dir`: `models` load on demand, with these limits.
    pub on_demand: Option<OnDemandLimits>,
}

/// `--max-loaded-models`, `--model-idle-timeout`, `--model-load-timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDemandLimits {
    pub max_loaded: Option<usize>,
    /// `--max-loaded-memory`, in bytes.
    pub max_memory: Option<u64>,
    pub idle_timeout: Option<std::time::Duration>,
    pub load_timeout: std::time::Duration,
}

/// vLLM's TLS flags, checked for consistency (the files are read when the server starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub keyfile: std::path::PathBuf,
    pub certfile: std::path::PathBuf,
    pub ca_certs: Option<std::path::PathBuf>,
    pub client_certs: ClientCerts,
}

/// `--ssl-cert-reqs`: Python's `ssl.CERT_NONE`, `CERT_OPTIONAL`, `CERT_REQUIRED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    NotAsked,
    Optional,
    Required,
}

fn tls_options(args: &ServeArgs) -> Result<Option<TlsOptions>, ConfigError> {
    let client_certs = match args.ssl_cert_reqs {
        0 => ClientCerts::NotAsked,
        1 => ClientCerts::Optional,
        2 => ClientCerts::Required,
        n => return Err(ConfigError(format!("--ssl-cert-reqs must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED), not {n}"))),
    };
    let (Some(keyfile), Some(certfile)) = (&args.ssl_keyfile, &args.ssl_certfile) else {
        if client_certs != ClientCerts::NotAsked {
            return Err(ConfigError("--ssl-cert-reqs needs --ssl-keyfile and --ssl-certfile".into()));
        }
        return Ok(None);
    };
    if client_certs != ClientCerts::NotAsked && args.ssl_ca_certs.is_none() {
        return Err(ConfigError("--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs (the CAs client certificates must chain to)".into()));
    }
    Ok(Some(TlsOptions { keyfile: keyfile.clone(), certfile: certfile.clone(), ca_certs: args.ssl_ca_certs.clone(), client_certs }))
}

/// A flag value that cannot be used; printed as one line before exiting.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub(crate) String);

fn positive(name: &str, value: usize) -> Result<usize, ConfigError> {
    if value == 0 {
        return Err(ConfigError(format!("--{name} must be greater than 0")));
    }
    Ok(value)
}

/// `--max-loaded-memory`: a count of MiB (as `--cache-size`), or a size with its unit, binary
/// (`KiB`/`Ki`, `MiB`/`Mi`, `GiB`/`Gi`, `TiB`/`Ti`) or decimal (`KB`/`K`, `MB`/`M`, `GB`/`G`,
/// `TB`/`T`, as Kubernetes' quantities and `B` for bytes), in bytes.
fn memory_size(text: &str) -> Result<u64, ConfigError> {
    let bad = || {
        ConfigError(format!(
            "--max-loaded-memory {text:?} is not a size: give MiB (`4096`) or a size with its unit (`4GiB`, `4Gi`, `500MB`)"
        ))
    };
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale: f64 = match unit.trim() {
        "" => (1u64 << 20) as f64,
        "B" => 1.0,
        "KiB" | "Ki" => 1024.0,
        "MiB" | "Mi" => (1u64 << 20) as f64,
        "GiB" | "Gi" => (1u64 << 30) as f64,
        "TiB" | "Ti" => (1u64 << 40) as f64,
        "KB" | "K" | "kB" | "k" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        "TB" | "T" => 1e12,
        _ => return Err(bad()),
    };
    let bytes = number * scale;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(ConfigError("--max-loaded-memory must be greater than 0".into()));
    }
    Ok(bytes.min(u64::MAX as f64) as u64)
}

/// `--pooler-config` and `--hf-overrides`, read from their JSON.
fn json_flags(args: &ServeArgs) -> Result<(PoolerConfig, serde_json::Map<String, serde_json::Value>), ConfigError> {
    let pooler = match &args.pooler_config {
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
    Ok((pooler, hf_overrides))
}

/// `--cache-size` (MiB) and `--cache-dir`; a folder without a size is refused rather than
/// silently unused.
fn cache_options(mib: u64, dir: Option<std::path::PathBuf>) -> Result<crate::engine::cache::CacheOptions, ConfigError> {
    if mib == 0 && dir.is_some() {
        return Err(ConfigError("--cache-dir needs --cache-size (MiB of outputs to keep)".into()));
    }
    let bytes = usize::try_from(mib).ok().and_then(|m| m.checked_mul(1 << 20));
    let bytes = bytes.ok_or_else(|| ConfigError(format!("--cache-size {mib} MiB does not fit in this machine's memory")))?;
    Ok(crate::engine::cache::CacheOptions { bytes, dir })
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
        let module: LoraModule = item.parse().map_err(|e: crate::loader::LoadError| ConfigError(e.to_string()))?;
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

/// The plugin flags: `--plugin-path` folders before the defaults' (`POOLSERVE_PLUGIN_PATH`,
/// `./plugins`).
fn plugin_options(args: &ServeArgs) -> Result<crate::plugin::PluginOptions, ConfigError> {
    let mut plugins = crate::plugin::PluginOptions::default();
    plugins.paths.splice(0..0, args.plugin_paths.iter().cloned());
    plugins.python = args.plugin_python.clone();
    plugins.timeout = std::time::Duration::from_secs(positive("plugin-timeout", args.plugin_timeout as usize)? as u64);
    plugins.memory_limit_bytes = (positive("plugin-memory-limit", args.plugin_memory_limit as usize)? as u64) << 20;
    plugins.processes = positive("plugin-processes", args.plugin_processes)?;
    Ok(plugins)
}

/// `--chat-template-content-format`: `auto` (`None`) or a fixed format.
fn content_format(value: &str) -> Result<Option<crate::input::chat_template::ContentFormat>, ConfigError> {
    match value {
        "auto" => Ok(None),
        other => other.parse().map(Some).map_err(|e| ConfigError(format!("--chat-template-content-format: {e}"))),
    }
}

impl TryFrom<ServeArgs> for ServerConfig {
    type Error = ConfigError;

    fn try_from(args: ServeArgs) -> Result<Self, ConfigError> {
        let tls = tls_options(&args)?;
        let plugins = plugin_options(&args)?;
        let (pooler, hf_overrides) = json_flags(&args)?;
        let defaults = ModelOptions {
            served_name: String::new(),
            source: String::new(),
            revision: args.revision,
            hub_token: args.hf_token.as_deref().and_then(crate::loader::hub::HubToken::new),
            runner: args.runner,
            convert: args.convert,
            pooler,
            hf_overrides,
            max_model_len: args.max_model_len,
            auto_truncate: args.auto_truncate,
            device: args.device,
            dtype: args.dtype,
            quantization: args.quantization,
            reranker_instruction: args.reranker_instruction,
            dense_path: args.dense_path,
            io_processor_plugin: args.io_processor_plugin,
            default_prompt_name: args.default_prompt_name,
            default_prompt: args.default_prompt,
            chat_template: args.chat_template,
            chat_template_content_format: content_format(&args.chat_template_content_format)?,
            lora: args.enable_lora.then(|| LoraOptions {
                modules: Vec::new(),
                max_loras: args.max_loras,
                max_lora_rank: args.max_lora_rank,
            }),
        };
        let mut models = match (&args.config, &args.models_dir) {
            (Some(path), _) => models_file::read(path, &defaults)?,
            (None, Some(dir)) => models_in(dir, &defaults)?,
            (None, None) => named_models(&args.models, args.served_model_name.as_deref(), &defaults)?,
        };
        let on_demand = match &args.models_dir {
            Some(_) => Some(OnDemandLimits {
                max_loaded: args.max_loaded_models.map(|n| positive("max-loaded-models", n)).transpose()?,
                max_memory: args.max_loaded_memory.as_deref().map(memory_size).transpose()?,
                idle_timeout: args
                    .model_idle_timeout
                    .map(|s| positive("model-idle-timeout", s as usize).map(|s| std::time::Duration::from_secs(s as u64)))
                    .transpose()?,
                load_timeout: std::time::Duration::from_secs(positive("model-load-timeout", args.model_load_timeout as usize)? as u64),
            }),
            None => None,
        };
        assign_lora_modules(&mut models, &args.lora_modules)?;
        for model in &models {
            model
                .check()
                .map_err(|e| ConfigError(if models.len() > 1 { format!("model `{}`: {e}", model.served_name) } else { e.to_string() }))?;
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
            max_audio_seconds: positive("max-audio-seconds", args.max_audio_seconds as usize)? as u64,
            max_video_frames: positive("max-video-frames", args.max_video_frames)?,
            scheduling_policy: args.scheduling_policy,
            cache: cache_options(args.cache_size, args.cache_dir)?,
        };
        if args.enable_lora {
            positive("max-loras", args.max_loras)?;
            positive("max-lora-rank", args.max_lora_rank)?;
        }
        let telemetry = match args.otlp_endpoint {
            Some(endpoint) if endpoint.trim().is_empty() => return Err(ConfigError("--otlp-endpoint must not be empty".into())),
            Some(endpoint) => Some(crate::telemetry::TelemetryOptions { endpoint, service_name: args.otlp_service_name }),
            None => None,
        };
        let cors = cors::cors_options(
            args.allowed_origins.as_deref(),
            args.allowed_methods.as_deref(),
            args.allowed_headers.as_deref(),
            args.allow_credentials,
        )?;
        Ok(ServerConfig {
            tls,
            telemetry,
            cors,
            on_demand,
            models,
            engine,
            plugins,
            host: args.host,
            port: args.port,
            url_prefix: url_path("--url-prefix", args.url_prefix.as_deref())?,
            root_path: url_path("--root-path", args.root_path.as_deref())?,
            uds: match args.uds {
                Some(_) if args.ssl_certfile.is_some() => {
                    return Err(ConfigError("--uds cannot be combined with --ssl-certfile: serve TLS on a TCP port".into()))
                }
                Some(path) if path.as_os_str().is_empty() => return Err(ConfigError("--uds must not be empty".into())),
                uds => uds,
            },
            payload_limit: positive("payload-limit", args.payload_limit)?,
            api_keys: api_keys(&args.api_key, args.api_key_file.as_deref())?,
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
            plugins: crate::plugin::PluginOptions::default(),
            host: "0.0.0.0".into(),
            port: 8000,
            uds: None,
            url_prefix: String::new(),
            root_path: String::new(),
            payload_limit: 2_000_000,
            api_keys: Vec::new(),
            max_client_batch_size: 1024,
            trust_request_chat_template: false,
            shutdown_timeout: std::time::Duration::from_secs(30),
            log_format: LogFormat::Text,
            allowed_media_domains: Vec::new(),
            media_fetch_timeout: std::time::Duration::from_secs(5),
            allow_runtime_lora_updating: false,
            tls: None,
            telemetry: None,
            cors: None,
            on_demand: None,
        }
    }
}

/// `--models-dir DIR`: every sub-folder with a config.json is a model, named by its folder
/// (sorted, so that the order is the same on every start); flags are their defaults.
fn models_in(dir: &std::path::Path, defaults: &ModelOptions) -> Result<Vec<ModelOptions>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ConfigError(format!("--models-dir {}: {e}", dir.display())))?;
    let mut folders: Vec<(String, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("config.json").is_file())
        .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p)))
        .collect();
    folders.sort();
    if folders.is_empty() {
        return Err(ConfigError(format!("--models-dir {} holds no model folder (a folder with a config.json)", dir.display())));
    }
    Ok(folders
        .into_iter()
        .map(|(name, path)| ModelOptions { served_name: name, source: path.to_string_lossy().into_owned(), ..defaults.clone() })
        .collect())
}

/// `--url-prefix` and `--root-path`: `/` and a path of segments, without a trailing slash
/// (`/` alone is no prefix); nothing a router would read as a parameter or a query.
fn url_path(flag: &str, value: Option<&str>) -> Result<String, ConfigError> {
    let Some(value) = value else { return Ok(String::new()) };
    if !value.starts_with('/') {
        return Err(ConfigError(format!("{flag} must start with `/` (e.g. /embeddings), not `{value}`")));
    }
    if let Some(c) = value.chars().find(|c| c.is_whitespace() || c.is_control() || "?#{}*%\\".contains(*c)) {
        return Err(ConfigError(format!("{flag} `{value}` holds `{c}`: write a plain path such as /embeddings")));
    }
    if value.contains("//") {
        return Err(ConfigError(format!("{flag} `{value}` has an empty segment")));
    }
    Ok(value.trim_end_matches('/').to_string())
}

/// `--api-key` values and the lines of `--api-key-file` (a Kubernetes secret mounted as a
/// file: one key a line; blank lines and `#` comments skipped), read once at start.
fn api_keys(flags: &[String], file: Option<&std::path::Path>) -> Result<Vec<String>, ConfigError> {
    let mut keys = Vec::new();
    for key in flags {
        if key.trim().is_empty() {
            return Err(ConfigError("--api-key must not be empty".into()));
        }
        keys.push(key.clone());
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("--api-key-file {}: {e}", path.display())))?;
        let before = keys.len();
        keys.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from));
        if keys.len() == before {
            return Err(ConfigError(format!("--api-key-file {} holds no key (one a line)", path.display())));
        }
    }
    Ok(keys)
}

/// vLLM's switch for the adapter routes: `VLLM_ALLOW_RUNTIME_LORA_UPDATING` set to `1` or
/// `true` (any case), as vLLM's `envs` reads it.
fn vllm_runtime_lora_updating() -> bool {
    std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING").is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_read_as_mib_or_with_their_unit() {
        assert_eq!(memory_size("4096").unwrap(), 4096 << 20);
        assert_eq!(memory_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(memory_size("8Gi").unwrap(), 8 << 30);
        assert_eq!(memory_size("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(memory_size("500MB").unwrap(), 500_000_000);
        assert_eq!(memory_size("300KiB").unwrap(), 300 << 10);
        assert_eq!(memory_size("2G").unwrap(), 2_000_000_000);
        for bad in ["", "GiB", "8 parsecs", "-1", "1e3", "0", "0.0000001"] {
            assert!(memory_size(bad).is_err(), "{bad:?}");
        }
        assert!(memory_size("8 parsecs").unwrap_err().to_string().contains("is not a size"));
    }
    use crate::loader::options::DTypeArg;

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
    fn tls_flags_are_checked_together() {
        let tls = |extra: &[&str]| {
            let mut args = vec!["m", "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem"];
            args.extend_from_slice(extra);
            parse(&args)
        };
        assert_eq!(tls(&[]).unwrap().tls.unwrap().client_certs, ClientCerts::NotAsked);
        let mutual = tls(&["--ssl-ca-certs", "ca.pem", "--ssl-cert-reqs", "2"]).unwrap().tls.unwrap();
        assert_eq!((mutual.client_certs, mutual.ca_certs.as_deref()), (ClientCerts::Required, Some(std::path::Path::new("ca.pem"))));
        assert_eq!(tls(&["--ssl-ca-certs", "ca.pem", "--ssl-cert-reqs", "1"]).unwrap().tls.unwrap().client_certs, ClientCerts::Optional);
        let error = |r: Result<ServerConfig, ConfigError>| r.unwrap_err().to_string();
        assert!(error(tls(&["--ssl-cert-reqs", "2"])).contains("needs --ssl-ca-certs"));
        assert!(error(tls(&["--ssl-ca-certs", "ca.pem", "--ssl-cert-reqs", "3"])).contains("must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2"));
        assert!(error(parse(&["m", "--ssl-keyfile", "k.pem"])).contains("--ssl-certfile"), "a key without its certificate");
        assert!(error(parse(&["m", "--ssl-cert-reqs", "1"])).contains("needs --ssl-keyfile"));
        assert!(parse(&["m"]).unwrap().tls.is_none());
    }

    #[test]
    fn otlp_flags_are_teis_and_vllms() {
        let otlp = |extra: &[&str]| {
            let mut args = vec!["m"];
            args.extend_from_slice(extra);
            parse(&args)
        };
        assert_eq!(otlp(&[]).unwrap().telemetry, None);
        let tei = otlp(&["--otlp-endpoint", "http://collector:4317", "--otlp-service-name", "embedder"]).unwrap().telemetry.unwrap();
        assert_eq!((tei.endpoint.as_str(), tei.service_name.as_str()), ("http://collector:4317", "embedder"));
        let vllm = otlp(&["--otlp-traces-endpoint", "collector:4317"]).unwrap().telemetry.unwrap();
        assert_eq!((vllm.endpoint.as_str(), vllm.service_name.as_str()), ("collector:4317", "poolserve"));
        assert!(otlp(&["--otlp-endpoint", " "]).is_err());
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
        assert!(unknown.to_string().contains("unknown field"), "{unknown}");
        assert!(models_file::parse(r#"{"models": [{"model": "/m/a"}, {"model": "/m/a"}]}"#, &defaults).is_err());
        assert!(models_file::parse(r#"{"models": []}"#, &defaults).is_err());
        assert!(parse(&["--config", "x.yaml", "/m/a"]).is_err(), "a models file and MODEL arguments are exclusive");
        assert!(parse(&["--config", "x.yaml", "--served-model-name", "n"]).is_err());
        let both =
            models_file::parse(r#"{"models": [{"model": "/m/a", "default_prompt": "q: ", "default_prompt_name": "query"}]}"#, &defaults);
        assert!(both.unwrap_err().to_string().contains("exclude each other"));
        let flagged = ModelOptions { default_prompt: Some("flag: ".into()), ..defaults.clone() };
        let entry = models_file::parse(r#"{"models": [{"model": "/m/a", "default_prompt_name": "query"}]}"#, &flagged).unwrap();
        assert_eq!((entry[0].default_prompt_name.as_deref(), entry[0].default_prompt.as_deref()), (Some("query"), None));
        // Each model its own IO-processor plugin, over the flag's.
        let flagged = ModelOptions { io_processor_plugin: Some("flag_plugin".into()), ..defaults.clone() };
        let text = r#"{"models": [{"model": "/m/a", "io_processor_plugin": "bge_m3_sparse_plugin"}, {"model": "/m/b"}]}"#;
        let plugins: Vec<Option<String>> = models_file::parse(text, &flagged).unwrap().into_iter().map(|m| m.io_processor_plugin).collect();
        assert_eq!(plugins, [Some("bge_m3_sparse_plugin".to_string()), Some("flag_plugin".to_string())]);
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
        assert!(err.unwrap_err().to_string().contains("lora_modules needs enable_lora"));
    }
}
