//! The connection loop: every connection a listener (plain or [`super::tls::TlsListener`])
//! accepts is served HTTP/1.1 or HTTP/2 (told apart by the client's first bytes: h2c with prior
//! knowledge, as gRPC clients speak it, or h2 after ALPN) until the server stops; then each
//! connection finishes its requests and closes (HTTP/2 with GOAWAY).
//!
//! Written here rather than `axum::serve` for HTTP/2's windows. h2 (since 0.4.16) closes a
//! connection whose unread small DATA frames exceed a budget of half the connection window
//! (GOAWAY ENHANCE_YOUR_CALM, "too_many_data_frames"), its guard against floods of tiny frames.
//! A gRPC stream of short texts is exactly such frames (one message each, 8 bytes and up), and
//! a stream runs at most a window of messages at once ([`crate::api::grpc`]), so a client that
//! sends faster than the model embeds (or stops reading the answers) leaves frames unread until
//! flow control stops it, one stream window later. With hyper's windows (1 MiB each: a 512 KiB
//! budget) such streams were cut after a few dozen answers. Here a stream window of 256 KiB
//! holds at most 32,768 of the smallest messages (8 MiB of budget), and the 32 MiB connection
//! window gives a 16 MiB budget: two streams stalled at once on one connection with the
//! smallest messages, many more with real texts. 256 KiB in flight per stream is still ~25,000
//! short texts a second at 10 ms of round trip, more than a model embeds.

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;

/// HTTP/2's windows (see the module's note).
const CONNECTION_WINDOW: u32 = 32 << 20;
const STREAM_WINDOW: u32 = 256 << 10;

/// TCP_NODELAY: an HTTP/2 answer leaves in several small writes (headers, data, gRPC's
/// trailers), and Nagle's algorithm held the later ones for the client's delayed ACK: a gRPC
/// call took 52 ms instead of 4 (measured, MiniLM on 2 cores). HTTP/1.1 answers, one write each,
/// did not suffer; tonic's own server sets it too.
pub fn no_delay(stream: &mut tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY not set: {e}");
    }
}

/// Serves `app` on every connection of `listener` until `stop` finishes, then waits for the
/// open connections to finish their requests and close.
pub async fn serve<L: Listener>(mut listener: L, app: Router, stop: impl Future<Output = ()>) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http2().initial_connection_window_size(CONNECTION_WINDOW).initial_stream_window_size(STREAM_WINDOW);
    let service = TowerToHyperService::new(app);
    let connections = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            (io, _peer) = listener.accept() => {
                let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service.clone()).into_owned();
                let connection = connections.watch(connection);
                tokio::spawn(async move {
                    // A client that breaks off mid-request is its own business.
                    if let Err(e) = connection.await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            _ = &mut stop => break,
        }
    }
    // No more connections; those open finish their requests (the shutdown timeout bounds it).
    drop(listener);
    connections.shutdown().await;
    Ok(())
}
