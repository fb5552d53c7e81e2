//! The ops an engine drives around the decode path: the resident remap with its modes
//! (`hs_runtime_remap_modes`: decode context parallelism, prefill rows into a gathered
//! workspace) and the compressed slot mapping of the indexer caches
//! (`hs_runtime_compressed_slot_mapping`).

use std::ffi::c_void;

use hisparse_core::ops::DcpSplit;
use hisparse_runtime::{CompressedSlots, IndexerCacheSide, PrefillWorkspace, RemapModes};

use super::decode::{HsLayerCall, buffers};
use super::{HsBuffer, HsRuntime};
use crate::error::{HsStatus, deref, deref_mut, guard, invalid};
use crate::exclusive::enter;

/// The modes of `hs_runtime_remap_modes` (all zero: the plain resident remap).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsRemapModes {
    /// Decode context parallelism: the ranks each request's context is spread over, in runs
    /// of `dcp_interleave` tokens (0 = off). Tokens another rank stores map to -1; this
    /// rank's (`dcp_rank`) map through the resident tables by their local index.
    pub dcp_size: u32,
    /// This rank (`< dcp_size`).
    pub dcp_rank: u32,
    /// Consecutive tokens one rank stores before the next rank's (≥ 1 with `dcp_size`).
    pub dcp_interleave: u32,
    /// Prefill workspace: the prefill requests `P` whose context was gathered into a
    /// contiguous workspace (0 = off).
    pub workspace_requests: u32,
    /// int32 `[num_tokens]`: the prefill request of each token row (-1 = a decode row, which
    /// remaps through the resident tables); NULL without a workspace.
    pub request_of_row: *const HsBuffer,
    /// int32 `[P]`: the workspace row of each prefill request's token 0 (entry `tok` maps to
    /// `starts[p] + tok`); NULL without a workspace.
    pub workspace_starts: *const HsBuffer,
}

/// The resident remap of index group `call->group` with `modes` (the fully-resident path:
/// top-k positions → physical rows through the resident tables, nothing swapped in; the hot
/// state untouched), inside a step, on `call->stream`; outputs as for `hs_runtime_decode`
/// (`call->swap` is ignored).
///
/// # Safety
///
/// As `hs_runtime_decode`; `modes` points to a valid `HsRemapModes` whose buffers are live
/// handles of the runtime's device (NULL without a workspace).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_remap_modes(
    runtime: *mut HsRuntime,
    call: *const HsLayerCall,
    modes: *const HsRemapModes,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, call, modes) = unsafe {
            (
                enter(runtime, "runtime")?,
                deref(call, "call")?,
                deref(modes, "modes")?,
            )
        };
        let dcp = (modes.dcp_size != 0).then_some(DcpSplit {
            size: modes.dcp_size,
            rank: modes.dcp_rank,
            interleave: modes.dcp_interleave,
        });
        let workspace = if modes.workspace_requests == 0 {
            None
        } else {
            // SAFETY: forwarded contract.
            let (ids, starts) = unsafe {
                (
                    deref(modes.request_of_row, "modes.request_of_row")?,
                    deref(modes.workspace_starts, "modes.workspace_starts")?,
                )
            };
            Some(PrefillWorkspace {
                requests: modes.workspace_requests,
                request_of_row: &ids.buf,
                starts: &starts.buf,
            })
        };
        let written = [call.rows.cast_const(), call.counts.cast_const()];
        for (what, b) in [
            ("modes.request_of_row", modes.request_of_row),
            ("modes.workspace_starts", modes.workspace_starts),
        ] {
            if !b.is_null() && written.contains(&b) {
                return Err(invalid(format!(
                    "`{what}` is also an output of the call; give every output a buffer of its own"
                )));
            }
        }
        // SAFETY: forwarded contract.
        let (topk, out) = unsafe { buffers(call) }?;
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(call.stream) }?;
        Ok(r.rt.remap_modes_on(call.group, &topk, RemapModes { dcp, workspace }, out, on)?)
    })
}

/// The compressed slot mapping of the indexer caches: for each of `num_tokens` tokens
/// (`positions`, `slot_mapping` — only its sign is read, negative = padding — and
/// `state_rows`, int32 `[num_tokens]`) the indexer row it writes, into `out` (int32
/// `[num_tokens]`): in the device pool's indexer blocks (`host` = 0, through the indexer block
/// table) or in the runtime's indexer host cache (`host` ≠ 0, through the host table), as
/// `block * rows_per_page + row`; -1 for a token that writes no indexer row (a compressed
/// indexer writes one per `R` tokens). On `stream` (NULL: the compute stream). Refused for a
/// layout without an indexer layer.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; the buffers are live handles
/// of its device, `out` distinct from the others; `stream` is NULL or a live stream of the
/// device that outlives the runtime.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hs_runtime_compressed_slot_mapping(
    runtime: *mut HsRuntime,
    host: u32,
    num_tokens: u32,
    positions: *const HsBuffer,
    slot_mapping: *const HsBuffer,
    state_rows: *const HsBuffer,
    out: *mut HsBuffer,
    stream: *mut c_void,
) -> HsStatus {
    guard(|| {
        let reads = [positions, slot_mapping, state_rows];
        if reads.contains(&out.cast_const()) && !out.is_null() {
            return Err(invalid(
                "`out` is also an input of the call; give it a buffer of its own",
            ));
        }
        // SAFETY: forwarded contract; `out` aliases no input (checked).
        let (mut r, positions, slot_mapping, state_rows, out) = unsafe {
            (
                enter(runtime, "runtime")?,
                deref(positions, "positions")?,
                deref(slot_mapping, "slot_mapping")?,
                deref(state_rows, "state_rows")?,
                deref_mut(out, "out")?,
            )
        };
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(stream) }?;
        let side = if host == 0 {
            IndexerCacheSide::Device
        } else {
            IndexerCacheSide::Host
        };
        Ok(r.rt.compressed_slot_mapping_on(
            side,
            CompressedSlots {
                num_tokens,
                positions: &positions.buf,
                slot_mapping: &slot_mapping.buf,
                state_rows: &state_rows.buf,
                out: &mut out.buf,
            },
            on,
        )?)
    })
}
