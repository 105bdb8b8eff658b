//! TEI's scoring routes: `/predict` (class scores of texts and pairs, sorted) and TEI's body of
//! `/rerank` (`query` and `texts`), with TEI's activation (softmax, sigmoid for one label,
//! unless `raw_scores`) and TEI's order (ties in reverse input order).

use super::error::{handed_over, TeiError, TeiJson};
use super::inputs::TruncationDirection;
use super::{batch_size, begin, Kind};
use crate::api::AppState;
use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::input::Prompt;
use crate::loader::model_spec::ModelSpec;
use crate::pooling::Task;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `/predict`'s request; `inputs` is read by [`predict_inputs`].
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct PredictRequest {
    #[schema(value_type = PredictInputs)]
    pub inputs: Value,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub model: Option<String>,
}

/// TEI's `PredictInput`, as the OpenAPI document states it (a text, a pair, or a batch of texts
/// and pairs); the body itself is read by [`predict_inputs`], which gives TEI's messages.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum PredictInputs {
    Text(String),
    TextOrPair(Vec<String>),
    Batch(Vec<Vec<String>>),
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Prediction {
    pub score: f32,
    pub label: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PredictResponse {
    Single(Vec<Prediction>),
    Batch(Vec<Vec<Prediction>>),
}

/// TEI's `inputs` of `/predict`: `"a"` or `["a"]` is one text, `["a", "b"]` one pair, and a
/// batch is a list of such lists (`[["a"], ["b", "c"]]`). Returns the inputs and whether it
/// was a batch.
fn predict_inputs(inputs: &Value) -> Result<(Vec<Prompt>, bool), TeiError> {
    const EXPECTED: &str =
        "a string, a pair of strings [string, string] or a batch of mixed strings and pairs [[string], [string, string], ...]";
    let invalid = |what: String| {
        TeiError::validation(format!("Failed to deserialize the JSON body into the target type: inputs: {what}, expected {EXPECTED}"))
    };
    let item = |list: &[Value]| -> Result<Prompt, TeiError> {
        let texts: Vec<&str> =
            list.iter().map(|v| v.as_str().ok_or_else(|| invalid(format!("invalid type: {v}")))).collect::<Result<_, _>>()?;
        match texts.as_slice() {
            [one] => Ok(Prompt::Text(one.to_string())),
            [a, b] => Ok(Prompt::Pair(a.to_string(), b.to_string())),
            other => Err(invalid(format!("invalid length {}", other.len()))),
        }
    };
    match inputs {
        Value::String(text) => Ok((vec![Prompt::Text(text.clone())], false)),
        Value::Array(items) if items.first().is_some_and(Value::is_array) => {
            let batch = items
                .iter()
                .map(|i| i.as_array().ok_or_else(|| invalid(format!("invalid type: {i}"))).and_then(|l| item(l)))
                .collect::<Result<_, _>>()?;
            Ok((batch, true))
        }
        Value::Array(items) => Ok((vec![item(items)?], false)),
        other => Err(invalid(format!("invalid type: {other}"))),
    }
}

/// The parameters of TEI's scoring routes: TEI's truncation, and the raw logits (TEI applies its
/// own activation, [`tei_activation`]).
fn raw_logits(task: Task, truncate: Option<bool>, direction: TruncationDirection, spec: &ModelSpec) -> Result<ResolvedParams, TeiError> {
    let sent = PoolingParams {
        truncate_prompt_tokens: truncate.unwrap_or(true).then_some(-1),
        truncation_side: Some(direction.into()),
        use_activation: Some(false),
        ..Default::default()
    };
    sent.verify(task, spec).map_err(|e| TeiError::validation(e.message))
}

/// TEI's scores: softmax over the labels (sigmoid for one), unless raw.
fn tei_activation(logits: &mut [f32], raw: bool) {
    use crate::pooling::classifier::ClassifierActivation;
    if !raw {
        let activation = if logits.len() == 1 { ClassifierActivation::Sigmoid } else { ClassifierActivation::Softmax };
        activation.apply(logits);
    }
}

/// Highest first; equal scores in reverse input order (TEI sorts ascending, then reverses).
fn tei_order<T>(items: &mut [T], score: impl Fn(&T) -> f32) {
    items.sort_by(|a, b| score(a).total_cmp(&score(b)));
    items.reverse();
}

pub(in crate::api) async fn predict_inner(state: &AppState, request: PredictRequest) -> Result<PredictResponse, TeiError> {
    let (engine, _permit, (prompts, batch)) = begin(
        state,
        request.model.as_deref(),
        |s| s.supports(Task::Classify),
        |_| {
            let (prompts, batch) = predict_inputs(&request.inputs)?;
            if batch {
                batch_size(state, prompts.len())?;
            }
            Ok((prompts, batch))
        },
    )?;
    let spec = engine.spec();
    if !spec.supports(Task::Classify) {
        return Err(TeiError::backend("Model is not a classifier model"));
    }
    let params = raw_logits(Task::Classify, request.truncate, request.truncation_direction, spec)?;
    let (outputs, _): (Vec<Vec<f32>>, _) = engine.encode_as(prompts, &params).await?;
    let mut lists = Vec::with_capacity(outputs.len());
    for mut logits in outputs {
        tei_activation(&mut logits, request.raw_scores);
        if logits.iter().any(|s| s.is_nan()) {
            return Err(TeiError::backend("score is NaN").with_message("score is NaN"));
        }
        let mut predictions: Vec<Prediction> = logits
            .into_iter()
            .enumerate()
            .map(|(i, score)| Prediction { score, label: spec.labels.get(i).cloned().unwrap_or_else(|| format!("LABEL_{i}")) })
            .collect();
        tei_order(&mut predictions, |p| p.score);
        lists.push(predictions);
    }
    Ok(match batch {
        true => PredictResponse::Batch(lists),
        false => PredictResponse::Single(lists.pop().unwrap_or_default()),
    })
}

#[utoipa::path(post, tag = "TEI", path = "/predict", description = "TEI: class scores per input, sorted.", request_body = PredictRequest, responses((status = 200, body = PredictResponse), crate::api::error::TeiErrorResponses))]
pub async fn predict(State(state): State<AppState>, TeiJson(request): TeiJson<PredictRequest>) -> Result<Json<PredictResponse>, TeiError> {
    predict_inner(&state, request).await.map(Json)
}

/// TEI's `/rerank` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    pub query: String,
    pub texts: Vec<String>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub return_text: bool,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Rank {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub score: f32,
}

/// Whether a `/rerank` body is TEI's: `texts` without `documents`.
pub fn is_tei_rerank(body: &Value) -> bool {
    body.get("texts").is_some() && body.get("documents").is_none()
}

pub(in crate::api) async fn rerank_inner(state: &AppState, request: RerankRequest) -> Result<Vec<Rank>, TeiError> {
    if request.texts.is_empty() {
        return Err(TeiError::empty("`texts` cannot be empty"));
    }
    let (engine, _permit, ()) = begin(
        state,
        request.model.as_deref(),
        |s| Kind::of(s) == Some(Kind::Reranker),
        |engine| {
            if Kind::of(engine.spec()) != Some(Kind::Reranker) || engine.score_mode().is_none() {
                return Err(TeiError::backend("model is not a re-ranker model"));
            }
            batch_size(state, request.texts.len())
        },
    )?;
    let spec = engine.spec();
    let params = raw_logits(Task::Score, request.truncate, request.truncation_direction, spec)?;
    let (logits, _) = engine.score(std::slice::from_ref(&request.query), &request.texts, &params, None).await?;
    let mut ranks = Vec::with_capacity(logits.len());
    for (index, logit) in logits.into_iter().enumerate() {
        let mut score = [logit];
        tei_activation(&mut score, request.raw_scores);
        if score[0].is_nan() {
            return Err(TeiError::backend("score is NaN").with_message("score is NaN"));
        }
        ranks.push(Rank { index, text: request.return_text.then(|| request.texts[index].clone()), score: score[0] });
    }
    tei_order(&mut ranks, |r| r.score);
    Ok(ranks)
}

/// TEI's `/rerank`, for bodies [`is_tei_rerank`] says are TEI's.
pub async fn rerank(state: &AppState, body: Value) -> Response {
    let answer = async { rerank_inner(state, handed_over(body)?).await };
    answer.await.map(Json).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use serde_json::json;

    #[test]
    fn predict_inputs_follow_tei() {
        let one = |v: Value| predict_inputs(&v).unwrap();
        assert_eq!(one(json!("a")), (vec![Prompt::Text("a".into())], false));
        assert_eq!(one(json!(["a"])), (vec![Prompt::Text("a".into())], false));
        assert_eq!(one(json!(["a", "b"])), (vec![Prompt::Pair("a".into(), "b".into())], false));
        assert_eq!(one(json!([["a"], ["b", "c"]])), (vec![Prompt::Text("a".into()), Prompt::Pair("b".into(), "c".into())], true));
        for bad in [json!(["a", "b", "c"]), json!([]), json!([[]]), json!(5), json!([["a"], "b"])] {
            assert_eq!(predict_inputs(&bad).unwrap_err().status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        }
    }

    #[test]
    fn ties_come_out_in_reverse_input_order() {
        let mut ranks = vec![(0, 0.5), (1, 0.1), (2, 0.5)];
        tei_order(&mut ranks, |r| r.1);
        assert_eq!(ranks.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 0, 1]);
    }

    #[test]
    fn rerank_bodies_are_told_apart() {
        assert!(is_tei_rerank(&json!({"query": "q", "texts": ["a"]})));
        assert!(!is_tei_rerank(&json!({"query": "q", "documents": ["a"]})));
        assert!(!is_tei_rerank(&json!({"query": "q", "documents": ["a"], "texts": ["b"]})));
    }
}
