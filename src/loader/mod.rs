//! Loading a model: find its files ([`hub`]), read its sentence-transformers layout
//! ([`sentence`]), decide everything model-specific ([`spec`]), and build the backbone,
//! tokenizer and heads.

pub mod hub;
pub mod sentence;
pub mod spec;
pub mod tokenizer;

use crate::config::{DeviceArg, ServerConfig};
use tokenizer::TextTokenizer;
use crate::models::{self, Backbone, ModelError};
use crate::pooling::classifier::{ClassifierActivation, ClassifierHead, StepFilter};
use crate::pooling::PoolingType;
use crate::pooling::head::EmbeddingHead;
use crate::pooling::sparse::SparseHead;
use crate::pooling::Task;
use crate::loader::tokenizer::TruncationSide;
use candle_core::Device;
use candle_nn::VarBuilder;
use hub::ModelSource;
use sentence::SentenceTransformer;
use spec::{Family, ModelSpec, RerankTemplate};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    NotFound(String),
    #[error("hub: {0}")]
    Hub(String),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("device: {0}")]
    Device(String),
}

impl From<candle_core::Error> for LoadError {
    fn from(e: candle_core::Error) -> Self {
        LoadError::Model(ModelError::Weights(e))
    }
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::File { path: path.into(), message: e.to_string() })?;
    serde_json::from_str(&text).map_err(|e| LoadError::File { path: path.into(), message: e.to_string() })
}

/// Everything the engine runs.
pub struct LoadedModel {
    pub spec: ModelSpec,
    pub backbone: Box<dyn Backbone>,
    pub tokenizer: TextTokenizer,
    pub embedding_head: EmbeddingHead,
    /// Present when the model serves `classify` (and `score` as a cross-encoder) or
    /// `token_classify`.
    pub classifier: Option<ClassifierHead>,
    /// Present when the model serves `embed_sparse` (SPLADE).
    pub sparse_head: Option<SparseHead>,
    /// Where the backbone runs.
    pub device: Device,
}

fn device(kind: DeviceArg) -> Result<Device, LoadError> {
    match kind {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda => Device::new_cuda(0).map_err(|e| LoadError::Device(e.to_string())),
        DeviceArg::Metal => Device::new_metal(0).map_err(|e| LoadError::Device(e.to_string())),
    }
}

/// Weight files: one `model.safetensors`, or the shards a `model.safetensors.index.json` names.
fn weight_files(source: &ModelSource) -> Result<Vec<PathBuf>, LoadError> {
    if let Some(p) = source.file("model.safetensors")? {
        return Ok(vec![p]);
    }
    if let Some(index) = source.file("model.safetensors.index.json")? {
        let index: serde_json::Value = read_json(&index)?;
        let mut shards: Vec<String> = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .map(|m| m.values().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default();
        shards.sort();
        shards.dedup();
        return shards.iter().map(|s| source.required(s)).collect();
    }
    Err(LoadError::Unsupported("no model.safetensors (PyTorch .bin weights are not supported)".into()))
}

pub fn load(config: &ServerConfig) -> Result<LoadedModel, LoadError> {
    let source = ModelSource::resolve(&config.model, config.revision.as_deref())?;
    let mut raw: serde_json::Value = read_json(&source.required("config.json")?)?;
    spec::apply_overrides(&mut raw, &config.hf_overrides);
    let (architecture, family) = spec::architecture_of(&raw)?;
    let num_labels = spec::num_labels_of(&raw);
    let sentence = SentenceTransformer::read(&source)?;
    let hints = spec::TaskHints {
        num_labels,
        pooling: config.pooler.pooling_type.or(sentence.pooling),
        multi_vector: sentence.multi_vector,
        sentence_pooling: sentence.pooling_module,
    };
    let tasks = spec::tasks_for(&architecture, config.convert, hints)?;

    let tokenizer_config: serde_json::Value = match source.file("tokenizer_config.json")? {
        Some(p) => read_json(&p)?,
        None => serde_json::Value::Null,
    };
    let truncation_side = match tokenizer_config.get("truncation_side").and_then(|v| v.as_str()) {
        Some("left") => TruncationSide::Left,
        _ => TruncationSide::Right,
    };
    let tokenizer = TextTokenizer::from_file(
        &source.required("tokenizer.json")?,
        sentence.do_lower_case,
        uses_token_type_ids(&tokenizer_config, &raw),
    )?;

    let device = device(config.device)?;
    let files = weight_files(&source)?;
    // SAFETY: the weight files are memory-mapped read-only and must not change while we run,
    // the same contract as every safetensors loader.
    let dtype = config.dtype.dtype_on(config.device);
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, &device)? };
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        match models::ops::cuda::self_check(&device, dtype) {
            Ok(()) => tracing::info!("CUDA kernels checked against candle's ops in {dtype:?}"),
            Err(problem) => tracing::error!("CUDA kernel self-check failed ({problem}): running on candle's composite ops instead, slower"),
        }
    }

    let mut spec = ModelSpec {
        served_name: config.served_model_name.clone(),
        root: config.model.clone(),
        architecture,
        family,
        matryoshka: spec::matryoshka_of(&raw),
        config: raw,
        tasks,
        pooling: family.pooling(config.pooler.pooling_type, sentence.pooling),
        max_model_len: 0,
        hidden_size: 0,
        embedding_size: 0,
        pooler_defaults: config.pooler.clone(),
        truncation_side,
        labels: Vec::new(),
        rerank_template: None,
        prompts: spec::Prompts::new(
            sentence.prompts.clone(),
            sentence.default_prompt_name.as_deref(),
            config.default_prompt_name.as_deref(),
            config.default_prompt.as_deref(),
        )?,
    };
    let mut backbone = models::load_backbone(&spec, vb.clone(), &device)?;
    if config.quantization.is_some() {
        models::quantize_int8(backbone.as_mut()).map_err(ModelError::Weights)?;
        if !models::ops::int8::accelerated() {
            tracing::warn!("--quantization int8: this CPU has no AVX2; the portable int8 kernel is slower than float32");
        }
    }
    spec.max_model_len = spec::max_model_len(config.max_model_len, sentence.max_seq_length, backbone.max_positions())?;
    spec.hidden_size = backbone.hidden_size();
    // Dense layers must chain from the hidden size; a mismatch would only surface per request.
    let mut width = spec.hidden_size;
    for (i, dense) in sentence.dense.iter().enumerate() {
        if dense.linear.in_features() != width {
            return Err(LoadError::Invalid(format!(
                "Dense module {i} takes {} features but receives {width}",
                dense.linear.in_features()
            )));
        }
        width = dense.linear.out_features();
    }
    if config.pooler.pooling_type == Some(PoolingType::Step) && !spec.supports(Task::TokenClassify) {
        return Err(LoadError::Unsupported("STEP pooling needs a token-classification model (`*ForTokenClassification`)".into()));
    }
    if spec.supports(Task::Embed) && spec.pooling.is_token_level() {
        return Err(LoadError::Unsupported(format!(
            "pooling_type {:?} gives one vector per token; embeddings need CLS, MEAN or LAST",
            spec.pooling
        )));
    }
    let classifier = if spec.supports(Task::Classify) {
        spec.labels = match spec::classifier_tokens(&spec.config) {
            Some(tokens) if num_labels == tokens.len() => tokens,
            _ => spec::labels_of(&spec.config, num_labels),
        };
        let from_tokens = classifier_token_ids(&spec.config, &tokenizer)?;
        let parts = models::load_classifier(&spec, vb.clone(), num_labels, from_tokens.as_deref())?;
        if spec.family == Family::Qwen3 && num_labels == 1 {
            let mut template = RerankTemplate::default();
            if let Some(instruction) = &config.reranker_instruction {
                template.instruction = instruction.clone();
            }
            spec.rerank_template = Some(template);
        }
        Some(ClassifierHead {
            step: None,
            pooling: parts.pooling,
            pooler: parts.pooler,
            classifier: parts.classifier,
            logit_bias: config.pooler.logit_bias.map(|b| b as f32),
            classify_activation: ClassifierActivation::for_classification(&spec.config, num_labels),
            score_activation: ClassifierActivation::for_scoring(&spec.config, num_labels),
        })
    } else if spec.supports(Task::TokenClassify) {
        spec.labels = spec::labels_of(&spec.config, num_labels);
        let parts = models::load_token_classifier(&spec, vb.clone(), num_labels, spec.hidden_size)?;
        let step = (config.pooler.pooling_type == Some(PoolingType::Step)).then(|| StepFilter {
            step_tag_id: config.pooler.step_tag_id,
            columns: config.pooler.returned_token_ids.as_ref().map(|ids| ids.iter().map(|&i| i as usize).collect()),
        });
        if let Some(bad) = step.as_ref().and_then(|s| s.columns.as_ref()).and_then(|c| c.iter().find(|&&c| c >= num_labels)) {
            return Err(LoadError::Invalid(format!("returned_token_ids: {bad} is not one of the model's {num_labels} labels")));
        }
        Some(ClassifierHead {
            step,
            pooling: parts.pooling,
            pooler: parts.pooler,
            classifier: parts.classifier,
            logit_bias: config.pooler.logit_bias.map(|b| b as f32),
            classify_activation: ClassifierActivation::for_classification(&spec.config, num_labels),
            score_activation: ClassifierActivation::for_classification(&spec.config, num_labels),
        })
    } else {
        None
    };
    let sparse_head = if spec.supports(Task::EmbedSparse) { Some(models::load_sparse_head(&spec, vb)?) } else { None };
    let embedding_head = EmbeddingHead { dense: sentence.dense };
    spec.embedding_size = embedding_head.output_size(spec.hidden_size);
    Ok(LoadedModel { spec, backbone, tokenizer, embedding_head, classifier, sparse_head, device })
}

/// The vocabulary ids of `classifier_from_token`; each must be a single token.
fn classifier_token_ids(config: &serde_json::Value, tokenizer: &TextTokenizer) -> Result<Option<Vec<u32>>, LoadError> {
    let Some(tokens) = spec::classifier_tokens(config) else { return Ok(None) };
    let ids = tokens
        .iter()
        .map(|t| {
            tokenizer
                .token_id(t)
                .ok_or_else(|| LoadError::Invalid(format!("classifier_from_token `{t}` is not a single token of the vocabulary")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(ids))
}

/// Whether pairs keep the tokenizer's segment ids (0/1): when `tokenizer_config.json` lists
/// `token_type_ids` among the model inputs (BERT does, RoBERTa and XLM-R do not), or, without
/// that list, when the model has more than one token type.
fn uses_token_type_ids(tokenizer_config: &serde_json::Value, config: &serde_json::Value) -> bool {
    match tokenizer_config.get("model_input_names").and_then(|v| v.as_array()) {
        Some(names) => names.iter().any(|n| n == "token_type_ids"),
        None => config.get("type_vocab_size").and_then(|v| v.as_u64()).unwrap_or(2) > 1,
    }
}
