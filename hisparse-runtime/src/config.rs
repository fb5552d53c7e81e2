//! How a [`crate::Runtime`] is sized.

/// Settings of a [`crate::Runtime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RuntimeConfig {
    /// Per-request state rows of every table and hot state: the coordinator's
    /// [`max_running`](hisparse_core::coordinator::CoordinatorConfig::max_running).
    pub state_rows: u32,
    /// Token rows one per-layer call may carry (decode tokens per step, speculative tokens
    /// included). Sizes the miss-plan and counter buffers.
    pub max_step_tokens: u32,
    /// Tokens one step may compute (prefill chunks and decode tokens: the coordinator's
    /// [`max_batched_tokens`](hisparse_core::coordinator::CoordinatorConfig::max_batched_tokens)).
    /// Sizes the device slot mapping ([`crate::Runtime::slot_mapping`]); a command scheduling more
    /// is refused. [`RuntimeConfig::new`] sets it to the larger of `max_step_tokens` and
    /// [`DEFAULT_MAX_BATCHED_TOKENS`].
    pub max_batched_tokens: u32,
    /// Which worker (tensor-parallel rank) this runtime is, in the coordinator's reports.
    pub worker: u32,
    /// Bring the device's decode counters (hits, misses, rows read, calls: counted on the device,
    /// so graph replays count too) to host every `stats_every`-th step (`1` = every step; `0` =
    /// never, the decode counters of [`crate::Counters`] then stay zero). Each snapshot is one
    /// small device→host copy on the step's stream; the counts are exact at every snapshot
    /// whatever the interval ([`crate::Runtime::drain`] takes one more).
    pub stats_every: u32,
    /// Whether this runtime writes the host pool: row mirrors, page spills and host
    /// copy-on-write. `true` when a process has the pool to itself. When one host pool is shared
    /// by every tensor-parallel rank of a node, exactly one rank writes it and the others only
    /// read it (swap-in gathers, restores): their transfer batches hold no copies and complete
    /// once their forward pass has, and the writer's host copy-on-write must complete before the
    /// others' restores of the same step (a barrier the engine places, see
    /// [`crate::Runtime::begin_step`]).
    pub writes_host: bool,
}

/// The coordinator's default
/// [`max_batched_tokens`](hisparse_core::coordinator::CoordinatorConfig::max_batched_tokens),
/// which [`RuntimeConfig::new`] sizes the slot mapping for.
pub const DEFAULT_MAX_BATCHED_TOKENS: u32 = 512;

impl RuntimeConfig {
    /// `state_rows` rows, `max_step_tokens` token rows per call, worker 0, counters every step,
    /// a slot mapping for [`DEFAULT_MAX_BATCHED_TOKENS`] tokens (or `max_step_tokens`, if more).
    pub const fn new(state_rows: u32, max_step_tokens: u32) -> Self {
        RuntimeConfig {
            state_rows,
            max_step_tokens,
            max_batched_tokens: if max_step_tokens > DEFAULT_MAX_BATCHED_TOKENS {
                max_step_tokens
            } else {
                DEFAULT_MAX_BATCHED_TOKENS
            },
            worker: 0,
            stats_every: 1,
            writes_host: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_slot_mapping_holds_the_coordinators_default_step() {
        let coord = hisparse_core::coordinator::CoordinatorConfig::default();
        assert_eq!(DEFAULT_MAX_BATCHED_TOKENS, coord.max_batched_tokens);
        assert_eq!(RuntimeConfig::new(4, 8).max_batched_tokens, 512);
        assert_eq!(RuntimeConfig::new(4, 1024).max_batched_tokens, 1024);
    }
}
