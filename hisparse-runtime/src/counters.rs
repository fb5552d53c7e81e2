//! What a runtime counts, for an engine's metrics.

use hisparse_core::coordinator::Coordinator;

/// Totals since the runtime was built. Read them with [`crate::Runtime::counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Counters {
    /// Steps begun.
    pub steps: u64,
    /// Snapshots of the device's decode counters folded in (see
    /// [`crate::RuntimeConfig::stats_every`]). The decode counters — hits, misses, resident
    /// reads, swap-in bytes, remap, prefill-remap and resolve calls — are counted on the device
    /// (graph replays included) and cover every step up to the last snapshot folded.
    pub sampled_steps: u64,
    /// Top-k entries served from a hot buffer (summed over index groups).
    pub hot_hits: u64,
    /// Top-k entries swapped in from host (summed over index groups).
    pub hot_misses: u64,
    /// Valid top-k entries read from resident pages (summed over index groups).
    pub resident_reads: u64,
    /// Bytes copied host → device: swap-in gathers (every layer of the index group that missed)
    /// and page restores.
    pub h2d_bytes: u64,
    /// Bytes copied device → host into the host pool: row mirrors and page spills.
    pub d2h_bytes: u64,
    /// Index-group calls that took the fully-resident remap.
    pub remap_calls: u64,
    /// Prefill reads remapped through the resident tables ([`crate::Runtime::remap_prefill`]).
    pub prefill_remap_calls: u64,
    /// Index-group calls that resolved against the hot buffers.
    pub resolve_calls: u64,
    /// Follower layers that applied their leader's miss plan ([`crate::Runtime::apply_plan`]
    /// calls made on the host; a graph replay of them is not counted here, its bytes are in
    /// `h2d_bytes`).
    pub follower_gathers: u64,
    /// Table entries written (incremental table updates).
    pub table_writes: u64,
    /// Hot states reset (state row × index group).
    pub hot_resets: u64,
    /// Resident pages reclaimed (a page whose entries became null in every bucket).
    pub reclaimed_pages: u64,
    /// Pages restored host → device (copy-on-write tails, imported tails, prefill context
    /// staged from host).
    pub restored_pages: u64,
    /// Host copy-on-write pages.
    pub host_cow_pages: u64,
    /// GPU copy-on-write blocks.
    pub gpu_cow_blocks: u64,
    /// Row-mirror spans enqueued.
    pub mirror_spans: u64,
    /// Whole pages spilled device → host.
    pub spilled_pages: u64,
    /// Transfer batches enqueued.
    pub transfers_enqueued: u64,
    /// Transfer batches seen complete by polling.
    pub transfers_completed: u64,
    /// Indexer rows backed up device → host (each in every indexer layer), in the transfer
    /// batches.
    pub indexer_rows_backed_up: u64,
    /// Indexer pages restored host → device (imported requests, prefix hits whose indexer
    /// blocks were no longer cached).
    pub indexer_pages_restored: u64,
    /// Bytes copied between the device pool and the indexer host cache, which every rank
    /// keeps for itself (apart from the host pool's traffic, which a shared pool's reading
    /// ranks do not write): backups device → host and restores host → device.
    pub indexer_d2h_bytes: u64,
    /// See `indexer_d2h_bytes`.
    pub indexer_h2d_bytes: u64,
}

impl Counters {
    /// Share of swapped-in-or-hit entries that hit the hot buffers.
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hot_hits + self.hot_misses;
        (n > 0).then(|| self.hot_hits as f64 / n as f64)
    }
}

/// Block-pool occupancy, for metrics: what the coordinator holds of each pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolUsage {
    /// GPU blocks held by requests (the null block excluded).
    pub gpu_used: u32,
    /// GPU blocks that can be handed out (the null block excluded).
    pub gpu_total: u32,
    /// Host blocks held by requests (the null block excluded).
    pub host_used: u32,
    /// Host blocks that can be handed out (the null block excluded).
    pub host_total: u32,
}

impl PoolUsage {
    /// The occupancy of `coord`'s pools.
    pub fn of(coord: &Coordinator) -> Self {
        let (g, h) = (coord.gpu_pool(), coord.host_pool());
        PoolUsage {
            gpu_used: g.num_held(),
            gpu_total: g.num_held() + g.num_free(),
            host_used: h.num_held(),
            host_total: h.num_held() + h.num_free(),
        }
    }
}
