//! A worker's report (`HsReport`): the transfer batches a runtime enqueued and saw complete,
//! taken from the runtime (`hs_runtime_poll`, `hs_runtime_drain_report`) and given to the
//! coordinator (`hs_coordinator_apply_report`) — in another process when the scheduler and the
//! workers are apart.

use hisparse_runtime::WorkerReport;

use crate::coordinator::HsCoordinator;
use crate::error::{HsStatus, answer_array, deref, free_handle, guard, handle, output};
use crate::exclusive::enter;
use crate::runtime::HsRuntime;

/// What a worker found since its last report (opaque). Free with `hs_report_free`.
pub struct HsReport {
    pub(crate) inner: WorkerReport,
}

/// A report's summary.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsReportInfo {
    /// The worker (tensor-parallel rank) that made it.
    pub worker: u32,
    /// Transfer batches enqueued since the last report (`hs_report_enqueued`).
    pub num_enqueued: usize,
    /// Transfer batches completed since the last report (`hs_report_completed`).
    pub num_completed: usize,
}

/// Polls the runtime's transfers in flight without blocking; `*out` receives what it found
/// (free with `hs_report_free`), for `hs_coordinator_apply_report`. Every report must reach the
/// coordinator, in order: a lost one stalls the pages it completes.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `out` points to writable
/// memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_poll(
    runtime: *mut HsRuntime,
    out: *mut *mut HsReport,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
        let inner = r.rt.poll()?;
        out.set(handle(HsReport { inner }));
        Ok(())
    })
}

/// Blocks until every transfer and counter copy of the runtime completed; `*out` receives the
/// report (as `hs_runtime_poll`).
///
/// # Safety
///
/// As `hs_runtime_poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_drain_report(
    runtime: *mut HsRuntime,
    out: *mut *mut HsReport,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
        let inner = r.rt.drain()?;
        out.set(handle(HsReport { inner }));
        Ok(())
    })
}

/// Records the report's worker progress in the coordinator (`hs_coordinator_report` with the
/// report's lists).
///
/// # Safety
///
/// `coordinator` and `report` are live handles; `coordinator` is used by no other thread
/// meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_apply_report(
    coordinator: *mut HsCoordinator,
    report: *const HsReport,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut c, rep) = unsafe {
            (
                enter(coordinator, "coordinator")?,
                &deref(report, "report")?.inner,
            )
        };
        Ok(c.report(rep.worker, &rep.enqueued, &rep.completed)?)
    })
}

/// The report's summary.
///
/// # Safety
///
/// `report` is a live handle; `out` points to writable memory for an `HsReportInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_report_info(
    report: *const HsReport,
    out: *mut HsReportInfo,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (&deref(report, "report")?.inner, output(out, "out")?) };
        out.set(HsReportInfo {
            worker: r.worker,
            num_enqueued: r.enqueued.len(),
            num_completed: r.completed.len(),
        });
        Ok(())
    })
}

/// The transfer ids the report says were enqueued, oldest first, into `out` (`capacity`
/// elements; `*count` receives how many there are). NULL `out` with `capacity` 0 asks only for
/// the count; a smaller array gets `HS_STATUS_BUFFER_TOO_SMALL`.
///
/// # Safety
///
/// `report` is a live handle; `out` is NULL or points to `capacity` writable ids; `count`
/// points to writable memory.
// Accepted twin of command.rs's hs_command_preempted (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_report_enqueued(
    report: *const HsReport,
    out: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer_array(report, "report", out, capacity, count, |r| {
            &r.inner.enqueued
        })
    }
}

/// The transfer ids the report says completed, oldest first (as `hs_report_enqueued`).
///
/// # Safety
///
/// As `hs_report_enqueued`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_report_completed(
    report: *const HsReport,
    out: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer_array(report, "report", out, capacity, count, |r| {
            &r.inner.completed
        })
    }
}

/// Frees a report (NULL is ignored).
///
/// # Safety
///
/// `report` is NULL or a handle from `hs_runtime_poll` or `hs_runtime_drain_report`, not freed
/// yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_report_free(report: *mut HsReport) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(report) }
}
