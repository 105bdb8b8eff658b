//! Which tasks a checkpoint serves and how its sequences pool: from its architecture name,
//! `--convert`, its number of labels and what its files say besides (a sentence-transformers
//! Pooling module, a multi-vector encoder, SPLADE pooling, BGE-M3's heads, a vision tower).

use super::SpecInputs;
use crate::loader::options::Convert;
use crate::loader::LoadError;
use crate::models::SequencePooling;
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
fn is_reward_layout(architecture: &str) -> bool {
    architecture.ends_with("RewardModel") || architecture.ends_with("RewardModeling")
}

/// Whether the checkpoint carries a sequence-classification head.
fn is_sequence_classifier(architecture: &str) -> bool {
    architecture.ends_with("ForSequenceClassification")
}

/// What decides a checkpoint's tasks besides its architecture.
#[derive(Debug, Clone, Copy, Default)]
struct TaskHints {
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
fn tasks_for(architecture: &str, convert: Convert, hints: TaskHints) -> Result<Vec<Task>, LoadError> {
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

/// The model's tasks in preference order: an image-text model embeds (a page retriever gives
/// every token's vector and scores by MaxSim), BGE-M3 serves all four of its outputs, anything
/// else as its architecture and files say ([`tasks_for`]).
pub(super) fn decide_tasks(input: &SpecInputs, num_labels: usize) -> Result<Vec<Task>, LoadError> {
    let SpecInputs { options, architecture_name: name, sentence, .. } = input;
    let embeds_only = matches!(options.convert, Convert::Auto | Convert::Embed);
    if input.vision {
        if options.pooler.enable_chunked_processing == Some(true) {
            return Err(LoadError::Unsupported(format!(
                "`{name}`: chunked processing does not apply to image-text models (their texts are read at one token)"
            )));
        }
        // A vision-language model converted into a classifier (Qwen3-VL-Reranker's
        // `--hf-overrides`) classifies its inputs, images included, and (with one label)
        // scores pairs written into its template.
        if is_sequence_classifier(name) && matches!(options.convert, Convert::Auto | Convert::Classify) {
            let one_label = num_labels == 1;
            return Ok(if one_label { vec![Task::Classify, Task::Score] } else { vec![Task::Classify] });
        }
        // Otherwise an image-text model's one job: embeddings of texts and images in one space.
        if !embeds_only {
            return Err(LoadError::Unsupported(format!(
                "`{name}` embeds texts and images; it is served with --convert auto or embed only"
            )));
        }
        if input.architecture.multi_vector() {
            return Ok(vec![Task::TokenEmbed, Task::Score]);
        }
        return Ok(vec![Task::Embed]);
    }
    if input.m3 {
        // BGE-M3: the dense embedding, ColBERT vectors, per-token and per-id lexical weights,
        // all from one pass.
        if !embeds_only {
            return Err(LoadError::Unsupported(format!(
                "BGE-M3 (`{name}` with its sparse and ColBERT heads) is served with --convert auto or embed only"
            )));
        }
        return Ok(vec![Task::Embed, Task::TokenEmbed, Task::TokenClassify, Task::EmbedSparse]);
    }
    let hints = TaskHints {
        num_labels,
        pooling: options.pooler.pooling_type.or(sentence.pooling),
        multi_vector: sentence.multi_vector || input.architecture.multi_vector() || crate::models::is_colbert_name(name),
        sentence_pooling: sentence.pooling_module,
        masked_lm_embeds: input.architecture.masked_lm_embeds(),
    };
    tasks_for(name, options.convert, hints)
}

/// How sequences pool: `--pooler-config`, else the sentence-transformers Pooling module, else
/// the architecture's default (process reward models pool their step tags); refused where the
/// tasks cannot use it.
pub(super) fn decide_pooling(input: &SpecInputs, tasks: &[Task]) -> Result<PoolingType, LoadError> {
    let pooler = &input.options.pooler;
    let supports = |task| tasks.contains(&task);
    let default_pooling = match input.architecture.default_pooling(input.config) {
        _ if input.architecture_name == PROCESS_REWARD_MODEL && supports(Task::TokenClassify) => PoolingType::Step,
        SequencePooling::First => PoolingType::Cls,
        SequencePooling::Last => PoolingType::Last,
        SequencePooling::Mean => PoolingType::Mean,
    };
    let pooling = pooler.pooling_type.or(input.sentence.pooling).unwrap_or(default_pooling);
    if pooler.pooling_type == Some(PoolingType::Step) && !supports(Task::TokenClassify) {
        return Err(LoadError::Unsupported("STEP pooling needs a token-classification model (`*ForTokenClassification`)".into()));
    }
    if supports(Task::Embed) && pooling.is_token_level() {
        return Err(LoadError::Unsupported(format!(
            "pooling_type {pooling:?} gives one vector per token; embeddings need CLS, MEAN or LAST"
        )));
    }
    Ok(pooling)
}

/// vLLM's pooling task: `--pooler-config`'s `task` if the model serves it (never the pair task
/// `score`), else the first of `tasks`.
pub(super) fn pooling_task(named: Option<&str>, tasks: &[Task]) -> Result<Task, LoadError> {
    let Some(name) = named else { return Ok(tasks[0]) };
    name.parse::<Task>().ok().filter(|t| *t != Task::Score && tasks.contains(t)).ok_or_else(|| {
        LoadError::Unsupported(format!("Unsupported task: '{name}' Supported tasks: {}", Task::py_tuple(&pooling_tasks(tasks))))
    })
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
