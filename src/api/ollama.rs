//! Ollama's embedding API, so that tools that speak only Ollama (Open WebUI, AnythingLLM, the
//! Ollama clients of LangChain and LlamaIndex, the `ollama` package) use a poolserve model
//! unchanged: `POST /api/embed`, the older `POST /api/embeddings`, `GET /api/tags` and
//! `GET /api/version`, with Ollama's fields, defaults, messages and error shape `{"error": …}`
//! (its `server/routes.go`).
//!
//! As Ollama answers: `/api/embed` L2-normalizes every vector and, with `dimensions` below the
//! width, cuts and normalizes again (any model); `truncate` (default true) cuts inputs to the
//! context (`options.num_ctx` when smaller than the model's), and with `truncate: false` a longer
//! input is a 400; an empty `input` answers no vectors. `/api/embeddings` returns the vector
//! `/v1/embeddings` returns (the model's pooling and normalization), neither normalized again
//! nor cut; an empty `prompt` answers `{"embedding": []}`.
//! **Decisions**: models stay loaded, so `keep_alive` is accepted and changes nothing, and of
//! `options` only `num_ctx` means anything for an embedder; a name may carry Ollama's `:latest`
//! tag; `load_duration` is the time to reach the model (it is always loaded); `/api/tags` lists
//! every served model by its served name, with our architecture as its family and our dtype as
//! its quantization level; `/api/embeddings` truncates like `/api/embed` by default.

use super::error::{ApiError, ErrorNote};
use super::AppState;
use crate::engine::params::PoolingParams;
use crate::engine::{Engine, EngineError};
use crate::input::{InputError, Prompt};
use crate::pooling::Task;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Instant;

/// An error in Ollama's shape.
#[derive(Debug)]
pub struct OllamaError {
    status: StatusCode,
    message: String,
}

impl OllamaError {
    fn bad_request(message: impl Into<String>) -> Self {
        OllamaError { status: StatusCode::BAD_REQUEST, message: message.into() }
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.message }))).into_response();
        response.extensions_mut().insert(ErrorNote(self.message));
        response
    }
}

/// Our errors keep their status and message; Ollama's own words where it has them.
impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError { status: e.status(), message: e.to_string() }
    }
}

impl From<crate::engine::params::ParamsError> for OllamaError {
    fn from(e: crate::engine::params::ParamsError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<EngineError> for OllamaError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Input(InputError::InputTooLong { .. } | InputError::TextTooLong { .. }) => {
                Self::bad_request("the input length exceeds the context length")
            }
            other => ApiError::from(other).into(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct EmbedRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    dimensions: Option<i64>,
    #[serde(default)]
    options: Option<Value>,
    /// Accepted: models stay loaded.
    #[serde(default, rename = "keep_alive")]
    _keep_alive: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingsRequest {
    #[serde(default)]
    model: String,
    #[serde(default)]
    prompt: String,
    #[serde(default)]
    options: Option<Value>,
    #[serde(default, rename = "keep_alive")]
    _keep_alive: Option<Value>,
}

/// The body as Ollama's binding reads it: an empty body and malformed JSON are 400s.
fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, OllamaError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(OllamaError::bad_request("missing request body"));
    }
    serde_json::from_slice(bytes).map_err(|e| OllamaError::bad_request(e.to_string()))
}

/// The served model `name` (Ollama's `:latest` tag allowed) that embeds, with its admission.
fn embedder(state: &AppState, name: &str) -> Result<(Engine, tokio::sync::OwnedSemaphorePermit), OllamaError> {
    let not_found = || OllamaError { status: StatusCode::NOT_FOUND, message: format!("model '{name}' not found") };
    if name.is_empty() {
        return Err(OllamaError::bad_request("model is required"));
    }
    let name = match name.strip_suffix(":latest") {
        Some(base) if !state.served_names().any(|s| s == name) => base,
        _ => name,
    };
    let (engine, permit, ()) = state
        .begin(Some(name), |engine| {
            if engine.spec().pooling_task == Task::Embed {
                Ok(())
            } else {
                Err(OllamaError::bad_request("this model does not support embeddings"))
            }
        })
        .map_err(|e| if e.status == StatusCode::NOT_FOUND { not_found() } else { e })?;
    Ok((engine, permit))
}

/// Truncation as Ollama's: to the context (`num_ctx` when smaller), or none.
fn params(engine: &Engine, truncate: bool, options: Option<&Value>) -> Result<crate::engine::params::ResolvedParams, OllamaError> {
    let max = engine.spec().max_model_len;
    let num_ctx = options.and_then(|o| o.get("num_ctx")).and_then(Value::as_u64).filter(|&n| n > 0).map(|n| n.min(max as u64) as i64);
    let truncate_prompt_tokens = truncate.then(|| num_ctx.unwrap_or(-1));
    Ok(PoolingParams { truncate_prompt_tokens, ..Default::default() }.verify(Task::Embed, engine.spec())?)
}

/// L2 normalization as Ollama's `normalize` (a NaN or infinity is an error).
fn normalized(mut vector: Vec<f32>) -> Result<Vec<f32>, OllamaError> {
    if vector.iter().any(|v| !v.is_finite()) {
        return Err(OllamaError::bad_request("embedding contains NaN or Inf values"));
    }
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    vector.iter_mut().for_each(|v| *v /= norm);
    Ok(vector)
}

/// `POST /api/embed`: `input` a string or strings → `embeddings`, normalized.
pub async fn embed(State(state): State<AppState>, bytes: Bytes) -> Result<Json<Value>, OllamaError> {
    let started = Instant::now();
    let request: EmbedRequest = body(&bytes)?;
    let inputs: Vec<String> = match &request.input {
        Value::String(s) if s.is_empty() => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<_>>()
            .ok_or_else(|| OllamaError::bad_request("invalid input type"))?,
        Value::Null => Vec::new(),
        _ => return Err(OllamaError::bad_request("invalid input type")),
    };
    let (engine, _permit) = embedder(&state, &request.model)?;
    let loaded = started.elapsed();
    if inputs.is_empty() {
        return Ok(Json(json!({"model": request.model, "embeddings": []})));
    }
    let params = params(&engine, request.truncate.unwrap_or(true), request.options.as_ref())?;
    let (vectors, tokens): (Vec<Vec<f32>>, _) = engine.encode_as(inputs.into_iter().map(Prompt::Text).collect(), &params).await?;
    let dimensions = request.dimensions.filter(|&d| d > 0).map(|d| d as usize);
    let embeddings = vectors
        .into_iter()
        .map(|v| {
            let v = normalized(v)?;
            match dimensions {
                Some(d) if d < v.len() => normalized(v[..d].to_vec()),
                _ => Ok(v),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(json!({
        "model": request.model,
        "embeddings": embeddings,
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": loaded.as_nanos() as u64,
        "prompt_eval_count": tokens,
    })))
}

/// `POST /api/embeddings` (Ollama's older route): `prompt` → `embedding`, as `/v1/embeddings`.
pub async fn embeddings(State(state): State<AppState>, bytes: Bytes) -> Result<Json<Value>, OllamaError> {
    let request: EmbeddingsRequest = body(&bytes)?;
    let (engine, _permit) = embedder(&state, &request.model)?;
    if request.prompt.is_empty() {
        return Ok(Json(json!({"embedding": []})));
    }
    let params = params(&engine, true, request.options.as_ref())?;
    let (mut vectors, _): (Vec<Vec<f32>>, _) = engine.encode_as(vec![Prompt::Text(request.prompt)], &params).await?;
    let embedding: Vec<f64> = vectors.pop().unwrap_or_default().into_iter().map(f64::from).collect();
    Ok(Json(json!({ "embedding": embedding })))
}

/// `GET /api/tags`: the served models, in Ollama's list shape.
pub async fn tags(State(state): State<AppState>) -> Result<Json<Value>, OllamaError> {
    let modified_at = chrono_like_rfc3339(state.started());
    let models: Vec<Value> = state
        .engines()?
        .into_iter()
        .map(|engine| {
            let spec = engine.spec();
            json!({
                "name": spec.served_name,
                "model": spec.served_name,
                "modified_at": modified_at,
                "size": 0,
                "digest": "",
                "details": {
                    "parent_model": "",
                    "format": "safetensors",
                    "family": spec.architecture,
                    "families": [spec.architecture],
                    "parameter_size": "",
                    "quantization_level": spec.dtype,
                },
            })
        })
        .collect();
    Ok(Json(json!({ "models": models })))
}

/// The Ollama release whose embedding API these routes reproduce: v0.11.11 (September 2025)
/// added `dimensions`, the last `/api/embed` field we read. `/api/version` answers it rather
/// than our own version because clients compare it with Ollama's releases (Open WebUI has warned
/// "Ollama Version: …" below 0.1.16, which our 0.1.0 would read as).
pub const OLLAMA_API_VERSION: &str = "0.11.11";

/// `GET /api/version`: what Ollama clients ask first to check the connection.
pub async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_API_VERSION }))
}

/// `seconds` since the epoch as RFC 3339 in UTC (`2026-12-03T07:43:10Z`), the form of Ollama's
/// `modified_at`; civil-from-days after Howard Hinnant's algorithm (no date crate for one field).
fn chrono_like_rfc3339(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rest = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_in_rfc3339() {
        assert_eq!(chrono_like_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(chrono_like_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(chrono_like_rfc3339(1_796_283_790), "2026-12-03T07:43:10Z");
    }

    #[test]
    fn normalization_as_ollamas() {
        assert_eq!(normalized(vec![3.0, 4.0]).unwrap(), vec![0.6, 0.8]);
        assert_eq!(normalized(vec![0.0, 0.0]).unwrap(), vec![0.0, 0.0]);
        assert_eq!(normalized(vec![f32::NAN]).unwrap_err().message, "embedding contains NaN or Inf values");
    }
}
