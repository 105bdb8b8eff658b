//! Chat templates: how a model turns a conversation (`messages`) into the one text it embeds or
//! classifies, as vLLM renders it for pooling models (transformers' `apply_chat_template`).
//!
//! - **Which template**: `--chat-template` (a file, or the template itself when no such file
//!   exists and it holds Jinja's `{`, `}` or a newline, as vLLM decides), else
//!   `tokenizer_config.json`'s `chat_template` (a string, or named templates of which
//!   `default`), else `chat_template.jinja`, else `chat_template.json`'s. A request's own
//!   `chat_template` is taken only with `--trust-request-chat-template` (the API layer checks).
//! - **The engine** is minijinja, with transformers' settings: `trim_blocks`, `lstrip_blocks`,
//!   loop controls, Python's string and dict methods (minijinja-contrib's pycompat),
//!   `raise_exception`, `strftime_now` and a `tojson` that writes what Python's `json.dumps`
//!   writes (`", "` and `": "` separators, non-ASCII kept). Templates get `messages`,
//!   `add_generation_prompt`, `tools` and `documents` (none), the tokenizer's special tokens
//!   (`bos_token`, `eos_token`, …) and the request's `chat_template_kwargs`.
//! - **Content**: a message's `content` is a string or a list of parts; text parts are joined
//!   with a newline for templates that read content as a string, and kept as
//!   `{"type": "text", "text": …}` parts for templates that loop over it (vLLM's "openai"
//!   content format, told apart the same way: does the template iterate over a message's
//!   content?), unless `--chat-template-content-format` says which. A model that reads media
//!   in its text (EmbeddingGemma 2) gives its placeholders ([`MediaPlaceholders`]): an image,
//!   audio or video part is `{"type": "image"}` (`"audio"`, `"video"`) for templates that loop
//!   over content, and for the others its placeholder, all of them before the text, one a line
//!   (vLLM's `get_full_multimodal_text_prompt`).
//! - **continue_final_message** cuts the rendered text after the last message's content, as
//!   transformers does, so that the text ends open.
//! - **Bounds**: every render runs on fuel (minijinja's instruction budget, which also charges
//!   for the bytes it creates), so that a template, a request's included, cannot loop or grow
//!   without end.

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind};
use std::path::Path;

/// How a template reads a message's `content` (vLLM's `--chat-template-content-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string: text parts joined by newlines.
    String,
    /// OpenAI's list of parts (`{"type": "text", "text": …}`).
    OpenAi,
}

impl std::str::FromStr for ContentFormat {
    type Err = ChatError;
    fn from_str(s: &str) -> Result<Self, ChatError> {
        match s {
            "string" => Ok(ContentFormat::String),
            "openai" => Ok(ContentFormat::OpenAi),
            other => Err(ChatError(format!("unknown chat template content format `{other}` (auto, string, openai)"))),
        }
    }
}

/// Instruction budget of one render: a long conversation through the largest published
/// templates needs well under a tenth of it.
const FUEL: u64 = 5_000_000;

/// The transformers special tokens a template may name.
const SPECIAL_TOKENS: [&str; 7] = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// Why a conversation could not be rendered: the template's own complaint (`raise_exception`)
/// or a malformed conversation. A client error (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChatError(pub String);

/// What a request asks of the rendering.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// `chat_template_kwargs`: extra variables for the template.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// The model's media placeholders, when its messages may hold media (else a media part
    /// is refused).
    pub placeholders: Option<MediaPlaceholders>,
}

/// The text a model's processor expands into a medium's soft tokens, per kind (vLLM's
/// `get_placeholder_str`; EmbeddingGemma 2: `<|image|>`, `<|audio|>`, `<|video|>`); `None` for a
/// kind the model does not take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MediaPlaceholders {
    pub image: Option<String>,
    pub audio: Option<String>,
    pub video: Option<String>,
}

impl MediaPlaceholders {
    /// The placeholder of a media part's `type` (`image`, `audio`, `video`).
    fn of(&self, kind: &str) -> Option<&str> {
        match kind {
            "image" => self.image.as_deref(),
            "audio" => self.audio.as_deref(),
            "video" => self.video.as_deref(),
            _ => None,
        }
    }
}

/// A model's chat template, compiled once.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether the model has a template (else only a request's own can render).
    has_template: bool,
    content_format: ContentFormat,
    /// The tokenizer's special tokens, as template variables.
    special_tokens: Vec<(String, Value)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("content_format", &self.content_format).finish_non_exhaustive()
    }
}

/// The template text of a `--chat-template` value: its file, or the value itself (module docs).
pub fn read_flag(value: &str) -> Result<String, ChatError> {
    match std::fs::read_to_string(value) {
        Ok(text) => Ok(text),
        Err(_) if value.contains(['{', '}', '\n']) => Ok(value.to_string()),
        Err(e) => {
            Err(ChatError(format!("The supplied chat template ({value}) looks like a file path, but it failed to be opened. Reason: {e}")))
        }
    }
}

/// The folder's own template (module docs), if it has one.
pub fn from_folder(
    tokenizer_config: &serde_json::Value,
    jinja_file: Option<&Path>,
    json_file: Option<&Path>,
) -> Result<Option<String>, ChatError> {
    match tokenizer_config.get("chat_template") {
        Some(serde_json::Value::String(template)) => return Ok(Some(template.clone())),
        Some(serde_json::Value::Array(named)) => {
            let default = named.iter().find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some("default"));
            if let Some(template) = default.and_then(|t| t.get("template")).and_then(serde_json::Value::as_str) {
                return Ok(Some(template.to_string()));
            }
        }
        _ => {}
    }
    let read = |path: &Path| std::fs::read_to_string(path).map_err(|e| ChatError(format!("{}: {e}", path.display())));
    if let Some(path) = jinja_file {
        return read(path).map(Some);
    }
    if let Some(path) = json_file {
        let value: serde_json::Value = serde_json::from_str(&read(path)?).map_err(|e| ChatError(format!("{}: {e}", path.display())))?;
        return Ok(value.get("chat_template").and_then(serde_json::Value::as_str).map(str::to_string));
    }
    Ok(None)
}

/// The environment transformers renders chat templates in.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
    if let Ok(syntax) = syntax {
        env.set_syntax(syntax);
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_fuel(Some(FUEL));
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, message))
    });
    env.add_function("strftime_now", |format: String| strftime(&format, unix_now()));
    env
}

impl ChatTemplate {
    /// Compiles `source` (`None`: the model has no template); `tokenizer_config` gives the
    /// special tokens; `content_format` is the flag's choice (`None`: decided from the
    /// template).
    pub fn new(
        source: Option<String>,
        tokenizer_config: &serde_json::Value,
        content_format: Option<ContentFormat>,
    ) -> Result<Self, ChatError> {
        let has_template = source.is_some();
        let source = source.unwrap_or_default();
        let content_format = content_format.unwrap_or_else(|| detect_content_format(&source));
        let mut env = environment();
        env.add_template_owned("chat", source).map_err(|e| ChatError(format!("the chat template does not compile: {e}")))?;
        let mut special_tokens: Vec<(String, Value)> = SPECIAL_TOKENS
            .iter()
            .filter_map(|name| super::tokenizer::special_token(tokenizer_config, name).map(|t| (name.to_string(), Value::from(t))))
            .collect();
        if let Some(extra) = tokenizer_config.get("additional_special_tokens").and_then(serde_json::Value::as_array) {
            let tokens: Vec<Value> = extra
                .iter()
                .filter_map(|t| t.as_str().or_else(|| t.get("content").and_then(serde_json::Value::as_str)).map(Value::from))
                .collect();
            special_tokens.push(("additional_special_tokens".into(), Value::from(tokens)));
        }
        Ok(ChatTemplate { env, has_template, content_format, special_tokens })
    }

    /// Whether the model has a template of its own.
    pub fn has_template(&self) -> bool {
        self.has_template
    }

    /// One conversation as the model's text.
    pub fn render(&self, messages: &[serde_json::Value], options: &ChatOptions) -> Result<String, ChatError> {
        if !self.has_template {
            return Err(ChatError(
                "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the tokenizer does not define one.".into(),
            ));
        }
        let template = self.env.get_template("chat").map_err(|e| ChatError(e.to_string()))?;
        render_with(&template, self.content_format, &self.special_tokens, messages, options)
    }

    /// [`Self::render`] with a request's own template (`--trust-request-chat-template`).
    pub fn render_source(&self, source: &str, messages: &[serde_json::Value], options: &ChatOptions) -> Result<String, ChatError> {
        let env = environment();
        let template = env.template_from_str(source).map_err(|e| ChatError(e.to_string()))?;
        render_with(&template, detect_content_format(source), &self.special_tokens, messages, options)
    }
}

fn render_with(
    template: &minijinja::Template<'_, '_>,
    content_format: ContentFormat,
    special_tokens: &[(String, Value)],
    messages: &[serde_json::Value],
    options: &ChatOptions,
) -> Result<String, ChatError> {
    if options.continue_final_message && options.add_generation_prompt {
        return Err(ChatError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.".into()));
    }
    let unexpected: Vec<&str> = ["chat_template", "tokenize"].into_iter().filter(|k| options.kwargs.contains_key(*k)).collect();
    if !unexpected.is_empty() {
        let set: Vec<String> = unexpected.iter().map(|k| format!("'{k}'")).collect();
        return Err(ChatError(format!("Found unexpected chat template kwargs from request: {{{}}}", set.join(", "))));
    }
    let placeholders = options.placeholders.as_ref();
    let conversation = messages.iter().map(|m| conversation_message(m, content_format, placeholders)).collect::<Result<Vec<_>, _>>()?;
    let mut context: Vec<(String, Value)> = special_tokens.to_vec();
    for (key, value) in &options.kwargs {
        context.push((key.clone(), Value::from(Serde(value))));
    }
    context.push(("messages".into(), Value::from(Serde(&conversation))));
    context.push(("add_generation_prompt".into(), Value::from(options.add_generation_prompt)));
    context.push(("tools".into(), Value::from(())));
    context.push(("documents".into(), Value::from(())));
    let rendered = template.render(Value::from_pairs(context)).map_err(|e| ChatError(template_error(&e)))?;
    if options.continue_final_message {
        return continue_final(rendered, conversation.last());
    }
    Ok(rendered)
}

/// The template's own reason (what `raise_exception` said), as vLLM surfaces it.
fn template_error(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => format!("the chat template failed: {e}"),
    }
}

/// A request message as the template sees it: `role`, `content` in the template's format, and
/// the fields templates read besides (`name`, `tool_calls`, `tool_call_id`).
fn conversation_message(
    message: &serde_json::Value,
    format: ContentFormat,
    placeholders: Option<&MediaPlaceholders>,
) -> Result<serde_json::Value, ChatError> {
    let object = message.as_object().ok_or_else(|| ChatError("each message must be an object with a `role`".into()))?;
    let role =
        object.get("role").and_then(serde_json::Value::as_str).ok_or_else(|| ChatError("each message needs a string `role`".into()))?;
    let content = match object.get("content") {
        None | Some(serde_json::Value::Null) => serde_json::Value::Null,
        Some(serde_json::Value::String(text)) => serde_json::Value::String(text.clone()),
        Some(serde_json::Value::Array(parts)) => {
            let parts = parts.iter().map(|p| content_part(p, placeholders)).collect::<Result<Vec<_>, _>>()?;
            match format {
                ContentFormat::String => serde_json::Value::String(flattened(&parts)?),
                ContentFormat::OpenAi => parts
                    .iter()
                    .map(|part| match part {
                        ContentPiece::Text(t) => serde_json::json!({"type": "text", "text": t}),
                        ContentPiece::Media { kind, .. } => serde_json::json!({"type": kind}),
                    })
                    .collect(),
            }
        }
        Some(_) => return Err(ChatError("a message's `content` must be a string or a list of content parts".into())),
    };
    let mut out = serde_json::Map::new();
    out.insert("role".into(), role.into());
    out.insert("content".into(), content);
    for key in ["name", "tool_calls", "tool_call_id", "reasoning_content"] {
        if let Some(value) = object.get(key) {
            out.insert(key.into(), value.clone());
        }
    }
    Ok(serde_json::Value::Object(out))
}

/// A content part as a template reads it.
enum ContentPiece<'a> {
    Text(&'a str),
    /// An image, audio or video (`kind`), written as `placeholder` in a string.
    Media {
        kind: &'a str,
        placeholder: &'a str,
    },
}

/// A content part: a text, or a medium the model takes; other parts need a model that reads
/// them.
fn content_part<'a>(part: &'a serde_json::Value, placeholders: Option<&'a MediaPlaceholders>) -> Result<ContentPiece<'a>, ChatError> {
    match part.get("type").and_then(serde_json::Value::as_str) {
        Some("text") | Some("input_text") => part
            .get("text")
            .and_then(serde_json::Value::as_str)
            .map(ContentPiece::Text)
            .ok_or_else(|| ChatError("a text part needs a string `text`".into())),
        Some(kind) => match placeholders.and_then(|p| p.of(kind)) {
            Some(placeholder) => Ok(ContentPiece::Media { kind, placeholder }),
            None => Err(ChatError(format!("content parts of type `{kind}` need an image-text model; this model reads text only"))),
        },
        None => Err(ChatError("each content part needs a `type`".into())),
    }
}

/// A message's parts as one string (vLLM's string content format): the texts joined by
/// newlines; before them, one a line, the placeholder of each medium the texts do not already
/// hold, grouped by kind in the order the kinds first appear (`get_full_multimodal_text_prompt`
/// without `interleave_strings`; more typed than sent is its error).
fn flattened(parts: &[ContentPiece]) -> Result<String, ChatError> {
    let texts: Vec<&str> = parts.iter().filter_map(|p| if let ContentPiece::Text(t) = p { Some(*t) } else { None }).collect();
    let text = texts.join("\n");
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for part in parts {
        if let ContentPiece::Media { placeholder, .. } = part {
            match kinds.iter_mut().find(|(p, _)| p == placeholder) {
                Some((_, count)) => *count += 1,
                None => kinds.push((placeholder, 1)),
            }
        }
    }
    let mut lines: Vec<&str> = Vec::new();
    for (placeholder, count) in kinds {
        let typed = text.matches(placeholder).count();
        let missing = count.checked_sub(typed).ok_or_else(|| {
            ChatError(format!("Found more '{placeholder}' placeholders in input prompt than actual multimodal data items."))
        })?;
        lines.extend(std::iter::repeat_n(placeholder, missing));
    }
    if !text.is_empty() {
        lines.push(&text);
    }
    Ok(lines.join("\n"))
}

/// transformers' `continue_final_message`: the text up to the end of the last message's
/// content (keeping the template's spacing when it preserved the message's own).
fn continue_final(rendered: String, last: Option<&serde_json::Value>) -> Result<String, ChatError> {
    let content = last.and_then(|m| m.get("content"));
    let final_message = match content {
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(serde_json::Value::Array(parts)) => {
            parts.iter().rev().find_map(|p| p.get("text").and_then(serde_json::Value::as_str)).map(str::to_string).ok_or_else(|| {
                ChatError("continue_final_message is set but we could not find any text to continue in the final message!".into())
            })?
        }
        _ => return Err(ChatError("continue_final_message is set but the final message has no text to continue".into())),
    };
    let stripped = final_message.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(ChatError(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.".into(),
        ));
    };
    let lstripped = final_message.trim_start();
    let end = if rendered[at..].starts_with(lstripped) && rendered.get(at..at + lstripped.len()) == Some(final_message.as_str()) {
        at + lstripped.len()
    } else {
        at + stripped.len()
    };
    Ok(rendered[..end].to_string())
}

/// vLLM's content-format guess: a template that loops over a message's content reads parts.
fn detect_content_format(source: &str) -> ContentFormat {
    let compact: String = source.chars().filter(|c| !c.is_whitespace()).collect();
    let loops_over_content =
        ["in message['content']", "in message[\"content\"]", "in message.content", "in msg['content']", "in m['content']", "in content"]
            .iter()
            .any(|pattern| compact.contains(&pattern.replace(' ', "")));
    if loops_over_content {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, which transformers'
/// `tojson` filter calls.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let mut serializer = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&spaces));
            serde::Serialize::serialize(&json, &mut serializer)
        }
        None => {
            let mut serializer = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            serde::Serialize::serialize(&json, &mut serializer)
        }
    };
    written.map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    Ok(Value::from_safe_string(String::from_utf8(out).map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?))
}

/// `json.dumps`'s default separators: `", "` between items, `": "` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Python's `strftime` for the codes chat templates use (`%d %b %Y` for "26 Jul 2024", …), in
/// UTC; other codes are kept as written.
fn strftime(format: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix.div_euclid(86_400);
    let seconds = unix.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", seconds / 3600)),
            Some('M') => out.push_str(&format!("{:02}", seconds / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", seconds % 60)),
            Some('j') => out.push_str(&format!("{:03}", doy_of_year(year, month, day))),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn doy_of_year(year: i64, month: i64, day: i64) -> i64 {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(month - 1) as usize];
    before + day + i64::from(leap && month > 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DUMMY: &str = "{% for message in messages %}{{message['role'] + ': ' + message['content'] + '\\n'}}{% endfor %}";

    fn messages() -> Vec<serde_json::Value> {
        vec![json!({"role": "user", "content": "The cat sat."}), json!({"role": "assistant", "content": "A feline rested."})]
    }

    #[test]
    fn renders_like_transformers() {
        let template = ChatTemplate::new(Some(DUMMY.into()), &json!({}), None).unwrap();
        let out = template.render(&messages(), &ChatOptions::default()).unwrap();
        assert_eq!(out, "user: The cat sat.\nassistant: A feline rested.\n");
        let open = ChatOptions { continue_final_message: true, ..Default::default() };
        assert_eq!(template.render(&messages(), &open).unwrap(), "user: The cat sat.\nassistant: A feline rested.");
        let both = ChatOptions { continue_final_message: true, add_generation_prompt: true, ..Default::default() };
        assert_eq!(
            template.render(&messages(), &both).unwrap_err().0,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        );
    }

    #[test]
    fn python_methods_special_tokens_and_exceptions() {
        let source = "{{ bos_token }}{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{{ m.content.strip().upper() }}|{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ extra|tojson }}";
        let template = ChatTemplate::new(Some(source.into()), &json!({"bos_token": {"content": "<s>"}}), None).unwrap();
        let options = ChatOptions {
            add_generation_prompt: true,
            kwargs: [("extra".to_string(), json!({"a": [1, "é"]}))].into_iter().collect(),
            ..Default::default()
        };
        let out = template.render(&[json!({"role": "user", "content": "  hi "})], &options).unwrap();
        assert_eq!(out, "<s>HI|>{\"a\": [1, \"é\"]}");
        let err = template.render(&[json!({"role": "tool", "content": "x"})], &options).unwrap_err();
        assert_eq!(err.0, "bad role tool");
        let bad = ChatOptions { kwargs: [("tokenize".to_string(), json!(true))].into_iter().collect(), ..Default::default() };
        assert!(template
            .render(&messages(), &bad)
            .unwrap_err()
            .0
            .contains("Found unexpected chat template kwargs from request: {'tokenize'}"));
    }

    #[test]
    fn content_parts_follow_the_template() {
        let parts = vec![json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})];
        let string = ChatTemplate::new(Some("{{ messages[0]['content'] }}".into()), &json!({}), None).unwrap();
        assert_eq!(string.render(&parts, &ChatOptions::default()).unwrap(), "a\nb");
        let openai = ChatTemplate::new(
            Some("{% for m in messages %}{% for part in m['content'] %}[{{ part.text }}]{% endfor %}{% endfor %}".into()),
            &json!({}),
            None,
        )
        .unwrap();
        assert_eq!(openai.render(&parts, &ChatOptions::default()).unwrap(), "[a][b]");
        let image = vec![json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})];
        assert!(string.render(&image, &ChatOptions::default()).unwrap_err().0.contains("image-text model"));
    }

    /// A model's media: `{"type": "image"}` for a template that loops over content; for one
    /// that reads a string, vLLM's placeholders first, grouped by kind, one a line.
    #[test]
    fn media_parts_follow_the_template() {
        let placeholders = MediaPlaceholders { image: Some("<I>".into()), audio: Some("<A>".into()), video: None };
        let options = ChatOptions { placeholders: Some(placeholders), ..Default::default() };
        let content =
            json!([{"type": "text", "text": "a"}, {"type": "audio"}, {"type": "image"}, {"type": "text", "text": "b"}, {"type": "audio"}]);
        let parts = vec![json!({"role": "user", "content": content})];
        let string = ChatTemplate::new(Some("{{ messages[0]['content'] }}".into()), &json!({}), None).unwrap();
        assert_eq!(string.render(&parts, &options).unwrap(), "<A>\n<A>\n<I>\na\nb");
        let openai = ChatTemplate::new(
            Some("{% for m in messages %}{% for part in m['content'] %}[{{ part.type }}]{% endfor %}{% endfor %}".into()),
            &json!({}),
            None,
        )
        .unwrap();
        assert_eq!(openai.render(&parts, &options).unwrap(), "[text][audio][image][text][audio]");
        // A placeholder typed in the text stands for a medium where it is typed; more than the
        // media is vLLM's error.
        let typed = vec![json!({"role": "user", "content": [{"type": "text", "text": "x <I> y"}, {"type": "image"}]})];
        assert_eq!(string.render(&typed, &options).unwrap(), "x <I> y");
        let extra = vec![json!({"role": "user", "content": [{"type": "text", "text": "<I><I>"}, {"type": "image"}]})];
        assert_eq!(
            string.render(&extra, &options).unwrap_err().0,
            "Found more '<I>' placeholders in input prompt than actual multimodal data items."
        );
        let video = vec![json!({"role": "user", "content": [{"type": "video"}]})];
        assert!(string.render(&video, &options).is_err(), "a kind the model does not take");
    }
    #[test]
    fn runaway_templates_run_out_of_fuel() {
        let template = ChatTemplate::new(Some("{% for i in range(100000000) %}{{ i }}{% endfor %}".into()), &json!({}), None).unwrap();
        assert!(template.render(&messages(), &ChatOptions::default()).is_err());
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-07-26 15:05:09 UTC, as Python's datetime formats it.
        assert_eq!(strftime("%d %b %Y %H:%M:%S %A %j", 1_722_006_309), "26 Jul 2024 15:05:09 Friday 208");
    }

    #[test]
    fn template_sources() {
        assert_eq!(read_flag("{{ x }}").unwrap(), "{{ x }}");
        assert!(read_flag("no/such/template.jinja").is_err());
        let named = json!({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]});
        assert_eq!(from_folder(&named, None, None).unwrap().as_deref(), Some("d"));
        assert_eq!(from_folder(&json!({}), None, None).unwrap(), None);
    }
}
