//! `POST /v2/embed` and `/v1/embed`: Cohere's embed API, so `cohere.ClientV2(...).embed(...)`
//! and the v1 `cohere.Client(...).embed(...)` work unchanged against any embedding model.
//!
//! Decisions where Cohere's API assumes its own models:
//! - `input_type` picks a sentence-transformers prompt of the model: search_query → the prompt
//!   named `search_query`, else `query`; search_document → `search_document`, else `document`,
//!   else `passage`; classification and clustering → the prompt of that name. When the model has
//!   none of those names, no prompt is used (not even the default), so that Cohere's clients
//!   work with any model; without `input_type` the model's default prompt applies, as on every
//!   other route. Any other `input_type` must name one of the model's prompts (as vLLM reads
//!   them), else 400 in vLLM's words (`Unsupported input_type 'x'. Supported values: …`).
//! - A model with built-in task adapters (jina-embeddings-v3) runs the task `input_type`
//!   names instead: search_query → `retrieval.query`, search_document → `retrieval.passage`,
//!   classification → `classification`, clustering → `separation`, or a task by its own name;
//!   the task's instruction is then the prompt, as with Jina's `task`.
//! - `meta.billed_units`: `input_tokens` counts the text tokens run through the model
//!   (prompts and special tokens included), `image_tokens` the sequence each image becomes in
//!   the vision tower (0 for text requests), as vLLM bills them.
//! - `truncate`: END (the default) keeps the first `max_model_len` tokens, START the last,
//!   NONE refuses longer inputs with vLLM's 400. `max_tokens` lowers the kept length (at most
//!   `max_model_len`) and needs START or END.
//! - `inputs`: the text parts of one input are joined with a newline; image parts (and
//!   `images`, `input_type: image`) need an image-text model (CLIP, SigLIP) and are refused
//!   for text models. For image-text models an input holds one text or one image
//!   ([`crate::input::media::content_prompt`]); `texts` in the response echoes the texts only.
//!   Superset: soft-token models (EmbeddingGemma 2) take any mix of text, image, audio and
//!   video parts in one input, as vLLM's `messages` content parts, read by the same parser;
//!   where the folder has a chat template, `images` and `inputs` are rendered through it as
//!   vLLM renders them (a user message of the input's parts, after a system message of the
//!   `input_type`'s instruction when there is one).
//! - `embedding_types` (default `float`) are encoded as [`super::encoding`] documents;
//!   `meta.billed_units.input_tokens` counts the tokens run through the model, prompts and
//!   special tokens included.
//! - v1 without `embedding_types` answers `response_type: embeddings_floats` (a plain list of
//!   float vectors), as Cohere's v1 does; v2 always answers `embeddings_by_type`.

use super::encoding;
use super::error::{ApiError, ErrorResponses};
use super::json::ApiJson;
use super::{response_id, AppState};
use crate::engine::params::PoolingParams;
use crate::input::chat_template::ChatOptions;
use crate::input::media::{self, MediaOptions};
use crate::input::tokenizer::TruncationSide;
use crate::input::{ChatTurn, Prompt};
use crate::loader::model_spec::Prompts;
use crate::pooling::Task;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Cohere's own input types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputType {
    SearchQuery,
    SearchDocument,
    Classification,
    Clustering,
    Image,
}

impl InputType {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "search_query" => InputType::SearchQuery,
            "search_document" => InputType::SearchDocument,
            "classification" => InputType::Classification,
            "clustering" => InputType::Clustering,
            "image" => InputType::Image,
            _ => return None,
        })
    }

    /// The prompt names this input type selects, in order of preference.
    fn prompt_names(self) -> &'static [&'static str] {
        match self {
            InputType::SearchQuery => &["search_query", "query"],
            InputType::SearchDocument => &["search_document", "document", "passage"],
            InputType::Classification => &["classification"],
            InputType::Clustering => &["clustering"],
            InputType::Image => &[],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingType {
    Float,
    Int8,
    Uint8,
    Binary,
    Ubinary,
    Base64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Truncate {
    None,
    Start,
    End,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct CohereEmbedRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub texts: Option<Vec<String>>,
    /// Image data URLs (image models only).
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>)]
    pub images: Option<Value>,
    /// `[{"content": [{"type": "text", "text": …}, {"type": "image_url", …}]}]`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub inputs: Option<Vec<Value>>,
    /// Cohere's input types, or the name of one of the model's prompts.
    #[serde(default)]
    pub input_type: Option<String>,
    #[serde(default)]
    pub embedding_types: Option<Vec<EmbeddingType>>,
    /// Matryoshka size, with the rules of `dimensions`.
    #[serde(default)]
    pub output_dimension: Option<i64>,
    #[serde(default)]
    pub truncate: Option<Truncate>,
    /// Keep at most this many tokens of each input (needs `truncate` START or END).
    #[serde(default)]
    pub max_tokens: Option<i64>,
}

/// One list per requested type, each with one entry per input.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct EmbeddingsByType {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub float: Option<Vec<Vec<f32>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int8: Option<Vec<Vec<i8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uint8: Option<Vec<Vec<u8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary: Option<Vec<Vec<i8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ubinary: Option<Vec<Vec<u8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<Vec<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum CohereEmbeddings {
    ByType(EmbeddingsByType),
    Floats(Vec<Vec<f32>>),
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApiVersion {
    pub version: &'static str,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BilledUnits {
    pub input_tokens: usize,
    pub image_tokens: usize,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CohereMeta {
    pub api_version: ApiVersion,
    pub billed_units: BilledUnits,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CohereEmbedResponse {
    pub id: String,
    /// `embeddings_by_type`, or `embeddings_floats` (v1 without `embedding_types`).
    pub response_type: &'static str,
    pub embeddings: CohereEmbeddings,
    pub texts: Vec<String>,
    pub meta: CohereMeta,
}

fn no_images() -> ApiError {
    ApiError::BadRequest {
        message: "This model embeds text only: images need an image model (such as CLIP or SigLIP)".into(),
        param: Some("images"),
    }
}

impl CohereEmbedRequest {
    /// The texts to embed, from `texts` or the text parts of `inputs`.
    fn texts(&self) -> Result<Vec<String>, ApiError> {
        if self.images.is_some() || self.input_type.as_deref() == Some("image") {
            return Err(no_images());
        }
        let texts = match (&self.texts, &self.inputs) {
            (Some(texts), None) => texts.clone(),
            (None, Some(inputs)) => inputs.iter().map(input_text).collect::<Result<_, _>>()?,
            _ => return Err(ApiError::bad_request("An embed request needs exactly one of texts, images or inputs")),
        };
        if texts.is_empty() {
            return Err(ApiError::BadRequest { message: "texts must not be empty".into(), param: Some("texts") });
        }
        Ok(texts)
    }

    /// The inputs and the texts to echo back. A text model takes `texts` or the text parts
    /// of `inputs`; an image-text model also `images` (data URLs, or URLs of allowed hosts)
    /// and `inputs` whose content is one text or one image each.
    async fn prompts(&self, takes_images: bool, media: &MediaOptions) -> Result<(Vec<Prompt>, Vec<String>), ApiError> {
        if !takes_images {
            let texts = self.texts()?;
            return Ok((texts.iter().cloned().map(Prompt::Text).collect(), texts));
        }
        let empty = |field: &'static str| ApiError::BadRequest { message: format!("{field} must not be empty"), param: Some(field) };
        match (&self.texts, &self.images, &self.inputs) {
            (Some(_), None, None) if self.input_type.as_deref() == Some("image") => Err(ApiError::BadRequest {
                message: "input_type `image` goes with `images`, not `texts`".into(),
                param: Some("input_type"),
            }),
            (Some(_), None, None) => {
                let texts = self.texts()?;
                Ok((texts.iter().cloned().map(Prompt::Text).collect(), texts))
            }
            (None, Some(images), None) => {
                let shape = || ApiError::BadRequest {
                    message: "images must be a list of data URLs (data:image/png;base64,…)".into(),
                    param: Some("images"),
                };
                let urls = images.as_array().ok_or_else(shape)?;
                if urls.is_empty() {
                    return Err(empty("images"));
                }
                let urls = urls.iter().map(|url| url.as_str().map(String::from).ok_or_else(shape)).collect::<Result<Vec<_>, _>>()?;
                let prompts = media::images_bytes(urls, media).await?.into_iter().map(Prompt::Image).collect();
                Ok((prompts, Vec::new()))
            }
            (None, None, Some(inputs)) => {
                if inputs.is_empty() {
                    return Err(empty("inputs"));
                }
                let contents = inputs
                    .iter()
                    .map(|input| {
                        input.get("content").cloned().ok_or_else(|| ApiError::BadRequest {
                            message: "each input must be {\"content\": [content parts]}".into(),
                            param: Some("inputs"),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let prompts = media::content_prompts(&contents, media).await?;
                let texts = prompts.iter().filter_map(|p| if let Prompt::Text(t) = p { Some(t.clone()) } else { None }).collect();
                Ok((prompts, texts))
            }
            _ => Err(ApiError::bad_request("An embed request needs exactly one of texts, images or inputs")),
        }
    }

    /// `truncate_prompt_tokens` and side from `truncate` and `max_tokens`.
    fn truncation(&self, max_model_len: usize) -> Result<(Option<i64>, Option<TruncationSide>), ApiError> {
        let keep = match self.max_tokens {
            None => -1,
            Some(n) if n >= 1 => n.min(max_model_len as i64),
            Some(n) => {
                return Err(ApiError::BadRequest {
                    message: format!("max_tokens must be a positive integer, got {n}"),
                    param: Some("max_tokens"),
                })
            }
        };
        match self.truncate.unwrap_or(Truncate::End) {
            Truncate::None if self.max_tokens.is_some() => {
                Err(ApiError::BadRequest { message: "max_tokens needs truncate START or END".into(), param: Some("max_tokens") })
            }
            Truncate::None => Ok((None, None)),
            Truncate::Start => Ok((Some(keep), Some(TruncationSide::Left))),
            Truncate::End => Ok((Some(keep), Some(TruncationSide::Right))),
        }
    }
}

/// The text of one `inputs` entry: its text parts joined with a newline.
fn input_text(input: &Value) -> Result<String, ApiError> {
    let shape = || ApiError::BadRequest {
        message: "each input must be {\"content\": [{\"type\": \"text\", \"text\": string}, ...]}".into(),
        param: Some("inputs"),
    };
    let parts = input.get("content").and_then(Value::as_array).filter(|p| !p.is_empty()).ok_or_else(shape)?;
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => texts.push(part.get("text").and_then(Value::as_str).ok_or_else(shape)?),
            Some("image_url") => return Err(no_images()),
            _ => return Err(shape()),
        }
    }
    Ok(texts.join("\n"))
}

/// The built-in task adapter an `input_type` selects among `tasks` (module docs).
fn task_for<'t>(input_type: &str, tasks: &'t [String]) -> Option<&'t str> {
    let wanted = match input_type {
        "search_query" => "retrieval.query",
        "search_document" => "retrieval.passage",
        "clustering" => "separation",
        other => other,
    };
    tasks.iter().map(String::as_str).find(|task| *task == wanted)
}

/// The prompt an `input_type` selects (module docs), or the default without one.
fn prompt_for(input_type: Option<&str>, prompts: &Prompts) -> Result<Option<String>, ApiError> {
    let Some(name) = input_type else {
        return Ok(prompts.default.clone());
    };
    if let Some(kind) = InputType::parse(name) {
        let named = kind.prompt_names().iter().find(|name| prompts.has(name));
        return Ok(named.and_then(|name| prompts.named.get(*name).cloned()));
    }
    if let Some(text) = prompts.named.get(name) {
        return Ok(Some(text.clone()));
    }
    let message = if prompts.named.is_empty() {
        format!("Unsupported input_type '{name}'. This model does not define any input_type task instructions.")
    } else {
        let names: Vec<&str> = prompts.named.keys().map(String::as_str).collect();
        format!("Unsupported input_type '{name}'. Supported values: {}", names.join(", "))
    };
    Err(ApiError::BadRequest { message, param: Some("input_type") })
}

/// Every requested encoding of the float vectors.
fn by_type(vectors: &[Vec<f32>], types: &[EmbeddingType]) -> EmbeddingsByType {
    let mut out = EmbeddingsByType::default();
    for kind in types {
        match kind {
            EmbeddingType::Float => out.float = Some(vectors.to_vec()),
            EmbeddingType::Int8 => out.int8 = Some(vectors.iter().map(|v| encoding::int8(v)).collect()),
            EmbeddingType::Uint8 => out.uint8 = Some(vectors.iter().map(|v| encoding::uint8(v)).collect()),
            EmbeddingType::Binary => out.binary = Some(vectors.iter().map(|v| encoding::binary(v)).collect()),
            EmbeddingType::Ubinary => out.ubinary = Some(vectors.iter().map(|v| encoding::ubinary(v)).collect()),
            EmbeddingType::Base64 => out.base64 = Some(vectors.iter().map(|v| encoding::base64_f32(v)).collect()),
        }
    }
    out
}

async fn embed(
    state: AppState,
    headers: HeaderMap,
    request: CohereEmbedRequest,
    version: &'static str,
) -> Result<Json<CohereEmbedResponse>, ApiError> {
    let (engine, _permit, ()) = state.begin(request.model.as_deref(), |engine| {
        // vLLM registers /v2/embed beside /v1/embeddings, which a token_embed model replaces.
        if engine.spec().pooling_task == Task::TokenEmbed {
            return Err(ApiError::RouteNotFound);
        }
        super::serves(engine.spec(), Task::Embed, "Embeddings")
    })?;
    let tasks = engine.lora().map_or(&[][..], |registry| registry.tasks());
    // Owned: `engine` is replaced below by its task's.
    let task = request.input_type.as_deref().and_then(|input_type| task_for(input_type, tasks)).map(str::to_string);
    let engine = match task.as_deref() {
        Some(task) => engine.with_task(task).map_err(|e| ApiError::BadRequest { message: e.message, param: Some("input_type") })?,
        None => engine,
    };
    let engine = &engine;
    let spec = engine.spec();
    let (truncate_prompt_tokens, truncation_side) = request.truncation(spec.max_model_len)?;
    let pooling = PoolingParams { truncate_prompt_tokens, truncation_side, dimensions: request.output_dimension, ..Default::default() };
    // Matryoshka refusals name the field this API calls `output_dimension`.
    let mut params = pooling.verify(Task::Embed, spec).map_err(|mut e| {
        if e.param == Some("dimensions") {
            e.param = Some("output_dimension");
        }
        e
    })?;
    params.prompt = match task {
        Some(_) => None, // the task's own instruction
        None => prompt_for(request.input_type.as_deref(), &spec.prompts)?.map(Into::into),
    };
    // Before any image is fetched or decoded.
    let count = [
        request.texts.as_ref().map(Vec::len),
        request.images.as_ref().and_then(Value::as_array).map(Vec::len),
        request.inputs.as_ref().map(Vec::len),
    ];
    state.check_batch_size(count.into_iter().flatten().max().unwrap_or(0))?;
    let (mut prompts, texts) = request.prompts(spec.images, &state.options().media).await?;
    let input = engine.input();
    if request.texts.is_none() && input.media_placeholders().is_some() && input.has_chat_template() {
        // vLLM renders `images` and `inputs` through the chat template, the input_type's
        // instruction as a system message before each.
        let instruction = params.prompt.take();
        let conversations = prompts
            .into_iter()
            .map(|prompt| {
                let system = instruction.as_ref().map(|text| ChatTurn { role: "system".into(), prompt: Prompt::Text(text.to_string()) });
                system.into_iter().chain([ChatTurn { role: "user".into(), prompt }]).collect()
            })
            .collect();
        prompts = input.render_media_chat(conversations, ChatOptions::default(), None).await?;
        params.add_special_tokens = false;
    }
    let (vectors, usage): (Vec<Vec<f32>>, _) = engine.encode_as_counted(prompts, &params).await?;
    let (tokens, image_tokens) = (usage.tokens, usage.image_tokens);
    let (response_type, embeddings) = match (&request.embedding_types, version) {
        (None, "1") => ("embeddings_floats", CohereEmbeddings::Floats(vectors)),
        (types, _) => {
            let types = types.as_deref().filter(|t| !t.is_empty()).unwrap_or(&[EmbeddingType::Float]);
            ("embeddings_by_type", CohereEmbeddings::ByType(by_type(&vectors, types)))
        }
    };
    Ok(Json(CohereEmbedResponse {
        id: response_id("embed", &headers, None),
        response_type,
        embeddings,
        texts,
        meta: CohereMeta {
            api_version: ApiVersion { version },
            billed_units: BilledUnits { input_tokens: tokens - image_tokens, image_tokens },
        },
    }))
}

#[utoipa::path(post, tag = "Embed (Cohere)", path = "/v2/embed", description = "Cohere embed v2 (embeddings by type).", request_body = CohereEmbedRequest,
    responses(
        (status = 200, body = CohereEmbedResponse),
        ErrorResponses
    ))]
pub async fn create_v2(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CohereEmbedRequest>,
) -> Result<Json<CohereEmbedResponse>, ApiError> {
    embed(state, headers, request, "2").await
}

#[utoipa::path(post, tag = "Embed (Cohere)", path = "/v1/embed", description = "Cohere embed v1 (float list without embedding_types).", request_body = CohereEmbedRequest,
    responses(
        (status = 200, body = CohereEmbedResponse),
        ErrorResponses
    ))]
pub async fn create_v1(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CohereEmbedRequest>,
) -> Result<Json<CohereEmbedResponse>, ApiError> {
    embed(state, headers, request, "1").await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: Value) -> CohereEmbedRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn input_types_pick_prompts_by_alias() {
        let named = [("query", "q: "), ("passage", "p: "), ("clustering", "c: ")].map(|(k, v)| (k.to_string(), v.to_string())).into();
        let prompts = Prompts::new(named, Some("query"), None, None).unwrap();
        assert_eq!(prompt_for(Some("search_query"), &prompts).unwrap().as_deref(), Some("q: "));
        assert_eq!(prompt_for(Some("search_document"), &prompts).unwrap().as_deref(), Some("p: "));
        assert_eq!(prompt_for(Some("clustering"), &prompts).unwrap().as_deref(), Some("c: "));
        assert_eq!(prompt_for(Some("classification"), &prompts).unwrap(), None);
        assert_eq!(prompt_for(None, &prompts).unwrap().as_deref(), Some("q: "));
        // Any prompt of the model by its name; others in vLLM's words.
        assert_eq!(prompt_for(Some("passage"), &prompts).unwrap().as_deref(), Some("p: "));
        let err = prompt_for(Some("nonexistent_type"), &prompts).unwrap_err();
        assert_eq!(err.to_string(), "Unsupported input_type 'nonexistent_type'. Supported values: clustering, passage, query");
        let err = prompt_for(Some("nonexistent_type"), &Prompts::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Unsupported input_type 'nonexistent_type'. This model does not define any input_type task instructions."
        );
    }

    #[test]
    fn texts_come_from_texts_or_input_parts() {
        assert_eq!(request(json!({"texts": ["a", "b"]})).texts().unwrap(), vec!["a", "b"]);
        let parts = json!({"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
        assert_eq!(request(parts).texts().unwrap(), vec!["a\nb"]);
        assert!(request(json!({"texts": []})).texts().is_err());
        assert!(request(json!({})).texts().is_err());
        assert!(request(json!({"images": ["data:image/png;base64,AAAA"]})).texts().unwrap_err().to_string().contains("image model"));
        let image_part = json!({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]});
        assert!(request(image_part).texts().is_err());
        assert!(request(json!({"texts": ["a"], "input_type": "image"})).texts().is_err());
    }

    #[test]
    fn truncate_modes() {
        assert_eq!(request(json!({})).truncation(128).unwrap(), (Some(-1), Some(TruncationSide::Right)));
        assert_eq!(request(json!({"truncate": "START"})).truncation(128).unwrap(), (Some(-1), Some(TruncationSide::Left)));
        assert_eq!(request(json!({"truncate": "NONE"})).truncation(128).unwrap(), (None, None));
        assert_eq!(request(json!({"max_tokens": 5})).truncation(128).unwrap(), (Some(5), Some(TruncationSide::Right)));
        assert_eq!(request(json!({"max_tokens": 500})).truncation(128).unwrap(), (Some(128), Some(TruncationSide::Right)));
        assert!(request(json!({"truncate": "NONE", "max_tokens": 5})).truncation(128).is_err());
        assert!(request(json!({"max_tokens": 0})).truncation(128).is_err());
    }
}
