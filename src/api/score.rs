//! `POST /score` (and `/v1/score`): relevance of text pairs, vLLM's request forms
//! (`text_1`/`text_2`, `queries`/`documents` or `queries`/`items`, `data_1`/`data_2`) and
//! 1:1, 1:N, N:N pairing.
//! A side is vLLM 0.33's `ScoreInput | list[ScoreInput]`: a string, or a multimodal document
//! `{"content": [parts]}` whose parts make one input together, or a list of them
//! (`"documents": [{"content": [page 1]}, {"content": [page 2]}]` is two documents); media
//! inputs are scored as the model scores pairs (cosine, MaxSim, a prompt-based reranker).
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

/// One side of a pair request as vLLM 0.33 takes it (`ScoreInput | list[ScoreInput]`): each item
/// a string, a `{"text": …}` object, or a multimodal document `{"content": [parts]}` whose parts
/// make one input together (a page; a text with its image). A single item is a side of one.
pub struct Side<'a> {
    items: Vec<SideItem<'a>>,
}

enum SideItem<'a> {
    Text(String),
    Content(&'a Value),
}

impl<'a> Side<'a> {
    pub fn parse(value: &'a Value, param: &'static str) -> Result<Self, ApiError> {
        let shape = || ApiError::BadRequest {
            message: format!("{param} must be a string, a {{\"content\": [parts]}} document, or a list of strings and documents"),
            param: Some(param),
        };
        let item = |value: &'a Value| match value {
            Value::String(text) => Some(SideItem::Text(text.clone())),
            Value::Object(fields) => match (fields.get("content"), fields.get("text").and_then(Value::as_str)) {
                (Some(content), _) => Some(SideItem::Content(content)),
                (None, Some(text)) => Some(SideItem::Text(text.to_string())),
                (None, None) => None,
            },
            _ => None,
        };
        let items = match value {
            Value::Array(list) => list.iter().map(item).collect::<Option<Vec<_>>>().ok_or_else(shape)?,
            single => vec![item(single).ok_or_else(shape)?],
        };
        Ok(Self { items })
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether any item is a `{"content": …}` document.
    pub fn is_multimodal(&self) -> bool {
        self.items.iter().any(|item| matches!(item, SideItem::Content(_)))
    }

    /// The side's texts; `None` when an item is a `{"content": …}` document.
    pub fn texts(&self) -> Option<Vec<String>> {
        self.items
            .iter()
            .map(|item| match item {
                SideItem::Text(text) => Some(text.clone()),
                SideItem::Content(_) => None,
            })
            .collect()
    }

    /// Each item as one input, its media fetched and decoded.
    pub async fn prompts(&self, media: &MediaOptions) -> Result<Vec<Prompt>, ApiError> {
        let contents: Vec<Value> = self
            .items
            .iter()
            .map(|item| match item {
                SideItem::Text(text) => Value::String(text.clone()),
                SideItem::Content(content) => (*content).clone(),
            })
            .collect();
        Ok(media::content_prompts(&contents, media).await?)
    }

    /// What `/rerank` returns as each document (vLLM's `RerankDocument`): its text, or its
    /// content parts as sent.
    pub fn echoes(&self) -> Vec<(Option<String>, Option<Value>)> {
        self.items
            .iter()
            .map(|item| match item {
                SideItem::Text(text) => (Some(text.clone()), None),
                SideItem::Content(content) => (None, Some((*content).clone())),
            })
            .collect()
    }
}

/// vLLM's pairing rules and messages, in its order (`_validate_score_input_lens`): 1:1, 1:N or
/// N:N, and neither side empty.
pub fn check_pairing(first: usize, second: usize) -> Result<(), ApiError> {
    if first > 1 && first != second {
        return Err(ApiError::bad_request("Input lengths must be either 1:1, 1:N or N:N"));
    }
    if first == 0 {
        return Err(ApiError::bad_request("At least one text element must be given"));
    }
    if second == 0 {
        return Err(ApiError::bad_request("At least one text_pair element must be given"));
    }
    Ok(())
}

/// The scores of two sides, paired 1:1, 1:N or N:N (vLLM's rules and messages), and the tokens
/// they took: texts as the model scores text pairs; with a `{"content": …}` document on either
/// side, each input embedded (or paired, for a prompt-based reranker) with its media, which a
/// model without media refuses in vLLM's words.
pub async fn score_sides(
    state: &AppState,
    engine: &Engine,
    (first, second): (&Side<'_>, &Side<'_>),
    params: &ResolvedParams,
    instruction: Option<&str>,
) -> Result<(Vec<f32>, usize), ApiError> {
    check_pairing(first.len(), second.len())?;
    state.check_batch_size(first.len().max(second.len()))?;
    match (first.texts(), second.texts()) {
        (Some(queries), Some(documents)) => Ok(engine.score(&queries, &documents, params, instruction).await?),
        _ if !engine.spec().images => {
            Err(ApiError::bad_request(format!("MultiModalParam is not supported for {}", engine.spec().architecture)))
        }
        _ => {
            let media = &state.options().media;
            Ok(engine.score_prompts(first.prompts(media).await?, second.prompts(media).await?, params, instruction).await?)
        }
    }
}

impl ScoreRequest {
    /// What pairs with `queries`: `documents`, or vLLM's `items`.
    fn second_of_queries(&self) -> (&'static str, &Option<Value>) {
        match (&self.documents, &self.items) {
            (None, Some(_)) => ("items", &self.items),
            _ => ("documents", &self.documents),
        }
    }

    /// The two sides, from whichever of the three field pairs the request used.
    fn sides(&self) -> Result<(Side<'_>, Side<'_>), ApiError> {
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
        Ok((Side::parse(first, first_name)?, Side::parse(second, second_name)?))
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
    let (first, second) = request.sides()?;
    let (scores, tokens) = score_sides(&state, engine, (&first, &second), &params, request.pair.instruction.as_deref()).await?;
    let data = scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    Ok(Json(ListResponse::new("score", &headers, request.request_id.as_deref(), engine, data, tokens)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sides_take_vllm_score_inputs() {
        let texts = |value: Value| Side::parse(&value, "documents").map(|side| side.texts());
        assert_eq!(texts(json!("a")).unwrap(), Some(vec!["a".to_string()]));
        assert_eq!(texts(json!(["a", {"text": "b"}])).unwrap(), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(texts(json!([])).unwrap(), Some(vec![]));
        let page = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}});
        // One document of two parts, and a list of two documents.
        let one = json!({"content": [page, page]});
        let side = Side::parse(&one, "documents").unwrap();
        assert_eq!((side.len(), side.is_multimodal(), side.texts()), (1, true, None));
        let two = json!([{"content": [page]}, "a text", {"content": [page]}]);
        assert_eq!(Side::parse(&two, "documents").unwrap().len(), 3);
        for bad in [json!(5), json!([1]), json!([["a"]]), json!({"texts": "a"})] {
            let err = Side::parse(&bad, "documents").err().unwrap().to_string();
            assert!(err.starts_with("documents must be a string"), "{err}");
        }
    }

    #[test]
    fn pairing_follows_vllm() {
        assert!(check_pairing(1, 3).is_ok() && check_pairing(3, 3).is_ok());
        assert_eq!(check_pairing(2, 3).unwrap_err().to_string(), "Input lengths must be either 1:1, 1:N or N:N");
        assert_eq!(check_pairing(2, 0).unwrap_err().to_string(), "Input lengths must be either 1:1, 1:N or N:N");
        assert_eq!(check_pairing(0, 1).unwrap_err().to_string(), "At least one text element must be given");
        assert_eq!(check_pairing(1, 0).unwrap_err().to_string(), "At least one text_pair element must be given");
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
