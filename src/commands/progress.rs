//! Progress of a batch run on stderr: one line rewritten in place on a terminal (inputs/s,
//! tokens/s, ETA from the bytes of input read so far), or a log line every 10 s otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    started: Instant,
    last: Instant,
    terminal: bool,
    total_bytes: u64,
    pub inputs: usize,
    pub tokens: usize,
    pub bytes: u64,
}

impl Progress {
    pub fn new(total_bytes: u64) -> Self {
        let now = Instant::now();
        Progress { started: now, last: now, terminal: std::io::stderr().is_terminal(), total_bytes, inputs: 0, tokens: 0, bytes: 0 }
    }

    fn line(&self) -> String {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let eta = if self.bytes > 0 && self.total_bytes > self.bytes {
            let rest = elapsed * (self.total_bytes - self.bytes) as f64 / self.bytes as f64;
            format!(", ETA {:.0} s", rest)
        } else {
            String::new()
        };
        format!(
            "{} inputs, {:.1} inputs/s, {:.0} tokens/s, {:.0}% of the input{eta}",
            self.inputs,
            self.inputs as f64 / elapsed,
            self.tokens as f64 / elapsed,
            100.0 * self.bytes as f64 / self.total_bytes.max(1) as f64
        )
    }

    /// Called after each written chunk; prints at most every 0.2 s (terminal) or 10 s (logs).
    pub fn tick(&mut self) {
        let every = if self.terminal { Duration::from_millis(200) } else { Duration::from_secs(10) };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let mut err = std::io::stderr();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{}", self.line());
        } else {
            let _ = writeln!(err, "progress: {}", self.line());
        }
    }

    pub fn finish(&self) -> String {
        if self.terminal {
            eprint!("\r\x1b[2K");
        }
        format!(
            "{} inputs, {} tokens in {:.1?} ({:.1} inputs/s)",
            self.inputs,
            self.tokens,
            self.started.elapsed(),
            self.inputs as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
        )
    }
}
