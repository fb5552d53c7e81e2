//! Per-layer calls: the engine's `topk`, `rows`, `counts` and `state_rows` arrays read, checked
//! and lent once ([`LayerArrays`]), then run — at once (`Runtime.resolve_index_group`) or as
//! often as the engine likes through a prepared call ([`LayerCall`]), which then costs only the
//! runtime's own work per call.

use std::sync::Mutex;

use hisparse_runtime::{
    AnyBuffer, AnyDevice, Indices, LayerCall as CoreCall, RemapModes, Runtime as Core, StreamId,
    Swap, TopK,
};
use pyo3::prelude::*;

use super::lend::lend_device;
use super::{Runtime, State};
use crate::args::{Int, take_args};
use crate::arrays::{Array, array, check_disjoint};
use crate::errors::{concurrent_use, invalid, poisoned, to_py};

/// What a per-layer call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// The decode path, swapping in the layers `Swap` names (`resolve_index_group`,
    /// `resolve_leader`).
    Decode(Swap),
    /// A prefill chunk's remap through the resident tables (`remap_prefill`).
    RemapPrefill,
}

impl Op {
    /// The `swap=` argument of `Runtime.layer_call`.
    pub(crate) fn parse(s: &str) -> PyResult<Op> {
        match s {
            "index_group" => Ok(Op::Decode(Swap::IndexGroup)),
            "leader" => Ok(Op::Decode(Swap::Leader)),
            "prefill" => Ok(Op::RemapPrefill),
            _ => Err(invalid(format!(
                "swap = {s:?}; pass \"index_group\" (every layer of the group), \"leader\" (the leader only) or \"prefill\" (a prefill chunk's remap)"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Decode(Swap::IndexGroup) => "index_group",
            Op::Decode(Swap::Leader) => "leader",
            Op::RemapPrefill => "prefill",
        }
    }
}

/// The arrays of a per-layer call, checked and lent to the device.
pub(crate) struct LayerArrays {
    // The buffers come first: they are dropped before the arrays whose memory they use.
    topk_buf: AnyBuffer,
    rows_buf: AnyBuffer,
    counts_buf: Option<AnyBuffer>,
    state_buf: Option<AnyBuffer>,
    /// Token rows every array holds room for (the default of a call's `num_tokens`).
    capacity: u32,
    /// The arrays' objects, kept alive while the buffers use their memory.
    _arrays: Vec<Array>,
}

impl LayerArrays {
    /// Reads, checks and lends the arrays of a per-layer call: `topk` int32 `[T, top_k]` (or
    /// flat, `T * top_k`), `rows` the same, writable; `counts` and `state_rows` int32 `[T]`
    /// when given. `T` is `topk`'s first dimension (or its length over `top_k`).
    pub(crate) fn new(
        state: &State,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        state_rows: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let k = state.rt.layout().config.top_k as usize;
        let topk = array(topk, "topk")?;
        topk.expect_i32("topk")?;
        let rows = array(rows, "rows")?;
        rows.expect_i32("rows")?;
        rows.expect_writable("rows")?;
        let counts = counts.map(|c| array(c, "counts")).transpose()?;
        let state_rows = state_rows.map(|s| array(s, "state_rows")).transpose()?;
        if let Some(c) = &counts {
            c.expect_i32("counts")?;
            c.expect_writable("counts")?;
        }
        if let Some(s) = &state_rows {
            s.expect_i32("state_rows")?;
        }
        if topk.shape.len() == 2 && topk.shape[1] != k {
            return Err(invalid(format!(
                "topk has {} columns but the layout's top_k is {k}; pass [num_tokens, {k}]",
                topk.shape[1]
            )));
        }
        let t = if topk.shape.len() == 2 {
            topk.shape[0]
        } else {
            topk.len() / k.max(1)
        };
        for (what, arr, need) in [
            ("rows", Some(&rows), t * k),
            ("counts", counts.as_ref(), t),
            ("state_rows", state_rows.as_ref(), t),
        ] {
            if let Some(a) = arr
                && a.len() < need
            {
                return Err(invalid(format!(
                    "{what} holds {} elements but topk's {t} token rows need {need}",
                    a.len()
                )));
            }
        }
        let capacity = u32::try_from(t)
            .map_err(|_| invalid(format!("topk has {t} token rows; pass fewer than 2^32")))?;
        let mut named: Vec<(&str, &Array)> = vec![("topk", &topk), ("rows", &rows)];
        if let Some(c) = &counts {
            named.push(("counts", c));
        }
        if let Some(s) = &state_rows {
            named.push(("state_rows", s));
        }
        for pool in &state.lent {
            named.push(("a pool of this runtime", pool));
        }
        check_disjoint(&named)?;
        let dev = state.rt.device();
        let topk_buf = lend_device(dev, &topk, "topk")?;
        let rows_buf = lend_device(dev, &rows, "rows")?;
        let counts_buf = counts
            .as_ref()
            .map(|c| lend_device(dev, c, "counts"))
            .transpose()?;
        let state_buf = state_rows
            .as_ref()
            .map(|s| lend_device(dev, s, "state_rows"))
            .transpose()?;
        let mut arrays = vec![topk, rows];
        arrays.extend(counts);
        arrays.extend(state_rows);
        Ok(LayerArrays {
            topk_buf,
            rows_buf,
            counts_buf,
            state_buf,
            capacity,
            _arrays: arrays,
        })
    }

    /// Token rows every array holds room for.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The call's input and outputs over the first `num_tokens` token rows (all of them when
    /// `None`).
    fn io(
        &mut self,
        num_tokens: Option<u32>,
    ) -> PyResult<(TopK<'_, AnyBuffer>, Indices<'_, AnyBuffer>)> {
        let t = num_tokens.unwrap_or(self.capacity);
        if t > self.capacity {
            return Err(invalid(format!(
                "num_tokens = {t}, but the arrays hold {} token rows; pass at most that many",
                self.capacity
            )));
        }
        let topk = TopK {
            positions: &self.topk_buf,
            num_tokens: t,
            state_rows: self.state_buf.as_ref(),
        };
        let out = Indices {
            rows: &mut self.rows_buf,
            counts: self.counts_buf.as_mut(),
        };
        Ok((topk, out))
    }

    /// The resident remap of index group `group` with `modes` over the arrays
    /// (`Runtime.remap_modes`).
    pub(crate) fn run_modes(
        &mut self,
        rt: &mut Core<AnyDevice>,
        group: usize,
        modes: RemapModes<'_, AnyBuffer>,
        num_tokens: Option<u32>,
        on: Option<StreamId>,
    ) -> PyResult<()> {
        let (topk, out) = self.io(num_tokens)?;
        rt.remap_modes_on(group, &topk, modes, out, on)
            .map_err(to_py)
    }

    /// Runs the call over the first `num_tokens` token rows (all of them when `None`) on
    /// stream `on`.
    pub(crate) fn run(
        &mut self,
        rt: &mut Core<AnyDevice>,
        group: usize,
        op: Op,
        num_tokens: Option<u32>,
        on: Option<StreamId>,
    ) -> PyResult<()> {
        let (topk, out) = self.io(num_tokens)?;
        match op {
            Op::Decode(swap) => rt.decode(CoreCall {
                group,
                swap,
                topk,
                out,
                on,
            }),
            Op::RemapPrefill => rt.remap_prefill_on(group, &topk, out, on),
        }
        .map_err(to_py)
    }
}

/// A prepared per-layer call (`Runtime.layer_call`): arrays read, checked and lent once; each
/// call runs only the runtime's work. Usable from one thread at a time, like its runtime.
#[pyclass(module = "hisparse", name = "LayerCall", frozen)]
pub struct LayerCall {
    runtime: Py<Runtime>,
    group: usize,
    op: Op,
    /// The stream every call enqueues on, when fixed (else the caller's current stream).
    stream: Option<u64>,
    capacity: u32,
    arrays: Mutex<LayerArrays>,
}

impl LayerCall {
    pub(super) fn new(
        runtime: Py<Runtime>,
        group: usize,
        op: Op,
        stream: Option<u64>,
        arrays: LayerArrays,
    ) -> Self {
        LayerCall {
            runtime,
            group,
            op,
            stream,
            capacity: arrays.capacity,
            arrays: Mutex::new(arrays),
        }
    }
}

#[pymethods]
impl LayerCall {
    /// Runs the call over the first `num_tokens` token rows of its arrays (all of them by
    /// default).
    #[pyo3(signature = (num_tokens = None))]
    fn __call__(&self, py: Python<'_>, num_tokens: Option<Int<u32>>) -> PyResult<()> {
        take_args!(num_tokens);
        let mut state = self.runtime.get().lock()?;
        let on = state.on(py, self.stream)?;
        let mut arrays = self.arrays.try_lock().map_err(|e| match e {
            std::sync::TryLockError::WouldBlock => concurrent_use("LayerCall"),
            std::sync::TryLockError::Poisoned(_) => poisoned("LayerCall"),
        })?;
        arrays.run(&mut state.rt, self.group, self.op, num_tokens, on)
    }

    /// The index group.
    #[getter]
    fn group(&self) -> usize {
        self.group
    }

    /// `"index_group"`, `"leader"` or `"prefill"`.
    #[getter]
    fn swap(&self) -> &'static str {
        self.op.name()
    }

    /// Token rows the arrays hold (the default `num_tokens` of a call).
    #[getter]
    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn __repr__(&self) -> String {
        format!("LayerCall(group={}, swap={:?})", self.group, self.op.name())
    }
}
