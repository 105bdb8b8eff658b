//! Prometheus metrics: one process-wide registry, fed by the HTTP layer (requests, latency,
//! in-flight), the engine (tokenization, tokens) and the model thread (queue, inference, batch
//! shapes, queue depth), rendered in the text exposition format at `GET /metrics`.
//!
//! A mutex around plain numbers is enough: a few updates per request or batch, at most a few
//! thousand a second, never on the per-token path.
//!
//! Written here rather than with the `prometheus-client` crate (weighed and set aside): that
//! crate writes only the OpenMetrics format (its content type, `# EOF`, `_total` naming and
//! `# UNIT` rules), which would change `/metrics` for every scraper and dashboard that reads
//! today's Prometheus text format 0.0.4; what it would replace is a histogram, two maps and the
//! text rendering below (label values escaped by [`label_value`]). The `metrics` facade with its
//! Prometheus exporter (TEI's choice) writes 0.0.4 but brings a recorder, a global registry and
//! an HTTP stack of its own for what one mutex does here.
//!
//! Names (all prefixed `poolserve_`): `requests_total{endpoint,status,model}`,
//! `request_duration_seconds{endpoint,model}`, and per `{model}`:
//! `tokenization_duration_seconds`, `queue_duration_seconds`, `inference_duration_seconds`
//! (histograms, per input), `input_tokens_total`, `batch_size` and `batch_tokens` (histograms,
//! per forward batch), `queue_depth` (gauge), `cancelled_inputs_total` (inputs dropped because
//! their client went away), `model_load_seconds`, `model_loads_total`, `model_unloads_total`
//! and `model_resident` (1 while loaded; models on demand load and unload while serving);
//! `requests_in_flight` (gauge, server-wide).
//! With `--cache-size`, per `{model}`: `cache_hits_total`, `cache_misses_total`,
//! `cache_entries`, `cache_bytes`. `model` is the served name; requests that resolved no model
//! (404s, /health) have `model=""`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

const SECONDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const SEQUENCES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
const TOKENS: &[f64] = &[16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];

#[derive(Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count);
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

/// One model's series.
struct ModelSeries {
    tokenization: Histogram,
    queue: Histogram,
    inference: Histogram,
    batch_size: Histogram,
    batch_tokens: Histogram,
    input_tokens: u64,
    cancelled_inputs: u64,
    queue_depth: usize,
    load_seconds: f64,
    loads: u64,
    unloads: u64,
    resident: bool,
}

impl Default for ModelSeries {
    fn default() -> Self {
        ModelSeries {
            tokenization: Histogram::new(SECONDS),
            queue: Histogram::new(SECONDS),
            inference: Histogram::new(SECONDS),
            batch_size: Histogram::new(SEQUENCES),
            batch_tokens: Histogram::new(TOKENS),
            input_tokens: 0,
            cancelled_inputs: 0,
            queue_depth: 0,
            load_seconds: 0.0,
            loads: 0,
            unloads: 0,
            resident: false,
        }
    }
}

#[derive(Default)]
struct Registry {
    /// (endpoint, status, model) → count; `model` is empty where a request named none that
    /// resolved (404s, /health, /metrics).
    requests: BTreeMap<(String, u16, String), u64>,
    request_duration: BTreeMap<(String, String), Histogram>,
    models: BTreeMap<String, ModelSeries>,
    /// (model, plugin, outcome) → plugin requests; (model, plugin) → their time and the
    /// plugin processes started (the first, and one after each crash, hang or memory flood).
    plugin_calls: BTreeMap<(String, String, &'static str), u64>,
    plugin_duration: BTreeMap<(String, String), Histogram>,
    plugin_processes: BTreeMap<(String, String), u64>,
    /// model → its output cache's numbers (`--cache-size`).
    caches: BTreeMap<String, CacheSeries>,
    in_flight: i64,
}

#[derive(Default)]
struct CacheSeries {
    hits: u64,
    misses: u64,
    entries: usize,
    bytes: usize,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));

fn with(f: impl FnOnce(&mut Registry)) {
    // A poisoned lock only means a panic elsewhere mid-update; the numbers are still usable.
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut registry);
}

fn with_model(model: &str, f: impl FnOnce(&mut ModelSeries)) {
    with(|r| match r.models.get_mut(model) {
        Some(series) => f(series),
        None => f(r.models.entry(model.to_string()).or_default()),
    });
}

/// Requests being answered now (`requests_in_flight`).
pub fn in_flight() -> i64 {
    let mut count = 0;
    with(|r| count = r.in_flight);
    count
}

pub fn request_started() {
    with(|r| r.in_flight += 1);
}

pub fn request_finished(endpoint: &str, status: u16, model: &str, duration: Duration) {
    with(|r| {
        r.in_flight -= 1;
        *r.requests.entry((endpoint.to_string(), status, model.to_string())).or_default() += 1;
        r.request_duration
            .entry((endpoint.to_string(), model.to_string()))
            .or_insert_with(|| Histogram::new(SECONDS))
            .observe(duration.as_secs_f64());
    });
}

pub fn tokenized(model: &str, duration: Duration, tokens: usize) {
    with_model(model, |m| {
        m.tokenization.observe(duration.as_secs_f64());
        m.input_tokens += tokens as u64;
    });
}

/// One forward batch: its shape, and every input's queue wait.
pub fn batch_ran(model: &str, sequences: usize, tokens: usize, inference: Duration, queue_waits: impl Iterator<Item = Duration>) {
    with_model(model, |m| {
        m.batch_size.observe(sequences as f64);
        m.batch_tokens.observe(tokens as f64);
        for wait in queue_waits {
            m.queue.observe(wait.as_secs_f64());
            m.inference.observe(inference.as_secs_f64());
        }
    });
}

pub fn queue_depth(model: &str, depth: usize) {
    with_model(model, |m| m.queue_depth = depth);
}

pub fn inputs_cancelled(model: &str, count: usize) {
    with_model(model, |m| m.cancelled_inputs += count as u64);
}

pub fn model_loaded(model: &str, duration: Duration) {
    with_model(model, |m| {
        m.load_seconds = duration.as_secs_f64();
        m.loads += 1;
        m.resident = true;
    });
}

/// A model on demand was unloaded (evicted for another, idle, or asked to).
pub fn model_unloaded(model: &str) {
    with_model(model, |m| {
        m.unloads += 1;
        m.resident = false;
    });
}

/// A plugin request ended with `outcome` (`ok`, `rejected`, `timeout`, `crashed`, `error`).
pub fn plugin_call(model: &str, plugin: &str, outcome: &'static str, duration: Duration) {
    with(|r| {
        *r.plugin_calls.entry((model.to_string(), plugin.to_string(), outcome)).or_default() += 1;
        r.plugin_duration
            .entry((model.to_string(), plugin.to_string()))
            .or_insert_with(|| Histogram::new(SECONDS))
            .observe(duration.as_secs_f64());
    });
}

/// A plugin process started (after the first: a restart).
pub fn plugin_process_started(model: &str, plugin: &str) {
    with(|r| *r.plugin_processes.entry((model.to_string(), plugin.to_string())).or_default() += 1);
}

/// A request's lookups in `model`'s output cache: `hits` found, `misses` not.
pub fn cache_lookups(model: &str, hits: usize, misses: usize) {
    with(|r| {
        let series = r.caches.entry(model.to_string()).or_default();
        series.hits += hits as u64;
        series.misses += misses as u64;
    });
}

/// `model`'s output cache holds `entries` outputs, counted as `bytes`.
pub fn cache_size(model: &str, entries: usize, bytes: usize) {
    with(|r| {
        let series = r.caches.entry(model.to_string()).or_default();
        (series.entries, series.bytes) = (entries, bytes);
    });
}

/// A label value as the text format writes it: backslash, double quote and newline escaped.
fn label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The text exposition format.
pub fn render() -> String {
    let mut out = String::new();
    with(|r| {
        let _ = writeln!(
            out,
            "# HELP poolserve_requests_total HTTP requests by endpoint, status and model.\n# TYPE poolserve_requests_total counter"
        );
        for ((endpoint, status, model), count) in &r.requests {
            let _ = writeln!(
                out,
                "poolserve_requests_total{{endpoint=\"{}\",status=\"{status}\",model=\"{}\"}} {count}",
                label_value(endpoint),
                label_value(model)
            );
        }
        let _ = writeln!(
            out,
            "# HELP poolserve_request_duration_seconds Time from request to response.\n# TYPE poolserve_request_duration_seconds histogram"
        );
        for ((endpoint, model), h) in &r.request_duration {
            let labels = format!("endpoint=\"{}\",model=\"{}\"", label_value(endpoint), label_value(model));
            h.render(&mut out, "poolserve_request_duration_seconds", &labels);
        }
        type Pick = fn(&ModelSeries) -> &Histogram;
        let histograms: [(&str, &str, Pick); 5] = [
            ("tokenization_duration_seconds", "Tokenizing one request's inputs.", |m| &m.tokenization),
            ("queue_duration_seconds", "An input's wait between queueing and its batch starting.", |m| &m.queue),
            ("inference_duration_seconds", "The forward batch an input ran in.", |m| &m.inference),
            ("batch_size", "Sequences per forward batch.", |m| &m.batch_size),
            ("batch_tokens", "Tokens per forward batch.", |m| &m.batch_tokens),
        ];
        for (name, help, pick) in histograms {
            let _ = writeln!(out, "# HELP poolserve_{name} {help}\n# TYPE poolserve_{name} histogram");
            for (model, series) in &r.models {
                pick(series).render(&mut out, &format!("poolserve_{name}"), &format!("model=\"{}\"", label_value(model)));
            }
        }
        type Value = fn(&ModelSeries) -> f64;
        let values: [(&str, &str, &str, Value); 7] = [
            ("input_tokens_total", "counter", "Tokens run through the model.", |m| m.input_tokens as f64),
            ("cancelled_inputs_total", "counter", "Queued inputs dropped because their client disconnected.", |m| {
                m.cancelled_inputs as f64
            }),
            ("queue_depth", "gauge", "Inputs waiting for the model.", |m| m.queue_depth as f64),
            ("model_load_seconds", "gauge", "Time the model took to load.", |m| m.load_seconds),
            ("model_loads_total", "counter", "Times the model was loaded.", |m| m.loads as f64),
            ("model_unloads_total", "counter", "Times the model was unloaded (models on demand).", |m| m.unloads as f64),
            ("model_resident", "gauge", "1 while the model is loaded.", |m| f64::from(u8::from(m.resident))),
        ];
        for (name, kind, help, value) in values {
            let _ = writeln!(out, "# HELP poolserve_{name} {help}\n# TYPE poolserve_{name} {kind}");
            for (model, series) in &r.models {
                let _ = writeln!(out, "poolserve_{name}{{model=\"{}\"}} {}", label_value(model), value(series));
            }
        }
        render_plugins(r, &mut out);
        render_caches(r, &mut out);
        let _ = writeln!(
            out,
            "# HELP poolserve_requests_in_flight Requests being answered.\n# TYPE poolserve_requests_in_flight gauge\npoolserve_requests_in_flight {}",
            r.in_flight
        );
    });
    out
}

fn render_caches(r: &Registry, out: &mut String) {
    type Value = fn(&CacheSeries) -> f64;
    let values: [(&str, &str, &str, Value); 4] = [
        ("cache_hits_total", "counter", "Inputs whose output the output cache held (the model did not run them).", |c| c.hits as f64),
        ("cache_misses_total", "counter", "Inputs the output cache was asked for and did not hold.", |c| c.misses as f64),
        ("cache_entries", "gauge", "Outputs in the output cache.", |c| c.entries as f64),
        ("cache_bytes", "gauge", "Bytes the output cache counts for its outputs (at most --cache-size).", |c| c.bytes as f64),
    ];
    for (name, kind, help, value) in values.iter().filter(|_| !r.caches.is_empty()) {
        let _ = writeln!(out, "# HELP poolserve_{name} {help}\n# TYPE poolserve_{name} {kind}");
        for (model, series) in &r.caches {
            let _ = writeln!(out, "poolserve_{name}{{model=\"{}\"}} {}", label_value(model), value(series));
        }
    }
}

fn render_plugins(r: &Registry, out: &mut String) {
    if r.plugin_processes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP poolserve_plugin_requests_total IO-processor plugin requests by outcome.\n# TYPE poolserve_plugin_requests_total counter"
    );
    for ((model, plugin, outcome), count) in &r.plugin_calls {
        let _ = writeln!(
            out,
            "poolserve_plugin_requests_total{{model=\"{}\",plugin=\"{}\",outcome=\"{outcome}\"}} {count}",
            label_value(model),
            label_value(plugin)
        );
    }
    let _ = writeln!(out, "# HELP poolserve_plugin_request_duration_seconds A plugin request from pre_process to post_process.\n# TYPE poolserve_plugin_request_duration_seconds histogram");
    for ((model, plugin), h) in &r.plugin_duration {
        let labels = format!("model=\"{}\",plugin=\"{}\"", label_value(model), label_value(plugin));
        h.render(out, "poolserve_plugin_request_duration_seconds", &labels);
    }
    let _ = writeln!(out, "# HELP poolserve_plugin_processes_started_total Plugin processes started (more than the first: restarts).\n# TYPE poolserve_plugin_processes_started_total counter");
    for ((model, plugin), count) in &r.plugin_processes {
        let _ = writeln!(
            out,
            "poolserve_plugin_processes_started_total{{model=\"{}\",plugin=\"{}\"}} {count}",
            label_value(model),
            label_value(plugin)
        );
    }
}

/// Per-request phase times, collected while a handler runs (a task-local set by the HTTP
/// layer; the engine adds to it when present) and returned as response headers.
#[derive(Debug, Default)]
pub struct RequestTimings {
    pub tokenization: Cell<Duration>,
    pub queue: Cell<Duration>,
    pub inference: Cell<Duration>,
    /// Characters of the request's texts (TEI's `x-compute-characters`: a pair counts both).
    pub characters: Cell<usize>,
    /// Tokens the model read for the request, images' tokens included (`x-compute-tokens`).
    pub tokens: Cell<usize>,
    /// The model ran on a GPU (`x-compute-type`).
    pub on_gpu: Cell<bool>,
    /// The served name of the model the request resolved to, once it has.
    pub model: RefCell<Option<String>>,
    /// The phases of the work with their times, for the request's trace; `None` (nothing
    /// noted) when requests are not traced.
    pub phases: RefCell<Option<Vec<Phase>>>,
}

/// One timed phase of a request's work (`tokenize`, `queue`, `inference`…), a child span of
/// the request's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub name: &'static str,
    pub start: std::time::SystemTime,
    pub end: std::time::SystemTime,
}

impl RequestTimings {
    /// The numbers so far (the model's name left where it is).
    pub fn snapshot(&self) -> TimingSnapshot {
        TimingSnapshot {
            tokenization: self.tokenization.get(),
            queue: self.queue.get(),
            inference: self.inference.get(),
            characters: self.characters.get(),
            tokens: self.tokens.get(),
            on_gpu: self.on_gpu.get(),
        }
    }
}

/// A request's [`RequestTimings`] once it is done, as the response reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimingSnapshot {
    pub tokenization: Duration,
    pub queue: Duration,
    pub inference: Duration,
    pub characters: usize,
    pub tokens: usize,
    pub on_gpu: bool,
}

impl TimingSnapshot {
    /// Adds the work of a part that ran beside the others (a stream's messages): characters
    /// and tokens add up, times are the longest part's (they overlapped), on a GPU if any was.
    pub fn merge(&mut self, part: &TimingSnapshot) {
        self.characters += part.characters;
        self.tokens += part.tokens;
        self.tokenization = self.tokenization.max(part.tokenization);
        self.queue = self.queue.max(part.queue);
        self.inference = self.inference.max(part.inference);
        self.on_gpu |= part.on_gpu;
    }
}

tokio::task_local! {
    pub static TIMINGS: RequestTimings;
}

/// Records the model the current request resolved to (its metrics and log line carry it).
pub fn note_model(name: &str) {
    let _ = TIMINGS.try_with(|t| *t.model.borrow_mut() = Some(name.to_string()));
}

/// Adds to the current request's timings, if the caller runs inside one.
pub fn note(f: impl FnOnce(&RequestTimings)) {
    let _ = TIMINGS.try_with(f);
}

/// Adds `took` (from `started`) to the current request's tokenization time (TEI's
/// `x-tokenization-time`, media preprocessing included) and notes it as the phase `name`
/// (`tokenize`, `preprocess`) of its trace.
pub fn note_tokenization(name: &'static str, started: std::time::Instant, took: Duration) {
    note(|t| t.tokenization.set(t.tokenization.get() + took));
    note_phase(name, started, took);
}

/// Notes a phase of the current request's work that began at `started` and took `took`, when
/// the request is traced (the wall-clock start is read back from the monotonic one).
pub fn note_phase(name: &'static str, started: std::time::Instant, took: Duration) {
    let _ = TIMINGS.try_with(|t| {
        if let Some(phases) = t.phases.borrow_mut().as_mut() {
            let start = std::time::SystemTime::now() - started.elapsed();
            phases.push(Phase { name, start, end: start + took });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(0.5);
        h.observe(1.5);
        h.observe(9.0);
        assert_eq!(h.counts, vec![1, 2]);
        let mut out = String::new();
        h.render(&mut out, "x", "");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3"));
        assert!(out.contains("x_sum 11"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label_value("line\nbreak"), "line\\nbreak");
        assert_eq!(label_value("/v1/embeddings"), "/v1/embeddings");
    }
}
