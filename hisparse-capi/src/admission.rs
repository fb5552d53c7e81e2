//! The questions an engine's scheduler asks before it picks a step's batch, answered without
//! changing anything: would this request fit now, and how many tokens
//! (`hs_coordinator_can_start`, `hs_coordinator_can_schedule`); what each tier has free
//! (`hs_coordinator_tier_free`); what a request needs (`hs_coordinator_needs`). Each answers
//! exactly what the operation would decide now.

use hisparse_core::coordinator::{Admission, CoordError, Coordinator};

use crate::coordinator::{HsCoordinator, answer};
use crate::error::HsStatus;
use crate::scheduling::HsAlloc;

/// What `hs_coordinator_can_start` or `hs_coordinator_can_schedule` finds: the answer the
/// operation would give now.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsAdmission {
    /// The operation's answer.
    pub outcome: HsAlloc,
    /// Tokens it would schedule (0 unless scheduled): all of them for
    /// `hs_coordinator_schedule`; for `hs_coordinator_start`, its first chunk (fewer than the
    /// budget when the prompt has fewer left or the free GPU pool holds less).
    pub tokens: u32,
    /// Whether it would reclaim resident pages first (the free GPU pool alone is short).
    pub reclaims: bool,
}

impl From<Admission> for HsAdmission {
    fn from(a: Admission) -> Self {
        HsAdmission {
            outcome: a.outcome.into(),
            tokens: a.tokens,
            reclaims: a.reclaims,
        }
    }
}

/// What each tier has free now.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsTierFree {
    /// Free GPU blocks (blocks the prefix cache keeps and unpinned resident pages' blocks
    /// count as free).
    pub gpu_blocks: u32,
    /// Usable GPU blocks (all but the null block).
    pub gpu_capacity: u32,
    /// GPU blocks carrying a prefix-cache key (held, or free and still reusable).
    pub gpu_cached: u32,
    /// Free host blocks (prefix-cached ones included).
    pub host_blocks: u32,
    /// Usable host blocks.
    pub host_capacity: u32,
    /// Host blocks carrying a prefix-cache key.
    pub host_cached: u32,
    /// GPU blocks one hot region costs (every bucket).
    pub hot_region_blocks: u32,
    /// Hot regions the free GPU pool could give now.
    pub hot_regions_free: u32,
    /// Requests holding a hot region.
    pub hot_regions_held: u32,
    /// State rows free (`max_running` minus the running requests).
    pub rows: u32,
}

/// What a request needs: for its next tokens, the blocks they take out of the free pools; for
/// its whole context, what the layout says it holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsNeeds {
    /// Tokens the next-step figures are for: the `num_tokens` asked for a running request; for
    /// a waiting one, the first chunk a start with that budget schedules before the free pools
    /// shrink it.
    pub tokens: u32,
    /// GPU blocks those tokens take out of the free pool (new pages in every group, regular
    /// columns, prefill context staged from host, a hot region, prefix-hit blocks re-pinned).
    pub gpu_blocks: u64,
    /// Of `gpu_blocks`, the hot region's (0 when it holds one or reads nothing from host).
    pub hot_region_blocks: u64,
    /// Host blocks those tokens take out of the free pool.
    pub host_blocks: u64,
    /// Tokens of the request (prompt and appended).
    pub context_tokens: u32,
    /// GPU blocks its whole context holds at the least.
    pub context_gpu_blocks: u64,
    /// GPU blocks a prefill over its whole context holds (a restart recomputes it all).
    pub context_prefill_gpu_blocks: u64,
    /// Host blocks its whole context holds: one per page.
    pub context_host_blocks: u64,
}

/// What `hs_coordinator_start(coordinator, id, max_tokens, …)` would answer now, and the tokens
/// of the chunk it would schedule; changes nothing.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory for an `HsAdmission`.
// Accepted twin of scheduling.rs's hs_coordinator_start and hs_coordinator_schedule (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_can_start(
    coordinator: *const HsCoordinator,
    id: u64,
    max_tokens: u32,
    out: *mut HsAdmission,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { admission(coordinator, out, |c| c.can_start(id, max_tokens)) }
}

/// What `hs_coordinator_schedule(coordinator, id, num_tokens, …)` would answer now; changes
/// nothing.
///
/// # Safety
///
/// As `hs_coordinator_can_start`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_can_schedule(
    coordinator: *const HsCoordinator,
    id: u64,
    num_tokens: u32,
    out: *mut HsAdmission,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { admission(coordinator, out, |c| c.can_schedule(id, num_tokens)) }
}

/// # Safety
///
/// As `hs_coordinator_can_start`.
unsafe fn admission(
    coordinator: *const HsCoordinator,
    out: *mut HsAdmission,
    query: impl FnOnce(&Coordinator) -> Result<Admission, CoordError>,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { answer(coordinator, out, |c| Ok(query(c)?.into())) }
}

/// What each tier has free now.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory for an `HsTierFree`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_tier_free(
    coordinator: *const HsCoordinator,
    out: *mut HsTierFree,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(coordinator, out, |c| {
            let f = c.free();
            Ok(HsTierFree {
                gpu_blocks: f.gpu_blocks,
                gpu_capacity: f.gpu_capacity,
                gpu_cached: f.gpu_cached,
                host_blocks: f.host_blocks,
                host_capacity: f.host_capacity,
                host_cached: f.host_cached,
                hot_region_blocks: f.hot_region_blocks,
                hot_regions_free: f.hot_regions_free,
                hot_regions_held: f.hot_regions_held,
                rows: f.rows,
            })
        })
    }
}

/// What request `id` needs for its next `num_tokens` tokens (a running request's; a start's
/// first chunk within that budget for a waiting one) and for its whole context; changes
/// nothing. Refused: an unknown or refused request, 0 tokens or more than `max_model_len`, an
/// import whose writes are not complete.
///
/// # Safety
///
/// `coordinator` is a live handle; `out` points to writable memory for an `HsNeeds`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_coordinator_needs(
    coordinator: *const HsCoordinator,
    id: u64,
    num_tokens: u32,
    out: *mut HsNeeds,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(coordinator, out, |c| {
            let n = c.needs(id, num_tokens)?;
            Ok(HsNeeds {
                tokens: n.tokens,
                gpu_blocks: n.gpu_blocks,
                hot_region_blocks: n.hot_region_blocks,
                host_blocks: n.host_blocks,
                context_tokens: n.context_tokens,
                context_gpu_blocks: n.context_gpu_blocks,
                context_prefill_gpu_blocks: n.context_prefill_gpu_blocks,
                context_host_blocks: n.context_host_blocks,
            })
        })
    }
}
