//! A progress bar on stderr, drawn only when stderr is a terminal.

use std::io::{IsTerminal, Write};
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
