//! The model's text tokenizer: its `tokenizer.json` with our own truncation rules (single
//! texts, cross-encoder pairs with per-side caps, token-id inputs). The loader builds it; the
//! input layer's workers ([`super::workers`]) run it off the async runtime.
//!
//! Whatever truncation or padding the file has baked in is cleared at load (all-MiniLM-L6-v2
//! ships truncation at 128 and fixed padding to 128); each request's `truncate_prompt_tokens`
//! and `truncation_side` decide instead.

use crate::models::batch::TokenizedInput;
use serde::Deserialize;
use std::path::Path;
use tokenizers::utils::truncation::{truncate_encodings, TruncationParams, TruncationStrategy};
use tokenizers::{Encoding, Tokenizer, TruncationDirection};

/// Which end of an over-long input is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TruncationSide {
    Left,
    #[default]
    Right,
}

/// Why a text could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizer failed: {0}")]
    Failed(String),
    /// A pair index outside the queries or documents given.
    #[error("Input lengths must be either 1:1, 1:N or N:N")]
    InvalidPairing,
}

/// How one text (or pair) is turned into tokens.
#[derive(Debug, Clone, Copy)]
pub struct EncodeOptions {
    pub add_special_tokens: bool,
    /// Keep at most this many tokens, special tokens included. Pairs are cut longest-first.
    pub truncate_to: Option<usize>,
    pub side: TruncationSide,
    pub pair_limits: PairLimits,
}

/// Per-side caps for pairs (`max_tokens_per_query`, `max_tokens_per_doc`), applied to each
/// side's own tokens before the pair is joined; the end of the text is cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairLimits {
    pub query: Option<usize>,
    pub document: Option<usize>,
}

/// A text to tokenize: alone, or as a (query, document) pair for a cross-encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextInput {
    Single(String),
    Pair(String, String),
}

/// A token's id, whether it is special, and its `[start, stop)` byte range in the text (none
/// for special tokens).
pub type TokenInfo = (u32, bool, Option<(usize, usize)>);

pub struct TextTokenizer {
    inner: Tokenizer,
    /// sentence-transformers' `do_lower_case`: lowercase before tokenizing.
    lowercase: bool,
    /// Keep the post-processor's segment ids; otherwise every token gets type 0.
    type_ids: bool,
    /// The pad token (`tokenizer_config.json`'s `pad_token`, else `tokenizer.json`'s padding).
    pad_id: Option<u32>,
}

impl TextTokenizer {
    pub fn from_file(path: &Path, lowercase: bool, type_ids: bool) -> Result<Self, TokenizeError> {
        let inner = Tokenizer::from_file(path).map_err(|e| TokenizeError::Failed(format!("{}: {e}", path.display())))?;
        Self::new(inner, lowercase, type_ids)
    }

    /// From a `tokenizer.json` document built in memory (a SentencePiece model converted by
    /// [`super::sentencepiece`]).
    pub fn from_json(document: &str, lowercase: bool, type_ids: bool) -> Result<Self, TokenizeError> {
        let inner: Tokenizer = document.parse().map_err(|e| TokenizeError::Failed(format!("converted tokenizer: {e}")))?;
        Self::new(inner, lowercase, type_ids)
    }

    fn new(mut inner: Tokenizer, lowercase: bool, type_ids: bool) -> Result<Self, TokenizeError> {
        let pad_id = inner.get_padding().map(|p| p.pad_id);
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| TokenizeError::Failed(e.to_string()))?;
        Ok(Self { inner, lowercase, type_ids, pad_id })
    }

    /// The BOS/EOS that transformers 4's `LlamaTokenizerFast` and `GemmaTokenizerFast` add by
    /// `tokenizer_config.json`'s `add_bos_token` (default true) and `add_eos_token` (default
    /// false): they rebuild the post-processor from those flags, whatever tokenizer.json says.
    /// e5-mistral-7b-instruct publishes `add_eos_token: true` over a tokenizer.json that appends
    /// nothing, and was trained and evaluated with the `</s>` appended (its last-token pooling
    /// reads it). Applied only when `add_eos_token` is true and the tokenizer.json does not
    /// already end a text with that EOS; other classes are left as tokenizer.json says.
    pub fn with_llama_special_tokens(mut self, tokenizer_config: &serde_json::Value) -> Result<Self, TokenizeError> {
        let class = tokenizer_config.get("tokenizer_class").and_then(serde_json::Value::as_str).unwrap_or("");
        let flag = |name: &str, default: bool| tokenizer_config.get(name).and_then(serde_json::Value::as_bool).unwrap_or(default);
        if !matches!(class.trim_end_matches("Fast"), "LlamaTokenizer" | "CodeLlamaTokenizer" | "GemmaTokenizer")
            || !flag("add_eos_token", false)
        {
            return Ok(self);
        }
        let token = |name: &str| special_token(tokenizer_config, name).and_then(|t| self.inner.token_to_id(&t).map(|id| (t, id)));
        let Some((eos, eos_id)) = token("eos_token") else { return Ok(self) };
        let appends_eos = self.inner.encode("a", true).map(|e| e.get_ids().last() == Some(&eos_id)).unwrap_or(false);
        if appends_eos {
            return Ok(self);
        }
        let bos = if flag("add_bos_token", true) { token("bos_token") } else { None };
        let prefix = bos.as_ref().map(|(t, _)| format!("{t}:0 ")).unwrap_or_default();
        let mut specials: Vec<(String, u32)> = bos.into_iter().collect();
        specials.push((eos.clone(), eos_id));
        let template = tokenizers::processors::template::TemplateProcessing::builder()
            .try_single(format!("{prefix}$A:0 {eos}:0"))
            .and_then(|b| b.try_pair(format!("{prefix}$A:0 {eos}:0 {}$B:1 {eos}:1", prefix.replace(":0", ":1"))))
            .map_err(|e| TokenizeError::Failed(format!("add_eos_token: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| TokenizeError::Failed(format!("add_eos_token: {e}")))?;
        self.inner.with_post_processor(Some(template));
        Ok(self)
    }

    /// Names the pad token (`tokenizer_config.json`'s `pad_token`), when the vocabulary has it.
    pub fn with_pad_token(mut self, token: Option<&str>) -> Self {
        if let Some(id) = token.and_then(|t| self.inner.token_to_id(t)) {
            self.pad_id = Some(id);
        }
        self
    }

    /// Each token's `(start, end)` in `text`, counted in characters (as Python's fast
    /// tokenizers report `offset_mapping`); special tokens have `(0, 0)`. The same tokens as
    /// [`Self::encode`] without truncation.
    pub fn char_offsets(&self, text: &str, add_special_tokens: bool) -> Result<Vec<(usize, usize)>, TokenizeError> {
        let encoding = self.inner.encode_char_offsets(text, add_special_tokens).map_err(tokenizer_error)?;
        Ok(encoding.get_offsets().to_vec())
    }

    /// The pad token's id, if the tokenizer has one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// Tokens of `text` alone, without special tokens.
    fn raw(&self, text: &str) -> Result<Encoding, TokenizeError> {
        let encoded = if self.lowercase { self.inner.encode(text.to_lowercase(), false) } else { self.inner.encode(text, false) };
        encoded.map_err(tokenizer_error)
    }

    /// Special tokens the post-processor adds to a single text or a pair.
    fn added_tokens(&self, pair: bool, options: EncodeOptions) -> usize {
        if !options.add_special_tokens {
            return 0;
        }
        self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, pair))
    }

    pub fn encode(&self, text: &str, options: EncodeOptions) -> Result<TokenizedInput, TokenizeError> {
        let mut encoding = self.raw(text)?;
        if let Some(limit) = options.truncate_to {
            encoding.truncate(limit.saturating_sub(self.added_tokens(false, options)), 0, direction(options.side));
            // Truncation keeps the cut-off tokens as "overflowing" pieces; we never use them.
            encoding.take_overflowing();
        }
        self.finish(encoding, None, options)
    }

    /// A (query, document) pair as cross-encoders see it (`[CLS] q [SEP] d [SEP]` with segment
    /// ids 0/1 for BERT, `<s> q </s></s> d </s>` for RoBERTa), as `tokenizer(q, d)` makes it.
    pub fn encode_pair(&self, query: &str, document: &str, options: EncodeOptions) -> Result<TokenizedInput, TokenizeError> {
        let first = self.pair_side(query, options.pair_limits.query)?;
        let second = self.pair_side(document, options.pair_limits.document)?;
        self.join_pair(first, second, options)
    }

    /// Every `(query, document)` pair of `pairs` (indices into `queries` and `documents`),
    /// exactly as [`Self::encode_pair`] makes each, but with each distinct text tokenized once:
    /// a long query against a thousand documents is one tokenization, not a thousand.
    pub fn encode_pairs(
        &self,
        queries: &[String],
        documents: &[String],
        pairs: &[(usize, usize)],
        options: EncodeOptions,
    ) -> Vec<Result<TokenizedInput, TokenizeError>> {
        let queries: Vec<_> = queries.iter().map(|q| self.pair_side(q, options.pair_limits.query)).collect();
        let documents: Vec<_> = documents.iter().map(|d| self.pair_side(d, options.pair_limits.document)).collect();
        pairs
            .iter()
            .map(|&(i, j)| match (queries.get(i), documents.get(j)) {
                (Some(Ok(q)), Some(Ok(d))) => self.join_pair(q.clone(), d.clone(), options),
                (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e.clone()),
                _ => Err(TokenizeError::InvalidPairing),
            })
            .collect()
    }

    /// One side of a pair, without special tokens, cut to its own limit.
    fn pair_side(&self, text: &str, limit: Option<usize>) -> Result<Encoding, TokenizeError> {
        let mut encoding = self.raw(text)?;
        if let Some(n) = limit {
            encoding.truncate(n, 0, TruncationDirection::Right);
            // The cut-off pieces would be cloned into every pair and multiplied with the other
            // side's when the pair is joined.
            encoding.take_overflowing();
        }
        Ok(encoding)
    }

    /// Truncates a pair to the input limit (longest first) and adds the special tokens.
    fn join_pair(&self, first: Encoding, second: Encoding, options: EncodeOptions) -> Result<TokenizedInput, TokenizeError> {
        let (first, second) = match options.truncate_to {
            Some(limit) => {
                let params = TruncationParams {
                    direction: direction(options.side),
                    max_length: limit.saturating_sub(self.added_tokens(true, options)),
                    strategy: TruncationStrategy::LongestFirst,
                    stride: 0,
                };
                let (mut first, second) = truncate_encodings(first, Some(second), &params).map_err(tokenizer_error)?;
                first.take_overflowing();
                (
                    first,
                    second.map(|mut s| {
                        s.take_overflowing();
                        s
                    }),
                )
            }
            None => (first, Some(second)),
        };
        self.finish(first, second, options)
    }

    pub fn encode_input(&self, input: &TextInput, options: EncodeOptions) -> Result<TokenizedInput, TokenizeError> {
        match input {
            TextInput::Single(text) => self.encode(text, options),
            TextInput::Pair(query, document) => self.encode_pair(query, document, options),
        }
    }

    fn finish(&self, first: Encoding, second: Option<Encoding>, options: EncodeOptions) -> Result<TokenizedInput, TokenizeError> {
        let encoding = self.inner.post_process(first, second, options.add_special_tokens).map_err(tokenizer_error)?;
        let ids = encoding.get_ids().to_vec();
        let type_ids = if self.type_ids { encoding.get_type_ids().to_vec() } else { vec![0; ids.len()] };
        Ok(TokenizedInput { ids, type_ids })
    }

    /// The text of `ids`; `skip_special_tokens` leaves the special tokens out.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TokenizeError::Failed(e.to_string()))
    }

    /// Every token of `text` as TEI's `/tokenize` lists it ([`TokenInfo`]).
    pub fn tokens(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenInfo>, TokenizeError> {
        let encoding = self.inner.encode(text, add_special_tokens).map_err(tokenizer_error)?;
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_special_tokens_mask())
            .zip(encoding.get_offsets())
            .map(|((&id, &special), &(start, stop))| (id, special == 1, (special == 0).then_some((start, stop))))
            .collect())
    }

    pub fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| self.inner.id_to_token(id).unwrap_or_default()).collect()
    }

    /// The vocabulary's piece for `id` (added tokens included), if the id is in it.
    pub fn token_string(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token of the vocabulary (added tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The space marker of a SentencePiece-style pre-tokenizer (`Metaspace`, alone or in a
    /// `Sequence`; "▁" unless it says otherwise), which decoding one token strips: vLLM's
    /// `get_leading_space_marker`, read from the same configuration.
    pub fn leading_space_marker(&self) -> Option<String> {
        let pre = serde_json::to_value(self.inner.get_pre_tokenizer()?).ok()?;
        let marker = |node: &serde_json::Value| {
            (node["type"] == "Metaspace").then(|| node["replacement"].as_str().unwrap_or("\u{2581}").to_string())
        };
        marker(&pre).or_else(|| pre["pretokenizers"].as_array()?.iter().find_map(marker))
    }
}

fn tokenizer_error(e: tokenizers::Error) -> TokenizeError {
    TokenizeError::Failed(e.to_string())
}

fn direction(side: TruncationSide) -> TruncationDirection {
    match side {
        TruncationSide::Left => TruncationDirection::Left,
        TruncationSide::Right => TruncationDirection::Right,
    }
}

/// Token-id inputs skip the tokenizer but follow the same truncation rule.
/// A special token of `tokenizer_config.json` (`pad_token`, `bos_token`, …): written as the
/// token itself or as an added-token object with its `content`.
pub fn special_token(tokenizer_config: &serde_json::Value, name: &str) -> Option<String> {
    match tokenizer_config.get(name)? {
        serde_json::Value::String(token) => Some(token.clone()),
        serde_json::Value::Object(added) => added.get("content").and_then(serde_json::Value::as_str).map(str::to_string),
        _ => None,
    }
}

pub fn truncate_ids(mut ids: Vec<u32>, options: EncodeOptions) -> TokenizedInput {
    if let Some(limit) = options.truncate_to {
        if ids.len() > limit {
            match options.side {
                TruncationSide::Right => ids.truncate(limit),
                TruncationSide::Left => {
                    ids.drain(..ids.len() - limit);
                }
            }
        }
    }
    let type_ids = vec![0; ids.len()];
    TokenizedInput { ids, type_ids }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_truncation_sides() {
        let opts = |side| EncodeOptions { add_special_tokens: true, truncate_to: Some(2), side, pair_limits: PairLimits::default() };
        assert_eq!(truncate_ids(vec![1, 2, 3], opts(TruncationSide::Right)).ids, vec![1, 2]);
        assert_eq!(truncate_ids(vec![1, 2, 3], opts(TruncationSide::Left)).ids, vec![2, 3]);
        assert_eq!(truncate_ids(vec![1], opts(TruncationSide::Left)).ids, vec![1]);
    }
}
