//! The steps every prompt takes before the model, in [`Preprocessor`], the model's input side:
//!
//! 1. **Bound**: a text longer than any input the model takes could need
//!    ([`Preprocessor::max_text_bytes`]) is cut when the request truncates, refused when it
//!    does not, before it is copied or tokenized (a megabyte text is not tokenized only to be
//!    refused afterwards);
//! 2. **Prompt**: a sentence-transformers prompt is prepended to texts, as `encode` does;
//! 3. **Tokenize** on the input workers, with the request's truncation (token-id inputs are
//!    checked against the vocabulary and truncated the same way);
//! 4. **Pad** to `max_model_len` for `padding: "max_length"`, or to the length a model was
//!    trained at (SigLIP);
//! 5. **Check** the length against the model's limit; images and audio are decoded into what
//!    their towers take ([`media_inputs`]).

use super::chat_template::{ChatOptions, ChatTemplate};
use super::tokenizer::{self, EncodeOptions, TextInput, TextTokenizer, TokenInfo, TruncationSide};
use super::workers::InputWorkers;

mod media_chat;
mod media_inputs;
mod sides;
use super::{InputError, ModelInput, Prompt, MAX_BYTES_PER_TOKEN};
use crate::models::batch::TokenizedInput;
pub use media_chat::ChatTurn;
use media_inputs::{audio_bytes, image_bytes, video_bytes, MediaNumbering};
pub use sides::{AudioSide, ImageProcessing, ImageSide, PageFrame, PageText, SoftTokenFrame, TextFrame, VideoSide};
use std::borrow::Cow;
use std::sync::Arc;

/// Part of one request's prompts for [`Preprocessor::prepare_wave`]: at most
/// [`ImageSide::wave`] images and audio, with the texts between them, in order.
#[derive(Debug)]
pub struct Wave {
    prompts: Vec<Prompt>,
    /// Where the wave's first image (and audio) is among the request's, and how many the
    /// request has (for error messages that name the request's image or audio).
    first_image: usize,
    images_in_request: usize,
    first_audio: usize,
    audio_in_request: usize,
    first_video: usize,
    videos_in_request: usize,
}

impl Wave {
    /// A request in one wave.
    fn whole(prompts: Vec<Prompt>) -> Self {
        let images_in_request = image_count(&prompts);
        let audio_in_request = prompts.iter().map(Prompt::audio_count).sum();
        let videos_in_request = prompts.iter().map(Prompt::video_count).sum();
        Wave { prompts, first_image: 0, images_in_request, first_audio: 0, audio_in_request, first_video: 0, videos_in_request }
    }

    /// The wave's prompts, in the request's order.
    pub fn prompts(&self) -> &[Prompt] {
        &self.prompts
    }
}

/// How one request's prompts become inputs, decided by the engine from the request's
/// validated parameters.
#[derive(Debug, Clone)]
pub struct InputOptions {
    /// Special tokens, truncation and the per-side caps of pairs.
    pub encode: EncodeOptions,
    /// A sentence-transformers prompt, prepended to texts (not to pairs or token ids).
    pub prompt: Option<Arc<str>>,
    /// vLLM's `padding: "max_length"`: pad to `max_model_len` after truncating.
    pub pad_to_max_length: bool,
    /// The longest input accepted: `max_model_len`, or `max_embed_len` for embeddings with
    /// chunked processing.
    pub max_len: usize,
}

/// The model's side of the input work: its tokenizer on the input workers, its chat template,
/// its image processing and the limits its inputs obey.
pub struct Preprocessor {
    workers: InputWorkers,
    chat_template: Arc<ChatTemplate>,
    images: Option<ImageSide>,
    audio: Option<AudioSide>,
    /// The backbone's vocabulary (token ids at or past it cannot be embedded).
    vocab_size: usize,
    max_model_len: usize,
    /// `(length, pad id)` for models trained on padded texts (SigLIP).
    pad_text_to: Option<(usize, u32)>,
    /// What a retrieval processor puts around every text (ColPali's queries).
    query_frame: Option<TextFrame>,
    /// The served name, the metrics' `model` label.
    served_name: String,
}

/// What a [`Preprocessor`] is built from (the loader's pieces and the model's limits).
pub struct PreprocessorParts {
    pub tokenizer: TextTokenizer,
    pub workers: usize,
    pub chat_template: ChatTemplate,
    pub images: Option<ImageSide>,
    pub audio: Option<AudioSide>,
    pub vocab_size: usize,
    pub max_model_len: usize,
    pub pad_text_to: Option<(usize, u32)>,
    pub query_frame: Option<TextFrame>,
    pub served_name: String,
}

impl Preprocessor {
    /// Starts the worker threads.
    pub fn start(parts: PreprocessorParts) -> std::io::Result<Self> {
        let PreprocessorParts {
            tokenizer,
            workers,
            chat_template,
            images,
            audio,
            vocab_size,
            max_model_len,
            pad_text_to,
            query_frame,
            served_name,
        } = parts;
        Ok(Self {
            workers: InputWorkers::new(Arc::new(tokenizer), workers)?,
            chat_template: Arc::new(chat_template),
            images,
            audio,
            vocab_size,
            max_model_len,
            pad_text_to,
            query_frame,
            served_name,
        })
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        self.workers.tokenizer()
    }

    /// The tokenizer, for a holder that outlives a borrow (an IO-processor plugin's calls).
    pub fn shared_tokenizer(&self) -> Arc<TextTokenizer> {
        self.workers.shared()
    }

    /// The size of the model's vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether the model takes images (an image-text model).
    pub fn takes_images(&self) -> bool {
        self.images.is_some()
    }

    /// Whether the model's prompt frame has an instruction, which a request's prompt (or a
    /// chat request's system message) replaces (Qwen3-VL-Embedding).
    pub fn takes_instruction(&self) -> bool {
        self.query_frame.as_ref().is_some_and(|f| f.instruction.is_some())
    }

    /// Whether the model takes audio (it has an audio tower).
    pub fn takes_audio(&self) -> bool {
        self.audio.is_some()
    }

    /// Whether the model takes video (its processor samples frames for its vision tower).
    pub fn takes_video(&self) -> bool {
        self.video_side().is_some()
    }

    fn video_side(&self) -> Option<&VideoSide> {
        match &self.images.as_ref()?.processing {
            ImageProcessing::SoftTokens(frame) => frame.video.as_ref(),
            ImageProcessing::Crop { .. } | ImageProcessing::Page(_) => None,
        }
    }

    /// What one image counts in a batch and in `usage` (its sequence in the vision tower); 0
    /// for text models.
    pub fn tokens_per_image(&self) -> usize {
        self.images.as_ref().map_or(0, |side| side.tokens_per_image)
    }

    /// A page retriever's image placeholder typed in a text (or given as a token id) would
    /// stand for an image that is not there: refused, as the soft-token models refuse one
    /// typed beside their media.
    fn check_no_page_placeholder(&self, input: &TokenizedInput) -> Result<(), InputError> {
        let (placeholder, id) = match self.images.as_ref().map(|side| &side.processing) {
            Some(ImageProcessing::Page(frame)) => (&frame.placeholder, frame.placeholder_id),
            Some(ImageProcessing::SoftTokens(frame)) if frame.page.is_some() => (&frame.placeholder, frame.placeholder_id),
            _ => return Ok(()),
        };
        match input.ids.contains(&id) {
            true => Err(media_inputs::placeholder_typed("image", placeholder)),
            false => Ok(()),
        }
    }

    /// The tower patches of a page retriever's crop (its soft tokens are in the text); 0 for
    /// other models.
    fn page_tokens(&self) -> usize {
        match self.images.as_ref().map(|side| &side.processing) {
            Some(ImageProcessing::Page(frame)) => frame.patches,
            _ => 0,
        }
    }

    /// What an input costs in a batch's token budget.
    pub fn cost(&self, input: &ModelInput) -> usize {
        match input {
            ModelInput::Text(tokens) => tokens.len(),
            ModelInput::Image(_) => self.tokens_per_image().max(1),
            // The text sequence, and the towers' passes over the patches and the audio.
            ModelInput::ImageSequence(media) => {
                media.tokens.len()
                    + media.crops.len() * self.page_tokens()
                    + media.patches.iter().chain(&media.video_frames).map(|p| p.positions.len()).sum::<usize>()
                    + self.audio.as_ref().map_or(0, |side| media.audio.iter().map(|a| side.soft_tokens(a)).sum())
            }
        }
    }

    /// The front door: every prompt (texts, token ids, pairs, images) made ready for the
    /// model, in order, each checked against the model's limits. Requests with more images
    /// than [`ImageSide::wave`] go through [`Self::waves`] instead, so as not to hold them all.
    pub async fn prepare(&self, prompts: Vec<Prompt>, options: &InputOptions) -> Result<Vec<ModelInput>, InputError> {
        let whole = Wave::whole(prompts);
        self.prepare_wave(whole, options).await
    }

    /// Cuts a request into [`Wave`]s of at most [`ImageSide::wave`] media (images and audio),
    /// so that it is decoded a wave at a time (the caller runs each wave while the next is
    /// decoded): a request of many 30-second clips holds one wave of them, not all. When there
    /// is more than one wave, every image's and audio's header is checked first
    /// ([`check_header`], [`decode::check_header`]), so a medium that is refused fails the
    /// request before any wave runs, as it would in one wave.
    ///
    /// [`check_header`]: super::image::check_header
    /// [`decode::check_header`]: super::audio::decode::check_header
    pub async fn waves(&self, prompts: Vec<Prompt>) -> Result<Vec<Wave>, InputError> {
        let whole = Wave::whole(prompts);
        let media_in_request = whole.images_in_request + whole.audio_in_request + whole.videos_in_request;
        let Some(side) = self.images.as_ref().filter(|side| media_in_request > side.wave.max(1)) else {
            return Ok(vec![whole]);
        };
        let Wave { prompts, images_in_request, audio_in_request, videos_in_request, .. } = whole;
        let (per_wave, limits) = (side.wave.max(1), side.limits);
        let audio = self.audio.as_ref().map(|side| (side.features.sampling_rate, side.features.max_samples, side.limits));
        let video_limits = self.video_side().map(|side| side.limits);
        let prompts = self
            .workers
            .execute(move || {
                let mut index = 0;
                for prompt in &prompts {
                    for bytes in image_bytes(prompt) {
                        super::image::check_header(bytes, &limits).map_err(|e| InputError::Image(format!("image {index}: {e}")))?;
                        index += 1;
                    }
                }
                if let Some((rate, max_samples, limits)) = audio {
                    for (index, bytes) in prompts.iter().flat_map(audio_bytes).enumerate() {
                        super::audio::decode::check_header(bytes, rate, max_samples, &limits)
                            .map_err(|e| InputError::Audio(format!("audio {index}: {e}")))?;
                    }
                }
                if let Some(limits) = video_limits {
                    for (index, bytes) in prompts.iter().flat_map(video_bytes).enumerate() {
                        super::video::check_header(bytes, &limits).map_err(|e| InputError::Video(format!("video {index}: {e}")))?;
                    }
                }
                Ok::<_, InputError>(prompts)
            })
            .await??;
        let mut waves = Vec::with_capacity(media_in_request.div_ceil(per_wave));
        let mut wave = Wave {
            prompts: Vec::new(),
            first_image: 0,
            images_in_request,
            first_audio: 0,
            audio_in_request,
            first_video: 0,
            videos_in_request,
        };
        let (mut images_seen, mut audio_seen, mut videos_seen) = (0, 0, 0);
        for prompt in prompts {
            // An input's media stay together: a wave may hold an interleaved input's few more.
            if prompt.media_count() > 0 {
                if images_seen + audio_seen + videos_seen - wave.first_image - wave.first_audio - wave.first_video >= per_wave {
                    let next = Wave {
                        prompts: Vec::new(),
                        first_image: images_seen,
                        images_in_request,
                        first_audio: audio_seen,
                        audio_in_request,
                        first_video: videos_seen,
                        videos_in_request,
                    };
                    waves.push(std::mem::replace(&mut wave, next));
                }
                images_seen += prompt.image_count();
                audio_seen += prompt.audio_count();
                videos_seen += prompt.video_count();
            }
            wave.prompts.push(prompt);
        }
        waves.push(wave);
        Ok(waves)
    }

    /// [`Self::prepare`] for one of [`Self::waves`].
    pub async fn prepare_wave(&self, wave: Wave, options: &InputOptions) -> Result<Vec<ModelInput>, InputError> {
        let Wave { prompts, first_image, images_in_request, first_audio, audio_in_request, first_video, videos_in_request } = wave;
        if !prompts.iter().any(|p| p.media_count() > 0) {
            return Ok(self.prepare_texts(prompts, options).await?.into_iter().map(ModelInput::Text).collect());
        }
        let mut texts = Vec::new();
        let mut images = Vec::new();
        let mut is_image = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let image = prompt.media_count() > 0;
            is_image.push(image);
            if image {
                images.push(prompt);
            } else {
                texts.push(prompt);
            }
        }
        let numbering = MediaNumbering { first_image, images_in_request, first_audio, audio_in_request, first_video, videos_in_request };
        let pixels = self.prepare_images(images, numbering, options).await?;
        let texts = if texts.is_empty() { Vec::new() } else { self.prepare_texts(texts, options).await? };
        let (mut texts, mut pixels) = (texts.into_iter(), pixels.into_iter());
        is_image
            .into_iter()
            .map(|image| {
                let next = if image { pixels.next() } else { texts.next().map(ModelInput::Text) };
                next.ok_or(InputError::Stopped)
            })
            .collect()
    }

    /// [`Self::prepare`] for prompts without images: their token ids.
    pub async fn prepare_texts(&self, prompts: Vec<Prompt>, options: &InputOptions) -> Result<Vec<TokenizedInput>, InputError> {
        let started = std::time::Instant::now();
        let characters = prompts.iter().map(Prompt::characters).sum::<usize>();
        crate::metrics::note(|t| t.characters.set(t.characters.get() + characters));
        let inputs = self.tokenize_and_check(prompts, options).await?;
        self.note_tokenized(started, &inputs);
        Ok(inputs)
    }

    /// Cross-encoder pairs (`pairs` index `queries` and `documents`), each distinct text
    /// tokenized once, checked against the model's limits like [`Self::prepare`]'s inputs.
    pub async fn prepare_pairs(
        &self,
        queries: &[String],
        documents: &[String],
        pairs: Vec<(usize, usize)>,
        options: &InputOptions,
    ) -> Result<Vec<TokenizedInput>, InputError> {
        let started = std::time::Instant::now();
        let count = |texts: &[String], i: usize| texts.get(i).map_or(0, |t| t.chars().count());
        let characters = pairs.iter().map(|&(q, d)| count(queries, q) + count(documents, d)).sum::<usize>();
        crate::metrics::note(|t| t.characters.set(t.characters.get() + characters));
        let limits = options.encode.pair_limits;
        let bound = |texts: &[String], side_limit: Option<usize>| {
            texts.iter().map(|t| self.bounded_side(t, options, side_limit).map(Cow::into_owned)).collect::<Result<Vec<_>, _>>()
        };
        let (queries, documents) = (bound(queries, limits.query)?, bound(documents, limits.document)?);
        let encoded = self.workers.encode_pairs(queries, documents, pairs, options.encode).await?;
        let inputs = encoded.into_iter().collect::<Result<Vec<_>, _>>()?;
        for input in &inputs {
            check_length(input.len(), options.max_len, true)?;
        }
        self.note_tokenized(started, &inputs);
        Ok(inputs)
    }

    /// One text tokenized as [`Self::prepare`] tokenizes it (prompt prefix, special tokens,
    /// truncation), without the length checks: `/tokenize` reports what the model would see.
    pub async fn tokenize(&self, text: String, options: &InputOptions) -> Result<TokenizedInput, InputError> {
        let text = self.framed(options.prompt.as_deref(), &text);
        self.workers.encode(vec![TextInput::Single(text)], self.text_encoding(options)).await?.pop().ok_or(InputError::Stopped)?
    }

    /// A text as the model reads it: behind the request's prompt, inside the retrieval
    /// processor's frame where there is one.
    fn framed(&self, prompt: Option<&str>, text: &str) -> String {
        match &self.query_frame {
            Some(frame) => {
                let (prefix, prompt) = frame.prefix_with(prompt);
                format!("{prefix}{prompt}{}{}", if frame.trim { text.trim() } else { text }, frame.suffix)
            }
            None => format!("{}{text}", prompt.unwrap_or("")),
        }
    }

    /// How single texts are encoded: the request's options, without the tokenizer's special
    /// tokens inside a retrieval frame (the frame writes them, as the processor does).
    fn text_encoding(&self, options: &InputOptions) -> EncodeOptions {
        match &self.query_frame {
            Some(frame) if !frame.special_tokens => EncodeOptions { add_special_tokens: false, ..options.encode },
            _ => options.encode,
        }
    }

    /// Each conversation rendered by the chat template into one text, on the input workers (a
    /// long conversation through a large template is not the async runtime's work).
    /// `template`: a request's own template (the HTTP layer has checked that it may).
    pub async fn render_chat(
        &self,
        conversations: Vec<Vec<serde_json::Value>>,
        options: ChatOptions,
        template: Option<String>,
    ) -> Result<Vec<String>, InputError> {
        let chat = Arc::clone(&self.chat_template);
        self.workers
            .execute(move || {
                conversations
                    .iter()
                    .map(|messages| match &template {
                        Some(source) => chat.render_source(source, messages, &options),
                        None => chat.render(messages, &options),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| InputError::Chat(e.0))
            })
            .await?
    }

    /// The text of token ids (/detokenize), off the async runtime.
    pub async fn detokenize(&self, ids: Vec<u32>) -> Result<String, InputError> {
        self.workers.decode(ids, false).await
    }

    /// The texts of several id lists (TEI's `/decode`), on a blocking thread.
    pub async fn decode_all(&self, ids: Vec<Vec<u32>>, skip_special_tokens: bool) -> Result<Vec<String>, InputError> {
        let tokenizer = self.workers.shared();
        tokio::task::spawn_blocking(move || ids.iter().map(|i| tokenizer.decode(i, skip_special_tokens)).collect::<Result<Vec<_>, _>>())
            .await
            .map_err(|_| InputError::Stopped)?
            .map_err(InputError::from)
    }

    /// TEI's `/tokenize` tokens of each text ([`TextTokenizer::tokens`]), on the input workers.
    pub async fn tokens(&self, texts: Vec<String>, add_special_tokens: bool) -> Result<Vec<Vec<TokenInfo>>, InputError> {
        let tokenizer = self.workers.shared();
        self.workers
            .execute(move || texts.iter().map(|t| tokenizer.tokens(t, add_special_tokens)).collect::<Result<Vec<_>, _>>())
            .await?
            .map_err(InputError::from)
    }

    /// Each token's character range in `text` (late chunking's source ranges), on the worker
    /// pool.
    pub async fn char_offsets(&self, text: String, add_special_tokens: bool) -> Result<Vec<(usize, usize)>, InputError> {
        let tokenizer = self.workers.shared();
        self.workers.execute(move || tokenizer.char_offsets(&text, add_special_tokens)).await?.map_err(InputError::from)
    }

    /// Token ids the model can embed: vLLM names the largest id past the vocabulary.
    pub fn check_token_ids(&self, ids: &[u32]) -> Result<(), InputError> {
        match ids.iter().max() {
            Some(&id) if id as usize >= self.vocab_size => Err(InputError::InvalidTokenId { id: id as i64 }),
            _ => Ok(()),
        }
    }

    /// Longest text, in bytes, that tokenizing could ever need: [`MAX_BYTES_PER_TOKEN`] per
    /// token of the longest input accepted.
    pub fn max_text_bytes(&self, options: &InputOptions) -> usize {
        options.max_len.saturating_mul(MAX_BYTES_PER_TOKEN)
    }

    /// `text`, or its cut to [`Self::max_text_bytes`] when the request truncates (the end the
    /// truncation side drops, at a character boundary), or an error when it does not.
    pub fn bounded<'a>(&self, text: &'a str, options: &InputOptions) -> Result<Cow<'a, str>, InputError> {
        self.bounded_side(text, options, None)
    }

    /// [`Self::bounded`] for one side of a cross-encoder pair whose side is cut to
    /// `side_limit` tokens (`max_tokens_per_query` / `_per_doc`): that cut always keeps the
    /// start, so the text is cut from the right to what those tokens could use, whatever the
    /// request's truncation.
    fn bounded_side<'a>(&self, text: &'a str, options: &InputOptions, side_limit: Option<usize>) -> Result<Cow<'a, str>, InputError> {
        let limit = self.max_text_bytes(options);
        let side_bytes = side_limit.map(|n| n.saturating_mul(MAX_BYTES_PER_TOKEN));
        if text.len() <= side_bytes.map_or(limit, |s| s.min(limit)) {
            return Ok(Cow::Borrowed(text));
        }
        let keep_start = |bytes: usize| {
            let end = (0..=bytes.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            Cow::Borrowed(&text[..end])
        };
        if let Some(side) = side_bytes {
            return Ok(keep_start(side.min(limit)));
        }
        if options.encode.truncate_to.is_none() {
            return Err(InputError::TextTooLong { bytes: text.len(), limit, max: self.max_model_len });
        }
        Ok(match options.encode.side {
            TruncationSide::Right => keep_start(limit),
            TruncationSide::Left => {
                let start = (text.len() - limit..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
                Cow::Borrowed(&text[start..])
            }
        })
    }

    async fn tokenize_and_check(&self, prompts: Vec<Prompt>, options: &InputOptions) -> Result<Vec<TokenizedInput>, InputError> {
        let limits = options.encode.pair_limits;
        let with_prompt = |text: &str| -> Result<String, InputError> {
            let text = self.bounded(text, options)?;
            Ok(self.framed(options.prompt.as_deref(), &text))
        };
        let texts: Vec<TextInput> = prompts
            .iter()
            .filter_map(|p| match p {
                Prompt::Text(t) => Some(with_prompt(t).map(TextInput::Single)),
                Prompt::Pair(q, d) => Some(
                    self.bounded_side(q, options, limits.query)
                        .and_then(|q| Ok(TextInput::Pair(q.into_owned(), self.bounded_side(d, options, limits.document)?.into_owned()))),
                ),
                Prompt::Tokens(_) | Prompt::Image(_) | Prompt::Interleaved(_) | Prompt::Chat(_) => None,
            })
            .collect::<Result<_, _>>()?;
        let encoding = if prompts.iter().any(|p| matches!(p, Prompt::Pair(..))) { options.encode } else { self.text_encoding(options) };
        let mut encoded = if texts.is_empty() { Vec::new().into_iter() } else { self.workers.encode(texts, encoding).await?.into_iter() };
        let mut inputs = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let from_text = !matches!(prompt, Prompt::Tokens(_));
            let input = match prompt {
                Prompt::Text(_) | Prompt::Pair(..) => encoded.next().ok_or(InputError::Stopped)??,
                Prompt::Tokens(ids) => {
                    if ids.is_empty() {
                        return Err(InputError::EmptyPrompt);
                    }
                    self.check_token_ids(&ids)?;
                    tokenizer::truncate_ids(ids, options.encode)
                }
                Prompt::Image(_) | Prompt::Interleaved(_) | Prompt::Chat(_) => {
                    return Err(InputError::Panicked("an image reached the tokenizer"))
                }
            };
            let input = self.padded(input, options)?;
            check_length(input.len(), options.max_len, from_text)?;
            self.check_no_page_placeholder(&input)?;
            inputs.push(input);
        }
        Ok(inputs)
    }

    /// `input` padded with the tokenizer's pad token: to `max_model_len` when the request asks
    /// for `padding: "max_length"` (vLLM pads after truncating, before the length check), or
    /// to the model's fixed text length for models trained so (SigLIP).
    fn padded(&self, mut input: TokenizedInput, options: &InputOptions) -> Result<TokenizedInput, InputError> {
        let target = match (options.pad_to_max_length, self.pad_text_to) {
            (true, _) => {
                let pad = self.tokenizer().pad_id().ok_or_else(|| InputError::Field {
                    message: "padding: \"max_length\" needs a pad token, and this model's tokenizer has none".into(),
                    param: "padding",
                })?;
                Some((self.max_model_len, pad))
            }
            (false, fixed) => fixed,
        };
        if let Some((len, pad)) = target {
            if input.len() < len {
                input.type_ids.resize(len, 0);
                input.ids.resize(len, pad);
            }
        }
        Ok(input)
    }

    fn note_tokenized(&self, started: std::time::Instant, inputs: &[TokenizedInput]) {
        let elapsed = started.elapsed();
        crate::metrics::tokenized(&self.served_name, elapsed, inputs.iter().map(TokenizedInput::len).sum());
        crate::metrics::note_tokenization("tokenize", started, elapsed);
    }

    /// Test hook for [`InputWorkers::panic_in_a_worker`].
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn panic_in_a_worker(&self) -> Result<(), InputError> {
        self.workers.panic_in_a_worker().await?.into_iter().next().ok_or(InputError::Stopped)?.map(|_| ())
    }
}

fn image_count(prompts: &[Prompt]) -> usize {
    prompts.iter().map(Prompt::image_count).sum()
}

/// The input's length against the longest accepted. `from_text`: the input was tokenized from
/// text, whose excess vLLM reports as "at least {limit + 1}" (see [`InputError::InputTooLong`]).
fn check_length(len: usize, max: usize, from_text: bool) -> Result<(), InputError> {
    if len > max {
        return Err(InputError::InputTooLong { max, got: len, from_text });
    }
    if len == 0 {
        return Err(InputError::EmptyPrompt);
    }
    Ok(())
}
