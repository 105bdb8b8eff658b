//! ColQwen2 (`ColQwen2ForRetrieval`, transformers 5.24's `modeling_colqwen2.py`): a page
//! retriever on Qwen2-VL ([`super::qwen2_vl`]), serving one vector per token (`token_embed`)
//! scored by MaxSim.
//!
//! - **Images** at their own resolution (the processor's `smart_resize` to multiples of 28
//!   within `min_pixels..max_pixels`), one soft token per 2×2 block of patches, in place of
//!   `<|image_pad|>`;
//! - **language model:** Qwen2 with every token placed by its index in the sequence, image
//!   tokens included, as transformers 5.24's `ColQwen2ForRetrieval` runs it (the reference for
//!   a folder saved by that class: it calls its backbone without `input_ids`, so
//!   `Qwen2VLModel` cannot place the image by row and column). colpali-engine's `ColQwen2`,
//!   which trained the checkpoints, runs `Qwen2VLModel.forward` with the image grid (M-RoPE):
//!   a config key of ours, `"mrope_positions": true` (config.json or `--hf-overrides`), asks
//!   for that instead. The two differ on every page (random-weight fixtures: row cosine 0.67–0.89);
//!   queries, which hold no image, are the same under both;
//! - **head:** `embedding_proj_layer` (with its bias) to `embedding_dim` on every token, then
//!   the token_embed head's L2 normalization;
//! - **prompts** ([`RetrievalPrompts`]), as `ColQwen2Processor` builds them: a text is a query,
//!   `{query_prefix}{text}` + the pad token ×10 + `\n`; an image is `visual_prompt_prefix` with
//!   its `<|image_pad|>` expanded to the image's soft tokens (`<|im_start|>user\n<|vision_start|>
//!   …<|vision_end|>Describe the image.<|im_end|><|endoftext|>` by default), both from the
//!   folder's `processor_config.json`.

use super::llama::decoder_root;
use super::qwen2_vl::{Qwen2VlText, Qwen2VlVision, TokenPositions};
use super::retrieval::{default_embedding_dim, processor_field, qwen_page_prompts, root, Projected, QUERY_AUGMENTATION_TOKENS};
use super::{parse_config, Architecture, Backbone, ModelError, RetrievalPrompts, SequencePooling, SoftTokenTower};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct ColQwen2;

pub static COLQWEN2: ColQwen2 = ColQwen2;

#[derive(Debug, Deserialize)]
struct ColQwen2Config {
    vlm_config: Value,
    #[serde(default = "default_embedding_dim")]
    embedding_dim: usize,
    /// Ours, not transformers': colpali-engine's M-RoPE positions (module docs).
    #[serde(default)]
    mrope_positions: bool,
}

impl Architecture for ColQwen2 {
    fn name(&self) -> &'static str {
        "ColQwen2"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ColQwen2"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["colqwen2"]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn multi_vector(&self) -> bool {
        true
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: ColQwen2Config = parse_config(raw)?;
        let text_config = config.vlm_config.get("text_config").filter(|t| t.is_object()).unwrap_or(&config.vlm_config);
        let text = root(&vb, &["vlm.language_model", "vlm.model.language_model", "vlm.model", "vlm"], "embed_tokens.weight")
            .or_else(|_| root(&vb, &["vlm.language_model", "vlm"], "model.embed_tokens.weight").map(decoder_root))?;
        let positions = if config.mrope_positions { TokenPositions::Mrope } else { TokenPositions::Sequence };
        Ok(Box::new(Projected::load(Qwen2VlText::load(text_config, text, positions)?, &vb, config.embedding_dim)?))
    }

    fn soft_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        let config: ColQwen2Config = parse_config(raw)?;
        let visual = root(&vb, &["vlm.visual", "vlm.model.visual"], "patch_embed.proj.weight")?;
        Ok(Some(Box::new(Qwen2VlVision::load(&config.vlm_config, visual)?)))
    }

    fn retrieval_prompts(
        &self,
        _config: &Value,
        processor: &Value,
        special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| processor_field(processor, name, default);
        let pad = special("pad_token").unwrap_or_else(|| "<|endoftext|>".into());
        let visual = field(
            "visual_prompt_prefix",
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>",
        )?;
        let query_suffix = format!("{}\n", pad.repeat(QUERY_AUGMENTATION_TOKENS));
        Ok(Some(qwen_page_prompts(field("query_prefix", "Query: ")?, query_suffix, &visual, false)?))
    }
}
