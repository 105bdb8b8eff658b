//! ColQwen3 (`ColQwen3`, TomoroAI's published `modeling_colqwen3.py` and
//! `processing_colqwen3.py`, the layout vLLM's `ColQwen3Model` loads for
//! TomoroAI/tomoro-colqwen3-embed-4b and -8b): a page retriever on Qwen3-VL
//! ([`super::qwen3_vl`]), one vector per token (`token_embed`) scored by MaxSim.
//!
//! - **Config:** `vision_config` and `text_config` at the top level (not under a `vlm_config`),
//!   `embed_dim` (320 by default), the image token ids beside them;
//! - **model:** Qwen3-VL's vision tower (DeepStack included) and language model, with M-RoPE
//!   for the image tokens (the published code hands `image_grid_thw` to `Qwen3VLModel`), then
//!   `embedding_proj_layer` (with its bias) to `embed_dim` on every token and the token_embed
//!   head's L2 normalization;
//! - **prompts** ([`RetrievalPrompts`]), as `ColQwen3Processor` builds them: a query is
//!   `{query_prefix}{text, stripped}` + the pad token ×10 (no newline; the prefix is empty by
//!   default); an image is `<|im_start|>user\n<|vision_start|><|image_pad|>×n<|vision_end|>
//!   Describe the image.<|im_end|><|endoftext|>` (`visual_prompt_prefix` +
//!   `visual_prompt_suffix` of `processor_config.json` where the folder sets them).

use super::qwen3_vl::{deepstack_features, Qwen3VlText, Qwen3VlVision};
use super::retrieval::{processor_field, root, Projected, QUERY_AUGMENTATION_TOKENS};
use super::{parse_config, Architecture, Backbone, ModelError, RetrievalPrompts, SequencePooling, SoftTokenTower};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct ColQwen3;

pub static COLQWEN3: ColQwen3 = ColQwen3;

const VISION_FRAME: &str = "<|vision_start|><|image_pad|><|vision_end|>";

#[derive(Debug, Deserialize)]
struct ColQwen3Config {
    text_config: Value,
    #[serde(default = "default_embed_dim")]
    embed_dim: usize,
}

/// `ColQwen3Config`'s default.
fn default_embed_dim() -> usize {
    320
}

impl Architecture for ColQwen3 {
    fn name(&self) -> &'static str {
        "ColQwen3"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ColQwen3"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["colqwen3"]
    }

    fn default_pooling(&self) -> SequencePooling {
        SequencePooling::Last
    }

    fn multi_vector(&self) -> bool {
        true
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: ColQwen3Config = parse_config(raw)?;
        let deepstack = deepstack_features(raw)?;
        let text = root(&vb, &["vlm.model.language_model", "model.language_model", "language_model", "vlm.model"], "embed_tokens.weight")?;
        Ok(Box::new(Projected::load(Qwen3VlText::load(&config.text_config, deepstack, text)?, &vb, config.embed_dim)?))
    }

    fn soft_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        let visual = root(&vb, &["vlm.model.visual", "model.visual", "visual"], "patch_embed.proj.weight")?;
        Ok(Some(Box::new(Qwen3VlVision::load(raw, visual)?)))
    }

    fn retrieval_prompts(
        &self,
        _config: &Value,
        processor: &Value,
        special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| processor_field(processor, name, default);
        let pad = special("pad_token").unwrap_or_else(|| "<|endoftext|>".into());
        let visual = field("visual_prompt_prefix", "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.")?;
        // The image's frame (`<|vision_start|>`, its soft tokens, `<|vision_end|>`) is the
        // tower's; the prompt is what stands around it.
        let (image_prefix, after) = visual.split_once(VISION_FRAME).ok_or_else(|| {
            ModelError::Config(format!("processor_config.json: visual_prompt_prefix has no `{VISION_FRAME}` for the image"))
        })?;
        Ok(Some(RetrievalPrompts {
            query_prefix: field("query_prefix", "")?,
            query_suffix: pad.repeat(QUERY_AUGMENTATION_TOKENS),
            image_prefix: image_prefix.to_string(),
            image_suffix: format!("{after}{}", field("visual_prompt_suffix", "<|im_end|><|endoftext|>")?),
            mixed: false,
            strips_queries: true,
            instruction: None,
            special_tokens: false,
        }))
    }
}
