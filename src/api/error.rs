//! The one error type of the HTTP layer. Every failure, from any layer, becomes an
//! [`ApiError`] and leaves as `{"error": {"message", "type", "param", "code"}}` with the status
//! of docs/http-api.md's table.

use crate::engine::params::ParamsError;
use crate::engine::EngineError;
use crate::input::InputError;
use crate::plugin::PluginError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    BadRequest { message: String, param: Option<&'static str> },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    NotFound(String),
    /// A route that vLLM does not register for this model (its pooling task has no such
    /// endpoint): FastAPI's own 404, `{"detail": "Not Found"}`, which vLLM's clients and tests
    /// match on.
    #[error("Not Found")]
    RouteNotFound,
    /// A route the model's tasks have but its pooling task does not serve (vLLM's 501).
    #[error("{0}")]
    NotImplemented(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    Unavailable(String),
    /// Work that did not finish in its time (a plugin past `--plugin-timeout`).
    #[error("{0}")]
    Timeout(String),
}

/// The body of every error response.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorInfo,
}

/// FastAPI's body for a route vLLM does not register for the model: `{"detail": "Not Found"}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DetailBody {
    pub detail: String,
}

/// TEI's error body (its routes: `api/tei/`): `{"error": message, "error_type": kind}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TeiErrorBody {
    pub error: String,
    pub error_type: String,
}

/// A 404: an unknown model (our shape), or a route the model's tasks lack (FastAPI's).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum NotFoundBody {
    Error(ErrorBody),
    Detail(DetailBody),
}

/// Any of the three shapes, for routes that also answer for TEI's bodies (`/rerank`,
/// `/tokenize`, `/invocations`).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum AnyErrorBody {
    Error(ErrorBody),
    Detail(DetailBody),
    Tei(TeiErrorBody),
}

/// The error responses of every model route, for the OpenAPI description (one list, used by
/// each handler's annotation).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum ErrorResponses {
    #[response(status = 400, description = "invalid request (docs/http-api.md's messages)")]
    BadRequest(ErrorBody),
    #[response(status = 401, description = "missing or wrong API key")]
    Unauthorized(ErrorBody),
    #[response(status = 404, description = "unknown model, or a route the model's tasks lack (vLLM's `{\"detail\": \"Not Found\"}`)")]
    NotFound(NotFoundBody),
    #[response(status = 413, description = "body over --payload-limit")]
    PayloadTooLarge(ErrorBody),
    #[response(status = 429, description = "at --max-concurrent-requests")]
    TooManyRequests(ErrorBody),
    #[response(status = 501, description = "a task the model has but does not serve (its pooling task is another)")]
    NotImplemented(ErrorBody),
    #[response(status = 503, description = "loading or shutting down")]
    Unavailable(ErrorBody),
}

/// The error responses of TEI's routes, in TEI's shape (a missing API key is ours).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum TeiErrorResponses {
    #[response(status = 400, description = "invalid JSON, or an empty input (`Empty`)")]
    BadRequest(TeiErrorBody),
    #[response(status = 401, description = "missing or wrong API key")]
    Unauthorized(ErrorBody),
    #[response(status = 404, description = "unknown model")]
    NotFound(TeiErrorBody),
    #[response(status = 413, description = "body over --payload-limit")]
    PayloadTooLarge(TeiErrorBody),
    #[response(status = 422, description = "invalid request (`Validation`, `Tokenizer`)")]
    Unprocessable(TeiErrorBody),
    #[response(status = 424, description = "the model is not of the route's kind (`Backend`)")]
    FailedDependency(TeiErrorBody),
    #[response(status = 429, description = "at --max-concurrent-requests (`Overloaded`)")]
    TooManyRequests(TeiErrorBody),
    #[response(status = 503, description = "loading or shutting down (`Unhealthy`)")]
    Unavailable(TeiErrorBody),
}

/// The error responses of routes that answer TEI's bodies too.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum AnyErrorResponses {
    #[response(status = 400, description = "invalid request")]
    BadRequest(AnyErrorBody),
    #[response(status = 401, description = "missing or wrong API key")]
    Unauthorized(ErrorBody),
    #[response(status = 404, description = "unknown model, or a route the model's tasks lack")]
    NotFound(AnyErrorBody),
    #[response(status = 413, description = "body over --payload-limit")]
    PayloadTooLarge(AnyErrorBody),
    #[response(status = 422, description = "invalid TEI request")]
    Unprocessable(TeiErrorBody),
    #[response(status = 424, description = "the model is not of the TEI route's kind")]
    FailedDependency(TeiErrorBody),
    #[response(status = 429, description = "at --max-concurrent-requests")]
    TooManyRequests(AnyErrorBody),
    #[response(status = 501, description = "a task the model has but does not serve")]
    NotImplemented(ErrorBody),
    #[response(status = 503, description = "loading or shutting down")]
    Unavailable(AnyErrorBody),
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorInfo {
    pub message: String,
    /// `BadRequestError`, `AuthenticationError`, `NotFoundError`, … (docs/http-api.md's table).
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'static str>,
    /// The HTTP status.
    pub code: u16,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest { message: message.into(), param: None }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) | ApiError::RouteNotFound => StatusCode::NOT_FOUND,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "BadRequestError",
            ApiError::Unauthorized(_) => "AuthenticationError",
            ApiError::NotFound(_) | ApiError::RouteNotFound => "NotFoundError",
            ApiError::NotImplemented(_) => "NotImplementedError",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowedError",
            ApiError::PayloadTooLarge(_) => "PayloadTooLargeError",
            ApiError::TooManyRequests(_) => "TooManyRequestsError",
            ApiError::Internal(_) => "InternalServerError",
            ApiError::Unavailable(_) => "ServiceUnavailableError",
            ApiError::Timeout(_) => "GatewayTimeoutError",
        }
    }

    fn param(&self) -> Option<&'static str> {
        match self {
            ApiError::BadRequest { param, .. } => *param,
            _ => None,
        }
    }
}

/// The message of an error response, carried to the request's log line
/// (`observe.rs` writes it) so each request is logged once, with its cause.
#[derive(Debug, Clone)]
pub struct ErrorNote(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = self.to_string();
        let mut response = match self {
            ApiError::RouteNotFound => (status, Json(serde_json::json!({"detail": "Not Found"}))).into_response(),
            _ => {
                let body = ErrorBody {
                    error: ErrorInfo { message: message.clone(), kind: self.kind(), param: self.param(), code: status.as_u16() },
                };
                (status, Json(body)).into_response()
            }
        };
        response.extensions_mut().insert(ErrorNote(message));
        response
    }
}

impl From<ParamsError> for ApiError {
    fn from(e: ParamsError) -> Self {
        ApiError::BadRequest { message: e.message, param: e.param }
    }
}

impl From<InputError> for ApiError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::InputTooLong { .. }
            | InputError::TextTooLong { .. }
            | InputError::InvalidTokenId { .. }
            | InputError::EmptyPrompt => ApiError::BadRequest { message: e.to_string(), param: Some("input") },
            InputError::Field { message, param } => ApiError::BadRequest { message, param: Some(param) },
            InputError::Media { message, param } => ApiError::BadRequest { message, param },
            InputError::InvalidPairing
            | InputError::Tokenizer(_)
            | InputError::Image(_)
            | InputError::ImagesUnsupported
            | InputError::Audio(_)
            | InputError::AudioUnsupported
            | InputError::Video(_)
            | InputError::VideoUnsupported
            | InputError::Chat(_) => ApiError::bad_request(e.to_string()),
            InputError::Panicked(_) => ApiError::Internal(e.to_string()),
            InputError::Stopped => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<PluginError> for ApiError {
    fn from(e: PluginError) -> Self {
        match e {
            PluginError::Engine(e) => e.into(),
            PluginError::Plugin { status: 400, message } => ApiError::bad_request(message),
            PluginError::Plugin { status: 501, message } => ApiError::NotImplemented(message),
            PluginError::Timeout(_) => ApiError::Timeout(e.to_string()),
            _ => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Input(e) => e.into(),
            EngineError::Params(p) => p.into(),
            EngineError::OutputTooLarge { .. } => ApiError::bad_request(e.to_string()),
            EngineError::Overloaded(_) => ApiError::TooManyRequests(e.to_string()),
            // A model that failed to start never serves a request: internal if it ever did.
            EngineError::Model(_) | EngineError::Options(_) | EngineError::Setup(_) | EngineError::Load(_) | EngineError::Threads(_) => {
                ApiError::Internal(e.to_string())
            }
            EngineError::Stopped | EngineError::Dead(_) => ApiError::Unavailable(e.to_string()),
        }
    }
}
