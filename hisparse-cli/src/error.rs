//! The CLI's error: one line that says what went wrong and what to change.

use std::fmt;

/// A failure the CLI reports as a single line on stderr before exiting non-zero.
#[derive(Debug)]
pub enum CliError {
    /// The arguments are wrong; the message says what to change. Exit code 2.
    Usage(String),
    /// The requested backend is not compiled into this binary. Exit code 2.
    NotCompiled(&'static str),
    /// The backend or the run failed. Exit code 1.
    Failed(String),
}

impl CliError {
    /// A usage error.
    pub fn usage(msg: impl Into<String>) -> Self {
        CliError::Usage(msg.into())
    }

    /// A run-time failure.
    pub fn failed(msg: impl Into<String>) -> Self {
        CliError::Failed(msg.into())
    }

    /// Wraps a backend error with what was being done.
    pub fn device<E: hisparse_core::Error>(what: &str, e: E) -> Self {
        CliError::Failed(format!("{what}: {e} ({})", e.kind()))
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) | CliError::NotCompiled(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            CliError::Usage(m) | CliError::Failed(m) => m.clone(),
            CliError::NotCompiled(b) => format!(
                "the {b} backend is not compiled into this binary; rebuild with \
                 `cargo build --release -p hisparse-cli --features {b}`"
            ),
        };
        // Always one line: fold any embedded line breaks.
        let one: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        f.write_str(&one.join("; "))
    }
}

impl std::error::Error for CliError {}

/// `Result` with a [`CliError`].
pub type CliResult<T> = Result<T, CliError>;
