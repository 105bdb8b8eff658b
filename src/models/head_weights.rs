//! Task heads as an architecture loads them: the weights of a classifier (and which token it
//! reads), of a masked-LM head, and the prompt of a chat-style reranker conversion. Each
//! architecture file knows where its checkpoints keep these; what is computed from them
//! (activations, SPLADE pooling, labels) lives in `pooling/`.
//!
//! Heads run on the host in f32, on rows of the final hidden states.

use super::ModelError;
use crate::kernels::{Activation, LayerNorm, Linear};
use candle_core::{Device, Result, Tensor};
use candle_nn::VarBuilder;

/// A head weight as the heads use it: on the CPU, in f32.
pub fn on_host(t: Tensor) -> Result<Tensor> {
    t.to_device(&Device::Cpu)?.to_dtype(candle_core::DType::F32)
}

/// A `[out, inp]` dense layer with its bias, on the host.
pub fn host_linear(vb: &VarBuilder, out: usize, inp: usize) -> Result<Linear> {
    Linear::new(on_host(vb.get((out, inp), "weight")?)?, Some(on_host(vb.get(out, "bias")?)?))
}

/// Which token state(s) a classifier reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadInput {
    /// The first token (BERT-style heads).
    First,
    /// The mean of the sequence's tokens (ModernBERT with `classifier_pooling: mean`).
    Mean,
    /// The last token (decoders converted with `classifier_from_token`).
    Last,
    /// The rightmost token that is not `pad_token_id` (transformers' decoder classifiers).
    LastNonPad { pad_token_id: u32 },
    /// Every token (token classifiers).
    EveryToken,
}

/// The layer between the pooled token and the classifier: BERT's pooler and RoBERTa's
/// `classifier.dense` (tanh), DistilBERT's `pre_classifier` (ReLU), ModernBERT's `head`
/// (GELU, then LayerNorm).
pub struct PreClassifier {
    pub dense: Linear,
    /// `None`: tanh.
    pub activation: Option<Activation>,
    pub norm: Option<LayerNorm>,
}

impl PreClassifier {
    pub fn tanh(dense: Linear) -> Self {
        PreClassifier { dense, activation: None, norm: None }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.dense.forward(x)?;
        let x = match self.activation {
            None => x.tanh()?,
            Some(act) => act.forward_biased(x, None)?,
        };
        match &self.norm {
            Some(norm) => norm.forward(x),
            None => Ok(x),
        }
    }
}

/// The weights of a sequence or token classifier.
pub struct ClassifierWeights {
    pub pre: Option<PreClassifier>,
    pub classifier: Linear,
    pub input: HeadInput,
    /// Whether `token_classify` runs `pre` on every token: vLLM counts it part of the
    /// classifier for RoBERTa's and MPNet's `classifier.dense` and the reward heads, and part of
    /// the sequence pooling (not run per token) for BERT's pooler, DistilBERT's
    /// `pre_classifier` and ModernBERT's `head`.
    pub pre_on_tokens: bool,
}

impl ClassifierWeights {
    /// The `classifier` layer applied to every token, as the encoders' `*ForTokenClassification`
    /// have it.
    pub fn per_token(vb: &VarBuilder, num_labels: usize, hidden: usize) -> std::result::Result<Self, ModelError> {
        Ok(ClassifierWeights {
            pre: None,
            classifier: host_linear(&vb.pp("classifier"), num_labels, hidden)?,
            input: HeadInput::EveryToken,
            pre_on_tokens: true,
        })
    }
}

/// A causal LM's head: the vocabulary logits of the next token, which vLLM's
/// `/generative_scoring` reads.
pub struct LmHeadWeights {
    /// `[vocab, hidden]`, on the host in f32: `lm_head.weight`, or the embeddings it is tied to.
    pub weight: Tensor,
    /// Gemma 2's `final_logit_softcapping`: each logit becomes `cap · tanh(logit / cap)`.
    pub softcap: Option<f32>,
}

/// A masked-LM head (transform: dense → activation → LayerNorm, then the decoder to the
/// vocabulary), which SPLADE pooling reads.
pub struct MaskedLmHead {
    pub transform: Linear,
    pub activation: Activation,
    pub norm: LayerNorm,
    /// `[vocab, hidden]` with the output bias.
    pub decoder: Linear,
}

impl MaskedLmHead {
    /// Vocabulary logits `[rows, vocab]` of hidden states `[rows, hidden]`.
    pub fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.activation.forward_biased(self.transform.forward(x)?, None)?;
        self.decoder.forward(&self.norm.forward(x)?)
    }
}

/// A reranker converted from a chat model: a (query, document) pair becomes one prompt whose
/// last token the one-label classifier judges. The prompt is rendered and tokenized whole,
/// special tokens included, with nothing added by the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankTemplate {
    /// The prompt, with `{query}`, `{document}` and `{instruction}` where they go.
    pub format: String,
    /// What `{instruction}` becomes unless the request or `--reranker-instruction` says.
    pub instruction: String,
}

impl RerankTemplate {
    /// Qwen3-Reranker's chat prompt, whose reference usage always wraps pairs this way.
    pub fn qwen3() -> Self {
        RerankTemplate {
            format: "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. \
                     Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n\
                     <Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                .into(),
            instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
        }
    }

    /// Qwen3-VL-Reranker's prompt, as vLLM's `qwen3_vl_reranker.jinja` renders a query and a
    /// document (each a text or an image, `<|vision_start|><|image_pad|>…<|vision_end|>`).
    pub fn qwen3_vl() -> Self {
        RerankTemplate {
            format: "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. \
                     Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\
                     <Query>:{query}\n<Document>:{document}<|im_end|>\n<|im_start|>assistant\n"
                .into(),
            instruction: "Given a search query, retrieve relevant candidates that answer the query.".into(),
        }
    }

    /// BAAI/bge-reranker-v2-gemma's prompt (FlagEmbedding's `FlagLLMReranker`, and vLLM's test
    /// of it): `<bos>A: {query}\nB: {document}\n{prompt}`, read at the "Yes" token.
    pub fn bge_reranker_gemma() -> Self {
        RerankTemplate {
            format: "<bos>A: {query}\nB: {document}\n{instruction}".into(),
            instruction: "Given a query A and a passage B, determine whether the passage contains an answer to the query by providing a prediction of either 'Yes' or 'No'.".into(),
        }
    }

    /// The prompt for one pair; `instruction` replaces the default task description. Each
    /// placeholder of the format is replaced once, in one pass: braces inside a query or a
    /// document stay as they are.
    pub fn render(&self, query: &str, document: &str, instruction: Option<&str>) -> String {
        let mut out = String::with_capacity(self.format.len() + query.len() + document.len());
        let mut rest = self.format.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open..];
            let (value, len) = if after.starts_with("{query}") {
                (query, "{query}".len())
            } else if after.starts_with("{document}") {
                (document, "{document}".len())
            } else if after.starts_with("{instruction}") {
                (instruction.unwrap_or(&self.instruction), "{instruction}".len())
            } else {
                ("{", 1)
            };
            out.push_str(value);
            rest = &after[len..];
        }
        out.push_str(rest);
        out
    }

    /// The prompt's text before the query, between the query and the document, and after the
    /// document (the instruction written in), for a pair whose sides are not plain texts
    /// (images); `None` if the format puts the document first.
    pub fn around(&self, instruction: Option<&str>) -> Option<[String; 3]> {
        let (before, rest) = self.format.split_once("{query}")?;
        let (between, after) = rest.split_once("{document}")?;
        let piece =
            |format: &str| RerankTemplate { format: format.into(), instruction: self.instruction.clone() }.render("", "", instruction);
        Some([piece(before), piece(between), piece(after)])
    }
}

#[cfg(test)]
mod tests {
    use super::RerankTemplate;

    #[test]
    fn templates_render_each_placeholder_once() {
        let qwen = RerankTemplate::qwen3().render("q {document}", "d", None);
        assert!(qwen.contains("<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: q {document}\n<Document>: d<|im_end|>"));
        assert!(qwen.starts_with(
            "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that"
        ));
        let gemma = RerankTemplate::bge_reranker_gemma().render("what {x}", "B", Some("Yes?"));
        assert_eq!(gemma, "<bos>A: what {x}\nB: B\nYes?");
    }
}
