//! `POST /rerank`, `/v1/rerank`, `/v2/rerank`: one query against many documents, sorted by
//! relevance, in the body Jina's and Cohere's clients (v1 and v2 SDKs) parse.
//!
//! Any model `/score` serves reranks, as in vLLM: a cross-encoder by its activated logit, an
//! embedding model (bi-encoder) by the cosine of the two embeddings, a late-interaction model by
//! MaxSim; `relevance_score` is always what `/score` gives for the same pair.
//!
//! TEI's body (`query` and `texts`, no `documents`) is answered as TEI's `/rerank`
//! ([`super::tei`]).
//!
//! Decisions: `top_n` absent or 0 returns every document, a `top_n` above the number of
//! documents also returns them all (as Cohere does), a negative one is a 400.

use super::error::ApiError;
use super::json::ApiJson;
use super::score::{score_params, texts_of, PairFields};
use super::{response_id, AppState, Usage};
use crate::engine::params::PoolingParams;
use crate::input::Prompt;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub query: String,
    pub documents: Value,
    #[serde(default)]
    pub top_n: Option<i64>,
    #[serde(default)]
    pub return_documents: Option<bool>,
    /// vLLM: names the response (`rerank-{request_id}`) when no `X-Request-Id` header does.
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(flatten)]
    pub pair: PairFields,
    #[serde(flatten)]
    pub params: PoolingParams,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RerankResult {
    pub index: usize,
    pub relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: Usage,
    pub results: Vec<RerankResult>,
}

/// How many results to return: `top_n` if positive and below `documents`, else all.
fn result_count(top_n: Option<i64>, documents: usize) -> Result<usize, ApiError> {
    match top_n {
        Some(n) if n < 0 => {
            Err(ApiError::BadRequest { message: format!("top_n must be a non-negative integer, got {n}"), param: Some("top_n") })
        }
        Some(n) if n > 0 => Ok((n as usize).min(documents)),
        _ => Ok(documents),
    }
}

#[utoipa::path(post, tag = "Scoring and reranking", path = "/rerank", description = "Cohere/Jina rerank (also at /v1/rerank and /v2/rerank).", request_body = RerankRequest,
    responses(
        (status = 200, body = RerankResponse),
        super::error::AnyErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Value>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    // TEI's body (`texts`, no `documents`): TEI's rerank, answered in TEI's shape.
    if super::tei::scores::is_tei_rerank(&body) {
        return Ok(super::tei::scores::rerank(&state, body).await);
    }
    let request: RerankRequest = super::json::from_value(body)?;
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), super::scores)?;
    let engine = &engine;
    let params = score_params(engine, &request.params, &request.pair)?;
    let (scores, tokens, mut documents) = match request.documents.get("content").and_then(Value::as_array) {
        // vLLM's multimodal documents, `{"content": [parts]}`: each part a document (a text,
        // an image or an audio), scored against the query as the model scores pairs (cosine of
        // embeddings, MaxSim of token vectors, or a prompt-based reranker's pair).
        Some(parts) => {
            if !engine.spec().images {
                return Err(ApiError::BadRequest {
                    message:
                        "Documents of content parts need an image-text model (CLIP, SigLIP, EmbeddingGemma 2, Qwen3-VL), a page retriever (ColPali, ColQwen) or Qwen3-VL-Reranker"
                            .into(),
                    param: Some("documents"),
                });
            }
            state.check_batch_size(parts.len())?;
            let texts: Vec<Option<String>> = parts
                .iter()
                .map(|p| (p.get("type").and_then(Value::as_str) == Some("text")).then(|| p["text"].as_str().map(str::to_string)).flatten())
                .collect();
            let prompts = super::score::side_prompts(&request.documents, &state.options().media).await?;
            let (scores, tokens) = engine
                .score_prompts(vec![Prompt::Text(request.query.clone())], prompts, &params, request.pair.instruction.as_deref())
                .await?;
            (scores, tokens, texts)
        }
        None => {
            if !request.documents.is_array() {
                return Err(ApiError::BadRequest {
                    message: "documents must be a list of strings or of {\"text\": string} objects, or {\"content\": [parts]}".into(),
                    param: Some("documents"),
                });
            }
            let documents = texts_of(&request.documents, "documents")?;
            state.check_batch_size(documents.len())?;
            let (scores, tokens) = engine.score(&[request.query], &documents, &params, request.pair.instruction.as_deref()).await?;
            (scores, tokens, documents.into_iter().map(Some).collect())
        }
    };
    let count = result_count(request.top_n, scores.len())?;

    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Highest first; equal scores keep document order (the sort is stable).
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let return_documents = request.return_documents.unwrap_or(true);
    let results = order
        .into_iter()
        .take(count)
        .map(|index| RerankResult {
            index,
            relevance_score: scores[index],
            document: if return_documents { documents[index].take().map(|text| RerankDocument { text }) } else { None },
        })
        .collect();
    Ok(Json(RerankResponse {
        id: response_id("rerank", &headers, request.request_id.as_deref()),
        model: engine.served_name().to_string(),
        usage: Usage::new(tokens),
        results,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::result_count;

    #[test]
    fn top_n_rules() {
        assert_eq!(result_count(None, 3).unwrap(), 3);
        assert_eq!(result_count(Some(0), 3).unwrap(), 3);
        assert_eq!(result_count(Some(2), 3).unwrap(), 2);
        assert_eq!(result_count(Some(10), 3).unwrap(), 3);
        assert!(result_count(Some(-1), 3).is_err());
    }
}
