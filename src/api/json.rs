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
/// most [`CHUNKS_IN_FLIGHT`] of them waiting for the client. A client that reads nothing for
/// [`STALLED_CLIENT`] loses the connection, so that it cannot hold the writing thread.
pub struct OffRuntimeJson<T>(pub T);

const CHUNK: usize = 64 * 1024;
const CHUNKS_IN_FLIGHT: usize = 4;
const STALLED_CLIENT: std::time::Duration = std::time::Duration::from_secs(60);

/// A piece of the body, or the writing's failure (which aborts the connection: the status has
/// already gone out as 200).
type Chunk = Result<Bytes, std::io::Error>;

impl<T: serde::Serialize + Send + 'static> OffRuntimeJson<T> {
    /// The response; `permit` (the request's admission) is held until the body has been sent,
    /// so streamed bodies count against `--max-concurrent-requests`.
    pub async fn into_response(self, permit: tokio::sync::OwnedSemaphorePermit) -> Result<axum::response::Response, ApiError> {
        let value = self.0;
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<Chunk>(CHUNKS_IN_FLIGHT);
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let mut writer = ChunkWriter { buffer: Vec::with_capacity(CHUNK), sender, runtime };
            let written =
                serde_json::to_writer(&mut writer, &value).map_err(std::io::Error::from).and_then(|()| std::io::Write::flush(&mut writer));
            if let Err(e) = written {
                // Ends the body with an error, so that the connection is aborted rather than
                // closed as if the JSON were complete.
                let _ = writer.runtime.block_on(tokio::time::timeout(STALLED_CLIENT, writer.sender.send(Err(e))));
            }
        });
        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
        let failed = |e: std::io::Error| ApiError::Internal(format!("serializing the response failed: {e}"));
        // Most bodies are one chunk: sent whole, with a Content-Length. Larger ones stream.
        let first = match receiver.recv().await {
            Some(chunk) => chunk.map_err(failed)?,
            None => return Err(ApiError::Internal("serializing the response failed".into())),
        };
        let second = match receiver.recv().await {
            Some(chunk) => chunk.map_err(failed)?,
            None => return Ok((json, first).into_response()),
        };
        let body = axum::body::Body::new(ChunkBody { pending: vec![second, first], receiver, _permit: permit });
        Ok((json, body).into_response())
    }
}

/// Collects the JSON text into chunks and hands each to the response body.
struct ChunkWriter {
    buffer: Vec<u8>,
    sender: tokio::sync::mpsc::Sender<Chunk>,
    runtime: tokio::runtime::Handle,
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
        let gone = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client has gone or stopped reading");
        match self.runtime.block_on(tokio::time::timeout(STALLED_CLIENT, self.sender.send(Ok(chunk)))) {
            Ok(Ok(())) => Ok(()),
            _ => Err(gone()),
        }
    }
}

/// The response body: the chunks as the writer sends them, ending when it is done.
struct ChunkBody {
    /// Chunks already received, last first.
    pending: Vec<Bytes>,
    receiver: tokio::sync::mpsc::Receiver<Chunk>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(bytes) = self.pending.pop() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes))));
        }
        self.receiver.poll_recv(cx).map(|chunk| chunk.map(|piece| piece.map(http_body::Frame::data)))
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
        serde_json::from_slice(&bytes).map(ApiJson).map_err(invalid_body)
    }
}

/// A request body already parsed (`/invocations`, `/vertex` dispatch by its shape) as the
/// request type of the route it goes to, refused as [`ApiJson`] refuses a body.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(invalid_body)
}

fn invalid_body(e: serde_json::Error) -> ApiError {
    let text = e.to_string();
    match crate::engine::literal::recognize(&text) {
        Some((param, message)) => ApiError::BadRequest { message, param: Some(param) },
        None => ApiError::bad_request(format!("Invalid JSON body: {text}")),
    }
}

/// `#[serde(deserialize_with = "object")]`: a nested struct read from a JSON object only.
/// serde's derived structs also take an array of their fields in order, so that
/// `"parameters": []` would pass as every default (schemathesis found it on `/similarity`),
/// where the schema (ours and TEI's) says object.
pub fn object<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    struct ObjectOnly<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for ObjectOnly<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(ObjectOnly(std::marker::PhantomData))
}

/// [`object`] for an optional field: `null` (or, with `#[serde(default)]`, no field) is `None`.
pub fn optional_object<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    struct Optional<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Optional<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
            object(deserializer).map(Some)
        }
    }
    deserializer.deserialize_option(Optional(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Inner {
        #[serde(default)]
        flag: Option<bool>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        #[serde(deserialize_with = "super::object")]
        required: Inner,
        #[serde(default, deserialize_with = "super::optional_object")]
        optional: Option<Inner>,
    }

    #[test]
    fn nested_structs_are_read_from_objects_only() {
        let read = |text: &str| serde_json::from_str::<Outer>(text).map_err(|e| e.to_string());
        let set = Inner { flag: Some(true) };
        assert_eq!(read(r#"{"required": {"flag": true}}"#), Ok(Outer { required: set, optional: None }));
        assert_eq!(read(r#"{"required": {}, "optional": null}"#), Ok(Outer { required: Inner::default(), optional: None }));
        assert_eq!(read(r#"{"required": {}, "optional": {}}"#), Ok(Outer { required: Inner::default(), optional: Some(Inner::default()) }));
        // serde's derive alone would take both arrays as every default.
        assert!(read(r#"{"required": []}"#).unwrap_err().starts_with("invalid type: sequence, expected an object"));
        assert!(read(r#"{"required": {}, "optional": []}"#).unwrap_err().starts_with("invalid type: sequence, expected an object"));
        assert!(read(r#"{"required": {}, "optional": 3}"#).is_err());
    }
}
