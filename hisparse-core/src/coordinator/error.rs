//! Errors of the coordinator: [`CoordError`] and the [`PoolKind`] it names.

use core::fmt;

use super::RequestId;
#[cfg(doc)]
use super::{Coordinator, CoordinatorConfig, OffloadCommand};
#[cfg(doc)]
use crate::layout::KvCacheConfig;
use crate::layout::LayoutError;
use crate::pool::PoolError;

/// Which pool ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PoolKind {
    /// The GPU pool.
    Gpu,
    /// The pinned host pool.
    Host,
}

/// A scheduling or reporting error. Every variant names the request, worker or value at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CoordError {
    /// A [`CoordinatorConfig`] field is zero.
    ZeroConfig {
        /// Field name.
        field: &'static str,
    },
    /// A [`CoordinatorConfig`] field is larger than the coordinator can serve.
    ConfigTooLarge {
        /// Field name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// Memory for the coordinator's own bookkeeping could not be allocated (a caller-given size
    /// the allocator refused); nothing was changed.
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
    /// The layout's pools are unusable (a pool error while building them).
    Pool(PoolError),
    /// The request id is already known.
    DuplicateRequest {
        /// The id.
        id: RequestId,
    },
    /// No such request.
    UnknownRequest {
        /// The id.
        id: RequestId,
    },
    /// A request must have at least one prompt token.
    EmptyPrompt {
        /// The id.
        id: RequestId,
    },
    /// The request would exceed `max_model_len`.
    TooLong {
        /// The id.
        id: RequestId,
        /// Tokens it would have.
        tokens: u64,
        /// The limit.
        max_model_len: u32,
    },
    /// The request can never fit the pools, even alone.
    NeverFits {
        /// The id.
        id: RequestId,
        /// The pool that is too small.
        pool: PoolKind,
        /// Blocks it needs.
        needed: u64,
        /// Usable blocks in the pool.
        capacity: u64,
    },
    /// A prefill chunk reads its whole earlier context on the GPU (pages that live only on
    /// host are staged there first), and this request's context could never be held there
    /// beside the chunk, even with the whole GPU pool free. Give the KV cache more GPU memory
    /// (a larger `num_gpu_blocks`; `--gpu-mem` on the CLI) or use shorter prompts.
    PrefillNeverFits {
        /// The id.
        id: RequestId,
        /// Tokens of context before the chunk (or of the prompt, at admission).
        context_tokens: u32,
        /// GPU blocks that context and the chunk's first page need.
        needed: u64,
        /// Usable blocks in the GPU pool.
        capacity: u64,
    },
    /// `schedule` asked for more tokens than the request has uncomputed.
    NotEnoughTokens {
        /// The id.
        id: RequestId,
        /// Tokens asked for.
        requested: u32,
        /// Tokens available.
        available: u32,
    },
    /// A rollback ([`Coordinator::rollback`]) asks to give back more computed tokens than the
    /// request's last step may return: at most `max_query_len - 1` of them (a step's
    /// speculative tokens), never its first token, and never into a page that is reclaimed or
    /// marked for release.
    RollbackTooFar {
        /// The id.
        id: RequestId,
        /// Computed tokens the rollback would give back.
        requested: u32,
        /// Computed tokens it may give back.
        allowed: u32,
    },
    /// An import call out of turn or with unusable arguments (see
    /// [`Coordinator::reserve_import`]).
    Import {
        /// The id.
        id: RequestId,
        /// What is wrong and what to do instead.
        what: &'static str,
    },
    /// The request is not running (waiting requests are started by [`Coordinator::step`] or
    /// [`Coordinator::start`]).
    NotRunning {
        /// The id.
        id: RequestId,
    },
    /// No free slot (state row) to start a request.
    NoFreeSlot,
    /// No running request holds this state row.
    UnknownSlot {
        /// The state row.
        slot: u32,
    },
    /// The layout handed to [`Coordinator::new`] breaks a rule of the planner (hand-edited or
    /// deserialised); see [`KvCacheConfig::validate`].
    InvalidLayout(LayoutError),
    /// A worker index is out of range.
    UnknownWorker {
        /// The worker.
        worker: u32,
        /// Workers configured.
        num_workers: u32,
    },
    /// A worker reported a transfer out of FIFO order or one never issued / never enqueued.
    OutOfOrderReport {
        /// The worker.
        worker: u32,
        /// `"enqueued"` or `"completed"`.
        what: &'static str,
        /// The id reported.
        id: u64,
        /// The id expected next.
        expected: u64,
    },
    /// The request was refused while a step was scheduled ([`OffloadCommand::refused`]): it
    /// holds no block and is in no queue. [`Coordinator::finish`] it (or finish it and admit a
    /// shorter one).
    Refused {
        /// The id.
        id: RequestId,
        /// Why it was refused.
        reason: RefusalReason,
    },
    /// A rollback of a request whose tokens the open step has scheduled (between
    /// [`Coordinator::schedule`] or [`Coordinator::schedule_step`] and
    /// [`Coordinator::build_offload_command`]): the step's command would still compute the
    /// tokens given back. Roll back before scheduling the step, or after building its command.
    RollbackInOpenStep {
        /// The id.
        id: RequestId,
        /// The open step's number (the command it builds carries it).
        step: u64,
    },
}

/// Why a request was refused while a step was scheduled ([`OffloadCommand::refused`]): plain,
/// portable data (no borrowed text), the reason [`CoordError`] of the scheduling that refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RefusalReason {
    /// Its prefill can never hold its context on the GPU ([`CoordError::PrefillNeverFits`]):
    /// a restart whose recomputed context outgrew the pool. Finish it, or admit it again with a
    /// shorter context.
    PrefillNeverFits {
        /// Tokens of context before the chunk.
        context_tokens: u32,
        /// GPU blocks that context and the chunk's first page need.
        needed: u64,
        /// Usable blocks in the GPU pool.
        capacity: u64,
    },
    /// It can never fit a pool, even alone ([`CoordError::NeverFits`]).
    NeverFits {
        /// The pool that is too small.
        pool: PoolKind,
        /// Blocks it needs.
        needed: u64,
        /// Usable blocks in the pool.
        capacity: u64,
    },
    /// The coordinator's bookkeeping for it could not be allocated
    /// ([`CoordError::OutOfMemory`]).
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Any other error scheduling it met (a pool refusing what the coordinator's accounting
    /// allowed: a defect to report, with the request's history).
    Internal,
}

impl RefusalReason {
    /// The reason `e` (an error of scheduling or starting one request) gives.
    pub fn of(e: &CoordError) -> Self {
        match *e {
            CoordError::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
                ..
            } => RefusalReason::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
            },
            CoordError::NeverFits {
                pool,
                needed,
                capacity,
                ..
            } => RefusalReason::NeverFits {
                pool,
                needed,
                capacity,
            },
            CoordError::OutOfMemory { bytes, .. } => RefusalReason::OutOfMemory { bytes },
            CoordError::Refused { reason, .. } => reason,
            _ => RefusalReason::Internal,
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RefusalReason::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
            } => write!(
                f,
                "prefill over its {context_tokens} tokens of context needs that context on the GPU ({needed} blocks with the chunk's first page) but the GPU pool has {capacity}; give the KV cache more GPU memory (num_gpu_blocks, --gpu-mem) or shorten the prompt"
            ),
            RefusalReason::NeverFits {
                pool,
                needed,
                capacity,
            } => write!(
                f,
                "needs {needed} {} blocks but the pool has {capacity}; plan larger pools",
                match pool {
                    PoolKind::Gpu => "GPU",
                    PoolKind::Host => "host",
                }
            ),
            RefusalReason::OutOfMemory { bytes } => write!(
                f,
                "{bytes} B of bookkeeping could not be allocated; shorten it or lower max_model_len"
            ),
            RefusalReason::Internal => f.write_str(
                "a pool refused what the coordinator's accounting allowed (a defect: report it with the request's calls)",
            ),
        }
    }
}

impl From<PoolError> for CoordError {
    fn from(e: PoolError) -> Self {
        CoordError::Pool(e)
    }
}

impl From<LayoutError> for CoordError {
    fn from(e: LayoutError) -> Self {
        CoordError::InvalidLayout(e)
    }
}

/// An [`CoordError::OutOfMemory`] for `count` elements of `T` (saturating).
pub(super) fn out_of_memory<T>(what: &'static str, count: usize) -> CoordError {
    CoordError::OutOfMemory {
        what,
        bytes: (count as u64).saturating_mul(core::mem::size_of::<T>() as u64),
    }
}

impl fmt::Display for CoordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CoordError::ZeroConfig { field } => {
                write!(f, "coordinator: `{field}` must be greater than 0")
            }
            CoordError::ConfigTooLarge { field, value, max } => write!(
                f,
                "coordinator: `{field}` = {value} exceeds {max}; lower it"
            ),
            CoordError::OutOfMemory { what, bytes } => write!(
                f,
                "coordinator: {bytes} B for {what} could not be allocated; lower it"
            ),
            CoordError::Pool(e) => e.fmt(f),
            CoordError::DuplicateRequest { id } => {
                write!(f, "coordinator: request {id} already exists")
            }
            CoordError::UnknownRequest { id } => write!(f, "coordinator: no request {id}"),
            CoordError::EmptyPrompt { id } => {
                write!(f, "coordinator: request {id} has an empty prompt")
            }
            CoordError::TooLong {
                id,
                tokens,
                max_model_len,
            } => write!(
                f,
                "coordinator: request {id} would have {tokens} tokens, above max_model_len {max_model_len}; finish it or plan a larger max_model_len"
            ),
            CoordError::PrefillNeverFits { id, .. } | CoordError::NeverFits { id, .. } => {
                write!(f, "coordinator: request {id}: {}", RefusalReason::of(self))
            }
            CoordError::NotEnoughTokens {
                id,
                requested,
                available,
            } => write!(
                f,
                "coordinator: request {id}: {requested} tokens scheduled but only {available} are uncomputed; append tokens first"
            ),
            CoordError::RollbackTooFar {
                id,
                requested,
                allowed,
            } => write!(
                f,
                "coordinator: request {id}: a rollback of {requested} computed tokens, but only {allowed} may go back (the rejected speculative tokens of its last step: at most max_query_len - 1, never its first token); roll back fewer"
            ),
            CoordError::Import { id, what } => {
                write!(f, "coordinator: imported request {id}: {what}")
            }
            CoordError::NotRunning { id } => write!(f, "coordinator: request {id} is not running"),
            CoordError::NoFreeSlot => {
                f.write_str("coordinator: every slot is taken; raise max_running")
            }
            CoordError::UnknownSlot { slot } => {
                write!(f, "coordinator: no running request holds state row {slot}")
            }
            CoordError::InvalidLayout(e) => write!(f, "coordinator: invalid layout: {e}"),
            CoordError::UnknownWorker {
                worker,
                num_workers,
            } => write!(
                f,
                "coordinator: worker {worker} does not exist ({num_workers} configured)"
            ),
            CoordError::OutOfOrderReport {
                worker,
                what,
                id,
                expected,
            } => write!(
                f,
                "coordinator: worker {worker} reported transfer {id} {what}, but {expected} is next (FIFO, issued ids only)"
            ),
            CoordError::RollbackInOpenStep { id, step } => write!(
                f,
                "coordinator: request {id} has tokens scheduled in the open step {step}: its command would still compute the tokens a rollback gives back; roll back before scheduling the step or after build_offload_command"
            ),
            CoordError::Refused { id, reason } => write!(
                f,
                "coordinator: request {id} was refused while a step was scheduled ({reason}); finish it"
            ),
        }
    }
}

impl crate::error::Error for CoordError {
    fn kind(&self) -> crate::error::ErrorKind {
        // Every variant is a call to fix, an out-of-memory one included: its size comes from the
        // caller (`max_running`, `num_workers`, a prompt, the planned pools).
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for CoordError {}
