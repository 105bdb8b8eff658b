//! sentence-transformers prompts of a model (`config_sentence_transformers.json`) and the
//! default one, as `--default-prompt-name` / `--default-prompt` decide it.

use crate::loader::LoadError;

/// A `prompt_name` the model does not define; the message is part of the API contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownPrompt(pub String);

/// sentence-transformers prompts (`config_sentence_transformers.json`): a prompt's text is
/// prepended to a text input before tokenization, exactly as `SentenceTransformer.encode`
/// does, so its tokens are embedded, pooled and counted in usage like the rest. Token-id inputs
/// are taken as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompts {
    /// Name → text.
    pub named: std::collections::BTreeMap<String, String>,
    /// The text used when a request names no prompt: the folder's `default_prompt_name`, or the
    /// `--default-prompt-name` / `--default-prompt` flags.
    pub default: Option<String>,
}

impl Prompts {
    /// Decides the default: `--default-prompt` (a text) or `--default-prompt-name` (a name the
    /// folder defines) win over the folder's `default_prompt_name`. A default name the folder
    /// does not define is an error, as sentence-transformers refuses to load such a folder.
    pub fn new(
        named: std::collections::BTreeMap<String, String>,
        folder_default: Option<&str>,
        flag_name: Option<&str>,
        flag_text: Option<&str>,
    ) -> Result<Self, LoadError> {
        let mut prompts = Prompts { named, default: None };
        prompts.default = match (flag_text, flag_name, folder_default) {
            (Some(text), _, _) => Some(text.to_string()),
            (None, Some(name), _) => Some(prompts.text(name).ok_or_else(|| {
                LoadError::Invalid(format!("--default-prompt-name `{name}`: the model's prompts are {}", prompts.names()))
            })?),
            (None, None, Some(name)) => Some(prompts.text(name).ok_or_else(|| {
                LoadError::Invalid(format!(
                    "config_sentence_transformers.json: default_prompt_name `{name}` is not among its prompts {}",
                    prompts.names()
                ))
            })?),
            (None, None, None) => None,
        };
        Ok(prompts)
    }

    fn text(&self, name: &str) -> Option<String> {
        self.named.get(name).cloned()
    }

    /// The names as a Python list, for messages.
    pub fn names(&self) -> String {
        let quoted: Vec<String> = self.named.keys().map(|k| format!("'{k}'")).collect();
        format!("[{}]", quoted.join(", "))
    }

    pub fn has(&self, name: &str) -> bool {
        self.named.contains_key(name)
    }

    /// The prompt a request gets: the one it names, else the default.
    pub fn resolve(&self, name: Option<&str>) -> Result<Option<String>, UnknownPrompt> {
        match name {
            None => Ok(self.default.clone()),
            Some(name) => self.text(name).map(Some).ok_or_else(|| {
                UnknownPrompt(if self.named.is_empty() {
                    format!("Unknown prompt_name '{name}': the model defines no prompts")
                } else {
                    format!("Unknown prompt_name '{name}'; the model's prompts are {}", self.names())
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_defaults_and_lookup() {
        let named: std::collections::BTreeMap<String, String> =
            [("query".to_string(), "query: ".to_string()), ("passage".to_string(), "passage: ".to_string())].into();
        let folder = Prompts::new(named.clone(), Some("query"), None, None).unwrap();
        assert_eq!(folder.default.as_deref(), Some("query: "));
        assert_eq!(folder.resolve(None).unwrap().as_deref(), Some("query: "));
        assert_eq!(folder.resolve(Some("passage")).unwrap().as_deref(), Some("passage: "));
        let err = folder.resolve(Some("doc")).unwrap_err();
        assert_eq!(err.0, "Unknown prompt_name 'doc'; the model's prompts are ['passage', 'query']");
        assert_eq!(Prompts::new(named.clone(), Some("query"), Some("passage"), None).unwrap().default.as_deref(), Some("passage: "));
        assert_eq!(Prompts::new(named.clone(), Some("query"), None, Some("x: ")).unwrap().default.as_deref(), Some("x: "));
        assert!(Prompts::new(named.clone(), None, Some("nope"), None).unwrap_err().to_string().contains("['passage', 'query']"));
        assert!(Prompts::new(named, Some("nope"), None, None).is_err());
        assert_eq!(Prompts::new(Default::default(), None, None, None).unwrap().resolve(None).unwrap(), None);
    }
}
