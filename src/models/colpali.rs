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
use super::retrieval::{default_embedding_dim, processor_field, root, text_width, Projected, QUERY_AUGMENTATION_TOKENS};
use super::siglip::SiglipVisionEncoder;
use super::weights::linear;
use super::{parse_config, Architecture, Backbone, CropTokenTower, ModelError, RetrievalPrompts, SequencePooling};
use crate::kernels::Linear;
use candle_core::{DType, Result, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct ColPali;

pub static COLPALI: ColPali = ColPali;

#[derive(Debug, Deserialize)]
struct ColPaliConfig {
    vlm_config: VlmConfig,
    #[serde(default = "default_embedding_dim")]
    embedding_dim: usize,
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
    fn default_pooling(&self, _config: &Value) -> SequencePooling {
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
        Ok(Box::new(Projected::load(gemma, &vb, config.embedding_dim)?))
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
        let text_width = text_width(&config.vlm_config.text_config)?;
        let projector = linear(&projector, text_width, encoder.hidden_size)?;
        Ok(Some(Box::new(ColPaliVision { encoder, projector, placeholder: config.vlm_config.image_token_index })))
    }

    fn retrieval_prompts(
        &self,
        _config: &Value,
        processor: &Value,
        special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| processor_field(processor, name, default);
        let bos = special("bos_token").unwrap_or_else(|| "<bos>".into());
        let pad = special("pad_token").unwrap_or_else(|| "<pad>".into());
        Ok(Some(RetrievalPrompts {
            query_prefix: format!("{bos}{}", field("query_prefix", "Question: ")?),
            query_suffix: format!("{}\n", pad.repeat(QUERY_AUGMENTATION_TOKENS)),
            image_prefix: String::new(),
            image_suffix: format!("{bos}{}\n", field("visual_prompt_prefix", "Describe the image.")?),
            mixed: false,
            strips_queries: false,
            instruction: None,
            special_tokens: false,
        }))
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
