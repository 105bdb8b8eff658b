//! Tokenization: the model's `tokenizer.json` with our own truncation rules, run on a small
//! pool of worker threads so the async runtime never blocks on it.
//!
//! Whatever truncation or padding the file has baked in is cleared at load (all-MiniLM-L6-v2
//! ships truncation at 128 and fixed padding to 128); each request's `truncate_prompt_tokens`
//! and `truncation_side` decide instead.

use super::batch::TokenizedInput;
use super::EngineError;
use crate::loader::LoadError;
use crate::pooling::params::TruncationSide;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokenizers::{Tokenizer, TruncationDirection};
use tokio::sync::{mpsc, oneshot};

/// How one text is turned into tokens.
#[derive(Debug, Clone, Copy)]
pub struct EncodeOptions {
    pub add_special_tokens: bool,
    /// Keep at most this many tokens, special tokens included.
    pub truncate_to: Option<usize>,
    pub side: TruncationSide,
}

pub struct TextTokenizer {
    inner: Tokenizer,
    /// sentence-transformers' `do_lower_case`: lowercase before tokenizing.
    lowercase: bool,
}

impl TextTokenizer {
    pub fn from_file(path: &Path, lowercase: bool) -> Result<Self, LoadError> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| LoadError::Tokenizer(format!("{}: {e}", path.display())))?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        Ok(Self { inner, lowercase })
    }

    pub fn encode(&self, text: &str, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        let lowered;
        let text = if self.lowercase {
            lowered = text.to_lowercase();
            lowered.as_str()
        } else {
            text
        };
        let tokenizer_error = |e: tokenizers::Error| EngineError::Tokenizer(e.to_string());
        let mut encoding = self.inner.encode(text, false).map_err(tokenizer_error)?;
        if let Some(limit) = options.truncate_to {
            let added = if options.add_special_tokens {
                self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false))
            } else {
                0
            };
            encoding.truncate(limit.saturating_sub(added), 0, direction(options.side));
        }
        let encoding = self.inner.post_process(encoding, None, options.add_special_tokens).map_err(tokenizer_error)?;
        Ok(TokenizedInput { ids: encoding.get_ids().to_vec(), type_ids: encoding.get_type_ids().to_vec() })
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner.decode(ids, false).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    pub fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| self.inner.id_to_token(id).unwrap_or_default()).collect()
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

fn direction(side: TruncationSide) -> TruncationDirection {
    match side {
        TruncationSide::Left => TruncationDirection::Left,
        TruncationSide::Right => TruncationDirection::Right,
    }
}

/// Token-id inputs skip the tokenizer but follow the same truncation rule.
pub fn truncate_ids(mut ids: Vec<u32>, options: EncodeOptions) -> TokenizedInput {
    if let Some(limit) = options.truncate_to {
        if ids.len() > limit {
            match options.side {
                TruncationSide::Right => ids.truncate(limit),
                TruncationSide::Left => {
                    ids.drain(..ids.len() - limit);
                }
            }
        }
    }
    let type_ids = vec![0; ids.len()];
    TokenizedInput { ids, type_ids }
}

struct Job {
    texts: Vec<String>,
    options: EncodeOptions,
    reply: oneshot::Sender<Vec<Result<TokenizedInput, EngineError>>>,
}

/// Worker threads that own the tokenizing. One request's texts go to one worker, in order.
#[derive(Clone)]
pub struct TokenizerPool {
    tokenizer: Arc<TextTokenizer>,
    jobs: mpsc::Sender<Job>,
}

impl TokenizerPool {
    pub fn new(tokenizer: Arc<TextTokenizer>, workers: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>(1024);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let rx = Arc::clone(&rx);
            let tokenizer = Arc::clone(&tokenizer);
            std::thread::Builder::new().name(format!("tokenizer-{i}")).spawn(move || loop {
                // Holding the lock only while waiting hands jobs to idle workers one at a time.
                let job = match rx.lock() {
                    Ok(mut guard) => guard.blocking_recv(),
                    Err(_) => None,
                };
                let Some(job) = job else { break };
                if job.reply.is_closed() {
                    continue; // the client has gone
                }
                let out = job.texts.iter().map(|t| tokenizer.encode(t, job.options)).collect();
                let _ = job.reply.send(out);
            })?;
        }
        Ok(Self { tokenizer, jobs: tx })
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    pub async fn encode(&self, texts: Vec<String>, options: EncodeOptions) -> Result<Vec<Result<TokenizedInput, EngineError>>, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.jobs.send(Job { texts, options, reply }).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_truncation_sides() {
        let opts = |side| EncodeOptions { add_special_tokens: true, truncate_to: Some(2), side };
        assert_eq!(truncate_ids(vec![1, 2, 3], opts(TruncationSide::Right)).ids, vec![1, 2]);
        assert_eq!(truncate_ids(vec![1, 2, 3], opts(TruncationSide::Left)).ids, vec![2, 3]);
        assert_eq!(truncate_ids(vec![1], opts(TruncationSide::Left)).ids, vec![1]);
    }
}
