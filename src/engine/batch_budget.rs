//! How many tokens the next batch may take. On the CPU, with no `--max-batch-tokens`, a batch
//! that others wait behind is sized by time, not tokens: about [`LATENCY_BATCH`] of work at the
//! rate the model has been running. A query that arrives while bulk requests flood the model
//! then waits about one short batch, whatever the bulk requests' size; a request alone keeps
//! full-size batches, and a GPU (whose throughput needs large batches) its token budget.
//!
//! Measured (benches/query_under_flood.py, MiniLM, 2-core Zen 4, three clients sending 1,024
//! texts of 200 tokens, 3 interleaved rounds): a one-sentence query's p50 went from 810 ms
//! (4,096-token batches) to 157 ms (max 193 ms) with 100 ms batches, the flood's throughput
//! from 7,508 to 7,793 tokens/s; 130 ms batches gave 197 ms.

use std::time::Duration;

/// The work a contended CPU batch is sized to.
pub const LATENCY_BATCH: Duration = Duration::from_millis(100);

/// The fewest tokens a time-sized batch takes: below it, per-batch costs eat the throughput.
pub const MIN_LATENCY_TOKENS: usize = 512;

#[derive(Debug, Clone, Copy)]
pub struct BatchBudget {
    /// `Some` on the CPU without `--max-batch-tokens`: the time a contended batch is sized to.
    target: Option<Duration>,
    /// Tokens per second of recent batches (a moving average); `None` before the first.
    rate: Option<f64>,
}

impl BatchBudget {
    pub fn new(target: Option<Duration>) -> Self {
        BatchBudget { target, rate: None }
    }

    /// Notes a batch of `tokens` that took `took`. Small batches (a query alone) run at a lower
    /// rate than the batches being sized; they are left out.
    pub fn observe(&mut self, tokens: usize, took: Duration) {
        if took.is_zero() || tokens < MIN_LATENCY_TOKENS / 2 {
            return;
        }
        let rate = tokens as f64 / took.as_secs_f64();
        self.rate = Some(self.rate.map_or(rate, |old| 0.7 * old + 0.3 * rate));
    }

    /// The next batch's token budget: `max_tokens`, or, when other requests wait behind this
    /// batch (`contended`) and the budget is time-sized, the tokens of [`LATENCY_BATCH`] at the
    /// recent rate (at least [`MIN_LATENCY_TOKENS`], at most `max_tokens`).
    pub fn max_tokens(&self, max_tokens: usize, contended: bool) -> usize {
        match (self.target, self.rate) {
            (Some(target), Some(rate)) if contended => {
                let tokens = (rate * target.as_secs_f64()) as usize;
                tokens.clamp(MIN_LATENCY_TOKENS.min(max_tokens), max_tokens)
            }
            _ => max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contended_batches_are_sized_by_time() {
        let mut budget = BatchBudget::new(Some(Duration::from_millis(100)));
        assert_eq!(budget.max_tokens(4096, true), 4096, "no rate yet");
        budget.observe(4000, Duration::from_millis(500)); // 8,000 tokens/s
        assert_eq!(budget.max_tokens(4096, true), 800);
        assert_eq!(budget.max_tokens(4096, false), 4096, "a request alone keeps full batches");
        budget.observe(16, Duration::from_millis(4)); // a query alone: not a rate to size by
        assert_eq!(budget.max_tokens(4096, true), 800);
        for _ in 0..10 {
            budget.observe(1000, Duration::from_secs(10)); // a slow stretch: 100 tokens/s
        }
        assert_eq!(budget.max_tokens(4096, true), MIN_LATENCY_TOKENS);
        let fixed = BatchBudget { target: None, rate: Some(8000.0) };
        assert_eq!(fixed.max_tokens(4096, true), 4096, "--max-batch-tokens or a GPU: the token budget");
    }
}
