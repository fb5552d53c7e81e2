//! Progress on stderr, drawn only when stderr is a terminal: a bar for work with a known total,
//! a ticker (elapsed time) for work without one.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A single-line progress bar that redraws at most every 100 ms.
pub struct Progress {
    enabled: bool,
    total: u64,
    label: String,
    last: Option<Instant>,
}

impl Progress {
    /// A bar for `total` units; disabled (silent) when stderr is not a terminal or `quiet`.
    pub fn new(label: &str, total: u64, quiet: bool) -> Self {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
            total: total.max(1),
            label: label.to_string(),
            last: None,
        }
    }

    /// Shows `done` of the total, with a short status text.
    pub fn set(&mut self, done: u64, status: &str) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if done < self.total
            && self
                .last
                .is_some_and(|t| now - t < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        const WIDTH: u64 = 30;
        let filled = (done.min(self.total) * WIDTH / self.total) as usize;
        let bar = format!(
            "{}{}",
            "#".repeat(filled),
            "-".repeat(WIDTH as usize - filled)
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{} [{bar}] {done}/{} {status}",
            self.label, self.total
        );
        let _ = err.flush();
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// Elapsed time on one stderr line, redrawn twice a second by a background thread until the
/// ticker is dropped: progress for a long call that reports nothing itself.
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Starts a ticker labelled `label`; disabled (no thread) when stderr is not a terminal or
    /// `quiet`.
    pub fn start(label: &str, quiet: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        if quiet || !std::io::stderr().is_terminal() {
            return Ticker { stop, thread: None };
        }
        let (flag, label) = (Arc::clone(&stop), label.to_string());
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{label}… {} s", t0.elapsed().as_secs());
                let _ = err.flush();
                drop(err);
                std::thread::sleep(Duration::from_millis(500));
            }
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        });
        Ticker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
