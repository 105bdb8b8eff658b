//! The `poolserve` command: parses the command line into a `ServerConfig` and runs the server.

use clap::{Parser, Subcommand};
use poolserve::commands::{self, CommandArgs};
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
    /// Embed every input of a file (JSON Lines or text) into a JSON Lines file.
    Embed(CommandArgs),
    /// Classify every input of a file.
    Classify(CommandArgs),
    /// Score every `text_1`/`text_2` pair of a JSON Lines file.
    Score(CommandArgs),
    /// Any pooling task (`--task`) over every input of a file.
    Encode(CommandArgs),
}

fn main() -> ExitCode {
    // Before any thread exists (it may set an environment variable).
    poolserve::kernels::settle_thread_pools();
    // vLLM's spellings of the flags (`--pooler-config.task X`, `--hf_overrides`) read as ours.
    let args = match poolserve::config::vllm_style_args(std::env::args().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    let (file_command, args) = match cli.command {
        Command::Serve(args) => (None, args),
        Command::Embed(c) => (Some((commands::Command::Embed, c.clone())), c.model),
        Command::Classify(c) => (Some((commands::Command::Classify, c.clone())), c.model),
        Command::Score(c) => (Some((commands::Command::Score, c.clone())), c.model),
        Command::Encode(c) => (Some((commands::Command::Encode, c.clone())), c.model),
    };
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
    if let Some((command, args)) = file_command {
        return match commands::run(command, args) {
            Ok(summary) => {
                eprintln!(
                    "done: {} written, {} bad lines skipped, {} already in the output; {}",
                    summary.written, summary.skipped_errors, summary.skipped_done, summary.message
                );
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("error: {message}");
                ExitCode::FAILURE
            }
        };
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
