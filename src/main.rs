//! The `poolserve` command: parses the command line into a `ServerConfig` and runs the server.

use clap::{Parser, Subcommand};
use poolserve::config::{LogFormat, ServeArgs, ServerConfig};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "poolserve", version, about = "Serve embedding, classification and reranking models over HTTP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model (vLLM-style flags).
    Serve(ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let config = match ServerConfig::try_from(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => logs.init(),
        // One JSON object per event, with the request span (method, path, request id).
        LogFormat::Json => logs.json().with_current_span(true).init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(poolserve::server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line. Each cause's text usually repeats inside its parent's
/// (thiserror's `{0}`), so only new text is appended; candle's backtraces (RUST_BACKTRACE) are cut.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.lines().next().unwrap_or_default();
        if !line.contains(text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(text);
        }
    }
    line
}
