//! The coordinator (`HsCoordinator`) and its per-step command (`HsCommand`).

use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};

use crate::error::{HsStatus, deref, deref_mut, guard, invalid, put, slice};
use crate::layout::HsLayout;

/// The scheduler side of HiSparse for one model instance (opaque). Free with
/// `hs_coordinator_free`.
pub struct HsCoordinator {
    pub(crate) inner: Coordinator,
}

/// One step's command (opaque): plain data for `hs_runtime_begin_step` / `hs_runtime_end_step`.
/// Free with `hs_command_free`.
pub struct HsCommand {
    pub(crate) inner: OffloadCommand,
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

/// A command's summary.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsCommandInfo {
    /// Step number (from 1).
    pub step: u64,
    /// Whether the step has after-forward copies (then `transfer_id` is their batch).
    pub has_transfer: bool,
    /// Id of the after-forward copy batch.
    pub transfer_id: u64,
    /// Every scheduled request is fully resident (the remap path).
    pub fully_resident: bool,
    /// Requests computed in this step (`hs_command_scheduled`).
    pub num_scheduled: usize,
    /// Requests preempted in this step.
    pub num_preempted: usize,
}

/// A request scheduled in a step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsScheduledRequest {
    /// The request.
    pub id: u64,
    /// Its state row in every per-request table.
    pub slot: u32,
    /// First token computed in this step.
    pub first_token: u32,
    /// Tokens computed in this step.
    pub num_tokens: u32,
    /// Whether every page of the request is resident.
    pub fully_resident: bool,
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
        let d = CoordinatorConfig::default();
        let value = HsCoordinatorConfig {
            max_running: d.max_running,
            max_batched_tokens: d.max_batched_tokens,
            max_spill_pages_per_step: d.max_spill_pages_per_step,
            num_workers: d.num_workers,
            enable_prefix_caching: d.enable_prefix_caching,
            reclaim_min_blocks: d.reclaim_min_blocks,
        };
        // SAFETY: forwarded contract.
        unsafe { put(config, "config", value) }
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
        let (layout, config) = unsafe { (deref(layout, "layout")?, deref(config, "config")?) };
        let inner = Coordinator::new(layout.kv.clone(), (*config).into())?;
        let handle = Box::into_raw(Box::new(HsCoordinator { inner }));
        // SAFETY: forwarded contract.
        unsafe { put(out, "out", handle) }.inspect_err(|_| {
            // SAFETY: `handle` came from `Box::into_raw` just above and was not handed out.
            drop(unsafe { Box::from_raw(handle) });
        })
    })
}

/// Frees a coordinator (NULL is ignored).
///
/// # Safety
///
/// `coordinator` is NULL or a handle from `hs_coordinator_new` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_free(coordinator: *mut HsCoordinator) {
    if !coordinator.is_null() {
        // SAFETY: forwarded contract: the handle came from `Box::into_raw`.
        drop(unsafe { Box::from_raw(coordinator) });
    }
}

/// Queues request `id` with `len` prompt tokens.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `prompt` points to `len`
/// tokens (NULL allowed when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_admit(
    coordinator: *mut HsCoordinator,
    id: u64,
    prompt: *const u32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, prompt) = unsafe {
            (
                deref_mut(coordinator, "coordinator")?,
                slice(prompt, len, "prompt")?,
            )
        };
        Ok(c.inner.admit(id, prompt)?)
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
        let (c, tokens) = unsafe {
            (
                deref_mut(coordinator, "coordinator")?,
                slice(tokens, len, "tokens")?,
            )
        };
        Ok(c.inner.append_tokens(id, tokens)?)
    })
}

/// Plans the next step; `*out` receives its command (free with `hs_command_free`).
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `out` points to writable
/// memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_step(
    coordinator: *mut HsCoordinator,
    out: *mut *mut HsCommand,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { deref_mut(coordinator, "coordinator") }?;
        if out.is_null() {
            return Err(crate::error::null("out"));
        }
        let inner = c.inner.step()?;
        let handle = Box::into_raw(Box::new(HsCommand { inner }));
        // SAFETY: forwarded contract; `out` is non-null.
        unsafe { put(out, "out", handle) }
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
        let (c, e, d) = unsafe {
            (
                deref_mut(coordinator, "coordinator")?,
                slice(enqueued, num_enqueued, "enqueued")?,
                slice(completed, num_completed, "completed")?,
            )
        };
        Ok(c.inner.report(worker, e, d)?)
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
        let c = unsafe { deref_mut(coordinator, "coordinator") }?;
        Ok(c.inner.finish(id)?)
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
        let c = unsafe { deref_mut(coordinator, "coordinator") }?;
        Ok(c.inner.preempt(id)?)
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
    guard(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { deref(coordinator, "coordinator") }?;
        let n = c
            .inner
            .num_tokens(id)
            .ok_or_else(|| invalid(format!("coordinator: no request {id}")))?;
        // SAFETY: forwarded contract.
        unsafe { put(out, "out", n) }
    })
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
    guard(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { deref(coordinator, "coordinator") }?;
        let n = c
            .inner
            .num_computed(id)
            .ok_or_else(|| invalid(format!("coordinator: no request {id}")))?;
        // SAFETY: forwarded contract.
        unsafe { put(out, "out", n) }
    })
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
    guard(|| {
        // SAFETY: forwarded contract.
        let c = unsafe { deref(coordinator, "coordinator") }?;
        // SAFETY: forwarded contract.
        unsafe { put(out, "out", c.inner.is_empty()) }
    })
}

/// Frees a command (NULL is ignored).
///
/// # Safety
///
/// `command` is NULL or a handle from `hs_coordinator_step` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_free(command: *mut HsCommand) {
    if !command.is_null() {
        // SAFETY: forwarded contract: the handle came from `Box::into_raw`.
        drop(unsafe { Box::from_raw(command) });
    }
}

/// The command's summary.
///
/// # Safety
///
/// `command` is a live handle; `out` points to writable memory for an `HsCommandInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_info(
    command: *const HsCommand,
    out: *mut HsCommandInfo,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let c = &unsafe { deref(command, "command") }?.inner;
        let info = HsCommandInfo {
            step: c.step,
            has_transfer: c.transfer_id.is_some(),
            transfer_id: c.transfer_id.unwrap_or(0),
            fully_resident: c.fully_resident,
            num_scheduled: c.scheduled.len(),
            num_preempted: c.preempted.len(),
        };
        // SAFETY: forwarded contract.
        unsafe { put(out, "out", info) }
    })
}

/// Scheduled request `index` of the command (`0 .. num_scheduled`).
///
/// # Safety
///
/// `command` is a live handle; `out` points to writable memory for an `HsScheduledRequest`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_scheduled(
    command: *const HsCommand,
    index: usize,
    out: *mut HsScheduledRequest,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let c = &unsafe { deref(command, "command") }?.inner;
        let s = c.scheduled.get(index).ok_or_else(|| {
            invalid(format!(
                "scheduled request {index} does not exist (the command has {})",
                c.scheduled.len()
            ))
        })?;
        let value = HsScheduledRequest {
            id: s.id,
            slot: s.slot,
            first_token: s.first_token,
            num_tokens: s.num_tokens,
            fully_resident: s.fully_resident,
        };
        // SAFETY: forwarded contract.
        unsafe { put(out, "out", value) }
    })
}
