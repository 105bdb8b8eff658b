//! The batch commands: `poolserve embed|classify|score|encode MODEL --input FILE --output FILE`.
//!
//! The input is streamed: lines are read, parsed and sent to the engine a chunk at a time, with
//! two chunks in flight so tokenization and the model overlap, and results are written in input
//! order as JSON Lines with each input's id. Memory stays flat whatever the file size. A bad
//! line (unparsable, wrong kind, too long, …) is reported with its line number and either
//! skipped (`--skip-errors`) or ends the run with an error after everything before it is
//! written. `--shard I/N` takes every N-th line starting at line I+1, so N workers (a
//! Kubernetes Indexed Job) cover a file exactly once; `--resume` skips ids already in the output.

pub mod input;
pub mod progress;

use crate::config::{ServeArgs, ServerConfig};
use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::engine::Engine;
use crate::input::Prompt;
use crate::library::LocalModel;
use crate::pooling::PoolingOutput;
use crate::pooling::Task;
use input::{InputFormat, Payload, Record};
use serde::Serialize;
use serde_json::Value;
use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Flags of the batch commands (plus every `serve` flag that shapes the model).
#[derive(Debug, Clone, clap::Args)]
pub struct CommandArgs {
    #[command(flatten)]
    pub model: ServeArgs,
    /// Input file: JSON Lines (`{"id", "text"}`, or `{"id", "text_1", "text_2"}` for score) or
    /// plain text, one input per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Output file, JSON Lines in input order.
    #[arg(long)]
    pub output: PathBuf,
    #[arg(long, value_enum, default_value = "auto")]
    pub format: InputFormat,
    /// Report bad lines and go on (default: stop at the first one, exit status 1).
    #[arg(long)]
    pub skip_errors: bool,
    /// Process only shard I of N (0-based): lines I+1, I+1+N, I+1+2N, …
    #[arg(long)]
    pub shard: Option<String>,
    /// Append to the output, skipping inputs whose id it already holds.
    #[arg(long)]
    pub resume: bool,
    /// Inputs handed to the engine at a time (two such chunks are in flight).
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    /// `encode` only: the task (default: the model's first).
    #[arg(long)]
    pub task: Option<String>,
    /// A sentence-transformers prompt of the model, prepended to every text input (default:
    /// the model's default prompt, if any).
    #[arg(long)]
    pub prompt_name: Option<String>,
}

/// Why a batch command cannot run, stops, or skips an input; each is one line of text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The command cannot run: a flag, a model that cannot load or run its task, or a chunk's
    /// task that failed.
    #[error("{0}")]
    Setup(String),
    /// A file that cannot be read or written (the message names it).
    #[error("{0}")]
    File(String),
    /// One input that cannot run: a line that does not parse, an input the model refuses.
    #[error("{0}")]
    Input(String),
    /// The input that ends the run (without `--skip-errors`), with its line number.
    #[error("line {line}: {error}")]
    Line { line: usize, error: Box<CommandError> },
}

impl CommandError {
    /// A file's error, naming the file.
    fn file(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        CommandError::File(format!("{}: {e}", path.display()))
    }

    /// A model's error, naming the model when several are loaded.
    fn of_model(several: bool, name: &str, e: impl std::fmt::Display) -> Self {
        CommandError::Setup(if several { format!("model `{name}`: {e}") } else { e.to_string() })
    }
}

/// Which batch command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Embed,
    Classify,
    Score,
    Encode,
}

/// How a run ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub written: usize,
    pub skipped_errors: usize,
    pub skipped_done: usize,
    pub message: String,
}

/// The loaded models by served name: each record runs on the one it names.
struct Router {
    jobs: std::collections::HashMap<String, std::sync::Arc<Job>>,
    /// The model of records that name none: the only one, when one is loaded.
    only: Option<String>,
    names: Vec<String>,
}

impl Router {
    /// A chunk, split by model; each model's records run as one chunk of their own.
    async fn run_chunk(&self, records: Vec<Record>) -> ChunkResult {
        let mut groups: Vec<(std::sync::Arc<Job>, Vec<Record>)> = Vec::new();
        let mut results = Vec::new();
        for record in records {
            // With one model loaded, a line's `model` is not looked at (as before several
            // models could be loaded: OpenAI-style batch lines carry one).
            // A line naming a LoRA adapter of the model runs with it.
            let name = match &record.model {
                Some(model) if self.jobs.contains_key(model) => Some(model.clone()),
                _ => self.only.clone().or_else(|| record.model.clone()),
            };
            let job = match name.as_deref().map(|n| self.jobs.get(n).ok_or(n)) {
                Some(Ok(job)) => job,
                Some(Err(unknown)) => {
                    let message = format!("model `{unknown}` is not loaded (loaded: {})", self.names.join(", "));
                    results.push((record.line, Err(CommandError::Input(message))));
                    continue;
                }
                None => {
                    let message = format!("several models are loaded; name one in `model` ({})", self.names.join(", "));
                    results.push((record.line, Err(CommandError::Input(message))));
                    continue;
                }
            };
            match groups.iter_mut().find(|(j, _)| std::sync::Arc::ptr_eq(j, job)) {
                Some((_, group)) => group.push(record),
                None => groups.push((job.clone(), vec![record])),
            }
        }
        let mut tokens = 0;
        for (job, group) in groups {
            let (group_results, group_tokens) = job.run_chunk(group).await;
            results.extend(group_results);
            tokens += group_tokens;
        }
        (results, tokens)
    }
}

struct Job {
    engine: Engine,
    params: ResolvedParams,
    task: Task,
    labels: Vec<String>,
    /// The model, kept for its IO-processor plugin: `encode` runs plugin records (`data`)
    /// through it; `None` for other commands and models without a plugin.
    plugin_host: Option<std::sync::Arc<LocalModel>>,
    command: Command,
}

/// One chunk's outcome per line (its output line, or why it failed) and the tokens it ran.
type ChunkResult = (Vec<(usize, Result<String, CommandError>)>, usize);

impl Job {
    /// The command's task on one loaded model, with the request parameters it runs under.
    fn for_model(model: &LocalModel, command: Command, args: &CommandArgs) -> Result<Job, CommandError> {
        let spec = model.spec();
        let setup = |message: String| CommandError::Setup(message);
        let task = match command {
            Command::Embed => Task::Embed,
            Command::Classify => Task::Classify,
            Command::Score => Task::Score,
            Command::Encode => match &args.task {
                Some(name) => name.parse().map_err(|_| setup(format!("unknown task `{name}`")))?,
                None => *spec.tasks.first().ok_or_else(|| setup("the model serves no task".into()))?,
            },
        };
        let supported = if task == Task::Score { model.engine().score_mode().is_some() } else { spec.supports(task) };
        if !supported {
            return Err(setup(format!("the model does not support the {task} task")));
        }
        let params = PoolingParams::default()
            .verify(task, spec)
            .and_then(|p| p.with_prompt_name(args.prompt_name.as_deref(), spec))
            .map_err(|e| setup(e.to_string()))?;
        Ok(Job { engine: model.engine().clone(), params, task, labels: spec.labels.clone(), plugin_host: None, command })
    }

    fn line_of(&self, record: &Record, output: PoolingOutput) -> String {
        let id = &record.id;
        match (self.task, output) {
            (Task::Embed, PoolingOutput::Vector(v)) => line(id, Output::Embedding { embedding: &v }),
            (Task::Classify, PoolingOutput::Vector(probs)) => {
                let best = crate::pooling::classifier::argmax(&probs);
                line(id, Output::Classification { label: self.labels.get(best), probs: &probs })
            }
            (_, PoolingOutput::Vector(v)) => line(id, Output::Vector { data: &v }),
            (_, PoolingOutput::Tokens(t)) => line(id, Output::Tokens { data: &t }),
            (_, PoolingOutput::Sparse(s)) => {
                let data: Vec<SparseEntry> = s.iter().map(|&(index, value)| SparseEntry { index, value }).collect();
                line(id, Output::Sparse { data })
            }
            // The batch commands ask for one task at a time, never BGE-M3's outputs together.
            (_, PoolingOutput::Multi(_)) => format!("{{\"id\":{id},\"error\":\"several outputs at once are served on /pooling only\"}}"),
        }
    }

    /// Plugin records: each `data` through the model's plugin, as the library's offline plugin
    /// request runs it (one after another: the plugin's processes are driven by the model's own
    /// runtime, on a blocking thread); each line is `{"id", "data"}` with what the plugin returned.
    async fn run_plugin(&self, records: &[Record]) -> Result<(Vec<String>, usize), CommandError> {
        if self.command != Command::Encode {
            return Err(CommandError::Input("plugin records (`data`) run under `poolserve encode`".into()));
        }
        let host = self.plugin_host.clone().ok_or_else(|| CommandError::Input(crate::library::LibraryError::NoPlugin.to_string()))?;
        let data = records
            .iter()
            .map(|r| match &r.payload {
                Payload::Data(data) => Ok(data.clone()),
                _ => Err(CommandError::Input("a chunk mixes plugin records and model inputs".into())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = tokio::task::spawn_blocking(move || data.into_iter().map(|d| host.plugin(d)).collect::<Result<Vec<_>, _>>())
            .await
            .map_err(|e| CommandError::Setup(e.to_string()))?
            .map_err(|e| CommandError::Input(e.to_string()))?;
        let tokens = outputs.iter().filter_map(|o| o["usage"]["prompt_tokens"].as_u64()).sum::<u64>() as usize;
        Ok((records.iter().zip(&outputs).map(|(r, data)| line(&r.id, Output::Plugin { data })).collect(), tokens))
    }

    /// Runs records that all have the payload the task needs.
    async fn run(&self, records: &[Record]) -> Result<(Vec<String>, usize), CommandError> {
        if records.first().is_some_and(|r| matches!(r.payload, Payload::Data(_))) {
            return self.run_plugin(records).await;
        }
        let refused = |e: crate::engine::EngineError| CommandError::Input(e.to_string());
        if self.task == Task::Score {
            let (mut queries, mut documents) = (Vec::new(), Vec::new());
            for r in records {
                let Payload::Pair(q, d) = &r.payload else { return Err(CommandError::Input("score needs `text_1` and `text_2`".into())) };
                queries.push(q.clone());
                documents.push(d.clone());
            }
            let (scores, tokens) = self.engine.score(&queries, &documents, &self.params, None).await.map_err(refused)?;
            return Ok((records.iter().zip(scores).map(|(r, s)| line(&r.id, Output::Score { score: s })).collect(), tokens));
        }
        let prompts = records
            .iter()
            .map(|r| match &r.payload {
                Payload::Text(t) => Ok(Prompt::Text(t.clone())),
                Payload::Image(source) => image_bytes(source).map(Prompt::Image),
                Payload::Pair(..) => Err(CommandError::Input(format!("{} takes `text`, not a pair", self.task))),
                Payload::Data(_) => Err(CommandError::Input("a chunk mixes plugin records and model inputs".into())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (outputs, tokens) = self.engine.encode(prompts, &self.params).await.map_err(refused)?;
        Ok((records.iter().zip(outputs).map(|(r, o)| self.line_of(r, o)).collect(), tokens))
    }

    /// A chunk at once; if it fails, record by record, to name the bad lines.
    async fn run_chunk(&self, records: Vec<Record>) -> ChunkResult {
        if let Ok((lines, tokens)) = self.run(&records).await {
            return (records.iter().zip(lines).map(|(r, l)| (r.line, Ok(l))).collect(), tokens);
        }
        let (mut out, mut tokens) = (Vec::with_capacity(records.len()), 0);
        for record in records {
            let result = self.run(std::slice::from_ref(&record)).await.map(|(mut l, t)| {
                tokens += t;
                l.remove(0)
            });
            out.push((record.line, result));
        }
        (out, tokens)
    }
}

/// The bytes of a line's `image`: a data URL, or a file path.
fn image_bytes(source: &str) -> Result<Vec<u8>, CommandError> {
    if source.starts_with("data:") {
        return crate::input::image::decode_data_url(source).map_err(|e| CommandError::Input(e.to_string()));
    }
    std::fs::read(source).map_err(|e| CommandError::Input(format!("image `{source}`: {e}")))
}

/// One output line: `id` first, then the task's fields, in declaration order.
#[derive(Serialize)]
struct Line<'a> {
    id: &'a Value,
    #[serde(flatten)]
    output: Output<'a>,
}

/// The fields a task writes after the line's `id`.
#[derive(Serialize)]
#[serde(untagged)]
enum Output<'a> {
    Embedding {
        embedding: &'a [f32],
    },
    Classification {
        label: Option<&'a String>,
        probs: &'a [f32],
    },
    Score {
        score: f32,
    },
    Vector {
        data: &'a [f32],
    },
    Tokens {
        data: &'a [Vec<f32>],
    },
    Sparse {
        data: Vec<SparseEntry>,
    },
    /// What the model's IO-processor plugin returned for a record's `data`.
    Plugin {
        data: &'a Value,
    },
}

#[derive(Serialize)]
struct SparseEntry {
    index: u32,
    value: f32,
}

fn line(id: &Value, output: Output) -> String {
    // Serializing plain structs of ids, strings and finite floats cannot fail; a NaN would be
    // written as null by serde_json rather than an error.
    serde_json::to_string(&Line { id, output }).unwrap_or_else(|e| format!("{{\"id\":{id},\"error\":\"{e}\"}}"))
}

fn ids_in(path: &Path) -> Result<HashSet<String>, CommandError> {
    let file = File::open(path).map_err(|e| CommandError::file(path, e))?;
    let mut ids = HashSet::new();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|e| CommandError::file(path, e))?;
        if let Ok(value) = serde_json::from_str::<Value>(&line) {
            if let Some(id) = value.get("id") {
                ids.insert(id.to_string());
            }
        }
    }
    Ok(ids)
}

/// Runs one batch command to the end. Errors are one line each, for the command's exit.
pub fn run(command: Command, args: CommandArgs) -> Result<Summary, CommandError> {
    let shard = args.shard.as_deref().map(input::parse_shard).transpose()?;
    if args.chunk == 0 {
        return Err(CommandError::Setup("--chunk must be greater than 0".into()));
    }
    let router = std::sync::Arc::new(Router::load(command, &args)?);
    let done = if args.resume && args.output.exists() { ids_in(&args.output)? } else { HashSet::new() };
    let mut output = OutputFile::open(&args.output, args.resume, args.skip_errors)?;
    let input = File::open(&args.input).map_err(|e| CommandError::file(&args.input, e))?;
    let mut progress = progress::Progress::new(input.metadata().map(|m| m.len()).unwrap_or(0));
    let jsonl = match args.format {
        InputFormat::Jsonl => Some(true),
        InputFormat::Text => Some(false),
        InputFormat::Auto => None,
    };
    let mut reader =
        LineReader { lines: BufReader::new(input).lines(), path: &args.input, number: 0, jsonl, shard, done, exhausted: false };
    let mut summary = Summary { written: 0, skipped_errors: 0, skipped_done: 0, message: String::new() };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| CommandError::Setup(e.to_string()))?;
    let mut in_flight: VecDeque<tokio::task::JoinHandle<ChunkResult>> = VecDeque::new();
    loop {
        // Two chunks in flight while there is input, so tokenization and the model overlap.
        while in_flight.len() < 2 {
            let Some((records, early_errors)) = reader.next_chunk(args.chunk, &mut summary, &mut progress)? else { break };
            let router = router.clone();
            in_flight.push_back(runtime.spawn(async move {
                let (mut results, tokens) = router.run_chunk(records).await;
                results.extend(early_errors);
                results.sort_by_key(|(line, _)| *line);
                (results, tokens)
            }));
        }
        let Some(next) = in_flight.pop_front() else { break };
        let results = runtime.block_on(next).map_err(|e| CommandError::Setup(e.to_string()))?;
        // A failure ends the run here: the chunks in flight are dropped with the runtime.
        output.write(results, &mut summary, &mut progress)?;
    }
    summary.message = progress.finish();
    Ok(summary)
}

impl Router {
    /// Loads every model of the command line into this process (their engines share the
    /// compute pool), each with the command's job, and its LoRA adapters as jobs of their own.
    fn load(command: Command, args: &CommandArgs) -> Result<Router, CommandError> {
        let config = ServerConfig::try_from(args.model.clone()).map_err(|e| CommandError::Setup(e.to_string()))?;
        let several = config.models.len() > 1;
        let mut jobs = std::collections::HashMap::new();
        let mut names = Vec::with_capacity(config.models.len());
        for options in config.models {
            let name = options.served_name.clone();
            let model = LocalModel::load(crate::library::LocalModelOptions {
                model: options,
                engine: config.engine.clone(),
                plugins: config.plugins.clone(),
            })
            .map_err(|e| CommandError::of_model(several, &name, e))?;
            let mut job = Job::for_model(&model, command, args).map_err(|e| CommandError::of_model(several, &name, e))?;
            // Lines may name the model's LoRA adapters (--enable-lora --lora-modules).
            for adapter in model.engine().lora().map(|l| l.list()).unwrap_or_default() {
                if let Ok(adapted) = model.with_adapter(&adapter.name) {
                    let engine = adapted.engine().clone();
                    let plugin_host = (command == Command::Encode && adapted.has_plugin()).then(|| std::sync::Arc::new(adapted));
                    let adapted =
                        Job { engine, params: job.params.clone(), task: job.task, labels: job.labels.clone(), plugin_host, command };
                    jobs.insert(adapter.name.clone(), std::sync::Arc::new(adapted));
                }
            }
            names.push(model.spec().served_name.clone());
            if command == Command::Encode && model.has_plugin() {
                job.plugin_host = Some(std::sync::Arc::new(model));
            }
            jobs.insert(name, std::sync::Arc::new(job));
        }
        Ok(Router { jobs, only: (!several).then(|| names[0].clone()), names })
    }
}

/// The input file, read a chunk of records at a time.
struct LineReader<'a> {
    lines: std::io::Lines<BufReader<File>>,
    path: &'a Path,
    /// The last line read (1-based numbers).
    number: usize,
    /// Whether lines are JSON Lines; `None` until the first non-blank line says.
    jsonl: Option<bool>,
    /// `--shard I/N`: only this shard's lines.
    shard: Option<(usize, usize)>,
    /// `--resume`: ids already in the output.
    done: HashSet<String>,
    exhausted: bool,
}

impl LineReader<'_> {
    /// The next `size` records (fewer at the end of the file) and the lines that did not parse;
    /// `None` once the file is read.
    #[allow(clippy::type_complexity)]
    fn next_chunk(
        &mut self,
        size: usize,
        summary: &mut Summary,
        progress: &mut progress::Progress,
    ) -> Result<Option<(Vec<Record>, Vec<(usize, Result<String, CommandError>)>)>, CommandError> {
        if self.exhausted {
            return Ok(None);
        }
        let (mut records, mut early_errors) = (Vec::with_capacity(size), Vec::new());
        while records.len() < size {
            let Some(line) = self.lines.next() else {
                self.exhausted = true;
                break;
            };
            let line = line.map_err(|e| CommandError::file(self.path, e))?;
            self.number += 1;
            progress.bytes += line.len() as u64 + 1;
            if line.trim().is_empty() || self.shard.is_some_and(|(i, n)| input::shard_of(self.number, n) != i) {
                continue;
            }
            let is_jsonl = *self.jsonl.get_or_insert_with(|| line.trim_start().starts_with('{'));
            match input::parse_line(self.number, &line, is_jsonl) {
                Ok(record) if self.done.contains(&record.id.to_string()) => summary.skipped_done += 1,
                Ok(record) => records.push(record),
                Err(error) => early_errors.push((self.number, Err(error))),
            }
        }
        Ok(Some((records, early_errors)))
    }
}

/// The output file: finished chunks written in input order.
struct OutputFile {
    writer: BufWriter<File>,
    path: PathBuf,
    skip_errors: bool,
}

impl OutputFile {
    /// Appends to it with `--resume`, else starts it afresh.
    fn open(path: &Path, resume: bool, skip_errors: bool) -> Result<Self, CommandError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(resume)
            .truncate(!resume)
            .open(path)
            .map_err(|e| CommandError::file(path, e))?;
        Ok(OutputFile { writer: BufWriter::new(file), path: path.to_path_buf(), skip_errors })
    }

    /// Writes one finished chunk; a failed input is skipped with `--skip-errors`, else it is
    /// the run's error.
    fn write(
        &mut self,
        (results, tokens): ChunkResult,
        summary: &mut Summary,
        progress: &mut progress::Progress,
    ) -> Result<(), CommandError> {
        progress.tokens += tokens;
        for (line, result) in results {
            match result {
                Ok(text) => {
                    writeln!(self.writer, "{text}").map_err(|e| CommandError::file(&self.path, e))?;
                    summary.written += 1;
                }
                Err(error) if self.skip_errors => {
                    eprintln!("line {line}: {error} (skipped)");
                    summary.skipped_errors += 1;
                }
                Err(error) => return Err(CommandError::Line { line, error: Box::new(error) }),
            }
        }
        self.writer.flush().map_err(|e| CommandError::file(&self.path, e))?;
        progress.inputs = summary.written;
        progress.tick();
        Ok(())
    }
}
