//! ColPali (`ColPaliForRetrieval`, transformers 5.24's `modeling_colpali.py`): a page
//! retriever on PaliGemma, serving one vector per token (`token_embed`) scored by MaxSim.
//!
//! - **Images:** SigLIP's vision transformer without its head ([`SiglipVisionEncoder`]), every
//!   patch through `multi_modal_projector.linear` into the language model's width: one soft
//!   token per patch, in place of the `<image>` placeholders (unscaled: Gemma scales the word
//!   embeddings only);
//! - **language model:** Gemma 1, attending over the whole sequence (PaliGemma's prefix: the
//!   processor's `token_type_ids` are all 0), [`Gemma::load_prefix_lm`];
//! - **head:** `embedding_proj_layer` (with its bias) to `embedding_dim` on every token; the L2
//!   normalization that follows is the token_embed head's.
//! - **Prompts** ([`RetrievalPrompts`]), as `ColPaliProcessor` builds them: a text is a query,
//!   `<bos>{query_prefix}{text}` + the pad token ×10 (its "query augmentation" buffer, attended
//!   and kept as vectors) + `\n`; an image is `<image>×n <bos>{visual_prompt_prefix}\n`, with
//!   `query_prefix` ("Question: ") and `visual_prompt_prefix` ("Describe the image.") from the
//!   folder's `processor_config.json`.

use super::clip::TowerConfig;
use super::gemma::Gemma;
use super::llama::decoder_root;
use super::ops::Linear;
use super::siglip::SiglipVisionEncoder;
use super::weights::linear;
use super::{parse_config, Architecture, Backbone, BackboneSizes, CropTokenTower, ModelError, RetrievalPrompts, SequencePooling};
use crate::models::batch::Batch;
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct ColPali;

pub static COLPALI: ColPali = ColPali;

/// The query augmentation buffer: `ColPaliProcessor` appends its pad token this many times.
const QUERY_AUGMENTATION_TOKENS: usize = 10;

#[derive(Debug, Deserialize)]
struct ColPaliConfig {
    vlm_config: VlmConfig,
    #[serde(default = "default_embedding_dim")]
    embedding_dim: usize,
}

fn default_embedding_dim() -> usize {
    128
}

/// `PaliGemmaConfig`'s fields the model reads (its defaults where absent).
#[derive(Debug, Deserialize)]
struct VlmConfig {
    text_config: Value,
    #[serde(default)]
    vision_config: TowerConfig,
    #[serde(default = "default_image_token")]
    image_token_index: u32,
}

fn default_image_token() -> u32 {
    256_000
}

/// The first of `prefixes` under which `tensor` exists: checkpoints saved by transformers 4
/// nest the towers one level deeper (`vision_tower.vision_model`) than transformers 5 does,
/// and some put them under `vlm.model`.
fn root<'a>(vb: &VarBuilder<'a>, prefixes: &[&str], tensor: &str) -> std::result::Result<VarBuilder<'a>, ModelError> {
    prefixes
        .iter()
        .map(|p| vb.pp(*p))
        .find(|v| v.contains_tensor(tensor))
        .ok_or_else(|| ModelError::Config(format!("no `{tensor}` under any of {prefixes:?}")))
}

impl Architecture for ColPali {
    fn name(&self) -> &'static str {
        "ColPali"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ColPali"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["colpali"]
    }

    /// Not used for its own task (token_embed); `--convert embed`-style pooling of its
    /// vectors reads the last token, as a decoder's.
    fn default_pooling(&self) -> SequencePooling {
        SequencePooling::Last
    }

    fn multi_vector(&self) -> bool {
        true
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: ColPaliConfig = parse_config(raw)?;
        let text = root(&vb, &["vlm.language_model", "vlm.model.language_model"], "model.embed_tokens.weight")
            .or_else(|_| root(&vb, &["vlm.language_model", "vlm.model.language_model"], "embed_tokens.weight"))?;
        let gemma = Gemma::load_prefix_lm(&config.vlm_config.text_config, decoder_root(text))?;
        let width = gemma.sizes().hidden;
        let projection = linear(&vb.pp("embedding_proj_layer"), config.embedding_dim, width)?;
        let sizes = BackboneSizes { hidden: config.embedding_dim, ..gemma.sizes() };
        Ok(Box::new(ColPaliText { gemma, projection, sizes }))
    }

    fn crop_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn CropTokenTower>>, ModelError> {
        let config: ColPaliConfig = parse_config(raw)?;
        let patch = "embeddings.patch_embedding.weight";
        let vision = root(
            &vb,
            &["vlm.vision_tower.vision_model", "vlm.vision_tower", "vlm.model.vision_tower.vision_model", "vlm.model.vision_tower"],
            patch,
        )?;
        let encoder = SiglipVisionEncoder::load(&config.vlm_config.vision_config, vision)?;
        let projector = root(&vb, &["vlm.multi_modal_projector", "vlm.model.multi_modal_projector"], "linear.weight")?.pp("linear");
        let text_width = config
            .vlm_config
            .text_config
            .get("hidden_size")
            .and_then(Value::as_u64)
            .ok_or_else(|| ModelError::Config("vlm_config.text_config.hidden_size is missing".into()))? as usize;
        let projector = linear(&projector, text_width, encoder.hidden_size)?;
        Ok(Some(Box::new(ColPaliVision { encoder, projector, placeholder: config.vlm_config.image_token_index })))
    }

    fn retrieval_prompts(
        &self,
        processor: &Value,
        special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| match processor.get(name) {
            None | Some(Value::Null) => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(ModelError::Config(format!("processor_config.json: {name} is not a string: {other}"))),
        };
        let bos = special("bos_token").unwrap_or_else(|| "<bos>".into());
        let pad = special("pad_token").unwrap_or_else(|| "<pad>".into());
        Ok(Some(RetrievalPrompts {
            query_prefix: format!("{bos}{}", field("query_prefix", "Question: ")?),
            query_suffix: format!("{}\n", pad.repeat(QUERY_AUGMENTATION_TOKENS)),
            image_prefix: String::new(),
            image_suffix: format!("{bos}{}\n", field("visual_prompt_prefix", "Describe the image.")?),
        }))
    }
}

/// The language model and the projection to the retrieval width.
struct ColPaliText {
    gemma: Gemma,
    projection: Linear,
    sizes: BackboneSizes,
}

impl Backbone for ColPaliText {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        self.projection.forward(&self.gemma.forward(batch)?)
    }

    fn sizes(&self) -> BackboneSizes {
        self.sizes
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.gemma.int8_linears()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.gemma.attention_input_linears()
    }
}

/// SigLIP's patches projected into the language model's width.
struct ColPaliVision {
    encoder: SiglipVisionEncoder,
    projector: Linear,
    placeholder: u32,
}

impl CropTokenTower for ColPaliVision {
    fn forward(&self, pixels: &[f32], images: usize) -> Result<Tensor> {
        self.projector.forward(&self.encoder.forward(pixels, images)?)?.to_dtype(DType::F32)
    }

    fn image_size(&self) -> usize {
        self.encoder.geometry.image_size
    }

    fn tokens_per_image(&self) -> usize {
        self.encoder.geometry.patches()
    }

    fn placeholder(&self) -> u32 {
        self.placeholder
    }
}
