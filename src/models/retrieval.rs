//! What the page retrievers (ColPali, ColQwen2, ColQwen3, ColQwen3.5, ColModernVBert) share: their projection over the
//! language model's final states ([`Projected`]), the fields of their processors'
//! `processor_config.json`, and finding a tower's weights under the prefixes that transformers 4
//! and 5 save them with.

use super::batch::Batch;
use super::weights::linear;
use super::{Backbone, BackboneSizes, ModelError, RetrievalPrompts};
use crate::kernels::Linear;
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use serde_json::Value;

/// The processors' query augmentation buffer: their pad token, this many times, after a query.
pub(super) const QUERY_AUGMENTATION_TOKENS: usize = 10;

/// `embedding_dim` when the config has none (`ColPaliConfig`'s and `ColQwen2Config`'s default).
pub(super) fn default_embedding_dim() -> usize {
    128
}

/// The first of `prefixes` holding `tensor`: transformers 5 saves the language model as
/// `vlm.language_model`, transformers 4.5x as `vlm.model.language_model`, and the vision tower
/// one level deeper or shallower.
pub(super) fn root<'a>(vb: &VarBuilder<'a>, prefixes: &[&str], tensor: &str) -> std::result::Result<VarBuilder<'a>, ModelError> {
    prefixes
        .iter()
        .map(|p| vb.pp(*p))
        .find(|v| v.contains_tensor(tensor))
        .ok_or_else(|| ModelError::Config(format!("no `{tensor}` under any of {prefixes:?}")))
}

/// The language model's width (`text_config.hidden_size`), which a vision tower's projector maps
/// into.
pub(super) fn text_width(text_config: &Value) -> std::result::Result<usize, ModelError> {
    text_config
        .get("hidden_size")
        .and_then(Value::as_u64)
        .map(|w| w as usize)
        .ok_or_else(|| ModelError::Config("vlm_config.text_config.hidden_size is missing".into()))
}

/// An image in a Qwen-VL prompt: the tower's soft tokens fill it.
pub(super) const QWEN_IMAGE_FRAME: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// The Qwen-based retrievers' prompts: a query between `query_prefix` and `query_suffix`, a page
/// being `visual` (the processor's `visual_prompt_prefix`) with the image's frame
/// (`<|vision_start|><|image_pad|><|vision_end|>`, which the tower's tokens fill) cut out of it.
/// Their processors call the tokenizer with its defaults, so its post-processor has its say
/// (Qwen's adds nothing; a `tokenizer.json` that appends `<|endoftext|>` appends it to every
/// query and page, as transformers does).
pub(super) fn qwen_page_prompts(
    query_prefix: String,
    query_suffix: String,
    visual: &str,
    strips_queries: bool,
) -> std::result::Result<RetrievalPrompts, ModelError> {
    const FRAME: &str = QWEN_IMAGE_FRAME;
    let (image_prefix, image_suffix) = visual
        .split_once(FRAME)
        .ok_or_else(|| ModelError::Config(format!("processor_config.json: visual_prompt_prefix has no `{FRAME}` for the image")))?;
    Ok(RetrievalPrompts {
        query_prefix,
        query_suffix,
        image_prefix: image_prefix.to_string(),
        image_suffix: image_suffix.to_string(),
        mixed: false,
        strips_queries,
        instruction: None,
        special_tokens: true,
    })
}

/// A string field of `processor_config.json`, or the processor class's default.
pub(super) fn processor_field(processor: &Value, name: &str, default: &str) -> std::result::Result<String, ModelError> {
    match processor.get(name) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ModelError::Config(format!("processor_config.json: {name} is not a string: {other}"))),
    }
}

/// A language model and `embedding_proj_layer` (with its bias) on every token: the retrieval
/// vectors before the token_embed head's L2 normalization.
pub(super) struct Projected<B> {
    model: B,
    projection: Linear,
    sizes: BackboneSizes,
}

impl<B: Backbone> Projected<B> {
    /// `model` and the projection to `embedding_dim` under `vb` (`embedding_proj_layer`).
    pub(super) fn load(model: B, vb: &VarBuilder, embedding_dim: usize) -> std::result::Result<Self, ModelError> {
        let projection = linear(&vb.pp("embedding_proj_layer"), embedding_dim, model.sizes().hidden)?;
        let sizes = BackboneSizes { hidden: embedding_dim, ..model.sizes() };
        Ok(Self { model, projection, sizes })
    }

    /// `model` and the projection at the first of `names` under `vb` holding a weight, as wide
    /// as that weight (vLLM's ColQwen3Model infers the width so when the config names none);
    /// `keep`: only its first outputs (OpenSearch's `dims`: the published forward slices the
    /// projected vectors before normalizing, which is the weight's first rows). Its bias, where
    /// the checkpoint has one.
    pub(super) fn load_found(model: B, vb: &VarBuilder, names: &[&str], keep: Option<usize>) -> std::result::Result<Self, ModelError> {
        let at = names
            .iter()
            .map(|n| vb.pp(*n))
            .find(|v| v.contains_tensor("weight"))
            .ok_or_else(|| ModelError::Config(format!("no projection weight under any of {names:?}")))?;
        let full = at.get_unchecked_dtype("weight", at.dtype())?;
        let (out, inp) = full.dims2()?;
        if inp != model.sizes().hidden {
            return Err(ModelError::Config(format!(
                "{}.weight takes {inp} inputs; the language model gives {}",
                at.prefix(),
                model.sizes().hidden
            )));
        }
        let width = match keep {
            Some(k) if k == 0 || k > out => {
                return Err(ModelError::Config(format!("dims {k}: the projection {} has {out} outputs", at.prefix())))
            }
            Some(k) => k,
            None => out,
        };
        let bias = if at.contains_tensor("bias") { Some(at.get(out, "bias")?.narrow(0, 0, width)?) } else { None };
        let projection = Linear::new(full.narrow(0, 0, width)?, bias)?.named(&at.prefix());
        let sizes = BackboneSizes { hidden: width, ..model.sizes() };
        Ok(Self { model, projection, sizes })
    }
}

impl<B: Backbone> Backbone for Projected<B> {
    fn forward(&self, batch: &Batch) -> Result<Tensor> {
        self.projection.forward(&self.model.forward(batch)?)
    }

    fn sizes(&self) -> BackboneSizes {
        self.sizes
    }

    fn int8_linears(&mut self) -> Vec<&mut Linear> {
        self.model.int8_linears()
    }

    fn attention_input_linears(&mut self) -> Vec<&mut Linear> {
        self.model.attention_input_linears()
    }
}
