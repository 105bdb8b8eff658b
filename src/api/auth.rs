//! `--api-key` (one or several keys, any of them accepted): every route except /health, /ping, GET /, /version, /metrics, /openapi.json and
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

/// Whether `sent` is one of `keys`: every key is compared, whichever matches, so that timing
/// says nothing about which key (or how many) there are.
pub(super) fn key_accepted(keys: &[String], sent: &str) -> bool {
    keys.iter().fold(false, |accepted, key| constant_time_eq(sent.as_bytes(), key.as_bytes()) | accepted)
}

pub async fn require_api_key(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, ApiError> {
    let keys = &state.options().api_keys;
    if !keys.is_empty() {
        let sent = request.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
        if !key_accepted(keys, sent) {
            return Err(ApiError::Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>`".into()));
        }
    }
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::{constant_time_eq, key_accepted};

    #[test]
    fn any_of_several_keys() {
        let keys = vec!["first".to_string(), "second".to_string()];
        assert!(key_accepted(&keys, "first") && key_accepted(&keys, "second"));
        assert!(!key_accepted(&keys, "third") && !key_accepted(&keys, "") && !key_accepted(&[], "first"));
    }

    #[test]
    fn compares_whole_keys() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
