//! `POST /rerank`, `/v1/rerank`, `/v2/rerank`: one query against many documents, sorted by
//! relevance, in the body Jina's and Cohere's clients (v1 and v2 SDKs) parse.
//!
//! Any model `/score` serves reranks, as in vLLM: a cross-encoder by its activated logit, an
//! embedding model (bi-encoder) by the cosine of the two embeddings, a late-interaction model by
//! MaxSim; `relevance_score` is always what `/score` gives for the same pair.
//!
//! The query and each document may be vLLM 0.33's multimodal `{"content": [parts]}` (a page for
//! a page retriever, an image for CLIP or SigLIP); such a document comes back as its parts
//! (`multi_modal`), a text one as its `text`.
//!
//! TEI's body (`query` and `texts`, no `documents`) is answered as TEI's `/rerank`
//! ([`super::tei`]).
//!
//! Decisions: `top_n` absent or 0 returns every document, a `top_n` above the number of
//! documents also returns them all (as Cohere does), a negative one is a 400.

use super::error::ApiError;
use super::json::ApiJson;
use super::score::{score_params, score_sides, PairFields, Side};
use super::{response_id, AppState, Usage};
use crate::engine::params::PoolingParams;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string, or vLLM's multimodal `{"content": [parts]}`.
    pub query: Value,
    /// A list of strings, `{"text": …}` objects and vLLM's `{"content": [parts]}` documents (or
    /// one of them).
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

/// A document as returned: its text, or (vLLM's `multi_modal`) the content parts it was sent as.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RerankDocument {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_modal: Option<Value>,
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
    let query = Side::parse(&request.query, "query")?;
    if query.len() != 1 {
        return Err(ApiError::BadRequest {
            message: "query must be a string or a {\"content\": [parts]} document".into(),
            param: Some("query"),
        });
    }
    let documents = Side::parse(&request.documents, "documents")?;
    // vLLM's multimodal documents (and query): each `{"content": [parts]}` one document (a
    // page, an image, a text with its image), scored as `/score` scores the pair.
    let (scores, tokens) = score_sides(&state, engine, (&query, &documents), &params, request.pair.instruction.as_deref()).await?;
    let mut documents = documents.echoes();
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
            document: return_documents.then(|| {
                let (text, multi_modal) = std::mem::take(&mut documents[index]);
                RerankDocument { text, multi_modal }
            }),
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
