//! The model layer: transformer architectures on the flat padding-free [`Batch`], built from
//! the fused operations of [`crate::kernels`], the encoder most encoder families share
//! (`encoder`), and the weights of their task heads (`head_weights`). Depends only on
//! `kernels`.
//!
//! An architecture is one file (its config, detection, backbone and heads) implementing
//! [`Architecture`], registered by one line of [`ARCHITECTURES`]. A backbone turns a batch into
//! final hidden states `[total_tokens, hidden]`; what happens after (pooling, head math) is
//! architecture-independent and lives in `pooling/`.

pub mod batch;
pub mod bert;
pub mod bge_m3;
pub mod clip;
pub mod colmodernvbert;
pub mod colpali;
pub mod colqwen2;
pub mod colqwen3;
pub mod colqwen3_5;
pub mod deberta;
pub mod distilbert;
pub mod electra;
pub mod embedding_gemma2;
pub mod encoder;
pub mod gemma;
pub mod gemma4_audio;
pub mod gemma4_vision;
pub mod gte;
pub mod head_weights;
pub mod jina_bert;
pub mod jina_v3;
pub mod jina_v5;
pub mod lfm2;
pub mod llama;
pub mod modernbert;
pub mod mpnet;
pub mod nomic_bert;
pub mod qwen;
pub mod qwen2_vl;
pub mod qwen3_5;
pub mod qwen3_vl;
pub mod retrieval;
pub mod siglip;
pub mod weights;

use crate::kernels::Linear;
use batch::Batch;
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;
use head_weights::{ClassifierWeights, LmHeadWeights, MaskedLmHead, RerankTemplate};
use serde_json::Value;

/// Every architecture served, in detection order.
pub static ARCHITECTURES: &[&dyn Architecture] = &[
    &bert::BERT,
    &bert::ROBERTA,
    &bert::ERNIE,
    &distilbert::DISTILBERT,
    &electra::ELECTRA,
    &deberta::DEBERTA,
    &mpnet::MPNET,
    &modernbert::MODERNBERT,
    &gte::GTE,
    &nomic_bert::NOMIC_BERT,
    &jina_bert::JINA_BERT,
    &jina_v3::JINA_V3,
    &qwen::QWEN2,
    &qwen::QWEN3,
    &llama::LLAMA,
    &llama::MISTRAL,
    &llama::LLAMA_BIDIRECTIONAL,
    &llama::GRITLM,
    &jina_v5::JINA_V5,
    &lfm2::LFM2,
    &gemma::GEMMA,
    &gemma::GEMMA2,
    &gemma::GEMMA3,
    &embedding_gemma2::EMBEDDING_GEMMA2,
    &clip::CLIP,
    &siglip::SIGLIP,
    &colpali::COLPALI,
    &colqwen2::COLQWEN2,
    &colqwen3::COLQWEN3,
    &colqwen3_5::COLQWEN3_5,
    &colmodernvbert::COLMODERNVBERT,
    &qwen3_vl::QWEN3_VL,
];

/// The architecture serving a config.json: one that claims its fields, else the one of its
/// `architectures[0]` (by its stem), else of its `model_type`.
pub fn detect(config: &Value, architecture: &str, model_type: &str) -> Option<&'static dyn Architecture> {
    let stem = architecture.split("For").next().unwrap_or(architecture).trim_end_matches("Model");
    // vLLM's ColBERT names wrap their backbone's (`ColBERTModernBertModel`); `HF_ColBERT`
    // (Stanford's colbert-ir checkpoints) is BERT.
    let stem = if architecture == HF_COLBERT { "Bert" } else { stem.strip_prefix("ColBERT").unwrap_or(stem) };
    ARCHITECTURES
        .iter()
        .find(|a| a.claims(config))
        .or_else(|| ARCHITECTURES.iter().find(|a| a.architecture_stems().contains(&stem)))
        .or_else(|| ARCHITECTURES.iter().find(|a| a.model_types().contains(&model_type)))
        .copied()
}

/// The `architectures` entry of Stanford's ColBERT checkpoints (answerai-colbert-small-v1, …).
pub const HF_COLBERT: &str = "HF_ColBERT";

/// Whether `architectures[0]` names one of vLLM's ColBERT models (`HF_ColBERT`, and the
/// `ColBERT*Model` names its docs have users set with `--hf-overrides`): a multi-vector
/// retriever whatever its folder says.
pub fn is_colbert_name(architecture: &str) -> bool {
    architecture == HF_COLBERT || (architecture.starts_with("ColBERT") && architecture.len() > "ColBERT".len())
}

/// A model's task adapters as PEFT folders ([`Architecture::adapter_folders`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterFolders {
    /// The task merged into the weights at load: what a request without a task runs.
    pub merged: String,
    /// Every task and its folder, the merged one included, in the model's order.
    pub tasks: Vec<(String, String)>,
}

/// What the table serves, for the "unsupported architecture" message.
pub fn supported_architectures() -> String {
    let names: Vec<&str> = ARCHITECTURES.iter().map(|a| a.name()).collect();
    format!(
        "{} (base models and their sentence-transformers folders, *ForSequenceClassification, decoders' causal LMs as embedders, CLIPModel / SiglipModel image-text embedders, ColPali / ColQwen2 / ColQwen3 / ColQwen3.5 / ColModernVBert page retrievers, and Qwen3-VL as Qwen3-VL-Embedding or, converted, Qwen3-VL-Reranker)",
        names.join(", ")
    )
}

/// A backbone's sizes: what its final hidden states are wide, which token ids it takes, how long
/// a sequence may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackboneSizes {
    pub hidden: usize,
    pub vocab: usize,
    /// Longest sequence its positions allow (the position table's rows after any offset, or
    /// what a rotary or ALiBi checkpoint declares).
    pub max_positions: usize,
}

/// What the engine needs from a transformer body.
pub trait Backbone: Send + Sync {
    /// Final hidden states of every token of the batch, `[batch.num_tokens(), hidden_size]`.
    fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor>;
    fn sizes(&self) -> BackboneSizes;
    fn hidden_size(&self) -> usize {
        self.sizes().hidden
    }
    /// Vocabulary size: token-id inputs at or above it are rejected before they reach the model.
    fn vocab_size(&self) -> usize {
        self.sizes().vocab
    }
    /// Longest sequence the position table allows.
    fn max_positions(&self) -> usize {
        self.sizes().max_positions
    }
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

/// A backbone whose linears were packed in bf16 for the CPU kernels (`--dtype bfloat16`, or
/// what `--dtype auto`'s probe kept): its forward passes also run attention's two products in
/// bf16 on the native bf16 instructions (AMX tiles or AVX-512 BF16) where the linears run on
/// them ([`crate::kernels::with_bf16_tiles`]).
pub struct Bf16Backbone(pub Box<dyn Backbone>);

impl Backbone for Bf16Backbone {
    fn forward(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        crate::kernels::with_bf16_tiles(|| self.0.forward(batch))
    }
    fn sizes(&self) -> BackboneSizes {
        self.0.sizes()
    }
    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.0.int8_linears()
    }
    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.0.attention_input_linears()
    }
}

/// What the engine needs from an image tower (CLIP, SigLIP): images in, embeddings out.
pub trait VisionTower: Send + Sync {
    /// Embeddings `[images, embedding_size]` (f32) of `images` images, whose pixel values
    /// (`[3, size, size]` each, as the processor makes them) lie end to end in `pixels`.
    fn forward(&self, pixels: &[f32], images: usize) -> candle_core::Result<Tensor>;
    /// Height and width the tower takes.
    fn image_size(&self) -> usize;
    /// The sequence an image becomes (patches, plus a class token where there is one): what
    /// an image costs in a batch's token budget.
    fn tokens_per_image(&self) -> usize;
    fn embedding_size(&self) -> usize;
}

/// What the engine needs from an image tower whose output stands in for placeholder tokens of
/// the text sequence (EmbeddingGemma 2's Gemma 4 tower): an image becomes `<begin>
/// <placeholder>×n <end>` in the text, and the tower's `n` soft tokens replace the
/// placeholders' embeddings ([`batch::SoftTokens`]).
pub trait SoftTokenTower: Send + Sync {
    /// Each image's soft tokens, `[Σ soft tokens, text hidden]`, images in order.
    fn forward(&self, images: &[&gemma4_vision::ImagePatches]) -> candle_core::Result<Tensor>;
    /// Pixels per patch side, and patches per soft token side.
    fn patch_geometry(&self) -> (usize, usize);
    /// The token ids that frame an image in the text.
    fn image_tokens(&self) -> ImageTokens;
    /// The placeholder of a video frame's soft tokens (framed by the image's begin and end),
    /// for towers that also read video frames; `None` otherwise.
    fn video_token(&self) -> Option<u32> {
        None
    }
    /// Whether the backbone places an image's soft tokens by row and column (Qwen2-VL's
    /// M-RoPE): the engine then gives it each image's grid ([`batch::ImageGrid`]).
    fn places_soft_tokens(&self) -> bool {
        false
    }
}

/// What the engine needs from an image tower whose fixed-size crop becomes a fixed number of
/// soft tokens in the text (PaliGemma's SigLIP and projector, in ColPali): an image is
/// `placeholder×n` in the text ([`RetrievalPrompts`] frame it), and the tower's `n` rows
/// replace the placeholders' embeddings ([`batch::SoftTokens`]).
pub trait CropTokenTower: Send + Sync {
    /// Each image's soft tokens, `[images · tokens_per_image, text hidden]`, of `images`
    /// crops whose pixel values (`[3, size, size]` each, as the processor makes them) lie end
    /// to end in `pixels`.
    fn forward(&self, pixels: &[f32], images: usize) -> candle_core::Result<Tensor>;
    /// Height and width the tower takes.
    fn image_size(&self) -> usize;
    /// The soft tokens an image becomes.
    fn tokens_per_image(&self) -> usize;
    /// The patches the tower runs over for an image: its soft tokens, unless the tower folds
    /// several patches into one (ColModernVBert's pixel shuffle).
    fn patches_per_image(&self) -> usize {
        self.tokens_per_image()
    }
    /// The placeholder token their rows replace.
    fn placeholder(&self) -> u32;
}

/// How a visual retrieval model's processor frames its inputs as text, resolved to literal
/// strings (ColPali's `process_queries` and `process_images`): a text (a query) is
/// `query_prefix text query_suffix`, an image `image_prefix placeholder×n image_suffix` (with
/// Idefics3's frames, ColModernVBert's, the placeholders are the frames' text). Unless
/// `special_tokens`, the processor writes the special tokens itself and these texts are
/// tokenized without the tokenizer's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrievalPrompts {
    pub query_prefix: String,
    pub query_suffix: String,
    pub image_prefix: String,
    pub image_suffix: String,
    /// Whether a text and images may share one input (Qwen3-VL-Embedding's user turn): their
    /// parts are written one after another inside the frame. Otherwise an input is a text or
    /// one image (ColPali's processor takes one or the other).
    pub mixed: bool,
    /// Whether a text loses its leading and trailing whitespace before the frame (ColQwen3's
    /// processor strips its queries).
    pub strips_queries: bool,
    /// The frame's default instruction, where its prefixes hold `{instruction}`
    /// (Qwen3-VL-Embedding's system turn): a request's prompt replaces it there rather than
    /// standing before the text.
    pub instruction: Option<String>,
    /// Whether the tokenizer adds its own special tokens around the framed texts
    /// (ColModernVBert's processor calls its tokenizer with its defaults: `[CLS] … [SEP]`);
    /// otherwise the frame writes them (ColPali's `<bos>`).
    pub special_tokens: bool,
}

/// What the engine needs from an audio tower whose output stands in for placeholder tokens of
/// the text sequence (EmbeddingGemma 2's Gemma 4 audio tower): an audio becomes `<begin>
/// <placeholder>×n <end>` in the text, and the tower's `n` soft tokens replace them.
pub trait AudioTokenTower: Send + Sync {
    /// Each audio's soft tokens, `[Σ soft tokens, text hidden]`, audio in order; each audio
    /// is its real log-mel frames (`[frames, mel_bins]` values, and the frame count).
    fn forward(&self, audio: &[(&[f32], usize)]) -> candle_core::Result<Tensor>;
    /// Frames per soft token: an audio of `frames` frames becomes `⌈frames / this⌉` of them.
    fn frames_per_token(&self) -> usize;
    /// Whether the tower takes frames of `bins` mel bins (the feature extractor's
    /// `feature_size`).
    fn takes_mel_bins(&self, bins: usize) -> bool;
    /// The token ids that frame an audio in the text.
    fn audio_tokens(&self) -> ImageTokens;
}

/// The special tokens of an image (or an audio) in the text: `begin placeholder×n end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokens {
    pub begin: u32,
    pub placeholder: u32,
    pub end: u32,
}

/// Quantizes the layers [`Backbone::int8_linears`] names (`--quantization int8`), and
/// [`Backbone::attention_input_linears`] where this CPU's int8 kernel keeps them accurate and
/// no LoRA adapter can reach them (`takes_adapters`: `--enable-lora`, or built-in task
/// adapters). An adapter's changes to Q and K multiply the base's weight error in the
/// attention logits: on the bert-embed-cls fixture with its all-dense adapter, transformers
/// with those base weights quantized as ours are (exact activations, the adapter in float32)
/// falls to cosine 0.99841 of PEFT's merged model, 0.99975 with Q/K/V left in float32; without
/// the adapter both stay above 0.99993. Our AVX2 kernel gave 0.99842, so the arithmetic was
/// right and the layer choice was what fell below the int8 bar (0.999)
/// (tests/fixtures/int8_layer_choice.py measures it).
pub fn quantize_int8(backbone: &mut dyn Backbone, takes_adapters: bool) -> candle_core::Result<()> {
    if crate::kernels::int8::quantizes_attention_inputs() && !takes_adapters {
        backbone.attention_input_linears().into_iter().try_for_each(Linear::quantize_int8)?;
    }
    backbone.int8_linears().into_iter().try_for_each(Linear::quantize_int8)
}

/// Makes every named dense layer of `backbone` (those [`Backbone::attention_input_linears`]
/// and [`Backbone::int8_linears`] list, which the architecture named after its checkpoint
/// modules) a LoRA site, numbered in that order: what adapters for this model may reach.
pub fn enable_lora(backbone: &mut dyn Backbone) -> Vec<crate::kernels::lora::LoraSite> {
    let mut sites = Vec::new();
    let mut add = |layers: Vec<&mut Linear>| {
        for layer in layers.into_iter().filter(|l| !l.modules().is_empty()) {
            let (device, dtype) = layer.device_and_dtype();
            sites.push(crate::kernels::lora::LoraSite {
                parts: layer.modules().to_vec(),
                in_features: layer.in_features(),
                on_cpu_kernels: !layer.on_device(),
                device,
                dtype,
            });
            layer.set_lora_site(sites.len() - 1);
        }
    };
    add(backbone.attention_input_linears());
    add(backbone.int8_linears());
    sites
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
/// Each pass adds its sequences' LoRA adapters ([`crate::kernels::lora::with_segments`]).
pub fn forward_chunked(backbone: &dyn Backbone, batch: &Batch, chunk_tokens: usize) -> candle_core::Result<Tensor> {
    let forward = |b: &Batch| crate::kernels::lora::with_segments(b.num_tokens(), b.lora_segments(), || backbone.forward(b));
    if batch.num_tokens() <= chunk_tokens {
        return forward(batch);
    }
    let parts = batch.chunks(chunk_tokens).iter().map(forward).collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}

/// Runs `images` images through `tower` in cache-sized groups (about `chunk_tokens` tokens
/// each, as [`forward_chunked`] does for texts); embeddings in image order.
pub fn forward_images_chunked(tower: &dyn VisionTower, pixels: &[f32], images: usize, chunk_tokens: usize) -> candle_core::Result<Tensor> {
    in_groups(pixels, images, tower.tokens_per_image(), chunk_tokens, |p, n| tower.forward(p, n))
}

/// Runs `images` crops through a [`CropTokenTower`] in cache-sized groups, as
/// [`forward_images_chunked`]; their soft tokens in image order.
pub fn forward_crops_chunked(
    tower: &dyn CropTokenTower,
    pixels: &[f32],
    images: usize,
    chunk_tokens: usize,
) -> candle_core::Result<Tensor> {
    in_groups(pixels, images, tower.patches_per_image(), chunk_tokens, |p, n| tower.forward(p, n))
}

/// `forward` over groups of the `images` images laid end to end in `pixels`, about
/// `chunk_tokens` tower tokens a group; the outputs concatenated in image order.
fn in_groups(
    pixels: &[f32],
    images: usize,
    tokens_per_image: usize,
    chunk_tokens: usize,
    forward: impl Fn(&[f32], usize) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    let per_group = (chunk_tokens / tokens_per_image.max(1)).max(1);
    if images <= per_group {
        return forward(pixels, images);
    }
    let per_image = pixels.len() / images.max(1);
    let parts = pixels
        .chunks(per_group * per_image)
        .map(|group| forward(group, group.len() / per_image))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}

/// A candle error as one line: candle appends a backtrace when RUST_BACKTRACE is set, which
/// must not reach clients or the one-line startup error.
pub fn describe(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// The sentence-level pooling an architecture embeds with by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequencePooling {
    First,
    Last,
    Mean,
}

/// Errors raised while building a backbone or a head from its files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid config.json: {0}")]
    Config(String),
    /// The checkpoint asks for a head this architecture does not have here.
    #[error("{0}")]
    NoHead(String),
    #[error("weights: {0}")]
    Weights(#[from] candle_core::Error),
}

/// A config.json parsed into an architecture's own config type.
pub fn parse_config<T: serde::de::DeserializeOwned>(raw: &Value) -> Result<T, ModelError> {
    serde::Deserialize::deserialize(raw).map_err(|e| ModelError::Config(e.to_string()))
}

/// One architecture: which checkpoints it serves, its backbone, and the heads it has. Each
/// lives in its own file and is registered in [`ARCHITECTURES`]; a head it lacks is a
/// [`ModelError::NoHead`] naming it.
pub trait Architecture: Sync {
    /// How messages name it.
    fn name(&self) -> &'static str;
    /// The `architectures` entries it serves, by their stem (`BertForMaskedLM` → `Bert`,
    /// `NewModel` → `New`).
    fn architecture_stems(&self) -> &'static [&'static str];
    /// The `model_type`s it serves when `architectures` is missing or unknown.
    fn model_types(&self) -> &'static [&'static str];
    /// Whether the architecture recognises `config` by its fields, ahead of any name
    /// (jina-embeddings-v3 calls itself `XLMRobertaModel`).
    fn claims(&self, _config: &Value) -> bool {
        false
    }
    /// The model's built-in adapters on the backbone's LoRA `sites` (jina-embeddings-v3's
    /// tasks); none for most.
    fn task_adapters(
        &self,
        _config: &Value,
        _vb: VarBuilder,
        _sites: &[crate::kernels::lora::LoraSite],
    ) -> Result<Vec<crate::kernels::lora::TaskAdapter>, ModelError> {
        Ok(Vec::new())
    }
    /// Whether the model comes with built-in adapters (they are then served without
    /// `--enable-lora`).
    fn has_task_adapters(&self, _config: &Value) -> bool {
        false
    }
    /// How embeddings pool by default (without `--pooler-config` or a sentence-transformers
    /// Pooling module): encoders read the first token; decoders (causal attention) and the text
    /// towers of CLIP and SigLIP the last; JinaBERT averages, as it is published.
    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::First
    }
    /// Whether the architecture's `*ForMaskedLM` checkpoints are its published embedders
    /// (JinaBERT's are) rather than SPLADE candidates.
    fn masked_lm_embeds(&self) -> bool {
        false
    }
    /// Whether the pooled vector becomes int8 values before any normalization:
    /// `round(127 · tanh(x))`, pplx-embed-v1's output as TEI computes it.
    fn pooled_int8(&self, _config: &Value) -> bool {
        false
    }
    /// The text backbone (for CLIP and SigLIP, the text tower).
    fn backbone(&self, config: &Value, vb: VarBuilder) -> Result<Box<dyn Backbone>, ModelError>;
    /// The image tower of an image-text model; `None` for text-only architectures.
    fn vision_tower(&self, _config: &Value, _vb: VarBuilder) -> Result<Option<Box<dyn VisionTower>>, ModelError> {
        Ok(None)
    }
    /// The image tower of a model that reads images as soft tokens in its text
    /// ([`SoftTokenTower`]); `None` for the others.
    fn soft_token_tower(&self, _config: &Value, _vb: VarBuilder) -> Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        Ok(None)
    }
    /// The image tower of a model whose fixed-size crops become soft tokens in its text
    /// ([`CropTokenTower`]); `None` for the others.
    fn crop_token_tower(&self, _config: &Value, _vb: VarBuilder) -> Result<Option<Box<dyn CropTokenTower>>, ModelError> {
        Ok(None)
    }
    /// A multi-vector retriever: it serves `token_embed`, and pairs score by MaxSim (ColPali),
    /// as a sentence-transformers `MultiVectorEncoder` folder does.
    fn multi_vector(&self) -> bool {
        false
    }
    /// How the model's processor frames queries and images ([`RetrievalPrompts`]), from its
    /// config (after `--hf-overrides`), its `processor_config.json` (`Value::Null` when the
    /// folder has none) and the tokenizer's special tokens by their `tokenizer_config.json`
    /// names (`special("bos_token")`).
    fn retrieval_prompts(
        &self,
        _config: &Value,
        _processor: &Value,
        _special: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<RetrievalPrompts>, ModelError> {
        Ok(None)
    }
    /// The audio tower of a model that reads audio as soft tokens in its text
    /// ([`AudioTokenTower`]); `None` for the others.
    fn audio_tower(&self, _config: &Value, _vb: VarBuilder) -> Result<Option<Box<dyn AudioTokenTower>>, ModelError> {
        Ok(None)
    }
    /// `(length, pad id)` when the model was trained on texts padded to a fixed length with
    /// the pads attended (SigLIP): every text is padded so before it runs.
    fn pads_text(&self, _config: &Value) -> Option<(usize, u32)> {
        None
    }
    /// A `*ForSequenceClassification` head with `num_labels` outputs, or for a causal LM
    /// converted with `classifier_from_token`, the LM-head rows of `from_tokens`.
    fn classifier(
        &self,
        _config: &Value,
        _vb: VarBuilder,
        _num_labels: usize,
        _from_tokens: Option<&[u32]>,
    ) -> Result<ClassifierWeights, ModelError> {
        Err(ModelError::NoHead(format!("{} classification heads are not supported yet", self.name())))
    }
    /// A `*ForTokenClassification` head.
    fn token_classifier(&self, _config: &Value, _vb: VarBuilder, _num_labels: usize) -> Result<ClassifierWeights, ModelError> {
        Err(ModelError::NoHead(format!("token classification heads for {} are not supported yet", self.name())))
    }
    /// The masked-LM head (SPLADE).
    fn masked_lm_head(&self, _config: &Value, _vb: VarBuilder) -> Result<MaskedLmHead, ModelError> {
        Err(ModelError::NoHead(format!("SPLADE needs a masked-LM head; {} models have none here", self.name())))
    }
    /// Whether `embed`'s mean leaves out the instruction that opens a prompt (GritLM's
    /// `<|user|>\n…\n<|embed|>\n`, found by its token pattern as vLLM's `GritLMMeanPool`
    /// finds it).
    fn embeds_after_instruction(&self) -> bool {
        false
    }
    /// Task adapters kept beside the weights as PEFT folders, one of them merged into the
    /// weights as they load (jina-embeddings-v5's `adapters/<task>`); none for most.
    fn adapter_folders(&self, _config: &Value) -> Option<AdapterFolders> {
        None
    }
    /// A causal LM's head (`--runner generate`: vLLM's `/generative_scoring`).
    fn lm_head(&self, _config: &Value, _vb: VarBuilder) -> Result<LmHeadWeights, ModelError> {
        Err(ModelError::NoHead(format!(
            "{} models have no language-model head here; generative scores need a causal LM (Llama, Mistral, Qwen2, Qwen3, Gemma)",
            self.name()
        )))
    }
    /// The prompt that turns a one-label classifier of this architecture into a reranker.
    fn rerank_template(&self, _config: &Value, _num_labels: usize) -> Option<RerankTemplate> {
        None
    }
}
