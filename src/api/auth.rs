//! `--api-key`: every route except /health, /ping, GET /, /version, /metrics, /openapi.json and
//! /docs (the probes, the scrape and the API's description: nothing of a model's) needs
//! `Authorization: Bearer KEY`; vLLM guards only paths under /v1, /v2, /inference and /cohere. The comparison takes the same time wherever the keys differ, so
//! response timing does not reveal how much of a guess was right.

use super::error::ApiError;
use super::AppState;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

/// Equal length and equal bytes, looking at every byte (`subtle`, whose comparison the
/// optimizer cannot turn into an early exit).
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

pub async fn require_api_key(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, ApiError> {
    if let Some(key) = &state.options().api_key {
        let sent = request.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
        if !constant_time_eq(sent.as_bytes(), key.as_bytes()) {
            return Err(ApiError::Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>`".into()));
        }
    }
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_whole_keys() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
