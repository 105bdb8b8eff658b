//! A classifier's decisions from config.json: how many labels and their names, the activation
//! of `classify` and of `score` (vLLM's rules), `classifier_from_token` conversions and a
//! reranker prompt set in config.json.

use crate::loader::LoadError;
use crate::models::head_weights::RerankTemplate;
use crate::pooling::classifier::ClassifierActivation;
use serde_json::Value;

/// vLLM's activation for classification: `problem_type` first, then the number of labels.
pub(super) fn classify_activation(config: &Value, num_labels: usize) -> ClassifierActivation {
    let by_count = if num_labels == 1 { ClassifierActivation::Sigmoid } else { ClassifierActivation::Softmax };
    match config.get("problem_type").and_then(Value::as_str) {
        Some("regression") => ClassifierActivation::Identity,
        Some("multi_label_classification") => ClassifierActivation::Sigmoid,
        _ => by_count,
    }
}

/// Cross-encoders: sentence-transformers' `activation_fn` in config.json wins (e.g. an Identity
/// for models trained to output raw scores); otherwise the classification rule.
pub(super) fn score_activation(config: &Value, num_labels: usize) -> ClassifierActivation {
    let named =
        config.pointer("/sentence_transformers/activation_fn").and_then(Value::as_str).and_then(|name| match name.rsplit('.').next()? {
            "Identity" => Some(ClassifierActivation::Identity),
            "Sigmoid" => Some(ClassifierActivation::Sigmoid),
            "Softmax" => Some(ClassifierActivation::Softmax),
            "Tanh" => Some(ClassifierActivation::Tanh),
            _ => None,
        });
    named.unwrap_or_else(|| classify_activation(config, num_labels))
}

/// A reranker prompt set in config.json or `--hf-overrides`: `rerank_template` (with
/// `{query}`, `{document}` and `{instruction}`) and optionally `rerank_instruction`, for
/// one-label classifiers whose published usage wraps pairs in a prompt we do not detect.
pub(super) fn rerank_template_override(config: &Value, num_labels: usize) -> Result<Option<RerankTemplate>, LoadError> {
    let Some(format) = config.get("rerank_template") else { return Ok(None) };
    let format = format.as_str().ok_or_else(|| LoadError::Invalid("rerank_template must be a string".into()))?;
    if num_labels != 1 {
        return Err(LoadError::Invalid(format!("rerank_template needs a one-label classifier; this one has {num_labels} labels")));
    }
    if !format.contains("{query}") || !format.contains("{document}") {
        return Err(LoadError::Invalid("rerank_template must contain {query} and {document}".into()));
    }
    let instruction = config.get("rerank_instruction").and_then(Value::as_str).unwrap_or_default();
    Ok(Some(RerankTemplate { format: format.into(), instruction: instruction.into() }))
}

/// `classifier_from_token` of a converted causal LM (`--hf-overrides`), e.g. `["no", "yes"]`.
pub fn classifier_tokens(config: &Value) -> Option<Vec<String>> {
    let tokens = config.get("classifier_from_token")?.as_array()?;
    tokens.iter().map(|t| t.as_str().map(String::from)).collect()
}

/// Whether the config turns two tokens' logits into one score (Qwen3-Reranker's yes − no):
/// `is_original_qwen3_reranker`, or vLLM's `"method": "from_2_way_softmax"`.
pub fn is_original_qwen3_reranker(config: &Value) -> bool {
    config.get("is_original_qwen3_reranker").and_then(Value::as_bool).unwrap_or(false)
        || config.get("method").and_then(Value::as_str) == Some("from_2_way_softmax")
}

/// Number of classifier outputs: one per `classifier_from_token` token (one in all for
/// Qwen3-Reranker's yes − no), else `id2label`'s size, else `num_labels`, else transformers'
/// default of 2.
pub fn num_labels_of(config: &Value) -> usize {
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
pub fn labels_of(config: &Value, num_labels: usize) -> Vec<String> {
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
    fn activation_rules() {
        use ClassifierActivation::*;
        assert_eq!(classify_activation(&json!({}), 1), Sigmoid);
        assert_eq!(classify_activation(&json!({}), 3), Softmax);
        assert_eq!(classify_activation(&json!({"problem_type": "regression"}), 1), Identity);
        assert_eq!(classify_activation(&json!({"problem_type": "multi_label_classification"}), 3), Sigmoid);
        assert_eq!(classify_activation(&json!({"problem_type": "single_label_classification"}), 1), Sigmoid);
        let st = json!({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}});
        assert_eq!(score_activation(&st, 1), Identity);
        assert_eq!(classify_activation(&st, 1), Sigmoid);
        assert_eq!(score_activation(&json!({}), 1), Sigmoid);
    }

    #[test]
    fn label_count() {
        assert_eq!(num_labels_of(&json!({"id2label": {"0": "a", "1": "b", "2": "c"}})), 3);
        assert_eq!(num_labels_of(&json!({"num_labels": 1})), 1);
        assert_eq!(num_labels_of(&json!({})), 2);
        let reranker = json!({"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true});
        assert_eq!(num_labels_of(&reranker), 1);
        assert_eq!(num_labels_of(&json!({"classifier_from_token": ["no", "yes"]})), 2);
        assert_eq!(labels_of(&json!({"id2label": {"0": "neg"}}), 2), vec!["neg".to_string(), "LABEL_1".to_string()]);
    }
}
