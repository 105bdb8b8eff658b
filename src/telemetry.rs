//! OpenTelemetry traces: one span per request, sent to an OTLP collector over gRPC.
//!
//! TEI's `--otlp-endpoint` / `--otlp-service-name` and vLLM's `--otlp-traces-endpoint` turn it
//! on. Each request (HTTP or gRPC) becomes a server span named `METHOD route` with the phases
//! of its work as children: `tokenize` (texts made into token ids), `preprocess` (images,
//! audio and video decoded and framed, where the request has them), `queue`
//! (waiting for a batch), `inference` (from the first of its batches starting to the last
//! finishing) and `postprocess` (pooling the outputs and writing the answer). A W3C
//! `traceparent` on the request makes the span a child of the caller's.
//!
//! **Why spans are made after the fact.** The phases run on other threads (tokenizer workers,
//! the model's batch loop) and are already timed for TEI's headers ([`crate::metrics`]); when
//! tracing is on, those places also note each phase's start and end, and the spans are built
//! from them with their real timestamps once the answer is ready. Nothing of this runs when
//! tracing is off, and when it is on, the request path only hands finished spans to the SDK's
//! batch exporter, which sends them from its own thread: a slow or absent collector drops
//! spans (the queue holds 2,048) and never delays an answer.
//!
//! The exporter is opentelemetry-otlp's gRPC one over the tonic already in the tree; the SDK's
//! environment variables apply (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_TRACES_SAMPLER`, …). OTLP over
//! HTTP (port 4318) is not offered: TEI and vLLM's default is gRPC.

pub use crate::metrics::Phase;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

/// Where spans go, and the service they are from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryOptions {
    /// The collector's OTLP/gRPC address, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    /// `service.name` on every span.
    pub service_name: String,
}

static TRACER: OnceLock<SdkTracer> = OnceLock::new();
/// The exporter's provider, kept to send the last spans at exit ([`shutdown`]).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry: {0}")]
pub struct TelemetryError(String);

/// Starts the exporter; call inside the tokio runtime (tonic's channel lives on it). Requests
/// are traced from then on ([`enabled`]).
pub fn start(options: &TelemetryOptions) -> Result<(), TelemetryError> {
    let endpoint = if options.endpoint.contains("://") { options.endpoint.clone() } else { format!("http://{}", options.endpoint) };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(options.service_name.clone()).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("poolserve");
    PROVIDER.set(provider).map_err(|_| TelemetryError("the exporter was started twice".into()))?;
    let _ = TRACER.set(tracer);
    Ok(())
}

/// Sends the spans still queued, waiting at most 5 s (an absent collector does not hold the
/// exit); blocks the calling thread. Nothing when tracing is off.
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!("OpenTelemetry: the last spans were not all sent: {e}");
        }
    }
}

/// Whether requests are traced (an exporter was started).
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// What a finished request's span says.
pub struct RequestSpan<'a> {
    pub method: &'a str,
    /// The route's pattern (`/v1/embeddings`), or the gRPC method's path.
    pub route: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub model: &'a str,
    pub tokens: usize,
    pub characters: usize,
    pub start: SystemTime,
    pub end: SystemTime,
}

/// The caller's trace, read from the request's `traceparent` and `tracestate` headers.
pub fn parent_from(headers: &axum::http::HeaderMap) -> Context {
    struct Headers<'a>(&'a axum::http::HeaderMap);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(axum::http::HeaderName::as_str).collect()
        }
    }
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// Sends a finished request's span and its phases' spans (a no-op when tracing is off).
/// `postprocess` runs from the end of the last phase to the answer.
pub fn record(parent: &Context, request: &RequestSpan, phases: &[Phase]) {
    let Some(tracer) = TRACER.get() else { return };
    let mut attributes = vec![
        KeyValue::new("http.request.method", request.method.to_string()),
        KeyValue::new("http.route", request.route.to_string()),
        KeyValue::new("url.path", request.path.to_string()),
        KeyValue::new("http.response.status_code", i64::from(request.status)),
    ];
    if !request.model.is_empty() {
        attributes.push(KeyValue::new("gen_ai.request.model", request.model.to_string()));
    }
    if request.tokens > 0 {
        attributes.push(KeyValue::new("gen_ai.usage.input_tokens", request.tokens as i64));
        attributes.push(KeyValue::new("poolserve.characters", request.characters as i64));
    }
    let root = tracer
        .span_builder(format!("{} {}", request.method, request.route))
        .with_kind(SpanKind::Server)
        .with_start_time(request.start)
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    let cx = parent.with_span(root);
    if request.status >= 500 {
        cx.span().set_status(Status::error(format!("HTTP {}", request.status)));
    }
    let child = |name: &'static str, start: SystemTime, end: SystemTime| {
        let mut span = tracer.span_builder(name).with_kind(SpanKind::Internal).with_start_time(start).start_with_context(tracer, &cx);
        opentelemetry::trace::Span::end_with_timestamp(&mut span, end.max(start));
    };
    for phase in phases {
        child(phase.name, phase.start, phase.end);
    }
    if let Some(last) = phases.iter().map(|p| p.end).max() {
        child("postprocess", last, request.end);
    }
    cx.span().end_with_timestamp(request.end);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_traceparent_becomes_the_parent() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
        let parent = parent_from(&headers);
        let context = parent.span().span_context().clone();
        assert!(context.is_remote() && context.is_sampled());
        assert_eq!(context.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        // No header, or a malformed one: a new trace.
        assert!(!parent_from(&axum::http::HeaderMap::new()).span().span_context().is_valid());
        headers.insert("traceparent", "00-zz-00f067aa0ba902b7-01".parse().unwrap());
        assert!(!parent_from(&headers).span().span_context().is_valid());
    }
}
