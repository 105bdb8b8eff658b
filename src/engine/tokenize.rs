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
use tokenizers::utils::truncation::{truncate_encodings, TruncationParams, TruncationStrategy};
use tokenizers::{Encoding, Tokenizer, TruncationDirection};
use tokio::sync::{mpsc, oneshot};

/// How one text (or pair) is turned into tokens.
#[derive(Debug, Clone, Copy)]
pub struct EncodeOptions {
    pub add_special_tokens: bool,
    /// Keep at most this many tokens, special tokens included. Pairs are cut longest-first.
    pub truncate_to: Option<usize>,
    pub side: TruncationSide,
    pub pair_limits: PairLimits,
}

/// Per-side caps for pairs (`max_tokens_per_query`, `max_tokens_per_doc`), applied to each
/// side's own tokens before the pair is joined; the end of the text is cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairLimits {
    pub query: Option<usize>,
    pub document: Option<usize>,
}

/// A text to tokenize: alone, or as a (query, document) pair for a cross-encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextInput {
    Single(String),
    Pair(String, String),
}

pub struct TextTokenizer {
    inner: Tokenizer,
    /// sentence-transformers' `do_lower_case`: lowercase before tokenizing.
    lowercase: bool,
    /// Keep the post-processor's segment ids; otherwise every token gets type 0.
    type_ids: bool,
}

impl TextTokenizer {
    pub fn from_file(path: &Path, lowercase: bool, type_ids: bool) -> Result<Self, LoadError> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| LoadError::Tokenizer(format!("{}: {e}", path.display())))?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| LoadError::Tokenizer(e.to_string()))?;
        Ok(Self { inner, lowercase, type_ids })
    }

    /// Tokens of `text` alone, without special tokens.
    fn raw(&self, text: &str) -> Result<Encoding, EngineError> {
        let encoded = if self.lowercase { self.inner.encode(text.to_lowercase(), false) } else { self.inner.encode(text, false) };
        encoded.map_err(tokenizer_error)
    }

    /// Special tokens the post-processor adds to a single text or a pair.
    fn added_tokens(&self, pair: bool, options: EncodeOptions) -> usize {
        if !options.add_special_tokens {
            return 0;
        }
        self.inner.get_post_processor().map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, pair))
    }

    pub fn encode(&self, text: &str, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        let mut encoding = self.raw(text)?;
        if let Some(limit) = options.truncate_to {
            encoding.truncate(limit.saturating_sub(self.added_tokens(false, options)), 0, direction(options.side));
            // Truncation keeps the cut-off tokens as "overflowing" pieces; we never use them.
            encoding.take_overflowing();
        }
        self.finish(encoding, None, options)
    }

    /// A (query, document) pair as cross-encoders see it (`[CLS] q [SEP] d [SEP]` with segment
    /// ids 0/1 for BERT, `<s> q </s></s> d </s>` for RoBERTa), as `tokenizer(q, d)` makes it.
    pub fn encode_pair(&self, query: &str, document: &str, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        let first = self.pair_side(query, options.pair_limits.query)?;
        let second = self.pair_side(document, options.pair_limits.document)?;
        self.join_pair(first, second, options)
    }

    /// Every `(query, document)` pair of `pairs` (indices into `queries` and `documents`),
    /// exactly as [`Self::encode_pair`] makes each, but with each distinct text tokenized once:
    /// a long query against a thousand documents is one tokenization, not a thousand.
    pub fn encode_pairs(
        &self,
        queries: &[String],
        documents: &[String],
        pairs: &[(usize, usize)],
        options: EncodeOptions,
    ) -> Vec<Result<TokenizedInput, EngineError>> {
        let queries: Vec<_> = queries.iter().map(|q| self.pair_side(q, options.pair_limits.query)).collect();
        let documents: Vec<_> = documents.iter().map(|d| self.pair_side(d, options.pair_limits.document)).collect();
        pairs
            .iter()
            .map(|&(i, j)| match (queries.get(i), documents.get(j)) {
                (Some(Ok(q)), Some(Ok(d))) => self.join_pair(q.clone(), d.clone(), options),
                (Some(Err(e)), _) | (_, Some(Err(e))) => Err(e.clone()),
                _ => Err(EngineError::InvalidPairing),
            })
            .collect()
    }

    /// One side of a pair, without special tokens, cut to its own limit.
    fn pair_side(&self, text: &str, limit: Option<usize>) -> Result<Encoding, EngineError> {
        let mut encoding = self.raw(text)?;
        if let Some(n) = limit {
            encoding.truncate(n, 0, TruncationDirection::Right);
            // The cut-off pieces would be cloned into every pair and multiplied with the other
            // side's when the pair is joined.
            encoding.take_overflowing();
        }
        Ok(encoding)
    }

    /// Truncates a pair to the input limit (longest first) and adds the special tokens.
    fn join_pair(&self, first: Encoding, second: Encoding, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        let (first, second) = match options.truncate_to {
            Some(limit) => {
                let params = TruncationParams {
                    direction: direction(options.side),
                    max_length: limit.saturating_sub(self.added_tokens(true, options)),
                    strategy: TruncationStrategy::LongestFirst,
                    stride: 0,
                };
                let (mut first, second) = truncate_encodings(first, Some(second), &params).map_err(tokenizer_error)?;
                first.take_overflowing();
                (first, second.map(|mut s| {
                    s.take_overflowing();
                    s
                }))
            }
            None => (first, Some(second)),
        };
        self.finish(first, second, options)
    }

    pub fn encode_input(&self, input: &TextInput, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        match input {
            TextInput::Single(text) => self.encode(text, options),
            TextInput::Pair(query, document) => self.encode_pair(query, document, options),
        }
    }

    fn finish(&self, first: Encoding, second: Option<Encoding>, options: EncodeOptions) -> Result<TokenizedInput, EngineError> {
        let encoding = self.inner.post_process(first, second, options.add_special_tokens).map_err(tokenizer_error)?;
        let ids = encoding.get_ids().to_vec();
        let type_ids = if self.type_ids { encoding.get_type_ids().to_vec() } else { vec![0; ids.len()] };
        Ok(TokenizedInput { ids, type_ids })
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner.decode(ids, false).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    pub fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| self.inner.id_to_token(id).unwrap_or_default()).collect()
    }

    /// The id of a token of the vocabulary (added tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

fn tokenizer_error(e: tokenizers::Error) -> EngineError {
    EngineError::Tokenizer(e.to_string())
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
    work: Work,
    options: EncodeOptions,
    reply: oneshot::Sender<Vec<Result<TokenizedInput, EngineError>>>,
    /// Test hook ([`TokenizerPool::panic_in_a_worker`]): the worker panics on this job.
    panic: bool,
}

/// What a job tokenizes.
enum Work {
    Texts(Vec<TextInput>),
    /// Cross-encoder pairs by index into the distinct queries and documents, so that each text
    /// is tokenized once however many pairs it is in ([`TextTokenizer::encode_pairs`]).
    Pairs { queries: Vec<String>, documents: Vec<String>, pairs: Vec<(usize, usize)> },
}

impl Work {
    fn outputs(&self) -> usize {
        match self {
            Work::Texts(texts) => texts.len(),
            Work::Pairs { pairs, .. } => pairs.len(),
        }
    }
}

type Receiver = Arc<Mutex<mpsc::Receiver<Job>>>;

/// Runs one tokenizer worker; a worker that dies anyway (a panic outside a job) is replaced by
/// its guard, so the pool keeps its size.
fn spawn_worker(index: usize, rx: Receiver, tokenizer: Arc<TextTokenizer>) -> std::io::Result<()> {
    std::thread::Builder::new().name(format!("tokenizer-{index}")).spawn(move || {
        let guard = Respawn { index, rx: Arc::clone(&rx), tokenizer: Arc::clone(&tokenizer) };
        loop {
            // Holding the lock only while waiting hands jobs to idle workers one at a time. A
            // poisoned lock (a worker died holding it) still holds a working receiver.
            let job = rx.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).blocking_recv();
            let Some(job) = job else { break };
            if job.reply.is_closed() {
                continue; // the client has gone
            }
            let count = job.work.outputs();
            // A tokenizer bug on one input must fail that request, not the worker.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if job.panic {
                    panic!("tokenizer test hook");
                }
                match &job.work {
                    Work::Texts(texts) => texts.iter().map(|t| tokenizer.encode_input(t, job.options)).collect::<Vec<_>>(),
                    Work::Pairs { queries, documents, pairs } => tokenizer.encode_pairs(queries, documents, pairs, job.options),
                }
            }))
            .unwrap_or_else(|_| {
                tracing::error!("a tokenizer worker panicked on a request of {count} inputs; the request fails, the worker goes on");
                (0..count).map(|_| Err(EngineError::Tokenizer("the tokenizer panicked on this input".into()))).collect()
            });
            let _ = job.reply.send(out);
        }
        drop(guard);
    })?;
    Ok(())
}

/// Replaces its worker when the worker's thread unwinds.
struct Respawn {
    index: usize,
    rx: Receiver,
    tokenizer: Arc<TextTokenizer>,
}

impl Drop for Respawn {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("tokenizer worker {} died; starting a new one", self.index);
            if let Err(e) = spawn_worker(self.index, Arc::clone(&self.rx), Arc::clone(&self.tokenizer)) {
                tracing::error!("could not restart tokenizer worker {}: {e}", self.index);
            }
        }
    }
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
            spawn_worker(i, Arc::clone(&rx), Arc::clone(&tokenizer))?;
        }
        Ok(Self { tokenizer, jobs: tx })
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The text of `ids`, decoded on a blocking thread (a long id list is milliseconds of work
    /// that must not hold a runtime worker).
    pub async fn decode(&self, ids: Vec<u32>) -> Result<String, EngineError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        tokio::task::spawn_blocking(move || tokenizer.decode(&ids)).await.map_err(|_| EngineError::Stopped)?
    }

    pub async fn encode(&self, texts: Vec<TextInput>, options: EncodeOptions) -> Result<Vec<Result<TokenizedInput, EngineError>>, EngineError> {
        self.submit(Work::Texts(texts), options).await
    }

    /// Cross-encoder pairs, each distinct text tokenized once ([`TextTokenizer::encode_pairs`]).
    pub async fn encode_pairs(
        &self,
        queries: Vec<String>,
        documents: Vec<String>,
        pairs: Vec<(usize, usize)>,
        options: EncodeOptions,
    ) -> Result<Vec<Result<TokenizedInput, EngineError>>, EngineError> {
        self.submit(Work::Pairs { queries, documents, pairs }, options).await
    }

    async fn submit(&self, work: Work, options: EncodeOptions) -> Result<Vec<Result<TokenizedInput, EngineError>>, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.jobs.send(Job { work, options, reply, panic: false }).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Whether no worker is left to take jobs.
    pub fn is_closed(&self) -> bool {
        self.jobs.is_closed()
    }

    /// Test hook: makes the worker that takes this job panic (the job's request fails; the
    /// worker must survive).
    #[doc(hidden)]
    pub async fn panic_in_a_worker(&self) -> Result<Vec<Result<TokenizedInput, EngineError>>, EngineError> {
        let (reply, rx) = oneshot::channel();
        let options = EncodeOptions { add_special_tokens: true, truncate_to: None, side: TruncationSide::Right, pair_limits: PairLimits::default() };
        let job = Job { work: Work::Texts(vec![TextInput::Single(String::new())]), options, reply, panic: true };
        self.jobs.send(job).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_truncation_sides() {
        let opts = |side| EncodeOptions { add_special_tokens: true, truncate_to: Some(2), side, pair_limits: PairLimits::default() };
        assert_eq!(truncate_ids(vec![1, 2, 3], opts(TruncationSide::Right)).ids, vec![1, 2]);
        assert_eq!(truncate_ids(vec![1, 2, 3], opts(TruncationSide::Left)).ids, vec![2, 3]);
        assert_eq!(truncate_ids(vec![1], opts(TruncationSide::Left)).ids, vec![1]);
    }
}
