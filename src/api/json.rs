//! Our JSON body extractor: malformed JSON, wrong field types and oversized bodies all come
//! back in the API's error shape (axum's own `Json` answers them in plain text).

use super::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::response::IntoResponse;
use serde::de::DeserializeOwned;

pub struct ApiJson<T>(pub T);

/// A JSON response serialized on a blocking thread: a large body (thousands of vectors, token
/// matrices) would otherwise hold a runtime worker for tens of milliseconds, delaying every
/// other request, `/health` included. The value is moved, so only the serialized bytes and not
/// a second copy of the value exist once it is written.
pub struct OffRuntimeJson<T>(pub T);

impl<T: serde::Serialize + Send + 'static> OffRuntimeJson<T> {
    pub async fn into_response(self) -> Result<axum::response::Response, ApiError> {
        let value = self.0;
        let bytes = tokio::task::spawn_blocking(move || serde_json::to_vec(&value))
            .await
            .map_err(|_| ApiError::Internal("serializing the response failed".into()))?
            .map_err(|e| ApiError::Internal(format!("serializing the response failed: {e}")))?;
        Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], bytes).into_response())
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
