//! The request log through the real router: one line per request, at INFO for client errors
//! (4xx) and for 503 while loading, with the error message; ERROR only for a 500.

mod common;

use common::*;
use poolserve::api::{self, ApiOptions, AppState};
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything the subscriber writes, for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn take(&self) -> Vec<String> {
        let text = String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap();
        text.lines().map(String::from).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_line_per_request_and_no_error_for_client_errors_or_loading() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt().with_ansi(false).with_max_level(tracing::Level::INFO).with_writer(move || writer.clone()).init();

    // Still loading: /health and model routes answer 503.
    let loading = api::router(AppState::new(vec!["m".into()], ApiOptions::default()), 1_000_000);
    assert_eq!(send(&loading, "GET", "/health", None, &[]).await.status, 503);
    assert_eq!(post(&loading, "/v1/embeddings", json!({"input": "a"})).await.status, 503);
    let lines = captured.take();
    assert_eq!(lines.len(), 2, "one line per request: {lines:#?}");
    assert!(lines.iter().all(|l| l.contains(" INFO ") && l.contains("status=503") && l.contains("still loading")), "{lines:#?}");

    let ready = router(engine(&fixture_model("bert-embed-mean"), |_| {}), 1_000_000);
    assert_eq!(post(&ready, "/v1/embeddings", json!({"input": "a"})).await.status, 200);
    assert_eq!(post(&ready, "/v1/embeddings", json!({"input": []})).await.status, 400);
    assert_eq!(post(&ready, "/v1/embeddings", json!({"input": "a", "model": "other"})).await.status, 404);
    assert_eq!(send(&ready, "GET", "/nowhere", None, &[]).await.status, 404);
    let lines: Vec<String> = captured.take().into_iter().filter(|l| l.contains("request")).collect();
    assert_eq!(lines.len(), 4, "one line per request: {lines:#?}");
    assert!(lines.iter().all(|l| l.contains(" INFO ")), "{lines:#?}");
    assert!(lines[0].contains("status=200") && lines[0].contains("path=/v1/embeddings"), "{}", lines[0]);
    assert!(lines[1].contains("status=400") && lines[1].contains("must not be an empty list"), "{}", lines[1]);
    assert!(lines[2].contains("status=404") && lines[2].contains("does not exist"), "{}", lines[2]);
}
