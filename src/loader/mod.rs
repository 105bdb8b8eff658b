//! Loading a model from its [`options`], at load time only: find its files ([`hub`]), read its
//! sentence-transformers layout ([`sentence`]), build the backbone through its architecture
//! (`models::ARCHITECTURES`), decide everything model-specific once ([`model_spec`]), then build the
//! input layer's pieces from the folder (tokenizer, chat template, image processor config; they
//! live in [`crate::input`], which runs them per request) and the heads the spec's tasks need.

pub mod auto_dtype;
pub mod hub;
pub mod lora;
mod mapped;
mod media;
pub mod model_spec;
pub mod options;
pub mod sentence;

use crate::input::chat_template::{self, ChatError, ChatTemplate};
use crate::input::image;
use crate::input::sentencepiece;
use crate::input::tokenizer::{self, TextTokenizer, TokenizeError};
use crate::kernels::{with_cpu_weight_format, WeightFormat};
use crate::models::bge_m3::{self, M3Weights};
use crate::models::{self, Backbone, ModelError};
use crate::pooling::classifier::ClassifierHead;
use crate::pooling::embedding_head::{Dense, DenseActivation, EmbeddingHead};
use crate::pooling::instruction::InstructionSpan;
use crate::pooling::m3::M3Head;
use crate::pooling::next_token::NextTokenHead;
use crate::pooling::sparse::SparseHead;
use crate::pooling::Task;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use hub::ModelSource;
use model_spec::{ModelSpec, SpecInputs};
use options::{DeviceArg, ModelOptions};
use sentence::SentenceTransformer;
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
    /// No PEFT adapter at the path (vLLM answers 404).
    #[error("Loading lora {name} failed: No adapter found for {path}")]
    AdapterNotFound { name: String, path: String },
    /// A LoRA adapter this server cannot apply, or a broken adapter file; the message names it.
    #[error("{0}")]
    Adapter(String),
    /// Options that cannot work together, in the words of the flag that set them.
    #[error("{0}")]
    Options(String),
}

impl From<TokenizeError> for LoadError {
    fn from(e: TokenizeError) -> Self {
        match e {
            TokenizeError::Failed(message) => LoadError::Tokenizer(message),
            other => LoadError::Tokenizer(other.to_string()),
        }
    }
}

impl From<ChatError> for LoadError {
    fn from(e: ChatError) -> Self {
        LoadError::Invalid(e.0)
    }
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
    /// BGE-M3's sparse and ColBERT heads (`sparse_linear.pt`, `colbert_linear.pt`).
    pub m3_head: Option<M3Head>,
    /// A causal LM's head, with `--runner generate`.
    pub next_token: Option<NextTokenHead>,
    /// GritLM's instruction span, which `embed` leaves out of its mean.
    pub instruction: Option<InstructionSpan>,
    /// Where the backbone runs.
    pub device: Device,
    /// The image tower and its processor, for image-text models (CLIP, SigLIP).
    pub vision: Option<VisionInput>,
    /// The audio tower and its feature extractor, for models that read audio (EmbeddingGemma 2).
    pub audio: Option<AudioInput>,
    /// How a visual retrieval model frames its queries and images (ColPali's processor).
    pub retrieval: Option<models::RetrievalPrompts>,
    /// How `messages` become text (`--chat-template`, else the folder's template).
    pub chat_template: ChatTemplate,
    /// The adapters it serves, with `--enable-lora`.
    pub lora: Option<lora::LoraRegistry>,
    /// What names the model's file in `--cache-dir` ([`identity_of`]).
    pub identity: String,
}

/// An image-text model's image side: its tower and how images become what the tower takes.
pub enum VisionInput {
    /// CLIP and SigLIP: an image is a sequence of its own in the tower and gets its own
    /// embedding.
    Pooled { tower: Box<dyn models::VisionTower>, processor: image::ImageProcessorConfig },
    /// EmbeddingGemma 2: an image, or each sampled frame of a video, becomes soft tokens
    /// inside the text sequence.
    SoftTokens {
        tower: Box<dyn models::SoftTokenTower>,
        patches: image::patches::PatchConfig,
        /// The processor's `video_processor`, when the tower reads video frames.
        video: Option<crate::input::video::VideoConfig>,
    },
    /// ColPali: an image is resized to the tower's square and becomes a fixed number of soft
    /// tokens inside the text sequence.
    Page { tower: Box<dyn models::CropTokenTower>, processor: image::ImageProcessorConfig },
}

/// A model's audio side: its tower, and the log-mel features it takes.
pub struct AudioInput {
    pub tower: Box<dyn models::AudioTokenTower>,
    pub features: crate::input::audio::LogMelConfig,
}

fn device(kind: DeviceArg) -> Result<Device, LoadError> {
    match kind {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda => Device::new_cuda(0).map_err(|e| LoadError::Device(e.to_string())),
        DeviceArg::Metal => Device::new_metal(0).map_err(|e| LoadError::Device(e.to_string())),
    }
}

/// Where a folder keeps its weights.
enum WeightFiles {
    /// `model.safetensors`, or the shards a `model.safetensors.index.json` names: memory-mapped.
    Safetensors(Vec<PathBuf>),
    /// One `pytorch_model.bin` (the zip format `torch.save` writes since PyTorch 1.6), for
    /// folders published without safetensors (BAAI/bge-m3, microsoft/deberta-v3-*): read through
    /// candle's pickle reader, each tensor when it is loaded; not memory-mapped.
    Pytorch(PathBuf),
}

/// The folder's weights: safetensors when it has them (one `model.safetensors`, or the shards
/// a `model.safetensors.index.json` names), else a single `pytorch_model.bin`.
fn weight_files(source: &ModelSource) -> Result<WeightFiles, LoadError> {
    if let Some(p) = source.file("model.safetensors")? {
        return Ok(WeightFiles::Safetensors(vec![p]));
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
        return Ok(WeightFiles::Safetensors(shards.iter().map(|s| source.required(s)).collect::<Result<_, _>>()?));
    }
    if let Some(p) = source.file("pytorch_model.bin")? {
        return Ok(WeightFiles::Pytorch(p));
    }
    if source.file("pytorch_model.bin.index.json")?.is_some() {
        return Err(LoadError::Unsupported(
            "sharded PyTorch .bin weights are not supported: convert them to safetensors (transformers' save_pretrained does)".into(),
        ));
    }
    Err(LoadError::NotFound("the model has no model.safetensors or pytorch_model.bin".into()))
}

/// The bytes of a local model folder's weights: the backbone's files (as the load picks them)
/// and the `model.safetensors` or `pytorch_model.bin` of each sentence-transformers module in a
/// sub-folder (`2_Dense/`). What a model on demand counts against `--max-loaded-memory`: its
/// weights as the checkpoint stores them, a bound rather than a measure of what it will take
/// (float32 weights running in bfloat16 or int8 take a half or a quarter; the input layer,
/// threads and activations add tens of MiB). 0 for a folder without weights (its load fails).
pub fn weight_bytes(dir: &Path) -> u64 {
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let backbone: u64 = match weight_files(&ModelSource::Local(dir.to_path_buf())) {
        Ok(WeightFiles::Safetensors(files)) => files.iter().map(|f| size(f)).sum(),
        Ok(WeightFiles::Pytorch(file)) => size(&file),
        Err(_) => 0,
    };
    let modules: u64 = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .map(|entry| {
            let safetensors = size(&entry.path().join("model.safetensors"));
            if safetensors > 0 {
                safetensors
            } else {
                size(&entry.path().join("pytorch_model.bin"))
            }
        })
        .sum();
    backbone + modules
}

/// Loads the model `options` names: its files, its backbone and image tower, the decisions of
/// its spec, its tokenizer and chat template, and the heads and adapters its tasks need.
pub fn load(options: &ModelOptions) -> Result<LoadedModel, LoadError> {
    let source = ModelSource::resolve(&options.source, options.revision.as_deref(), options.hub_token.as_ref())?;
    let mut config: serde_json::Value = read_json(&source.required("config.json")?)?;
    model_spec::apply_overrides(&mut config, &options.hf_overrides);
    let (architecture_name, architecture) = model_spec::architecture_of(&config)?;
    let mut sentence = SentenceTransformer::read(&source, options.dense_path.as_deref())?;
    let tokenizer_config: serde_json::Value = source.file("tokenizer_config.json")?.map(|p| read_json(&p)).transpose()?.unwrap_or_default();

    let device = device(options.device)?;
    let adapter_folders = architecture.adapter_folders(&config);
    let merged_folder =
        adapter_folders.as_ref().and_then(|f| f.tasks.iter().find(|(task, _)| *task == f.merged)).map(|(_, folder)| folder.as_str());
    let (vb, cpu_weight_format) = open_weights(&source, options, &device, merged_folder)?;
    let probe_vb = vb.clone();
    let mut backbone = with_cpu_weight_format(cpu_weight_format, || architecture.backbone(&config, vb.clone()))?;
    if cpu_weight_format == WeightFormat::Bf16 {
        backbone = Box::new(models::Bf16Backbone(backbone));
    }
    if options.quantization.is_some() {
        let takes_adapters = options.lora.is_some() || architecture.has_task_adapters(&config);
        models::quantize_int8(backbone.as_mut(), takes_adapters).map_err(ModelError::Weights)?;
        if !crate::kernels::int8::accelerated() {
            tracing::warn!("--quantization int8: this CPU has no AVX2; the portable int8 kernel is slower than float32");
        }
    }

    let m3_weights = bge_m3_heads(&source, &architecture_name, backbone.hidden_size())?;
    if sentence.dense.is_empty() && (sentence.multi_vector || models::is_colbert_name(&architecture_name)) {
        sentence.dense.extend(colbert_projection(&vb, backbone.hidden_size())?);
    }
    let media::Media { vision, retrieval, audio } =
        media::towers(&source, &config, architecture, (&vb, cpu_weight_format), &tokenizer_config, backbone.hidden_size())?;
    let mut spec = ModelSpec::decide(SpecInputs {
        options,
        config: &config,
        architecture_name,
        architecture,
        sentence: &sentence,
        tokenizer_config: &tokenizer_config,
        hidden_size: backbone.hidden_size(),
        max_positions: backbone.max_positions(),
        vision: vision.is_some(),
        m3: m3_weights.is_some(),
        dtype: match cpu_weight_format {
            WeightFormat::Bf16 => DType::BF16,
            _ => vb.dtype(),
        },
        tokenizer_dir: source.file("tokenizer.json")?.and_then(|p| p.parent().map(std::path::Path::to_path_buf)),
    })?;
    let pad_token = tokenizer::special_token(&tokenizer_config, "pad_token");
    let tokenizer = text_tokenizer(&source, &tokenizer_config, &spec)?.with_pad_token(pad_token.as_deref());

    let m3_head = m3_weights.map(|weights| {
        let id = |name: &str| tokenizer::special_token(&tokenizer_config, name).and_then(|t| tokenizer.token_id(&t));
        let unused = ["cls_token", "eos_token", "pad_token", "unk_token"].into_iter().filter_map(id).collect();
        M3Head { weights, unused, bos: id("cls_token").or_else(|| id("bos_token")), eos: id("eos_token") }
    });
    let calibration = (spec.pooler_defaults.logit_bias.map(|b| b as f32), spec.pooler_defaults.logit_sigma.map(|s| s as f32));
    let classifier_source = classifier_source(&spec, &config, architecture, &tokenizer, calibration, vb.clone())?;
    let classifier = classifier_source.as_ref().map(lora::ClassifierSource::base_head).transpose()?;
    let lora = lora_registry(
        options,
        architecture,
        &config,
        backbone.as_mut(),
        classifier_source,
        vb.clone(),
        (&source, adapter_folders.as_ref()),
    )?;
    let instruction = instruction_span(architecture, &tokenizer)?;
    let next_token = match spec.generates {
        true => Some(NextTokenHead::new(
            architecture.lm_head(&config, vb.clone()).map_err(|e| LoadError::Unsupported(format!("--runner generate: {e}")))?,
        )),
        false => None,
    };
    let sparse_head = if spec.supports(Task::EmbedSparse) && !spec.m3 {
        Some(SparseHead { lm: architecture.masked_lm_head(&config, vb)? })
    } else {
        None
    };
    let embedding_head = EmbeddingHead { dense: sentence.dense, int8: architecture.pooled_int8(&config) };
    let chat_template = chat_template_of(options, &source, &tokenizer_config)?;
    if options.dtype == options::DTypeArg::Auto && device.is_cpu() && cpu_weight_format == WeightFormat::F32 {
        let kept_in_f32 = [
            (options.quantization.is_some(), "--quantization int8 keeps the linears it leaves alone in float32"),
            (lora.is_some(), "the probe does not cover LoRA adapters"),
            (vision.is_some() || audio.is_some(), "the probe does not cover image or audio towers"),
            (classifier.is_some(), "its outputs are scores, held to 1e-4, which bf16 moves by up to 2.5e-3"),
            (sparse_head.is_some() || m3_head.is_some(), "its sparse weights are scores, which bf16 moves"),
            (next_token.is_some(), "--runner generate's scores are probabilities, which bf16 moves"),
        ];
        let bf16 =
            || -> Result<Box<dyn Backbone>, LoadError> { Ok(Box::new(models::Bf16Backbone(architecture.backbone(&config, probe_vb)?))) };
        let outcome = auto_cpu_dtype(&kept_in_f32, &source, |kernel| {
            auto_dtype::probe(backbone.as_ref(), bf16, &tokenizer, spec.max_model_len, kernel)
        })?;
        if let Some(bf16) = outcome.backbone {
            backbone = bf16;
            spec.dtype = "bfloat16";
        }
        tracing::info!(model = %options.served_name, "--dtype auto: {}", outcome.reason);
        spec.dtype_reason = Some(outcome.reason);
    }
    let identity = format!("{}\nruns in {}", identity_of(options, &source), spec.dtype);
    Ok(LoadedModel {
        spec,
        backbone,
        tokenizer,
        embedding_head,
        classifier,
        sparse_head,
        m3_head,
        next_token,
        instruction,
        device,
        vision,
        audio,
        retrieval,
        chat_template,
        lora,
        identity,
    })
}

/// `--dtype auto` for a float32 model on the CPU ([`auto_dtype`]): float32 for the first reason
/// in `kept_in_f32` that holds, on a CPU without native bf16 products, or where the memory
/// available holds no bf16 copy for the probe (the weight files are read only then); else what
/// `probe` finds with the CPU's bf16 kernel.
fn auto_cpu_dtype(
    kept_in_f32: &[(bool, &str)],
    source: &ModelSource,
    probe: impl FnOnce(&str) -> Result<auto_dtype::Outcome, LoadError>,
) -> Result<auto_dtype::Outcome, LoadError> {
    let float32 = |why: &str| Ok(auto_dtype::Outcome { backbone: None, reason: format!("float32: {why}") });
    if let Some((_, why)) = kept_in_f32.iter().find(|(kept, _)| *kept) {
        return float32(why);
    }
    let Some(kernel) = crate::kernels::native_bf16() else {
        return float32("this CPU has no native bf16 products (AMX or AVX-512 BF16)");
    };
    if !room_for_a_bf16_copy(source)? {
        return float32("the memory available holds no bf16 copy for the probe");
    }
    probe(kernel)
}

/// Whether the memory available holds a bf16 copy of the weights beside the float32 ones (at most
/// half their float32 size: the weight files' bytes, whatever dtype they store) with a fifth to
/// spare: `--dtype auto`'s probe builds one before it drops either.
fn room_for_a_bf16_copy(source: &ModelSource) -> Result<bool, LoadError> {
    let files = match weight_files(source)? {
        WeightFiles::Safetensors(files) => files,
        WeightFiles::Pytorch(file) => vec![file],
    };
    let bytes: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    Ok(mapped::available_memory().is_none_or(|available| bytes.saturating_add(bytes / 4) < available))
}

/// The options a model was loaded with and, for a local folder, its files' sizes and times:
/// outputs cached on disk for one identity are never read back for another (a model folder
/// replaced in place, another dtype or quantization).
fn identity_of(options: &ModelOptions, source: &ModelSource) -> String {
    let mut identity = format!("{options:?}");
    if let ModelSource::Local(dir) = source {
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let meta = entry.metadata().ok()?;
                let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
                Some(format!("{:?} {} {}", entry.file_name(), meta.len(), modified.as_nanos()))
            })
            .collect();
        files.sort();
        identity.extend(files.iter().map(|f| format!("\n{f}")));
    }
    identity
}

/// Where an instruction-following embedder's instruction ends in its prompt (its tokenizer's
/// pieces of the pattern), for the architectures that embed only what follows it.
fn instruction_span(architecture: &dyn models::Architecture, tokenizer: &TextTokenizer) -> Result<Option<InstructionSpan>, LoadError> {
    if !architecture.embeds_after_instruction() {
        return Ok(None);
    }
    InstructionSpan::from_pieces(|piece| tokenizer.token_id(piece)).map(Some).ok_or_else(|| {
        LoadError::Invalid(format!(
            "{}: the tokenizer lacks the pieces of its instruction pattern (<s>, ▁<, <, |, user, embed, >, <0x0A>)",
            architecture.name()
        ))
    })
}

/// The projection a ColBERT checkpoint keeps beside its backbone (Stanford's `HF_ColBERT`,
/// jina-colbert-v2: `linear.weight`; vLLM also looks for `colbert_linear.weight`), as vLLM
/// finds it when no sentence-transformers Dense module holds one: no bias, its width from the
/// weight.
fn colbert_projection(vb: &VarBuilder, hidden: usize) -> Result<Option<Dense>, LoadError> {
    let Some(name) = ["linear.weight", "colbert_linear.weight"].into_iter().find(|n| vb.contains_tensor(n)) else {
        return Ok(None);
    };
    let weight = vb.get_unchecked_dtype(name, candle_core::DType::F32)?.to_device(&Device::Cpu)?;
    match weight.dims() {
        [_, inputs] if *inputs == hidden => {}
        dims => return Err(LoadError::Invalid(format!("{name} has shape {dims:?}; the backbone gives {hidden} values per token"))),
    }
    Ok(Some(Dense { linear: crate::kernels::Linear::new(weight, None)?, activation: DenseActivation::Identity }))
}

/// The weights, as the architectures read them, and the format the CPU kernels pack dense
/// layers in: safetensors memory-mapped (`--dtype auto` on the CPU keeping half precision when
/// an f32 copy would not fit), else a `pytorch_model.bin`. With bfloat16 on the CPU, the
/// transformer's dense layers are packed in bf16 for the CPU kernels and everything else
/// (activations, norms, attention, heads) runs in f32 (see `crate::kernels::sgemm`).
/// `merged_adapter`: the folder of a task adapter merged into the weights as they load.
fn open_weights(
    source: &ModelSource,
    options: &ModelOptions,
    device: &Device,
    merged_adapter: Option<&str>,
) -> Result<(VarBuilder<'static>, WeightFormat), LoadError> {
    let mut dtype = options.dtype.dtype_on(options.device);
    let weights = match weight_files(source)? {
        WeightFiles::Safetensors(files) => {
            // SAFETY: the weight files are memory-mapped read-only and must not change while
            // we run, the same contract as every safetensors loader.
            let mut weights = unsafe { mapped::MappedWeights::open(&files)? };
            if let Some(folder) = merged_adapter {
                let deltas = lora::merged::deltas(source, folder, |name| weights.has(name))?;
                weights = weights.with_deltas(deltas);
            }
            if options.dtype == options::DTypeArg::Auto && device.is_cpu() {
                dtype = mapped::auto_cpu_dtype(&weights, &files, mapped::available_memory());
            }
            Ok(weights)
        }
        WeightFiles::Pytorch(_) if merged_adapter.is_some() => {
            return Err(LoadError::Unsupported("a task adapter is merged into safetensors weights only".into()))
        }
        WeightFiles::Pytorch(file) => Err(file),
    };
    let cpu_weight_format = if device.is_cpu() && dtype == DType::BF16 {
        dtype = DType::F32;
        WeightFormat::Bf16
    } else {
        WeightFormat::F32
    };
    let vb = match weights {
        Ok(weights) => VarBuilder::from_backend(Box::new(weights), dtype, device.clone()),
        Err(file) => VarBuilder::from_pth(&file, dtype, device)?,
    };
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        match crate::kernels::cuda::self_check(device, dtype) {
            Ok(()) => tracing::info!("CUDA kernels checked against candle's ops in {dtype:?}"),
            Err(problem) => tracing::error!("CUDA kernel self-check failed ({problem}): running on candle's composite ops instead, slower"),
        }
    }
    Ok((vb, cpu_weight_format))
}

/// The adapters the model serves: with `--enable-lora`, or its built-in task adapters
/// (jina-embeddings-v3's, and jina-embeddings-v5's adapter folders: `lora::merged`, served
/// without the flag), then the `--lora-modules` read at start.
fn lora_registry(
    options: &ModelOptions,
    architecture: &'static dyn models::Architecture,
    config: &serde_json::Value,
    backbone: &mut dyn Backbone,
    classifier_source: Option<lora::ClassifierSource>,
    vb: VarBuilder<'static>,
    (source, adapter_folders): (&ModelSource, Option<&models::AdapterFolders>),
) -> Result<Option<lora::LoraRegistry>, LoadError> {
    let lora_options = match (&options.lora, architecture.has_task_adapters(config)) {
        (Some(lora_options), _) => lora_options.clone(),
        (None, true) => lora::LoraOptions::default(),
        (None, false) => return Ok(None),
    };
    let sites = models::enable_lora(backbone);
    if sites.is_empty() {
        return Err(LoadError::Unsupported(format!("--enable-lora: LoRA adapters are not supported for {} yet", architecture.name())));
    }
    let mut tasks = architecture.task_adapters(config, vb, &sites)?;
    if let Some(folders) = adapter_folders {
        tasks.extend(lora::merged::task_adapters(source, folders, &sites)?);
    }
    let mut registry = lora::LoraRegistry::new(sites, classifier_source, &lora_options);
    for task in tasks {
        let adapter = registry.add_task(task)?;
        tracing::info!(model = %options.served_name, "task adapter `{}` (built in, rank {}, {} floats)", adapter.name, adapter.rank, adapter.floats);
    }
    for module in &lora_options.modules {
        let adapter = registry.load(&module.name, &module.path)?;
        tracing::info!(model = %options.served_name, "LoRA adapter `{}` loaded from {} (rank {}, {} floats)", adapter.name, adapter.path, adapter.rank, adapter.floats);
    }
    Ok(Some(registry))
}

/// How `messages` become text: `--chat-template`, else the folder's template.
fn chat_template_of(options: &ModelOptions, source: &ModelSource, tokenizer_config: &serde_json::Value) -> Result<ChatTemplate, LoadError> {
    let template = match &options.chat_template {
        Some(flag) => Some(chat_template::read_flag(flag)?),
        None => chat_template::from_folder(
            tokenizer_config,
            source.file("chat_template.jinja")?.as_deref(),
            source.file("chat_template.json")?.as_deref(),
        )?,
    };
    Ok(ChatTemplate::new(template, tokenizer_config, options.chat_template_content_format)?)
}

/// How the model's classifier head is built (`classify` / `score`, or `token_classify`), over
/// any weights: the folder's, or with a LoRA adapter's `modules_to_save` in place of some.
/// `None` for models without one.
fn classifier_source(
    spec: &ModelSpec,
    config: &serde_json::Value,
    architecture: &'static dyn models::Architecture,
    tokenizer: &TextTokenizer,
    calibration: (Option<f32>, Option<f32>),
    vb: VarBuilder<'static>,
) -> Result<Option<lora::ClassifierSource>, LoadError> {
    let sequence = spec.supports(Task::Classify);
    if spec.m3 || !(sequence || spec.supports(Task::TokenClassify)) {
        return Ok(None);
    }
    let from_tokens = match sequence {
        true => classifier_token_ids(spec.classifier_from_token.as_deref(), tokenizer)?,
        false => None,
    };
    let (config, num_labels, step) = (config.clone(), spec.num_labels, spec.step.clone());
    let (classify_activation, score_activation) = (spec.classify_activation, spec.score_activation);
    let build = move |vb: VarBuilder<'static>| -> Result<ClassifierHead, ModelError> {
        let weights = match sequence {
            true => architecture.classifier(&config, vb, num_labels, from_tokens.as_deref())?,
            false => architecture.token_classifier(&config, vb, num_labels)?,
        };
        Ok(ClassifierHead::new(weights, step.clone(), calibration, classify_activation, score_activation))
    };
    Ok(Some(lora::ClassifierSource { build: Box::new(build), base: vb }))
}

/// The folder's `tokenizer.json`, or for a DeBERTa-v2/v3 folder published without one, the
/// tokenizer transformers builds from its `spm.model`.
fn text_tokenizer(source: &ModelSource, tokenizer_config: &serde_json::Value, spec: &ModelSpec) -> Result<TextTokenizer, LoadError> {
    if let Some(path) = source.file("tokenizer.json")? {
        return Ok(TextTokenizer::from_file(&path, spec.lowercase, spec.segment_ids)?.with_llama_special_tokens(tokenizer_config)?);
    }
    let class = tokenizer_config.get("tokenizer_class").and_then(serde_json::Value::as_str).unwrap_or("");
    if class.trim_end_matches("Fast") == "DebertaV2Tokenizer" {
        if let Some(path) = source.file("spm.model")? {
            let bytes = std::fs::read(&path).map_err(|e| LoadError::File { path: path.clone(), message: e.to_string() })?;
            let document = sentencepiece::deberta_v2_tokenizer_json(&bytes, tokenizer_config)
                .map_err(|e| LoadError::File { path: path.clone(), message: e.to_string() })?;
            return Ok(TextTokenizer::from_json(&document, spec.lowercase, spec.segment_ids)?);
        }
    }
    Err(LoadError::NotFound("the model has no tokenizer.json (nor, for DeBERTa-v2/v3, spm.model)".into()))
}

/// BGE-M3's heads when the folder has both of its head files (or vLLM's architecture name asks
/// for them); one file without the other is an error, as is the name without them.
fn bge_m3_heads(source: &ModelSource, architecture: &str, hidden: usize) -> Result<Option<M3Weights>, LoadError> {
    let (sparse, colbert) = (source.file(bge_m3::SPARSE_FILE)?, source.file(bge_m3::COLBERT_FILE)?);
    match (sparse, colbert) {
        (Some(sparse), Some(colbert)) => Ok(Some(M3Weights::read(&sparse, &colbert, hidden)?)),
        (None, None) if architecture == bge_m3::VLLM_ARCHITECTURE => Err(LoadError::NotFound(format!(
            "{architecture} needs {} and {} beside the weights, as BAAI/bge-m3 ships them",
            bge_m3::SPARSE_FILE,
            bge_m3::COLBERT_FILE
        ))),
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(LoadError::NotFound(format!(
            "BGE-M3 needs both {} and {}; the folder has only one",
            bge_m3::SPARSE_FILE,
            bge_m3::COLBERT_FILE
        ))),
    }
}

/// The vocabulary ids of `classifier_from_token`; each must be a single token.
fn classifier_token_ids(tokens: Option<&[String]>, tokenizer: &TextTokenizer) -> Result<Option<Vec<u32>>, LoadError> {
    let Some(tokens) = tokens else { return Ok(None) };
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
