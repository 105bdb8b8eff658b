//! The pooling tasks a model can serve (vLLM's `PoolingTask`).

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// One vector per input.
    Embed,
    /// Class probabilities per input.
    Classify,
    /// A relevance score per (query, document) pair.
    Score,
    /// One vector per token.
    TokenEmbed,
    /// Class probabilities per token.
    TokenClassify,
    /// A sparse vocabulary-sized vector per input (SPLADE).
    EmbedSparse,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Embed => "embed",
            Task::Classify => "classify",
            Task::Score => "score",
            Task::TokenEmbed => "token_embed",
            Task::TokenClassify => "token_classify",
            Task::EmbedSparse => "embed_sparse",
        }
    }

    /// Whether the output is per token rather than per input.
    pub fn is_token_level(self) -> bool {
        matches!(self, Task::TokenEmbed | Task::TokenClassify)
    }
}

impl Task {
    /// Python's repr of a tuple of task names, as vLLM prints a model's supported tasks.
    pub fn py_tuple(tasks: &[Task]) -> String {
        Self::py_tuple_of(tasks.iter().map(|t| t.to_string()))
    }

    /// [`Task::py_tuple`] of task names, for names beyond [`Task`] (vLLM's compound tasks).
    pub fn py_tuple_of(names: impl IntoIterator<Item = String>) -> String {
        let items: Vec<String> = names.into_iter().map(|name| format!("'{name}'")).collect();
        match items.as_slice() {
            [one] => format!("({one},)"),
            _ => format!("({})", items.join(", ")),
        }
    }
}

impl std::str::FromStr for Task {
    type Err = super::PoolingError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Task::Embed, Task::Classify, Task::Score, Task::TokenEmbed, Task::TokenClassify, Task::EmbedSparse]
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| super::PoolingError::Config(format!("unknown task `{s}`")))
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_print_as_python_tuples() {
        assert_eq!(Task::py_tuple(&[Task::Embed, Task::TokenEmbed]), "('embed', 'token_embed')");
        assert_eq!(Task::py_tuple(&[Task::Classify]), "('classify',)");
    }
}
