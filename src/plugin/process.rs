//! One plugin process: the Python host (`host.py`) started with `python -c`, holding one
//! instance of the plugin. A call that does not answer in time kills it; one that finds it gone
//! says so; the pool above starts another for the next request. While a call runs, the plugin
//! may ask the server's tokenizer (its renderer's `get_tokenizer()`): those frames are answered
//! in the same exchange, and the call's time limit covers them.

use super::frame::{self, Frame};
use super::{tokenizer, PluginError, PluginOptions};
use crate::input::tokenizer::TextTokenizer;
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const HOST: &str = include_str!("host.py");

pub struct PluginProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// False once a call failed in a way that leaves the process unusable.
    pub healthy: bool,
    /// What the plugin's `merge_pooling_params()` returned at start (its `task`, …).
    pub asked_params: Option<Value>,
}

/// What the host answers at start: the plugin loaded, or the names it could have loaded.
pub enum Started {
    Ready(Box<PluginProcess>),
    NotInstalled { installed: Vec<String> },
}

impl PluginProcess {
    /// Starts the host and loads plugin `name` with the model's settings (`model`).
    pub async fn start(name: &str, options: &PluginOptions, model: &Value, text: &TextTokenizer) -> Result<Started, PluginError> {
        let mut child = Command::new(&options.python)
            .arg("-c")
            .arg(HOST)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // One BLAS thread: a plugin's numpy must not spread over the model's cores.
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1")
            .env("PYTHONUNBUFFERED", "1")
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| PluginError::Start(format!("cannot run `{}` for plugin `{name}`: {e}", options.python.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(PluginError::Start("the plugin process has no pipes".into()));
        };
        let mut process = PluginProcess { child, stdin, stdout, healthy: true, asked_params: None };
        let paths: Vec<String> = options.paths.iter().map(|p| p.display().to_string()).collect();
        let hello = json!({"plugin": name, "paths": paths, "model": model, "memory_limit_bytes": options.memory_limit_bytes});
        let answer = process.call(Frame::json(hello), options.start_timeout, text).await?;
        match answer.header.get("ok").and_then(Value::as_bool) {
            Some(true) => {
                process.asked_params = answer.header.get("params").cloned();
                Ok(Started::Ready(Box::new(process)))
            }
            _ if answer.header["status"] == 404 => {
                let installed = answer.header["plugins"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(String::from));
                Ok(Started::NotInstalled { installed: installed.collect() })
            }
            _ => Err(PluginError::Start(format!(
                "plugin `{name}` failed to load: {}",
                answer.header["message"].as_str().unwrap_or("(no message; see the server's log)")
            ))),
        }
    }

    /// Sends one frame and waits for the answer, at most `timeout`, answering the plugin's
    /// questions to the tokenizer (`text`) on the way; on a timeout or a broken pipe the process
    /// is killed and marked unhealthy.
    pub async fn call(&mut self, request: Frame, timeout: Duration, text: &TextTokenizer) -> Result<Frame, PluginError> {
        let exchange = async {
            frame::write(&mut self.stdin, &request).await?;
            loop {
                let frame = frame::read(&mut self.stdout).await?;
                if frame.header.get("call").is_none() {
                    return Ok(frame);
                }
                let reply = tokenizer::answer(text, &frame.header);
                frame::write(&mut self.stdin, &Frame::json(reply)).await?;
            }
        };
        let answer = match tokio::time::timeout(timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(PluginError::Timeout(timeout)),
        };
        match answer {
            Ok(answer) => Ok(answer),
            // A closed pipe: the process died; say how.
            Err(PluginError::Gone(error)) => {
                self.healthy = false;
                match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
                    Ok(Ok(status)) => Err(PluginError::Crashed(status.to_string())),
                    _ => {
                        let _ = self.child.start_kill();
                        Err(PluginError::Gone(error))
                    }
                }
            }
            Err(error) => {
                self.healthy = false;
                let _ = self.child.start_kill();
                Err(error)
            }
        }
    }
}
