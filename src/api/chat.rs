//! vLLM's chat-style inputs on `/v1/embeddings`, `/classify`, `/pooling`, `/tokenize` (and
//! `/invocations`): a conversation (`messages`, or `input` holding messages; a list of
//! conversations embeds each) is rendered through the model's chat template into one text
//! input. The fields are vLLM's: `add_generation_prompt` (default false; true on
//! `/tokenize`), `continue_final_message`, `chat_template` (only with
//! `--trust-request-chat-template`), `chat_template_kwargs`, and `add_special_tokens`, which
//! defaults to false for a rendered conversation (the template writes the special tokens).
//!
//! On media models each message is one input: rendered through the folder's chat template
//! where the model reads its media inside its text and the folder has one (EmbeddingGemma 2,
//! [`crate::input::ChatTurn`]); else its content as it stands, a text or an image (CLIP,
//! SigLIP, page retrievers), see [`crate::input::media`].

use super::error::ApiError;
use super::AppState;
use crate::engine::params::ResolvedParams;
use crate::engine::Engine;
use crate::input::chat_template::ChatOptions;
use crate::input::{ChatTurn, Prompt};
use serde::Deserialize;
use serde_json::Value;

/// The chat fields of a request.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct ChatFields {
    /// End the text with the template's cue for the assistant's turn.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Leave the last message open (no end-of-turn after it).
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// A template of the request's own (needs `--trust-request-chat-template`).
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Extra variables for the template.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// A request's inputs, whether they are rendered conversations, and the instruction its
/// system messages give a model that takes one.
pub struct Inputs {
    pub prompts: Vec<Prompt>,
    pub chat: bool,
    pub instruction: Option<String>,
}

impl Inputs {
    /// `params` as they apply to these inputs: a rendered conversation gets no
    /// sentence-transformers prompt and, unless the request says otherwise, no special tokens;
    /// a system message's instruction stands in for the prompt.
    pub fn params(&self, params: ResolvedParams, add_special_tokens: Option<bool>) -> ResolvedParams {
        if let Some(instruction) = &self.instruction {
            return ResolvedParams { prompt: Some(instruction.as_str().into()), ..params };
        }
        if !self.chat {
            return params;
        }
        ResolvedParams { add_special_tokens: add_special_tokens.unwrap_or(false), prompt: None, ..params }
    }
}

/// Whether `value` is one conversation: a non-empty list of objects with a string `role`.
fn is_conversation(value: &Value) -> bool {
    value.as_array().is_some_and(|items| !items.is_empty() && items.iter().all(|m| m.get("role").is_some_and(Value::is_string)))
}

/// The conversations a `messages` value (or chat-shaped `input`) holds: one, or a list of them.
fn conversations(value: &Value, field: &'static str) -> Result<Vec<Vec<Value>>, ApiError> {
    if is_conversation(value) {
        return Ok(vec![value.as_array().cloned().unwrap_or_default()]);
    }
    match value.as_array() {
        Some(batch) if !batch.is_empty() && batch.iter().all(is_conversation) => {
            Ok(batch.iter().map(|c| c.as_array().cloned().unwrap_or_default()).collect())
        }
        Some(batch) if batch.is_empty() => {
            Err(ApiError::BadRequest { message: format!("`{field}` must not be empty"), param: Some(field) })
        }
        _ => Err(ApiError::BadRequest {
            message: format!("`{field}` must be a list of messages (objects with a `role` and a `content`), or a list of such lists"),
            param: Some(field),
        }),
    }
}

/// The inputs of a request that takes text `input` or chat `messages` (exactly one of the
/// two); `generation_prompt`: the endpoint's default for `add_generation_prompt`.
pub async fn inputs(
    state: &AppState,
    engine: &Engine,
    input: &Value,
    messages: Option<&Value>,
    chat: &ChatFields,
    generation_prompt: bool,
) -> Result<Inputs, ApiError> {
    let conversation_source = match messages {
        Some(_) if !input.is_null() => {
            return Err(ApiError::BadRequest { message: "Send either `input` or `messages`, not both".into(), param: Some("messages") })
        }
        Some(messages) => Some((messages, "messages")),
        // vLLM also reads a conversation sent as `input`.
        None if is_conversation(input) || input.as_array().is_some_and(|b| !b.is_empty() && b.iter().all(is_conversation)) => {
            Some((input, "input"))
        }
        None => None,
    };
    let Some((source, field)) = conversation_source else {
        return Ok(Inputs { prompts: state.prompts(input)?, chat: false, instruction: None });
    };
    if chat.chat_template.is_some() && !state.options().trust_request_chat_template {
        return Err(ApiError::bad_request(
            "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.",
        ));
    }
    let options = ChatOptions {
        add_generation_prompt: chat.add_generation_prompt.unwrap_or(generation_prompt),
        continue_final_message: chat.continue_final_message.unwrap_or(false),
        kwargs: chat.chat_template_kwargs.clone().unwrap_or_default(),
        placeholders: None,
    };
    if engine.spec().images {
        return media_inputs(state, engine, source, field, (options, chat.chat_template.clone())).await;
    }
    let conversations = conversations(source, field)?;
    state.check_batch_size(conversations.len())?;
    // An image is this model's problem before any template's.
    let parts = conversations.iter().flatten().filter_map(|m| m.get("content").and_then(Value::as_array)).flatten();
    if let Some(kind) = parts.filter_map(|p| p.get("type").and_then(Value::as_str)).find(|t| !matches!(*t, "text" | "input_text")) {
        let needs = match kind {
            "input_audio" | "audio_url" => "a model with an audio tower (EmbeddingGemma 2's multimodal folder)",
            "video_url" => "a model that reads video frames (EmbeddingGemma 2's multimodal folder)",
            _ => "an image-text model (CLIP, SigLIP, EmbeddingGemma 2, Qwen3-VL)",
        };
        return Err(ApiError::BadRequest {
            message: format!("content parts of type `{kind}` need {needs}; this model reads text only"),
            param: Some(field),
        });
    }

    let texts = engine.input().render_chat(conversations, options, chat.chat_template.clone()).await?;
    Ok(Inputs { prompts: texts.into_iter().map(Prompt::Text).collect(), chat: true, instruction: None })
}

/// A media model's messages, each one input: rendered by the folder's chat template (or the
/// request's) where the model reads its media inside its text (EmbeddingGemma 2), as vLLM
/// renders them; else each message's content as it stands (CLIP, SigLIP, the page retrievers,
/// Qwen3-VL-Embedding's own frame, a folder without a template).
async fn media_inputs(
    state: &AppState,
    engine: &Engine,
    source: &Value,
    field: &'static str,
    (options, template): (ChatOptions, Option<String>),
) -> Result<Inputs, ApiError> {
    if let Some(count) = source.as_array().map(Vec::len) {
        state.check_batch_size(count)?;
    }
    let input = engine.input();
    if input.media_placeholders().is_some() && (input.has_chat_template() || template.is_some()) {
        let prompts = crate::input::media::message_prompts(source, &state.options().media).await?;
        let roles = source.as_array().into_iter().flatten().map(|m| m.get("role").and_then(Value::as_str).unwrap_or("user").to_string());
        let conversations = roles.zip(prompts).map(|(role, prompt)| vec![ChatTurn { role, prompt }]).collect();
        let prompts = input.render_media_chat(conversations, options, template).await?;
        return Ok(Inputs { prompts, chat: true, instruction: None });
    }
    // A model whose frame has an instruction (Qwen3-VL-Embedding) reads the system messages
    // as that instruction, as its chat template writes them; the others embed every message.
    let (instruction, messages) = match input.takes_instruction() {
        true => system_instruction(source, field)?,
        false => (None, source.clone()),
    };
    let prompts = crate::input::media::message_prompts(&messages, &state.options().media).await?;
    Ok(Inputs { prompts, chat: false, instruction })
}

/// The text of a message list's `system` messages (joined with newlines), and the other
/// messages; `None` when there is no system message.
fn system_instruction(messages: &Value, field: &'static str) -> Result<(Option<String>, Value), ApiError> {
    let Some(list) = messages.as_array() else { return Ok((None, messages.clone())) };
    let (system, rest): (Vec<&Value>, Vec<&Value>) = list.iter().partition(|m| m.get("role").and_then(Value::as_str) == Some("system"));
    if system.is_empty() {
        return Ok((None, messages.clone()));
    }
    let text_of = |message: &Value| -> Result<String, ApiError> {
        let refused = || ApiError::BadRequest { message: "a system message's content must be text".into(), param: Some(field) };
        match message.get("content") {
            Some(Value::String(text)) => Ok(text.clone()),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| match p.get("type").and_then(Value::as_str) {
                    Some("text" | "input_text") => p.get("text").and_then(Value::as_str).map(str::to_string).ok_or_else(refused),
                    _ => Err(refused()),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|texts| texts.join("\n")),
            _ => Err(refused()),
        }
    };
    let instruction = system.into_iter().map(text_of).collect::<Result<Vec<_>, _>>()?.join("\n");
    if rest.is_empty() {
        return Err(ApiError::BadRequest {
            message: format!("`{field}` holds only system messages: nothing to embed"),
            param: Some(field),
        });
    }
    Ok((Some(instruction), Value::Array(rest.into_iter().cloned().collect())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_conversation_or_a_list_of_them() {
        let one = json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]);
        assert_eq!(conversations(&one, "messages").unwrap().len(), 1);
        let two = json!([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]);
        assert_eq!(conversations(&two, "messages").unwrap().len(), 2);
        assert!(conversations(&json!([]), "messages").is_err());
        assert!(conversations(&json!(["a"]), "messages").is_err());
        assert!(!is_conversation(&json!(["text"])));
    }
}
