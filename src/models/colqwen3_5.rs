//! ColQwen3.5 (colpali-engine's `ColQwen3_5`, the layout vLLM's `ColQwen3_5Model` loads, e.g.
//! athrael-soju/colqwen3.5-4.5B): a page retriever on Qwen3.5, one vector per token
//! (`token_embed`) scored by MaxSim.
//!
//! - **Config:** a `qwen3_5` config naming `ColQwen3_5`, `vision_config` and `text_config`;
//! - **model:** Qwen3-VL's vision tower without DeepStack ([`super::qwen3_vl::Qwen3VlVision`];
//!   Qwen3.5's is the same tower), Qwen3.5's hybrid language model ([`super::qwen3_5`]) with
//!   M-RoPE for the image tokens, then `custom_text_proj` (with its bias) as wide as its weight
//!   (the class's `config.dim`, 128 by default) and the token_embed head's L2 normalization.
//!   Weights as its `save_pretrained` writes them: `visual.*`, `language_model.*`,
//!   `custom_text_proj.*` (also under `model.`); multi-token-prediction weights (`mtp.*`) are
//!   not read;
//! - **prompts** ([`RetrievalPrompts`]), as `ColQwen3_5Processor` builds them (colpali-engine's
//!   ColQwen3 prompts): a query is `{query_prefix}{text}` + `<|endoftext|>`×10; a page
//!   `<|im_start|>user\n<|vision_start|><|image_pad|>×n<|vision_end|>Describe the
//!   image.<|im_end|><|endoftext|>` (`visual_prompt_prefix` of `processor_config.json` where the
//!   folder sets it). Its `process_images` converts with Pillow (alpha dropped).

use super::qwen3_5::Qwen3_5Text;
use super::qwen3_vl::Qwen3VlVision;
use super::retrieval::{processor_field, qwen_page_prompts, root, Projected, QUERY_AUGMENTATION_TOKENS, QWEN_IMAGE_FRAME};
use super::{Architecture, Backbone, ModelError, RetrievalPrompts, SequencePooling, SoftTokenTower};
use candle_nn::VarBuilder;
use serde_json::Value;

pub struct ColQwen3_5;

pub static COLQWEN3_5: ColQwen3_5 = ColQwen3_5;

const END_OF_TEXT: &str = "<|endoftext|>";

impl Architecture for ColQwen3_5 {
    fn name(&self) -> &'static str {
        "ColQwen3_5"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ColQwen3_5"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &[]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn multi_vector(&self) -> bool {
        true
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let text = root(&vb, &["model.language_model", "language_model"], "embed_tokens.weight")?;
        let text = Qwen3_5Text::load(raw.get("text_config").unwrap_or(&Value::Null), text)?;
        Ok(Box::new(Projected::load_found(text, &vb, &["custom_text_proj", "model.custom_text_proj"], None)?))
    }

    fn soft_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        let visual = root(&vb, &["model.visual", "visual"], "patch_embed.proj.weight")?;
        Ok(Some(Box::new(Qwen3VlVision::load(raw, visual)?)))
    }

    fn retrieval_prompts(
        &self,
        _config: &Value,
        processor: &Value,
        _special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| processor_field(processor, name, default);
        let visual =
            field("visual_prompt_prefix", &format!("<|im_start|>user\n{QWEN_IMAGE_FRAME}Describe the image.<|im_end|>{END_OF_TEXT}"))?;
        Ok(Some(qwen_page_prompts(field("query_prefix", "")?, END_OF_TEXT.repeat(QUERY_AUGMENTATION_TOKENS), &visual, false)?))
    }
}
