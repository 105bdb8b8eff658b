//! `ModelSpec`: every model-specific decision, taken once at load time from config.json
//! (after `--hf-overrides`), the sentence-transformers files, `tokenizer_config.json`, the
//! backbone's sizes and the model options, in [`ModelSpec::decide`]. Handlers, the engine and
//! the loader read the spec; besides this folder only the architecture files read config.json.
//!
//! [`ModelSpec::decide`] reads top-down, a file a step: `labels` (what config.json says of the
//! classifier outputs), `tasks` (which tasks the checkpoint serves and how it pools),
//! `classifier` (labels, activations, STEP filter and reranker prompt for those tasks), then the
//! sizes and tokenizer settings here; `prompts` holds sentence-transformers' prompts.

mod classifier;
mod labels;
mod prompts;
mod tasks;

pub use prompts::{Prompts, UnknownPrompt};

use super::options::ModelOptions;
use super::sentence::SentenceTransformer;
use super::tokenizer::TruncationSide;
use super::LoadError;
use crate::models::head_weights::RerankTemplate;
use crate::models::Architecture;
use crate::pooling::classifier::{ClassifierActivation, StepFilter};
use crate::pooling::config::PoolerConfig;
use crate::pooling::{PoolingType, Task};
use classifier::ClassifierSpec;
use labels::LabelFacts;
use serde_json::Value;
use tasks::pooling_tasks;

/// Matryoshka support declared by config.json (or `--hf-overrides`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matryoshka {
    pub enabled: bool,
    /// The only dimensions allowed, when the model lists them.
    pub dimensions: Option<Vec<usize>>,
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
    /// `--auto-truncate` (TEI's flag): a request that names no truncation is cut to
    /// `max_model_len` instead of refused (vLLM's routes; TEI's always default to cutting).
    pub auto_truncate: bool,
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
    /// Why `--dtype auto` chose `dtype` on the CPU (its probe's finding, or what kept float32);
    /// `None` for an explicit `--dtype` and off the CPU.
    pub dtype_reason: Option<String>,
    /// `--runner generate`: the LM head is loaded and `/generative_scoring` answers.
    pub generates: bool,
    /// The IO-processor plugin of `/pooling`'s `data` requests: `--io-processor-plugin`, else
    /// config.json's `io_processor_plugin` (vLLM's order).
    pub io_processor_plugin: Option<String>,
    /// The local folder holding tokenizer.json (a plugin's tokenizer reads it).
    pub tokenizer_dir: Option<std::path::PathBuf>,
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
    /// The weights' type as they run: `--dtype`, or what `--dtype auto` chose for the memory
    /// there is (bfloat16 for weights packed in bf16 for the CPU kernels).
    pub dtype: candle_core::DType,
    /// The local folder holding tokenizer.json, when there is one.
    pub tokenizer_dir: Option<std::path::PathBuf>,
}

impl ModelSpec {
    /// Every decision about the model, in one place: its tasks, its pooling, its sizes, its
    /// classifier's labels and activations, its prompts and tokenizer settings.
    pub fn decide(input: SpecInputs) -> Result<ModelSpec, LoadError> {
        let options = input.options;
        let pooler = &options.pooler;
        let labels = LabelFacts::read(input.config, &input.architecture_name);
        let tasks = tasks::decide_tasks(&input, labels.num_labels)?;
        let pooling_task = tasks::pooling_task(pooler.task.as_deref(), &tasks)?;
        let pooling = tasks::decide_pooling(&input, &tasks)?;
        let classifier = ClassifierSpec::decide(&input, labels, &tasks, pooling)?;
        let embedding_size = embedding_size(input.sentence, input.hidden_size)?;
        let SpecInputs {
            config,
            architecture_name,
            architecture,
            sentence,
            tokenizer_config,
            hidden_size,
            max_positions,
            vision,
            m3,
            tokenizer_dir,
            ..
        } = input;
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
            auto_truncate: options.auto_truncate,
            truncation_side: match tokenizer_config.get("truncation_side").and_then(Value::as_str) {
                Some("left") => TruncationSide::Left,
                _ => TruncationSide::Right,
            },
            lowercase: sentence.do_lower_case,
            segment_ids: uses_token_type_ids(tokenizer_config, config),
            num_labels: classifier.num_labels,
            labels: classifier.labels,
            classifier_from_token: classifier.from_token,
            classify_activation: classifier.classify_activation,
            score_activation: classifier.score_activation,
            step: classifier.step,
            rerank_template: classifier.rerank_template,
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
            dtype: match input.dtype {
                candle_core::DType::F16 => "float16",
                candle_core::DType::BF16 => "bfloat16",
                _ => "float32",
            },
            dtype_reason: None,
            generates: options.runner == super::options::Runner::Generate,
            io_processor_plugin: options
                .io_processor_plugin
                .clone()
                .or_else(|| config.get("io_processor_plugin").and_then(Value::as_str).map(String::from)),
            tokenizer_dir,
        })
    }
}

/// An embedding's size after the folder's Dense layers, which must chain from the hidden size
/// (a mismatch would otherwise only surface per request).
fn embedding_size(sentence: &SentenceTransformer, hidden_size: usize) -> Result<usize, LoadError> {
    let mut size = hidden_size;
    for (i, dense) in sentence.dense.iter().enumerate() {
        if dense.linear.in_features() != size {
            return Err(LoadError::Invalid(format!("Dense module {i} takes {} features but receives {size}", dense.linear.in_features())));
        }
        size = dense.linear.out_features();
    }
    Ok(size)
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
            auto_truncate: false,
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
            dtype_reason: None,
            generates: false,
            io_processor_plugin: None,
            tokenizer_dir: None,
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
        // GritLM's folders say `mistral`: its name alone tells it apart.
        assert_eq!(name(json!({"architectures": ["GritLM"], "model_type": "mistral"})), "GritLM");
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
}
