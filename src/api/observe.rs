//! What operators see: `GET /metrics` (Prometheus text), the per-request tracking that feeds it,
//! and TEI's headers on every routed response (gRPC answers carry them as metadata):
//! `x-compute-type` (`cpu`, or `gpu+optimized` as TEI names its GPU builds), `x-compute-time`
//! and `x-total-time` (the same: the whole request), `x-compute-characters` (of the texts; a
//! pair counts both), `x-compute-tokens` (what the model read), `x-tokenization-time`,
//! `x-queue-time`, `x-inference-time`. Times are whole milliseconds, cut down, as TEI writes
//! them (a client that parses them as integers keeps working); queue and inference are the
//! slowest of the request's inputs (TEI: their mean, which hides a straggler).

use super::error::ErrorNote;
use crate::metrics::{self, RequestTimings, TimingSnapshot, TIMINGS};
use crate::telemetry;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime};

/// The one log line of every response, inside the request's span (method, path, request id).
/// Levels say who must act: a 500 (a bug) is an ERROR; everything else is INFO, client errors
/// (4xx) and 503 (loading, draining: expected states that probes poll) included, with the
/// error message when there is one. A refused gRPC call counts as its status's HTTP
/// equivalent, with its `grpc-message`.
pub fn log_response(response: &Response, latency: Duration, _span: &tracing::Span) {
    let grpc_status = super::grpc::http_status_of(response);
    let status = grpc_status.unwrap_or(response.status().as_u16());
    let latency_ms = (latency.as_secs_f64() * 1e6).round() / 1e3;
    let model = response.extensions().get::<ModelNote>().map_or("", |m| m.0.as_str());
    let error = match response.extensions().get::<ErrorNote>() {
        Some(ErrorNote(error)) => Some(std::borrow::Cow::Borrowed(error.as_str())),
        None if grpc_status.is_some_and(|s| s != 200) => super::grpc::message_of(response.headers()).map(std::borrow::Cow::Owned),
        None => None,
    };
    match error {
        Some(error) if status == 500 => tracing::error!(status, latency_ms, model, error = %error, "request failed"),
        Some(error) => tracing::info!(status, latency_ms, model, error = %error, "request refused"),
        None => tracing::info!(status, latency_ms, model, "request done"),
    }
}

/// The served name of the model a request resolved to, carried to its log line.
#[derive(Debug, Clone)]
pub struct ModelNote(pub String);

pub async fn metrics_text() -> impl IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render())
}

/// One request in `requests_in_flight`: counted out when it finishes, or, when the client
/// disconnects and its handler is dropped mid-way, when the guard is dropped (as status 499,
/// nginx's "client closed request"), so the gauge always returns to zero.
struct InFlight {
    endpoint: String,
    started: Instant,
    done: bool,
}

impl InFlight {
    fn start(endpoint: String, started: Instant) -> Self {
        metrics::request_started();
        Self { endpoint, started, done: false }
    }

    fn finish(&mut self, status: u16, model: &str) {
        if !self.done {
            self.done = true;
            metrics::request_finished(&self.endpoint, status, model, self.started.elapsed());
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Unwinding from a handler panic: the client gets a 500 (CatchPanicLayer).
        self.finish(if std::thread::panicking() { 500 } else { CLIENT_CLOSED_REQUEST }, "");
    }
}

const CLIENT_CLOSED_REQUEST: u16 = 499;

/// TEI's headers on answers no route matched (404, 405): the total time, and zeros for the
/// work such a request never reached. Routed answers already carry them ([`track`]).
pub async fn timing_headers_everywhere(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let mut response = next.run(request).await;
    if !response.headers().contains_key("x-total-time") {
        for (name, value) in compute_headers(&TimingSnapshot::default(), started.elapsed()) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// TEI's response headers for a request's work ([`TimingSnapshot`]) and its total time.
pub fn compute_headers(work: &TimingSnapshot, total: Duration) -> [(HeaderName, HeaderValue); 8] {
    let millis = |d: Duration| HeaderValue::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    [
        (HeaderName::from_static("x-compute-type"), HeaderValue::from_static(if work.on_gpu { "gpu+optimized" } else { "cpu" })),
        (HeaderName::from_static("x-compute-time"), millis(total)),
        (HeaderName::from_static("x-compute-characters"), HeaderValue::from(work.characters)),
        (HeaderName::from_static("x-compute-tokens"), HeaderValue::from(work.tokens)),
        (HeaderName::from_static("x-total-time"), millis(total)),
        (HeaderName::from_static("x-tokenization-time"), millis(work.tokenization)),
        (HeaderName::from_static("x-queue-time"), millis(work.queue)),
        (HeaderName::from_static("x-inference-time"), millis(work.inference)),
    ]
}

pub async fn track(request: Request, next: Next) -> Response {
    let endpoint = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    let started = Instant::now();
    let trace = telemetry::enabled().then(|| TraceStart {
        parent: telemetry::parent_from(request.headers()),
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        start: SystemTime::now(),
    });
    let mut in_flight = InFlight::start(endpoint.clone(), started);
    let timings = RequestTimings { phases: RefCell::new(trace.as_ref().map(|_| Vec::new())), ..RequestTimings::default() };
    let (mut response, work, model, phases) = TIMINGS
        .scope(timings, async {
            let response = next.run(request).await;
            let (work, model, phases) = TIMINGS.with(|t| (t.snapshot(), t.model.borrow_mut().take(), t.phases.borrow_mut().take()));
            (response, work, model, phases)
        })
        .await;
    let total = started.elapsed();
    let model = model.unwrap_or_default();
    // A gRPC call answers HTTP 200 whatever its outcome: count its gRPC status instead.
    let status = super::grpc::http_status_of(&response).unwrap_or(response.status().as_u16());
    // The span goes before the request counts as finished: a draining server exits once
    // none is in flight, and flushes the spans it has at that moment.
    if let Some(trace) = trace {
        // A gRPC service is routed by a wildcard: its span is named by the method's path.
        let route = if endpoint.contains("{*") || endpoint.is_empty() { trace.path.as_str() } else { endpoint.as_str() };
        let span = telemetry::RequestSpan {
            method: &trace.method,
            route,
            path: &trace.path,
            status,
            model: &model,
            tokens: work.tokens,
            characters: work.characters,
            start: trace.start,
            end: SystemTime::now(),
        };
        telemetry::record(&trace.parent, &span, &phases.unwrap_or_default());
    }
    in_flight.finish(status, &model);
    response.extensions_mut().insert(ModelNote(model));
    for (name, value) in compute_headers(&work, total) {
        response.headers_mut().insert(name, value);
    }
    response
}

/// What a traced request's span needs from its start.
struct TraceStart {
    parent: opentelemetry::Context,
    method: String,
    path: String,
    start: SystemTime,
}
