//! Waiting for what a test can observe, with a deadline, instead of
//! sleeping for a guessed while.

use std::time::{Duration, Instant};

/// How often [`wait_until`] looks again.
pub const POLL: Duration = Duration::from_millis(20);

/// Waits until `cond` holds, looking every [`POLL`]; fails the test with
/// `what` once `limit` has passed.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// Looks at `probe` every `every` until `done` holds of what it returned
/// or `limit` has passed, and returns what it returned last: for what
/// drains on its own time (processes reaped, watchdogs done), which the
/// caller then asserts on.
pub fn settle<T>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let seen = probe();
        if done(&seen) || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(every);
    }
}
