//! `POST /score` (and `/v1/score`): relevance of text pairs, vLLM's request forms
//! (`text_1`/`text_2`, `queries`/`documents` or `queries`/`items`, `data_1`/`data_2`) and
//! 1:1, 1:N, N:N pairing.
//! A side may also be vLLM's multimodal `{"content": [parts]}`: each part (a text or an
//! image) is one input, scored by the cosine of embeddings (image-text models).
//! The request helpers here are shared with `/rerank`.

use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::{AppState, ListResponse};
use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::engine::Engine;
use crate::input::media::{self, MediaOptions};
use crate::input::tokenizer::PairLimits;
use crate::input::Prompt;
use crate::pooling::Task;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct ScoreRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub text_1: Option<Value>,
    #[serde(default)]
    pub text_2: Option<Value>,
    #[serde(default)]
    pub queries: Option<Value>,
    #[serde(default)]
    pub documents: Option<Value>,
    /// vLLM's other name of `documents` beside `queries`.
    #[serde(default)]
    pub items: Option<Value>,
    #[serde(default)]
    pub data_1: Option<Value>,
    #[serde(default)]
    pub data_2: Option<Value>,
    /// vLLM: names the response (`score-{request_id}`) when no `X-Request-Id` header does.
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(flatten)]
    pub pair: PairFields,
    #[serde(flatten)]
    pub params: PoolingParams,
}

/// The pair options of /score and /rerank: `max_tokens_per_query` / `max_tokens_per_doc`
/// (Cohere's names) and the `instruction` of prompt-based rerankers (Qwen3-Reranker; others
/// ignore it).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct PairFields {
    #[serde(default)]
    pub instruction: Option<String>,
    #[serde(default)]
    pub max_tokens_per_query: Option<i64>,
    #[serde(default)]
    pub max_tokens_per_doc: Option<i64>,
    /// BGE-M3 only: FlagEmbedding's `[dense, sparse, colbert]` weights; the score is then
    /// their weighted mean (FlagEmbedding's `colbert+sparse+dense`).
    #[serde(default)]
    pub weights_for_different_modes: Option<Vec<f64>>,
}

impl PairFields {
    /// The per-side caps; 0 (vLLM's default) means none, negative is refused in vLLM's words.
    pub fn resolve(&self) -> Result<PairLimits, ApiError> {
        let cap = |value: Option<i64>, param: &'static str| match value {
            None | Some(0) => Ok(None),
            Some(n) if n >= 1 => Ok(Some(n as usize)),
            Some(_) => Err(ApiError::BadRequest { message: format!("{param} must be a non-negative integer"), param: Some(param) }),
        };
        Ok(PairLimits {
            query: cap(self.max_tokens_per_query, "max_tokens_per_query")?,
            document: cap(self.max_tokens_per_doc, "max_tokens_per_doc")?,
        })
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ScoreData {
    pub index: usize,
    pub object: &'static str,
    pub score: f32,
}

/// One side of a pair request: a string, or a non-empty list of strings or `{"text": …}` objects.
pub fn texts_of(value: &Value, param: &'static str) -> Result<Vec<String>, ApiError> {
    let shape = || ApiError::BadRequest {
        message: format!("{param} must be a string, a list of strings or a list of {{\"text\": string}} objects"),
        param: Some(param),
    };
    let text = |item: &Value| match item {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("text").and_then(Value::as_str).map(String::from),
        _ => None,
    };
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::BadRequest { message: format!("{param} must not be empty"), param: Some(param) })
        }
        Value::Array(items) => items.iter().map(text).collect::<Option<Vec<_>>>().ok_or_else(shape),
        _ => Err(shape()),
    }
}

/// Validates the pooling parameters for the `score` task and adds the per-side token caps.
pub fn score_params(engine: &Engine, params: &PoolingParams, pair: &PairFields) -> Result<ResolvedParams, ApiError> {
    let mut resolved = params.verify(Task::Score, engine.spec())?;
    resolved.pair_limits = pair.resolve()?;
    if let Some(weights) = &pair.weights_for_different_modes {
        resolved.hybrid = Some(hybrid_weights(weights, engine)?);
    }
    Ok(resolved)
}

/// `weights_for_different_modes`: three finite, non-negative weights of a positive sum, for a
/// BGE-M3 model.
fn hybrid_weights(weights: &[f64], engine: &Engine) -> Result<[f32; 3], ApiError> {
    let param = Some("weights_for_different_modes");
    if !engine.spec().m3 {
        return Err(ApiError::BadRequest {
            message: format!(
                "weights_for_different_modes weighs BGE-M3's dense, sparse and ColBERT scores; model {} has no sparse and ColBERT heads",
                engine.spec().served_name
            ),
            param,
        });
    }
    match weights {
        [d, s, c] if weights.iter().all(|w| w.is_finite() && *w >= 0.0) && d + s + c > 0.0 => Ok([*d as f32, *s as f32, *c as f32]),
        _ => Err(ApiError::BadRequest {
            message: "weights_for_different_modes must be three non-negative numbers (dense, sparse, colbert) with a positive sum".into(),
            param,
        }),
    }
}

/// One side as inputs: a side of texts, or vLLM's `{"content": [parts]}`, each part one
/// input (a text or an image).
pub(super) async fn side_prompts(side: &Value, media: &MediaOptions) -> Result<Vec<Prompt>, ApiError> {
    match side.get("content").and_then(Value::as_array) {
        Some(parts) if parts.is_empty() => Err(ApiError::bad_request("`content` must not be empty")),
        Some(parts) => {
            let contents: Vec<Value> = parts.iter().map(|part| Value::Array(vec![part.clone()])).collect();
            Ok(media::content_prompts(&contents, media).await?)
        }
        None => Ok(texts_of(side, "content")?.into_iter().map(Prompt::Text).collect()),
    }
}

impl ScoreRequest {
    /// Both sides, when one of them is vLLM's multimodal `{"content": […]}` form.
    fn content_sides(&self) -> Option<(&Value, &Value)> {
        let forms = [(&self.text_1, &self.text_2), (&self.queries, self.second_of_queries().1), (&self.data_1, &self.data_2)];
        forms.into_iter().find_map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) if a.get("content").is_some() || b.get("content").is_some() => Some((a, b)),
            _ => None,
        })
    }

    /// What pairs with `queries`: `documents`, or vLLM's `items`.
    fn second_of_queries(&self) -> (&'static str, &Option<Value>) {
        match (&self.documents, &self.items) {
            (None, Some(_)) => ("items", &self.items),
            _ => ("documents", &self.documents),
        }
    }

    /// The two sides, from whichever of the three field pairs the request used.
    fn sides(&self) -> Result<(Vec<String>, Vec<String>), ApiError> {
        let (second_name, second) = self.second_of_queries();
        let forms = [
            ("text_1", &self.text_1, "text_2", &self.text_2),
            ("queries", &self.queries, second_name, second),
            ("data_1", &self.data_1, "data_2", &self.data_2),
        ];
        let used: Vec<_> = forms.iter().filter(|(_, a, _, b)| a.is_some() || b.is_some()).collect();
        let [(first_name, first, second_name, second)] = used.as_slice() else {
            return Err(ApiError::bad_request(
                "A score request needs exactly one of the field pairs text_1/text_2, queries/documents (or queries/items) or data_1/data_2",
            ));
        };
        let missing = |name: &'static str| ApiError::BadRequest { message: format!("{name} is required"), param: Some(name) };
        let first = first.as_ref().ok_or_else(|| missing(first_name))?;
        let second = second.as_ref().ok_or_else(|| missing(second_name))?;
        Ok((texts_of(first, first_name)?, texts_of(second, second_name)?))
    }
}

#[utoipa::path(post, tag = "Scoring and reranking", path = "/score", description = "Pair scores (also at /v1/score).", request_body = ScoreRequest,
    responses(
        (status = 200, body = ListResponse<ScoreData>),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ScoreRequest>,
) -> Result<Json<ListResponse<ScoreData>>, ApiError> {
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), super::scores)?;
    let engine = &engine;
    let params = score_params(engine, &request.params, &request.pair)?;
    if let Some((first, second)) = request.content_sides() {
        // A side of content parts (vLLM's multimodal form): texts and images, embedded.
        if !engine.spec().images {
            return Err(ApiError::bad_request(
                "Sides of content parts (`{\"content\": [...]}`) need an image-text model (CLIP, SigLIP, EmbeddingGemma 2, Qwen3-VL), a page retriever (ColPali, ColQwen) or Qwen3-VL-Reranker; this model does not take images",
            ));
        }
        let count = |side: &Value| match side.get("content").and_then(Value::as_array) {
            Some(parts) => Ok(parts.len()),
            None => texts_of(side, "content").map(|t| t.len()),
        };
        state.check_batch_size(count(first)?.max(count(second)?))?;
        let media = &state.options().media;
        let (queries, documents) = (side_prompts(first, media).await?, side_prompts(second, media).await?);
        let (scores, tokens) = engine.score_prompts(queries, documents, &params, request.pair.instruction.as_deref()).await?;
        let data = scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
        return Ok(Json(ListResponse::new("score", &headers, request.request_id.as_deref(), engine, data, tokens)));
    }
    let (queries, documents) = request.sides()?;
    state.check_batch_size(queries.len().max(documents.len()))?;
    let (scores, tokens) = engine.score(&queries, &documents, &params, request.pair.instruction.as_deref()).await?;
    let data = scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    Ok(Json(ListResponse::new("score", &headers, request.request_id.as_deref(), engine, data, tokens)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sides_accept_strings_lists_and_text_objects() {
        assert_eq!(texts_of(&json!("a"), "text_1").unwrap(), vec!["a"]);
        assert_eq!(texts_of(&json!(["a", {"text": "b"}]), "documents").unwrap(), vec!["a", "b"]);
        assert!(texts_of(&json!([]), "documents").unwrap_err().to_string().contains("must not be empty"));
        assert!(texts_of(&json!([1]), "documents").is_err());
        assert!(texts_of(&json!({"text": "a"}), "documents").is_err());
    }

    #[test]
    fn pair_limits_must_be_positive() {
        let fields = PairFields { max_tokens_per_query: Some(4), ..Default::default() };
        assert_eq!(fields.resolve().unwrap(), PairLimits { query: Some(4), document: None });
        assert_eq!(PairFields { max_tokens_per_doc: Some(0), ..Default::default() }.resolve().unwrap(), PairLimits::default());
        let err = PairFields { max_tokens_per_doc: Some(-5), ..Default::default() }.resolve().unwrap_err();
        assert_eq!(err.to_string(), "max_tokens_per_doc must be a non-negative integer");
    }
}
