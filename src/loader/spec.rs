//! `ModelSpec`: every model-specific decision, taken once at load time from config.json
//! (after `--hf-overrides`), the sentence-transformers files and the flags. Handlers and the
//! engine ask the spec; nothing else reads config.json.

use super::LoadError;
use crate::config::{Convert, PoolerConfig};
use crate::loader::tokenizer::TruncationSide;
use crate::pooling::{PoolingType, Task};
use serde_json::Value;

/// Architecture families with their own backbone code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Bert,
    /// RoBERTa, XLM-RoBERTa, CamemBERT: BERT layers, positions after the padding index.
    Roberta,
    /// DistilBERT: BERT layers under other names, no segment embeddings.
    DistilBert,
    /// MPNet: BERT layers with a relative position bias, RoBERTa-style positions.
    Mpnet,
    /// ModernBERT: pre-LN, RoPE, alternating global/local attention, GeGLU.
    ModernBert,
    /// Alibaba GTE (`GteModel`, hub `NewModel`): post-LN, RoPE, gated MLP.
    Gte,
    /// Qwen2 decoders (gte-Qwen2, …): q/k/v biases.
    Qwen2,
    /// Qwen3 decoders (Qwen3-Embedding, Qwen3-Reranker): q/k norms.
    Qwen3,
}

impl Family {
    fn detect(architecture: &str, model_type: &str) -> Option<Self> {
        let stem = architecture.split("For").next().unwrap_or(architecture).trim_end_matches("Model");
        match stem {
            "Bert" => Some(Family::Bert),
            "Roberta" | "XLMRoberta" | "Camembert" => Some(Family::Roberta),
            "Qwen2" => Some(Family::Qwen2),
            "Qwen3" => Some(Family::Qwen3),
            "DistilBert" => Some(Family::DistilBert),
            "MPNet" => Some(Family::Mpnet),
            "ModernBert" => Some(Family::ModernBert),
            "Gte" | "New" => Some(Family::Gte),
            _ => match model_type {
                "bert" => Some(Family::Bert),
                "roberta" | "xlm-roberta" | "camembert" => Some(Family::Roberta),
                "qwen2" => Some(Family::Qwen2),
                "qwen3" => Some(Family::Qwen3),
                "distilbert" => Some(Family::DistilBert),
                "mpnet" => Some(Family::Mpnet),
                "modernbert" => Some(Family::ModernBert),
                "gte" | "new" => Some(Family::Gte),
                _ => None,
            },
        }
    }

    /// Pooling when neither `--pooler-config` nor sentence-transformers files say: CLS for
    /// encoders, the last token for decoders (the only one that has seen the whole input).
    fn default_pooling(self) -> PoolingType {
        match self {
            Family::Bert | Family::Roberta | Family::DistilBert | Family::Mpnet | Family::ModernBert | Family::Gte => PoolingType::Cls,
            Family::Qwen2 | Family::Qwen3 => PoolingType::Last,
        }
    }

    pub fn is_decoder(self) -> bool {
        matches!(self, Family::Qwen2 | Family::Qwen3)
    }
}

/// Matryoshka support declared by config.json (or `--hf-overrides`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matryoshka {
    pub enabled: bool,
    /// The only dimensions allowed, when the model lists them.
    pub dimensions: Option<Vec<usize>>,
}

/// The Qwen3-Reranker prompt: a (query, document) pair becomes one chat-formatted text whose
/// last token the model judges ("yes" / "no"). Built for Qwen3 one-label classifiers, whose
/// reference usage always wraps pairs this way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankTemplate {
    pub system: String,
    pub instruction: String,
}

impl Default for RerankTemplate {
    fn default() -> Self {
        RerankTemplate {
            system: "Judge whether the Document meets the requirements based on the Query and the Instruct provided. \
                     Note that the answer can only be \"yes\" or \"no\"."
                .into(),
            instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
        }
    }
}

impl RerankTemplate {
    /// The prompt for one pair; `instruction` replaces the default task description.
    pub fn render(&self, query: &str, document: &str, instruction: Option<&str>) -> String {
        format!(
            "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n<Instruct>: {}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            self.system,
            instruction.unwrap_or(&self.instruction)
        )
    }
}

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
    pub fn resolve(&self, name: Option<&str>) -> Result<Option<String>, crate::engine::params::ParamsError> {
        match name {
            None => Ok(self.default.clone()),
            Some(name) => self.text(name).map(Some).ok_or_else(|| {
                crate::engine::params::ParamsError::new(
                    if self.named.is_empty() {
                        format!("Unknown prompt_name '{name}': the model defines no prompts")
                    } else {
                        format!("Unknown prompt_name '{name}'; the model's prompts are {}", self.names())
                    },
                    "prompt_name",
                )
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
    pub architecture: String,
    pub family: Family,
    /// config.json with `--hf-overrides` merged in.
    pub config: Value,
    /// Tasks in preference order; the first is the default for /pooling.
    pub tasks: Vec<Task>,
    pub pooling: PoolingType,
    pub max_model_len: usize,
    pub hidden_size: usize,
    /// Size of an embedding before any Matryoshka slice (after Dense layers).
    pub embedding_size: usize,
    pub matryoshka: Matryoshka,
    pub pooler_defaults: PoolerConfig,
    pub truncation_side: TruncationSide,
    /// Class names of a classifier, index = logit position; empty for other models.
    pub labels: Vec<String>,
    /// How `/score` and `/rerank` turn a pair into model input when it is not text + text_pair.
    pub rerank_template: Option<RerankTemplate>,
    /// sentence-transformers prompts and the default one.
    pub prompts: Prompts,
}

/// Shallow-merges `overrides` into config.json, as vLLM's `--hf-overrides` does.
pub fn apply_overrides(config: &mut Value, overrides: &serde_json::Map<String, Value>) {
    if let Value::Object(map) = config {
        for (k, v) in overrides {
            map.insert(k.clone(), v.clone());
        }
    }
}

/// Architecture name and family of a config.json.
pub fn architecture_of(config: &Value) -> Result<(String, Family), LoadError> {
    let architecture = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
    let family = Family::detect(&architecture, model_type).ok_or_else(|| {
        LoadError::Unsupported(format!(
            "architecture `{}` (model_type `{model_type}`); supported: {}",
            if architecture.is_empty() { "?" } else { &architecture },
            crate::models::SUPPORTED_ARCHITECTURES
        ))
    })?;
    Ok((architecture, family))
}

/// `classifier_from_token` of a converted causal LM (`--hf-overrides`), e.g. `["no", "yes"]`.
pub fn classifier_tokens(config: &Value) -> Option<Vec<String>> {
    let tokens = config.get("classifier_from_token")?.as_array()?;
    tokens.iter().map(|t| t.as_str().map(String::from)).collect()
}

/// Whether the config turns Qwen3-Reranker's yes/no logits into one score.
pub fn is_original_qwen3_reranker(config: &Value) -> bool {
    config.get("is_original_qwen3_reranker").and_then(Value::as_bool).unwrap_or(false)
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
    let classifier_tasks = || {
        let mut tasks = vec![Task::Classify];
        if hints.num_labels == 1 {
            tasks.push(Task::Score);
        }
        tasks
    };
    let masked_lm = architecture.ends_with("ForMaskedLM");
    match convert {
        Convert::Embed => Ok(embedder()),
        Convert::Auto if hints.sentence_pooling => Ok(embedder()),
        Convert::Auto | Convert::Classify if is_sequence_classifier(architecture) => Ok(classifier_tasks()),
        Convert::Auto | Convert::Classify if architecture.ends_with("ForTokenClassification") => Ok(vec![Task::TokenClassify]),
        Convert::Classify => Err(LoadError::Unsupported(format!(
            "--convert classify needs a `*ForSequenceClassification` or `*ForTokenClassification` checkpoint with classifier weights; `{architecture}` has none"
        ))),
        Convert::Auto if masked_lm && hints.pooling == Some(PoolingType::Splade) => Ok(vec![Task::EmbedSparse]),
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
        Some(n) if n > derived => Err(LoadError::Invalid(format!(
            "--max-model-len {n} is larger than the model's limit of {derived} tokens"
        ))),
        Some(n) => Ok(n),
        None => Ok(derived),
    }
}

impl Family {
    pub fn pooling(self, flag: Option<PoolingType>, sentence: Option<PoolingType>) -> PoolingType {
        flag.or(sentence).unwrap_or(self.default_pooling())
    }
}

impl ModelSpec {
    /// A minimal spec for unit tests of code that only reads a few fields.
    pub fn for_tests(embedding_size: usize, max_model_len: usize) -> Self {
        ModelSpec {
            served_name: "test-model".into(),
            root: "test-model".into(),
            architecture: "BertModel".into(),
            family: Family::Bert,
            config: Value::Null,
            tasks: vec![Task::Embed, Task::TokenEmbed],
            pooling: PoolingType::Mean,
            max_model_len,
            hidden_size: embedding_size,
            embedding_size,
            matryoshka: Matryoshka::default(),
            pooler_defaults: PoolerConfig::default(),
            truncation_side: TruncationSide::Right,
            labels: Vec::new(),
            rerank_template: None,
            prompts: Prompts::default(),
        }
    }

    pub fn supports(&self, task: Task) -> bool {
        self.tasks.contains(&task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn detects_families() {
        assert_eq!(architecture_of(&json!({"architectures": ["BertModel"]})).unwrap().1, Family::Bert);
        assert_eq!(architecture_of(&json!({"architectures": ["XLMRobertaModel"]})).unwrap().1, Family::Roberta);
        assert_eq!(architecture_of(&json!({"model_type": "roberta"})).unwrap().1, Family::Roberta);
        assert_eq!(architecture_of(&json!({"architectures": ["Qwen3ForCausalLM"]})).unwrap().1, Family::Qwen3);
        assert_eq!(architecture_of(&json!({"architectures": ["Qwen2Model"]})).unwrap().1, Family::Qwen2);
        let err = architecture_of(&json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})).unwrap_err();
        assert!(err.to_string().contains("LlamaForCausalLM"));
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
        assert_eq!(tasks_for("BertForSequenceClassification", Convert::Auto, labels(3)).unwrap(), vec![Task::Classify]);
        assert_eq!(tasks_for("XLMRobertaForSequenceClassification", Convert::Classify, labels(1)).unwrap(), vec![Task::Classify, Task::Score]);
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
        for architecture in ["MPNetForMaskedLM", "BertForPreTraining", "RobertaForCausalLM", "Qwen3ForCausalLM", "BertForSequenceClassification"] {
            assert_eq!(tasks_for(architecture, Convert::Auto, st).unwrap(), embed, "{architecture}");
        }
        assert_eq!(tasks_for("BertForSequenceClassification", Convert::Classify, TaskHints { sentence_pooling: true, num_labels: 1, ..Default::default() }).unwrap(), vec![Task::Classify, Task::Score]);
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
        assert_eq!(err.message, "Unknown prompt_name 'doc'; the model's prompts are ['passage', 'query']");
        assert_eq!(Prompts::new(named.clone(), Some("query"), Some("passage"), None).unwrap().default.as_deref(), Some("passage: "));
        assert_eq!(Prompts::new(named.clone(), Some("query"), None, Some("x: ")).unwrap().default.as_deref(), Some("x: "));
        assert!(Prompts::new(named.clone(), None, Some("nope"), None).unwrap_err().to_string().contains("['passage', 'query']"));
        assert!(Prompts::new(named, Some("nope"), None, None).is_err());
        assert_eq!(Prompts::new(Default::default(), None, None, None).unwrap().resolve(None).unwrap(), None);
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
