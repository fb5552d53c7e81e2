//! A step on the runtime: the before-forward half (`hs_runtime_begin_step`), the batch of the
//! per-layer calls (`hs_runtime_set_batch`), the after-forward half (`hs_runtime_end_step`),
//! and the transfers' completion (`hs_runtime_poll_and_report`, `hs_runtime_drain`).

use std::ffi::c_void;

use hisparse_runtime::ReportError;

use super::HsRuntime;
use crate::command::HsCommand;
use crate::coordinator::HsCoordinator;
use crate::error::{Failure, HsStatus, deref, guard, output_opt, slice};
use crate::exclusive::{enter, enter_opt};

/// Before the forward pass: applies `command`'s table updates, hot-state resets, invalidation,
/// copy-on-write and restores, and writes the step's slot mapping (`hs_runtime_slot_mapping`),
/// on `stream` (NULL: the runtime's compute stream). Commands run once each, in step order:
/// one run twice, an older one or one after a skipped step is refused, naming both steps.
/// Before-replay work: on a stream being captured into a graph it is `HS_STATUS_CAPTURE`.
///
/// # Safety
///
/// `runtime` and `command` are live handles; `runtime` is used by no other thread meanwhile;
/// `stream` is NULL or a live stream of the runtime's device that outlives the runtime (it is
/// lent to the runtime on first use).
// Accepted twin of the step entry points below (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_begin_step(
    runtime: *mut HsRuntime,
    command: *const HsCommand,
    stream: *mut c_void,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, c) = unsafe { (enter(runtime, "runtime")?, deref(command, "command")?) };
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(stream) }?;
        Ok(r.rt.begin_step_on(&c.inner, on)?)
    })
}

/// Sets this step's batch, which per-layer calls without their own state rows read:
/// `state_rows[t]` is token row `t`'s state row (-1 = padding), each held by a request scheduled
/// in the open step. Written into the runtime's batch table (`hs_runtime_batch_table`, a fixed
/// address) on `stream`, stream-ordered. Before replaying a graph whose per-layer calls were
/// captured with `T` token rows, pass `pad_to = T`: the batch is padded with -1 to `T` rows,
/// and a `T` no capture recorded, or smaller than the batch, is `HS_STATUS_GRAPH_SHAPE`;
/// `pad_to = 0` pads nothing. Before-replay work: on a stream being captured it is
/// `HS_STATUS_CAPTURE`.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `state_rows` holds `len`
/// values (NULL allowed for 0); `stream` as for `hs_runtime_begin_step`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_set_batch(
    runtime: *mut HsRuntime,
    state_rows: *const i32,
    len: usize,
    pad_to: u32,
    stream: *mut c_void,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, rows) = unsafe {
            (
                enter(runtime, "runtime")?,
                slice(state_rows, len, "state_rows")?,
            )
        };
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(stream) }?;
        let pad_to = (pad_to != 0).then_some(pad_to);
        Ok(r.rt.set_batch_on(rows, pad_to, on)?)
    })
}

/// After the forward pass: row mirrors and spills on the runtime's copy stream, ordered after
/// `stream`'s work (NULL: the runtime's compute stream) — the stream the step's forward pass ran
/// on. Before-replay work: on a stream being captured it is `HS_STATUS_CAPTURE`.
///
/// # Safety
///
/// As `hs_runtime_begin_step`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_end_step(
    runtime: *mut HsRuntime,
    command: *const HsCommand,
    stream: *mut c_void,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, c) = unsafe { (enter(runtime, "runtime")?, deref(command, "command")?) };
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(stream) }?;
        Ok(r.rt.end_step_on(&c.inner, on)?)
    })
}

/// Polls the transfers in flight without blocking and reports the finished ones to
/// `coordinator`; `*completed` (if not NULL) receives how many completed.
///
/// # Safety
///
/// `runtime` and `coordinator` are live handles used by no other thread meanwhile;
/// `completed` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_poll_and_report(
    runtime: *mut HsRuntime,
    coordinator: *mut HsCoordinator,
    completed: *mut usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, mut c, completed) = unsafe {
            (
                enter(runtime, "runtime")?,
                enter(coordinator, "coordinator")?,
                output_opt(completed),
            )
        };
        let report = r.rt.poll_and_report(&mut c).map_err(|e| match e {
            ReportError::Runtime(e) => Failure::from(e),
            ReportError::Coordinator(e) => Failure::from(e),
        })?;
        if let Some(completed) = completed {
            completed.set(report.completed.len());
        }
        Ok(())
    })
}

/// Blocks until every transfer and counter copy in flight completed; reports them to
/// `coordinator` when it is not NULL.
///
/// # Safety
///
/// `runtime` is a live handle, `coordinator` NULL or one, both used by no other thread
/// meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_drain(
    runtime: *mut HsRuntime,
    coordinator: *mut HsCoordinator,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, c) = unsafe {
            (
                enter(runtime, "runtime")?,
                enter_opt(coordinator, "coordinator")?,
            )
        };
        let report = r.rt.drain()?;
        if let Some(mut c) = c
            && !report.is_empty()
        {
            c.report(report.worker, &report.enqueued, &report.completed)?;
        }
        Ok(())
    })
}
