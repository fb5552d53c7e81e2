//! The per-layer calls: one index group's top-k resolved into attention rows
//! (`hs_runtime_decode`, and its two short forms), a follower layer swapped in with its leader's
//! plan (`hs_runtime_apply_plan`), a prefill chunk's top-k remapped (`hs_runtime_remap_prefill`).

use std::ffi::c_void;

use hisparse_runtime::{AnyBuffer, Indices, LayerCall, Swap, TopK};

use super::{HsBuffer, HsRuntime};
use crate::error::{Failure, HsStatus, deref, deref_mut, guard, invalid};
use crate::exclusive::enter;

/// Which layers of an index group a per-layer call swaps in (`HsLayerCall::swap`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsSwap {
    /// The leader and every follower, in one gather: the usual call, once per index group
    /// before the group's attention layers.
    IndexGroup = 0,
    /// The leader only; each follower layer then calls `hs_runtime_apply_plan` when its
    /// attention is due (the followers read the same rows).
    Leader = 1,
}

/// One per-layer call (`hs_runtime_decode`, `hs_runtime_remap_prefill`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsLayerCall {
    /// The index group.
    pub group: usize,
    /// An `HsSwap` value (an integer, so that any value is checked rather than undefined);
    /// `hs_runtime_remap_prefill` swaps nothing in and ignores it.
    pub swap: u32,
    /// int32 `[num_tokens][top_k]` token positions (-1 = none).
    pub topk: *const HsBuffer,
    /// Token rows of the call.
    pub num_tokens: u32,
    /// int32 `[num_tokens]` state row of each token row (-1 = padding), or NULL for the batch
    /// set by `hs_runtime_set_batch` (what a captured graph reads). Read on the device, a
    /// call's own state rows are not checked as `hs_runtime_set_batch`'s are: each names a
    /// request scheduled in the step, or is padding (below 0, or at or beyond the runtime's
    /// state rows). They make the call a micro-batch: calls over disjoint requests write what
    /// one call over all of them would (the rules: docs/contract.md, section 7, Micro-batches).
    pub state_rows: *const HsBuffer,
    /// int32 `[num_tokens][top_k]`: the physical rows of the flat device-pool view (-1 = none).
    pub rows: *mut HsBuffer,
    /// int32 `[num_tokens]`: valid entries per token row, or NULL when not wanted.
    pub counts: *mut HsBuffer,
    /// The stream to enqueue on (a `CUstream` or `hipStream_t`, lent to the runtime on first
    /// use), or NULL for the runtime's compute stream.
    pub stream: *mut c_void,
}

/// The buffers of `call`, refusing an output that is also an input or the other output (the
/// call would read what it writes).
///
/// # Safety
///
/// `call`'s buffers are live handles (NULL where allowed) that no other thread uses meanwhile.
pub(super) unsafe fn buffers<'a>(
    call: &HsLayerCall,
) -> Result<(TopK<'a, AnyBuffer>, Indices<'a, AnyBuffer>), Failure> {
    let reads = [call.topk, call.state_rows];
    let writes = [call.rows.cast_const(), call.counts.cast_const()];
    for (i, w) in writes.iter().enumerate() {
        let aliased = !w.is_null() && (reads.contains(w) || (i == 0 && *w == writes[1]));
        if aliased {
            return Err(invalid(format!(
                "`{}` is also an input or the other output of the call; give every output a buffer of its own",
                ["rows", "counts"][i]
            )));
        }
    }
    // SAFETY: forwarded contract; the outputs alias nothing else the call borrows (checked).
    let (topk, state_rows, rows, counts) = unsafe {
        (
            deref(call.topk, "call.topk")?,
            call.state_rows.as_ref(),
            deref_mut(call.rows, "call.rows")?,
            call.counts.as_mut(),
        )
    };
    Ok((
        TopK {
            positions: &topk.buf,
            num_tokens: call.num_tokens,
            state_rows: state_rows.map(|s| &s.buf),
        },
        Indices {
            rows: &mut rows.buf,
            counts: counts.map(|c| &mut c.buf),
        },
    ))
}

/// Resolves index group `call->group`'s top-k for this step into attention rows and swaps in
/// `call->swap`'s layers (or, when every request of the call is fully resident and the stream is
/// not being captured, remaps it through the resident tables), on `call->stream`. No host
/// synchronisation; on a stream being captured into a graph the call is recorded (and always
/// takes the resolve path, correct whatever the residency at replay).
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `call` points to a valid
/// `HsLayerCall` whose buffers are live handles of the runtime's device (NULL where allowed),
/// and whose stream is NULL or a live stream of the device that outlives the runtime.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_decode(
    runtime: *mut HsRuntime,
    call: *const HsLayerCall,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, call) = unsafe { (enter(runtime, "runtime")?, deref(call, "call")?) };
        let swap = match call.swap {
            0 => Swap::IndexGroup,
            1 => Swap::Leader,
            other => {
                return Err(invalid(format!(
                    "call.swap = {other} is not an HsSwap; pass HS_SWAP_INDEX_GROUP (0) or HS_SWAP_LEADER (1)"
                )));
            }
        };
        // SAFETY: forwarded contract.
        let (topk, out) = unsafe { buffers(call) }?;
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(call.stream) }?;
        Ok(r.rt.decode(LayerCall {
            group: call.group,
            swap,
            topk,
            out,
            on,
        })?)
    })
}

/// The per-layer call over the batch set by `hs_runtime_set_batch`.
fn batch_call(
    group: usize,
    swap: HsSwap,
    topk: *const HsBuffer,
    num_tokens: u32,
    rows: *mut HsBuffer,
    counts: *mut HsBuffer,
    stream: *mut c_void,
) -> HsLayerCall {
    HsLayerCall {
        group,
        swap: swap as u32,
        topk,
        num_tokens,
        state_rows: std::ptr::null(),
        rows,
        counts,
        stream,
    }
}

/// `hs_runtime_decode` of index group `group` with `HS_SWAP_INDEX_GROUP`, over the batch set by
/// `hs_runtime_set_batch`: `topk` int32 `[num_tokens][top_k]` token positions in, `rows` int32
/// of the same shape out (physical rows of the flat device-pool view, -1 = none); `counts`
/// (int32 `[num_tokens]`, or NULL) receives valid entries per row.
///
/// # Safety
///
/// `runtime`, `topk` and `rows` are live handles (buffers of the runtime's device), `counts`
/// NULL or one; `runtime` is used by no other thread meanwhile; `stream` is NULL or a live
/// stream of the device that outlives the runtime.
// Accepted twin of the resolve entry points below (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_resolve_index_group(
    runtime: *mut HsRuntime,
    group: usize,
    topk: *const HsBuffer,
    num_tokens: u32,
    rows: *mut HsBuffer,
    counts: *mut HsBuffer,
    stream: *mut c_void,
) -> HsStatus {
    let call = batch_call(
        group,
        HsSwap::IndexGroup,
        topk,
        num_tokens,
        rows,
        counts,
        stream,
    );
    // SAFETY: forwarded contract.
    unsafe { hs_runtime_decode(runtime, &call) }
}

/// As `hs_runtime_resolve_index_group` with `HS_SWAP_LEADER`: the leader layer only; each
/// follower layer then calls `hs_runtime_apply_plan`.
///
/// # Safety
///
/// As `hs_runtime_resolve_index_group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_resolve_leader(
    runtime: *mut HsRuntime,
    group: usize,
    topk: *const HsBuffer,
    num_tokens: u32,
    rows: *mut HsBuffer,
    counts: *mut HsBuffer,
    stream: *mut c_void,
) -> HsStatus {
    let call = batch_call(
        group,
        HsSwap::Leader,
        topk,
        num_tokens,
        rows,
        counts,
        stream,
    );
    // SAFETY: forwarded contract.
    unsafe { hs_runtime_decode(runtime, &call) }
}

/// Swaps in follower layer `layer` with its leader's plan of this step, on `stream` (NULL: the
/// runtime's compute stream): its leader's call's, or, outside a graph, another stream, which
/// the runtime orders after that call.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `stream` is NULL or a live
/// stream of the device that outlives the runtime.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_apply_plan(
    runtime: *mut HsRuntime,
    layer: u32,
    stream: *mut c_void,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mut r = unsafe { enter(runtime, "runtime") }?;
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(stream) }?;
        Ok(r.rt.apply_plan_on(layer, on)?)
    })
}

/// A prefill chunk's read of index group `call->group`: remaps the top-k positions of its token
/// rows through the resident tables whatever the step's residency (a prefill chunk's context is
/// staged on the GPU) and swaps nothing in (`call->swap` is ignored); outputs as for
/// `hs_runtime_decode`.
///
/// # Safety
///
/// As `hs_runtime_decode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_remap_prefill(
    runtime: *mut HsRuntime,
    call: *const HsLayerCall,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, call) = unsafe { (enter(runtime, "runtime")?, deref(call, "call")?) };
        // SAFETY: forwarded contract.
        let (topk, out) = unsafe { buffers(call) }?;
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(call.stream) }?;
        Ok(r.rt.remap_prefill_on(call.group, &topk, out, on)?)
    })
}
