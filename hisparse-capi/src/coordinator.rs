//! The coordinator (`HsCoordinator`): its settings, requests coming and going, worker reports,
//! and what it answers about a request. Scheduling a step is in `scheduling.rs`.

use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, RequestId};

use crate::command::HsRefusedRequest;
use crate::error::{
    Failure, HsStatus, deref, free_handle, guard, handle, internal, invalid, output, output_opt,
    slice, slice_mut,
};
use crate::exclusive::{Exclusive, Handle, answer_entered_array, enter};
use crate::layout::{HsLayout, in_layout};

/// The scheduler side of HiSparse for one model instance (opaque). Free with
/// `hs_coordinator_free`.
pub struct HsCoordinator {
    state: Exclusive<Coordinator>,
}

impl Handle for HsCoordinator {
    type State = Coordinator;

    fn cell(&self) -> &Exclusive<Coordinator> {
        &self.state
    }
}

/// Runs a read-only query of the coordinator and stores its answer in `*out`.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory for a `T`.
pub(crate) unsafe fn answer<T>(
    coordinator: *const HsCoordinator,
    out: *mut T,
    query: impl FnOnce(&Coordinator) -> Result<T, Failure>,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, out) = unsafe { (enter(coordinator, "coordinator")?, output(out, "out")?) };
        out.set(query(&c)?);
        Ok(())
    })
}

/// The answer about request `id`, or an error saying the coordinator does not know it.
fn known<T>(answer: Option<T>, id: RequestId) -> Result<T, Failure> {
    answer.ok_or_else(|| {
        invalid(format!(
            "coordinator: no request {id} (never admitted, or finished)"
        ))
    })
}

/// Scheduler settings. Start from `hs_coordinator_config_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsCoordinatorConfig {
    /// Requests that can run at once (state rows); give the runtime the same `state_rows`.
    pub max_running: u32,
    /// Tokens one step may compute (prefill chunks + decode tokens).
    pub max_batched_tokens: u32,
    /// Whole-page spills planned per step when rows are not mirrored eagerly.
    pub max_spill_pages_per_step: u32,
    /// Workers (tensor-parallel ranks) that execute every command.
    pub num_workers: u32,
    /// Reuse durable host pages across requests with a common prefix.
    pub enable_prefix_caching: bool,
    /// Reclaim at least this many GPU blocks when the pool runs short (0 = the shortfall).
    pub reclaim_min_blocks: u32,
}

impl From<HsCoordinatorConfig> for CoordinatorConfig {
    fn from(c: HsCoordinatorConfig) -> Self {
        CoordinatorConfig {
            max_running: c.max_running,
            max_batched_tokens: c.max_batched_tokens,
            max_spill_pages_per_step: c.max_spill_pages_per_step,
            num_workers: c.num_workers,
            enable_prefix_caching: c.enable_prefix_caching,
            reclaim_min_blocks: c.reclaim_min_blocks,
        }
    }
}

/// Fills `config` with the coordinator's defaults.
///
/// # Safety
///
/// `config` is NULL or points to writable memory for an `HsCoordinatorConfig`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_config_default(
    config: *mut HsCoordinatorConfig,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let config = unsafe { output(config, "config") }?;
        let d = CoordinatorConfig::default();
        config.set(HsCoordinatorConfig {
            max_running: d.max_running,
            max_batched_tokens: d.max_batched_tokens,
            max_spill_pages_per_step: d.max_spill_pages_per_step,
            num_workers: d.num_workers,
            enable_prefix_caching: d.enable_prefix_caching,
            reclaim_min_blocks: d.reclaim_min_blocks,
        });
        Ok(())
    })
}

/// A coordinator with empty pools for `layout`; `*out` receives the handle.
///
/// # Safety
///
/// `layout` is a live handle, `config` points to a valid `HsCoordinatorConfig`, `out` to
/// writable memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_new(
    layout: *const HsLayout,
    config: *const HsCoordinatorConfig,
    out: *mut *mut HsCoordinator,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (layout, config, out) = unsafe {
            (
                deref(layout, "layout")?,
                deref(config, "config")?,
                output(out, "out")?,
            )
        };
        let inner = Coordinator::new(layout.kv.clone(), (*config).into())?;
        out.set(handle(HsCoordinator {
            state: Exclusive::new(inner),
        }));
        Ok(())
    })
}

/// Frees a coordinator (NULL is ignored).
///
/// # Safety
///
/// `coordinator` is NULL or a handle from `hs_coordinator_new` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_free(coordinator: *mut HsCoordinator) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(coordinator) }
}

/// Queues request `id` with `len` prompt tokens.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `prompt` points to `len`
/// tokens (NULL allowed when `len` is 0).
// Accepted twin of the entry points beside it (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_admit(
    coordinator: *mut HsCoordinator,
    id: u64,
    prompt: *const u32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, prompt) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                slice(prompt, len, "prompt")?,
            )
        };
        Ok(c.admit(id, prompt)?)
    })
}

/// Appends `len` tokens (the sampled ones) to running request `id`.
///
/// # Safety
///
/// As `hs_coordinator_admit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_append_tokens(
    coordinator: *mut HsCoordinator,
    id: u64,
    tokens: *const u32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, tokens) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                slice(tokens, len, "tokens")?,
            )
        };
        Ok(c.append_tokens(id, tokens)?)
    })
}

/// Records worker `worker`'s progress: transfer ids enqueued and completed, each in FIFO order.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; the arrays hold their
/// lengths (NULL allowed for length 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_report(
    coordinator: *mut HsCoordinator,
    worker: u32,
    enqueued: *const u64,
    num_enqueued: usize,
    completed: *const u64,
    num_completed: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, e, d) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                slice(enqueued, num_enqueued, "enqueued")?,
                slice(completed, num_completed, "completed")?,
            )
        };
        Ok(c.report(worker, e, d)?)
    })
}

/// Ends request `id` and frees its blocks.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_finish(
    coordinator: *mut HsCoordinator,
    id: u64,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mut c = unsafe { enter(coordinator, "coordinator") }?;
        Ok(c.finish(id)?)
    })
}

/// Preempts running request `id` (its tokens will be recomputed).
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_preempt(
    coordinator: *mut HsCoordinator,
    id: u64,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mut c = unsafe { enter(coordinator, "coordinator") }?;
        Ok(c.preempt(id)?)
    })
}

/// Tokens of request `id` (prompt and appended).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_num_tokens(
    coordinator: *const HsCoordinator,
    id: u64,
    out: *mut u32,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { answer(coordinator, out, |c| known(c.num_tokens(id), id)) }
}

/// Tokens of request `id` computed so far.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_num_computed(
    coordinator: *const HsCoordinator,
    id: u64,
    out: *mut u32,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { answer(coordinator, out, |c| known(c.num_computed(id), id)) }
}

/// Whether no request is waiting or running (`*out`).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_is_empty(
    coordinator: *const HsCoordinator,
    out: *mut bool,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { answer(coordinator, out, |c| Ok(c.is_empty())) }
}

/// Appends one token to the running request in state row `slot` (the hot path for engines that
/// key by state row); `*id` (if not NULL) receives the request's id.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_append_token_by_slot(
    coordinator: *mut HsCoordinator,
    slot: u32,
    token: u32,
    id: *mut u64,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, id) = unsafe { (enter(coordinator, "coordinator")?, output_opt(id)) };
        let owner = c.append_token_by_slot(slot, token)?;
        if let Some(id) = id {
            id.set(owner);
        }
        Ok(())
    })
}

/// The state row (`0 .. max_running`) of running request `id`; an error for a request that is
/// unknown or not running (waiting, preempted, or an import not started yet).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_slot_of(
    coordinator: *const HsCoordinator,
    id: u64,
    out: *mut u32,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(coordinator, out, |c| {
            c.slot_of(id).ok_or_else(|| {
                invalid(format!(
                    "request {id} holds no state row: it is unknown or not running (waiting, preempted, or an import not started)"
                ))
            })
        })
    }
}

/// Block-pool occupancy, for metrics: what the coordinator's requests hold of each pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsPoolUsage {
    /// GPU blocks held by requests (the null block excluded).
    pub gpu_used: u32,
    /// GPU blocks that can be handed out (the null block excluded).
    pub gpu_total: u32,
    /// Host blocks held by requests (the null block excluded).
    pub host_used: u32,
    /// Host blocks that can be handed out (the null block excluded).
    pub host_total: u32,
}

/// The occupancy of the coordinator's pools.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory for an `HsPoolUsage`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_pool_usage(
    coordinator: *const HsCoordinator,
    out: *mut HsPoolUsage,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(coordinator, out, |c| {
            let u = hisparse_runtime::PoolUsage::of(c);
            Ok(HsPoolUsage {
                gpu_used: u.gpu_used,
                gpu_total: u.gpu_total,
                host_used: u.host_used,
                host_total: u.host_total,
            })
        })
    }
}

/// Requests waiting to start (queued, preempted, or imports whose writes are complete).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_num_waiting(
    coordinator: *const HsCoordinator,
    out: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { answer(coordinator, out, |c| Ok(c.num_waiting())) }
}

/// Requests running (each holding a state row).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_num_running(
    coordinator: *const HsCoordinator,
    out: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { answer(coordinator, out, |c| Ok(c.num_running())) }
}

/// The ids of the running requests, oldest first, into `out` (`capacity` elements; `*count`
/// receives how many there are). NULL `out` with `capacity` 0 asks only for the count; a
/// smaller array gets `HS_STATUS_BUFFER_TOO_SMALL`.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` is NULL or points to `capacity` writable ids; `count`
/// points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_running_ids(
    coordinator: *const HsCoordinator,
    out: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer_entered_array(coordinator, "coordinator", out, capacity, count, |c| {
            // At most `max_running` ids: sized by the coordinator, not by an argument.
            c.running_ids().collect::<Vec<RequestId>>()
        })
    }
}

/// Writes a table row of the coordinator into the caller's `len` `int32_t`s at `out`.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to `len` writable `int32_t`s (NULL allowed for
/// 0).
unsafe fn table_row(
    coordinator: *const HsCoordinator,
    out: *mut i32,
    len: usize,
    row: impl FnOnce(&Coordinator, &mut [i32]) -> Result<(), Failure>,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, out) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                slice_mut(out, len, "out")?,
            )
        };
        row(&c, out)
    })
}

/// Running request `id`'s block table of layout group `group` (indexer, resident, regular, or
/// the source group's host blocks) as `len` `int32_t`s: column → block, 0 for null entries and
/// columns beyond the request. What the runtime's device tables hold, read on the host (a
/// debugging aid: engines read the device tables).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to `len` writable `int32_t`s (NULL allowed for
/// 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_block_table_row(
    coordinator: *const HsCoordinator,
    id: u64,
    group: usize,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        table_row(coordinator, out, len, |c, out| {
            in_layout(group, c.layout().groups.len(), "group")?;
            Ok(c.block_table_row(id, group, out)?)
        })
    }
}

/// Running request `id`'s hot region in `bucket` as `len` `int32_t`s: its
/// `hot_blocks_per_request` GPU blocks, or -1s when it has none.
///
/// # Safety
///
/// As `hs_coordinator_block_table_row`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_hot_row(
    coordinator: *const HsCoordinator,
    id: u64,
    bucket: u32,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        table_row(coordinator, out, len, |c, out| {
            in_layout(bucket as usize, c.layout().num_buckets as usize, "bucket")?;
            Ok(c.hot_row(id, bucket, out)?)
        })
    }
}

/// Checks the coordinator's internal invariants (for tests and debugging); a violation is
/// `HS_STATUS_INTERNAL` naming it.
///
/// # Safety
///
/// `coordinator` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_check_invariants(
    coordinator: *const HsCoordinator,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { enter(coordinator, "coordinator") }?;
        c.check_invariants()
            .map_err(|v| internal(format!("coordinator invariant broken: {v}")))
    })
}

/// Checks that the coordinator is back to empty once the engine finished every request and
/// every worker's transfers completed (and were reported): no request known, every transfer
/// durable, no GPU or host block held — then every invariant. Free blocks that keep a
/// prefix-cache key count as empty. What an engine's test checks at its end; a leak is
/// `HS_STATUS_INTERNAL` naming the first one found.
///
/// # Safety
///
/// `coordinator` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_check_drained(
    coordinator: *const HsCoordinator,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { enter(coordinator, "coordinator") }?;
        c.check_drained()
            .map_err(|v| internal(format!("coordinator not drained: {v}")))
    })
}

/// Why request `id` was refused while a step was scheduled, if it was: `*refused` receives
/// whether it was and, when it was, `*out` the reason (as `hs_command_refused` gives it). A
/// refused request is in no queue and holds nothing: fail it (or admit a shorter one) and
/// `hs_coordinator_finish` it.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory for an `HsRefusedRequest`,
/// `refused` for a `bool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_refusal(
    coordinator: *const HsCoordinator,
    id: u64,
    out: *mut HsRefusedRequest,
    refused: *mut bool,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, out, refused) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                output(out, "out")?,
                output(refused, "refused")?,
            )
        };
        let reason = c.refusal(id);
        refused.set(reason.is_some());
        if let Some(reason) = reason {
            out.set(HsRefusedRequest::new(id, reason));
        }
        Ok(())
    })
}
