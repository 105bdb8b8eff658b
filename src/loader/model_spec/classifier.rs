//! How a model's classifier answers, decided once its tasks and pooling are known: its labels
//! (none for models without one), the activation of `classify` and of `score` (vLLM's rules),
//! STEP pooling's filter and the reranker prompt that turns a pair into one input.

use super::labels::LabelFacts;
use super::tasks::{PROCESS_REWARD_MODEL, QWEN_PRM_STEP_TAG, REWARD_MODEL};
use super::SpecInputs;
use crate::loader::LoadError;
use crate::models::head_weights::RerankTemplate;
use crate::pooling::classifier::{ClassifierActivation, StepFilter};
use crate::pooling::{PoolingType, Task};
use serde_json::Value;

/// What the spec says of a model's classifier (no labels for models without one).
pub(super) struct ClassifierSpec {
    pub num_labels: usize,
    pub labels: Vec<String>,
    pub from_token: Option<Vec<String>>,
    pub classify_activation: ClassifierActivation,
    pub score_activation: ClassifierActivation,
    pub step: Option<StepFilter>,
    pub rerank_template: Option<RerankTemplate>,
}

impl ClassifierSpec {
    pub(super) fn decide(input: &SpecInputs, facts: LabelFacts, tasks: &[Task], pooling: PoolingType) -> Result<Self, LoadError> {
        let (config, options, name) = (input.config, input.options, input.architecture_name.as_str());
        let pooler = &options.pooler;
        let num_labels = facts.num_labels;
        let supports = |task| tasks.contains(&task);
        let classifies = supports(Task::Classify);
        // BGE-M3's token_classify is its lexical weight per token, not a classifier's labels.
        let token_classifier = supports(Task::TokenClassify) && !input.m3;
        let labels = if classifies || token_classifier { facts.names } else { Vec::new() };
        let step = (pooling == PoolingType::Step).then(|| StepFilter {
            // vLLM's default for Qwen2.5-Math-PRM: its `<extra_0>` step separator.
            step_tag_id: pooler.step_tag_id.or((name == PROCESS_REWARD_MODEL).then_some(QWEN_PRM_STEP_TAG)),
            columns: pooler.returned_token_ids.as_ref().map(|ids| ids.iter().map(|&i| i as usize).collect()),
        });
        if let Some(bad) = step.as_ref().and_then(|s| s.columns.as_ref()).and_then(|c| c.iter().find(|&&c| c >= num_labels)) {
            return Err(LoadError::Invalid(format!("returned_token_ids: {bad} is not one of the model's {num_labels} labels")));
        }
        let rerank_template = match classifies {
            true => rerank_template_override(config, num_labels)?.or_else(|| input.architecture.rerank_template(config, num_labels)).map(
                |mut template| {
                    if let Some(instruction) = &options.reranker_instruction {
                        template.instruction = instruction.clone();
                    }
                    template
                },
            ),
            false => None,
        };
        // Rewards are raw head outputs, as vLLM serves them.
        let classify_activation = match name == REWARD_MODEL && supports(Task::TokenClassify) {
            true => ClassifierActivation::Identity,
            false => classify_activation(config, num_labels),
        };
        Ok(ClassifierSpec {
            num_labels: if classifies || token_classifier { num_labels } else { 0 },
            labels,
            from_token: facts.from_token.filter(|_| classifies),
            classify_activation,
            // Token classifiers have no scores; their `score` activation is never read.
            score_activation: if classifies { score_activation(config, num_labels) } else { classify_activation },
            step,
            rerank_template,
        })
    }
}

/// vLLM's activation for classification: `problem_type` first, then the number of labels.
fn classify_activation(config: &Value, num_labels: usize) -> ClassifierActivation {
    let by_count = if num_labels == 1 { ClassifierActivation::Sigmoid } else { ClassifierActivation::Softmax };
    match config.get("problem_type").and_then(Value::as_str) {
        Some("regression") => ClassifierActivation::Identity,
        Some("multi_label_classification") => ClassifierActivation::Sigmoid,
        _ => by_count,
    }
}

/// Cross-encoders: sentence-transformers' `activation_fn` in config.json wins (e.g. an Identity
/// for models trained to output raw scores); otherwise the classification rule.
fn score_activation(config: &Value, num_labels: usize) -> ClassifierActivation {
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
fn rerank_template_override(config: &Value, num_labels: usize) -> Result<Option<RerankTemplate>, LoadError> {
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
}
