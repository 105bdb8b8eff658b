//! Models from a Hugging Face hub, through the real binary and a hub of our own on a local
//! port (`HF_ENDPOINT`): the token from `HF_TOKEN` or `--hf-token` reaches the hub as
//! `Authorization: Bearer`, and the hub's 401 and 403 become one line that names `HF_TOKEN`
//! and never the token.
//!
//! The fake hub answers the three requests hf-hub makes, as huggingface.co does: the repository's
//! file list (`/api/models/ORG/NAME/revision/REV`), a file's first byte with its etag, commit and
//! size (`Range: bytes=0-0`), then the file from an offset. `acme/gated-bert` lists its files to
//! anyone and refuses downloads without access, like a gated model; `acme/private-bert` refuses
//! everything, like a private one.

use crate::common::server::{start, wait_ready, BIN};
use crate::common::*;
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

const GOOD_TOKEN: &str = "hf_good_token_5f3a";
const NO_ACCESS_TOKEN: &str = "hf_no_access_token_9c1e";

/// A hub serving `folder` as both repositories; returns its URL and the Authorization headers
/// it received.
fn fake_hub(folder: PathBuf) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let (mut auth, mut range) = (String::new(), String::new());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                let (name, value) = line.split_once(':').unwrap_or((&line, ""));
                match name.to_ascii_lowercase().as_str() {
                    "authorization" => auth = value.trim().to_string(),
                    "range" => range = value.trim().to_string(),
                    _ => {}
                }
            }
            log.lock().unwrap().push(auth.clone());
            let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (status, headers, body) = answer(&folder, &path, &auth, &range);
            let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&body));
        }
    });
    (url, seen)
}

fn answer(folder: &Path, path: &str, auth: &str, range: &str) -> (&'static str, Vec<(&'static str, String)>, Vec<u8>) {
    let refuse = |status: &'static str| {
        (status, vec![("Content-Type", "application/json".to_string())], br#"{"error":"Access to model is restricted."}"#.to_vec())
    };
    let access = match auth.strip_prefix("Bearer ") {
        Some(GOOD_TOKEN) => Ok(()),
        Some(NO_ACCESS_TOKEN) => Err("403 Forbidden"),
        _ => Err("401 Unauthorized"),
    };
    let files = files_under(folder, "");
    for repo in ["acme/gated-bert", "acme/private-bert"] {
        if path == format!("/api/models/{repo}/revision/main") {
            if let (Err(status), "acme/private-bert") = (access, repo) {
                return refuse(status);
            }
            let siblings: Vec<_> = files.iter().map(|f| json!({"rfilename": f})).collect();
            let info = json!({"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": siblings});
            return ("200 OK", vec![("Content-Type", "application/json".to_string())], info.to_string().into_bytes());
        }
        if let Some(file) = path.strip_prefix(&format!("/{repo}/resolve/main/")) {
            if let Err(status) = access {
                return refuse(status);
            }
            let Ok(mut bytes) = std::fs::read(folder.join(file)) else { return ("404 Not Found", vec![], Vec::new()) };
            let size = bytes.len();
            let start: usize = range.strip_prefix("bytes=").and_then(|r| r.split('-').next()).and_then(|s| s.parse().ok()).unwrap_or(0);
            if range == "bytes=0-0" {
                bytes.truncate(1);
            } else {
                bytes.drain(..start.min(size));
            }
            let headers = vec![
                ("ETag", format!("\"etag-{file}-{size}\"")),
                ("X-Repo-Commit", "0123456789abcdef0123456789abcdef01234567".to_string()),
                ("Content-Range", format!("bytes {start}-{}/{size}", size.saturating_sub(1))),
            ];
            return ("206 Partial Content", headers, bytes);
        }
    }
    ("404 Not Found", vec![], b"{\"error\":\"Repository not found\"}".to_vec())
}

/// Every file under `folder`, as the hub names them (`1_Pooling/config.json`).
fn files_under(folder: &Path, prefix: &str) -> Vec<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap() {
        let entry = entry.unwrap();
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if entry.path().is_dir() {
            files.extend(files_under(&entry.path(), &format!("{name}/")));
        } else {
            files.push(name);
        }
    }
    files
}

/// `serve MODEL` against the hub with `envs`, run to its exit: (success, stderr).
fn serve_to_exit(hub: &str, home: &Path, model: &str, extra: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(BIN);
    command.args(["serve", model, "--port", "0"]).args(extra).env("HF_HOME", home).env("HF_ENDPOINT", hub).env("RUST_LOG", "error");
    for name in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"] {
        command.env_remove(name);
    }
    for (k, v) in envs {
        command.env(k, v);
    }
    let output = command.output().unwrap();
    let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut rest = String::new();
    let _ = output.stdout.as_slice().read_to_string(&mut rest);
    stderr.push_str(&rest);
    (output.status.success(), stderr)
}

fn assert_refused(outcome: (bool, String), part: &str) {
    let (ok, stderr) = outcome;
    assert!(!ok, "the server should stop: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(lines[0].starts_with("error:") && lines[0].contains(part), "{stderr}");
    assert!(
        !stderr.contains(GOOD_TOKEN) && !stderr.contains(NO_ACCESS_TOKEN) && !stderr.contains("hf_wrong"),
        "a token was echoed: {stderr}"
    );
}

#[test]
fn gated_and_private_models_need_a_token_and_say_so() {
    let (hub, seen) = fake_hub(fixture_model("bert-embed-mean"));
    let home = std::env::temp_dir().join(format!("poolserve-hub-home-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();

    // No token: the private model's listing and the gated model's downloads are refused.
    for model in ["acme/private-bert", "acme/gated-bert"] {
        assert_refused(
            serve_to_exit(&hub, &home, model, &[], &[]),
            "is gated or private on the Hugging Face hub (HTTP 401, no token sent): pass a read token",
        );
    }
    // A token the hub does not know, from the environment, and one without access from the flag.
    assert_refused(serve_to_exit(&hub, &home, "acme/gated-bert", &[], &[("HF_TOKEN", "hf_wrong_token")]), "refused the token");
    assert_refused(
        serve_to_exit(&hub, &home, "acme/private-bert", &["--hf-token", NO_ACCESS_TOKEN], &[("HF_TOKEN", GOOD_TOKEN)]),
        "(HTTP 403): accept its conditions",
    );
    assert!(seen.lock().unwrap().iter().any(|a| a == &format!("Bearer {NO_ACCESS_TOKEN}")), "--hf-token wins over HF_TOKEN");

    // HF_TOKEN with access: the model is fetched and serves the reference's vectors.
    let mut server = start(
        &["acme/gated-bert"],
        &[("HF_HOME", home.to_str().unwrap()), ("HF_ENDPOINT", &hub), ("HF_TOKEN", GOOD_TOKEN), ("HF_HUB_OFFLINE", "0")],
    );
    wait_ready(&mut server);
    let reference = expected("bert-embed-mean");
    let text = reference["texts"][0]["text"].clone();
    let answer = crate::common::server::post(server.port, "/v1/embeddings", json!({"model": "acme/gated-bert", "input": text}));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_close(&floats(&answer.json()["data"][0]["embedding"]), &floats(&reference["texts"][0]["embedding"]), "model from the hub");
    drop(server);
    assert!(seen.lock().unwrap().iter().filter(|a| *a == &format!("Bearer {GOOD_TOKEN}")).count() >= 3, "the token reached the hub");

    // The old variable name and the token file are read too (huggingface_hub's order).
    std::fs::remove_dir_all(home.join("hub")).unwrap();
    let mut server = start(
        &["acme/private-bert"],
        &[("HF_HOME", home.to_str().unwrap()), ("HF_ENDPOINT", &hub), ("HUGGING_FACE_HUB_TOKEN", GOOD_TOKEN)],
    );
    wait_ready(&mut server);
    drop(server);
    std::fs::remove_dir_all(home.join("hub")).unwrap();
    std::fs::write(home.join("token"), GOOD_TOKEN).unwrap();
    let mut server = start(&["acme/private-bert"], &[("HF_HOME", home.to_str().unwrap()), ("HF_ENDPOINT", &hub)]);
    wait_ready(&mut server);
    drop(server);
    std::fs::remove_dir_all(&home).unwrap();
}
