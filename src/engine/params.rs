//! Per-request pooling parameters and their validation: the only place that decides whether a
//! request's parameters are acceptable for a task, shared by every endpoint.
//!
//! Mirrors vLLM's `PoolingParams.verify`: unset fields are filled from the server defaults
//! (`--pooler-config`), fields the task does not accept are rejected with vLLM's message, and
//! the Matryoshka rules of docs/http-api.md decide `dimensions`.

use crate::input::tokenizer::{PairLimits, TruncationSide};
use crate::loader::model_spec::ModelSpec;
use crate::pooling::m3::MultiOutput;
use crate::pooling::Task;
use serde::Deserialize;

/// The pooling fields of a request body, as sent.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct PoolingParams {
    #[serde(default)]
    pub truncate_prompt_tokens: Option<i64>,
    #[serde(default, deserialize_with = "truncation_side")]
    #[schema(value_type = Option<String>)]
    pub truncation_side: Option<TruncationSide>,
    /// vLLM's `padding`: `max_length` pads every input to `max_model_len` with the pad token
    /// (after truncation; the pad tokens are attended and counted in `usage`), `do_not_pad`
    /// (the default) leaves it as it is.
    #[serde(default, deserialize_with = "padding")]
    #[schema(value_type = Option<String>)]
    pub padding: Option<Padding>,
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub normalize: Option<bool>,
    #[serde(default)]
    pub use_activation: Option<bool>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// vLLM's `priority`: lower runs earlier under `--scheduling-policy priority`; anything
    /// but 0 is refused under `fcfs`.
    #[serde(default)]
    pub priority: Option<i64>,
    /// vLLM's `cache_salt`: with `--cache-size`, the request only meets cached outputs made
    /// with the same salt (1 to 128 characters, none of `@`, `/`, `\` or NUL).
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// vLLM's `padding` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    MaxLength,
    DoNotPad,
}

fn padding<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Padding>, D::Error> {
    optional(d, "padding", &[("max_length", Padding::MaxLength), ("do_not_pad", Padding::DoNotPad)])
}

fn truncation_side<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<TruncationSide>, D::Error> {
    optional(d, "truncation_side", &[("left", TruncationSide::Left), ("right", TruncationSide::Right)])
}

/// An optional literal field: `null` is unset.
pub fn optional<'de, D: serde::Deserializer<'de>, T: Copy>(
    d: D,
    param: &'static str,
    options: &[(&str, T)],
) -> Result<Option<T>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => super::literal::deserialize(value, param, options).map(Some).map_err(serde::de::Error::custom),
    }
}

/// Parameters after validation: everything the engine needs, nothing left optional.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedParams {
    pub task: Task,
    /// Keep at most this many tokens (special tokens included); `None`: reject over-long inputs.
    pub truncate_to: Option<usize>,
    pub truncation_side: TruncationSide,
    /// Matryoshka slice of the embedding; `None` keeps the native size.
    pub dimensions: Option<usize>,
    /// embed / token_embed: L2-normalize; other tasks: apply the activation.
    pub activation: bool,
    pub add_special_tokens: bool,
    /// `padding: "max_length"`: pad each input to `max_model_len` with the pad token.
    pub pad_to_max_length: bool,
    /// token_embed with vLLM's late chunking: the token states are averaged over consecutive
    /// chunks of this many tokens before the head, one row per chunk.
    pub late_chunk: Option<usize>,
    /// Per-side token caps of cross-encoder pairs (set by the score and rerank endpoints).
    pub pair_limits: PairLimits,
    /// Text prepended to every text input before tokenization (a sentence-transformers prompt):
    /// the model's default unless the request names one ([`ResolvedParams::with_prompt_name`]).
    pub prompt: Option<std::sync::Arc<str>>,
    /// BGE-M3: the outputs `/pooling` asked for together (`return_dense`, `return_sparse`,
    /// `return_colbert_vecs`).
    pub multi: Option<MultiOutput>,
    /// BGE-M3: `/score` and `/rerank` weigh dense, sparse and ColBERT scores by these
    /// (FlagEmbedding's `weights_for_different_modes`).
    pub hybrid: Option<[f32; 3]>,
    /// A generative score (`/generative_scoring`): the LM head's probability of these labels
    /// after the input's last token, instead of the task's output.
    pub labels: Option<std::sync::Arc<crate::pooling::next_token::LabelQuery>>,
    /// The request's `priority` (0 unless it names one).
    pub priority: i64,
    /// The request's `cache_salt` (the output cache keeps salted outputs apart).
    pub cache_salt: Option<std::sync::Arc<str>>,
    /// Whether the output cache may answer and keep these outputs (not for the warm-up,
    /// which must run the model and is nobody's output).
    pub use_cache: bool,
}

impl ResolvedParams {
    /// vLLM's rule (its V0 engine's check and message; its `priority` field says so): a
    /// priority other than 0 needs `--scheduling-policy priority`.
    pub fn check_priority(&self, policy: super::SchedulingPolicy) -> Result<(), ParamsError> {
        if self.priority != 0 && policy != super::SchedulingPolicy::Priority {
            return Err(ParamsError::new(format!("Got priority {} but Priority scheduling is not enabled.", self.priority), "priority"));
        }
        Ok(())
    }

    /// `task` with nothing asked of it: no truncation, slice or prompt, activation on, special
    /// tokens added (what callers that build their inputs themselves start from).
    pub fn plain(task: Task) -> Self {
        ResolvedParams {
            task,
            truncate_to: None,
            truncation_side: TruncationSide::Right,
            dimensions: None,
            activation: true,
            add_special_tokens: true,
            pad_to_max_length: false,
            late_chunk: None,
            pair_limits: PairLimits::default(),
            prompt: None,
            multi: None,
            hybrid: None,
            labels: None,
            priority: 0,
            cache_salt: None,
            use_cache: true,
        }
    }

    /// Uses the prompt the request names (`prompt_name`), or keeps the model's default.
    pub fn with_prompt_name(mut self, name: Option<&str>, spec: &ModelSpec) -> Result<Self, ParamsError> {
        if name.is_some() {
            self.prompt = spec.prompts.resolve(name)?.map(Into::into);
        }
        Ok(self)
    }
}

/// A rejected parameter; the message is part of the API contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParamsError {
    pub message: String,
    pub param: Option<&'static str>,
}

impl From<crate::loader::model_spec::UnknownPrompt> for ParamsError {
    fn from(e: crate::loader::model_spec::UnknownPrompt) -> Self {
        ParamsError::new(e.0, "prompt_name")
    }
}

impl ParamsError {
    pub fn new(message: impl Into<String>, param: &'static str) -> Self {
        Self { message: message.into(), param: Some(param) }
    }
}

/// The task-specific fields, in the order vLLM lists them.
const TASK_FIELDS: [&str; 3] = ["dimensions", "normalize", "use_activation"];

fn valid_fields(task: Task) -> &'static [&'static str] {
    match task {
        Task::Embed | Task::TokenEmbed => &TASK_FIELDS,
        Task::Classify | Task::Score | Task::TokenClassify | Task::EmbedSparse => &TASK_FIELDS[2..],
    }
}

/// The fields vLLM 0.33 names as valid for `task` in its refusal (`PoolingParams.valid_parameters`;
/// `normalize`, the older alias we also take, is not among them).
fn vllm_fields(task: Task) -> &'static [&'static str] {
    match task {
        Task::Embed => &["dimensions", "use_activation"],
        Task::TokenEmbed => &["dimensions", "use_activation", "late_chunking_params"],
        Task::Classify | Task::Score | Task::TokenClassify | Task::EmbedSparse => &["use_activation"],
    }
}

/// Python's `repr` of a string (single quotes, unless it holds one and no double quote), as
/// vLLM's `{name!r}` prints it.
fn py_str(text: &str) -> String {
    if text.contains('\'') && !text.contains('"') {
        return format!("\"{}\"", text.replace('\\', "\\\\"));
    }
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Python's list repr, as vLLM prints it in its messages.
fn py_list<T: std::fmt::Display>(items: &[T], quote: bool) -> String {
    let parts: Vec<String> = items.iter().map(|i| if quote { format!("'{i}'") } else { i.to_string() }).collect();
    format!("[{}]", parts.join(", "))
}

impl PoolingParams {
    /// Validates the request for `task` against the served model.
    pub fn verify(&self, task: Task, spec: &ModelSpec) -> Result<ResolvedParams, ParamsError> {
        let defaults = &spec.pooler_defaults;
        // Server defaults only fill the fields this task accepts.
        let accepts = |field: &str| valid_fields(task).contains(&field);
        let dimensions = self.dimensions.or(if accepts("dimensions") { defaults.dimensions } else { None });
        let normalize = self.normalize.or(if accepts("normalize") { defaults.normalize } else { None });
        let use_activation = self.use_activation.or(defaults.use_activation);

        let given = [self.dimensions.is_some(), self.normalize.is_some(), self.use_activation.is_some()];
        let invalid: Vec<&str> =
            TASK_FIELDS.iter().zip(given).filter(|(field, set)| *set && !accepts(field)).map(|(field, _)| *field).collect();
        if !invalid.is_empty() {
            return Err(ParamsError::new(
                format!(
                    "Task {} only supports {} parameters, does not support {} parameters",
                    py_str(&task.to_string()),
                    py_list(vllm_fields(task), true),
                    py_list(&invalid, true)
                ),
                "pooling_params",
            ));
        }

        let dimensions = match dimensions {
            Some(k) if task.is_token_level() || task == Task::Embed => check_dimensions(k, spec)?,
            _ => None,
        };
        // For embeddings `normalize` is the older name of `use_activation`. What the request says
        // wins over the server's defaults (either name), then `normalize` over `use_activation`.
        let requested = self.normalize.filter(|_| accepts("normalize")).or(self.use_activation);
        let activation = requested.or(normalize).or(use_activation).unwrap_or(true);

        let max_len = spec.max_model_len;
        let truncate_to = match self.truncate_prompt_tokens {
            None => (spec.auto_truncate && spec.chunked_up_to.is_none()).then_some(max_len),
            Some(-1) => Some(max_len),
            // pydantic's `Field(ge=-1)`, worded as vLLM's validation handler prints it.
            Some(k) if k < -1 => {
                return Err(ParamsError::new(
                    format!("1 validation error:\n  {{'type': 'greater_than_equal', 'loc': 'body.truncate_prompt_tokens', 'msg': 'Input should be greater than or equal to -1', 'input': {k}, 'ctx': {{'ge': -1}}}}"),
                    "truncate_prompt_tokens",
                ))
            }
            Some(0) => return Err(ParamsError::new("truncate_prompt_tokens must be -1 or a positive integer, got 0", "truncate_prompt_tokens")),
            Some(k) if k as u64 > max_len as u64 => {
                return Err(ParamsError::new(
                    "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
                    "truncate_prompt_tokens",
                ))
            }
            Some(k) => Some(k as usize),
        };

        Ok(ResolvedParams {
            task,
            truncate_to,
            truncation_side: self.truncation_side.unwrap_or(spec.truncation_side),
            dimensions,
            activation,
            add_special_tokens: self.add_special_tokens.unwrap_or(true),
            pad_to_max_length: self.padding == Some(Padding::MaxLength),
            late_chunk: None,
            pair_limits: PairLimits::default(),
            prompt: spec.prompts.default.as_deref().map(Into::into),
            multi: None,
            hybrid: None,
            labels: None,
            priority: self.priority.unwrap_or(0),
            cache_salt: self.cache_salt.as_deref().map(check_cache_salt).transpose()?,
            use_cache: true,
        })
    }
}

/// vLLM's `validate_cache_salt`: its rules and messages.
fn check_cache_salt(salt: &str) -> Result<std::sync::Arc<str>, ParamsError> {
    if salt.is_empty() {
        return Err(ParamsError::new("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt"));
    }
    if salt.chars().count() > 128 || salt.contains(['@', '/', '\\', '\0']) {
        return Err(ParamsError::new(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        ));
    }
    Ok(salt.into())
}

/// The Matryoshka decision of docs/http-api.md, in vLLM 0.33's order and words
/// (`PoolingParams._set_default_parameters`). Returns the slice to apply, `None` for a no-op.
fn check_dimensions(k: i64, spec: &ModelSpec) -> Result<Option<usize>, ParamsError> {
    let native = spec.embedding_size;
    if k == native as i64 {
        return Ok(None); // OpenAI clients send the native size; always a no-op.
    }
    let name = py_str(&spec.served_name);
    if !spec.matryoshka.enabled {
        return Err(ParamsError::new(
            format!("Model {name} does not support Matryoshka embeddings; dimensions must be unset (received dimensions={k})."),
            "dimensions",
        ));
    }
    if k < 1 || k as u64 > native as u64 {
        return Err(ParamsError::new(format!("Model {name} only supports dimensions in range [1, {native}], got {k}."), "dimensions"));
    }
    if let Some(allowed) = &spec.matryoshka.dimensions {
        if !allowed.iter().any(|&d| d as i64 == k) {
            return Err(ParamsError::new(
                format!("Model {name} only supports Matryoshka dimensions {}, got {k}.", py_list(allowed, false)),
                "dimensions",
            ));
        }
    }
    Ok(Some(k as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::model_spec::{Matryoshka, ModelSpec};

    fn spec(matryoshka: Matryoshka) -> ModelSpec {
        let mut spec = ModelSpec::for_tests(384, 256);
        spec.matryoshka = matryoshka;
        spec
    }

    fn params(f: impl FnOnce(&mut PoolingParams)) -> PoolingParams {
        let mut p = PoolingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn defaults_normalize_and_keep_native_size() {
        let r = PoolingParams::default().verify(Task::Embed, &spec(Matryoshka::default())).unwrap();
        assert!(r.activation);
        assert_eq!(r.dimensions, None);
        assert_eq!(r.truncate_to, None);
        assert!(r.add_special_tokens);
    }

    #[test]
    fn native_dimensions_are_a_no_op_even_without_matryoshka() {
        let r = params(|p| p.dimensions = Some(384)).verify(Task::Embed, &spec(Matryoshka::default())).unwrap();
        assert_eq!(r.dimensions, None);
    }

    #[test]
    fn matryoshka_rules() {
        let plain = spec(Matryoshka::default());
        let err = params(|p| p.dimensions = Some(16)).verify(Task::Embed, &plain).unwrap_err();
        assert_eq!(
            err.message,
            "Model 'test-model' does not support Matryoshka embeddings; dimensions must be unset (received dimensions=16)."
        );

        let listed = spec(Matryoshka { enabled: true, dimensions: Some(vec![64, 128]) });
        let err = params(|p| p.dimensions = Some(16)).verify(Task::Embed, &listed).unwrap_err();
        assert_eq!(err.message, "Model 'test-model' only supports Matryoshka dimensions [64, 128], got 16.");
        assert_eq!(params(|p| p.dimensions = Some(64)).verify(Task::Embed, &listed).unwrap().dimensions, Some(64));

        let open = spec(Matryoshka { enabled: true, dimensions: None });
        let err = params(|p| p.dimensions = Some(0)).verify(Task::Embed, &open).unwrap_err();
        assert_eq!(err.message, "Model 'test-model' only supports dimensions in range [1, 384], got 0.");
        let err = params(|p| p.dimensions = Some(385)).verify(Task::Embed, &open).unwrap_err();
        assert_eq!(err.message, "Model 'test-model' only supports dimensions in range [1, 384], got 385.");
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(params(|p| p.dimensions = Some(16)).verify(Task::Embed, &open).unwrap().dimensions, Some(16));
    }

    #[test]
    fn rejects_fields_the_task_does_not_take() {
        let err = params(|p| {
            p.dimensions = Some(8);
            p.normalize = Some(true)
        })
        .verify(Task::Classify, &spec(Matryoshka::default()))
        .unwrap_err();
        assert_eq!(
            err.message,
            "Task 'classify' only supports ['use_activation'] parameters, does not support ['dimensions', 'normalize'] parameters"
        );
    }

    #[test]
    fn the_request_wins_over_the_server_default_whichever_name_it_uses() {
        let mut s = spec(Matryoshka::default());
        s.pooler_defaults.normalize = Some(true);
        assert!(!params(|p| p.use_activation = Some(false)).verify(Task::Embed, &s).unwrap().activation);
        s.pooler_defaults = Default::default();
        s.pooler_defaults.use_activation = Some(false);
        assert!(params(|p| p.normalize = Some(true)).verify(Task::Embed, &s).unwrap().activation);
        assert!(!params(|_| {}).verify(Task::Embed, &s).unwrap().activation);
    }

    #[test]
    fn normalize_false_disables_normalization() {
        let s = spec(Matryoshka::default());
        assert!(!params(|p| p.normalize = Some(false)).verify(Task::Embed, &s).unwrap().activation);
        assert!(!params(|p| p.use_activation = Some(false)).verify(Task::Embed, &s).unwrap().activation);
    }

    #[test]
    fn truncation_rules() {
        let s = spec(Matryoshka::default());
        assert_eq!(params(|p| p.truncate_prompt_tokens = Some(-1)).verify(Task::Embed, &s).unwrap().truncate_to, Some(256));
        assert_eq!(params(|p| p.truncate_prompt_tokens = Some(10)).verify(Task::Embed, &s).unwrap().truncate_to, Some(10));
        let err = params(|p| p.truncate_prompt_tokens = Some(300)).verify(Task::Embed, &s).unwrap_err();
        assert_eq!(err.message, "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.");
        assert!(params(|p| p.truncate_prompt_tokens = Some(-2)).verify(Task::Embed, &s).is_err());
    }

    #[test]
    fn server_defaults_fill_unset_fields() {
        let mut s = spec(Matryoshka { enabled: true, dimensions: None });
        s.pooler_defaults.normalize = Some(false);
        s.pooler_defaults.dimensions = Some(32);
        let r = PoolingParams::default().verify(Task::Embed, &s).unwrap();
        assert!(!r.activation);
        assert_eq!(r.dimensions, Some(32));
        // A default for a field the task does not take is not an error.
        assert!(PoolingParams::default().verify(Task::Classify, &s).is_ok());
    }
}
