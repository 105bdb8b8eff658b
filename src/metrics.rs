//! Prometheus metrics: one process-wide registry, fed by the HTTP layer (requests, latency,
//! in-flight), the engine (tokenization, tokens) and the model thread (queue, inference, batch
//! shapes, queue depth), rendered in the text exposition format at `GET /metrics`.
//!
//! A mutex around plain numbers is enough: a few updates per request or batch, at most a few
//! thousand a second, never on the per-token path.
//!
//! Written here rather than with the `prometheus-client` crate (weighed for issue 18): that
//! crate writes only the OpenMetrics format (its content type, `# EOF`, `_total` naming and
//! `# UNIT` rules), which would change `/metrics` for every scraper and dashboard that reads
//! today's Prometheus text format 0.0.4; what it would replace is a histogram, two maps and the
//! text rendering below (label values escaped by [`label_value`]). The `metrics` facade with its
//! Prometheus exporter (TEI's choice) writes 0.0.4 but brings a recorder, a global registry and
//! an HTTP stack of its own for what one mutex does here.
//!
//! Names (all prefixed `poolserve_`): `requests_total{endpoint,status}`,
//! `request_duration_seconds{endpoint}`, `tokenization_duration_seconds`,
//! `queue_duration_seconds`, `inference_duration_seconds` (histograms, per input),
//! `input_tokens_total`, `batch_size` and `batch_tokens` (histograms, per forward batch),
//! `queue_depth`, `requests_in_flight` (gauges), `cancelled_inputs_total` (inputs dropped because
//! their client went away), `model_load_seconds`.

use std::cell::Cell;
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

struct Registry {
    requests: BTreeMap<(String, u16), u64>,
    request_duration: BTreeMap<String, Histogram>,
    tokenization: Histogram,
    queue: Histogram,
    inference: Histogram,
    batch_size: Histogram,
    batch_tokens: Histogram,
    input_tokens: u64,
    cancelled_inputs: u64,
    queue_depth: usize,
    in_flight: i64,
    model_load_seconds: f64,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        requests: BTreeMap::new(),
        request_duration: BTreeMap::new(),
        tokenization: Histogram::new(SECONDS),
        queue: Histogram::new(SECONDS),
        inference: Histogram::new(SECONDS),
        batch_size: Histogram::new(SEQUENCES),
        batch_tokens: Histogram::new(TOKENS),
        input_tokens: 0,
        cancelled_inputs: 0,
        queue_depth: 0,
        in_flight: 0,
        model_load_seconds: 0.0,
    })
});

fn with(f: impl FnOnce(&mut Registry)) {
    // A poisoned lock only means a panic elsewhere mid-update; the numbers are still usable.
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut registry);
}

pub fn request_started() {
    with(|r| r.in_flight += 1);
}

pub fn request_finished(endpoint: &str, status: u16, duration: Duration) {
    with(|r| {
        r.in_flight -= 1;
        *r.requests.entry((endpoint.to_string(), status)).or_default() += 1;
        r.request_duration.entry(endpoint.to_string()).or_insert_with(|| Histogram::new(SECONDS)).observe(duration.as_secs_f64());
    });
}

pub fn tokenized(duration: Duration, tokens: usize) {
    with(|r| {
        r.tokenization.observe(duration.as_secs_f64());
        r.input_tokens += tokens as u64;
    });
}

/// One forward batch: its shape, and every input's queue wait.
pub fn batch_ran(sequences: usize, tokens: usize, inference: Duration, queue_waits: impl Iterator<Item = Duration>) {
    with(|r| {
        r.batch_size.observe(sequences as f64);
        r.batch_tokens.observe(tokens as f64);
        for wait in queue_waits {
            r.queue.observe(wait.as_secs_f64());
            r.inference.observe(inference.as_secs_f64());
        }
    });
}

pub fn queue_depth(depth: usize) {
    with(|r| r.queue_depth = depth);
}

pub fn inputs_cancelled(count: usize) {
    with(|r| r.cancelled_inputs += count as u64);
}

pub fn model_loaded(duration: Duration) {
    with(|r| r.model_load_seconds = duration.as_secs_f64());
}

/// The text exposition format.
/// A label value as the text format writes it: backslash, double quote and newline escaped.
fn label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub fn render() -> String {
    let mut out = String::new();
    with(|r| {
        let _ = writeln!(out, "# HELP poolserve_requests_total HTTP requests by endpoint and status.\n# TYPE poolserve_requests_total counter");
        for ((endpoint, status), count) in &r.requests {
            let _ = writeln!(out, "poolserve_requests_total{{endpoint=\"{}\",status=\"{status}\"}} {count}", label_value(endpoint));
        }
        let _ = writeln!(out, "# HELP poolserve_request_duration_seconds Time from request to response.\n# TYPE poolserve_request_duration_seconds histogram");
        for (endpoint, h) in &r.request_duration {
            h.render(&mut out, "poolserve_request_duration_seconds", &format!("endpoint=\"{}\"", label_value(endpoint)));
        }
        for (name, help, h) in [
            ("tokenization_duration_seconds", "Tokenizing one request's inputs.", &r.tokenization),
            ("queue_duration_seconds", "An input's wait between queueing and its batch starting.", &r.queue),
            ("inference_duration_seconds", "The forward batch an input ran in.", &r.inference),
            ("batch_size", "Sequences per forward batch.", &r.batch_size),
            ("batch_tokens", "Tokens per forward batch.", &r.batch_tokens),
        ] {
            let _ = writeln!(out, "# HELP poolserve_{name} {help}\n# TYPE poolserve_{name} histogram");
            h.render(&mut out, &format!("poolserve_{name}"), "");
        }
        for (name, kind, help, value) in [
            ("input_tokens_total", "counter", "Tokens run through the model.", r.input_tokens as f64),
            ("cancelled_inputs_total", "counter", "Queued inputs dropped because their client disconnected.", r.cancelled_inputs as f64),
            ("queue_depth", "gauge", "Inputs waiting for the model.", r.queue_depth as f64),
            ("requests_in_flight", "gauge", "Requests being answered.", r.in_flight as f64),
            ("model_load_seconds", "gauge", "Time the model took to load.", r.model_load_seconds),
        ] {
            let _ = writeln!(out, "# HELP poolserve_{name} {help}\n# TYPE poolserve_{name} {kind}\npoolserve_{name} {value}");
        }
    });
    out
}

/// Per-request phase times, collected while a handler runs (a task-local set by the HTTP
/// layer; the engine adds to it when present) and returned as response headers.
#[derive(Debug, Default)]
pub struct RequestTimings {
    pub tokenization: Cell<Duration>,
    pub queue: Cell<Duration>,
    pub inference: Cell<Duration>,
}

tokio::task_local! {
    pub static TIMINGS: RequestTimings;
}

/// Adds to the current request's timings, if the caller runs inside one.
pub fn note(f: impl FnOnce(&RequestTimings)) {
    let _ = TIMINGS.try_with(f);
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
