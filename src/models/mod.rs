//! Backbones: one architecture per file, all behind [`Backbone`].
//!
//! A backbone turns a flat [`Batch`] into final hidden states `[total_tokens, hidden]`.
//! Everything after that (pooling, heads) is architecture-independent and lives in `pooling/`.

pub mod batch;
pub mod bert;
pub mod distilbert;
pub mod gte;
pub mod modernbert;
pub mod mpnet;
pub mod ops;
pub mod qwen;

use batch::Batch;
use crate::loader::spec::{Family, ModelSpec};
use crate::pooling::classifier::PreClassifier;
use crate::pooling::method::{All, Cls, Last, LastNonPad, PoolingMethod};
use crate::pooling::sparse::SparseHead;
use ops::Linear;
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;

/// What the engine needs from a transformer body.
pub trait Backbone: Send {
    /// Final hidden states of every token of the batch, `[batch.num_tokens(), hidden_size]`.
    fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor>;
    fn hidden_size(&self) -> usize;
    /// Vocabulary size: token-id inputs at or above it are rejected before they reach the model.
    fn vocab_size(&self) -> usize;
    /// Longest sequence the position table allows.
    fn max_positions(&self) -> usize;
    /// What `--quantization int8` always converts: the attention output projection and the
    /// feed-forward layers of every block. Embeddings, norms, attention itself and the heads
    /// stay float32.
    fn int8_linears(&mut self) -> Vec<&mut Linear>;
    /// The fused Q/K/V projection of every block, which `--quantization int8` converts only
    /// where activations are quantized to 16 bits (the AVX2 kernel): their errors are amplified
    /// by the softmax. On all-MiniLM-L6-v2 with 16-bit activations, quantizing them too takes
    /// the worst cosine to float32 from 0.99962 to 0.99927 for 7% (32×128) to 14% (1×16) less
    /// time; with the VNNI kernels' 8-bit activations it was 0.9991 to 0.9980, so they stay f32.
    fn attention_input_linears(&mut self) -> Vec<&mut Linear>;
}

/// Quantizes the layers [`Backbone::int8_linears`] names (`--quantization int8`), and
/// [`Backbone::attention_input_linears`] where this CPU's int8 kernel keeps them accurate.
pub fn quantize_int8(backbone: &mut dyn Backbone) -> candle_core::Result<()> {
    if ops::int8::quantizes_attention_inputs() {
        backbone.attention_input_linears().into_iter().try_for_each(Linear::quantize_int8)?;
    }
    backbone.int8_linears().into_iter().try_for_each(Linear::quantize_int8)
}

/// Tokens per forward pass that keep a layer's activations (the intermediate layer is
/// 4·hidden floats per token) in the CPU's caches: a large batch runs as consecutive passes of
/// about this size. Sequences never attend across each other, so the result is identical;
/// measured on all-MiniLM-L6-v2, 32×128 tokens run 10-15% faster as 4 passes of 1024.
pub const FORWARD_CHUNK_TOKENS: usize = 1024;

/// Tokens per forward pass on `device`: [`FORWARD_CHUNK_TOKENS`] on the CPU; the whole batch
/// on a GPU, where larger products fill the device better and attention memory is linear.
pub fn forward_chunk_tokens(device: &Device) -> usize {
    if device.is_cpu() {
        FORWARD_CHUNK_TOKENS
    } else {
        usize::MAX
    }
}

/// Runs `batch` through `backbone` in cache-sized sub-batches; hidden states in batch order.
pub fn forward_chunked(backbone: &dyn Backbone, batch: &Batch, chunk_tokens: usize) -> candle_core::Result<Tensor> {
    if batch.num_tokens() <= chunk_tokens {
        return backbone.forward(batch);
    }
    let parts = batch.chunks(chunk_tokens).iter().map(|b| backbone.forward(b)).collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}

/// A candle error as one line: candle appends a backtrace when RUST_BACKTRACE is set, which
/// must not reach clients or the one-line startup error.
pub fn describe(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Errors raised while building a backbone from its files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unsupported architecture `{0}` (supported: {1})")]
    Unsupported(String, &'static str),
    #[error("invalid config.json: {0}")]
    Config(String),
    #[error("weights: {0}")]
    Weights(#[from] candle_core::Error),
}

pub const SUPPORTED_ARCHITECTURES: &str = "BertModel, RobertaModel, XLMRobertaModel, DistilBertModel, MPNetModel, ModernBertModel, GteModel/NewModel, Qwen2Model, Qwen3Model (and their \
     sentence-transformers folders), Qwen2ForCausalLM, Qwen3ForCausalLM (as embedders), and the \
     *ForSequenceClassification of each";

/// A head weight as the heads use it: on the CPU, in f32 (heads run on the host's f32 rows).
pub(crate) fn on_host(t: Tensor) -> candle_core::Result<Tensor> {
    t.to_device(&Device::Cpu)?.to_dtype(candle_core::DType::F32)
}

/// The architecture-specific part of a classification head.
pub struct ClassifierParts {
    /// The layer before the classifier (BERT's pooler, RoBERTa's `classifier.dense`, …).
    pub pooler: Option<PreClassifier>,
    pub classifier: Linear,
    /// The token the head reads.
    pub pooling: Box<dyn PoolingMethod>,
}

/// The classifier layers of a `*ForSequenceClassification` checkpoint (or of a causal LM
/// converted with `classifier_from_token`, whose token ids `from_tokens` gives).
pub fn load_classifier(
    spec: &ModelSpec,
    vb: VarBuilder,
    num_labels: usize,
    from_tokens: Option<&[u32]>,
) -> Result<ClassifierParts, ModelError> {
    match spec.family {
        Family::Bert | Family::Roberta | Family::Mpnet => {
            let (pooler, classifier) = bert::load_classifier(&spec.config, spec.family, vb, num_labels)?;
            Ok(ClassifierParts { pooler: Some(PreClassifier::tanh(pooler)), classifier, pooling: Box::new(Cls) })
        }
        Family::DistilBert => {
            let (pooler, classifier) = distilbert::load_classifier(&spec.config, vb, num_labels)?;
            Ok(ClassifierParts { pooler: Some(pooler), classifier, pooling: Box::new(Cls) })
        }
        Family::ModernBert => {
            let (pooler, classifier, pooling) = modernbert::load_classifier(&spec.config, vb, num_labels)?;
            Ok(ClassifierParts { pooler: Some(pooler), classifier, pooling })
        }
        Family::Gte => Err(ModelError::Config("GTE classification heads are not supported yet".into())),
        Family::Qwen2 | Family::Qwen3 => {
            let classifier = qwen::load_classifier(&spec.config, vb, num_labels, from_tokens)?;
            let pad = spec.config.get("pad_token_id").and_then(|v| v.as_u64());
            let pooling: Box<dyn PoolingMethod> = match pad {
                Some(pad) if from_tokens.is_none() => Box::new(LastNonPad { pad_token_id: pad as u32 }),
                _ => Box::new(Last),
            };
            Ok(ClassifierParts { pooler: None, classifier, pooling })
        }
    }
}

/// The per-token classifier of a `*ForTokenClassification` checkpoint (`classifier`, applied to
/// every token's final hidden state).
pub fn load_token_classifier(spec: &ModelSpec, vb: VarBuilder, num_labels: usize, hidden: usize) -> Result<ClassifierParts, ModelError> {
    match spec.family {
        Family::Bert | Family::Roberta | Family::DistilBert | Family::Mpnet => {
            let head = vb.pp("classifier");
            let classifier = Linear::new(on_host(head.get((num_labels, hidden), "weight")?)?, Some(on_host(head.get(num_labels, "bias")?)?))?;
            Ok(ClassifierParts { pooler: None, classifier, pooling: Box::new(All) })
        }
        other => Err(ModelError::Config(format!("token classification heads for {other:?} are not supported yet"))),
    }
}

/// The masked-LM head that SPLADE pooling needs.
pub fn load_sparse_head(spec: &ModelSpec, vb: VarBuilder) -> Result<SparseHead, ModelError> {
    match spec.family {
        Family::Bert | Family::Roberta => bert::load_mlm_head(&spec.config, spec.family, vb),
        Family::DistilBert => distilbert::load_mlm_head(&spec.config, vb),
        other => Err(ModelError::Config(format!("SPLADE needs a masked-LM head; {other:?} models have none here"))),
    }
}

/// Builds the backbone that `spec.architecture` names.
pub fn load_backbone(spec: &ModelSpec, vb: VarBuilder, device: &Device) -> Result<Box<dyn Backbone>, ModelError> {
    let _ = device;
    match spec.family {
        Family::Bert | Family::Roberta => Ok(Box::new(bert::Bert::load(&spec.config, spec.family, vb)?)),
        Family::DistilBert => Ok(Box::new(distilbert::load(&spec.config, vb)?)),
        Family::Mpnet => Ok(Box::new(mpnet::load(&spec.config, vb)?)),
        Family::ModernBert => Ok(Box::new(modernbert::ModernBert::load(&spec.config, vb)?)),
        Family::Gte => Ok(Box::new(gte::Gte::load(&spec.config, vb)?)),
        Family::Qwen2 => Ok(Box::new(qwen::Qwen::load(&spec.config, qwen::QwenVersion::Qwen2, vb)?)),
        Family::Qwen3 => Ok(Box::new(qwen::Qwen::load(&spec.config, qwen::QwenVersion::Qwen3, vb)?)),
    }
}
