//! Images in requests: where their bytes come from, and the chat-style content parts that
//! carry them (vLLM's `messages`, Cohere's `inputs`, `/score`'s `{"content": […]}` sides).
//!
//! A data URL (`data:image/png;base64,…`) always works. An http(s) URL is fetched only when
//! its host is one the server allows (`--allowed-media-domains`, as vLLM names it; exact host
//! names, on the scheme's default port unless an entry is `host:port`), with no redirects (a redirect could leave the allowed hosts), a time limit
//! (`--media-fetch-timeout`) and a size limit (`--payload-limit`, the bound a data URL has).
//! Decoding happens in [`super::image`] on the input workers, which refuses what is not a PNG, JPEG or WebP image.
//!
//! A request's images are fetched together ([`content_prompts`], [`images_bytes`]): up to
//! [`FETCHES_AT_ONCE`] at a time, all of them under one deadline of `--media-fetch-timeout` per
//! round of that many (a request of 40 URLs waits at most 3 timeouts, not 40 one after another).

use super::image::decode_data_url;
use super::{InputError, Part, Prompt};
use serde_json::Value;
use std::io::Read;
use std::time::Duration;

/// How the server gets images that requests name by URL.
#[derive(Debug, Clone)]
pub struct MediaOptions {
    /// Hosts whose http(s) image URLs are fetched; empty: none (data URLs only).
    pub allowed_domains: Vec<String>,
    pub fetch_timeout: Duration,
    /// Largest image fetched, in bytes.
    pub max_bytes: usize,
}

impl Default for MediaOptions {
    fn default() -> Self {
        MediaOptions { allowed_domains: Vec::new(), fetch_timeout: Duration::from_secs(5), max_bytes: 2_000_000 }
    }
}

fn bad(message: impl Into<String>) -> InputError {
    InputError::Media { message: message.into(), param: None }
}

/// How many of one request's image URLs are fetched at once.
pub const FETCHES_AT_ONCE: usize = 16;

/// The bytes of every image at `urls`, in order, fetched together (module docs); the first
/// failure is the answer.
pub async fn images_bytes(urls: Vec<String>, options: &MediaOptions) -> Result<Vec<Vec<u8>>, InputError> {
    media_bytes(urls.into_iter().map(|url| (url, Medium::Image)).collect(), options).await
}

/// What a media URL holds: the data URL's expected type and the words of error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    Image,
    Audio,
    Video,
}

impl Medium {
    fn noun(self) -> &'static str {
        match self {
            Medium::Image => "image",
            Medium::Audio => "audio",
            Medium::Video => "video",
        }
    }
}

/// [`images_bytes`] for images and audio in one request, in order.
pub async fn media_bytes(urls: Vec<(String, Medium)>, options: &MediaOptions) -> Result<Vec<Vec<u8>>, InputError> {
    let rounds = urls.iter().filter(|(u, _)| !u.starts_with("data:")).count().div_ceil(FETCHES_AT_ONCE).max(1);
    let deadline = options.fetch_timeout.saturating_mul(rounds as u32);
    let count = urls.len();
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(FETCHES_AT_ONCE));
    let mut fetches = tokio::task::JoinSet::new();
    for (index, (url, medium)) in urls.into_iter().enumerate() {
        let (options, permits) = (options.clone(), std::sync::Arc::clone(&permits));
        fetches.spawn(async move {
            let _permit = permits.acquire_owned().await.map_err(|_| InputError::Stopped)?;
            medium_bytes(&url, medium, &options).await.map(|bytes| (index, bytes))
        });
    }
    let collect = async {
        let mut images: Vec<Option<Vec<u8>>> = vec![None; count];
        while let Some(done) = fetches.join_next().await {
            let (index, bytes) = done.map_err(|_| InputError::Panicked("an image fetch panicked"))??;
            images[index] = Some(bytes);
        }
        images.into_iter().map(|image| image.ok_or(InputError::Stopped)).collect::<Result<Vec<_>, _>>()
    };
    // Dropping the set on the deadline aborts the fetches still waiting for a permit; those
    // already on a blocking thread end at their own timeout.
    tokio::time::timeout(deadline, collect).await.map_err(|_| {
        bad(format!(
            "Fetching the request's {count} images took longer than {:?} ({:?} per {FETCHES_AT_ONCE} images, --media-fetch-timeout)",
            deadline, options.fetch_timeout
        ))
    })?
}

/// The bytes of the image at `url`.
pub async fn image_bytes(url: &str, options: &MediaOptions) -> Result<Vec<u8>, InputError> {
    medium_bytes(url, Medium::Image, options).await
}

/// [`image_bytes`] for either medium.
pub async fn medium_bytes(url: &str, medium: Medium, options: &MediaOptions) -> Result<Vec<u8>, InputError> {
    if url.starts_with("data:") {
        return match medium {
            Medium::Image => decode_data_url(url).map_err(|e| bad(e.to_string())),
            Medium::Audio => decode_typed_data_url(url, "audio", "data:audio/wav;base64,…"),
            Medium::Video => decode_typed_data_url(url, "video", "data:video/mp4;base64,…"),
        };
    }
    let parsed = url::Url::parse(url).map_err(|_| {
        bad(format!(
            "Invalid {} URL `{}`: expected a data URL (data:{}/…;base64,…) or an http(s) URL",
            medium.noun(),
            shorten(url),
            medium.noun()
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(format!(
            "Unsupported {} URL scheme `{}`: send a data URL (data:{}/…;base64,…) or an http(s) URL",
            medium.noun(),
            parsed.scheme(),
            medium.noun()
        )));
    }
    let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
    // A bare host allows its scheme's default port only; `host:port` entries allow that port.
    let allowed = match parsed.port() {
        None => options.allowed_domains.iter().any(|d| d.eq_ignore_ascii_case(&host)),
        Some(port) => options.allowed_domains.iter().any(|d| d.eq_ignore_ascii_case(&format!("{host}:{port}"))),
    };
    if !allowed {
        let noun = medium.noun();
        return Err(InputError::Media {
            message: format!(
                "The {noun} URL's host `{host}` is not allowed: this server fetches media only from the hosts of --allowed-media-domains{}; send the {noun} as a data URL",
                if options.allowed_domains.is_empty() { " (none set)".to_string() } else { format!(" ({})", options.allowed_domains.join(", ")) }
            ),
            param: None,
        });
    }
    let (url, options) = (url.to_string(), options.clone());
    tokio::task::spawn_blocking(move || fetch(&url, medium, &options))
        .await
        .map_err(|_| InputError::Panicked("the media fetch panicked"))?
}

/// The bytes of an audio or video data URL: `data:audio/wav;base64,…` (any `{noun}/` type, or
/// none).
fn decode_typed_data_url(url: &str, noun: &str, example: &str) -> Result<Vec<u8>, InputError> {
    let rest = url.strip_prefix("data:").unwrap_or(url);
    let (meta, data) = rest.split_once(',').ok_or_else(|| bad("Invalid data URL: no `,` before the data"))?;
    let Some(media_type) = meta.strip_suffix(";base64") else {
        return Err(bad(format!("Invalid data URL: the {noun} must be base64-encoded ({example})")));
    };
    let typed = media_type.split_once('/').is_some_and(|(kind, _)| kind == noun);
    if !(media_type.is_empty() || typed || media_type == "application/octet-stream") {
        return Err(bad(format!("Invalid data URL: media type `{media_type}` is not {noun}")));
    }
    base64_bytes(data)
}

/// Base64 (standard alphabet, line breaks tolerated) to bytes.
fn base64_bytes(data: &str) -> Result<Vec<u8>, InputError> {
    use base64::Engine as _;
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| bad(format!("The audio's base64 data does not decode ({e})")))
}

fn fetch(url: &str, medium: Medium, options: &MediaOptions) -> Result<Vec<u8>, InputError> {
    let noun = medium.noun();
    let agent = ureq::AgentBuilder::new().timeout(options.fetch_timeout).redirects(0).build();
    let response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Status(code, _) => bad(format!("Fetching the {noun} at {} failed: HTTP {code}", shorten(url))),
        ureq::Error::Transport(t) => bad(format!("Fetching the {noun} at {} failed: {t}", shorten(url))),
    })?;
    if (300..400).contains(&response.status()) {
        return Err(bad(format!("Fetching the {noun} at {} failed: it redirects, and redirects are not followed", shorten(url))));
    }
    let mut bytes = Vec::new();
    response
        .into_reader()
        .take(options.max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("Fetching the {noun} at {} failed: {e}", shorten(url))))?;
    if bytes.len() > options.max_bytes {
        return Err(bad(format!("The {noun} at {} is larger than the server's limit of {} bytes", shorten(url), options.max_bytes)));
    }
    Ok(bytes)
}

/// A URL as messages quote it: a data URL's megabytes are not echoed back.
fn shorten(url: &str) -> String {
    match url.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &url[..i]),
        None => url.to_string(),
    }
}

/// One embedding input from chat-style content: a string, or a list of parts
/// (`{"type": "text", "text": …}`, `{"type": "image_url", "image_url": {"url": …}}`). Text
/// parts alone are joined with a newline. Text and images, or several images, in one content
/// are one [`Prompt::Interleaved`] input, parts in order: EmbeddingGemma 2 reads them as one
/// sequence; CLIP and SigLIP embed a text or an image, not both together, and refuse it
/// (asking for separate inputs).
pub async fn content_prompt(content: &Value, options: &MediaOptions) -> Result<Prompt, InputError> {
    content_prompts(std::slice::from_ref(content), options).await?.pop().ok_or(InputError::Stopped)
}

/// [`content_prompt`] for every input of a request, their images fetched together.
pub async fn content_prompts(contents: &[Value], options: &MediaOptions) -> Result<Vec<Prompt>, InputError> {
    let parsed = contents.iter().map(parse_content).collect::<Result<Vec<_>, _>>()?;
    let urls: Vec<(String, Medium)> = parsed.iter().flat_map(Content::urls).map(|(url, medium)| (url.to_string(), medium)).collect();
    let mut media = media_bytes(urls, options).await?.into_iter();
    let mut next_medium = || media.next().ok_or(InputError::Stopped);
    parsed
        .into_iter()
        .map(|content| match content {
            Content::Text(text) => Ok(Prompt::Text(text)),
            Content::Image(_) => next_medium().map(Prompt::Image),
            Content::Interleaved(parts) => parts
                .into_iter()
                .map(|part| match part {
                    RawPart::Text(text) => Ok(Part::Text(text)),
                    RawPart::Image(_) => next_medium().map(Part::Image),
                    RawPart::Audio(_) => next_medium().map(Part::Audio),
                    RawPart::Video(_) => next_medium().map(Part::Video),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Prompt::Interleaved),
        })
        .collect()
}

/// An input's content before its images are fetched.
enum Content {
    Text(String),
    Image(String),
    Interleaved(Vec<RawPart>),
}

enum RawPart {
    Text(String),
    Image(String),
    /// An `audio_url`'s URL, or an `input_audio`'s data as a data URL.
    Audio(String),
    /// A `video_url`'s URL.
    Video(String),
}

impl Content {
    /// The image URLs, in order.
    fn urls(&self) -> Vec<(&str, Medium)> {
        match self {
            Content::Text(_) => Vec::new(),
            Content::Image(url) => vec![(url, Medium::Image)],
            Content::Interleaved(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    RawPart::Image(url) => Some((url.as_str(), Medium::Image)),
                    RawPart::Audio(url) => Some((url.as_str(), Medium::Audio)),
                    RawPart::Video(url) => Some((url.as_str(), Medium::Video)),
                    RawPart::Text(_) => None,
                })
                .collect(),
        }
    }
}

/// What one input's content holds (module docs of [`content_prompt`]).
fn parse_content(content: &Value) -> Result<Content, InputError> {
    let parts = match content {
        Value::String(text) => return Ok(Content::Text(text.clone())),
        Value::Array(parts) => parts,
        _ => return Err(bad("`content` must be a string or a list of content parts")),
    };
    let mut parsed = Vec::with_capacity(parts.len());
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => parsed.push(RawPart::Text(
                part.get("text").and_then(Value::as_str).ok_or_else(|| bad("a `text` content part needs a string `text`"))?.to_string(),
            )),
            Some("image_url") => parsed.push(RawPart::Image(url_of(part, "image_url", "data:image/…;base64,…")?.to_string())),
            Some("audio_url") => parsed.push(RawPart::Audio(url_of(part, "audio_url", "data:audio/wav;base64,…")?.to_string())),
            Some("input_audio") => parsed.push(RawPart::Audio(input_audio_of(part)?)),
            Some("video_url") => parsed.push(RawPart::Video(url_of(part, "video_url", "data:video/mp4;base64,…")?.to_string())),
            Some(other) => {
                return Err(bad(format!(
                    "Unsupported content part type `{other}`: use `text`, `image_url`, `audio_url`, `input_audio` or `video_url`"
                )))
            }
            None => return Err(bad("every content part needs a `type` (`text`, `image_url`, `audio_url`, `input_audio` or `video_url`)")),
        }
    }
    if let [RawPart::Image(url)] = parsed.as_slice() {
        return Ok(Content::Image(url.clone()));
    }
    if parsed.is_empty() {
        return Err(bad("an input's content holds no text and no media"));
    }
    if parsed.iter().any(|p| matches!(p, RawPart::Image(_) | RawPart::Audio(_) | RawPart::Video(_))) {
        return Ok(Content::Interleaved(parsed));
    }
    let texts: Vec<String> = parsed.into_iter().filter_map(|p| if let RawPart::Text(t) = p { Some(t) } else { None }).collect();
    Ok(Content::Text(texts.join("\n")))
}

/// OpenAI's `{"type": "input_audio", "input_audio": {"data": base64, "format": "wav"}}`, as a
/// data URL. The format names the container (`wav`, `mp3`, `flac`, `ogg`); the decoder reads
/// the bytes whatever it says.
fn input_audio_of(part: &Value) -> Result<String, InputError> {
    let field = part.get("input_audio").ok_or_else(|| bad("an `input_audio` content part needs an `input_audio`"))?;
    let data = field
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`input_audio` must be {\"data\": base64, \"format\": \"wav\" | \"mp3\" | …}"))?;
    let format = field.get("format").and_then(Value::as_str).unwrap_or("wav");
    Ok(format!("data:audio/{format};base64,{data}"))
}

/// The URL of an `image_url` or `audio_url` part: `part[kind]["url"]` (OpenAI, Cohere, vLLM), or
/// `part[kind]` as a plain string.
fn url_of<'a>(part: &'a Value, kind: &str, example: &str) -> Result<&'a str, InputError> {
    let field = part.get(kind).ok_or_else(|| bad(format!("an `{kind}` content part needs an `{kind}`")))?;
    field
        .as_str()
        .or_else(|| field.get("url").and_then(Value::as_str))
        .ok_or_else(|| bad(format!("`{kind}` must be {{\"url\": \"{example}\"}} or a URL string")))
}

/// vLLM's chat-style embedding request: one input per message, from its `content`.
pub async fn message_prompts(messages: &Value, options: &MediaOptions) -> Result<Vec<Prompt>, InputError> {
    let messages = messages
        .as_array()
        .ok_or_else(|| InputError::Media { message: "`messages` must be a list of messages".into(), param: Some("messages") })?;
    if messages.is_empty() {
        return Err(InputError::Media { message: "`messages` must not be empty".into(), param: Some("messages") });
    }
    let contents = messages
        .iter()
        .map(|message| {
            message
                .get("content")
                .cloned()
                .ok_or_else(|| InputError::Media { message: "every message needs a `content`".into(), param: Some("messages") })
        })
        .collect::<Result<Vec<_>, _>>()?;
    content_prompts(&contents, options).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn data_urls_decode_and_refuse_what_is_not_base64_image_data() {
        assert_eq!(decode_data_url("data:image/png;base64,aGVs\nbG8=").unwrap(), b"hello");
        assert!(decode_data_url("data:image/png,hello").is_err());
        assert!(decode_data_url("data:text/plain;base64,aGVsbG8=").is_err());
        assert!(decode_data_url("data:image/png;base64,!!!").is_err());
    }

    #[test]
    fn urls_of_hosts_not_allowed_are_refused_without_a_fetch() {
        let options = MediaOptions::default();
        for url in ["https://example.com/cat.png", "file:///etc/passwd", "ftp://example.com/a.png", "not a url"] {
            assert!(run(image_bytes(url, &options)).is_err(), "{url}");
        }
    }

    #[test]
    fn content_holds_one_text_or_one_image() {
        let options = MediaOptions::default();
        let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}});
        assert_eq!(run(content_prompt(&json!("hi"), &options)).unwrap(), Prompt::Text("hi".into()));
        let texts = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]);
        assert_eq!(run(content_prompt(&texts, &options)).unwrap(), Prompt::Text("a\nb".into()));
        assert_eq!(run(content_prompt(&json!([image]), &options)).unwrap(), Prompt::Image(b"hello".to_vec()));
        // Parts in order; whether the model takes them together is the model's to say.
        assert_eq!(
            run(content_prompt(&json!([image, {"type": "text", "text": "a"}]), &options)).unwrap(),
            Prompt::Interleaved(vec![Part::Image(b"hello".to_vec()), Part::Text("a".into())])
        );
        assert_eq!(
            run(content_prompt(&json!([image, image]), &options)).unwrap(),
            Prompt::Interleaved(vec![Part::Image(b"hello".to_vec()), Part::Image(b"hello".to_vec())])
        );
        assert!(run(content_prompt(&json!([{"type": "audio_url"}]), &options)).is_err());
        assert!(run(content_prompt(&json!([]), &options)).is_err());
    }
}
