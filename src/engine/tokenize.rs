//! The tokenizer worker pool: the model's [`TextTokenizer`] run on a few threads of their own so
//! the async runtime never blocks on it; a panic is contained to its job and a dead worker is
//! replaced.

use super::EngineError;
use crate::loader::tokenizer::{EncodeOptions, PairLimits, TextInput, TextTokenizer, TruncationSide};
use crate::models::batch::TokenizedInput;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

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
                    Work::Texts(texts) => texts.iter().map(|t| tokenizer.encode_input(t, job.options).map_err(EngineError::from)).collect::<Vec<_>>(),
                    Work::Pairs { queries, documents, pairs } => tokenizer.encode_pairs(queries, documents, pairs, job.options).into_iter().map(|r| r.map_err(EngineError::from)).collect(),
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
        Ok(tokio::task::spawn_blocking(move || tokenizer.decode(&ids)).await.map_err(|_| EngineError::Stopped)??)
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
