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
    /// Which worker (tensor-parallel rank) this runtime is, in the coordinator's reports.
    pub worker: u32,
    /// Copy the per-group hit, miss and valid counts of every `stats_every`-th step to host for
    /// [`crate::Counters`] (`1` = every step; `0` = never, the hit and miss counters then stay
    /// zero). Each sampled step costs three small device→host copies per index group on the
    /// compute stream.
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

impl RuntimeConfig {
    /// `state_rows` rows, `max_step_tokens` token rows per call, worker 0, counters every step.
    pub const fn new(state_rows: u32, max_step_tokens: u32) -> Self {
        RuntimeConfig {
            state_rows,
            max_step_tokens,
            worker: 0,
            stats_every: 1,
            writes_host: true,
        }
    }
}
