//! TEI's error shape (`{"error", "error_type"}` with TEI's statuses), the errors of the layers
//! below in TEI's words, and TEI's JSON body extractor, whose failures take the same shape.

use crate::api::error::{ApiError, ErrorNote};
use crate::engine::EngineError;
use crate::input::InputError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// An error in TEI's shape.
#[derive(Debug)]
pub struct TeiError {
    pub(super) status: StatusCode,
    kind: &'static str,
    message: String,
}

impl TeiError {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        TeiError { status, kind, message: message.into() }
    }

    pub(super) fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Validation", message)
    }

    pub(super) fn empty(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Empty", message)
    }

    pub(super) fn backend(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::FAILED_DEPENDENCY, "Backend", format!("Backend error: {message}"))
    }

    /// The same error with another message (TEI's NaN score keeps its kind, not its prefix).
    pub(super) fn with_message(mut self, message: &str) -> Self {
        self.message = message.to_string();
        self
    }
}

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(serde_json::json!({"error": self.message, "error_type": self.kind}))).into_response();
        response.extensions_mut().insert(ErrorNote(self.message));
        response
    }
}

/// A TEI error as TEI's gRPC server answers it (`router/src/grpc/server.rs`: `From<ErrorResponse>
/// for Status`): Validation and Empty are INVALID_ARGUMENT, Backend and Tokenizer
/// FAILED_PRECONDITION, Overloaded RESOURCE_EXHAUSTED, Unhealthy UNAVAILABLE. Ours beyond TEI: an
/// unknown model name is NOT_FOUND, a missing one with several models INVALID_ARGUMENT.
impl From<TeiError> for tonic::Status {
    fn from(e: TeiError) -> Self {
        use tonic::Code;
        let code = match (e.kind, e.status) {
            (_, StatusCode::NOT_FOUND) => Code::NotFound,
            ("Unhealthy", _) => Code::Unavailable,
            ("Overloaded", _) => Code::ResourceExhausted,
            ("Backend" | "Tokenizer", _) => Code::FailedPrecondition,
            _ => Code::InvalidArgument,
        };
        tonic::Status::new(code, e.message)
    }
}

/// Errors of the layers below, in TEI's words where TEI has them.
impl From<EngineError> for TeiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Input(e) => e.into(),
            EngineError::Overloaded(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, "Overloaded", "Model is overloaded"),
            EngineError::Model(message) => Self::backend(message),
            EngineError::Options(_) | EngineError::Setup(_) | EngineError::Load(_) | EngineError::Threads(_) => {
                Self::backend(e.to_string())
            }
            EngineError::Stopped | EngineError::Dead(_) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", "unhealthy"),
            other => Self::validation(format!("Input validation error: {other}")),
        }
    }
}

/// The input layer's errors, in TEI's words where TEI has them.
impl From<InputError> for TeiError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::InputTooLong { max, got, .. } => {
                Self::validation(format!("Input validation error: `inputs` must have less than {max} tokens. Given: {got}"))
            }
            InputError::TextTooLong { bytes, limit, .. } => {
                Self::validation(format!("Input validation error: `inputs` must have less than {limit} characters. Given: {bytes}"))
            }
            InputError::EmptyPrompt => Self::empty("Input validation error: `inputs` cannot be empty"),
            InputError::Tokenizer(message) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Tokenizer", format!("tokenizer error {message}"))
            }
            InputError::Panicked(message) => Self::backend(message),
            InputError::Stopped => Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", "unhealthy"),
            other => Self::validation(format!("Input validation error: {other}")),
        }
    }
}

/// Errors of the HTTP layer's shared steps (the model's name, admission, parameters).
impl From<ApiError> for TeiError {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::TooManyRequests(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, "Overloaded", "Model is overloaded"),
            ApiError::Unavailable(_) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", message),
            ApiError::Internal(_) => Self::backend(message),
            other => Self::new(other.status(), "Validation", message),
        }
    }
}

/// TEI's JSON body extractor: failures in TEI's error shape.
pub struct TeiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for TeiJson<T> {
    type Rejection = TeiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, TeiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            TeiError::new(rejection.status(), "Validation", format!("Failed to buffer the request body: {}", rejection.body_text()))
        })?;
        parse(&bytes).map(TeiJson)
    }
}

pub(super) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TeiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => TeiError::validation(format!("Failed to deserialize the JSON body into the target type: {e}")),
        _ => TeiError::new(StatusCode::BAD_REQUEST, "Validation", format!("Failed to parse the request body as JSON: {e}")),
    })
}

pub(super) fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, TeiError> {
    serde_json::from_value(value).map_err(|e| TeiError::validation(e.to_string()))
}

/// A body another route hands over, read as [`TeiJson`] reads a body.
pub(super) fn handed_over<T: DeserializeOwned>(body: Value) -> Result<T, TeiError> {
    serde_json::from_value(body).map_err(|e| TeiError::validation(format!("Failed to deserialize the JSON body into the target type: {e}")))
}
