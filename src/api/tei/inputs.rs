//! The inputs TEI's embedding routes share: `inputs` (texts or token ids, one or a batch),
//! `truncate`, `truncation_direction`, `prompt_name`, read into our prompts and parameters.

use super::error::TeiError;
use crate::engine::params::{PoolingParams, ResolvedParams};
use crate::input::tokenizer::TruncationSide;
use crate::input::Prompt;
use crate::loader::model_spec::ModelSpec;
use crate::pooling::Task;
use serde::Deserialize;

/// TEI's `truncation_direction`: `Left`/`left`/`Right`/`right`.
#[derive(Debug, Clone, Copy, Default, Deserialize, utoipa::ToSchema)]
pub enum TruncationDirection {
    #[serde(alias = "left")]
    Left,
    #[default]
    #[serde(alias = "right")]
    Right,
}

impl From<TruncationDirection> for TruncationSide {
    fn from(d: TruncationDirection) -> Self {
        match d {
            TruncationDirection::Left => TruncationSide::Left,
            TruncationDirection::Right => TruncationSide::Right,
        }
    }
}

/// One TEI input: a text or token ids.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum InputType {
    Text(String),
    Ids(Vec<u32>),
}

/// TEI's `inputs`: one input, or a list of them (`[]` is one empty id list, as in TEI).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Input {
    Single(InputType),
    #[schema(value_type = NonEmptyBatch)]
    Batch(Vec<InputType>),
}

/// The schema of `Input::Batch`: at least one input. `[]` is read as one empty id list, so the
/// schema says so too; otherwise `[]` would match both branches of `Input`'s `oneOf` and a schema
/// checker would call every route's answer to it (TEI's 424 on a model of another kind included)
/// the acceptance of an invalid body.
struct NonEmptyBatch;

impl utoipa::PartialSchema for NonEmptyBatch {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ArrayBuilder::new().items(<InputType as utoipa::PartialSchema>::schema()).min_items(Some(1)).into()
    }
}

impl utoipa::ToSchema for NonEmptyBatch {}

impl Input {
    /// The inputs as prompts; an empty text or id list is refused as TEI refuses it (before
    /// special tokens would make it non-empty).
    pub(super) fn prompts(self) -> Result<Vec<Prompt>, TeiError> {
        let prompt = |i: InputType| match i {
            InputType::Text(t) if t.is_empty() => Err(TeiError::empty("Input validation error: `inputs` cannot be empty")),
            InputType::Ids(ids) if ids.is_empty() => Err(TeiError::empty("Input validation error: `inputs` cannot be empty")),
            InputType::Text(t) => Ok(Prompt::Text(t)),
            InputType::Ids(ids) => Ok(Prompt::Tokens(ids)),
        };
        match self {
            Input::Single(one) => Ok(vec![prompt(one)?]),
            Input::Batch(many) => many.into_iter().map(prompt).collect(),
        }
    }
}

/// The fields every TEI embedding route shares.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct InputFields {
    pub inputs: Input,
    /// Cut over-long inputs (default true, TEI's `--auto-truncate`).
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: TruncationDirection,
    /// A sentence-transformers prompt of the model.
    #[serde(default)]
    pub prompt_name: Option<String>,
    /// The served model (not in TEI's API, which serves one).
    #[serde(default)]
    pub model: Option<String>,
}

impl InputFields {
    /// The pooling parameters for `task`; `activation` (normalize) as the route decides.
    pub(super) fn params(&self, task: Task, spec: &ModelSpec, activation: bool) -> Result<ResolvedParams, TeiError> {
        let sent = PoolingParams {
            truncate_prompt_tokens: self.truncate.unwrap_or(true).then_some(-1),
            truncation_side: Some(self.truncation_direction.into()),
            ..Default::default()
        };
        let mut params = sent.verify(task, spec).map_err(|e| TeiError::validation(e.message))?;
        params.activation = activation;
        if self.prompt_name.is_some() {
            params.prompt = spec
                .prompts
                .resolve(self.prompt_name.as_deref())
                .map_err(|_| unknown_prompt(self.prompt_name.as_deref().unwrap_or(""), spec))?
                .map(Into::into);
        }
        Ok(params)
    }
}

/// TEI's words for a prompt name the model lacks.
pub(super) fn unknown_prompt(name: &str, spec: &ModelSpec) -> TeiError {
    if spec.prompts.named.is_empty() {
        return TeiError::validation(format!("Input validation error: `default-prompt-name` is set to `{name}` but no prompts were found in the Sentence Transformers configuration"));
    }
    let keys: Vec<String> = spec.prompts.named.keys().map(|k| format!("{k:?}")).collect();
    TeiError::validation(format!(
        "Input validation error: `default-prompt-name` is set to `{name}` but it was not found in the Sentence Transformers prompts. Available prompts: [{}]",
        keys.join(", ")
    ))
}

/// TEI's `true` defaults (`normalize`, `skip_special_tokens`, `add_special_tokens`).
pub(super) fn yes() -> bool {
    true
}
