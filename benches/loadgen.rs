//! Load generator: drives a running poolserve over HTTP/1.1 keep-alive connections at a fixed
//! concurrency with a deterministic mixed-length corpus, and reports sequences/s, tokens/s,
//! latency percentiles, errors and the server's peak RSS.
//!
//! ```sh
//! cargo bench --bench loadgen -- --url http://127.0.0.1:8000 --concurrency 32 --requests 2000 \
//!     [--batch 1] [--min-tokens 8] [--max-tokens 300] [--server-pid PID] [--dump-corpus FILE] [--model NAME]
//! ```
//!
//! The corpus is generated from a fixed seed (same texts on every run and machine), with target
//! lengths spread uniformly between `--min-tokens` and `--max-tokens`; `--dump-corpus` writes it
//! as JSON so other stacks (benches/compare_server.py) can run the identical inputs. Token counts
//! are the server's own (`usage.prompt_tokens`). No external service or HTTP library is
//! needed: the client is a minimal HTTP/1.1 writer/reader over tokio's TcpStream.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Options {
    url: String,
    concurrency: usize,
    requests: usize,
    batch: usize,
    min_tokens: usize,
    max_tokens: usize,
    server_pid: Option<u32>,
    dump_corpus: Option<String>,
    path: String,
    /// The `model` field of every request (servers with several models need one).
    model: Option<String>,
}

fn options() -> Options {
    let mut o = Options {
        url: "http://127.0.0.1:8000".into(),
        concurrency: 32,
        requests: 2000,
        batch: 1,
        min_tokens: 8,
        max_tokens: 300,
        server_pid: None,
        dump_corpus: None,
        path: "/v1/embeddings".into(),
        model: None,
    };
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let number = |v: &str| v.parse::<usize>().unwrap_or_else(|_| panic!("{} needs a number", args[i]));
        match args[i].as_str() {
            "--url" => o.url = value,
            "--path" => o.path = value,
            "--concurrency" => o.concurrency = number(&value),
            "--requests" => o.requests = number(&value),
            "--batch" => o.batch = number(&value),
            "--min-tokens" => o.min_tokens = number(&value),
            "--max-tokens" => o.max_tokens = number(&value),
            "--server-pid" => o.server_pid = Some(number(&value) as u32),
            "--dump-corpus" => o.dump_corpus = Some(value),
            "--model" => o.model = Some(value),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    o
}

/// Words of ordinary English prose; a word is 1.2–1.4 WordPiece tokens on average.
const WORDS: &str = "the of and to in is was for on that with as by at from his her it an were which are this \
    be had not have one their or also has but its first new two after who other more all been when during \
    time year city people world school known state some most many years later war made these used them such \
    only into between where called both over under work part number include united music series american \
    because while national before team played several through found film group life family river village \
    house government company around university church however three based since until north south east west \
    small large early second system city center public history water power light music field local market";

/// A deterministic corpus: text `i` has about `target` tokens, `target` uniform in the range.
fn corpus(n: usize, min_tokens: usize, max_tokens: usize) -> Vec<String> {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    (0..n)
        .map(|_| {
            let target = min_tokens + next() % (max_tokens - min_tokens + 1);
            // [CLS] and [SEP] count as two tokens; words average ~1.3 tokens.
            let count = ((target.saturating_sub(2)) as f64 / 1.3).round().max(1.0) as usize;
            let mut text: Vec<&str> = (0..count).map(|_| words[next() % words.len()]).collect();
            text[0] = "The";
            text.join(" ") + "."
        })
        .collect()
}

/// One keep-alive connection.
struct Connection {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Connection {
    async fn open(host: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(host).await?;
        stream.set_nodelay(true)?;
        Ok(Connection { reader: BufReader::new(stream), host: host.to_string() })
    }

    /// POSTs `body`; returns the status and the response body.
    async fn post(&mut self, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut length = 0;
        let mut chunked = false;
        loop {
            line.clear();
            if self.reader.read_line(&mut line).await? == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
                if name.eq_ignore_ascii_case("transfer-encoding") && value.trim().eq_ignore_ascii_case("chunked") {
                    chunked = true;
                }
            }
        }
        if !chunked {
            let mut body = vec![0; length];
            self.reader.read_exact(&mut body).await?;
            return Ok((status, body));
        }
        // Large responses are streamed: `size\r\n data\r\n` … `0\r\n\r\n`.
        let mut body = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size"))?;
            let start = body.len();
            body.resize(start + size + 2, 0);
            self.reader.read_exact(&mut body[start..]).await?;
            body.truncate(start + size);
            if size == 0 {
                return Ok((status, body));
            }
        }
    }
}

/// The server's peak resident set (VmHWM) in MiB, from /proc.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64() * 1e3
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let o = options();
    let texts = Arc::new(corpus(o.requests * o.batch, o.min_tokens, o.max_tokens));
    if let Some(path) = &o.dump_corpus {
        let mut file = std::fs::File::create(path).expect("corpus file");
        file.write_all(serde_json::to_string(&*texts).expect("json").as_bytes()).expect("write corpus");
    }
    let host = o.url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..o.concurrency {
        let (texts, next, host, path, batch, requests) = (texts.clone(), next.clone(), host.clone(), o.path.clone(), o.batch, o.requests);
        let model = o.model.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let (mut errors, mut tokens, mut sequences) = (0usize, 0usize, 0usize);
            let mut connection = Connection::open(&host).await.expect("connect to the server");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let input = &texts[i * batch..(i + 1) * batch];
                let body = match &model {
                    Some(model) => serde_json::json!({ "input": input, "model": model }),
                    None => serde_json::json!({ "input": input }),
                };
                let body = serde_json::to_vec(&body).expect("json");
                let start = Instant::now();
                match connection.post(&path, &body).await {
                    Ok((200, reply)) => {
                        latencies.push(start.elapsed());
                        let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap_or_default();
                        tokens += reply["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
                        sequences += batch;
                    }
                    Ok(_) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        connection = Connection::open(&host).await.expect("reconnect to the server");
                    }
                }
            }
            (latencies, errors, tokens, sequences)
        }));
    }
    let (mut latencies, mut errors, mut tokens, mut sequences) = (Vec::new(), 0, 0, 0);
    for worker in workers {
        let (l, e, t, s) = worker.await.expect("worker");
        latencies.extend(l);
        errors += e;
        tokens += t;
        sequences += s;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    println!(
        "loadgen: {} requests × {} inputs, concurrency {}, {}–{} tokens per input",
        o.requests, o.batch, o.concurrency, o.min_tokens, o.max_tokens
    );
    println!(
        "throughput {:.1} sequences/s, {:.0} tokens/s ({} tokens in {:.2} s)",
        sequences as f64 / elapsed,
        tokens as f64 / elapsed,
        tokens,
        elapsed
    );
    println!(
        "latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; errors {errors}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    if let Some(pid) = o.server_pid {
        match peak_rss_mib(pid) {
            Some(mib) => println!("server peak RSS {mib:.0} MiB"),
            None => println!("server peak RSS unknown (no /proc/{pid}/status)"),
        }
    }
}
