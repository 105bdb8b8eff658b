//! Request fields that take one of a fixed set of strings (vLLM's pydantic `Literal` fields:
//! `encoding_format`, `embed_dtype`, `endianness`, `padding`, `truncation_side`, `task`, …).
//! A value outside the set is refused with pydantic's `literal_error`, worded as vLLM's
//! validation handler prints it, which vLLM's clients and tests match on:
//!
//! ```text
//! 1 validation error:
//!   {'type': 'literal_error', 'loc': 'body.encoding_format', 'msg': "Input should be 'float' or 'base64'", 'input': 'x', 'ctx': {'expected': "'float' or 'base64'"}}
//! ```
//!
//! The fields deserialize through [`deserialize`], which fails with that text behind a marker;
//! the HTTP layer's JSON extractor recognizes the marker ([`recognize`]) and answers the text
//! alone (400).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// Marks a serde error message as a literal error (`{MARKER}{param}\n{message}`).
const MARKER: &str = "\u{1}literal:";

/// The fields that deserialize through [`deserialize`], so that an error names its field as a
/// `&'static str`.
const PARAMS: &[&str] = &["encoding_format", "embed_dtype", "endianness", "padding", "truncation_side"];

/// A string field that must be one of `options` (`(wire name, value)`).
pub fn deserialize<'de, D: Deserializer<'de>, T: Copy>(deserializer: D, param: &'static str, options: &[(&str, T)]) -> Result<T, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    let found = value.as_str().and_then(|s| options.iter().find(|(name, _)| *name == s));
    match found {
        Some((_, v)) => Ok(*v),
        None => {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            Err(D::Error::custom(format!("{MARKER}{param}\n{}", message(param, &value, &names))))
        }
    }
}

/// pydantic's literal error for `input` at `body.{param}`, as vLLM's handler prints it.
pub fn message(param: &str, input: &serde_json::Value, expected: &[&str]) -> String {
    let quoted: Vec<String> = expected.iter().map(|e| format!("'{e}'")).collect();
    let expected = match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    };
    let ctx = format!("{{'expected': {}}}", py_repr(&expected));
    validation_error("literal_error", &format!("body.{param}"), &format!("Input should be {expected}"), Some(input), Some(&ctx))
}

/// One pydantic validation error as vLLM's handler prints it:
/// `1 validation error:\n  {'type': …, 'loc': …, 'msg': …, 'input': …, 'ctx': …}` (`input`
/// and `ctx` when given; `ctx` already in Python's notation).
pub fn validation_error(kind: &str, loc: &str, msg: &str, input: Option<&serde_json::Value>, ctx: Option<&str>) -> String {
    let mut fields = format!("'type': '{kind}', 'loc': '{loc}', 'msg': {}", py_repr(msg));
    if let Some(input) = input {
        fields.push_str(&format!(", 'input': {}", py_value(input)));
    }
    if let Some(ctx) = ctx {
        fields.push_str(&format!(", 'ctx': {ctx}"));
    }
    format!("1 validation error:\n  {{{fields}}}")
}

/// Python's repr of a JSON value (strings quoted as Python quotes them).
fn py_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => py_repr(s),
        serde_json::Value::Bool(true) => "True".into(),
        serde_json::Value::Bool(false) => "False".into(),
        serde_json::Value::Null => "None".into(),
        serde_json::Value::Array(items) => format!("[{}]", items.iter().map(py_value).collect::<Vec<_>>().join(", ")),
        serde_json::Value::Object(map) => {
            format!("{{{}}}", map.iter().map(|(k, v)| format!("{}: {}", py_repr(k), py_value(v))).collect::<Vec<_>>().join(", "))
        }
        other => other.to_string(),
    }
}

/// Python's `repr` of a string: single quotes unless the text holds a single quote and no
/// double quote.
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The literal error inside a serde message, with its field: `Some((param, message))`.
pub fn recognize(serde_message: &str) -> Option<(&'static str, String)> {
    let rest = serde_message.split_once(MARKER)?.1;
    let (param, message) = rest.split_once('\n')?;
    let param = PARAMS.iter().copied().find(|p| *p == param)?;
    // serde_json appends " at line L column C" to custom errors.
    let message = match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    };
    Some((param, message.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Format {
        Float,
        Base64,
    }

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "format")]
        #[allow(dead_code)]
        encoding_format: Format,
    }

    fn format<'de, D: Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
        deserialize(d, "encoding_format", &[("float", Format::Float), ("base64", Format::Base64)])
    }

    #[test]
    fn worded_as_pydantic_through_vllm() {
        let err = serde_json::from_str::<Body>(r#"{"encoding_format": "bad_encoding_format"}"#).unwrap_err().to_string();
        let (param, message) = recognize(&err).unwrap();
        assert_eq!(param, "encoding_format");
        assert_eq!(
            message,
            "1 validation error:\n  {'type': 'literal_error', 'loc': 'body.encoding_format', 'msg': \"Input should be 'float' or 'base64'\", 'input': 'bad_encoding_format', 'ctx': {'expected': \"'float' or 'base64'\"}}"
        );
        assert!(serde_json::from_str::<Body>(r#"{"encoding_format": "base64"}"#).is_ok());
        let err = serde_json::from_str::<Body>(r#"{"encoding_format": 3}"#).unwrap_err().to_string();
        assert!(recognize(&err).unwrap().1.contains("'input': 3,"));
    }

    #[test]
    fn python_string_repr() {
        assert_eq!(py_repr("a"), "'a'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("'a' \"b\""), "'\\'a\\' \"b\"'");
    }
}
