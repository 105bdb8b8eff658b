//! `--pooler-config` (vLLM's `PoolerConfig`): a model's pooling task and defaults, and the
//! rules its fields must satisfy together.
//!
//! The fields are vLLM 0.33's (`task`, `pooling_type` or its split forms `seq_pooling_type` /
//! `tok_pooling_type`, `use_activation`, `dimensions`, `logit_mean` / `logit_sigma`,
//! `step_tag_id`, `returned_token_ids`, `enable_chunked_processing`, `max_embed_len`,
//! `enable_flash_late_interaction`), plus two that older vLLM releases had and we keep for
//! their users: `normalize` (embeddings) and `logit_bias` (= `logit_mean`).

use super::{PoolingError, PoolingType};
use serde::Deserialize;

/// Pooling defaults of a served model; every field optional (unset: the model's own choice).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(try_from = "RawPoolerConfig")]
pub struct PoolerConfig {
    /// vLLM's `task`: the one pooling task the model serves (its "pooling task"), checked
    /// against the model's tasks when it loads. `None`: the model's first task.
    pub task: Option<String>,
    pub pooling_type: Option<PoolingType>,
    pub normalize: Option<bool>,
    pub dimensions: Option<i64>,
    pub use_activation: Option<bool>,
    /// Subtracted from classifier logits before the activation (`logit_mean`, `logit_bias`).
    pub logit_bias: Option<f64>,
    /// Divides the logits after `logit_bias` (vLLM's `logit_sigma`, Platt scaling).
    pub logit_sigma: Option<f64>,
    pub step_tag_id: Option<u32>,
    pub returned_token_ids: Option<Vec<u32>>,
    pub enable_chunked_processing: Option<bool>,
    pub max_embed_len: Option<usize>,
}

/// The tasks vLLM's `PoolerConfig.task` takes, in its order (its message lists them so), and
/// ours: `embed_sparse` (SPLADE).
pub const POOLER_TASKS: [&str; 7] =
    ["embed", "classify", "token_embed", "token_classify", "plugin", "embed&token_classify", "embed_sparse"];

/// The configuration as written, before aliases are folded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPoolerConfig {
    task: Option<String>,
    /// The name vLLM's own token_classify tests give `task` (`--pooler-config
    /// '{"pooling_task": "token_classify"}'`): the same setting.
    pooling_task: Option<String>,
    pooling_type: Option<PoolingType>,
    seq_pooling_type: Option<PoolingType>,
    tok_pooling_type: Option<PoolingType>,
    normalize: Option<bool>,
    dimensions: Option<i64>,
    use_activation: Option<bool>,
    logit_bias: Option<f64>,
    logit_mean: Option<f64>,
    logit_sigma: Option<f64>,
    step_tag_id: Option<u32>,
    returned_token_ids: Option<Vec<u32>>,
    enable_chunked_processing: Option<bool>,
    max_embed_len: Option<usize>,
    /// vLLM's switch for a GPU MaxSim kernel: accepted, nothing to switch here.
    #[allow(dead_code)]
    enable_flash_late_interaction: Option<bool>,
}

impl TryFrom<RawPoolerConfig> for PoolerConfig {
    type Error = PoolingError;

    fn try_from(mut raw: RawPoolerConfig) -> Result<Self, PoolingError> {
        raw.task = match (raw.task.take(), raw.pooling_task.take()) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(format!("`task` ({a}) and `pooling_task` ({b}) name the same setting; give one")))
            }
            (task, pooling_task) => task.or(pooling_task),
        };
        if let Some(task) = &raw.task {
            check_task(task)?;
        }
        let pooling_type = match (raw.pooling_type, raw.seq_pooling_type, raw.tok_pooling_type) {
            (Some(_), Some(_), _) => return Err(invalid("Cannot set both `pooling_type` and `seq_pooling_type`")),
            (Some(_), _, Some(_)) => return Err(invalid("Cannot set both `pooling_type` and `tok_pooling_type`")),
            // A model here pools one way: a sequence and a token pooling together would need two.
            (None, Some(_), Some(_)) => {
                return Err(invalid("set one of `seq_pooling_type` and `tok_pooling_type` (poolserve pools a model one way)"))
            }
            (Some(p), None, None) => Some(p),
            (None, Some(p), None) | (None, None, Some(p)) => Some(p),
            (None, None, None) => None,
        };
        let seq_only = |p: PoolingType| matches!(p, PoolingType::Cls | PoolingType::Last | PoolingType::Mean);
        match (raw.seq_pooling_type, raw.tok_pooling_type) {
            (Some(p), _) if !seq_only(p) => {
                return Err(invalid(format!("seq_pooling_type: {p:?} is not a sequence pooling (CLS, LAST, MEAN)")))
            }
            (_, Some(p)) if !matches!(p, PoolingType::All | PoolingType::Step) => {
                return Err(invalid(format!("tok_pooling_type: {p:?} is not a token pooling (ALL, STEP)")))
            }
            _ => {}
        }
        if raw.logit_bias.is_some() && raw.logit_mean.is_some() {
            return Err(invalid("Cannot set both `logit_bias` and `logit_mean` (the same setting)"));
        }
        if raw.logit_sigma == Some(0.0) {
            return Err(invalid("logit_sigma cannot be 0 (division by zero)"));
        }
        Ok(PoolerConfig {
            task: raw.task,
            pooling_type,
            normalize: raw.normalize,
            dimensions: raw.dimensions,
            use_activation: raw.use_activation,
            logit_bias: raw.logit_bias.or(raw.logit_mean),
            logit_sigma: raw.logit_sigma,
            step_tag_id: raw.step_tag_id,
            returned_token_ids: raw.returned_token_ids,
            enable_chunked_processing: raw.enable_chunked_processing,
            max_embed_len: raw.max_embed_len,
        })
    }
}

/// vLLM's checks of a `task` value: the tasks it removed say what replaced them; anything
/// else it does not know is pydantic's literal error.
fn check_task(task: &str) -> Result<(), PoolingError> {
    match task {
        "score" => Err(invalid("`score` task was removed; use `classify` instead.")),
        "encode" => Err(invalid("`encode` task was removed; use `token_embed` or `token_classify` instead.")),
        _ if POOLER_TASKS.contains(&task) => Ok(()),
        _ => {
            let quoted: Vec<String> = POOLER_TASKS.iter().map(|t| format!("'{t}'")).collect();
            let (last, rest) = quoted.split_last().expect("tasks are listed");
            Err(invalid(format!("task: Input should be {} or {last}, not '{task}'", rest.join(", "))))
        }
    }
}

impl PoolerConfig {
    /// Fields that only make sense with another one set.
    pub fn check(&self) -> Result<(), PoolingError> {
        if self.max_embed_len.is_some() && self.enable_chunked_processing != Some(true) {
            return Err(invalid("max_embed_len needs enable_chunked_processing: true"));
        }
        if self.pooling_type != Some(PoolingType::Step) && (self.step_tag_id.is_some() || self.returned_token_ids.is_some()) {
            return Err(invalid("step_tag_id and returned_token_ids need pooling_type STEP"));
        }
        Ok(())
    }
}

fn invalid(message: impl Into<String>) -> PoolingError {
    PoolingError::Config(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config, or serde's message (which carries the conversion's error).
    fn parse(text: &str) -> Result<PoolerConfig, serde_json::Error> {
        serde_json::from_str::<PoolerConfig>(text)
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = parse(r#"{"pooling_typ": "MEAN"}"#).unwrap_err().to_string();
        assert!(err.contains("unknown field"), "{err}");
        let ok = parse(r#"{"pooling_type": "MEAN", "normalize": false}"#).unwrap();
        assert_eq!(ok.pooling_type, Some(PoolingType::Mean));
    }

    #[test]
    fn takes_vllm_033_fields() {
        let config = parse(r#"{"task": "token_embed", "seq_pooling_type": "CLS", "logit_mean": 0.5, "logit_sigma": 2.0, "enable_flash_late_interaction": false}"#).unwrap();
        assert_eq!(config.task.as_deref(), Some("token_embed"));
        assert_eq!(config.pooling_type, Some(PoolingType::Cls));
        assert_eq!((config.logit_bias, config.logit_sigma), (Some(0.5), Some(2.0)));
        assert_eq!(parse(r#"{"tok_pooling_type": "STEP"}"#).unwrap().pooling_type, Some(PoolingType::Step));
        // The name vLLM's token_classify tests use.
        assert_eq!(parse(r#"{"pooling_task": "token_classify"}"#).unwrap().task.as_deref(), Some("token_classify"));
        assert_eq!(parse(r#"{"task": "classify", "pooling_task": "classify"}"#).unwrap().task.as_deref(), Some("classify"));
        assert!(parse(r#"{"task": "classify", "pooling_task": "embed"}"#).unwrap_err().to_string().contains("name the same setting"));
        assert!(parse(r#"{"pooling_task": "score"}"#).unwrap_err().to_string().contains("`score` task was removed"));
    }

    #[test]
    fn refuses_what_vllm_refuses() {
        assert!(parse(r#"{"task": "score"}"#).unwrap_err().to_string().contains("`score` task was removed; use `classify` instead."));
        assert!(parse(r#"{"task": "encode"}"#).unwrap_err().to_string().contains("`encode` task was removed"));
        let err = parse(r#"{"task": "embedding"}"#).unwrap_err().to_string();
        assert!(err.contains("Input should be 'embed', 'classify'") && err.contains("not 'embedding'"), "{err}");
        assert!(parse(r#"{"pooling_type": "CLS", "seq_pooling_type": "MEAN"}"#)
            .unwrap_err()
            .to_string()
            .contains("Cannot set both `pooling_type` and `seq_pooling_type`"));
        assert!(parse(r#"{"logit_sigma": 0}"#).unwrap_err().to_string().contains("logit_sigma cannot be 0"));
        assert!(parse(r#"{"seq_pooling_type": "ALL"}"#).is_err());
    }

    #[test]
    fn fields_that_need_another() {
        assert!(PoolerConfig { max_embed_len: Some(10), ..Default::default() }.check().is_err());
        assert!(PoolerConfig { step_tag_id: Some(3), ..Default::default() }.check().is_err());
        assert!(PoolerConfig { step_tag_id: Some(3), pooling_type: Some(PoolingType::Step), ..Default::default() }.check().is_ok());
    }
}
