//! What a checkpoint's config.json says of its classifier outputs, read once before anything is
//! decided from them: how many there are (the tasks depend on it: one label also scores pairs),
//! their names, and the tokens of a causal LM converted into a classifier.

use super::tasks::{PROCESS_REWARD_MODEL, REWARD_MODEL};
use serde_json::Value;

/// The classifier outputs config.json declares (or the architecture fixes).
pub(super) struct LabelFacts {
    /// Outputs of the head; transformers' default of 2 for models that name none.
    pub num_labels: usize,
    /// Label names, index = logit position: the converted LM's tokens when there is one per
    /// output, else `id2label`'s, `LABEL_i` where it names none.
    pub names: Vec<String>,
    /// `classifier_from_token` of a converted causal LM, e.g. `["no", "yes"]`.
    pub from_token: Option<Vec<String>>,
}

impl LabelFacts {
    /// vLLM fixes the reward heads' sizes (Qwen2.5-Math-RM's config.json names none); other
    /// models say in config.json ([`num_labels_of`]).
    pub(super) fn read(config: &Value, architecture_name: &str) -> LabelFacts {
        let num_labels = match architecture_name {
            REWARD_MODEL => 1,
            PROCESS_REWARD_MODEL => 2,
            _ => num_labels_of(config),
        };
        let from_token = classifier_tokens(config);
        let names = match &from_token {
            Some(tokens) if num_labels == tokens.len() => tokens.clone(),
            _ => labels_of(config, num_labels),
        };
        LabelFacts { num_labels, names, from_token }
    }
}

/// `classifier_from_token` of a converted causal LM (`--hf-overrides`), e.g. `["no", "yes"]`.
fn classifier_tokens(config: &Value) -> Option<Vec<String>> {
    let tokens = config.get("classifier_from_token")?.as_array()?;
    tokens.iter().map(|t| t.as_str().map(String::from)).collect()
}

/// Whether the config turns two tokens' logits into one score (Qwen3-Reranker's yes − no):
/// `is_original_qwen3_reranker`, or vLLM's `"method": "from_2_way_softmax"`.
fn is_original_qwen3_reranker(config: &Value) -> bool {
    config.get("is_original_qwen3_reranker").and_then(Value::as_bool).unwrap_or(false)
        || config.get("method").and_then(Value::as_str) == Some("from_2_way_softmax")
}

/// Number of classifier outputs: one per `classifier_from_token` token (one in all for
/// Qwen3-Reranker's yes − no), else `id2label`'s size, else `num_labels`, else transformers'
/// default of 2.
fn num_labels_of(config: &Value) -> usize {
    if let Some(tokens) = classifier_tokens(config) {
        return if is_original_qwen3_reranker(config) && tokens.len() == 2 { 1 } else { tokens.len() };
    }
    config
        .get("id2label")
        .and_then(Value::as_object)
        .map(|m| m.len())
        .or_else(|| config.get("num_labels").and_then(Value::as_u64).map(|n| n as usize))
        .unwrap_or(2)
}

/// Label names from `id2label`, `LABEL_i` where it has none (as transformers names them).
fn labels_of(config: &Value, num_labels: usize) -> Vec<String> {
    (0..num_labels)
        .map(|i| {
            config
                .get("id2label")
                .and_then(|m| m.get(i.to_string()))
                .and_then(Value::as_str)
                .map_or_else(|| format!("LABEL_{i}"), String::from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_count() {
        assert_eq!(num_labels_of(&json!({"id2label": {"0": "a", "1": "b", "2": "c"}})), 3);
        assert_eq!(num_labels_of(&json!({"num_labels": 1})), 1);
        assert_eq!(num_labels_of(&json!({})), 2);
        let reranker = json!({"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true});
        assert_eq!(num_labels_of(&reranker), 1);
        assert_eq!(num_labels_of(&json!({"classifier_from_token": ["no", "yes"]})), 2);
        assert_eq!(labels_of(&json!({"id2label": {"0": "neg"}}), 2), vec!["neg".to_string(), "LABEL_1".to_string()]);
        assert_eq!(LabelFacts::read(&json!({"num_labels": 5}), REWARD_MODEL).num_labels, 1);
        assert_eq!(LabelFacts::read(&json!({}), PROCESS_REWARD_MODEL).num_labels, 2);
        let converted = LabelFacts::read(&json!({"classifier_from_token": ["no", "yes"]}), "Qwen3ForSequenceClassification");
        assert_eq!(converted.names, vec!["no".to_string(), "yes".to_string()]);
    }
}
