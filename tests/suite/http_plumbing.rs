//! What a deployment puts around the API, through the real binary: CORS with vLLM's flags
//! (preflights answered before the API key is asked for, `*` lists, credentials mirroring the
//! request as Starlette does, nothing when the flags are absent), several API keys from the flag
//! and from a key file, and bad values stopping the server with one line.

use crate::common::server::{assert_one_line_error, request, run_to_exit, start, wait_ready, Answer};
use crate::common::*;
use serde_json::json;

fn preflight(port: u16, origin: &str) -> Answer {
    let headers =
        [("Origin", origin), ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", "authorization, content-type")];
    request(port, "OPTIONS", "/v1/embeddings", None, &headers).expect("answer")
}

fn embed_from(port: u16, origin: &str, key: Option<&str>) -> Answer {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Origin", origin)];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth.as_str()));
    }
    request(port, "POST", "/v1/embeddings", Some(&json!({"input": "hello"})), &headers).expect("answer")
}

#[test]
fn cors_answers_the_allowed_origins_only() {
    let fixture = fixture_model("bert-embed-mean");
    let model = fixture.to_str().unwrap();
    let app = "https://app.example.com";
    let mut server = start(
        &[
            model,
            "--allowed-origins",
            r#"["https://app.example.com", "http://localhost:3000"]"#,
            "--api-key",
            "first-key",
            "--api-key",
            "second-key",
        ],
        &[],
    );
    wait_ready(&mut server);
    // The preflight needs no key; methods and headers default to vLLM's `*`.
    let answer = preflight(server.port, app);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("access-control-allow-origin"), Some(app));
    assert_eq!(answer.header("access-control-allow-methods"), Some("*"));
    assert_eq!(answer.header("access-control-allow-headers"), Some("*"));
    assert_eq!(answer.header("access-control-max-age"), Some("600"));
    assert_eq!(answer.header("access-control-allow-credentials"), None);
    // Either key; a refusal carries the CORS headers too, so the page can read the error.
    for key in ["first-key", "second-key"] {
        let answer = embed_from(server.port, app, Some(key));
        assert_eq!(answer.status, 200, "{key}: {}", answer.text());
        assert_eq!(answer.header("access-control-allow-origin"), Some(app));
    }
    let refused = embed_from(server.port, app, Some("third-key"));
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("access-control-allow-origin"), Some(app));
    // Another origin: no CORS headers (the browser blocks the page).
    let other = embed_from(server.port, "https://evil.example.com", Some("first-key"));
    assert_eq!(other.status, 200);
    assert_eq!(other.header("access-control-allow-origin"), None);
    assert_eq!(preflight(server.port, "https://evil.example.com").header("access-control-allow-origin"), None);
    drop(server);

    // `*` with credentials: the request's own origin, method and headers (browsers refuse `*`
    // with credentials), as Starlette answers.
    let mut server = start(&[model, "--allowed-origins", "*", "--allow-credentials"], &[]);
    wait_ready(&mut server);
    let answer = preflight(server.port, "https://any.example.org");
    assert_eq!(answer.header("access-control-allow-origin"), Some("https://any.example.org"));
    assert_eq!(answer.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(answer.header("access-control-allow-methods"), Some("POST"));
    assert_eq!(answer.header("access-control-allow-headers"), Some("authorization, content-type"));
    drop(server);

    // Off by default: no CORS headers at all.
    let mut server = start(&[model], &[]);
    wait_ready(&mut server);
    assert_eq!(embed_from(server.port, app, None).header("access-control-allow-origin"), None);
    assert_eq!(preflight(server.port, app).header("access-control-allow-origin"), None);
}

#[test]
fn api_keys_from_a_file() {
    let fixture = fixture_model("bert-embed-mean");
    let dir = std::env::temp_dir().join(format!("poolserve-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, "# tenants\nkey-of-team-a\n\n  key-of-team-b  \n").unwrap();
    let mut server = start(&[fixture.to_str().unwrap(), "--api-key-file", keys.to_str().unwrap()], &[]);
    wait_ready(&mut server);
    for key in ["key-of-team-a", "key-of-team-b"] {
        assert_eq!(embed_from(server.port, "http://x", Some(key)).status, 200, "{key}");
    }
    for key in [None, Some("# tenants"), Some("")] {
        assert_eq!(embed_from(server.port, "http://x", key).status, 401, "{key:?}");
    }
    drop(server);
    std::fs::write(&keys, "# nothing yet\n").unwrap();
    assert_one_line_error(&["serve", "m", "--api-key-file", keys.to_str().unwrap()], "holds no key");
    assert_one_line_error(&["serve", "m", "--api-key-file", "/no/such/keys"], "--api-key-file /no/such/keys");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_cors_values_stop_the_server_with_one_line() {
    assert_one_line_error(&["serve", "m", "--allowed-origins", "app.example.com"], "--allowed-origins: `app.example.com` is not an origin");
    assert_one_line_error(&["serve", "m", "--allowed-origins", "https://a.example.com/"], "is not an origin");
    assert_one_line_error(&["serve", "m", "--allowed-origins", "*", "--allowed-methods", "GET,PO ST"], "`PO ST` is not an HTTP method");
    assert_one_line_error(&["serve", "m", "--allowed-origins", "[\"https://a.example.com\""], "--allowed-origins must be a JSON list");
}

#[test]
fn auto_truncate_cuts_what_the_openai_route_would_refuse() {
    let fixture = fixture_model("bert-embed-mean");
    let model = fixture.to_str().unwrap();
    let long = "word ".repeat(2000);
    let body = json!({"input": long});
    let mut server = start(&[model], &[]);
    wait_ready(&mut server);
    let refused = request(server.port, "POST", "/v1/embeddings", Some(&body), &[]).unwrap();
    assert_eq!(refused.status, 400, "vLLM refuses: {}", refused.text());
    drop(server);
    let mut server = start(&[model, "--auto-truncate"], &[]);
    wait_ready(&mut server);
    let cut = request(server.port, "POST", "/v1/embeddings", Some(&body), &[]).unwrap();
    assert_eq!(cut.status, 200, "{}", cut.text());
    let explicit = json!({"input": long, "truncate_prompt_tokens": -1});
    let same = request(server.port, "POST", "/v1/embeddings", Some(&explicit), &[]).unwrap();
    assert_eq!(cut.json()["data"], same.json()["data"], "the same as truncate_prompt_tokens -1");
    assert_eq!(cut.json()["usage"]["prompt_tokens"], same.json()["usage"]["prompt_tokens"]);
}

#[test]
fn url_prefix_and_root_path() {
    let fixture = fixture_model("bert-embed-mean");
    let server = start(&[fixture.to_str().unwrap(), "--url-prefix", "/embed-svc/", "--root-path", "/proxy"], &[]);
    // /health lives under the prefix too.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while request(server.port, "GET", "/embed-svc/health", None, &[]).is_none_or(|a| a.status != 200) {
        assert!(std::time::Instant::now() < deadline, "not ready under the prefix");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let answer = request(server.port, "POST", "/embed-svc/v1/embeddings", Some(&json!({"input": "hello"})), &[]).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let outside = request(server.port, "POST", "/v1/embeddings", Some(&json!({"input": "hello"})), &[]).unwrap();
    assert_eq!(outside.status, 404);
    assert_eq!(outside.json()["error"]["type"], "NotFoundError", "the API's 404 outside the prefix");
    let unknown = request(server.port, "GET", "/embed-svc/nothing-here", None, &[]).unwrap();
    assert_eq!(unknown.status, 404);
    // gRPC keeps the protocol's paths at the root (HTTP/1.1 here: tonic answers it with a
    // gRPC status, which is all this checks).
    let grpc = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let head = "POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\nContent-Type: application/grpc\r\nTE: trailers\r\nContent-Length: 5\r\nConnection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&[0, 0, 0, 0, 0]).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        String::from_utf8_lossy(&answer).to_ascii_lowercase()
    };
    assert!(grpc.contains("content-type: application/grpc"), "{grpc}");
    // The description names the path clients use; the page fetches it through that path.
    let api = request(server.port, "GET", "/embed-svc/openapi.json", None, &[]).unwrap().json();
    assert_eq!(api["servers"][0]["url"], "/proxy/embed-svc");
    let page = request(server.port, "GET", "/embed-svc/docs/swagger-initializer.js", None, &[]).unwrap();
    assert_eq!(page.status, 200);
    assert!(page.text().contains("/proxy/embed-svc/openapi.json"), "{}", page.text());
    drop(server);

    assert_one_line_error(&["serve", "m", "--url-prefix", "embed-svc"], "--url-prefix must start with `/`");
    assert_one_line_error(&["serve", "m", "--root-path", "/a b"], "--root-path `/a b` holds ` `");
}

#[cfg(unix)]
#[test]
fn serves_on_a_unix_socket() {
    use std::io::{Read, Write};
    let fixture = fixture_model("bert-embed-mean");
    let dir = std::env::temp_dir().join(format!("poolserve-uds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("poolserve.sock");
    let ask = |path: &str, body: &str| -> Option<String> {
        let mut stream = std::os::unix::net::UnixStream::connect(&socket).ok()?;
        let method = if body.is_empty() { "GET" } else { "POST" };
        let head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        stream.write_all(head.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    };
    // Twice: the second run replaces the socket file the first left behind.
    for _ in 0..2 {
        let mut server = start(&[fixture.to_str().unwrap(), "--uds", socket.to_str().unwrap()], &[]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !ask("/health", "").is_some_and(|a| a.starts_with("HTTP/1.1 200")) {
            assert!(server.child.try_wait().unwrap().is_none(), "the server stopped");
            assert!(std::time::Instant::now() < deadline, "not ready on the socket");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let answer = ask("/v1/embeddings", r#"{"input": "hello"}"#).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("\"embedding\""), "{answer}");
        // Nothing on the TCP port.
        assert!(request(server.port, "GET", "/health", None, &[]).is_none());
        drop(server);
    }
    let file = dir.join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let (ok, stderr) = run_to_exit(&["serve", fixture.to_str().unwrap(), "--uds", file.to_str().unwrap()]);
    assert!(!ok && stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    std::fs::remove_dir_all(&dir).unwrap();
}
