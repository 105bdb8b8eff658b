//! TEI's embedding routes: `/embed` (dense; a SPLADE model's full vocabulary vector),
//! `/embed_all` (a vector per token), `/embed_sparse` (non-zero weights) and `/similarity`
//! (cosine of a source sentence with each of the others).

use super::error::{TeiError, TeiJson};
use super::inputs::{yes, Input, InputFields, InputType, TruncationDirection};
use super::{batch_size, begin, Kind};
use crate::api::pooling::SparseValue;
use crate::api::AppState;
use crate::pooling::Task;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;

/// `/embed`'s request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct EmbedRequest {
    #[serde(flatten)]
    pub fields: InputFields,
    #[serde(default = "yes")]
    pub normalize: bool,
    /// Keep the first `dimensions` values (then normalize).
    #[serde(default)]
    pub dimensions: Option<usize>,
}

pub(in crate::api) async fn embed_inner(state: &AppState, request: EmbedRequest) -> Result<Vec<Vec<f32>>, TeiError> {
    let (engine, _permit, ()) =
        begin(state, request.fields.model.as_deref(), |s| s.supports(Task::Embed) || s.supports(Task::EmbedSparse), |_| Ok(()))?;
    let spec = engine.spec();
    let splade = Kind::of(spec) == Some(Kind::Splade);
    if splade && request.normalize {
        return Err(TeiError::backend("`normalize` is not available for SPLADE models"));
    }
    if request.dimensions == Some(0) {
        return Err(TeiError::validation("Input validation error: `dimensions` should be positive"));
    }
    if !splade && !spec.supports(Task::Embed) {
        return Err(TeiError::backend("Model is not an embedding model"));
    }
    let prompts = request.fields.inputs.clone().prompts()?;
    batch_size(state, prompts.len())?;
    if splade {
        // TEI's dense form of a SPLADE vector: every vocabulary weight.
        let params = request.fields.params(Task::EmbedSparse, spec, false)?;
        let (outputs, _): (Vec<Vec<(u32, f32)>>, _) = engine.encode_as(prompts, &params).await?;
        let size = engine.input().vocab_size();
        return Ok(outputs
            .into_iter()
            .map(|weights| {
                let mut dense = vec![0.0; size];
                weights.into_iter().filter(|(i, _)| (*i as usize) < size).for_each(|(i, w)| dense[i as usize] = w);
                dense
            })
            .collect());
    }
    let mut params = request.fields.params(Task::Embed, spec, request.normalize)?;
    if let Some(d) = request.dimensions {
        if d > spec.embedding_size {
            return Err(TeiError::validation(
                "Input validation error: `dimensions` should be smaller than the maximum embedding dimension.",
            ));
        }
        params.dimensions = (d < spec.embedding_size).then_some(d);
    }
    Ok(engine.encode_as(prompts, &params).await?.0)
}

#[utoipa::path(post, tag = "TEI", path = "/embed", description = "TEI: one vector per input (a list of lists).", request_body = EmbedRequest, responses((status = 200, body = Vec<Vec<f32>>), crate::api::error::TeiErrorResponses))]
pub async fn embed(State(state): State<AppState>, TeiJson(request): TeiJson<EmbedRequest>) -> Result<Json<Vec<Vec<f32>>>, TeiError> {
    embed_inner(&state, request).await.map(Json)
}

#[utoipa::path(post, tag = "TEI", path = "/embed_all", description = "TEI: one vector per token of each input.", request_body = InputFields, responses((status = 200, body = Vec<Vec<Vec<f32>>>), crate::api::error::TeiErrorResponses))]
pub async fn embed_all(
    State(state): State<AppState>,
    TeiJson(request): TeiJson<InputFields>,
) -> Result<Json<Vec<Vec<Vec<f32>>>>, TeiError> {
    embed_all_inner(&state, request).await.map(Json)
}

pub(in crate::api) async fn embed_all_inner(state: &AppState, request: InputFields) -> Result<Vec<Vec<Vec<f32>>>, TeiError> {
    let (engine, _permit, ()) = begin(state, request.model.as_deref(), |s| s.supports(Task::Embed), |_| Ok(()))?;
    let spec = engine.spec();
    match Kind::of(spec) {
        Some(Kind::Splade) => return Err(TeiError::backend("`embed_all` is not available for SPLADE models")),
        Some(Kind::Embedding) if spec.supports(Task::TokenEmbed) => {}
        _ => return Err(TeiError::backend("Model is not an embedding model")),
    }
    let prompts = request.inputs.clone().prompts()?;
    batch_size(state, prompts.len())?;
    let params = request.params(Task::TokenEmbed, spec, false)?;
    Ok(engine.encode_as(prompts, &params).await?.0)
}

pub(in crate::api) async fn embed_sparse_inner(state: &AppState, request: InputFields) -> Result<Vec<Vec<SparseValue>>, TeiError> {
    let (engine, _permit, ()) = begin(state, request.model.as_deref(), |s| s.supports(Task::EmbedSparse), |_| Ok(()))?;
    let spec = engine.spec();
    if Kind::of(spec) != Some(Kind::Splade) && !spec.m3 {
        return Err(TeiError::backend("Model is not an embedding model with SPLADE pooling"));
    }
    let prompts = request.inputs.clone().prompts()?;
    batch_size(state, prompts.len())?;
    let params = request.params(Task::EmbedSparse, spec, false)?;
    let (outputs, _): (Vec<Vec<(u32, f32)>>, _) = engine.encode_as(prompts, &params).await?;
    Ok(outputs.into_iter().map(SparseValue::list).collect())
}

#[utoipa::path(post, tag = "TEI", path = "/embed_sparse", description = "TEI: SPLADE sparse embeddings, non-zero `{index, value}` per input.", request_body = InputFields, responses((status = 200, body = Vec<Vec<SparseValue>>), crate::api::error::TeiErrorResponses))]
pub async fn embed_sparse(
    State(state): State<AppState>,
    TeiJson(request): TeiJson<InputFields>,
) -> Result<Json<Vec<Vec<SparseValue>>>, TeiError> {
    embed_sparse_inner(&state, request).await.map(Json)
}

/// `/similarity`'s request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct SimilarityRequest {
    #[serde(deserialize_with = "crate::api::json::object")]
    pub inputs: SimilarityInputs,
    #[serde(default, deserialize_with = "crate::api::json::optional_object")]
    pub parameters: Option<SimilarityParameters>,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct SimilarityInputs {
    pub source_sentence: String,
    pub sentences: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct SimilarityParameters {
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    #[serde(default)]
    pub prompt_name: Option<String>,
}

#[utoipa::path(post, tag = "TEI", path = "/similarity", description = "TEI: cosine of the source sentence with each sentence.", request_body = SimilarityRequest, responses((status = 200, body = Vec<f32>), crate::api::error::TeiErrorResponses))]
pub async fn similarity(State(state): State<AppState>, TeiJson(request): TeiJson<SimilarityRequest>) -> Result<Json<Vec<f32>>, TeiError> {
    if request.inputs.sentences.is_empty() {
        return Err(TeiError::empty("`inputs.sentences` cannot be empty"));
    }
    batch_size(&state, request.inputs.sentences.len() + 1)?;
    let parameters = request.parameters.unwrap_or_default();
    let mut texts = vec![InputType::Text(request.inputs.source_sentence)];
    texts.extend(request.inputs.sentences.into_iter().map(InputType::Text));
    let embed = EmbedRequest {
        fields: InputFields {
            inputs: Input::Batch(texts),
            truncate: parameters.truncate,
            truncation_direction: parameters.truncation_direction,
            prompt_name: parameters.prompt_name,
            model: request.model,
        },
        normalize: false,
        dimensions: None,
    };
    let vectors = embed_inner(&state, embed).await?;
    let (source, others) = vectors.split_first().ok_or_else(|| TeiError::backend("no embedding returned"))?;
    Ok(Json(others.iter().map(|v| cosine(source, v)).collect()))
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    (dot / (norm(a) * norm(b)).max(1e-12)) as f32
}
