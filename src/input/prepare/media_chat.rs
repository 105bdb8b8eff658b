//! Chat messages holding media, for a model that reads media inside its text and has a chat
//! template (an EmbeddingGemma 2 folder that ships one): the folder's template decides where
//! each part goes, as vLLM renders such a conversation. Each medium reaches the template as
//! `{"type": "image"}` (`"audio"`, `"video"`) or, for a template that reads content as a string,
//! as its placeholder ([`MediaPlaceholders`]); the rendered text is then cut at the
//! placeholders the template wrote and each medium put back there, per kind in order (the
//! processor's replacement of its n-th `<|image|>` by the n-th image's soft tokens): a
//! [`Prompt::Chat`], which the media inputs expand with no separator and no prompt.

use super::{ImageProcessing, Preprocessor};
use crate::input::chat_template::{ChatOptions, MediaPlaceholders};
use crate::input::{InputError, Part, Prompt};
use serde_json::{json, Value};
use std::sync::Arc;

/// One message of a conversation: its role and what it holds (parsed content, media fetched).
#[derive(Debug, Clone)]
pub struct ChatTurn {
    pub role: String,
    pub prompt: Prompt,
}

impl Preprocessor {
    /// The placeholders of the media this model reads inside its text (`None` for a model
    /// that reads none, or that frames its media itself: the page retrievers, Qwen3-VL's
    /// embedder): where a chat template decides.
    pub fn media_placeholders(&self) -> Option<MediaPlaceholders> {
        let audio = self.audio.as_ref().map(|side| side.placeholder.clone());
        let (image, video) = match self.images.as_ref().map(|side| &side.processing) {
            Some(ImageProcessing::SoftTokens(frame)) if frame.page.is_none() => {
                (Some(frame.placeholder.clone()), frame.video.as_ref().map(|v| v.placeholder.clone()))
            }
            Some(_) => return None,
            None => (None, None),
        };
        (image.is_some() || audio.is_some()).then_some(MediaPlaceholders { image, audio, video })
    }

    /// Whether the model's folder has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.has_template()
    }

    /// Each conversation through the chat template (`template`: a request's own, which the
    /// HTTP layer has allowed), its media where the template wrote their placeholders: a
    /// [`Prompt::Chat`], or a [`Prompt::Text`] for a conversation of texts only. Rendered on the
    /// input workers.
    pub async fn render_media_chat(
        &self,
        conversations: Vec<Vec<ChatTurn>>,
        mut options: ChatOptions,
        template: Option<String>,
    ) -> Result<Vec<Prompt>, InputError> {
        let placeholders = self.media_placeholders().ok_or(InputError::ImagesUnsupported)?;
        options.placeholders = Some(placeholders.clone());
        let chat = Arc::clone(&self.chat_template);
        self.workers
            .execute(move || {
                conversations
                    .into_iter()
                    .map(|turns| {
                        let messages: Vec<Value> = turns.iter().map(message_of).collect();
                        let rendered = match &template {
                            Some(source) => chat.render_source(source, &messages, &options),
                            None => chat.render(&messages, &options),
                        }
                        .map_err(|e| InputError::Chat(e.0))?;
                        let media: Vec<Part> = turns.into_iter().flat_map(|turn| parts_of(turn.prompt)).filter(is_medium).collect();
                        if media.is_empty() {
                            return Ok(Prompt::Text(rendered));
                        }
                        place_media(&rendered, &placeholders, media).map(Prompt::Chat)
                    })
                    .collect::<Result<Vec<_>, InputError>>()
            })
            .await?
    }
}

/// A turn as the template's message: its role, and its parts with each medium as its kind.
fn message_of(turn: &ChatTurn) -> Value {
    let part = |part: &Part| match part {
        Part::Text(text) => json!({"type": "text", "text": text}),
        Part::Image(_) => json!({"type": "image"}),
        Part::Audio(_) => json!({"type": "audio"}),
        Part::Video(_) => json!({"type": "video"}),
    };
    let content: Vec<Value> = match &turn.prompt {
        Prompt::Text(text) => vec![part(&Part::Text(text.clone()))],
        Prompt::Image(_) => vec![json!({"type": "image"})],
        other => other.parts().iter().map(part).collect(),
    };
    json!({"role": turn.role, "content": content})
}

fn parts_of(prompt: Prompt) -> Vec<Part> {
    match prompt {
        Prompt::Text(text) => vec![Part::Text(text)],
        Prompt::Image(bytes) => vec![Part::Image(bytes)],
        Prompt::Interleaved(parts) | Prompt::Chat(parts) => parts,
        Prompt::Tokens(_) | Prompt::Pair(..) => Vec::new(),
    }
}

fn is_medium(part: &Part) -> bool {
    !matches!(part, Part::Text(_))
}

/// The kind's name and placeholder of a medium.
fn kind_of<'a>(part: &Part, placeholders: &'a MediaPlaceholders) -> (&'static str, Option<&'a str>) {
    match part {
        Part::Image(_) => ("image", placeholders.image.as_deref()),
        Part::Audio(_) => ("audio", placeholders.audio.as_deref()),
        Part::Video(_) => ("video", placeholders.video.as_deref()),
        Part::Text(_) => ("text", None),
    }
}

/// `rendered` cut at every placeholder, each replaced by the next medium of its kind; a
/// placeholder without a medium, or a medium the template left out, is refused.
fn place_media(rendered: &str, placeholders: &MediaPlaceholders, media: Vec<Part>) -> Result<Vec<Part>, InputError> {
    let refused = |message: String| InputError::Media { message, param: Some("messages") };
    let kinds: Vec<&str> =
        [&placeholders.image, &placeholders.audio, &placeholders.video].into_iter().flatten().map(String::as_str).collect();
    let mut queues: Vec<std::collections::VecDeque<Part>> = kinds.iter().map(|_| Default::default()).collect();
    for medium in media {
        let (kind, placeholder) = kind_of(&medium, placeholders);
        let queue = placeholder.and_then(|p| kinds.iter().position(|k| *k == p));
        match queue {
            Some(i) => queues[i].push_back(medium),
            None => return Err(refused(format!("this model takes no {kind} inputs"))),
        }
    }
    let mut parts = Vec::new();
    let mut rest = rendered;
    while let Some((at, i)) = kinds.iter().enumerate().filter_map(|(i, k)| rest.find(k).map(|at| (at, i))).min() {
        if at > 0 {
            parts.push(Part::Text(rest[..at].to_string()));
        }
        let medium = queues[i]
            .pop_front()
            .ok_or_else(|| refused(format!("Found more '{}' placeholders in input prompt than actual multimodal data items.", kinds[i])))?;
        parts.push(medium);
        rest = &rest[at + kinds[i].len()..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.to_string()));
    }
    if let Some(i) = queues.iter().position(|q| !q.is_empty()) {
        return Err(refused(format!(
            "the chat template wrote fewer '{}' placeholders than the message has media of that kind; each must be written where its medium goes",
            kinds[i]
        )));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemma() -> MediaPlaceholders {
        MediaPlaceholders { image: Some("<|image|>".into()), audio: Some("<|audio|>".into()), video: Some("<|video|>".into()) }
    }

    #[test]
    fn media_go_back_where_the_template_wrote_them_each_kind_in_order() {
        let media = vec![Part::Audio(b"a1".to_vec()), Part::Image(b"i1".to_vec()), Part::Audio(b"a2".to_vec())];
        let parts = place_media("<bos>x<|image|><|audio|>y\n<|audio|>", &gemma(), media).unwrap();
        assert_eq!(
            parts,
            vec![
                Part::Text("<bos>x".into()),
                Part::Image(b"i1".to_vec()),
                Part::Audio(b"a1".to_vec()),
                Part::Text("y\n".into()),
                Part::Audio(b"a2".to_vec()),
            ]
        );
    }

    #[test]
    fn placeholders_and_media_must_agree() {
        let err = place_media("<|image|><|image|>", &gemma(), vec![Part::Image(vec![1])]).unwrap_err();
        assert_eq!(err.to_string(), "Found more '<|image|>' placeholders in input prompt than actual multimodal data items.");
        let err = place_media("<bos>text", &gemma(), vec![Part::Image(vec![1])]).unwrap_err();
        assert!(err.to_string().contains("fewer '<|image|>' placeholders"), "{err}");
        let audio_only = MediaPlaceholders { audio: Some("<|audio|>".into()), ..Default::default() };
        let err = place_media("<|image|>", &audio_only, vec![Part::Image(vec![1])]).unwrap_err();
        assert_eq!(err.to_string(), "this model takes no image inputs");
    }
}
