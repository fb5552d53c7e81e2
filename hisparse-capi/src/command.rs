//! A step's command (`HsCommand`): what the coordinator hands the workers, and what they read of
//! it.

use hisparse_core::coordinator::{OffloadCommand, PoolKind, RefusalReason};

use crate::error::{HsStatus, answer_array, deref, free_handle, guard, invalid, output};

/// One step's command (opaque): plain data for `hs_runtime_begin_step` / `hs_runtime_end_step`.
/// Free with `hs_command_free`.
pub struct HsCommand {
    pub(crate) inner: OffloadCommand,
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
    /// Requests preempted in this step (`hs_command_preempted`).
    pub num_preempted: usize,
    /// Requests refused in this step (`hs_command_refused`).
    pub num_refused: usize,
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

/// Why a request was refused while a step was scheduled.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsRefusal {
    /// Its prefill can never hold its context on the GPU (a restart whose recomputed context
    /// outgrew the pool): give the KV cache more GPU memory or shorten the prompt.
    PrefillNeverFits = 0,
    /// It can never fit the GPU pool, even alone: plan larger pools.
    NeverFitsGpu = 1,
    /// It can never fit the host pool, even alone: plan larger pools.
    NeverFitsHost = 2,
    /// The coordinator's bookkeeping for it could not be allocated.
    OutOfMemory = 3,
    /// Another error met while scheduling it (a defect to report, with the request's history).
    Internal = 4,
}

/// A request refused while a step was scheduled: its blocks are given back and it is in no
/// queue; the engine fails it (or admits a shorter one) and calls `hs_coordinator_finish`. The
/// step goes on for every other request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsRefusedRequest {
    /// The request.
    pub id: u64,
    /// Why.
    pub reason: HsRefusal,
    /// `HS_REFUSAL_PREFILL_NEVER_FITS`: tokens of context before the chunk; 0 otherwise.
    pub context_tokens: u32,
    /// Blocks it needs (`HS_REFUSAL_PREFILL_NEVER_FITS`, `HS_REFUSAL_NEVER_FITS_*`), bytes
    /// asked for (`HS_REFUSAL_OUT_OF_MEMORY`); 0 otherwise.
    pub needed: u64,
    /// Usable blocks in the pool (`HS_REFUSAL_PREFILL_NEVER_FITS`, `HS_REFUSAL_NEVER_FITS_*`);
    /// 0 otherwise.
    pub capacity: u64,
}

impl HsRefusedRequest {
    pub(crate) fn new(id: u64, reason: RefusalReason) -> Self {
        let (reason, context_tokens, needed, capacity) = match reason {
            RefusalReason::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
            } => (
                HsRefusal::PrefillNeverFits,
                context_tokens,
                needed,
                capacity,
            ),
            RefusalReason::NeverFits {
                pool,
                needed,
                capacity,
            } => {
                let r = match pool {
                    PoolKind::Gpu => HsRefusal::NeverFitsGpu,
                    PoolKind::Host => HsRefusal::NeverFitsHost,
                };
                (r, 0, needed, capacity)
            }
            RefusalReason::OutOfMemory { bytes } => (HsRefusal::OutOfMemory, 0, bytes, 0),
            _ => (HsRefusal::Internal, 0, 0, 0),
        };
        HsRefusedRequest {
            id,
            reason,
            context_tokens,
            needed,
            capacity,
        }
    }
}

/// Frees a command (NULL is ignored).
///
/// # Safety
///
/// `command` is NULL or a handle from `hs_coordinator_step` or
/// `hs_coordinator_build_offload_command`, not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_free(command: *mut HsCommand) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(command) }
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
        let (c, out) = unsafe { (&deref(command, "command")?.inner, output(out, "out")?) };
        out.set(HsCommandInfo {
            step: c.step,
            has_transfer: c.transfer_id.is_some(),
            transfer_id: c.transfer_id.unwrap_or(0),
            fully_resident: c.fully_resident,
            num_scheduled: c.scheduled.len(),
            num_preempted: c.preempted.len(),
            num_refused: c.refused.len(),
        });
        Ok(())
    })
}

/// Scheduled request `index` of the command (`0 .. num_scheduled`).
///
/// # Safety
///
/// `command` is a live handle; `out` points to writable memory for an `HsScheduledRequest`.
// Accepted twin of hs_command_refused and report.rs's array answers (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_scheduled(
    command: *const HsCommand,
    index: usize,
    out: *mut HsScheduledRequest,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, out) = unsafe { (&deref(command, "command")?.inner, output(out, "out")?) };
        let s = c.scheduled.get(index).ok_or_else(|| {
            invalid(format!(
                "scheduled request {index} does not exist (the command has {}; see hs_command_info)",
                c.scheduled.len()
            ))
        })?;
        out.set(HsScheduledRequest {
            id: s.id,
            slot: s.slot,
            first_token: s.first_token,
            num_tokens: s.num_tokens,
            fully_resident: s.fully_resident,
        });
        Ok(())
    })
}

/// The ids of the requests preempted in this step, in order, into `out` (`capacity` elements;
/// `*count` receives how many there are). NULL `out` with `capacity` 0 asks only for the count;
/// a smaller array gets `HS_STATUS_BUFFER_TOO_SMALL`.
///
/// # Safety
///
/// `command` is a live handle; `out` is NULL or points to `capacity` writable ids; `count`
/// points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_preempted(
    command: *const HsCommand,
    out: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer_array(command, "command", out, capacity, count, |c| {
            &c.inner.preempted
        })
    }
}

/// Refused request `index` of the command (`0 .. num_refused`).
///
/// # Safety
///
/// `command` is a live handle; `out` points to writable memory for an `HsRefusedRequest`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_command_refused(
    command: *const HsCommand,
    index: usize,
    out: *mut HsRefusedRequest,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (c, out) = unsafe { (&deref(command, "command")?.inner, output(out, "out")?) };
        let r = c.refused.get(index).ok_or_else(|| {
            invalid(format!(
                "refused request {index} does not exist (the command has {}; see hs_command_info)",
                c.refused.len()
            ))
        })?;
        out.set(HsRefusedRequest::new(r.id, r.reason));
        Ok(())
    })
}
