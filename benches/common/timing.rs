//! The timing loop the single-process benchmarks share: warm-up runs, then the median of
//! `iterations` timed runs (the median, not the mean: these machines drift, and one slow run
//! should not move the number).

use std::time::{Duration, Instant};

/// The median time of `f` over `iterations` runs, after `warmups` untimed ones.
pub fn median_of(warmups: usize, iterations: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..warmups {
        f();
    }
    let mut times: Vec<Duration> = (0..iterations.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}
