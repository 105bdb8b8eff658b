//! Our JSON body extractor: malformed JSON, wrong field types and oversized bodies all come
//! back in the API's error shape (axum's own `Json` answers them in plain text).

use super::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::response::IntoResponse;
use serde::de::DeserializeOwned;

pub struct ApiJson<T>(pub T);

/// A JSON response serialized on a blocking thread and streamed: a large body (thousands of
/// vectors, token matrices) would otherwise hold a runtime worker for tens of milliseconds,
/// delaying every other request, `/health` included, and exist twice in memory (the values and
/// their whole JSON text). Here the text leaves in [`CHUNK`]-byte pieces as it is written, at
/// most [`CHUNKS_IN_FLIGHT`] of them waiting for the client.
pub struct OffRuntimeJson<T>(pub T);

const CHUNK: usize = 64 * 1024;
const CHUNKS_IN_FLIGHT: usize = 4;

impl<T: serde::Serialize + Send + 'static> OffRuntimeJson<T> {
    pub async fn into_response(self) -> Result<axum::response::Response, ApiError> {
        let value = self.0;
        let (sender, receiver) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        tokio::task::spawn_blocking(move || {
            let mut writer = ChunkWriter { buffer: Vec::with_capacity(CHUNK), sender };
            // Our response types always serialize; a client that went away ends the writing.
            if serde_json::to_writer(&mut writer, &value).is_ok() {
                let _ = std::io::Write::flush(&mut writer);
            }
        });
        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
        // Most bodies are one chunk: sent whole, with a Content-Length. Larger ones stream.
        let mut receiver = receiver;
        let Some(first) = receiver.recv().await else {
            return Err(ApiError::Internal("serializing the response failed".into()));
        };
        let Some(second) = receiver.recv().await else {
            return Ok((json, first).into_response());
        };
        let body = axum::body::Body::new(ChunkBody { pending: vec![second, first], receiver });
        Ok((json, body).into_response())
    }
}

/// Collects the JSON text into chunks and hands each to the response body.
struct ChunkWriter {
    buffer: Vec<u8>,
    sender: tokio::sync::mpsc::Sender<Bytes>,
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK {
            self.flush()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK)));
        self.sender.blocking_send(chunk).map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client has gone"))
    }
}

/// The response body: the chunks as the writer sends them, ending when it is done.
struct ChunkBody {
    /// Chunks already received, last first.
    pending: Vec<Bytes>,
    receiver: tokio::sync::mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(bytes) = self.pending.pop() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes))));
        }
        self.receiver.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(format!("Request body too large: {}", rejection.body_text()))
            } else {
                ApiError::bad_request(format!("Could not read the request body: {}", rejection.body_text()))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))
    }
}
