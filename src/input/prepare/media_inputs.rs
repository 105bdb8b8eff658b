//! The inputs holding images, audio and video ([`Prompt::Image`], [`Prompt::Interleaved`]):
//! CLIP and SigLIP crops, and for soft-token models (EmbeddingGemma 2) patches, log-mel frames
//! and sampled video frames with the text sequence that frames them, as the model's processor
//! builds it. Decoding runs on the
//! input workers; [`Preprocessor::prepare_wave`] sends the prompts that hold media here.

use super::{check_length, ImageProcessing, InputOptions, PageFrame, PageText, Preprocessor, SoftTokenFrame};
use crate::input::image::patches::preprocess_patches;
use crate::input::tokenizer::{EncodeOptions, TextInput, TruncationSide};
use crate::input::video::VideoFrames;
use crate::input::{ImageSequence, InputError, ModelInput, Part, Prompt};
use crate::models::batch::TokenizedInput;
use std::sync::Arc;

impl Preprocessor {
    /// Decodes and preprocesses `images`, the request's from `first` on (of `in_request`), into
    /// u8 crops (normalized when their batch runs), one after another on one worker of the pool
    /// (as texts are tokenized there): the other workers stay free for other requests.
    /// The inputs holding images ([`Prompt::Image`], [`Prompt::Interleaved`]), decoded on the
    /// input workers; `first` is the index of their first image among the request's
    /// `in_request`, for messages that name an image.
    pub(super) async fn prepare_images(
        &self,
        prompts: Vec<Prompt>,
        numbering: MediaNumbering,
        options: &InputOptions,
    ) -> Result<Vec<ModelInput>, InputError> {
        let (first, in_request) = (numbering.first_image, numbering.images_in_request);
        let has_audio = prompts.iter().any(|p| p.audio_count() > 0);
        if has_audio && self.audio.is_none() {
            return Err(InputError::AudioUnsupported);
        }
        if prompts.iter().any(|p| p.video_count() > 0) && !self.takes_video() {
            return Err(InputError::VideoUnsupported);
        }
        let Some(side) = self.images.as_ref() else {
            if prompts.iter().any(|p| p.image_count() > 0) {
                return Err(InputError::ImagesUnsupported);
            }
            // An audio model without an image tower.
            return self.soft_token_media(prompts, None, numbering, options).await;
        };
        let started = std::time::Instant::now();
        let limits = side.limits;
        let name = move |i: usize, e: crate::input::image::ImageError| {
            InputError::Image(if in_request > 1 { format!("image {}: {e}", first + i) } else { e.to_string() })
        };
        let inputs = match &side.processing {
            ImageProcessing::Crop { processor, tables } => {
                if prompts.iter().any(|p| matches!(p, Prompt::Interleaved(_) | Prompt::Chat(_))) {
                    return Err(InputError::Media {
                        message: "one input holds several parts (text and an image, or several images): this model embeds one text or one image per input; send them as separate inputs".into(),
                        param: None,
                    });
                }
                let (processor, tables) = (Arc::clone(processor), Arc::clone(tables));
                self.workers
                    .execute(move || {
                        prompts
                            .iter()
                            .flat_map(image_bytes)
                            .enumerate()
                            .map(|(i, bytes)| {
                                crate::input::image::preprocess_with(bytes, &processor, &limits, &tables)
                                    .map(ModelInput::Image)
                                    .map_err(|e| name(i, e))
                            })
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .await??
            }
            ImageProcessing::SoftTokens(frame) => {
                return self.soft_token_media(prompts, Some((frame, limits)), numbering, options).await;
            }
            ImageProcessing::Page(frame) => {
                let inputs = self.page_images(prompts, frame, limits, (first, in_request)).await?;
                crate::metrics::note_tokenization("preprocess", started, started.elapsed());
                return Ok(inputs);
            }
        };
        crate::metrics::note_tokenization("preprocess", started, started.elapsed());
        Ok(inputs)
    }

    /// A page retriever's images, decoded on one input worker: ColPali's each resized to the
    /// tower's square, with the page text tokenized at load ([`PageText::Fixed`]);
    /// ColModernVBert's each cut into Idefics3's frames, with the text of its frame grid
    /// tokenized here ([`PageText::Frames`]).
    /// An image is a document of its own: the processor takes text or images, never both in
    /// one input.
    async fn page_images(
        &self,
        prompts: Vec<Prompt>,
        frame: &PageFrame,
        limits: crate::input::image::ImageLimits,
        (first, in_request): (usize, usize),
    ) -> Result<Vec<ModelInput>, InputError> {
        if !prompts.iter().all(lone_image) {
            return Err(one_page_per_input());
        }
        let (processor, tables) = (Arc::clone(&frame.processor), Arc::clone(&frame.tables));
        let sequence = |tokens: TokenizedInput, crops| {
            ModelInput::ImageSequence(ImageSequence { tokens, crops, patches: Vec::new(), audio: Vec::new(), video_frames: Vec::new() })
        };
        match &frame.text {
            PageText::Fixed(tokens) => {
                let crops = self
                    .workers
                    .execute(move || {
                        each_medium(&prompts, image_bytes, (first, in_request, "image"), InputError::Image, |bytes| {
                            crate::input::image::preprocess_with(bytes, &processor, &limits, &tables)
                        })
                    })
                    .await??;
                check_length(tokens.len(), self.max_model_len, false)?;
                Ok(crops.into_iter().map(|crop| sequence(tokens.clone(), vec![crop])).collect())
            }
            PageText::Frames { prefix, suffix, special_tokens, max_frames } => {
                let max_frames = *max_frames;
                let pages = self
                    .workers
                    .execute(move || {
                        each_medium(&prompts, image_bytes, (first, in_request, "image"), InputError::Image, |bytes| {
                            crate::input::image::frames::preprocess_frames(bytes, &processor, &limits, &tables, max_frames)
                        })
                    })
                    .await??;
                let texts = pages
                    .iter()
                    .map(|page| {
                        let frames = crate::input::image::frames::frames_text(page.rows, page.cols, &frame.placeholder, frame.tokens);
                        TextInput::Single(format!("{prefix}{frames}{suffix}"))
                    })
                    .collect();
                let encode = EncodeOptions {
                    add_special_tokens: *special_tokens,
                    truncate_to: None,
                    side: TruncationSide::Right,
                    pair_limits: Default::default(),
                };
                let encoded = self.workers.encode(texts, encode).await?;
                pages
                    .into_iter()
                    .zip(encoded)
                    .map(|(page, tokens)| {
                        let tokens = tokens?;
                        check_length(tokens.len(), self.max_model_len, false)?;
                        Ok(sequence(tokens, page.frames))
                    })
                    .collect()
            }
        }
    }

    /// The inputs of a soft-token model: each image cut into patches and each audio decoded
    /// into log-mel frames on one input worker, then the text sequences
    /// ([`Self::image_sequences`]).
    async fn soft_token_media(
        &self,
        prompts: Vec<Prompt>,
        images: Option<(&SoftTokenFrame, crate::input::image::ImageLimits)>,
        numbering: MediaNumbering,
        options: &InputOptions,
    ) -> Result<Vec<ModelInput>, InputError> {
        let started = std::time::Instant::now();
        let MediaNumbering {
            first_image: first,
            images_in_request: in_request,
            first_audio,
            audio_in_request,
            first_video,
            videos_in_request,
        } = numbering;
        let patch_config = images.map(|(frame, limits)| (frame.patches, limits));
        let video_config = images.and_then(|(frame, _)| frame.video.as_ref()).map(|side| (side.config, side.limits));
        let audio_config = self.audio.as_ref().map(|side| (Arc::clone(&side.features), side.limits));
        let (prompts, patches, audio, videos) = self
            .workers
            .execute(move || {
                let patches = match patch_config {
                    Some((config, limits)) => {
                        each_medium(&prompts, image_bytes, (first, in_request, "image"), InputError::Image, |bytes| {
                            preprocess_patches(bytes, &config, &limits)
                        })?
                    }
                    None if prompts.iter().any(|p| p.image_count() > 0) => return Err(InputError::ImagesUnsupported),
                    None => Vec::new(),
                };
                let audio = match audio_config {
                    Some((features, limits)) => {
                        each_medium(&prompts, audio_bytes, (first_audio, audio_in_request, "audio"), InputError::Audio, |bytes| {
                            crate::input::audio::preprocess(bytes, &features, &limits)
                        })?
                    }
                    None => Vec::new(),
                };
                let videos = match video_config {
                    Some((config, limits)) => {
                        each_medium(&prompts, video_bytes, (first_video, videos_in_request, "video"), InputError::Video, |bytes| {
                            crate::input::video::preprocess(bytes, &config, &limits)
                        })?
                    }
                    None if prompts.iter().any(|p| p.video_count() > 0) => return Err(InputError::VideoUnsupported),
                    None => Vec::new(),
                };
                Ok::<_, InputError>((prompts, patches, audio, videos))
            })
            .await??;
        let media = Media { patches, audio, videos };
        let inputs = self.image_sequences(prompts, media, images.map(|(frame, _)| frame), options).await?;
        crate::metrics::note_tokenization("preprocess", started, started.elapsed());
        Ok(inputs)
    }

    /// The text sequences of media inputs for a soft-token model, as its processor builds them:
    /// each image or audio is `begin placeholder×n end` (n its soft tokens); an interleaved
    /// input's parts are joined with a newline, its text behind the request's prompt (a medium
    /// alone gets no prompt, as the processor gives it none); tokenized with special tokens and
    /// never truncated (a cut sequence would lose placeholders).
    async fn image_sequences(
        &self,
        prompts: Vec<Prompt>,
        media: Media,
        frame: Option<&SoftTokenFrame>,
        options: &InputOptions,
    ) -> Result<Vec<ModelInput>, InputError> {
        let Media { patches, audio, videos } = media;
        let image_text = |p: &crate::input::image::patches::Patches| -> Result<String, InputError> {
            let frame = frame.ok_or(InputError::ImagesUnsupported)?;
            Ok(format!("{}{}{}", frame.begin, frame.placeholder.repeat(frame.patches.soft_tokens(p.positions.len())), frame.end))
        };
        let audio_text = |a: &crate::input::audio::LogMel| -> Result<String, InputError> {
            let side = self.audio.as_ref().ok_or(InputError::AudioUnsupported)?;
            Ok(format!("{}{}{}", side.begin, side.placeholder.repeat(side.soft_tokens(a)), side.end))
        };
        let video_text = |v: &VideoFrames| -> Result<String, InputError> {
            let frame = frame.ok_or(InputError::VideoUnsupported)?;
            let side = frame.video.as_ref().ok_or(InputError::VideoUnsupported)?;
            Ok(crate::input::video::video_text(v, &side.config, [&frame.begin, &side.placeholder, &frame.end]))
        };
        let (mut next_image, mut next_audio, mut next_video) = (patches.iter(), audio.iter(), videos.iter());
        let page = frame.and_then(|f| f.page.as_ref());
        let mixed = frame.is_some_and(|f| f.mixed);
        if page.is_some() && !mixed && prompts.iter().any(|p| !lone_image(p)) {
            return Err(one_page_per_input());
        }
        // A chat turn's parts follow one another (the chat template writes them so);
        // EmbeddingGemma 2's processor puts a newline between them.
        let separator = if page.is_some() && mixed { "" } else { "\n" };
        let mut texts = Vec::with_capacity(prompts.len());
        let chat = prompts.iter().any(|p| matches!(p, Prompt::Chat(_)));
        if chat && !prompts.iter().all(|p| matches!(p, Prompt::Chat(_) | Prompt::Text(_))) {
            return Err(InputError::Media { message: "chat messages and other media inputs cannot share a request".into(), param: None });
        }
        let mut media_text = |part: &Part| -> Result<String, InputError> {
            match part {
                Part::Text(text) => Ok(text.clone()),
                Part::Image(_) => next_image.next().ok_or(InputError::Stopped).and_then(image_text),
                Part::Audio(_) => next_audio.next().ok_or(InputError::Stopped).and_then(audio_text),
                Part::Video(_) => next_video.next().ok_or(InputError::Stopped).and_then(video_text),
            }
        };
        for prompt in &prompts {
            let text = match prompt {
                // The template placed every part: they stand as they are, with no prompt.
                Prompt::Chat(parts) => parts.iter().map(&mut media_text).collect::<Result<String, _>>()?,
                Prompt::Interleaved(parts) => {
                    let joined = parts.iter().map(&mut media_text).collect::<Result<Vec<_>, _>>()?.join(separator);
                    let alone = matches!(parts.as_slice(), [Part::Audio(_)] | [Part::Image(_)] | [Part::Video(_)]);
                    // A frame with an instruction takes the prompt there, whatever the input.
                    let prompt = match page {
                        Some(page) if page.instruction.is_some() => "",
                        _ if alone => "",
                        _ => options.prompt.as_deref().unwrap_or(""),
                    };
                    format!("{prompt}{joined}")
                }
                // A lone image: the next image's text (the part only names the kind).
                _ => media_text(&Part::Image(Vec::new()))?,
            };
            let text = match page {
                Some(page) => {
                    let (prefix, _) = page.prefix_with(options.prompt.as_deref());
                    format!("{prefix}{text}{}", page.suffix)
                }
                None => text,
            };
            texts.push(TextInput::Single(text));
        }
        // Where a page's processor writes its special tokens itself the tokenizer adds none;
        // where it calls the tokenizer with its defaults (the Qwen-based retrievers) the
        // tokenizer's post-processor runs, as there.
        // A chat template wrote its special tokens: the request's `add_special_tokens` (false
        // unless it says otherwise) decides, as for rendered text conversations.
        let encode = EncodeOptions {
            add_special_tokens: if chat { options.encode.add_special_tokens } else { page.is_none_or(|page| page.special_tokens) },
            truncate_to: None,
            side: TruncationSide::Right,
            pair_limits: Default::default(),
        };
        let tokens = self.workers.encode(texts, encode).await?;
        let (mut patches, mut audio, mut videos) = (patches.into_iter(), audio.into_iter(), videos.into_iter());
        let mut inputs = Vec::with_capacity(prompts.len());
        for (prompt, tokens) in prompts.iter().zip(tokens) {
            let tokens = tokens?;
            check_length(tokens.len(), self.max_model_len, false)?;
            let images: Vec<_> = patches.by_ref().take(prompt.image_count()).collect();
            let sounds: Vec<_> = audio.by_ref().take(prompt.audio_count()).collect();
            let video_frames: Vec<_> = videos.by_ref().take(prompt.video_count()).flat_map(|v| v.frames).collect();
            self.check_placeholders(&tokens.ids, frame, (&images, &sounds, &video_frames))?;
            inputs.push(ModelInput::ImageSequence(ImageSequence {
                tokens,
                crops: Vec::new(),
                patches: images,
                audio: sounds,
                video_frames,
            }));
        }
        Ok(inputs)
    }

    /// Each medium's placeholders in `ids` are exactly its soft tokens: placeholders typed as
    /// text would take soft tokens meant for others.
    fn check_placeholders(
        &self,
        ids: &[u32],
        frame: Option<&SoftTokenFrame>,
        (images, sounds, video_frames): (
            &[crate::input::image::patches::Patches],
            &[crate::input::audio::LogMel],
            &[crate::input::image::patches::Patches],
        ),
    ) -> Result<(), InputError> {
        let count = |id: u32| ids.iter().filter(|&&t| t == id).count();
        if let Some(frame) = frame {
            let soft: usize = images.iter().map(|p| frame.patches.soft_tokens(p.positions.len())).sum();
            if count(frame.placeholder_id) != soft {
                return Err(placeholder_typed("image", &frame.placeholder));
            }
        }
        if let Some(side) = &self.audio {
            if count(side.placeholder_id) != sounds.iter().map(|a| side.soft_tokens(a)).sum::<usize>() {
                return Err(placeholder_typed("audio", &side.placeholder));
            }
        }
        if let Some(side) = frame.and_then(|f| f.video.as_ref()) {
            if count(side.placeholder_id) != video_frames.iter().map(|p| side.config.patches.soft_tokens(p.positions.len())).sum::<usize>()
            {
                return Err(placeholder_typed("video", &side.placeholder));
            }
        }
        Ok(())
    }
}

/// Each medium of one kind in `prompts` (`bytes_of`), prepared by `prepare` in order; the first
/// failure is the answer, named by its number in the request when the request has several
/// (`numbering`: the wave's first one's number, the request's count, the noun).
fn each_medium<T, E: std::fmt::Display>(
    prompts: &[Prompt],
    bytes_of: fn(&Prompt) -> Vec<&[u8]>,
    (first, in_request, noun): (usize, usize, &str),
    error: fn(String) -> InputError,
    prepare: impl Fn(&[u8]) -> Result<T, E>,
) -> Result<Vec<T>, InputError> {
    prompts
        .iter()
        .flat_map(bytes_of)
        .enumerate()
        .map(|(i, bytes)| {
            prepare(bytes).map_err(|e| error(if in_request > 1 { format!("{noun} {}: {e}", first + i) } else { e.to_string() }))
        })
        .collect()
}

/// Where a wave's first image, audio and video are among the request's, and how many it has:
/// the numbers error messages name.
#[derive(Debug, Clone, Copy)]
pub(super) struct MediaNumbering {
    pub(super) first_image: usize,
    pub(super) images_in_request: usize,
    pub(super) first_audio: usize,
    pub(super) audio_in_request: usize,
    pub(super) first_video: usize,
    pub(super) videos_in_request: usize,
}

/// A wave's decoded media, in request order.
struct Media {
    patches: Vec<crate::input::image::patches::Patches>,
    audio: Vec<crate::input::audio::LogMel>,
    videos: Vec<VideoFrames>,
}

/// An input that is one image and nothing else: a page retriever's document.
fn lone_image(prompt: &Prompt) -> bool {
    match prompt {
        Prompt::Image(_) => true,
        _ => matches!(prompt.parts(), [Part::Image(_)]),
    }
}

/// A page retriever's processor takes texts (queries) or images (pages), never both in one
/// input.
fn one_page_per_input() -> InputError {
    InputError::Media {
        message: "one input holds several parts (text and an image, or several images): this model embeds one text (a query) or one image (a page) per input; send them as separate inputs".into(),
        param: None,
    }
}

/// A placeholder token found in a medium's input text beyond what its media made.
pub(super) fn placeholder_typed(medium: &str, placeholder: &str) -> InputError {
    InputError::Media {
        message: format!("the input's text holds the {medium} placeholder token `{placeholder}`; it may only come from {medium} inputs"),
        param: None,
    }
}

/// The encoded audio of a prompt, in order.
pub(super) fn audio_bytes(prompt: &Prompt) -> Vec<&[u8]> {
    prompt.parts().iter().filter_map(|p| if let Part::Audio(bytes) = p { Some(bytes.as_slice()) } else { None }).collect()
}

/// The encoded videos of a prompt, in order.
pub(super) fn video_bytes(prompt: &Prompt) -> Vec<&[u8]> {
    prompt.parts().iter().filter_map(|p| if let Part::Video(bytes) = p { Some(bytes.as_slice()) } else { None }).collect()
}

/// The encoded images of a prompt, in order.
pub(super) fn image_bytes(prompt: &Prompt) -> Vec<&[u8]> {
    match prompt {
        Prompt::Image(bytes) => vec![bytes],
        _ => prompt.parts().iter().filter_map(|p| if let Part::Image(bytes) = p { Some(bytes.as_slice()) } else { None }).collect(),
    }
}
