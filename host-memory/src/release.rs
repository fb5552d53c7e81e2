//! Releasing host pools off the caller's thread.
//!
//! Unpinning and unmapping hundreds of GiB takes seconds; an engine's thread must not wait for
//! it. A released pool's memory is handed to a thread of its own (`hisparse-release`), which
//! unpins and unmaps it in parallel chunks; [`Release`] says when that is done, and
//! [`wait_for_releases`] waits for every release of the process (before measuring free memory,
//! or before allocating a pool as large as the one just dropped).
//!
//! A process may exit while a release runs: `exit` does not wait for the thread, and the kernel
//! frees the address space, its pinned pages included (the GPU drivers drop every registration
//! of a process when its device file closes), so nothing outlives the process.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Releases started and not yet finished, in the whole process.
static IN_FLIGHT: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether one release finished.
#[derive(Debug, Default)]
struct Done {
    finished: Mutex<bool>,
    signal: Condvar,
}

/// A pool's release, running or finished.
#[derive(Debug, Clone)]
#[must_use = "dropping a Release does not stop it; keep it to wait for the memory to be gone"]
pub struct Release {
    done: Arc<Done>,
}

impl Release {
    /// A release that finished before it was returned (done on the caller's thread).
    pub(crate) fn finished() -> Release {
        let done = Done::default();
        *lock(&done.finished) = true;
        Release {
            done: Arc::new(done),
        }
    }

    /// Whether the memory has been unpinned and unmapped.
    pub fn is_finished(&self) -> bool {
        *lock(&self.done.finished)
    }

    /// Waits until the memory has been unpinned and unmapped.
    pub fn wait(&self) {
        let mut f = lock(&self.done.finished);
        while !*f {
            f = self.done.signal.wait(f).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits at most `timeout`; whether the release finished.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let Some(end) = Instant::now().checked_add(timeout) else {
            self.wait();
            return true;
        };
        let mut f = lock(&self.done.finished);
        while !*f {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            f = self
                .done
                .signal
                .wait_timeout(f, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// Runs `job` — a pool's unpinning and unmapping, or dropping what holds pinned memory (a
/// runtime over an engine's lent pool, then the engine's object that owns the memory) — on a
/// release thread of its own, counted with this process's releases ([`releases_in_flight`],
/// [`wait_for_releases`], and the budget checks that wait for them), and returns at once.
/// Where no thread can be started (the process is out of threads), `job` runs here: slower for
/// the caller, never lost.
pub fn in_background(job: impl FnOnce() + Send + 'static) -> Release {
    let done = Arc::new(Done::default());
    *lock(&IN_FLIGHT.0) += 1;
    let finish = {
        let done = done.clone();
        move || {
            *lock(&done.finished) = true;
            done.signal.notify_all();
            let mut n = lock(&IN_FLIGHT.0);
            *n -= 1;
            IN_FLIGHT.1.notify_all();
        }
    };
    // The job and its completion travel together: if the thread cannot start, both come back
    // and run here.
    let task = Mutex::new(Some((job, finish)));
    let task = Arc::new(task);
    let theirs = task.clone();
    let spawned = std::thread::Builder::new()
        .name("hisparse-release".into())
        .spawn(move || {
            if let Some((job, finish)) = lock(&theirs).take() {
                job();
                finish();
            }
        });
    if spawned.is_err()
        && let Some((job, finish)) = lock(&task).take()
    {
        job();
        finish();
    }
    Release { done }
}

/// Releases of this process started and not finished yet.
pub fn releases_in_flight() -> usize {
    *lock(&IN_FLIGHT.0)
}

/// Waits at most `timeout` for every release of the process to finish; whether they all did.
pub fn wait_for_releases(timeout: Duration) -> bool {
    // A timeout past what an instant can hold (`Duration::MAX`) waits for as long as it takes.
    let end = Instant::now().checked_add(timeout);
    let mut n = lock(&IN_FLIGHT.0);
    while *n > 0 {
        let Some(end) = end else {
            n = IN_FLIGHT.1.wait(n).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        n = IN_FLIGHT
            .1
            .wait_timeout(n, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_release_runs_off_the_caller_and_reports_when_done() {
        let (go, wait_for_go) = mpsc::channel::<()>();
        let r = in_background(move || {
            wait_for_go.recv().unwrap();
        });
        assert!(!r.is_finished(), "the job waits for the test");
        assert!(!r.wait_timeout(Duration::from_millis(20)));
        assert!(releases_in_flight() >= 1);
        go.send(()).unwrap();
        r.wait();
        assert!(r.is_finished());
        assert!(r.wait_timeout(Duration::ZERO));
        assert!(
            r.wait_timeout(Duration::MAX),
            "no deadline: waits as long as it takes"
        );
        assert!(wait_for_releases(Duration::MAX));
        assert!(Release::finished().is_finished());
    }
}
