//! Which tasks a checkpoint serves: from its architecture name, `--convert`, and what its files
//! say besides (a sentence-transformers Pooling module, a multi-vector encoder, SPLADE pooling).

use crate::loader::options::Convert;
use crate::loader::LoadError;
use crate::pooling::{PoolingType, Task};

/// Qwen2.5-Math-RM's layout: per-token rewards (token_classify) and the last token's
/// (classify), no activation.
pub const REWARD_MODEL: &str = "Qwen2ForRewardModel";
/// Qwen2.5-Math-PRM's layout: per-step probabilities by STEP pooling.
pub const PROCESS_REWARD_MODEL: &str = "Qwen2ForProcessRewardModel";
/// Qwen2.5-Math-PRM's step separator `<extra_0>`: the PRM's `step_tag_id` unless
/// `--pooler-config` names another (vLLM's default).
pub const QWEN_PRM_STEP_TAG: u32 = 151_651;

/// Reward checkpoints by their architecture name (`*ForRewardModel`, `*ForProcessRewardModel`,
/// `*ForRewardModeling`, `*RewardModel`).
pub fn is_reward_layout(architecture: &str) -> bool {
    architecture.ends_with("RewardModel") || architecture.ends_with("RewardModeling")
}

/// Whether the checkpoint carries a sequence-classification head.
pub fn is_sequence_classifier(architecture: &str) -> bool {
    architecture.ends_with("ForSequenceClassification")
}

/// What decides a checkpoint's tasks besides its architecture.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskHints {
    pub num_labels: usize,
    /// The pooling `--pooler-config` or the sentence-transformers files ask for.
    pub pooling: Option<PoolingType>,
    /// A sentence-transformers MultiVectorEncoder (ColBERT-style).
    pub multi_vector: bool,
    /// modules.json runs the Transformer into a Pooling module: the folder is an embedding
    /// model whatever head its config.json's `architectures` names.
    pub sentence_pooling: bool,
    /// The architecture publishes its embedders as `*ForMaskedLM` (JinaBERT).
    pub masked_lm_embeds: bool,
}

/// The tasks a checkpoint serves, in preference order (the first is /pooling's default):
/// a sentence-transformers folder with a Pooling module is an embedder, whatever head
/// `architectures` names (published folders keep the architecture they were trained from:
/// all-mpnet-base-v2 says `MPNetForMaskedLM`; sentence-transformers loads the bare backbone and
/// so do we); otherwise classifiers serve `classify` (one-label ones also `score`), token classifiers
/// `token_classify`, masked LMs with SPLADE pooling `embed_sparse`, multi-vector encoders
/// `token_embed` and `score` (MaxSim), everything else `embed` and `token_embed`.
pub fn tasks_for(architecture: &str, convert: Convert, hints: TaskHints) -> Result<Vec<Task>, LoadError> {
    let embedder = || {
        if hints.multi_vector {
            vec![Task::TokenEmbed, Task::Score]
        } else {
            vec![Task::Embed, Task::TokenEmbed]
        }
    };
    // A sequence classifier also classifies every token (its classifier on each token state,
    // as vLLM's `DispatchPooler.for_seq_cls` does).
    let classifier_tasks = || {
        let mut tasks = vec![Task::Classify];
        if hints.num_labels == 1 {
            tasks.push(Task::Score);
        }
        tasks.push(Task::TokenClassify);
        tasks
    };
    let masked_lm = architecture.ends_with("ForMaskedLM");
    match convert {
        Convert::Embed => Ok(embedder()),
        Convert::Auto | Convert::Classify if architecture == PROCESS_REWARD_MODEL => Ok(vec![Task::TokenClassify]),
        Convert::Auto | Convert::Classify if architecture == REWARD_MODEL => Ok(vec![Task::TokenClassify, Task::Classify]),
        Convert::Auto | Convert::Classify if is_reward_layout(architecture) => Err(LoadError::Unsupported(format!(
            "`{architecture}` is a reward-model layout poolserve does not know (known: {REWARD_MODEL}, {PROCESS_REWARD_MODEL}); serve its backbone with --convert embed (token_embed and embed, as vLLM converts *ForRewardModeling and *RewardModel)"
        ))),
        Convert::Auto if hints.sentence_pooling => Ok(embedder()),
        Convert::Auto | Convert::Classify if is_sequence_classifier(architecture) => Ok(classifier_tasks()),
        Convert::Auto | Convert::Classify if architecture.ends_with("ForTokenClassification") => Ok(vec![Task::TokenClassify]),
        Convert::Classify => Err(LoadError::Unsupported(format!(
            "--convert classify needs a `*ForSequenceClassification` or `*ForTokenClassification` checkpoint with classifier weights; `{architecture}` has none"
        ))),
        Convert::Auto if masked_lm && hints.pooling == Some(PoolingType::Splade) => Ok(vec![Task::EmbedSparse]),
        Convert::Auto if masked_lm && hints.masked_lm_embeds => Ok(embedder()),
        Convert::Auto if masked_lm => Err(LoadError::Unsupported(format!(
            "`{architecture}` is served as a SPLADE sparse encoder with --pooler-config '{{\"pooling_type\": \"SPLADE\"}}', or as an embedding model with --convert embed"
        ))),
        Convert::Auto => Ok(embedder()),
    }
}

/// `tasks` without the pair task, sorted as vLLM sorts a model's supported tasks.
pub(super) fn pooling_tasks(tasks: &[Task]) -> Vec<Task> {
    let mut pooling: Vec<Task> = tasks.iter().copied().filter(|t| *t != Task::Score).collect();
    pooling.sort_by_key(|t| t.as_str());
    pooling
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_follow_architecture_and_convert() {
        let embed = vec![Task::Embed, Task::TokenEmbed];
        let labels = |n| TaskHints { num_labels: n, ..Default::default() };
        assert_eq!(tasks_for("BertModel", Convert::Auto, labels(2)).unwrap(), embed);
        assert_eq!(
            tasks_for("BertForSequenceClassification", Convert::Auto, labels(3)).unwrap(),
            vec![Task::Classify, Task::TokenClassify]
        );
        assert_eq!(
            tasks_for("XLMRobertaForSequenceClassification", Convert::Classify, labels(1)).unwrap(),
            vec![Task::Classify, Task::Score, Task::TokenClassify]
        );
        assert_eq!(tasks_for("BertForSequenceClassification", Convert::Embed, labels(1)).unwrap(), embed);
        assert!(tasks_for("BertModel", Convert::Classify, labels(2)).is_err());
        assert_eq!(tasks_for("BertForTokenClassification", Convert::Auto, labels(5)).unwrap(), vec![Task::TokenClassify]);
        assert!(tasks_for("BertForMaskedLM", Convert::Auto, labels(2)).is_err());
        let splade = TaskHints { pooling: Some(PoolingType::Splade), ..Default::default() };
        assert_eq!(tasks_for("BertForMaskedLM", Convert::Auto, splade).unwrap(), vec![Task::EmbedSparse]);
        let colbert = TaskHints { multi_vector: true, ..Default::default() };
        assert_eq!(tasks_for("BertModel", Convert::Auto, colbert).unwrap(), vec![Task::TokenEmbed, Task::Score]);
        // A sentence-transformers folder (Transformer → Pooling) that kept its training head.
        let st = TaskHints { sentence_pooling: true, pooling: Some(PoolingType::Mean), ..Default::default() };
        for architecture in
            ["MPNetForMaskedLM", "BertForPreTraining", "RobertaForCausalLM", "Qwen3ForCausalLM", "BertForSequenceClassification"]
        {
            assert_eq!(tasks_for(architecture, Convert::Auto, st).unwrap(), embed, "{architecture}");
        }
        assert_eq!(
            tasks_for(
                "BertForSequenceClassification",
                Convert::Classify,
                TaskHints { sentence_pooling: true, num_labels: 1, ..Default::default() }
            )
            .unwrap(),
            vec![Task::Classify, Task::Score, Task::TokenClassify]
        );
    }
}
