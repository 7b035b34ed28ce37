//! A watch on a call that cannot be interrupted: NCCL's blocking initialisation, which waits
//! for every rank of every node and, when one never connects (a node's NCCL picked a network
//! interface the others cannot reach, the commonest multi-node NCCL failure), waits forever.
//! The call runs as it is; a second thread calls `expired` if it has not returned in time, and
//! `expired` decides what to do (the CLI reports and ends the process).

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// Runs `f` on this thread. If it has not returned within `limit`, `expired(limit)` runs on a
/// watching thread (while `f` still runs); otherwise it never runs. Returns `f`'s result, once
/// `expired` (if it ran) has finished.
pub fn watched<T>(
    limit: Duration,
    expired: impl FnOnce(Duration) + Send + 'static,
    f: impl FnOnce() -> T,
) -> T {
    let (done, wait) = mpsc::channel::<()>();
    let watcher = std::thread::spawn(move || {
        // `f` returned: its end of the channel is dropped, which wakes this wait at once.
        if let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
            expired(limit);
        }
    });
    let out = f();
    drop(done);
    // The watcher ends as soon as it sees the dropped sender (or after `expired`).
    let _ = watcher.join();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    #[test]
    fn a_call_past_its_limit_is_reported_while_it_runs() {
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        let out = watched(
            Duration::from_millis(20),
            move |limit| *s.lock().unwrap() = Some(limit),
            || {
                std::thread::sleep(Duration::from_millis(300));
                7
            },
        );
        assert_eq!(out, 7);
        assert_eq!(*seen.lock().unwrap(), Some(Duration::from_millis(20)));
    }

    #[test]
    fn a_call_within_its_limit_is_not_reported_and_not_delayed() {
        let seen = Arc::new(Mutex::new(false));
        let s = seen.clone();
        let t = Instant::now();
        let out = watched(
            Duration::from_secs(60),
            move |_| *s.lock().unwrap() = true,
            || "done",
        );
        assert_eq!(out, "done");
        assert!(!*seen.lock().unwrap());
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
}
