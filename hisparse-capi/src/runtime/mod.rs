//! The engine runtime over a backend chosen by name (`HsRuntime`): building it, its settings and
//! counters, and the engine streams it enqueues on. The step (`step.rs`), the per-layer calls
//! (`decode.rs`), the remap with modes and the compressed slot mapping (`modes.rs`), its device
//! arrays (`arrays.rs`) and device buffers and pools (`memory.rs`) have files of their own.

mod arrays;
mod decode;
mod memory;
mod modes;
mod step;

use std::ffi::{c_char, c_void};

use hisparse_core::Device;
use hisparse_runtime::{AnyDevice, BackendKind, Pools, Runtime, RuntimeConfig, StreamId};

pub use arrays::*;
pub use decode::*;
pub use memory::*;
pub use modes::*;
pub use step::*;

use crate::error::{Failure, HsStatus, deref, free_handle, guard, handle, invalid, output, string};
use crate::exclusive::{Exclusive, Handle, answer_entered_array, enter};
use crate::layout::HsLayout;

/// The engine runtime (opaque): executes each step's command on a backend. Free with
/// `hs_runtime_free` (which first waits for the runtime's work in flight).
pub struct HsRuntime {
    state: Exclusive<RuntimeState>,
}

impl Handle for HsRuntime {
    type State = RuntimeState;

    fn cell(&self) -> &Exclusive<RuntimeState> {
        &self.state
    }
}

/// What an `HsRuntime` holds.
pub(crate) struct RuntimeState {
    pub(crate) rt: Runtime<AnyDevice>,
    /// The engine streams lent so far: the raw handle a call passed and the id the runtime gave
    /// it (each handle is lent once and kept for the runtime's life).
    streams: Vec<(usize, StreamId)>,
    /// The raw handle of the stream lent at construction (`HsLentResources::stream`), which is
    /// the compute stream itself: a call passing it means the compute stream.
    compute_raw: Option<usize>,
}

impl HsRuntime {
    fn new(rt: Runtime<AnyDevice>, compute_raw: Option<usize>) -> Self {
        HsRuntime {
            state: Exclusive::new(RuntimeState {
                rt,
                streams: Vec::new(),
                compute_raw,
            }),
        }
    }
}

impl RuntimeState {
    /// The stream a call passed as `raw`: NULL is the runtime's compute stream (`None`); any
    /// other handle is lent to the runtime the first time it is seen and named by its id after.
    ///
    /// # Safety
    ///
    /// `raw` is NULL or a live stream of the runtime's device (a `CUstream`, a `hipStream_t`)
    /// that outlives the runtime and the work enqueued on it.
    pub(crate) unsafe fn stream(&mut self, raw: *mut c_void) -> Result<Option<StreamId>, Failure> {
        let key = raw as usize;
        if raw.is_null() || self.compute_raw == Some(key) {
            return Ok(None);
        }
        if let Some(&(_, id)) = self.streams.iter().find(|(k, _)| *k == key) {
            return Ok(Some(id));
        }
        // SAFETY: forwarded contract.
        let stream = unsafe { self.rt.device().lend_stream(raw) }?;
        let id = self.rt.adopt_stream(stream)?;
        self.streams.push((key, id));
        Ok(Some(id))
    }
}

impl Drop for RuntimeState {
    fn drop(&mut self) {
        // Lent memory must outlive the work enqueued on it: finish that work first. A failure
        // has nowhere to go here (the device is then lost anyway).
        let _ = self.rt.drain();
    }
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
    /// Bring the device's decode counters to host every `stats_every`-th step (1 = every step;
    /// 0 = never, the decode counters of `HsCounters` then stay zero): one small copy each.
    pub stats_every: u32,
    /// Tokens one step may compute: the coordinator's `max_batched_tokens`, the capacity of the
    /// device slot mapping (`hs_runtime_slot_mapping`). 0 = the larger of `max_step_tokens`
    /// and the coordinator's default (512).
    pub max_batched_tokens: u32,
    /// Whether this runtime writes the host pool (row mirrors, spills, host copy-on-write).
    /// Workers that share one host pool (a layout planned with `shared_host_pool`, the pool lent
    /// to each over the same memory) leave it to exactly one of them: 1 there, 0 in the others.
    /// 1 by default.
    pub writes_host: bool,
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
    /// The engine's stream (`CUstream`, `hipStream_t`): the runtime's compute stream, which
    /// every call given a NULL stream enqueues on.
    pub stream: *mut c_void,
}

/// Totals since the runtime was built, for metrics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsCounters {
    /// Steps begun.
    pub steps: u64,
    /// Snapshots of the device's decode counters folded in (see `stats_every`). The decode
    /// counters — hits, misses, resident reads, swap-in bytes, remap, prefill-remap and resolve
    /// calls — are counted on the device (graph replays included) and cover every step up to
    /// the last snapshot (`hs_runtime_drain` takes one more: exact after it).
    pub sampled_steps: u64,
    /// Top-k entries served from a hot buffer (summed over index groups).
    pub hot_hits: u64,
    /// Top-k entries swapped in from host (summed over index groups).
    pub hot_misses: u64,
    /// Valid top-k entries read from resident pages (summed over index groups).
    pub resident_reads: u64,
    /// Bytes copied host → device: swap-in gathers and page restores.
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
    /// Prefill-chunk remaps (`hs_runtime_remap_prefill`).
    pub prefill_remap_calls: u64,
    /// Follower layers swapped in with their leader's plan (`hs_runtime_apply_plan` calls on
    /// the host; a graph replay of them is counted in `h2d_bytes` only).
    pub follower_gathers: u64,
    /// Table entries written.
    pub table_writes: u64,
    /// Hot states reset (state rows started, hot regions given out).
    pub hot_resets: u64,
    /// Pages restored host → device.
    pub restored_pages: u64,
    /// Host copy-on-write pages.
    pub host_cow_pages: u64,
    /// GPU copy-on-write blocks.
    pub gpu_cow_blocks: u64,
    /// Indexer rows backed up device → host into the indexer host cache (each in every indexer
    /// layer).
    pub indexer_rows_backed_up: u64,
    /// Indexer pages restored host → device (imported requests, prefix hits whose indexer
    /// blocks were no longer cached).
    pub indexer_pages_restored: u64,
    /// Bytes copied device → host into the runtime's indexer host cache.
    pub indexer_d2h_bytes: u64,
    /// Bytes copied host → device from the runtime's indexer host cache.
    pub indexer_h2d_bytes: u64,
}

/// Fills `config` with defaults: 1 state row, 1 token row per call, worker 0, counters every
/// step, the default slot-mapping capacity. Set `state_rows`, `max_step_tokens` and
/// `max_batched_tokens` for the engine.
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
            max_batched_tokens: 0,
            writes_host: true,
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
    cfg.writes_host = c.writes_host;
    if c.max_batched_tokens != 0 {
        cfg.max_batched_tokens = c.max_batched_tokens;
    }
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
        out.set(handle(HsRuntime::new(rt, None)));
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
        check_apart(lent)?;
        let kv = layout.kv.clone();
        let dev = open(backend, device)?;
        let device_buf = if lent.device_pool.is_null() {
            dev.alloc(to_usize(kv.gpu_pool_bytes())?)?
        } else {
            // SAFETY: forwarded contract (the lending contract of the backend).
            unsafe {
                dev.lend_device_memory(lent.device_pool as usize as u64, lent.device_pool_bytes)
            }?
        };
        let host_buf = if lent.host_pool.is_null() {
            dev.alloc_pinned(to_usize(kv.host_pool_bytes())?)?
        } else {
            // SAFETY: forwarded contract.
            unsafe { dev.lend_host_memory(lent.host_pool.cast(), lent.host_pool_bytes) }?
        };
        let stream = if lent.has_stream {
            // SAFETY: forwarded contract.
            Some(unsafe { dev.lend_stream(lent.stream) }?)
        } else {
            None
        };
        let pools = Pools {
            device: device_buf,
            host: host_buf,
        };
        let rt = Runtime::with_pools(dev, kv, runtime_config(config), pools, stream)?;
        let compute_raw = lent.has_stream.then_some(lent.stream as usize);
        out.set(handle(HsRuntime::new(rt, compute_raw)));
        Ok(())
    })
}

/// Refuses lent pools that share bytes: the runtime's copies between them would overwrite the
/// rows they read (both pools live in one address space on every backend that lends memory).
fn check_apart(lent: &HsLentResources) -> Result<(), Failure> {
    let (d, dn) = (lent.device_pool as usize, lent.device_pool_bytes);
    let (h, hn) = (lent.host_pool as usize, lent.host_pool_bytes);
    let lent_both = d != 0 && h != 0 && dn != 0 && hn != 0;
    if lent_both && d < h.saturating_add(hn) && h < d.saturating_add(dn) {
        return Err(invalid(format!(
            "lent.device_pool ({dn} bytes at {d:#x}) and lent.host_pool ({hn} bytes at {h:#x}) overlap; lend two separate allocations"
        )));
    }
    Ok(())
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
        let (r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
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
            prefill_remap_calls: c.prefill_remap_calls,
            follower_gathers: c.follower_gathers,
            table_writes: c.table_writes,
            hot_resets: c.hot_resets,
            restored_pages: c.restored_pages,
            host_cow_pages: c.host_cow_pages,
            gpu_cow_blocks: c.gpu_cow_blocks,
            indexer_rows_backed_up: c.indexer_rows_backed_up,
            indexer_pages_restored: c.indexer_pages_restored,
            indexer_d2h_bytes: c.indexer_d2h_bytes,
            indexer_h2d_bytes: c.indexer_h2d_bytes,
        });
        Ok(())
    })
}

/// How the host pool was set up, in words (threads, NUMA node, pages, pinnings; for a pool over
/// `/dev/shm`, the mount's huge-page setting and, with 4 KiB pages, the remount that speeds up
/// the set-up), as a NUL-terminated string into `out` (`capacity` bytes; `*count` receives the
/// bytes the string takes, its NUL included). An empty string where the backend did not set the
/// pool up (memory lent already pinned, a CPU-backend pool lent, the Vulkan backend). NULL `out`
/// with `capacity` 0 asks only for the count; a smaller array gets
/// `HS_STATUS_BUFFER_TOO_SMALL`.
///
/// # Safety
///
/// `runtime` is a live handle; `out` is NULL or points to `capacity` writable bytes; `count`
/// points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_host_pool_setup(
    runtime: *const HsRuntime,
    out: *mut c_char,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer_entered_array(runtime, "runtime", out, capacity, count, |r| {
            let text =
                r.rt.pools()
                    .host
                    .setup()
                    .map(ToString::to_string)
                    .unwrap_or_default();
            // The report is plain text: no byte of it is NUL.
            text.bytes().chain([0]).map(|b| b as c_char).collect()
        })
    }
}

/// Blocks until the work enqueued on `stream` (NULL: the runtime's compute stream) completed.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `stream` is NULL or a live
/// stream of the device that outlives the runtime.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_synchronize(
    runtime: *mut HsRuntime,
    stream: *mut c_void,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let mut r = unsafe { enter(runtime, "runtime") }?;
        // SAFETY: forwarded contract.
        let on = unsafe { r.stream(stream) }?;
        let s = r.rt.stream(on)?;
        Ok(r.rt.device().synchronize(s)?)
    })
}
