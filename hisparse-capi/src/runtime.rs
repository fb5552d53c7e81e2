//! The engine runtime over a backend chosen by name (`HsRuntime`), and device buffers for the
//! per-layer calls (`HsBuffer`).

use std::ffi::{c_char, c_void};

use hisparse_core::Device;
use hisparse_runtime::{
    AnyBuffer, AnyDevice, BackendKind, Indices, Pools, ReportError, Runtime, RuntimeConfig, TopK,
};

use crate::command::HsCommand;
use crate::coordinator::HsCoordinator;
use crate::error::{
    Failure, HsStatus, deref, deref_mut, free_handle, guard, handle, invalid, output, output_opt,
    slice, slice_mut, string,
};
use crate::layout::HsLayout;

/// The engine runtime (opaque): executes each step's command on a backend. Free with
/// `hs_runtime_free` (which first waits for the runtime's work in flight).
pub struct HsRuntime {
    pub(crate) rt: Runtime<AnyDevice>,
}

impl Drop for HsRuntime {
    fn drop(&mut self) {
        // Lent memory must outlive the work enqueued on it: finish that work first. A failure
        // has nowhere to go here (the device is then lost anyway).
        let _ = self.rt.drain();
    }
}

/// A device buffer of a runtime's device (opaque): top-k inputs, row-index outputs, counts.
/// Free with `hs_buffer_free`.
pub struct HsBuffer {
    buf: AnyBuffer,
}

/// Runtime settings. Start from `hs_runtime_config_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsRuntimeConfig {
    /// State rows of every table and hot state: the coordinator's `max_running`.
    pub state_rows: u32,
    /// Token rows one per-layer call may carry.
    pub max_step_tokens: u32,
    /// This runtime's worker index in the coordinator's reports.
    pub worker: u32,
    /// Copy the hit/miss counts of every `stats_every`-th step to host (0 = never).
    pub stats_every: u32,
}

/// Memory and a stream the engine lends the runtime instead of letting it allocate its own.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsLentResources {
    /// The device pool (a device pointer; host memory on the CPU backend), or NULL to let the
    /// runtime allocate it. At least the layout's `gpu_pool_bytes`.
    pub device_pool: *mut c_void,
    /// Bytes at `device_pool`.
    pub device_pool_bytes: usize,
    /// The host pool (page-aligned host memory, pinned or not), or NULL to let the runtime
    /// allocate it. At least the layout's `host_pool_bytes`.
    pub host_pool: *mut c_void,
    /// Bytes at `host_pool`.
    pub host_pool_bytes: usize,
    /// Whether `stream` is to be used.
    pub has_stream: bool,
    /// The engine's stream (`CUstream`, `hipStream_t`): the runtime's before-forward and
    /// decode-path work is enqueued on it.
    pub stream: *mut c_void,
}

/// Totals since the runtime was built, for metrics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsCounters {
    /// Steps begun.
    pub steps: u64,
    /// Steps whose hit and miss counts were copied back.
    pub sampled_steps: u64,
    /// Top-k entries served from a hot buffer.
    pub hot_hits: u64,
    /// Top-k entries swapped in from host.
    pub hot_misses: u64,
    /// Valid top-k entries read from resident pages.
    pub resident_reads: u64,
    /// Bytes copied host → device.
    pub h2d_bytes: u64,
    /// Bytes copied device → host.
    pub d2h_bytes: u64,
    /// Index-group calls that took the fully-resident remap.
    pub remap_calls: u64,
    /// Index-group calls that resolved against the hot buffers.
    pub resolve_calls: u64,
    /// Resident pages reclaimed.
    pub reclaimed_pages: u64,
    /// Row-mirror spans enqueued.
    pub mirror_spans: u64,
    /// Whole pages spilled device → host.
    pub spilled_pages: u64,
    /// Transfer batches enqueued.
    pub transfers_enqueued: u64,
    /// Transfer batches seen complete.
    pub transfers_completed: u64,
}

/// Fills `config` with defaults: 1 state row, 1 token row per call, worker 0, counters every
/// step. Set `state_rows` and `max_step_tokens` for the engine.
///
/// # Safety
///
/// `config` is NULL or points to writable memory for an `HsRuntimeConfig`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_config_default(config: *mut HsRuntimeConfig) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let config = unsafe { output(config, "config") }?;
        config.set(HsRuntimeConfig {
            state_rows: 1,
            max_step_tokens: 1,
            worker: 0,
            stats_every: 1,
        });
        Ok(())
    })
}

fn open(backend: &str, device: &str) -> Result<AnyDevice, Failure> {
    let kind: BackendKind = backend.parse().map_err(|e| invalid(format!("{e}")))?;
    Ok(AnyDevice::open(kind, device)?)
}

fn runtime_config(c: &HsRuntimeConfig) -> RuntimeConfig {
    let mut cfg = RuntimeConfig::new(c.state_rows, c.max_step_tokens);
    cfg.worker = c.worker;
    cfg.stats_every = c.stats_every;
    cfg
}

/// A runtime for `layout` on backend `backend` (`"cpu"`, `"cuda"`, `"vulkan"`, `"rocm"`),
/// device `device` (NULL or "" = the first; an ordinal for CUDA and ROCm, an index or name for
/// Vulkan), allocating its pools and streams. `*out` receives the handle.
///
/// # Safety
///
/// `layout` is a live handle; `backend` and `device` are NULL or NUL-terminated; `config`
/// points to a valid `HsRuntimeConfig`; `out` to writable memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_new(
    layout: *const HsLayout,
    backend: *const c_char,
    device: *const c_char,
    config: *const HsRuntimeConfig,
    out: *mut *mut HsRuntime,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (layout, backend, device, config, out) = unsafe {
            (
                deref(layout, "layout")?,
                string(backend, "backend", "cpu")?,
                string(device, "device", "")?,
                deref(config, "config")?,
                output(out, "out")?,
            )
        };
        let dev = open(backend, device)?;
        let rt = Runtime::new(dev, layout.kv.clone(), runtime_config(config))?;
        out.set(handle(HsRuntime { rt }));
        Ok(())
    })
}

/// As `hs_runtime_new`, on the pools and stream the engine lends in `lent` (each one NULL or
/// `has_stream` false = allocated by the runtime).
///
/// # Safety
///
/// As `hs_runtime_new`, and `lent` points to a valid `HsLentResources` whose memory and stream
/// meet the backend's lending contract: the memory stays allocated and the stream alive until
/// `hs_runtime_free` returns; nothing else touches the memory while the runtime's work on it
/// may be in flight, except in stream order; device memory belongs to the opened device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_new_with_pools(
    layout: *const HsLayout,
    backend: *const c_char,
    device: *const c_char,
    config: *const HsRuntimeConfig,
    lent: *const HsLentResources,
    out: *mut *mut HsRuntime,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (layout, backend, device, config, lent, out) = unsafe {
            (
                deref(layout, "layout")?,
                string(backend, "backend", "cpu")?,
                string(device, "device", "")?,
                deref(config, "config")?,
                deref(lent, "lent")?,
                output(out, "out")?,
            )
        };
        let kv = layout.kv.clone();
        let dev = open(backend, device)?;
        let device_buf = if lent.device_pool.is_null() {
            dev.alloc(to_usize(kv.gpu_pool_bytes())?)?
        } else {
            // SAFETY: forwarded contract (the lending contract of the backend).
            unsafe {
                dev.wrap_device_memory(lent.device_pool as usize as u64, lent.device_pool_bytes)
            }?
        };
        let host_buf = if lent.host_pool.is_null() {
            dev.alloc_pinned(to_usize(kv.host_pool_bytes())?)?
        } else {
            // SAFETY: forwarded contract.
            unsafe { dev.wrap_host_memory(lent.host_pool.cast(), lent.host_pool_bytes) }?
        };
        let stream = if lent.has_stream {
            // SAFETY: forwarded contract.
            Some(unsafe { dev.wrap_stream(lent.stream) }?)
        } else {
            None
        };
        let pools = Pools {
            device: device_buf,
            host: host_buf,
        };
        let rt = Runtime::with_pools(dev, kv, runtime_config(config), pools, stream)?;
        out.set(handle(HsRuntime { rt }));
        Ok(())
    })
}

fn to_usize(bytes: u64) -> Result<usize, Failure> {
    usize::try_from(bytes).map_err(|_| invalid(format!("{bytes} bytes exceed the address space")))
}

/// Waits for the runtime's work in flight, then frees it (NULL is ignored).
///
/// # Safety
///
/// `runtime` is NULL or a handle from `hs_runtime_new*` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_free(runtime: *mut HsRuntime) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(runtime) }
}

/// Before the forward pass: applies `command`'s table updates, hot-state resets, invalidation,
/// copy-on-write and restores on the compute stream.
///
/// # Safety
///
/// `runtime` and `command` are live handles; `runtime` is used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_begin_step(
    runtime: *mut HsRuntime,
    command: *const HsCommand,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, c) = unsafe { (deref_mut(runtime, "runtime")?, deref(command, "command")?) };
        Ok(r.rt.begin_step(&c.inner)?)
    })
}

/// Sets this step's batch: `state_rows[t]` is token row `t`'s state row (-1 = padding).
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `state_rows` holds `len`
/// values (NULL allowed for 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_set_batch(
    runtime: *mut HsRuntime,
    state_rows: *const i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, rows) = unsafe {
            (
                deref_mut(runtime, "runtime")?,
                slice(state_rows, len, "state_rows")?,
            )
        };
        Ok(r.rt.set_batch(rows)?)
    })
}

/// Which layers a per-layer call swaps in.
#[derive(Clone, Copy)]
enum Swap {
    Group,
    Leader,
}

/// # Safety
///
/// The contract of `hs_runtime_resolve_index_group`.
unsafe fn per_layer(
    runtime: *mut HsRuntime,
    group: usize,
    topk: *const HsBuffer,
    num_tokens: u32,
    rows: *mut HsBuffer,
    counts: *mut HsBuffer,
    swap: Swap,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract (`counts` may be NULL).
        let (r, topk, rows, counts) = unsafe {
            (
                deref_mut(runtime, "runtime")?,
                deref(topk, "topk")?,
                deref_mut(rows, "rows")?,
                counts.as_mut(),
            )
        };
        let input = TopK {
            positions: &topk.buf,
            num_tokens,
            state_rows: None,
        };
        let out = Indices {
            rows: &mut rows.buf,
            counts: counts.map(|c| &mut c.buf),
        };
        match swap {
            Swap::Group => r.rt.resolve_index_group(group, &input, out),
            Swap::Leader => r.rt.resolve_leader(group, &input, out),
        }?;
        Ok(())
    })
}

/// Resolves index group `group`'s top-k (`topk`: int32 `[num_tokens][top_k]` token positions
/// of the batch set by `hs_runtime_set_batch`, -1 = none) into attention rows (`rows`: int32,
/// same shape, physical rows of the flat device-pool view, -1 = none), swapping in every layer
/// of the group; `counts` (int32 `[num_tokens]`, or NULL) receives valid entries per row.
///
/// # Safety
///
/// `runtime`, `topk` and `rows` are live handles (buffers of the runtime's device), `counts`
/// NULL or one; `rows` and `counts` are distinct from each other and from `topk`; `runtime`
/// is used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_resolve_index_group(
    runtime: *mut HsRuntime,
    group: usize,
    topk: *const HsBuffer,
    num_tokens: u32,
    rows: *mut HsBuffer,
    counts: *mut HsBuffer,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { per_layer(runtime, group, topk, num_tokens, rows, counts, Swap::Group) }
}

/// As `hs_runtime_resolve_index_group`, swapping in the leader layer only; each follower layer
/// then calls `hs_runtime_apply_plan`.
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
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe { per_layer(runtime, group, topk, num_tokens, rows, counts, Swap::Leader) }
}

/// Swaps in follower layer `layer` with its leader's plan of this step.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_apply_plan(runtime: *mut HsRuntime, layer: u32) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let r = unsafe { deref_mut(runtime, "runtime") }?;
        Ok(r.rt.apply_plan(layer)?)
    })
}

/// After the forward pass: row mirrors and spills on the copy stream.
///
/// # Safety
///
/// As `hs_runtime_begin_step`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_end_step(
    runtime: *mut HsRuntime,
    command: *const HsCommand,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, c) = unsafe { (deref_mut(runtime, "runtime")?, deref(command, "command")?) };
        Ok(r.rt.end_step(&c.inner)?)
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
        let (r, c, completed) = unsafe {
            (
                deref_mut(runtime, "runtime")?,
                deref_mut(coordinator, "coordinator")?,
                output_opt(completed),
            )
        };
        let report = r.rt.poll_and_report(&mut c.inner).map_err(|e| match e {
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
        let (r, c) = unsafe { (deref_mut(runtime, "runtime")?, coordinator.as_mut()) };
        let report = r.rt.drain()?;
        if let Some(c) = c
            && !report.is_empty()
        {
            c.inner
                .report(report.worker, &report.enqueued, &report.completed)?;
        }
        Ok(())
    })
}

/// Totals since the runtime was built.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for an `HsCounters`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_counters(
    runtime: *const HsRuntime,
    out: *mut HsCounters,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (deref(runtime, "runtime")?, output(out, "out")?) };
        let c = r.rt.counters();
        out.set(HsCounters {
            steps: c.steps,
            sampled_steps: c.sampled_steps,
            hot_hits: c.hot_hits,
            hot_misses: c.hot_misses,
            resident_reads: c.resident_reads,
            h2d_bytes: c.h2d_bytes,
            d2h_bytes: c.d2h_bytes,
            remap_calls: c.remap_calls,
            resolve_calls: c.resolve_calls,
            reclaimed_pages: c.reclaimed_pages,
            mirror_spans: c.mirror_spans,
            spilled_pages: c.spilled_pages,
            transfers_enqueued: c.transfers_enqueued,
            transfers_completed: c.transfers_completed,
        });
        Ok(())
    })
}

/// Copies the resident table row of `state_row` in `bucket` (page → GPU block, 0 = read from
/// host) into `out`: the first `min(len, max_pages_per_request)` entries.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to `len` writable `int32_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_resident_row(
    runtime: *const HsRuntime,
    bucket: u32,
    state_row: u32,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (deref(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        let row = r.rt.resident_row(bucket, state_row).ok_or_else(|| {
            invalid(format!(
                "bucket {bucket} or state row {state_row} is outside the runtime ({} buckets, {} state rows)",
                r.rt.layout().num_buckets,
                r.rt.config().state_rows
            ))
        })?;
        let n = out.len().min(row.len());
        out[..n].copy_from_slice(&row[..n]);
        Ok(())
    })
}

/// Writes `len` bytes into the device pool at byte `offset`, synchronously (an engine's
/// forward pass writing KV rows into a pool the runtime owns).
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `data` holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_write_device_pool(
    runtime: *mut HsRuntime,
    offset: usize,
    data: *const u8,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, data) = unsafe { (deref_mut(runtime, "runtime")?, slice(data, len, "data")?) };
        let (dev, pools) = r.rt.device_and_pools_mut();
        Ok(dev.upload(&mut pools.device, offset, data)?)
    })
}

/// Reads `len` bytes of the device pool from byte `offset` into `out`, synchronously.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_read_device_pool(
    runtime: *const HsRuntime,
    offset: usize,
    out: *mut u8,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (deref(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        Ok(r.rt.device().download(&r.rt.pools().device, offset, out)?)
    })
}

/// Reads `len` bytes of the host pool from byte `offset` into `out` (call `hs_runtime_drain`
/// first for rows still being copied).
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_read_host_pool(
    runtime: *const HsRuntime,
    offset: usize,
    out: *mut u8,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (deref(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        Ok(r.rt.device().read_pinned(&r.rt.pools().host, offset, out)?)
    })
}

/// A zeroed device buffer of `bytes` bytes on the runtime's device; `*out` receives it.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_alloc(
    runtime: *const HsRuntime,
    bytes: usize,
    out: *mut *mut HsBuffer,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (deref(runtime, "runtime")?, output(out, "out")?) };
        let buf = r.rt.device().alloc(bytes)?;
        out.set(handle(HsBuffer { buf }));
        Ok(())
    })
}

/// The engine's device memory (`bytes` at device pointer `ptr`; host memory on the CPU
/// backend) as a buffer of the runtime's device, without owning it; `*out` receives it.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for a pointer; the memory
/// meets the backend's lending contract: it stays allocated until the buffer is freed and the
/// work enqueued with it completed, and nothing else touches it unordered meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_wrap(
    runtime: *const HsRuntime,
    ptr: *mut c_void,
    bytes: usize,
    out: *mut *mut HsBuffer,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (deref(runtime, "runtime")?, output(out, "out")?) };
        // SAFETY: forwarded contract.
        let buf = unsafe { r.rt.device().wrap_device_memory(ptr as usize as u64, bytes) }?;
        out.set(handle(HsBuffer { buf }));
        Ok(())
    })
}

/// Frees a buffer (NULL is ignored); wrapped memory is left to its owner.
///
/// # Safety
///
/// `buffer` is NULL or a handle from `hs_buffer_alloc` / `hs_buffer_wrap` not freed yet, with
/// no work using it still in flight.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_free(buffer: *mut HsBuffer) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(buffer) }
}

/// Writes `len` int32 values into `buffer` from element `offset` on, synchronously.
///
/// # Safety
///
/// `runtime` and `buffer` are live handles (the buffer of the runtime's device); `values`
/// holds `len` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_upload_i32(
    runtime: *const HsRuntime,
    buffer: *mut HsBuffer,
    offset: usize,
    values: *const i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, b, v) = unsafe {
            (
                deref(runtime, "runtime")?,
                deref_mut(buffer, "buffer")?,
                slice(values, len, "values")?,
            )
        };
        let at = offset
            .checked_mul(4)
            .ok_or_else(|| invalid("offset overflows"))?;
        Ok(r.rt.device().upload_i32(&mut b.buf, at, v)?)
    })
}

/// Reads `len` int32 values of `buffer` from element `offset` on into `out`, synchronously.
///
/// # Safety
///
/// `runtime` and `buffer` are live handles; `out` points to `len` writable values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_download_i32(
    runtime: *const HsRuntime,
    buffer: *const HsBuffer,
    offset: usize,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, b, out) = unsafe {
            (
                deref(runtime, "runtime")?,
                deref(buffer, "buffer")?,
                slice_mut(out, len, "out")?,
            )
        };
        let at = offset
            .checked_mul(4)
            .ok_or_else(|| invalid("offset overflows"))?;
        Ok(r.rt.device().download_i32(&b.buf, at, out)?)
    })
}
