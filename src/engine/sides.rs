//! A loaded model's input sides, decided once when its engine starts: how its images, pages,
//! audio and framed queries become model inputs (the input layer's settings, sized to the
//! batch limits), and which towers the model thread runs for them. A model whose files cannot
//! serve a side (a framing token missing from the vocabulary, a page prompt that does not
//! tokenize as its processor writes it) is refused here, before any request.

use super::scheduler::BatchLimits;
use super::{EngineError, EngineOptions};
use crate::input::tokenizer::{EncodeOptions, TextTokenizer, TruncationSide};
use crate::input::{AudioSide, ImageProcessing, ImageSide, PageFrame, PageText, SoftTokenFrame, TextFrame, VideoSide};
use crate::loader::{AudioInput, VisionInput};
use crate::models::batch::TokenizedInput;
use crate::models::{AudioTokenTower, CropTokenTower, ImageTokens, RetrievalPrompts, SoftTokenTower, VisionTower};
use std::sync::Arc;

/// What the input layer and the model thread each get of a model's media and framing.
#[derive(Default)]
pub(super) struct InputSides {
    pub images: Option<ImageSide>,
    pub vision: Option<Box<dyn VisionTower>>,
    pub soft_vision: Option<Box<dyn SoftTokenTower>>,
    pub page_vision: Option<Box<dyn CropTokenTower>>,
    pub audio: Option<AudioSide>,
    pub soft_audio: Option<Box<dyn AudioTokenTower>>,
    /// A retrieval model's frame around every text (its processor's query prompt).
    pub query_frame: Option<TextFrame>,
}

impl InputSides {
    pub fn new(
        vision: Option<VisionInput>,
        audio: Option<AudioInput>,
        retrieval: Option<RetrievalPrompts>,
        tokenizer: &TextTokenizer,
        (limits, max_model_len): (&BatchLimits, usize),
        options: &EngineOptions,
    ) -> Result<Self, EngineError> {
        let image_limits = crate::input::image::ImageLimits { max_pixels: options.max_image_pixels };
        let mut sides = match vision {
            Some(VisionInput::Pooled { tower, processor }) => {
                let tokens_per_image = tower.tokens_per_image();
                let processing = ImageProcessing::Crop {
                    tables: Arc::new(crate::input::image::ChannelTables::new(&processor)),
                    processor: Arc::new(processor),
                };
                Self {
                    images: Some(image_side(processing, image_limits, tokens_per_image, limits)),
                    vision: Some(tower),
                    ..Self::default()
                }
            }
            Some(VisionInput::SoftTokens { tower, patches, video }) => {
                let ids = tower.image_tokens();
                let [begin, placeholder, end] = framing_strings(tokenizer, ids, "image")?;
                let video = match (video, tower.video_token()) {
                    (Some(config), Some(id)) => {
                        let [placeholder] = token_strings(tokenizer, [id], "the video token is")?;
                        let limits = crate::input::video::VideoLimits { max_frames: options.max_video_frames, ..Default::default() };
                        Some(VideoSide { config, limits, placeholder, placeholder_id: id })
                    }
                    _ => None,
                };
                // An image's cost: at most its budget of soft tokens in the text, three framing
                // tokens, and the tower's pass over its patches.
                let tokens_per_image = patches.max_soft_tokens + patches.max_patches() + 4;
                let processing = ImageProcessing::SoftTokens(Box::new(SoftTokenFrame {
                    patches,
                    begin,
                    placeholder,
                    end,
                    placeholder_id: ids.placeholder,
                    video,
                    page: retrieval.as_ref().map(|p| TextFrame {
                        prefix: p.image_prefix.clone(),
                        suffix: p.image_suffix.clone(),
                        trim: false,
                        instruction: p.instruction.clone(),
                        special_tokens: p.special_tokens,
                    }),
                    mixed: retrieval.as_ref().is_some_and(|p| p.mixed),
                }));
                Self {
                    images: Some(image_side(processing, image_limits, tokens_per_image, limits)),
                    soft_vision: Some(tower),
                    ..Self::default()
                }
            }
            Some(VisionInput::Page { tower, processor }) => {
                let prompts = retrieval.as_ref().ok_or_else(|| setup("a page retriever without its processor's prompts"))?;
                let (processing, tokens_per_image) = page_processing(&*tower, processor, prompts, tokenizer, max_model_len)?;
                Self {
                    images: Some(image_side(processing, image_limits, tokens_per_image, limits)),
                    page_vision: Some(tower),
                    ..Self::default()
                }
            }
            None => Self::default(),
        };
        sides.query_frame = retrieval.map(|p| TextFrame {
            prefix: p.query_prefix,
            suffix: p.query_suffix,
            trim: p.strips_queries,
            instruction: p.instruction,
            special_tokens: p.special_tokens,
        });
        if let Some(AudioInput { tower, features }) = audio {
            let ids = tower.audio_tokens();
            let [begin, placeholder, end] = framing_strings(tokenizer, ids, "audio")?;
            sides.audio = Some(AudioSide {
                features: Arc::new(features),
                limits: crate::input::audio::AudioLimits { max_declared_seconds: options.max_audio_seconds as f64 },
                frames_per_token: tower.frames_per_token(),
                begin,
                placeholder,
                end,
                placeholder_id: ids.placeholder,
            });
            sides.soft_audio = Some(tower);
        }
        Ok(sides)
    }
}

/// An image side whose images cost `tokens_per_image` of a batch: its waves are half a batch
/// of them, so that one wave runs while the next is decoded.
fn image_side(
    processing: ImageProcessing,
    limits: crate::input::image::ImageLimits,
    tokens_per_image: usize,
    batch: &BatchLimits,
) -> ImageSide {
    let images_per_batch = (batch.max_tokens / tokens_per_image.max(1)).min(batch.max_seqs);
    ImageSide { processing, limits, tokens_per_image, wave: (images_per_batch / 2).max(1) }
}

/// A page retriever's pages: ColPali's one crop a page with the same text for every page
/// (tokenized here, once), or Idefics3's frames (ColModernVBert), whose text depends on the
/// page; and what a page costs of a batch: its soft tokens and the prompt around them in the
/// text, and the tower's pass over as many patches (a page of frames costs that many times
/// over).
fn page_processing(
    tower: &dyn CropTokenTower,
    processor: crate::input::image::ImageProcessorConfig,
    prompts: &RetrievalPrompts,
    tokenizer: &TextTokenizer,
    max_model_len: usize,
) -> Result<(ImageProcessing, usize), EngineError> {
    let placeholder_id = tower.placeholder();
    let [placeholder] = token_strings(tokenizer, [placeholder_id], "the image token is")?;
    let (tokens, patches) = (tower.tokens_per_image(), tower.patches_per_image());
    let (text, frames) = match processor.splitting {
        Some(split) => {
            // A page whose placeholders alone pass max_model_len can never run.
            let max_frames = max_model_len / tokens.max(1);
            let most = match processor.size {
                crate::input::image::Size::LongestEdge(n) if split.enabled => n.div_ceil(split.tile.max(1)).pow(2) + 1,
                _ => 1,
            };
            let text = PageText::Frames {
                prefix: prompts.image_prefix.clone(),
                suffix: prompts.image_suffix.clone(),
                special_tokens: prompts.special_tokens,
                max_frames,
            };
            (text, most.min(max_frames).max(1))
        }
        None => (PageText::Fixed(fixed_page_prompt(tokenizer, prompts, &placeholder, placeholder_id, tokens)?), 1),
    };
    let processing = ImageProcessing::Page(Box::new(PageFrame {
        tables: Arc::new(crate::input::image::ChannelTables::new(&processor)),
        processor: Arc::new(processor),
        text,
        placeholder,
        placeholder_id,
        tokens,
        patches,
    }));
    Ok((processing, frames * (tokens + patches) + 16))
}

/// A page retriever's page text when every page has the same one (ColPali, one crop a page):
/// `prefix placeholder×tokens suffix`, tokenized once without the tokenizer's special tokens
/// (the processor's prompt writes them), checked to hold its `tokens` placeholders.
fn fixed_page_prompt(
    tokenizer: &TextTokenizer,
    prompts: &RetrievalPrompts,
    placeholder: &str,
    placeholder_id: u32,
    tokens: usize,
) -> Result<TokenizedInput, EngineError> {
    let text = format!("{}{}{}", prompts.image_prefix, placeholder.repeat(tokens), prompts.image_suffix);
    let encode =
        EncodeOptions { add_special_tokens: false, truncate_to: None, side: TruncationSide::Right, pair_limits: Default::default() };
    let prompt = tokenizer.encode(&text, encode).map_err(|e| setup(format!("the page prompt: {e}")))?;
    if prompt.ids.iter().filter(|&&t| t == placeholder_id).count() != tokens {
        return Err(setup(format!("the page prompt does not tokenize into {tokens} `{placeholder}` tokens")));
    }
    Ok(prompt)
}

/// The strings of a medium's framing tokens (`begin placeholder end`), as the text that the
/// preprocessor writes around it; a tokenizer without them cannot serve that medium.
fn framing_strings(tokenizer: &TextTokenizer, ids: ImageTokens, medium: &str) -> Result<[String; 3], EngineError> {
    token_strings(tokenizer, [ids.begin, ids.placeholder, ids.end], &format!("the {medium} tokens are"))
}

/// The tokens' strings; `what` names them with their verb ("the image token is").
fn token_strings<const N: usize>(tokenizer: &TextTokenizer, ids: [u32; N], what: &str) -> Result<[String; N], EngineError> {
    <[String; N]>::try_from(tokenizer.token_strings(&ids)).map_err(|_| setup(format!("{what} not in the tokenizer's vocabulary")))
}

fn setup(message: impl Into<String>) -> EngineError {
    EngineError::Setup(message.into())
}
