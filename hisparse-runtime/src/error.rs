//! The runtime's error type: a device failure (with what the runtime was doing), or a call that
//! does not fit the layout, the configuration or the step sequence.

use core::fmt;

use hisparse_core::layout::LayoutError;
use hisparse_core::{Error, ErrorKind};

/// Why a runtime call failed. `E` is the backend's error type.
///
/// Every variant's message says what to change. [`RuntimeError::kind`] classifies it portably.
#[derive(Debug)]
#[non_exhaustive]
pub enum RuntimeError<E> {
    /// The backend failed while the runtime was doing `what`.
    Device {
        /// What the runtime was doing, e.g. "resolving index group 3".
        what: &'static str,
        /// The backend's error.
        source: E,
    },
    /// The layout cannot be executed as planned (a layer or group it names is missing).
    Layout(LayoutError),
    /// A configuration value is out of range.
    Config {
        /// The field.
        field: &'static str,
        /// Why, and what to change.
        reason: String,
    },
    /// A pool handed to the runtime is smaller than the layout needs.
    PoolTooSmall {
        /// "device pool" or "host pool".
        what: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes the pool has.
        available: u64,
    },
    /// The memory the device reports free cannot hold what the runtime would allocate; nothing
    /// was allocated.
    NotEnoughMemory {
        /// "device" or "host".
        what: &'static str,
        /// Bytes the runtime would allocate.
        needed: u64,
        /// Bytes free.
        available: u64,
    },
    /// A command or call names a state row beyond `state_rows`.
    StateRow {
        /// The row.
        row: u32,
        /// Rows the runtime holds.
        rows: u32,
    },
    /// A call carries more token rows than the runtime was configured for.
    TooManyTokens {
        /// Token rows given.
        tokens: u32,
        /// `max_step_tokens` of the configuration.
        max: u32,
    },
    /// An index group or layer outside the layout.
    NoSuchGroup {
        /// What was named ("index group", "layer").
        what: &'static str,
        /// Its number.
        value: u32,
    },
    /// A call out of sequence (e.g. a per-layer resolve before [`crate::Runtime::begin_step`]).
    Sequence(&'static str),
    /// A [`crate::StreamId`] that was not lent to this runtime.
    NoSuchStream {
        /// The id's index.
        id: u32,
    },
    /// Before-replay work called on a stream that is being captured into a graph.
    Capture {
        /// The call.
        call: &'static str,
    },
    /// A command out of order: run twice, older than the last, or after a skipped step.
    StepOrder {
        /// The step this runtime ran last.
        last: u64,
        /// The command's step.
        got: u64,
    },
    /// A batch row names a state row no request scheduled in the open step holds.
    NotScheduled {
        /// The state row.
        row: u32,
        /// The open step.
        step: u64,
    },
    /// A batch padded for a graph shape no capture recorded, or larger than the padding.
    GraphShape {
        /// Token rows of the batch.
        rows: u32,
        /// The padding asked for.
        pad_to: u32,
        /// Token-row counts of the per-layer calls captured so far.
        captured: Vec<u32>,
    },
    /// A command field that does not match the layout (a table update naming a source group as
    /// a resident group, a page beyond the table, …).
    Command(String),
}

impl<E> RuntimeError<E> {
    /// Wraps a backend error with what the runtime was doing.
    pub(crate) fn device(what: &'static str) -> impl FnOnce(E) -> Self {
        move |source| RuntimeError::Device { what, source }
    }
}

impl<E: fmt::Display> fmt::Display for RuntimeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Device { what, source } => write!(f, "{what}: {source}"),
            RuntimeError::Layout(e) => write!(f, "layout: {e}"),
            RuntimeError::Config { field, reason } => {
                write!(f, "runtime config `{field}`: {reason}")
            }
            RuntimeError::PoolTooSmall {
                what,
                needed,
                available,
            } => write!(
                f,
                "the {what} holds {available} bytes but the layout needs {needed}; pass a pool of at least {needed} bytes"
            ),
            RuntimeError::NotEnoughMemory {
                what,
                needed,
                available,
            } => write!(
                f,
                "the runtime needs {needed} bytes of {what} memory but only {available} are free (host memory: MemAvailable); plan a smaller pool — fewer GPU blocks (`--gpu-mem`, `gpu_mem=`) or a smaller host budget (`--host-mem`, `host_mem=`, `HiSparseConfig::host_budget_bytes`) — or fewer state rows"
            ),
            RuntimeError::StateRow { row, rows } => write!(
                f,
                "state row {row} is beyond the runtime's {rows} rows; configure `state_rows` as the coordinator's `max_running`"
            ),
            RuntimeError::TooManyTokens { tokens, max } => write!(
                f,
                "{tokens} token rows in one call, but the runtime was built for at most {max}; raise `max_step_tokens`"
            ),
            RuntimeError::NoSuchGroup { what, value } => {
                write!(f, "{what} {value} is not part of the layout")
            }
            RuntimeError::Sequence(m) => write!(f, "out of sequence: {m}"),
            RuntimeError::Command(m) => write!(f, "command does not match the layout: {m}"),
            RuntimeError::NoSuchStream { id } => write!(
                f,
                "stream id {id} was not lent to this runtime; pass an id adopt_stream returned"
            ),
            RuntimeError::Capture { call } => write!(
                f,
                "{call} is before-replay work but its stream is being captured into a graph; call it outside the capture (before replaying the graph, on the stream the graph is replayed on)"
            ),
            RuntimeError::StepOrder { last, got } => {
                if got == last {
                    write!(
                        f,
                        "the command of step {got} already ran: run each command once"
                    )
                } else if got < last {
                    write!(
                        f,
                        "the command of step {got} is older than step {last}, which already ran: run commands in order"
                    )
                } else {
                    write!(
                        f,
                        "the command of step {got} follows step {last}: the commands of steps {}..={} never ran; run every command, in order",
                        last + 1,
                        got - 1
                    )
                }
            }
            RuntimeError::NotScheduled { row, step } => write!(
                f,
                "state row {row} is not held by a request scheduled in step {step}; give set_batch the slots of the step's scheduled requests (-1 for padding)"
            ),
            RuntimeError::GraphShape {
                rows,
                pad_to,
                captured,
            } => write!(
                f,
                "a batch of {rows} token rows padded to {pad_to}, but the per-layer calls captured in graphs carry {captured:?} token rows; pad to the token rows of the graph you replay (at least the batch's)"
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RuntimeError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::Device { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl<E: Error> Error for RuntimeError<E> {
    fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::Device { source, .. } => source.kind(),
            RuntimeError::NotEnoughMemory { what: "host", .. } => ErrorKind::OutOfPinnedMemory,
            RuntimeError::NotEnoughMemory { .. } => ErrorKind::OutOfDeviceMemory,
            _ => ErrorKind::InvalidArgument,
        }
    }
}

impl<E> From<LayoutError> for RuntimeError<E> {
    fn from(e: LayoutError) -> Self {
        RuntimeError::Layout(e)
    }
}
