//! IO-processor plugins (vLLM's `plugin` pooling task): code of the user's that turns whatever a
//! client sends as `data` into prompts for the model, and the model's outputs into whatever the
//! client gets back (`POST /pooling` with `data`; the library's `plugin`).
//!
//! A plugin runs in processes of its own, never in the server's: Python, since vLLM's plugins
//! are Python (a vLLM plugin ports by importing `poolserve_plugins` instead of `vllm.*`), in
//! the host `host.py` started with `python -c`. The choice, against Triton's Python backend
//! (stub processes, shared memory), HashiCorp's go-plugin (subprocesses over gRPC) and wasmtime
//! (an in-process sandbox): a subprocess per plugin instance with framed pipes keeps plugins
//! unchanged (CPython and its packages do not run in a WebAssembly sandbox), a crash or a
//! memory flood ends one process and not the server, and a hang is ended by killing it; arrays
//! cross the pipe as their bytes (`frame`), which at the sizes of pooled outputs costs less than
//! the JSON the client receives, so shared memory would buy little. The protocol is in
//! docs/plugins.md, for plugins written in another language.
//!
//! One [`IoProcessor`] per model keeps up to `--plugin-processes` warm processes; a request
//! holds one from `pre_process` to `post_process` (vLLM's plugins keep the request between the
//! two), so concurrent requests run in parallel processes and a hung one holds only its own.

mod frame;
mod process;
mod tokenizer;

use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::engine::{Engine, EngineError};
use crate::input::tokenizer::TextTokenizer;
use crate::input::Prompt;
use crate::loader::model_spec::ModelSpec;
use crate::pooling::m3::MultiOutput;
use crate::pooling::{PoolingOutput, Task};
use frame::Frame;
use process::{PluginProcess, Started};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How plugin processes run (`serve` flags; one set for every model's plugin).
#[derive(Debug, Clone)]
pub struct PluginOptions {
    /// The Python that runs plugins (`--plugin-python`; `python3` on the PATH by default).
    pub python: PathBuf,
    /// Folders whose subfolders are plugins by name (`--plugin-path`, then
    /// `POOLSERVE_PLUGIN_PATH`, then `plugins` in the working folder); installed Python
    /// packages' entry points (`poolserve.io_processor_plugins`, `vllm.io_processor_plugins`)
    /// come after.
    pub paths: Vec<PathBuf>,
    /// Longest a plugin may take in one of its steps (`--plugin-timeout`): past it the process
    /// is killed and the request answers 504.
    pub timeout: Duration,
    /// Longest a plugin process may take to start and load its plugin.
    pub start_timeout: Duration,
    /// Memory a plugin process may allocate (`--plugin-memory-limit`, MiB; RLIMIT_DATA): past
    /// it the plugin's allocation fails and the request answers 500.
    pub memory_limit_bytes: u64,
    /// Plugin processes per model at most (`--plugin-processes`): requests beyond wait for one.
    pub processes: usize,
}

impl Default for PluginOptions {
    fn default() -> Self {
        let mut paths: Vec<PathBuf> =
            std::env::var_os("POOLSERVE_PLUGIN_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
        paths.push(PathBuf::from("plugins"));
        PluginOptions {
            python: PathBuf::from("python3"),
            paths,
            timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(60),
            memory_limit_bytes: 2048 << 20,
            processes: 4,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// At start: vLLM's message for a plugin that is not installed.
    #[error("The model requires the '{name}' IO Processor plugin but it is not installed. Available plugins: [{}]", installed.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", "))]
    NotInstalled { name: String, installed: Vec<String> },
    /// At start: the process or the plugin could not start.
    #[error("{0}")]
    Start(String),
    /// The plugin refused the request or failed in it: its exception's message, with vLLM's
    /// status for the exception (400 for ValueError and TypeError, 501 NotImplementedError,
    /// 500 otherwise).
    #[error("{message}")]
    Plugin { status: u16, message: String },
    #[error("the plugin did not answer within {0:?} (--plugin-timeout); its process was stopped")]
    Timeout(Duration),
    #[error("the plugin process exited ({0}); it is restarted for the next request")]
    Crashed(String),
    #[error("the plugin process closed its pipe: {0}")]
    Gone(std::io::Error),
    #[error("the plugin process broke the protocol: {0}")]
    Protocol(String),
    /// The plugin's prompts, run by the model.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// One model's plugin: its name, the model's settings it was started with, its processes.
pub struct IoProcessor {
    name: String,
    options: PluginOptions,
    model: Value,
    /// The model's tokenizer, which the plugin asks over the pipe.
    tokenizer: Arc<TextTokenizer>,
    idle: Mutex<Vec<PluginProcess>>,
    slots: Arc<Semaphore>,
}

impl IoProcessor {
    /// Starts the first process of plugin `name` for `engine`'s model: an unknown name, a plugin
    /// that fails to load, or one whose `merge_pooling_params` asks for a task the model lacks
    /// stops the server here, not at the first request.
    pub async fn start(name: &str, options: &PluginOptions, engine: &Engine) -> Result<Arc<IoProcessor>, PluginError> {
        let spec = engine.spec();
        let tokenizer = engine.input().shared_tokenizer();
        let defaults = &spec.pooler_defaults;
        // What vLLM's `vllm_config.model_config` tells a plugin (host.py's ModelConfig).
        let model = json!({
            "model": spec.root,
            "served_model_name": spec.served_name,
            "max_model_len": spec.max_model_len,
            "embedding_size": spec.embedding_size,
            "hidden_size": spec.hidden_size,
            "architecture": spec.architecture,
            "io_processor_plugin": name,
            "pooler_config": {
                "task": defaults.task,
                "use_activation": defaults.use_activation,
                "dimensions": defaults.dimensions,
                "normalize": defaults.normalize,
            },
            "tokenizer": tokenizer::describe(&tokenizer, spec.tokenizer_dir.as_deref()),
        });
        let processor = IoProcessor {
            name: name.to_string(),
            options: options.clone(),
            model,
            tokenizer,
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(options.processes.max(1))),
        };
        let first = processor.spawn().await?;
        // The task the plugin asks for, checked once against the model now (the host reports
        // what `merge_pooling_params()` returned at start).
        if let Some(asked) = first.asked_params.as_ref() {
            plugin_params(asked, spec).map_err(|e| PluginError::Start(format!("plugin `{name}` cannot run on this model: {e}")))?;
        }
        crate::metrics::plugin_process_started(&spec.served_name, name);
        processor.idle_processes().push(first);
        Ok(Arc::new(processor))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    async fn spawn(&self) -> Result<PluginProcess, PluginError> {
        match PluginProcess::start(&self.name, &self.options, &self.model, &self.tokenizer).await? {
            Started::Ready(process) => Ok(*process),
            Started::NotInstalled { installed } => Err(PluginError::NotInstalled { name: self.name.clone(), installed }),
        }
    }

    fn idle_processes(&self) -> std::sync::MutexGuard<'_, Vec<PluginProcess>> {
        // A poisoned lock only means a panic elsewhere mid-push; the list is still whole.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// vLLM's plugin request: `parse_data` and `pre_process` in the plugin, its prompts through
    /// the model with the task `merge_pooling_params` picks, then `post_process` with every
    /// output in prompt order; returns the plugin's output.
    /// `request_id`: the response's id online; `None` offline (the library), as vLLM calls a
    /// plugin's offline path.
    pub async fn process(&self, engine: &Engine, data: Value, request_id: Option<&str>) -> Result<Value, PluginError> {
        let started = Instant::now();
        let model = engine.spec().served_name.clone();
        let result = self.process_in_a_process(engine, data, request_id).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(PluginError::Plugin { status, .. }) if *status < 500 => "rejected",
            Err(PluginError::Timeout(_)) => "timeout",
            Err(PluginError::Crashed(_) | PluginError::Gone(_)) => "crashed",
            Err(_) => "error",
        };
        crate::metrics::plugin_call(&model, &self.name, outcome, started.elapsed());
        result
    }

    async fn process_in_a_process(&self, engine: &Engine, data: Value, request_id: Option<&str>) -> Result<Value, PluginError> {
        let _slot = self.slots.clone().acquire_owned().await.map_err(|_| PluginError::Start("the plugin is shutting down".into()))?;
        let idle = self.idle_processes().pop();
        let mut process = match idle {
            Some(process) => process,
            None => {
                crate::metrics::plugin_process_started(&engine.spec().served_name, &self.name);
                self.spawn().await?
            }
        };
        let result = self.exchange(&mut process, engine, data, request_id).await;
        if process.healthy {
            self.idle_processes().push(process);
        }
        result
    }

    async fn exchange(
        &self,
        process: &mut PluginProcess,
        engine: &Engine,
        data: Value,
        request_id: Option<&str>,
    ) -> Result<Value, PluginError> {
        let timeout = self.options.timeout;
        let text = &*self.tokenizer;
        let pre = process.call(Frame::json(json!({"op": "pre_process", "request_id": request_id, "data": data})), timeout, text).await?;
        let pre = answer(pre.header, process)?;
        let spec = engine.spec();
        let prompts = prompts(&pre["prompts"])?;
        let params = plugin_params(&pre["params"], spec)?;
        let inputs = engine.prepare(prompts, &params).await?;
        let ids: Vec<Vec<u32>> = inputs.iter().map(|input| input.ids.clone()).collect();
        let outputs = engine.run(inputs, &params).await?;
        let squeeze = spec.m3 && params.task == Task::TokenClassify;
        let mut arrays = Vec::with_capacity(2 * outputs.len());
        let mut described = Vec::with_capacity(outputs.len());
        for (ids, output) in ids.iter().zip(outputs) {
            let (shape, values) = array_of(output, squeeze)?;
            described.push(json!({"shape": shape}));
            arrays.push(ids.iter().flat_map(|id| id.to_le_bytes()).collect());
            arrays.push(values.iter().flat_map(|v| v.to_le_bytes()).collect());
        }
        let post = Frame { header: json!({"op": "post_process", "request_id": request_id, "outputs": described}), arrays };
        let post = process.call(post, timeout, text).await?;
        let mut post = answer(post.header, process)?;
        Ok(post["data"].take())
    }
}

/// A plugin's answer, or its error; a process that ran out of memory is not reused.
fn answer(mut header: Value, process: &mut PluginProcess) -> Result<Value, PluginError> {
    if header["ok"] == true {
        return Ok(header);
    }
    if header["restart"] == true {
        process.healthy = false;
    }
    let status = header["status"].as_u64().map_or(500, |s| s as u16);
    let message = header["message"].take();
    Err(PluginError::Plugin { status, message: message.as_str().unwrap_or("the plugin failed").to_string() })
}

/// The plugin's prompts (`{"text"}` or `{"token_ids"}` each, as the host writes them).
fn prompts(listed: &Value) -> Result<Vec<Prompt>, PluginError> {
    let protocol = |what: &str| PluginError::Protocol(format!("pre_process answered {what}"));
    let listed = listed.as_array().ok_or_else(|| protocol("no list of prompts"))?;
    listed
        .iter()
        .map(|prompt| {
            if let Some(text) = prompt["text"].as_str() {
                return Ok(Prompt::Text(text.to_string()));
            }
            let ids = prompt["token_ids"].as_array().ok_or_else(|| protocol("a prompt with neither text nor token ids"))?;
            let ids = ids.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()));
            let ids: Option<Vec<u32>> = ids.collect();
            let ids = ids.ok_or(PluginError::Plugin { status: 400, message: "Token prompt should be a list of integers".into() })?;
            Ok(Prompt::Tokens(ids))
        })
        .collect()
}

/// vLLM 0.33's compound pooling task: BGE-M3's dense embedding followed by its per-token
/// weights, in one output (`data[:embedding_size]`, `data[embedding_size:]`).
const EMBED_AND_TOKEN_CLASSIFY: &str = "embed&token_classify";

/// The pooling parameters `merge_pooling_params` returned (host.py sends `task`, `dimensions`,
/// `use_activation`), checked against the model as vLLM checks them: `plugin` (or no task)
/// runs the model's pooling task; `embed&token_classify` only BGE-M3 has (its `BgeM3Pooler`).
/// `skip_reading_prefix_cache` leaves our output cache unread, as vLLM's prefix cache.
fn plugin_params(asked: &Value, spec: &ModelSpec) -> Result<ResolvedParams, PluginError> {
    let named = asked["task"].as_str();
    let unsupported = |name: &str| {
        let compound = spec.m3.then(|| EMBED_AND_TOKEN_CLASSIFY.to_string());
        let tasks = Task::py_tuple_of(spec.pooling_tasks().iter().map(|t| t.to_string()).chain(compound));
        PluginError::Plugin { status: 400, message: format!("Unsupported task: '{name}' Supported tasks: {tasks}") }
    };
    let (task, multi) = match named {
        None | Some("plugin") => (spec.pooling_task, None),
        Some(EMBED_AND_TOKEN_CLASSIFY) if spec.m3 => {
            (Task::Embed, Some(MultiOutput { dense: true, token_weights: true, ..Default::default() }))
        }
        Some(name) => match name.parse::<Task>() {
            Ok(task) if task != Task::Score && spec.supports(task) => (task, None),
            _ => return Err(unsupported(name)),
        },
    };
    let dimensions = asked["dimensions"].as_i64();
    let use_activation = asked["use_activation"].as_bool();
    let mut params = if multi.is_some() {
        // vLLM leaves a compound task's parameters to the plugin (`PoolingParams.verify` skips
        // tasks it has no rules for): BGE-M3's plugin sets `dimensions` to the full size.
        let mut params = PoolingParams { use_activation, ..Default::default() }.verify(task, spec).map_err(EngineError::from)?;
        if let Some(k) = dimensions {
            let size = spec.embedding_size as i64;
            if !(1..=size).contains(&k) {
                let message = format!("dimensions must be in [1, {size}] for {EMBED_AND_TOKEN_CLASSIFY}, got {k}");
                return Err(PluginError::Plugin { status: 400, message });
            }
            params.dimensions = (k < size).then_some(k as usize);
        }
        params
    } else {
        PoolingParams { dimensions, use_activation, ..Default::default() }.verify(task, spec).map_err(EngineError::from)?
    };
    params.multi = multi;
    if asked["skip_reading_prefix_cache"] == true {
        params.use_cache = false;
    }
    Ok(params)
}

/// An output as a plugin receives it: its shape and its values row after row. BGE-M3's
/// lexical weights (token_classify) are one number per token, a vector as vLLM hands them.
fn array_of(output: PoolingOutput, squeeze: bool) -> Result<(Vec<usize>, Vec<f32>), PluginError> {
    match output {
        PoolingOutput::Vector(values) => Ok((vec![values.len()], values)),
        PoolingOutput::Tokens(rows) if squeeze => Ok((vec![rows.len()], rows.concat())),
        PoolingOutput::Tokens(rows) => Ok((vec![rows.len(), rows.first().map_or(0, Vec::len)], rows.concat())),
        // The compound task: the dense vector, then one weight per token.
        PoolingOutput::Multi(multi) if multi.token_weights.is_some() => {
            let values: Vec<f32> = multi.dense.into_iter().flatten().chain(multi.token_weights.into_iter().flatten()).collect();
            Ok((vec![values.len()], values))
        }
        PoolingOutput::Sparse(_) | PoolingOutput::Multi(_) => Err(PluginError::Plugin {
            status: 400,
            message: "a plugin takes dense outputs: embed, classify, token_embed or token_classify".into(),
        }),
    }
}
