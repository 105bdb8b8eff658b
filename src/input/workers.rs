//! The input workers: threads of the model's own (a rayon pool apart from the model's) that run
//! its [`TextTokenizer`], and the other input work a request brings (image decoding, chat
//! rendering: [`InputWorkers::execute`]), so the async runtime never blocks on it. Each job
//! catches its own panic, so a tokenizer or decoder bug fails that request and nothing else.
//!
//! Jobs wait in the pool's FIFO queue without a bound of their own: every job belongs to an
//! admitted request (`--max-concurrent-requests`), which bounds the queue.

use super::tokenizer::{EncodeOptions, TextInput, TextTokenizer};
use super::InputError;
use crate::models::batch::TokenizedInput;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What a job tokenizes.
enum Work {
    Texts(Vec<TextInput>),
    /// Cross-encoder pairs by index into the distinct queries and documents, so that each text
    /// is tokenized once however many pairs it is in ([`TextTokenizer::encode_pairs`]).
    Pairs {
        queries: Vec<String>,
        documents: Vec<String>,
        pairs: Vec<(usize, usize)>,
    },
    /// Test hook ([`InputWorkers::panic_in_a_worker`]): the job panics.
    #[cfg(any(test, feature = "test-hooks"))]
    Panic,
}

impl Work {
    fn outputs(&self) -> usize {
        match self {
            Work::Texts(texts) => texts.len(),
            Work::Pairs { pairs, .. } => pairs.len(),
            #[cfg(any(test, feature = "test-hooks"))]
            Work::Panic => 1,
        }
    }

    fn run(&self, tokenizer: &TextTokenizer, options: EncodeOptions) -> Vec<Result<TokenizedInput, InputError>> {
        match self {
            Work::Texts(texts) => texts.iter().map(|t| tokenizer.encode_input(t, options).map_err(InputError::from)).collect(),
            Work::Pairs { queries, documents, pairs } => {
                tokenizer.encode_pairs(queries, documents, pairs, options).into_iter().map(|r| r.map_err(InputError::from)).collect()
            }
            #[cfg(any(test, feature = "test-hooks"))]
            Work::Panic => panic!("tokenizer test hook"),
        }
    }
}

/// Threads that own the tokenizing. One request's texts go to one worker, in order.
#[derive(Clone)]
pub struct InputWorkers {
    tokenizer: Arc<TextTokenizer>,
    pool: Arc<rayon::ThreadPool>,
}

impl InputWorkers {
    pub fn new(tokenizer: Arc<TextTokenizer>, workers: usize) -> std::io::Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers.max(1))
            .thread_name(|i| format!("input-{i}"))
            // A panic outside a job's own catch (logging, replying) is logged, and the worker
            // goes on; without a handler rayon would abort the process.
            .panic_handler(|_| tracing::error!("a tokenizer worker panicked outside a job; it goes on"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Self { tokenizer, pool: Arc::new(pool) })
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The tokenizer, for work handed to [`Self::execute`].
    pub fn shared(&self) -> Arc<TextTokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// The text of `ids`, decoded on a blocking thread (a long id list is milliseconds of work
    /// that must not hold a runtime worker).
    pub async fn decode(&self, ids: Vec<u32>, skip_special_tokens: bool) -> Result<String, InputError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        Ok(tokio::task::spawn_blocking(move || tokenizer.decode(&ids, skip_special_tokens)).await.map_err(|_| InputError::Stopped)??)
    }

    pub async fn encode(
        &self,
        texts: Vec<TextInput>,
        options: EncodeOptions,
    ) -> Result<Vec<Result<TokenizedInput, InputError>>, InputError> {
        self.submit(Work::Texts(texts), options).await
    }

    /// Cross-encoder pairs, each distinct text tokenized once ([`TextTokenizer::encode_pairs`]).
    pub async fn encode_pairs(
        &self,
        queries: Vec<String>,
        documents: Vec<String>,
        pairs: Vec<(usize, usize)>,
        options: EncodeOptions,
    ) -> Result<Vec<Result<TokenizedInput, InputError>>, InputError> {
        self.submit(Work::Pairs { queries, documents, pairs }, options).await
    }

    async fn submit(&self, work: Work, options: EncodeOptions) -> Result<Vec<Result<TokenizedInput, InputError>>, InputError> {
        let (reply, rx) = oneshot::channel();
        let tokenizer = Arc::clone(&self.tokenizer);
        self.pool.spawn(move || {
            if reply.is_closed() {
                return; // the client has gone
            }
            let count = work.outputs();
            // A tokenizer bug on one input must fail that request, not the worker.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.run(&tokenizer, options))).unwrap_or_else(|_| {
                tracing::error!("the tokenizer panicked on a request of {count} inputs; the request fails, the worker goes on");
                (0..count).map(|_| Err(InputError::Tokenizer("the tokenizer panicked on this input".into()))).collect()
            });
            let _ = reply.send(out);
        });
        rx.await.map_err(|_| InputError::Stopped)
    }

    /// Other input work (decoding images) on the same workers, with the same containment: a
    /// panic fails this request only.
    pub async fn execute<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, InputError> {
        let (reply, rx) = oneshot::channel();
        self.pool.spawn(move || {
            if reply.is_closed() {
                return;
            }
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
                Ok(out) => {
                    let _ = reply.send(Ok(out));
                }
                Err(_) => {
                    tracing::error!("an input worker panicked; the request fails, the worker goes on");
                    let _ = reply.send(Err(InputError::Panicked("an input worker panicked on this request")));
                }
            }
        });
        rx.await.map_err(|_| InputError::Stopped)?
    }

    /// Test hook: makes the worker that takes this job panic (the job's request fails; the
    /// worker must survive).
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn panic_in_a_worker(&self) -> Result<Vec<Result<TokenizedInput, InputError>>, InputError> {
        let options = EncodeOptions {
            add_special_tokens: true,
            truncate_to: None,
            side: super::tokenizer::TruncationSide::Right,
            pair_limits: Default::default(),
        };
        self.submit(Work::Panic, options).await
    }
}
