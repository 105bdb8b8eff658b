//! `POST /pooling`: vLLM's task-generic endpoint. `task` must be the model's pooling task
//! (its default), as vLLM 0.33 checks it: a task the model has but does not serve says how to
//! switch (`--pooler-config.task`), one it lacks lists the tasks it has. A body with `data`
//! instead of `input` goes to the model's IO-processor plugin (`plugin.rs`). Per-token tasks answer nested lists,
//! embed_sparse lists of `{"index", "value"}`. `encoding_format` (`float`, `base64`, `bytes`,
//! `bytes_only`), `embed_dtype` and `endianness` apply as on `/v1/embeddings`; a matrix's
//! base64 holds its rows one after another.

use super::chat::{self, ChatFields};
use super::embeddings::bytes_response;
use super::encoding::{EncodedValue, EncodingParams};
use super::error::{ApiError, ErrorResponses};
use super::json::{ApiJson, OffRuntimeJson};
use super::{plugin, AppState, ListResponse};
use crate::engine::literal;
use crate::engine::params::PoolingParams;
use crate::loader::model_spec::ModelSpec;
use crate::pooling::config::POOLER_TASKS;
use crate::pooling::m3::{MultiOutput, MultiVectors};
use crate::pooling::PoolingOutput;
use crate::pooling::Task;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct PoolingRequest {
    /// Texts or token ids (absent when `messages` is sent).
    #[serde(default)]
    pub input: serde_json::Value,
    /// vLLM's chat input, rendered through the chat template; image-text models embed each
    /// message.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<serde_json::Value>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub task: Option<serde_json::Value>,
    /// vLLM's plugin request: anything the model's IO-processor plugin reads (with no `input`
    /// and no `messages`); see docs/plugins.md.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub data: Option<serde_json::Value>,
    /// A sentence-transformers prompt of the model, prepended to every text input.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// vLLM: names the response (`pooling-{request_id}`) when no `X-Request-Id` header does.
    #[serde(default)]
    pub request_id: Option<String>,
    /// BGE-M3 only: FlagEmbedding's `encode` flags. Any of them asks for several outputs of one
    /// pass; each item's `data` is then an object with the ones asked for.
    #[serde(default)]
    pub return_dense: Option<bool>,
    #[serde(default)]
    pub return_sparse: Option<bool>,
    #[serde(default)]
    pub return_colbert_vecs: Option<bool>,
    #[serde(flatten)]
    pub encoding: EncodingParams,
    #[serde(flatten)]
    pub chat: ChatFields,
    #[serde(flatten)]
    pub params: PoolingParams,
}

impl PoolingRequest {
    /// The BGE-M3 outputs asked for together, if the request names any.
    fn multi(&self) -> Option<MultiOutput> {
        if self.return_dense.is_none() && self.return_sparse.is_none() && self.return_colbert_vecs.is_none() {
            return None;
        }
        Some(MultiOutput {
            dense: self.return_dense.unwrap_or(false),
            sparse: self.return_sparse.unwrap_or(false),
            colbert: self.return_colbert_vecs.unwrap_or(false),
            token_weights: false,
        })
    }
}

/// BGE-M3's outputs of one input, named as FlagEmbedding's `encode` returns them:
/// `dense_vecs`, `lexical_weights` (token id → weight) and `colbert_vecs`, those asked for.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MultiData {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_vecs: Option<Vec<f32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lexical_weights: Option<std::collections::BTreeMap<String, f32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub colbert_vecs: Option<Vec<Vec<f32>>>,
}

impl From<MultiVectors> for MultiData {
    fn from(m: MultiVectors) -> Self {
        MultiData {
            dense_vecs: m.dense,
            lexical_weights: m.sparse.map(|s| s.into_iter().map(|(id, w)| (id.to_string(), w)).collect()),
            colbert_vecs: m.colbert,
        }
    }
}

/// One non-zero weight of a sparse embedding (TEI's `SparseValue`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SparseValue {
    pub index: u32,
    pub value: f32,
}

impl SparseValue {
    pub fn list(weights: Vec<(u32, f32)>) -> Vec<SparseValue> {
        weights.into_iter().map(|(index, value)| SparseValue { index, value }).collect()
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PoolingValue {
    Encoded(EncodedValue),
    Sparse(Vec<SparseValue>),
    Multi(MultiData),
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PoolingData {
    pub index: usize,
    pub object: &'static str,
    pub data: PoolingValue,
}

/// The task a request names, checked as vLLM's `_verify_pooling_task` checks it.
fn pooling_task(requested: Option<&serde_json::Value>, spec: &ModelSpec) -> Result<Task, ApiError> {
    let name = match requested {
        None | Some(serde_json::Value::Null) => return Ok(spec.pooling_task),
        Some(serde_json::Value::String(name)) => name.as_str(),
        Some(other) => {
            return Err(ApiError::BadRequest { message: literal::message("task", other, &POOLER_TASKS[..6]), param: Some("task") })
        }
    };
    let bad = |message: String| ApiError::BadRequest { message, param: Some("task") };
    match name {
        "score" => return Err(bad("`score` task was removed; use `classify` instead.".into())),
        "encode" => return Err(bad("`encode` task was removed; use `token_embed` or `token_classify` instead.".into())),
        "plugin" => return Err(bad(plugin::NO_PLUGIN.into())),
        _ if !POOLER_TASKS.contains(&name) => return Err(bad(literal::message("task", &name.into(), &POOLER_TASKS[..6]))),
        _ => {}
    }
    match name.parse::<Task>().ok().filter(|t| *t != Task::Score) {
        Some(task) if task == spec.pooling_task => Ok(task),
        // BGE-M3 computes all its outputs in one pass: every task it has is served.
        Some(task) if spec.m3 && spec.supports(task) => Ok(task),
        Some(task) if spec.supports(task) => Err(bad(format!("Try switching the model's pooling_task via --pooler-config.task {name}."))),
        _ => Err(bad(format!("Unsupported task: '{name}' Supported tasks: {}", Task::py_tuple(&spec.pooling_tasks())))),
    }
}

#[utoipa::path(post, tag = "Pooling (vLLM)", path = "/pooling", description = "Any pooling task (vLLM).", request_body = PoolingRequest,
    responses(
        (status = 200, description = "the pooled outputs (JSON), or with `encoding_format` bytes / bytes_only their elements (octet-stream)", content(
            (ListResponse<PoolingData> = "application/json"),
            (Vec<u8> = "application/octet-stream"),
        )),
        ErrorResponses
    ))]
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(mut request): ApiJson<PoolingRequest>,
) -> Result<axum::response::Response, ApiError> {
    // vLLM's IOProcessorRequest: `data`, and neither `input` nor `messages`.
    if request.data.is_some() && request.input.is_null() && request.messages.is_none() {
        let call = plugin::PluginCall {
            model: request.model.as_deref(),
            request_id: request.request_id.as_deref(),
            dimensions: request.params.dimensions.is_some(),
        };
        let data = request.data.take().unwrap_or_default();
        return plugin::run(&state, &headers, call, data).await;
    }
    AppState::require_input(&request.input, request.messages.as_ref())?;
    let multi = request.multi();
    let (engine, permit, task) = state.begin(request.model.as_deref(), |engine| {
        if let Some(multi) = multi {
            check_multi(multi, &request, engine.spec())?;
        }
        if request.task == Some("plugin".into()) && state.plugin(engine).is_some() {
            // vLLM fails this with an internal assertion; say what the plugin needs instead.
            let message = "the model's IO-processor plugin takes `data` (and no `input` or `messages`)";
            return Err(ApiError::BadRequest { message: message.into(), param: Some("data") });
        }
        let task = pooling_task(request.task.as_ref(), engine.spec())?;
        if task == Task::EmbedSparse && request.encoding.encoding_format.is_some_and(|f| f != super::encoding::EncodingFormat::Float) {
            return Err(ApiError::BadRequest {
                message: "embed_sparse outputs are `float` only (lists of {\"index\", \"value\"})".into(),
                param: Some("encoding_format"),
            });
        }
        Ok(task)
    })?;
    let engine = &engine;
    let spec = engine.spec();
    let mut params = request.params.verify(task, spec)?.with_prompt_name(request.prompt_name.as_deref(), spec)?;
    params.multi = multi;
    let inputs = chat::inputs(&state, engine, &request.input, request.messages.as_ref(), &request.chat, false).await?;
    let params = inputs.params(params, request.params.add_special_tokens);
    let (outputs, tokens) = engine.encode(inputs.prompts, &params).await?;
    let response = ListResponse::new("pooling", &headers, request.request_id.as_deref(), engine, Vec::<PoolingData>::new(), tokens);
    let encoding = request.encoding;
    if encoding.is_bytes() {
        let shaped = outputs
            .into_iter()
            .map(|output| match output {
                PoolingOutput::Vector(v) => Ok((vec![v.len()], v)),
                PoolingOutput::Tokens(rows) => Ok((vec![rows.len(), rows.first().map_or(0, Vec::len)], rows.concat())),
                PoolingOutput::Sparse(_) | PoolingOutput::Multi(_) => Err(ApiError::Internal("sparse outputs have no bytes form".into())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return bytes_response(encoding, shaped, response).await;
    }
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            let data = match output {
                PoolingOutput::Vector(v) => PoolingValue::Encoded(encoding.vector(v)),
                PoolingOutput::Tokens(rows) => PoolingValue::Encoded(encoding.matrix(rows)),
                PoolingOutput::Sparse(s) => PoolingValue::Sparse(SparseValue::list(s)),
                PoolingOutput::Multi(m) => PoolingValue::Multi(m.into()),
            };
            PoolingData { index, object: "pooling", data }
        })
        .collect();
    OffRuntimeJson(ListResponse { data, ..response }).into_response(permit).await
}

/// A request for several BGE-M3 outputs: a BGE-M3 model, the embed task (or none), float JSON,
/// and at least one output.
fn check_multi(multi: MultiOutput, request: &PoolingRequest, spec: &ModelSpec) -> Result<(), ApiError> {
    let bad = |message: String, param| Err(ApiError::BadRequest { message, param: Some(param) });
    if !spec.m3 {
        return bad(
            format!(
                "return_dense, return_sparse and return_colbert_vecs ask for BGE-M3's outputs; model {} has no sparse and ColBERT heads",
                spec.served_name
            ),
            "return_sparse",
        );
    }
    if !matches!(request.task.as_ref(), None | Some(serde_json::Value::Null)) && request.task != Some("embed".into()) {
        return bad("return_dense, return_sparse and return_colbert_vecs go with task `embed` (or no task)".into(), "task");
    }
    if request.encoding.encoding_format.is_some_and(|f| f != super::encoding::EncodingFormat::Float) {
        return bad("several outputs at once are `float` JSON only".into(), "encoding_format");
    }
    if !(multi.dense || multi.sparse || multi.colbert) {
        return bad("return_dense, return_sparse and return_colbert_vecs are all false: nothing to return".into(), "return_dense");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(requested: serde_json::Value, spec: &ModelSpec) -> String {
        match pooling_task(Some(&requested), spec).unwrap_err() {
            ApiError::BadRequest { message, .. } => message,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tasks_are_checked_as_vllm_checks_them() {
        let spec = ModelSpec::for_tests(8, 16);
        assert_eq!(pooling_task(None, &spec).unwrap(), Task::Embed);
        assert_eq!(pooling_task(Some(&json!("embed")), &spec).unwrap(), Task::Embed);
        assert_eq!(message(json!("token_embed"), &spec), "Try switching the model's pooling_task via --pooler-config.task token_embed.");
        assert_eq!(message(json!("classify"), &spec), "Unsupported task: 'classify' Supported tasks: ('embed', 'token_embed')");
        assert!(message(json!("plugin"), &spec).starts_with("No IOProcessor plugin installed."));
        assert!(message(json!("score"), &spec).contains("`score` task was removed"));
        assert!(message(json!("embedding"), &spec).contains("literal_error"));
    }
}
