//! A model's input sides, as the engine sets them up from what the loader found: how its
//! images are prepared ([`ImageProcessing`]: crops, soft tokens, pages), the text around a
//! page, a query or a medium's soft tokens, its video and audio settings, and what an image
//! costs of a batch.

use crate::input::image::patches::PatchConfig;
use crate::input::image::{ImageLimits, ImageProcessorConfig};
use crate::models::batch::TokenizedInput;
use std::sync::Arc;

/// How an image-text model's images are prepared.
pub enum ImageProcessing {
    /// CLIP and SigLIP: resized and cropped to the tower's square.
    Crop {
        processor: Arc<ImageProcessorConfig>,
        /// The processor's normalization, made once ([`crate::input::image::ChannelTables`]).
        tables: Arc<crate::input::image::ChannelTables>,
    },
    /// EmbeddingGemma 2: cut into patches, and framed in the text (boxed: the frame with its
    /// video side is several times the crop's size).
    SoftTokens(Box<SoftTokenFrame>),
    /// ColPali: resized to the tower's square, and read as `placeholder×n` in a text of its
    /// own ([`PageFrame`]).
    Page(Box<PageFrame>),
}

/// How a page retriever's image becomes its input (ColPali's `process_images`): the crop
/// CLIP and SigLIP make (or Idefics3's frames, ColModernVBert's), and the text around the
/// placeholders the tower's soft tokens replace ([`PageText`]).
pub struct PageFrame {
    pub processor: Arc<ImageProcessorConfig>,
    /// The processor's normalization, made once ([`crate::input::image::ChannelTables`]).
    pub tables: Arc<crate::input::image::ChannelTables>,
    pub text: PageText,
    pub placeholder: String,
    pub placeholder_id: u32,
    /// The soft tokens a crop (a frame) becomes.
    pub tokens: usize,
    /// The patches the tower runs over for a crop: what it costs beside its soft tokens.
    pub patches: usize,
}

/// A page's text.
pub enum PageText {
    /// Every page the same, `prefix placeholder×tokens suffix` (ColPali, one crop a page):
    /// tokenized once, at load, without the tokenizer's special tokens (the prompt writes them).
    Fixed(TokenizedInput),
    /// Idefics3's frames (ColModernVBert): `prefix`, the text of the page's frame grid
    /// ([`crate::input::image::frames::frames_text`]), `suffix`, tokenized per page, with the
    /// tokenizer's special tokens where `special_tokens` (the processor calls its tokenizer
    /// with its defaults); a page of more than `max_frames` frames is refused before it is
    /// resampled.
    Frames { prefix: String, suffix: String, special_tokens: bool, max_frames: usize },
}

/// The literal text a retrieval processor puts around every text input (ColPali's
/// `process_queries`: `<bos>Question: ` before, its pad token ×10 and `\n` after); framed texts
/// are tokenized without the tokenizer's own special tokens, which the frame writes.
#[derive(Debug, Clone)]
pub struct TextFrame {
    pub prefix: String,
    pub suffix: String,
    /// The text's leading and trailing whitespace dropped first (ColQwen3's queries).
    pub trim: bool,
    /// The default instruction, where `prefix` holds `{instruction}` ([`Self::prefix_with`]).
    pub instruction: Option<String>,
    /// Whether the tokenizer adds its own special tokens around the framed text
    /// (ColModernVBert's processor calls its tokenizer with its defaults); otherwise the frame
    /// writes them.
    pub special_tokens: bool,
}

impl TextFrame {
    /// The prefix, with the request's prompt (else the default) as its instruction where it
    /// has one; and the prompt left to stand before the text when it does not.
    pub fn prefix_with<'a>(&self, prompt: Option<&'a str>) -> (std::borrow::Cow<'_, str>, &'a str) {
        match &self.instruction {
            Some(default) => (self.prefix.replacen("{instruction}", prompt.unwrap_or(default), 1).into(), ""),
            None => (self.prefix.as_str().into(), prompt.unwrap_or("")),
        }
    }
}

/// How a soft-token model's image sits in its text: `begin placeholder×n end` (the tokens'
/// strings, tokenized as the processor tokenizes its expanded prompt).
pub struct SoftTokenFrame {
    pub patches: PatchConfig,
    pub begin: String,
    pub placeholder: String,
    pub end: String,
    pub placeholder_id: u32,
    /// Videos, for a model whose processor samples their frames (EmbeddingGemma 2).
    pub video: Option<VideoSide>,
    /// A retrieval model's input prompt around the media: ColQwen2's page, each image a
    /// document of its own (`prefix begin placeholder×n end suffix`), or, when `mixed`,
    /// Qwen3-VL-Embedding's user turn around its texts and images one after another.
    pub page: Option<TextFrame>,
    /// Whether an input may hold a text and images together (inside `page`).
    pub mixed: bool,
}

/// How a soft-token model's video becomes frames, each framed in the text like an image but
/// with the video placeholder ([`super::video`]).
pub struct VideoSide {
    pub config: crate::input::video::VideoConfig,
    pub limits: crate::input::video::VideoLimits,
    pub placeholder: String,
    pub placeholder_id: u32,
}

/// How a soft-token model's audio becomes features, and sits in its text as `begin
/// placeholder×n end` (n: its frames over `frames_per_token`, rounded up).
pub struct AudioSide {
    pub features: Arc<crate::input::audio::LogMelConfig>,
    pub limits: crate::input::audio::AudioLimits,
    pub frames_per_token: usize,
    pub begin: String,
    pub placeholder: String,
    pub end: String,
    pub placeholder_id: u32,
}

impl AudioSide {
    pub(super) fn soft_tokens(&self, audio: &crate::input::audio::LogMel) -> usize {
        audio.frames.div_ceil(self.frames_per_token.max(1))
    }
}

/// An image-text model's image preprocessing.
pub struct ImageSide {
    pub processing: ImageProcessing,
    pub limits: ImageLimits,
    /// What one image costs in a batch ([`crate::models::VisionTower::tokens_per_image`]).
    pub tokens_per_image: usize,
    /// The per-request pixel budget, as the most images one request has decoded at once
    /// ([`super::Preprocessor::waves`]): the engine sets it to half of what one batch holds
    /// (`--max-batch-tokens` over [`Self::tokens_per_image`], at most `--max-num-seqs`), so the
    /// wave being decoded and the wave running hold one batch of crops between them, whatever
    /// the request's image count.
    pub wave: usize,
}
