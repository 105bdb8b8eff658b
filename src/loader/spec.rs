//! `ModelSpec`: every model-specific decision, taken once at load time from config.json
//! (after `--hf-overrides`), the sentence-transformers files, `tokenizer_config.json`, the
//! backbone's sizes and the model options, in [`ModelSpec::decide`]. Handlers, the engine and
//! the loader read the spec; besides this file only the architecture files read config.json.

use super::options::{Convert, ModelOptions};
use super::sentence::SentenceTransformer;
use super::tokenizer::TruncationSide;
use super::LoadError;
use crate::models::head_weights::RerankTemplate;
use crate::models::{Architecture, SequencePooling};
use crate::pooling::classifier::{ClassifierActivation, StepFilter};
use crate::pooling::config::PoolerConfig;
use crate::pooling::{PoolingType, Task};
use serde_json::Value;

/// Matryoshka support declared by config.json (or `--hf-overrides`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matryoshka {
    pub enabled: bool,
    /// The only dimensions allowed, when the model lists them.
    pub dimensions: Option<Vec<usize>>,
}

/// A `prompt_name` the model does not define; the message is part of the API contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownPrompt(pub String);

/// sentence-transformers prompts (`config_sentence_transformers.json`): a prompt's text is
/// prepended to a text input before tokenization, exactly as `SentenceTransformer.encode`
/// does, so its tokens are embedded, pooled and counted in usage like the rest. Token-id inputs
/// are taken as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompts {
    /// Name → text.
    pub named: std::collections::BTreeMap<String, String>,
    /// The text used when a request names no prompt: the folder's `default_prompt_name`, or the
    /// `--default-prompt-name` / `--default-prompt` flags.
    pub default: Option<String>,
}

impl Prompts {
    /// Decides the default: `--default-prompt` (a text) or `--default-prompt-name` (a name the
    /// folder defines) win over the folder's `default_prompt_name`. A default name the folder
    /// does not define is an error, as sentence-transformers refuses to load such a folder.
    pub fn new(
        named: std::collections::BTreeMap<String, String>,
        folder_default: Option<&str>,
        flag_name: Option<&str>,
        flag_text: Option<&str>,
    ) -> Result<Self, LoadError> {
        let mut prompts = Prompts { named, default: None };
        prompts.default = match (flag_text, flag_name, folder_default) {
            (Some(text), _, _) => Some(text.to_string()),
            (None, Some(name), _) => Some(prompts.text(name).ok_or_else(|| {
                LoadError::Invalid(format!("--default-prompt-name `{name}`: the model's prompts are {}", prompts.names()))
            })?),
            (None, None, Some(name)) => Some(prompts.text(name).ok_or_else(|| {
                LoadError::Invalid(format!(
                    "config_sentence_transformers.json: default_prompt_name `{name}` is not among its prompts {}",
                    prompts.names()
                ))
            })?),
            (None, None, None) => None,
        };
        Ok(prompts)
    }

    fn text(&self, name: &str) -> Option<String> {
        self.named.get(name).cloned()
    }

    /// The names as a Python list, for messages.
    pub fn names(&self) -> String {
        let quoted: Vec<String> = self.named.keys().map(|k| format!("'{k}'")).collect();
        format!("[{}]", quoted.join(", "))
    }

    pub fn has(&self, name: &str) -> bool {
        self.named.contains_key(name)
    }

    /// The prompt a request gets: the one it names, else the default.
    pub fn resolve(&self, name: Option<&str>) -> Result<Option<String>, UnknownPrompt> {
        match name {
            None => Ok(self.default.clone()),
            Some(name) => self.text(name).map(Some).ok_or_else(|| {
                UnknownPrompt(if self.named.is_empty() {
                    format!("Unknown prompt_name '{name}': the model defines no prompts")
                } else {
                    format!("Unknown prompt_name '{name}'; the model's prompts are {}", self.names())
                })
            }),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The name clients send as `model`.
    pub served_name: String,
    /// The MODEL argument (folder or hub id), reported as `root` by /v1/models.
    pub root: String,
    /// `architectures[0]` of config.json (empty when it names none).
    pub architecture: String,
    /// Tasks in preference order (the first is the default pooling task).
    pub tasks: Vec<Task>,
    /// vLLM's "pooling task": the one task the model serves (`--pooler-config` `task`, else
    /// the first of `tasks`). `/pooling` takes it alone; `/v1/embeddings`, `/classify`,
    /// `/score` and `/rerank` follow it as vLLM registers its routes.
    pub pooling_task: Task,
    pub pooling: PoolingType,
    pub max_model_len: usize,
    pub hidden_size: usize,
    /// Size of an embedding before any Matryoshka slice (after Dense layers).
    pub embedding_size: usize,
    pub matryoshka: Matryoshka,
    pub pooler_defaults: PoolerConfig,
    pub truncation_side: TruncationSide,
    /// sentence-transformers' `do_lower_case`: texts are lowercased before tokenizing.
    pub lowercase: bool,
    /// Whether pairs keep the tokenizer's segment ids (0/1); otherwise every token has type 0.
    pub segment_ids: bool,
    /// Outputs of the classifier (sequence or token); 0 for models without one.
    pub num_labels: usize,
    /// Class names of a classifier, index = logit position; empty for other models.
    pub labels: Vec<String>,
    /// `classifier_from_token` of a causal LM converted to a classifier.
    pub classifier_from_token: Option<Vec<String>>,
    /// Activations of `classify` and of `score` (cross-encoders), vLLM's rules.
    pub classify_activation: ClassifierActivation,
    pub score_activation: ClassifierActivation,
    /// STEP pooling of a token classifier (`--pooler-config`).
    pub step: Option<StepFilter>,
    /// How `/score` and `/rerank` turn a pair into model input when it is not text + text_pair.
    pub rerank_template: Option<RerankTemplate>,
    /// sentence-transformers prompts and the default one.
    pub prompts: Prompts,
    /// `max_embed_len` when `enable_chunked_processing` is on: longer embedding inputs are
    /// split into chunks of `max_model_len` instead of refused.
    pub chunked_up_to: Option<usize>,
    /// Whether `embed` also takes images (CLIP, SigLIP: a vision tower and a processor).
    pub images: bool,
    /// BGE-M3 (sparse and ColBERT heads beside the weights): `/pooling` serves every task of
    /// `tasks` whatever the pooling task, since one pass computes them all, and takes several
    /// outputs at once; `/score` and `/rerank` take FlagEmbedding's hybrid weights.
    pub m3: bool,
    /// `(length, pad id)`: texts are padded to this length before they run (SigLIP).
    pub pad_text_to: Option<(usize, u32)>,
    /// The weights' type as it runs (`float32`, `float16`, `bfloat16`).
    pub dtype: &'static str,
}

/// What a spec is decided from.
pub struct SpecInputs<'a> {
    pub options: &'a ModelOptions,
    /// config.json with `--hf-overrides` merged in.
    pub config: &'a Value,
    pub architecture_name: String,
    pub architecture: &'static dyn Architecture,
    pub sentence: &'a SentenceTransformer,
    /// `tokenizer_config.json`, `Null` when the folder has none.
    pub tokenizer_config: &'a Value,
    pub hidden_size: usize,
    /// Longest sequence the backbone's positions allow.
    pub max_positions: usize,
    /// Whether the architecture loaded a vision tower (image-text models embed only).
    pub vision: bool,
    /// Whether BGE-M3's sparse and ColBERT heads were found beside the weights.
    pub m3: bool,
}

impl ModelSpec {
    /// Every decision about the model, in one place.
    pub fn decide(input: SpecInputs) -> Result<ModelSpec, LoadError> {
        let SpecInputs {
            options,
            config,
            architecture_name,
            architecture,
            sentence,
            tokenizer_config,
            hidden_size,
            max_positions,
            vision,
            m3,
        } = input;
        let pooler = &options.pooler;
        // vLLM fixes the reward heads' sizes (Qwen2.5-Math-RM's config.json names none).
        let num_labels = match architecture_name.as_str() {
            REWARD_MODEL => 1,
            PROCESS_REWARD_MODEL => 2,
            _ => num_labels_of(config),
        };
        let hints = TaskHints {
            num_labels,
            pooling: pooler.pooling_type.or(sentence.pooling),
            multi_vector: sentence.multi_vector,
            sentence_pooling: sentence.pooling_module,
            masked_lm_embeds: architecture.masked_lm_embeds(),
        };
        if vision && pooler.enable_chunked_processing == Some(true) {
            return Err(LoadError::Unsupported(format!(
                "`{architecture_name}`: chunked processing does not apply to image-text models (their texts are read at one token)"
            )));
        }
        let tasks = if vision {
            // An image-text model's one job: embeddings of texts and images in one space.
            if !matches!(options.convert, Convert::Auto | Convert::Embed) {
                return Err(LoadError::Unsupported(format!(
                    "`{architecture_name}` embeds texts and images; it is served with --convert auto or embed only"
                )));
            }
            vec![Task::Embed]
        } else if m3 {
            // BGE-M3: the dense embedding, ColBERT vectors, per-token and per-id lexical
            // weights, all from one pass.
            if !matches!(options.convert, Convert::Auto | Convert::Embed) {
                return Err(LoadError::Unsupported(format!(
                    "BGE-M3 (`{architecture_name}` with its sparse and ColBERT heads) is served with --convert auto or embed only"
                )));
            }
            vec![Task::Embed, Task::TokenEmbed, Task::TokenClassify, Task::EmbedSparse]
        } else {
            tasks_for(&architecture_name, options.convert, hints)?
        };
        let supports = |task| tasks.contains(&task);
        let pooling_task = match pooler.task.as_deref() {
            None => tasks[0],
            Some(name) => name.parse::<Task>().ok().filter(|t| *t != Task::Score && supports(*t)).ok_or_else(|| {
                LoadError::Unsupported(format!("Unsupported task: '{name}' Supported tasks: {}", Task::py_tuple(&pooling_tasks(&tasks))))
            })?,
        };
        let default_pooling = match () {
            // vLLM's process reward models pool the step tags.
            _ if architecture_name == PROCESS_REWARD_MODEL && supports(Task::TokenClassify) => PoolingType::Step,
            _ => match architecture.default_pooling() {
                SequencePooling::First => PoolingType::Cls,
                SequencePooling::Last => PoolingType::Last,
                SequencePooling::Mean => PoolingType::Mean,
            },
        };
        let pooling = pooler.pooling_type.or(sentence.pooling).unwrap_or(default_pooling);
        if pooler.pooling_type == Some(PoolingType::Step) && !supports(Task::TokenClassify) {
            return Err(LoadError::Unsupported("STEP pooling needs a token-classification model (`*ForTokenClassification`)".into()));
        }
        if supports(Task::Embed) && pooling.is_token_level() {
            return Err(LoadError::Unsupported(format!(
                "pooling_type {pooling:?} gives one vector per token; embeddings need CLS, MEAN or LAST"
            )));
        }
        // Dense layers must chain from the hidden size; a mismatch would only surface per request.
        let mut embedding_size = hidden_size;
        for (i, dense) in sentence.dense.iter().enumerate() {
            if dense.linear.in_features() != embedding_size {
                return Err(LoadError::Invalid(format!(
                    "Dense module {i} takes {} features but receives {embedding_size}",
                    dense.linear.in_features()
                )));
            }
            embedding_size = dense.linear.out_features();
        }
        let classifier_from_token = classifier_tokens(config);
        let classifies = supports(Task::Classify);
        // BGE-M3's token_classify is its lexical weight per token, not a classifier's labels.
        let token_classifier = supports(Task::TokenClassify) && !m3;
        let labels = match &classifier_from_token {
            Some(tokens) if classifies && num_labels == tokens.len() => tokens.clone(),
            _ if classifies || token_classifier => labels_of(config, num_labels),
            _ => Vec::new(),
        };
        let step = (pooling == PoolingType::Step).then(|| StepFilter {
            // vLLM's default for Qwen2.5-Math-PRM: its `<extra_0>` step separator.
            step_tag_id: pooler.step_tag_id.or((architecture_name == PROCESS_REWARD_MODEL).then_some(QWEN_PRM_STEP_TAG)),
            columns: pooler.returned_token_ids.as_ref().map(|ids| ids.iter().map(|&i| i as usize).collect()),
        });
        if let Some(bad) = step.as_ref().and_then(|s| s.columns.as_ref()).and_then(|c| c.iter().find(|&&c| c >= num_labels)) {
            return Err(LoadError::Invalid(format!("returned_token_ids: {bad} is not one of the model's {num_labels} labels")));
        }
        let rerank_template = if classifies {
            rerank_template_override(config, num_labels)?.or_else(|| architecture.rerank_template(config, num_labels)).map(
                |mut template| {
                    if let Some(instruction) = &options.reranker_instruction {
                        template.instruction = instruction.clone();
                    }
                    template
                },
            )
        } else {
            None
        };
        // Rewards are raw head outputs, as vLLM serves them.
        let classify_activation = if architecture_name == REWARD_MODEL && supports(Task::TokenClassify) {
            ClassifierActivation::Identity
        } else {
            classify_activation(config, num_labels)
        };
        Ok(ModelSpec {
            served_name: options.served_name.clone(),
            root: options.source.clone(),
            architecture: architecture_name,
            tasks: tasks.clone(),
            pooling_task,
            pooling,
            max_model_len: max_model_len(options.max_model_len, sentence.max_seq_length, max_positions)?,
            hidden_size,
            embedding_size,
            matryoshka: matryoshka_of(config),
            pooler_defaults: pooler.clone(),
            truncation_side: match tokenizer_config.get("truncation_side").and_then(Value::as_str) {
                Some("left") => TruncationSide::Left,
                _ => TruncationSide::Right,
            },
            lowercase: sentence.do_lower_case,
            segment_ids: uses_token_type_ids(tokenizer_config, config),
            num_labels: if classifies || token_classifier { num_labels } else { 0 },
            labels,
            classifier_from_token: classifier_from_token.filter(|_| classifies),
            classify_activation,
            // Token classifiers have no scores; their `score` activation is never read.
            score_activation: if classifies { score_activation(config, num_labels) } else { classify_activation },
            step,
            rerank_template,
            prompts: Prompts::new(
                sentence.prompts.clone(),
                sentence.default_prompt_name.as_deref(),
                options.default_prompt_name.as_deref(),
                options.default_prompt.as_deref(),
            )?,
            chunked_up_to: (pooler.enable_chunked_processing == Some(true)).then(|| pooler.max_embed_len.unwrap_or(usize::MAX)),
            images: vision,
            m3,
            pad_text_to: architecture.pads_text(config),
            dtype: match options.dtype.dtype_on(options.device) {
                candle_core::DType::F16 => "float16",
                candle_core::DType::BF16 => "bfloat16",
                _ => "float32",
            },
        })
    }
}

/// Whether pairs keep the tokenizer's segment ids (0/1): when `tokenizer_config.json` lists
/// `token_type_ids` among the model inputs (BERT does, RoBERTa and XLM-R do not), or, without
/// that list, when the model has more than one token type.
fn uses_token_type_ids(tokenizer_config: &Value, config: &Value) -> bool {
    match tokenizer_config.get("model_input_names").and_then(Value::as_array) {
        Some(names) => names.iter().any(|n| n == "token_type_ids"),
        None => config.get("type_vocab_size").and_then(Value::as_u64).unwrap_or(2) > 1,
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

/// Shallow-merges `overrides` into config.json, as vLLM's `--hf-overrides` does.
pub fn apply_overrides(config: &mut Value, overrides: &serde_json::Map<String, Value>) {
    if let Value::Object(map) = config {
        for (k, v) in overrides {
            map.insert(k.clone(), v.clone());
        }
    }
}

/// Architecture name (`architectures[0]`) of a config.json and the architecture serving it.
pub fn architecture_of(config: &Value) -> Result<(String, &'static dyn Architecture), LoadError> {
    let architecture = config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).unwrap_or("").to_string();
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
    let served = crate::models::detect(config, &architecture, model_type).ok_or_else(|| {
        LoadError::Unsupported(format!(
            "architecture `{}` (model_type `{model_type}`); supported: {}",
            if architecture.is_empty() { "?" } else { &architecture },
            crate::models::supported_architectures()
        ))
    })?;
    Ok((architecture, served))
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

/// Whether the checkpoint carries a sequence-classification head.
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

pub fn matryoshka_of(config: &Value) -> Matryoshka {
    let dimensions: Option<Vec<usize>> = config
        .get("matryoshka_dimensions")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).map(|d| d as usize).collect());
    let flag = config.get("is_matryoshka").and_then(Value::as_bool).unwrap_or(false);
    Matryoshka { enabled: flag || dimensions.is_some(), dimensions }
}

/// The longest input: `--max-model-len` if given (it may only lower the limit), else
/// sentence-transformers' `max_seq_length`, else the position table's size.
pub fn max_model_len(flag: Option<usize>, max_seq_length: Option<usize>, max_positions: usize) -> Result<usize, LoadError> {
    let derived = max_seq_length.map_or(max_positions, |m| m.min(max_positions));
    match flag {
        Some(n) if n > derived => {
            Err(LoadError::Invalid(format!("--max-model-len {n} is larger than the model's limit of {derived} tokens")))
        }
        Some(n) => Ok(n),
        None => Ok(derived),
    }
}

impl ModelSpec {
    /// A minimal spec for unit tests of code that only reads a few fields.
    #[cfg(test)]
    pub fn for_tests(embedding_size: usize, max_model_len: usize) -> Self {
        ModelSpec {
            served_name: "test-model".into(),
            root: "test-model".into(),
            architecture: "BertModel".into(),
            tasks: vec![Task::Embed, Task::TokenEmbed],
            pooling_task: Task::Embed,
            pooling: PoolingType::Mean,
            max_model_len,
            hidden_size: embedding_size,
            embedding_size,
            matryoshka: Matryoshka::default(),
            pooler_defaults: PoolerConfig::default(),
            truncation_side: TruncationSide::Right,
            lowercase: false,
            segment_ids: true,
            num_labels: 0,
            labels: Vec::new(),
            classifier_from_token: None,
            classify_activation: ClassifierActivation::Softmax,
            score_activation: ClassifierActivation::Softmax,
            step: None,
            rerank_template: None,
            prompts: Prompts::default(),
            chunked_up_to: None,
            images: false,
            m3: false,
            pad_text_to: None,
            dtype: "float32",
        }
    }

    pub fn supports(&self, task: Task) -> bool {
        self.tasks.contains(&task)
    }

    /// vLLM's "supported tasks" of the model, as its messages list them (sorted; the pair
    /// task `score` is not a pooling task).
    pub fn pooling_tasks(&self) -> Vec<Task> {
        pooling_tasks(&self.tasks)
    }

    /// Whether `/score` and `/rerank` exist for this model: vLLM enables them for an embed or
    /// token_embed pooling task (cosine, MaxSim) and for classify with exactly one label.
    pub fn scores(&self) -> bool {
        match self.pooling_task {
            Task::Embed | Task::TokenEmbed => true,
            Task::Classify => self.num_labels == 1,
            _ => false,
        }
    }
}

/// `tasks` without the pair task, sorted as vLLM sorts a model's supported tasks.
fn pooling_tasks(tasks: &[Task]) -> Vec<Task> {
    let mut pooling: Vec<Task> = tasks.iter().copied().filter(|t| *t != Task::Score).collect();
    pooling.sort_by_key(|t| t.as_str());
    pooling
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn detects_architectures() {
        let name = |config: Value| architecture_of(&config).unwrap().1.name();
        assert_eq!(name(json!({"architectures": ["BertModel"]})), "BERT");
        assert_eq!(name(json!({"architectures": ["XLMRobertaModel"]})), "RoBERTa/XLM-RoBERTa/CamemBERT");
        assert_eq!(name(json!({"model_type": "roberta"})), "RoBERTa/XLM-RoBERTa/CamemBERT");
        assert_eq!(name(json!({"architectures": ["Qwen3ForCausalLM"]})), "Qwen3");
        assert_eq!(name(json!({"architectures": ["Qwen2Model"]})), "Qwen2");
        assert_eq!(name(json!({"architectures": ["NewModel"]})), "GTE (GteModel/NewModel)");
        assert_eq!(name(json!({"architectures": ["MPNetForMaskedLM"]})), "MPNet");
        assert_eq!(name(json!({"architectures": ["DistilBertForTokenClassification"]})), "DistilBERT");
        assert_eq!(name(json!({"architectures": ["ModernBertModel"]})), "ModernBERT");
        assert_eq!(name(json!({"architectures": ["LlamaForCausalLM"]})), "Llama");
        assert_eq!(name(json!({"architectures": ["MistralModel"]})), "Mistral");
        assert_eq!(name(json!({"architectures": ["GemmaForSequenceClassification"]})), "Gemma");
        assert_eq!(name(json!({"architectures": ["Gemma2ForCausalLM"]})), "Gemma2");
        assert_eq!(name(json!({"architectures": ["Gemma3TextModel"]})), "Gemma3Text");
        assert_eq!(name(json!({"architectures": ["Gemma3ForCausalLM"]})), "Gemma3Text");
        let err = architecture_of(&json!({"architectures": ["PhiForCausalLM"], "model_type": "phi"})).err().expect("phi is not served");
        assert!(err.to_string().contains("PhiForCausalLM"));
    }

    #[test]
    fn overrides_and_matryoshka() {
        let mut config = json!({"architectures": ["BertModel"], "hidden_size": 32});
        apply_overrides(&mut config, json!({"is_matryoshka": true}).as_object().unwrap());
        assert_eq!(matryoshka_of(&config), Matryoshka { enabled: true, dimensions: None });
        let listed = matryoshka_of(&json!({"matryoshka_dimensions": [16, 32]}));
        assert_eq!(listed.dimensions, Some(vec![16, 32]));
        assert!(listed.enabled);
    }

    #[test]
    fn max_len_precedence() {
        assert_eq!(max_model_len(None, Some(256), 512).unwrap(), 256);
        assert_eq!(max_model_len(None, None, 512).unwrap(), 512);
        assert_eq!(max_model_len(Some(128), Some(256), 512).unwrap(), 128);
        assert!(max_model_len(Some(300), Some(256), 512).is_err());
        assert_eq!(max_model_len(None, Some(1024), 512).unwrap(), 512);
    }

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

    #[test]
    fn prompt_defaults_and_lookup() {
        let named: std::collections::BTreeMap<String, String> =
            [("query".to_string(), "query: ".to_string()), ("passage".to_string(), "passage: ".to_string())].into();
        let folder = Prompts::new(named.clone(), Some("query"), None, None).unwrap();
        assert_eq!(folder.default.as_deref(), Some("query: "));
        assert_eq!(folder.resolve(None).unwrap().as_deref(), Some("query: "));
        assert_eq!(folder.resolve(Some("passage")).unwrap().as_deref(), Some("passage: "));
        let err = folder.resolve(Some("doc")).unwrap_err();
        assert_eq!(err.0, "Unknown prompt_name 'doc'; the model's prompts are ['passage', 'query']");
        assert_eq!(Prompts::new(named.clone(), Some("query"), Some("passage"), None).unwrap().default.as_deref(), Some("passage: "));
        assert_eq!(Prompts::new(named.clone(), Some("query"), None, Some("x: ")).unwrap().default.as_deref(), Some("x: "));
        assert!(Prompts::new(named.clone(), None, Some("nope"), None).unwrap_err().to_string().contains("['passage', 'query']"));
        assert!(Prompts::new(named, Some("nope"), None, None).is_err());
        assert_eq!(Prompts::new(Default::default(), None, None, None).unwrap().resolve(None).unwrap(), None);
    }

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
