//! A stream of requests answered as TEI answers its `*Stream` calls: each message is its own
//! request, run at once beside the others (so the scheduler batches them together), and the
//! answers leave in the order the requests came. The first error ends the stream, as tonic ends
//! a stream at its first `Err`.
//!
//! Bounded where TEI is not: at most [`WINDOW`] messages of one stream run at once (TEI: 1024
//! queued, each waiting for a permit), and a client that stops reading stops the reading of its
//! requests, so a stream holds at most a window of requests and answers whatever its length.
//! A client that goes away cancels the messages still running (their inputs leave the queue).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

/// Messages of one stream running at once: enough for the scheduler to fill a batch from one
/// stream, few enough that a handful of streams stay under `--max-concurrent-requests` (512 by
/// default; each running message holds one admission, as a unary call does).
pub const WINDOW: usize = 32;

/// Streams whose answers are still being sent (shutdown waits for them).
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many streams are still answering.
pub fn open() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// Counts a stream as open while it lives.
struct Open;

impl Open {
    fn new() -> Self {
        OPEN.fetch_add(1, Ordering::Relaxed);
        Open
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The answers of a stream, in request order.
pub type Answers<T> = ReceiverStream<Result<T, Status>>;

/// A running message's task, aborted when dropped (its stream is gone).
struct Running<T>(JoinHandle<T>);

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Answers every message of `requests` with `work`, in order, [`WINDOW`] at once.
pub fn in_order<Req, Res, F, Fut>(mut requests: Streaming<Req>, work: F) -> Answers<Res>
where
    Req: Send + 'static,
    Res: Send + 'static,
    F: Fn(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Res, Status>> + Send + 'static,
{
    let (running_tx, mut running_rx) = mpsc::channel::<Running<Result<Res, Status>>>(WINDOW - 1);
    let (answers_tx, answers_rx) = mpsc::channel(WINDOW);
    // Reads the requests and starts each; waits while a window of them runs.
    tokio::spawn(async move {
        loop {
            let (task, last) = match requests.message().await {
                Ok(Some(request)) => (tokio::spawn(work(request)), false),
                Ok(None) => break,
                // A message that does not decode answers in its place, and ends the stream.
                Err(status) => (tokio::spawn(async move { Err(status) }), true),
            };
            if running_tx.send(Running(task)).await.is_err() || last {
                break;
            }
        }
    });
    // Hands the answers over in request order, until the first error or the client leaves.
    let open = Open::new();
    tokio::spawn(async move {
        let _open = open;
        while let Some(mut running) = running_rx.recv().await {
            let answer = (&mut running.0).await.unwrap_or_else(|e| Err(Status::internal(format!("the request's task failed: {e}"))));
            let failed = answer.is_err();
            if answers_tx.send(answer).await.is_err() || failed {
                break;
            }
        }
    });
    ReceiverStream::new(answers_rx)
}
