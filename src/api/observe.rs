//! What operators see: `GET /metrics` (Prometheus text), the per-request tracking that feeds it,
//! and the timing headers every routed response carries: `x-total-time`,
//! `x-tokenization-time`, `x-queue-time`, `x-inference-time`, in milliseconds (three decimals;
//! queue and inference are the slowest of the request's inputs).

use super::error::ErrorNote;
use crate::metrics::{self, RequestTimings, TIMINGS};
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::{Duration, Instant};

/// The one log line of every response, inside the request's span (method, path, request id).
/// Levels say who must act: a 500 (a bug) is an ERROR; everything else is INFO, client errors
/// (4xx) and 503 (loading, draining: expected states that probes poll) included, with the
/// error message when there is one.
pub fn log_response(response: &Response, latency: Duration, _span: &tracing::Span) {
    let status = response.status().as_u16();
    let latency_ms = (latency.as_secs_f64() * 1e6).round() / 1e3;
    let model = response.extensions().get::<ModelNote>().map_or("", |m| m.0.as_str());
    match response.extensions().get::<ErrorNote>() {
        Some(ErrorNote(error)) if status == 500 => tracing::error!(status, latency_ms, model, error = %error, "request failed"),
        Some(ErrorNote(error)) => tracing::info!(status, latency_ms, model, error = %error, "request refused"),
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

/// The timing headers on answers no route matched (404, 405): `x-total-time`, and zeros for
/// the phases such a request never reached. Routed answers already carry them ([`track`]).
pub async fn timing_headers_everywhere(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !headers.contains_key("x-total-time") {
        headers.insert(HeaderName::from_static("x-total-time"), millis(started.elapsed()));
        for name in ["x-tokenization-time", "x-queue-time", "x-inference-time"] {
            headers.insert(HeaderName::from_static(name), millis(Duration::ZERO));
        }
    }
    response
}

fn millis(d: Duration) -> HeaderValue {
    HeaderValue::from_str(&format!("{:.3}", d.as_secs_f64() * 1e3)).unwrap_or(HeaderValue::from_static("0"))
}

pub async fn track(request: Request, next: Next) -> Response {
    let endpoint = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    let started = Instant::now();
    let mut in_flight = InFlight::start(endpoint, started);
    let (mut response, tokenization, queue, inference, model) = TIMINGS
        .scope(RequestTimings::default(), async {
            let response = next.run(request).await;
            let (t, q, i, m) = TIMINGS.with(|t| (t.tokenization.get(), t.queue.get(), t.inference.get(), t.model.borrow_mut().take()));
            (response, t, q, i, m)
        })
        .await;
    let total = started.elapsed();
    let model = model.unwrap_or_default();
    in_flight.finish(response.status().as_u16(), &model);
    response.extensions_mut().insert(ModelNote(model));
    let headers = response.headers_mut();
    for (name, value) in
        [("x-total-time", total), ("x-tokenization-time", tokenization), ("x-queue-time", queue), ("x-inference-time", inference)]
    {
        headers.insert(HeaderName::from_static(name), millis(value));
    }
    response
}
