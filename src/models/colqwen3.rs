//! ColQwen3: page retrievers on Qwen3-VL ([`super::qwen3_vl`]), one vector per token
//! (`token_embed`) scored by MaxSim, in the four layouts vLLM's `ColQwen3Model` loads
//! ([`Publisher`]):
//!
//! - **TomoroAI's `ColQwen3`** (tomoro-colqwen3-embed-4b / -8b; its published
//!   `modeling_colqwen3.py` and `processing_colqwen3.py`): model_type `colqwen3`, weights under
//!   `vlm.model.*`, `embedding_proj_layer` (with its bias) to `embed_dim` (320 by default);
//!   a query is `{query_prefix}{text, stripped}` + the pad token ×10; a page
//!   `<|im_start|>user\n<|vision_start|><|image_pad|>×n<|vision_end|>Describe the
//!   image.<|im_end|><|endoftext|>` (`visual_prompt_prefix` + `visual_prompt_suffix` of
//!   `processor_config.json` where the folder sets them);
//! - **colpali-engine's `ColQwen3`** (0.3.18, as its `save_pretrained` writes it): a
//!   `qwen3_vl` config naming `ColQwen3`, weights under `model.*`, `custom_text_proj` (with its
//!   bias) as wide as its weight; a query is `{query_prefix}{text}` + `<|endoftext|>`×10, nothing
//!   stripped; a page is its `visual_prompt_prefix`, the same frame as TomoroAI's;
//! - **OpenSearch-AI's `OpsColQwen3Model`** (Ops-Colqwen3-4B / -8B; its `OpsColQwen3` and
//!   `OpsColQwen3Processor`): weights unprefixed (`visual.*`, `language_model.*`),
//!   `custom_text_proj` as wide as the hidden size of which the first `dims` (config) are kept;
//!   a query is its text as it is (the processor's `process_queries` adds nothing); a page ends
//!   `Describe the image.<|im_end|><|im_start|>assistant\n<|endoftext|>`;
//! - **NVIDIA's `Qwen3VLNemotronEmbedModel`** (nemotron-colembed-vl-4b-v2 / -8b-v2; its
//!   `modeling_qwen3_vl_nemotron_embed.py`): no projection; the language model attends
//!   bidirectionally and skips its final norm; a query is the user turn `Query: {query_prefix}
//!   {text}` and a page the user turn of the image then `{passage_prefix} `, each with the
//!   assistant turn opened (its processor runs them through Qwen3-VL's chat template, written
//!   here as that template renders them; the prefixes `query:` and `passage:` come from
//!   `processor_config.json`).
//!
//! Every layout runs Qwen3-VL's vision tower (DeepStack included) and language model with M-RoPE
//! for the image tokens, then the token_embed head's L2 normalization. A text document scores
//! as a query (the processors read every text as one).

use super::qwen3_vl::{deepstack_features, Qwen3VlText, Qwen3VlVision};
use super::retrieval::{processor_field, qwen_page_prompts, root, Projected, QUERY_AUGMENTATION_TOKENS, QWEN_IMAGE_FRAME};
use super::{parse_config, Architecture, Backbone, ModelError, RetrievalPrompts, SequencePooling, SoftTokenTower};
use candle_nn::VarBuilder;
use serde::Deserialize;
use serde_json::Value;

pub struct ColQwen3;

pub static COLQWEN3: ColQwen3 = ColQwen3;

/// Who published the folder: the four layouts differ in weight names, projection and prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publisher {
    TomoroAi,
    ColpaliEngine,
    OpenSearch,
    Nemotron,
}

impl Publisher {
    /// From config.json's `model_type` (the custom configs') and `architectures`.
    fn of(raw: &Value) -> Self {
        let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("");
        let architecture = raw.pointer("/architectures/0").and_then(Value::as_str).unwrap_or("");
        match (model_type, architecture) {
            ("ops_colqwen3", _) | (_, "OpsColQwen3Model") => Self::OpenSearch,
            ("qwen3_vl_nemotron_embed", _) | (_, "Qwen3VLNemotronEmbedModel") => Self::Nemotron,
            ("colqwen3", _) => Self::TomoroAi,
            _ => Self::ColpaliEngine,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ColQwen3Config {
    text_config: Value,
    /// OpenSearch's: how many of the projection's outputs are kept.
    #[serde(default)]
    dims: Option<usize>,
}

impl Architecture for ColQwen3 {
    fn name(&self) -> &'static str {
        "ColQwen3"
    }

    fn architecture_stems(&self) -> &'static [&'static str] {
        &["ColQwen3", "OpsColQwen3", "Qwen3VLNemotronEmbed"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["colqwen3", "ops_colqwen3", "qwen3_vl_nemotron_embed"]
    }

    fn default_pooling(&self, _config: &Value) -> SequencePooling {
        SequencePooling::Last
    }

    fn multi_vector(&self) -> bool {
        true
    }

    fn backbone(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Box<dyn Backbone>, ModelError> {
        let config: ColQwen3Config = parse_config(raw)?;
        let deepstack = deepstack_features(raw)?;
        let text = root(&vb, &["vlm.model.language_model", "model.language_model", "language_model", "vlm.model"], "embed_tokens.weight")?;
        let text = Qwen3VlText::load(&config.text_config, deepstack, text)?;
        // The projection's width is its weight's (TomoroAI's `embed_dim` says the same; the
        // others write none), under whichever name the folder uses, as vLLM finds it.
        Ok(match Publisher::of(raw) {
            Publisher::Nemotron => Box::new(text.into_bidirectional_without_final_norm()),
            Publisher::OpenSearch => Box::new(Projected::load_found(text, &vb, &PROJECTIONS, config.dims)?),
            Publisher::TomoroAi | Publisher::ColpaliEngine => Box::new(Projected::load_found(text, &vb, &PROJECTIONS, None)?),
        })
    }

    fn soft_token_tower(&self, raw: &Value, vb: VarBuilder) -> std::result::Result<Option<Box<dyn SoftTokenTower>>, ModelError> {
        let visual = root(&vb, &["vlm.model.visual", "model.visual", "visual"], "patch_embed.proj.weight")?;
        Ok(Some(Box::new(Qwen3VlVision::load(raw, visual)?)))
    }

    fn retrieval_prompts(
        &self,
        config: &Value,
        processor: &Value,
        special: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<RetrievalPrompts>, ModelError> {
        let field = |name: &str, default: &str| processor_field(processor, name, default);
        let prompts = |query_prefix: String, query_suffix: String, visual: String, strips_queries: bool| {
            qwen_page_prompts(query_prefix, query_suffix, &visual, strips_queries)
        };
        let endoftext = "<|endoftext|>";
        Ok(Some(match Publisher::of(config) {
            Publisher::TomoroAi => {
                let pad = special("pad_token").unwrap_or_else(|| endoftext.into());
                let visual = field("visual_prompt_prefix", &format!("<|im_start|>user\n{QWEN_IMAGE_FRAME}Describe the image."))?;
                let suffix = field("visual_prompt_suffix", "<|im_end|><|endoftext|>")?;
                prompts(field("query_prefix", "")?, pad.repeat(QUERY_AUGMENTATION_TOKENS), visual + &suffix, true)?
            }
            Publisher::ColpaliEngine => {
                let visual = field(
                    "visual_prompt_prefix",
                    &format!("<|im_start|>user\n{QWEN_IMAGE_FRAME}Describe the image.<|im_end|>{endoftext}"),
                )?;
                prompts(field("query_prefix", "")?, endoftext.repeat(QUERY_AUGMENTATION_TOKENS), visual, false)?
            }
            Publisher::OpenSearch => {
                let visual = field(
                    "visual_prompt_prefix",
                    &format!("<|im_start|>user\n{QWEN_IMAGE_FRAME}Describe the image.<|im_end|><|im_start|>assistant\n{endoftext}"),
                )?;
                prompts(String::new(), String::new(), visual, false)?
            }
            Publisher::Nemotron => {
                // `f"{query_prefix} {text}"`, or the text alone when the prefix is empty.
                let query_prefix = field("query_prefix", "query:")?;
                let query_prefix = if query_prefix.is_empty() { query_prefix } else { format!("{query_prefix} ") };
                let passage = field("passage_prefix", "passage:")?;
                let passage = if passage.is_empty() { passage } else { format!("{passage} ") };
                let assistant = "<|im_end|>\n<|im_start|>assistant\n";
                prompts(
                    format!("<|im_start|>user\nQuery: {query_prefix}"),
                    assistant.to_string(),
                    format!("<|im_start|>user\n{QWEN_IMAGE_FRAME}{passage}{assistant}"),
                    false,
                )?
            }
        }))
    }
}

/// Where the layouts keep their projection: TomoroAI's `embedding_proj_layer`, colpali-engine's
/// `save_pretrained` under `model.`, OpenSearch's at the top.
const PROJECTIONS: [&str; 3] = ["embedding_proj_layer", "model.custom_text_proj", "custom_text_proj"];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_publisher_comes_from_the_model_type_then_the_architecture() {
        let of = |model_type: &str, architecture: &str| Publisher::of(&json!({"model_type": model_type, "architectures": [architecture]}));
        assert_eq!(of("colqwen3", "ColQwen3"), Publisher::TomoroAi);
        assert_eq!(of("qwen3_vl", "ColQwen3"), Publisher::ColpaliEngine);
        assert_eq!(of("ops_colqwen3", "OpsColQwen3Model"), Publisher::OpenSearch);
        assert_eq!(of("qwen3_vl", "OpsColQwen3Model"), Publisher::OpenSearch);
        assert_eq!(of("qwen3_vl_nemotron_embed", "Qwen3VLNemotronEmbedModel"), Publisher::Nemotron);
    }
}
