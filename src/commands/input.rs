//! Input lines of the batch commands: JSON Lines (`{"id", "text"}`, `{"id", "image"}` for
//! image-text models, `{"id", "text_1", "text_2"}`, or `{"id", "data"}` for the model's
//! IO-processor plugin under `encode`, with `model` naming the model when several are loaded)
//! or plain text (one input per line, the line number as its id).

use super::CommandError;
use serde_json::Value;

/// What one line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Text(String),
    Pair(String, String),
    /// An image: a file path (relative to the working directory) or a data URL.
    Image(String),
    /// A plugin request's `data` (vLLM's offline `LLM.encode({"data": …})`).
    Data(Value),
}

/// One input line, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// 1-based line number in the input file.
    pub line: usize,
    /// The record's `id` (any JSON value), or its line number for plain text.
    pub id: Value,
    pub payload: Payload,
    /// The served name of the model to run it on (`model`; needed when several are loaded).
    pub model: Option<String>,
}

/// How the input file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    /// JSON Lines if the first non-blank line starts with `{`, else plain text.
    Auto,
    Jsonl,
    Text,
}

/// Parses one non-blank line; the error says what is wrong (the caller adds the line number).
pub fn parse_line(line: usize, text: &str, jsonl: bool) -> Result<Record, CommandError> {
    if !jsonl {
        return Ok(Record { line, id: Value::from(line), payload: Payload::Text(text.to_string()), model: None });
    }
    let bad = |message: String| CommandError::Input(message);
    let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    let object = value.as_object().ok_or_else(|| bad("not a JSON object".into()))?;
    let id = object.get("id").cloned().unwrap_or_else(|| Value::from(line));
    let field = |name: &str| match object.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("`{name}` must be a string"))),
    };
    let payload = match (field("text")?, field("text_1")?, field("text_2")?, field("image")?, object.get("data")) {
        (Some(text), None, None, None, None) => Payload::Text(text),
        (None, Some(a), Some(b), None, None) => Payload::Pair(a, b),
        (None, None, None, Some(image), None) => Payload::Image(image),
        (None, None, None, None, Some(data)) => Payload::Data(data.clone()),
        _ => return Err(bad("expected `text`, `image`, `text_1` and `text_2`, or a plugin's `data`".into())),
    };
    // Only a string names a model; anything else is left for the one-model case to ignore.
    let model = object.get("model").and_then(Value::as_str).map(String::from);
    Ok(Record { line, id, payload, model })
}

/// Which of `n` shards line `line` belongs to: consecutive lines go round-robin, so every line is
/// in exactly one shard and shards get similar work.
pub fn shard_of(line: usize, n: usize) -> usize {
    (line - 1) % n
}

/// `I/N` of `--shard` (0-based index).
pub fn parse_shard(text: &str) -> Result<(usize, usize), CommandError> {
    let setup = |message: &str| CommandError::Setup(message.into());
    let (i, n) = text.split_once('/').ok_or_else(|| setup("--shard takes I/N, e.g. 0/4"))?;
    let i: usize = i.trim().parse().map_err(|_| setup("--shard: I is not a number"))?;
    let n: usize = n.trim().parse().map_err(|_| setup("--shard: N is not a number"))?;
    if n == 0 || i >= n {
        return Err(CommandError::Setup(format!("--shard {i}/{n}: need 0 <= I < N")));
    }
    Ok((i, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_parse_by_format() {
        assert_eq!(parse_line(3, "hello", false).unwrap().id, json!(3));
        let r = parse_line(1, r#"{"id": "a", "text": "hi"}"#, true).unwrap();
        assert_eq!((r.id, r.payload), (json!("a"), Payload::Text("hi".into())));
        let r = parse_line(2, r#"{"id": 7, "text_1": "q", "text_2": "d"}"#, true).unwrap();
        assert_eq!(r.payload, Payload::Pair("q".into(), "d".into()));
        let r = parse_line(4, r#"{"image": "cat.png"}"#, true).unwrap();
        assert_eq!(r.payload, Payload::Image("cat.png".into()));
        assert!(parse_line(5, r#"{"image": "cat.png", "text": "a"}"#, true).is_err());
        assert!(parse_line(4, "{broken", true).is_err());
        assert!(parse_line(5, r#"{"id": 1}"#, true).is_err());
        assert!(parse_line(6, r#"{"text": 5}"#, true).is_err());
        assert!(parse_line(7, r#"[1]"#, true).is_err());
    }

    #[test]
    fn shards_cover_every_line_once() {
        let n = 3;
        for line in 1..=10 {
            assert_eq!((0..n).filter(|&i| shard_of(line, n) == i).count(), 1);
        }
        assert_eq!(parse_shard("1/4").unwrap(), (1, 4));
        assert!(parse_shard("4/4").is_err());
        assert!(parse_shard("x").is_err());
    }
}
