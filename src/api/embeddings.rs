//! `POST /v1/embeddings` (and `/embeddings`): the OpenAI embeddings API with vLLM's pooling
//! parameters and chat inputs ([`super::chat`]), sentence-transformers' `prompt_name`, and
//! vLLM's encodings (`base64`, `bytes`, `bytes_only`, with `embed_dtype` / `endianness`, see
//! [`super::encoding`]).
//!
//! A model whose pooling task is `token_embed` answers here as vLLM does: one matrix per input
//! (a vector per token), and with `late_chunking_params: {"chunk_size": n}` one vector per run
//! of `n` tokens (the mean of their states before the head, then the head and normalization),
//! each input's `late_chunking` saying which tokens and which characters of the text each
//! vector covers.

use super::chat::{self, ChatFields};
use super::encoding::{self, EncodedValue, EncodingFormat, EncodingParams};
use super::error::{ApiError, ErrorResponses};
use super::json::{ApiJson, OffRuntimeJson};
use super::{serves, AppState, ListResponse};
use crate::engine::literal;
use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::engine::Engine;
use crate::input::Prompt;
use crate::pooling::Task;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    /// Texts or token ids (absent when `messages` is sent); a chat conversation is read as
    /// `messages`.
    #[serde(default)]
    pub input: serde_json::Value,
    /// vLLM's chat input: one conversation rendered through the chat template (a list of
    /// conversations: one embedding each); image-text models embed each message.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<serde_json::Value>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(flatten)]
    pub encoding: EncodingParams,
    #[serde(default)]
    pub user: Option<String>,
    /// A sentence-transformers prompt of the model (`config_sentence_transformers.json`),
    /// prepended to every text input; default: the model's default prompt, if any.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// vLLM: names the response (`embd-{request_id}`) when no `X-Request-Id` header does.
    #[serde(default)]
    pub request_id: Option<String>,
    /// Jina's embeddings API: one of the model's built-in task adapters (jina-embeddings-v3:
    /// `retrieval.query`, `retrieval.passage`, `separation`, `classification`,
    /// `text-matching`); the same as naming the task as `model`, with the model's name kept
    /// in the response. Default: the base weights, as the published `encode` without a task.
    #[serde(default)]
    pub task: Option<String>,
    /// Infinity's `modality`: `"image"` or `"audio"` reads `input` as data URIs or URLs of that
    /// medium (as Infinity's `/embeddings_image` and `/embeddings_audio` do); `"text"` (the
    /// default) as texts.
    #[serde(default)]
    pub modality: Option<String>,
    /// vLLM's late chunking (`{"chunk_size": n}`), for models whose pooling task is token_embed.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub late_chunking_params: Option<serde_json::Value>,
    #[serde(flatten)]
    pub chat: ChatFields,
    #[serde(flatten)]
    pub params: PoolingParams,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmbeddingData {
    pub index: usize,
    pub object: &'static str,
    pub embedding: EncodedValue,
    /// Late chunking's token and character ranges (token_embed models).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub late_chunking: Option<LateChunking>,
}

/// Which tokens and characters each late-chunking vector covers (vLLM's
/// `LateChunkingMetadata`).
#[derive(Debug, Serialize)]
pub struct LateChunking {
    pub chunk_size: u64,
    pub input_tokens: usize,
    pub chunks: Vec<LateChunk>,
    pub strategy: &'static str,
}

#[derive(Debug, Serialize)]
pub struct LateChunk {
    /// `[start, end)` token positions, special tokens counted.
    pub token_range: [usize; 2],
    /// `[start, end)` characters of the text the chunk's tokens cover; `null` for a chunk of
    /// special tokens only.
    pub char_range: Option<[usize; 2]>,
}

#[utoipa::path(post, tag = "Embeddings (OpenAI)", path = "/v1/embeddings", description = "OpenAI embeddings (also at /embeddings).", request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "the embeddings (JSON), or with `encoding_format` bytes / bytes_only their elements (octet-stream, a `metadata` header for bytes)", content(
            (ListResponse<EmbeddingData> = "application/json"),
            (Vec<u8> = "application/octet-stream"),
        )),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<EmbeddingRequest>,
) -> Result<axum::response::Response, ApiError> {
    let request = read_modality(request)?;
    AppState::require_input(&request.input, request.messages.as_ref())?;
    // A token_embed model answers here with vLLM's token-embedding request (its own checks).
    let (engine, permit, token_embed) = state.begin(request.model.as_deref(), |engine| {
        if engine.spec().pooling_task == Task::TokenEmbed {
            return token_embedding_checks(&request).map(Some);
        }
        serves(engine.spec(), Task::Embed, "Embeddings")?;
        if request.late_chunking_params.is_some() {
            return Err(ApiError::BadRequest {
                message:
                    "late_chunking_params needs a model whose pooling task is token_embed (--pooler-config '{\"task\": \"token_embed\"}')"
                        .into(),
                param: Some("late_chunking_params"),
            });
        }
        Ok(None)
    })?;
    let engine = match request.task.as_deref() {
        Some(task) => engine.with_task(task)?,
        None => engine,
    };
    let engine = &engine;
    if let Some(chunk_size) = token_embed {
        return token_embeddings(&state, engine, permit, &headers, request, chunk_size).await;
    }
    let spec = engine.spec();
    let params = request.params.verify(Task::Embed, spec)?.with_prompt_name(request.prompt_name.as_deref(), spec)?;
    let inputs = chat::inputs(&state, engine, &request.input, request.messages.as_ref(), &request.chat, false).await?;
    let params = inputs.params(params, request.params.add_special_tokens);
    let (vectors, tokens): (Vec<Vec<f32>>, _) = engine.encode_as(inputs.prompts, &params).await?;
    let response = ListResponse::new("embd", &headers, request.request_id.as_deref(), engine, Vec::<EmbeddingData>::new(), tokens);
    if request.encoding.is_bytes() {
        let shaped: Vec<(Vec<usize>, Vec<f32>)> = vectors.into_iter().map(|v| (vec![v.len()], v)).collect();
        return bytes_response(request.encoding, shaped, response).await;
    }
    let encoding = request.encoding;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingData { index, object: "embedding", embedding: encoding.vector(v), late_chunking: None })
        .collect();
    OffRuntimeJson(ListResponse { data, ..response }).into_response(permit).await
}

/// A `bytes` / `bytes_only` response (see [`super::encoding`]): `outputs` are `(shape,
/// elements)`; `envelope` gives the metadata's `id`, `created`, `model` and `usage`. The bytes
/// are written on a blocking thread (they may be megabytes).
pub async fn bytes_response<T>(
    encoding: EncodingParams,
    outputs: Vec<(Vec<usize>, Vec<f32>)>,
    envelope: ListResponse<T>,
) -> Result<axum::response::Response, ApiError> {
    let mut meta = serde_json::Map::new();
    meta.insert("id".into(), envelope.id.into());
    meta.insert("created".into(), envelope.created.into());
    meta.insert("model".into(), envelope.model.into());
    meta.insert(
        "usage".into(),
        serde_json::json!({"prompt_tokens": envelope.usage.prompt_tokens, "total_tokens": envelope.usage.total_tokens}),
    );
    let (body, metadata) = tokio::task::spawn_blocking(move || {
        let views: Vec<(Vec<usize>, &[f32])> = outputs.iter().map(|(shape, v)| (shape.clone(), v.as_slice())).collect();
        encoding::bytes_body(&encoding, &views, meta)
    })
    .await
    .map_err(|_| ApiError::Internal("writing the bytes response failed".into()))?;
    let mut response = ([(axum::http::header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    if let Some(metadata) = metadata {
        let value = axum::http::HeaderValue::from_str(&ascii_json(&metadata))
            .map_err(|e| ApiError::Internal(format!("the metadata header: {e}")))?;
        response.headers_mut().insert("metadata", value);
    }
    Ok(response)
}

/// JSON text with every non-ASCII character escaped (`\uXXXX`, as Python's `json.dumps`
/// writes by default), so that it fits an HTTP header.
fn ascii_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// An `/embeddings` request with Infinity's `modality` (`"image"`, `"audio"`): its `input`
/// (data URIs or URLs) as one message per item, as Infinity's `/embeddings_image` and `/embeddings_audio` send them on.
pub(super) fn read_modality(mut request: EmbeddingRequest) -> Result<EmbeddingRequest, ApiError> {
    let part: fn(&str) -> Value = match request.modality.as_deref() {
        None | Some("text") => return Ok(request),
        Some("image") => |url| json!({"type": "image_url", "image_url": {"url": url}}),
        Some("audio") => |url| json!({"type": "audio_url", "audio_url": {"url": url}}),
        Some(other) => {
            return Err(ApiError::BadRequest {
                message: format!("modality must be \"text\", \"image\" or \"audio\", got {other:?}"),
                param: Some("modality"),
            })
        }
    };
    if request.messages.is_some() {
        return Err(ApiError::BadRequest { message: "modality reads `input`; send `messages` without it".into(), param: Some("modality") });
    }
    request.messages = Some(Value::Array(media_messages(&request.input, part)?));
    request.input = Value::Null;
    Ok(request)
}

/// One message per data URI or URL of `input` (one, or a non-empty list).
pub(super) fn media_messages(input: &Value, part: impl Fn(&str) -> Value) -> Result<Vec<Value>, ApiError> {
    let urls: Vec<&str> = match input {
        Value::String(url) => vec![url.as_str()],
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| item.as_str().ok_or_else(|| ApiError::bad_request("`input` must be a data URI or URL, or a list of them")))
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::bad_request("`input` must be a data URI or URL, or a non-empty list of them")),
    };
    Ok(urls.into_iter().map(|url| json!({"role": "user", "content": [part(url)]})).collect())
}

/// vLLM's token-embedding request on `/v1/embeddings` (its `TokenEmbeddingRequest`): float
/// matrices only, no `dimensions`, text or token inputs, optional late chunking (its chunk
/// size returned).
fn token_embedding_checks(request: &EmbeddingRequest) -> Result<Option<u64>, ApiError> {
    if let Some(format) = request.encoding.encoding_format.filter(|f| *f != EncodingFormat::Float) {
        let name = match format {
            EncodingFormat::Base64 => "base64",
            EncodingFormat::Bytes => "bytes",
            _ => "bytes_only",
        };
        return Err(literal_error("encoding_format", name.into(), &["float"]));
    }
    if let Some(dimensions) = request.params.dimensions {
        return Err(ApiError::BadRequest {
            message: literal::validation_error("none_required", "body.dimensions", "Input should be None", Some(&dimensions.into()), None),
            param: Some("dimensions"),
        });
    }
    // vLLM's token-embedding request has no `messages`; Infinity's `modality` sends media in
    // them ([`read_modality`]).
    if request.messages.is_some() && request.modality.is_none() {
        return Err(ApiError::BadRequest {
            message: literal::validation_error("missing", "body.input", "Field required", None, None),
            param: Some("input"),
        });
    }
    match &request.late_chunking_params {
        Some(value) => Ok(Some(late_chunk_size(value)?)),
        None => Ok(None),
    }
}

/// The token-embedding request, once [`token_embedding_checks`] passed and it was admitted.
async fn token_embeddings(
    state: &AppState,
    engine: &Engine,
    permit: tokio::sync::OwnedSemaphorePermit,
    headers: &HeaderMap,
    request: EmbeddingRequest,
    chunk_size: Option<u64>,
) -> Result<axum::response::Response, ApiError> {
    let spec = engine.spec();
    if chunk_size.is_some() && spec.m3 {
        return Err(ApiError::BadRequest {
            message: "late chunking averages token states; BGE-M3's token_embed gives ColBERT vectors, which are not chunked".into(),
            param: Some("late_chunking_params"),
        });
    }
    let mut params = request.params.verify(Task::TokenEmbed, spec)?.with_prompt_name(request.prompt_name.as_deref(), spec)?;
    let prompts = match &request.messages {
        // Infinity's media inputs (`modality`), one message each.
        Some(messages) => chat::inputs(state, engine, &request.input, Some(messages), &request.chat, false).await?.prompts,
        None => state.prompts(&request.input)?,
    };
    let mut texts = Vec::new();
    if let Some(size) = chunk_size {
        texts = late_chunking_texts(&prompts, &params, &request.params, spec.lowercase)?;
        params = ResolvedParams { late_chunk: Some(usize::try_from(size).unwrap_or(usize::MAX)), ..params };
    }
    let (outputs, tokens): (Vec<Vec<Vec<f32>>>, _) = engine.encode_as(prompts, &params).await?;
    let mut data = Vec::with_capacity(outputs.len());
    for (index, rows) in outputs.into_iter().enumerate() {
        let late_chunking = match (chunk_size, texts.get(index)) {
            (Some(size), Some(text)) => Some(late_chunking_ranges(engine, text, &params, size).await?),
            _ => None,
        };
        data.push(EmbeddingData { index, object: "embedding", embedding: EncodedValue::Tokens(rows), late_chunking });
    }
    OffRuntimeJson(ListResponse::new("embd", headers, request.request_id.as_deref(), engine, data, tokens)).into_response(permit).await
}

fn literal_error(param: &'static str, input: serde_json::Value, expected: &[&str]) -> ApiError {
    ApiError::BadRequest { message: literal::message(param, &input, expected), param: Some(param) }
}

/// `late_chunking_params` as vLLM's pydantic model checks it: an object with only
/// `chunk_size`, a strict integer in `[1, 2^63 - 1]`.
fn late_chunk_size(value: &serde_json::Value) -> Result<u64, ApiError> {
    let error = |kind: &str, loc: &str, msg: &str, input: &serde_json::Value, ctx: Option<&str>| ApiError::BadRequest {
        message: literal::validation_error(kind, loc, msg, Some(input), ctx),
        param: Some("late_chunking_params"),
    };
    let Some(object) = value.as_object() else {
        return Err(error(
            "model_type",
            "body.late_chunking_params",
            "Input should be a valid dictionary or instance of LateChunkingConfig",
            value,
            Some("{'class_name': 'LateChunkingConfig'}"),
        ));
    };
    if let Some((key, extra)) = object.iter().find(|(k, _)| k.as_str() != "chunk_size") {
        return Err(error("extra_forbidden", &format!("body.late_chunking_params.{key}"), "Extra inputs are not permitted", extra, None));
    }
    let loc = "body.late_chunking_params.chunk_size";
    let Some(size) = object.get("chunk_size") else {
        return Err(error("missing", loc, "Field required", value, None));
    };
    match size {
        serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => match n.as_i64() {
            Some(k) if k > 0 => Ok(k as u64),
            Some(_) => Err(error("greater_than", loc, "Input should be greater than 0", size, Some("{'gt': 0}"))),
            None => Err(error(
                "less_than_equal",
                loc,
                "Input should be less than or equal to 9223372036854775807",
                size,
                Some("{'le': 9223372036854775807}"),
            )),
        },
        // Past u64, serde_json reads the number as a float: still an integer too large.
        serde_json::Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0 && f > 0.0) => Err(error(
            "less_than_equal",
            loc,
            "Input should be less than or equal to 9223372036854775807",
            size,
            Some("{'le': 9223372036854775807}"),
        )),
        _ => Err(error("int_type", loc, "Input should be a valid integer", size, None)),
    }
}

/// The texts of a late-chunking request, refused as vLLM refuses what late chunking cannot
/// map back to the text: token ids or empty texts, truncation, padding, lowercasing.
fn late_chunking_texts(
    prompts: &[Prompt],
    params: &ResolvedParams,
    sent: &PoolingParams,
    lowercase: bool,
) -> Result<Vec<String>, ApiError> {
    if sent.truncate_prompt_tokens.is_some() || params.pad_to_max_length || lowercase {
        return Err(ApiError::bad_request("Late chunking does not support input padding, truncation or renderer text normalization"));
    }
    prompts
        .iter()
        .map(|p| match p {
            Prompt::Text(text) if !text.is_empty() => Ok(text.clone()),
            _ => Err(ApiError::bad_request("Late chunking requires nonempty plain-text input")),
        })
        .collect()
}

/// vLLM's late-chunking metadata of one text: each chunk's token range, and the characters
/// its tokens cover (special tokens cover none). A sentence-transformers prompt is part of the
/// tokens but not of the text: its characters are not counted.
async fn late_chunking_ranges(engine: &Engine, text: &str, params: &ResolvedParams, chunk_size: u64) -> Result<LateChunking, ApiError> {
    let prompt = params.prompt.as_deref().unwrap_or("");
    let offsets = engine.input().char_offsets(format!("{prompt}{text}"), params.add_special_tokens).await?;
    let skip = prompt.chars().count();
    let offsets: Vec<(usize, usize)> =
        offsets.into_iter().map(|(a, b)| if b <= skip { (0, 0) } else { (a.saturating_sub(skip), b - skip) }).collect();
    let tokens = offsets.len();
    let size = usize::try_from(chunk_size).unwrap_or(usize::MAX).min(tokens.max(1));
    let chunks = (0..tokens)
        .step_by(size)
        .map(|start| {
            let end = (start + size).min(tokens);
            let covered: Vec<&(usize, usize)> = offsets[start..end].iter().filter(|(a, b)| a < b).collect();
            let char_range = (!covered.is_empty())
                .then(|| [covered.iter().map(|r| r.0).min().unwrap_or(0), covered.iter().map(|r| r.1).max().unwrap_or(0)]);
            LateChunk { token_range: [start, end], char_range }
        })
        .collect();
    Ok(LateChunking { chunk_size, input_tokens: tokens, chunks, strategy: "fixed_tokens" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn late_chunking_params_are_checked_as_pydantic_does() {
        assert_eq!(late_chunk_size(&json!({"chunk_size": 5})).unwrap(), 5);
        assert_eq!(late_chunk_size(&json!({"chunk_size": 9223372036854775807u64})).unwrap(), (1 << 63) - 1);
        for (bad, kind) in [
            (json!({"chunk_size": 0}), "greater_than"),
            (json!({"chunk_size": 9223372036854775808u64}), "less_than_equal"),
            (json!({"chunk_size": 18446744073709551616.0}), "less_than_equal"),
            (json!({"chunk_size": "5"}), "int_type"),
            (json!({"chunk_size": 5.5}), "int_type"),
            (json!({"chunk_size": 5, "x": 1}), "extra_forbidden"),
            (json!({}), "missing"),
            (json!(5), "model_type"),
        ] {
            let ApiError::BadRequest { message, .. } = late_chunk_size(&bad).unwrap_err() else { panic!() };
            assert!(message.contains(&format!("'type': '{kind}'")), "{bad}: {message}");
        }
    }

    #[test]
    fn metadata_headers_are_ascii() {
        assert_eq!(ascii_json("{\"model\": \"é😀\"}"), "{\"model\": \"\\u00e9\\ud83d\\ude00\"}");
    }
}
