//! `Runtime.remap_modes` and `Runtime.compressed_slot_mapping`: the resident remap with its
//! modes and the compressed slot mapping of the indexer caches, over the engine's int32 arrays
//! lent for the call.

use hisparse_core::ops::DcpSplit;
use hisparse_runtime::{CompressedSlots, IndexerCacheSide, PrefillWorkspace, RemapModes};
use pyo3::prelude::*;

use super::State;
use super::lend::lend_device;
use super::per_layer::LayerArrays;
use crate::arrays::{Array, array, check_disjoint};
use crate::errors::{invalid, to_py};

/// `dcp=(size, rank, interleave)` as the core's split.
pub(crate) fn dcp_split(dcp: Option<(u32, u32, u32)>) -> Option<DcpSplit> {
    dcp.map(|(size, rank, interleave)| DcpSplit {
        size,
        rank,
        interleave,
    })
}

/// An int32 array of at least `need` elements, checked (writable when `out`).
fn int32_array(obj: &Bound<'_, PyAny>, what: &str, need: usize, out: bool) -> PyResult<Array> {
    let a = array(obj, what)?;
    a.expect_i32(what)?;
    if out {
        a.expect_writable(what)?;
    }
    if a.len() < need {
        return Err(invalid(format!(
            "{what} holds {} elements but the call needs {need}",
            a.len()
        )));
    }
    Ok(a)
}

/// Runs `Runtime.remap_modes` over the per-layer arrays `arrays` and, with a workspace, its
/// two arrays (`request_of_row` int32 `[T]`, `starts` int32 `[P]`).
pub(crate) fn remap_modes(
    state: &mut State,
    arrays: &mut LayerArrays,
    group: usize,
    dcp: Option<DcpSplit>,
    workspace: Option<(&Bound<'_, PyAny>, &Bound<'_, PyAny>)>,
    num_tokens: Option<u32>,
    on: Option<hisparse_runtime::StreamId>,
) -> PyResult<()> {
    let t = num_tokens.unwrap_or(arrays.capacity()) as usize;
    let ws = workspace
        .map(|(ids, starts)| {
            let ids = int32_array(ids, "request_of_row", t, false)?;
            let starts = int32_array(starts, "starts", 1, false)?;
            check_disjoint(&[("request_of_row", &ids), ("starts", &starts)])?;
            let dev = state.rt.device();
            let bufs = (
                lend_device(dev, &ids, "request_of_row")?,
                lend_device(dev, &starts, "starts")?,
            );
            let requests = u32::try_from(starts.len())
                .map_err(|_| invalid("starts holds 2^32 or more elements; pass fewer"))?;
            Ok::<_, PyErr>((bufs, requests, [ids, starts]))
        })
        .transpose()?;
    let modes = RemapModes {
        dcp,
        workspace: ws
            .as_ref()
            .map(|((ids, starts), requests, _)| PrefillWorkspace {
                requests: *requests,
                request_of_row: ids,
                starts,
            }),
    };
    arrays.run_modes(&mut state.rt, group, modes, num_tokens, on)
}

/// Runs `Runtime.compressed_slot_mapping`: `positions`, `slot_mapping`, `state_rows` int32
/// `[T]`, `out` int32 `[T]` written; `host` maps into the indexer host cache.
pub(crate) fn compressed_slot_mapping(
    state: &mut State,
    [positions, slot_mapping, state_rows, out]: [&Bound<'_, PyAny>; 4],
    host: bool,
    on: Option<hisparse_runtime::StreamId>,
) -> PyResult<()> {
    let positions = int32_array(positions, "positions", 0, false)?;
    let t = positions.len();
    let slot_mapping = int32_array(slot_mapping, "slot_mapping", t, false)?;
    let state_rows = int32_array(state_rows, "state_rows", t, false)?;
    let out = int32_array(out, "out", t, true)?;
    let mut named = vec![
        ("positions", &positions),
        ("slot_mapping", &slot_mapping),
        ("state_rows", &state_rows),
        ("out", &out),
    ];
    for pool in &state.lent {
        named.push(("a pool of this runtime", pool));
    }
    check_disjoint(&named)?;
    let num_tokens = u32::try_from(t)
        .map_err(|_| invalid("positions holds 2^32 or more elements; pass fewer"))?;
    let dev = state.rt.device();
    let bufs = [
        lend_device(dev, &positions, "positions")?,
        lend_device(dev, &slot_mapping, "slot_mapping")?,
        lend_device(dev, &state_rows, "state_rows")?,
    ];
    let mut out_buf = lend_device(dev, &out, "out")?;
    let side = if host {
        IndexerCacheSide::Host
    } else {
        IndexerCacheSide::Device
    };
    state
        .rt
        .compressed_slot_mapping_on(
            side,
            CompressedSlots {
                num_tokens,
                positions: &bufs[0],
                slot_mapping: &bufs[1],
                state_rows: &bufs[2],
                out: &mut out_buf,
            },
            on,
        )
        .map_err(to_py)
}
