//! Scheduling a step: the engine's own policy (`hs_coordinator_start`, `hs_coordinator_schedule`,
//! `hs_coordinator_rollback`, imports, then `hs_coordinator_build_offload_command`) or the
//! built-in one (`hs_coordinator_step`).
//!
//! An engine that keeps its own scheduler builds each step from these calls: for every running
//! request it picks, `hs_coordinator_schedule` (its next tokens: a prefill chunk or a decode);
//! for every waiting request it admits, `hs_coordinator_start` (with a token budget); for a
//! request it gives up on, `hs_coordinator_preempt`; then `hs_coordinator_build_offload_command`
//! ends the step and returns the command the workers execute.

use hisparse_core::coordinator::{Alloc, CoordError, Coordinator, PoolKind};

use crate::command::HsCommand;
use crate::coordinator::HsCoordinator;
use crate::error::{HsStatus, guard, handle, invalid, output, output_array, output_opt, slice};
use crate::exclusive::enter;

/// What `hs_coordinator_start` and `hs_coordinator_schedule` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsAlloc {
    /// The blocks are allocated; the tokens are scheduled in this step.
    Scheduled = 0,
    /// Not enough memory now, but reclamation (or a release) is in flight: try again next step
    /// rather than preempt.
    Wait = 1,
    /// The GPU pool is short and nothing is in flight: preempt a request (or wait for one to
    /// finish).
    NoSpaceGpu = 2,
    /// The host pool is short and nothing is in flight: preempt a request (or wait for one to
    /// finish).
    NoSpaceHost = 3,
}

impl From<Alloc> for HsAlloc {
    fn from(a: Alloc) -> Self {
        match a {
            Alloc::Scheduled => HsAlloc::Scheduled,
            Alloc::Wait => HsAlloc::Wait,
            Alloc::NoSpace(PoolKind::Gpu) => HsAlloc::NoSpaceGpu,
            Alloc::NoSpace(PoolKind::Host) => HsAlloc::NoSpaceHost,
        }
    }
}

/// Runs an allocating call (`start`, `schedule`) and stores what it did in `*outcome`.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `outcome` points to
/// writable memory for an `HsAlloc`.
unsafe fn allocate(
    coordinator: *mut HsCoordinator,
    outcome: *mut HsAlloc,
    call: impl FnOnce(&mut Coordinator) -> Result<Alloc, CoordError>,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, outcome) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                output(outcome, "outcome")?,
            )
        };
        outcome.set(call(&mut c)?.into());
        Ok(())
    })
}

/// Starts waiting request `id` (a prefix-cache lookup, host blocks for its whole prompt, a
/// state row) and schedules its first chunk of at most `max_tokens` tokens in the current step
/// — fewer when the free GPU pool holds less. `*outcome` receives what happened; on any outcome
/// but `HS_ALLOC_SCHEDULED` the request stays waiting (reclamation may have been set in motion
/// for a later step). The chunk's tokens (after a prefix hit, from the
/// first token not found in the cache) are in the step's command.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `outcome` points to
/// writable memory for an `HsAlloc`.
// Accepted twin of admission.rs's hs_coordinator_can_start and hs_coordinator_can_schedule (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_start(
    coordinator: *mut HsCoordinator,
    id: u64,
    max_tokens: u32,
    outcome: *mut HsAlloc,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { allocate(coordinator, outcome, |c| c.start(id, max_tokens)) }
}

/// Schedules the next `num_tokens` tokens of running request `id` in the current step (a
/// prefill chunk, a decode, or a decode with speculative tokens): all of them or none.
/// `*outcome` receives what happened; on any outcome but `HS_ALLOC_SCHEDULED` nothing is
/// scheduled (reclamation may have been set in motion for a later step). Allocates the pages in
/// every group, reclaiming resident pages when the GPU pool is short.
///
/// # Safety
///
/// As `hs_coordinator_start`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_schedule(
    coordinator: *mut HsCoordinator,
    id: u64,
    num_tokens: u32,
    outcome: *mut HsAlloc,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { allocate(coordinator, outcome, |c| c.schedule(id, num_tokens)) }
}

/// Ends the current step and returns its command in `*out` (free with `hs_command_free`): what
/// `hs_coordinator_start`, `hs_coordinator_schedule`, `hs_coordinator_preempt` and
/// `hs_coordinator_finish` decided since the last command.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `out` points to writable
/// memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_build_offload_command(
    coordinator: *mut HsCoordinator,
    out: *mut *mut HsCommand,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, out) = unsafe { (enter(coordinator, "coordinator")?, output(out, "out")?) };
        let inner = c.build_offload_command();
        out.set(handle(HsCommand { inner }));
        Ok(())
    })
}

/// What one `hs_coordinator_schedule_step` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsStepSummary {
    /// Requests scheduled.
    pub scheduled: u32,
    /// Tokens scheduled.
    pub tokens: u32,
    /// Requests preempted.
    pub preempted: u32,
    /// Requests that wait for reclamation in flight.
    pub waiting_on_reclaim: u32,
    /// Requests started from the waiting queue.
    pub started: u32,
}

/// Runs the built-in policy for one step (running requests first — prefill chunks and decodes
/// — then waiting ones, first come first served, within `max_batched_tokens`, preempting the
/// newest running request when memory runs out) without ending the step;
/// `hs_coordinator_build_offload_command` ends it. `summary` may be NULL.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `summary` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_schedule_step(
    coordinator: *mut HsCoordinator,
    summary: *mut HsStepSummary,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, summary) = unsafe { (enter(coordinator, "coordinator")?, output_opt(summary)) };
        let s = c.schedule_step()?;
        if let Some(summary) = summary {
            summary.set(HsStepSummary {
                scheduled: s.scheduled,
                tokens: s.tokens,
                preempted: s.preempted,
                waiting_on_reclaim: s.waiting_on_reclaim,
                started: s.started,
            });
        }
        Ok(())
    })
}

/// Plans the next step with the built-in policy (`hs_coordinator_schedule_step`) and ends it;
/// `*out` receives its command (free with `hs_command_free`).
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
        let (mut c, out) = unsafe { (enter(coordinator, "coordinator")?, output(out, "out")?) };
        let inner = c.step()?;
        out.set(handle(HsCommand { inner }));
        Ok(())
    })
}

/// Removes the last `num_tokens` tokens of running request `id`: the speculative tokens the
/// verifier rejected (at most `max_query_len - 1` computed ones, all from the request's last
/// step after its first token) and any appended but not computed. Call it after the step that
/// computed them and before the next one is scheduled.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_rollback(
    coordinator: *mut HsCoordinator,
    id: u64,
    num_tokens: u32,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mut c = unsafe { enter(coordinator, "coordinator") }?;
        Ok(c.rollback(id, num_tokens)?)
    })
}

/// Admits request `id` (`tokens`: its prompt and the tokens sampled so far, `len` of them)
/// whose KV for the first `imported` tokens another party (a prefill node, through a transfer
/// engine) writes into the host pool: reserves a host block for every page of those tokens
/// (`hs_coordinator_import_blocks` names them). At least one token is left to compute:
/// `0 < imported < len`. Once every page is written, call `hs_coordinator_complete_import`.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile; `tokens` points to `len`
/// tokens.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_reserve_import(
    coordinator: *mut HsCoordinator,
    id: u64,
    tokens: *const u32,
    len: usize,
    imported: u32,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, tokens) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                slice(tokens, len, "tokens")?,
            )
        };
        c.reserve_import(id, tokens, imported)?;
        Ok(())
    })
}

/// The host blocks reserved for request `id`'s import, one per page in page order, into `out`
/// (`capacity` elements; `*count` receives how many there are) while the import is not
/// complete. NULL `out` with `capacity` 0 asks only for the count; a smaller array gets
/// `HS_STATUS_BUFFER_TOO_SMALL`. The transfer engine writes page `p`'s rows of every sparse
/// layer at host block `out[p]` (see `hs_layout_host_layer_offset`).
///
/// # Safety
///
/// `coordinator` is a live handle; `out` is NULL or points to `capacity` writable values;
/// `count` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_import_blocks(
    coordinator: *const HsCoordinator,
    id: u64,
    out: *mut u32,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, out) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                output_array(out, capacity, count, "out")?,
            )
        };
        let blocks = c.import_blocks(id).ok_or_else(|| {
            invalid(format!(
                "request {id} has no import waiting for its writes (unknown, never reserved, or already completed)"
            ))
        })?;
        out.fill(blocks)
    })
}

/// Every page reserved for request `id`'s import is written: the request is queued behind the
/// waiting ones, its imported pages durable on host; a later step starts it.
///
/// # Safety
///
/// `coordinator` is a live handle used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_complete_import(
    coordinator: *mut HsCoordinator,
    id: u64,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mut c = unsafe { enter(coordinator, "coordinator") }?;
        Ok(c.complete_import(id)?)
    })
}
