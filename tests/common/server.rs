//! The real `poolserve` binary on a free port, and a minimal HTTP/1.1 client for it: what the
//! tests that drive the binary the way users run it share.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_poolserve");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running server, killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer: status, headers (names lowercased), body bytes.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The error message of an error body (`{"error": {"message"}}`, or TEI's `{"error"}`).
    pub fn message(&self) -> String {
        let body = self.json();
        match &body["error"] {
            Value::String(s) => s.clone(),
            other => other["message"].as_str().unwrap_or_default().to_string(),
        }
    }
}

/// One request over a fresh connection; `None` when the server does not answer.
pub fn request(port: u16, method: &str, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> Option<Answer> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Some(Answer { status, headers, body })
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = data.windows(2).position(|w| w == b"\r\n") else { return out };
        let size = usize::from_str_radix(String::from_utf8_lossy(&data[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = end + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
}

pub fn post(port: u16, path: &str, body: Value) -> Answer {
    request(port, "POST", path, Some(&body), &[]).unwrap_or_else(|| panic!("no answer from {path}"))
}

/// Starts `poolserve serve ARGS` on a free port.
pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Server {
    start_in(".", args, envs)
}

/// [`start`] in the working folder `dir`.
pub fn start_in(dir: &str, args: &[&str], envs: &[(&str, &str)]) -> Server {
    let port = free_port();
    let port_text = port.to_string();
    let mut command = Command::new(BIN);
    command.current_dir(dir);
    command.arg("serve").args(args).env("POOLSERVE_PORT", &port_text).env("POOLSERVE_HOST", "127.0.0.1");
    // float32 unless the test says otherwise (`--dtype`, or POOLSERVE_DTYPE in `envs`): the
    // parity references are float32, and `--dtype auto` may choose bfloat16 on CPUs with
    // native bf16 products (its own tests cover that).
    command.env("POOLSERVE_DTYPE", "float32");
    for (k, v) in envs {
        command.env(k, v);
    }
    let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("binary starts");
    Server { child, port }
}

/// Waits for `/health` to answer 200 (panics if the server exits first).
pub fn wait_ready(server: &mut Server) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("server exited during startup: {status}");
        }
        if let Some(answer) = request(server.port, "GET", "/health", None, &[]) {
            if answer.status == 200 {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("server not ready within 120 s");
}

/// A ready server for `args`.
pub fn serve(args: &[&str]) -> Server {
    let mut server = start(args, &[]);
    wait_ready(&mut server);
    server
}

/// The binary with `args` stops at start with one line, `error: …` containing `part`.
pub fn assert_one_line_error(args: &[&str], part: &str) {
    let (ok, stderr) = run_to_exit(args);
    assert!(!ok, "{args:?} should fail");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {stderr}");
    assert!(lines[0].starts_with("error:") && lines[0].contains(part), "{args:?}: {stderr}");
}

/// Runs the binary with `args` to completion; returns (success, stderr).
pub fn run_to_exit(args: &[&str]) -> (bool, String) {
    let output = Command::new(BIN).args(args).env("RUST_LOG", "error").output().expect("binary runs");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).to_string())
}
