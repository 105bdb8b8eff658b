//! The input layer: everything that turns what a client sent (a text, token ids, a
//! cross-encoder pair, a chat conversation, an image) into what the model runs on, before any
//! model work. It is the one door for inputs, as TEI's `core/tokenization` is: the engine calls
//! [`Preprocessor::prepare`] (and [`Preprocessor::prepare_pairs`] for cross-encoder pairs), and
//! `/tokenize` goes through the same steps.
//!
//! - [`tokenizer`]: the model's `tokenizer.json` with our truncation rules ([`sentencepiece`]:
//!   DeBERTa's `spm.model` made into one for folders without it); [`pool`]: the
//!   worker threads it (and image decoding, and chat rendering) runs on, off the async runtime;
//! - [`chat_template`]: conversations rendered into one text (minijinja, transformers' settings);
//! - [`image`]: image bytes → pixel values (decoding, Pillow-exact resampling, normalization);
//!   [`media`]: where a request's image bytes come from (data URLs, allowed http(s) hosts,
//!   chat-style content parts);
//! - [`prepare`]: the steps every prompt takes (byte bound, prompt prefix, tokenization,
//!   truncation, padding, the length and vocabulary checks), in [`Preprocessor`].
//!
//! The loader builds these pieces from a model's files at load time; the engine owns one
//! [`Preprocessor`] per model. This layer knows nothing of tasks: a request's options arrive
//! as [`InputOptions`], already decided from its validated parameters.

pub mod audio;
pub mod chat_template;
pub mod image;
pub mod media;
pub mod prepare;
pub mod sentencepiece;
pub mod tokenizer;
pub mod video;
pub mod workers;

pub use prepare::{
    AudioSide, ChatTurn, ImageProcessing, ImageSide, InputOptions, PageFrame, PageText, Preprocessor, SoftTokenFrame, TextFrame, VideoSide,
};

use crate::models::batch::TokenizedInput;

/// One input as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// A (query, document) pair for a cross-encoder, tokenized together.
    Pair(String, String),
    /// An encoded image (PNG, JPEG or WebP bytes), for image-text models.
    Image(Vec<u8>),
    /// Texts, images and audio in one input, in order (one `content` with several parts), for
    /// models that read media inside their text (EmbeddingGemma 2); other image-text models
    /// refuse it. An audio input alone is one of these too (no model embeds audio on its own).
    Interleaved(Vec<Part>),
    /// A chat message as the model's chat template wrote it, each medium where the template put
    /// its placeholder ([`Preprocessor::render_media_chat`]): the parts stand as they are (no
    /// separator, no sentence-transformers prompt; the template wrote the special tokens).
    Chat(Vec<Part>),
}

/// One part of an [`Prompt::Interleaved`] or [`Prompt::Chat`] input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Image(Vec<u8>),
    /// An encoded audio file (WAV, FLAC, MP3 or OGG/Vorbis bytes).
    Audio(Vec<u8>),
    /// An encoded video file (H.264 in MP4).
    Video(Vec<u8>),
}

impl Prompt {
    /// The parts of an input of several ([`Prompt::Interleaved`], [`Prompt::Chat`]).
    pub fn parts(&self) -> &[Part] {
        match self {
            Prompt::Interleaved(parts) | Prompt::Chat(parts) => parts,
            _ => &[],
        }
    }

    /// How many images the prompt holds.
    pub fn image_count(&self) -> usize {
        match self {
            Prompt::Image(_) => 1,
            _ => self.parts().iter().filter(|p| matches!(p, Part::Image(_))).count(),
        }
    }

    /// How many audio inputs the prompt holds.
    pub fn audio_count(&self) -> usize {
        self.parts().iter().filter(|p| matches!(p, Part::Audio(_))).count()
    }

    /// How many videos the prompt holds.
    pub fn video_count(&self) -> usize {
        self.parts().iter().filter(|p| matches!(p, Part::Video(_))).count()
    }

    /// Images, audio and videos: what makes a prompt more than text for the model.
    pub fn media_count(&self) -> usize {
        self.image_count() + self.audio_count() + self.video_count()
    }

    /// The characters of its texts (a pair counts both; TEI's `compute_chars`).
    pub fn characters(&self) -> usize {
        match self {
            Prompt::Text(text) => text.chars().count(),
            Prompt::Pair(query, document) => query.chars().count() + document.chars().count(),
            Prompt::Interleaved(parts) | Prompt::Chat(parts) => {
                parts.iter().map(|p| if let Part::Text(t) = p { t.chars().count() } else { 0 }).sum()
            }
            Prompt::Tokens(_) | Prompt::Image(_) => 0,
        }
    }
}

/// One input ready for the model: token ids, an image's crop (`[3, h, w]`, u8 until its
/// batch normalizes it), or an image as a text sequence with its patches (soft-token models).
#[derive(Debug, Clone)]
pub enum ModelInput {
    Text(TokenizedInput),
    Image(image::PixelValues),
    ImageSequence(ImageSequence),
}

/// Images, audio and videos for a model that reads them inside its text
/// ([`crate::models::SoftTokenTower`], [`crate::models::AudioTokenTower`]): the tokens as the
/// model's processor makes them (`<bos> <begin> <placeholder>×n <end>` for a medium alone,
/// texts around them for interleaved parts), each image's patches, each audio's log-mel
/// frames and each video's sampled frames' patches, whose soft tokens replace their
/// placeholders (each medium its own) in order.
#[derive(Debug, Clone)]
pub struct ImageSequence {
    pub tokens: TokenizedInput,
    /// Fixed-size crops whose soft tokens fill the placeholders (ColPali's page images).
    pub crops: Vec<image::PixelValues>,
    pub patches: Vec<image::patches::Patches>,
    pub audio: Vec<audio::LogMel>,
    /// The frames of every video of the input, one video after another.
    pub video_frames: Vec<image::patches::Patches>,
}

/// Bytes per token above which a text cannot fit the model ([`Preprocessor::max_text_bytes`]):
/// real text runs 1–10 bytes per token (CJK about 3, English about 4, indented code up to
/// 10); 32 leaves room for any of it while bounding what one request can make the server copy
/// and tokenize.
pub const MAX_BYTES_PER_TOKEN: usize = 32;

/// Why an input cannot be used. Every variant but the last two is the client's (400).
#[derive(Debug, Clone, thiserror::Error)]
pub enum InputError {
    /// vLLM 0.33's words. A text over the limit reads "at least {max + 1}" there (its
    /// tokenizer stops one token past the limit), so it does here too; `got` keeps the true
    /// length (TEI's routes report it).
    #[error("This model's maximum context length is {max} tokens. However, your prompt contains {} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.", if *from_text { format!("at least {}", max + 1) } else { got.to_string() })]
    InputTooLong { max: usize, got: usize, from_text: bool },
    #[error("This model's maximum context length is {max} tokens. However, your prompt contains {bytes} bytes (more than {limit} bytes, which is the upper bound for {max} input tokens). Please reduce the length of the input prompt.")]
    TextTooLong { bytes: usize, limit: usize, max: usize },
    #[error("Token id {id} is out of vocabulary")]
    InvalidTokenId { id: i64 },
    #[error("The prompt cannot be empty")]
    EmptyPrompt,
    #[error("Input lengths must be either 1:1, 1:N or N:N")]
    InvalidPairing,
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    /// A request field this model's inputs cannot honour (e.g. `padding` without a pad token).
    #[error("{message}")]
    Field { message: String, param: &'static str },
    /// An image that cannot be used (undecodable, too large, not an image).
    #[error("{0}")]
    Image(String),
    #[error("This model does not take images: only image-text models (CLIP, SigLIP, EmbeddingGemma 2, Qwen3-VL) and page retrievers (ColPali, ColQwen, ColModernVBert) take images")]
    ImagesUnsupported,
    /// An audio input that cannot be used (undecodable, too long, too short).
    #[error("{0}")]
    Audio(String),
    #[error("This model does not take audio: only models with an audio tower (EmbeddingGemma 2's multimodal folder) embed audio")]
    AudioUnsupported,
    /// A video that cannot be used (not H.264 in MP4, undecodable, too many frames).
    #[error("{0}")]
    Video(String),
    #[error("This model does not take video: only models that read video frames (EmbeddingGemma 2's multimodal folder) embed video")]
    VideoUnsupported,
    /// An image URL or content part that cannot be used; `param` names the request field.
    #[error("{message}")]
    Media { message: String, param: Option<&'static str> },
    /// A conversation the chat template could not render (the template's reason).
    #[error("{0}")]
    Chat(String),
    /// An input worker panicked on this request (a bug; the worker goes on).
    #[error("model execution failed: {0}")]
    Panicked(&'static str),
    /// The worker threads are gone (the server is shutting down).
    #[error("the engine has stopped")]
    Stopped,
}

impl From<tokenizer::TokenizeError> for InputError {
    fn from(e: tokenizer::TokenizeError) -> Self {
        match e {
            tokenizer::TokenizeError::Failed(message) => InputError::Tokenizer(message),
            tokenizer::TokenizeError::InvalidPairing => InputError::InvalidPairing,
        }
    }
}
