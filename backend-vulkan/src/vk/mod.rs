//! The raw Vulkan layer: instance and device creation, memory, pipelines, command recording and
//! submission. Every `unsafe` call of the backend lives in this module and its submodules:
//! `device` (instance, device and queue selection, validation messenger), `memory` (buffers,
//! host import, memory budget), `submit` (streams, batches, timeline submission, deferred
//! destruction) and `record` (pipelines and the command recorder with its hazard tracking).
//!
//! # Execution model
//!
//! * **Lanes** are the queues the device gets: up to [`MAX_COMPUTE_LANES`] queues of one
//!   compute-capable family, plus one queue of a dedicated transfer family (no graphics, no
//!   compute: a DMA engine) where the device has one.
//! * **Streams** are submission chains. Each stream owns a timeline semaphore; every submission
//!   of the stream waits for the stream's previous value and signals the next, so the stream's
//!   work runs in order whichever lane each submission went to. A stream records into one open
//!   command buffer (a *batch*) and submits it when the device has finished the stream's previous
//!   submission (the device would otherwise idle) and the batch is worth a submission (it holds
//!   [`IDLE_BATCH_COMMANDS`] commands, or the stream submitted nothing for [`IDLE_GAP`]: a
//!   submission costs the host several microseconds, more than a small kernel runs, so commands
//!   recorded in quick succession go together), when the batch holds [`FLUSH_COMMANDS`]
//!   commands, and whenever something must observe it (a synchronisation, an event another
//!   stream waits for or the host polls): a synchronisation never waits for the batching rule.
//!   On GPUs a host wait spins on the timeline for [`WAIT_SPIN`], then polls it while yielding
//!   the thread for up to [`WAIT_POLL`] before it blocks. A batch of copy
//!   commands only may go to the transfer lane; a batch with compute work goes to the stream's
//!   compute lane (streams take compute lanes round-robin).
//! * **Inside a batch**, a command waits behind a pipeline barrier only when it touches bytes an
//!   earlier command of the batch wrote, or writes bytes one read ([`record::Hazards`]), so
//!   independent commands overlap.
//! * **Events** are `(semaphore, value)` pairs; waiting for one adds a semaphore wait to the
//!   waiting stream's next submission.
//! * **Stream 0** is internal: buffer zero-fills and the staging copies of synchronous uploads
//!   and downloads. Every other stream's next submission waits for stream 0's latest value, so
//!   work enqueued after an allocation sees its zeros.
//! * **Capture** (the backend's `timed`): every stream records into stream 0's batch on compute
//!   lane 0, between two timestamp queries, with a full barrier at each event wait.
//!
//! Resources released while work may still use them are destroyed once every stream's timeline
//! has passed the value that could reference them.

use std::alloc::Layout;
use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use ash::vk;

use crate::error::VulkanError;
use crate::shaders::Shader;

mod device;
mod memory;
mod profile;
mod record;
mod submit;

pub use memory::{read_host, write_host};
pub use record::{Rec, Span};

type Result<T> = core::result::Result<T, VulkanError>;

/// Most compute queues the backend asks for (streams are spread over them round-robin).
pub const MAX_COMPUTE_LANES: u32 = 4;

/// Commands after which a stream's open batch is submitted even while the device is busy.
pub const FLUSH_COMMANDS: u32 = 64;

/// Commands from which a stream's open batch is submitted as soon as the device has caught up.
pub const IDLE_BATCH_COMMANDS: u32 = 16;

/// Time since a stream's last submission after which its open batch, however small, is submitted
/// as soon as the device has caught up.
pub const IDLE_GAP: std::time::Duration = std::time::Duration::from_micros(50);

/// How long a host wait polls the timelines before it blocks in `vkWaitSemaphores` (GPUs only).
pub const WAIT_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// How long a host wait on a GPU polls the timelines, yielding the thread between polls, after
/// [`WAIT_SPIN`] and before it blocks (unless the device was opened with `HostWait::Block`): a thread blocked in
/// `vkWaitSemaphores` wakes late, which cost each synchronisation of a benchmark sample or a
/// simulated step hundreds of microseconds.
pub const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Validation warnings and errors reported by the debug messenger of any device (process-wide).
static VALIDATION_MESSAGES: AtomicUsize = AtomicUsize::new(0);

/// Validation warnings and errors reported so far by any device of this process (counted when
/// `VK_EXT_debug_utils` is available, e.g. with `VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation`).
pub fn validation_message_count() -> usize {
    VALIDATION_MESSAGES.load(Ordering::SeqCst)
}

unsafe extern "system" fn debug_callback(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    VALIDATION_MESSAGES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the loader passes either null or a valid callback-data struct whose message is a
    // NUL-terminated string, both valid for the duration of this call.
    let msg = unsafe { data.as_ref().and_then(|d| d.message_as_c_str()) }
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    eprintln!("[vulkan validation {severity:?}] {msg}");
    vk::FALSE
}

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Device-local memory (the device pool, index buffers, scratch).
    Device,
    /// Host memory the device reads directly: imported page-aligned host allocation when
    /// `VK_EXT_external_memory_host` works, else host-visible coherent memory, mapped.
    Pinned,
    /// Host-visible coherent memory for staging uploads and downloads, mapped.
    Staging,
    /// Small host-written parameter blocks; device-local host-visible memory when available.
    Arena,
}

/// What a recording needs from the lane it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Compute dispatches (a compute lane).
    Compute,
    /// Only copy and fill commands (any lane, the transfer lane included).
    Copy,
}

/// A page-aligned host allocation owned by a buffer (imported into Vulkan).
#[derive(Debug)]
struct HostAlloc {
    ptr: *mut u8,
    layout: Layout,
}

/// A Vulkan buffer with its own memory.
#[derive(Debug)]
pub struct RawBuffer {
    /// The buffer handle.
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    /// Bytes of the Vulkan buffer (the logical size rounded up to 16, at least 16).
    pub size: u64,
    /// Host address of the contents for host-accessible kinds, else null.
    pub ptr: *mut u8,
    host: Option<HostAlloc>,
    /// Whether the memory is an imported host allocation.
    pub imported: bool,
    /// Bytes counted against the device heap (device-local allocations only).
    device_bytes: u64,
}

// SAFETY: the handles are plain identifiers usable from any thread (Vulkan requires external
// synchronisation only for concurrent use of the same object, which the owners serialise); `ptr`
// points to memory owned by this buffer for its whole life.
unsafe impl Send for RawBuffer {}
// SAFETY: shared references only read the handles and the address; host accesses through `ptr`
// are performed by the owning wrapper under `&mut` or after waiting for the device.
unsafe impl Sync for RawBuffer {}

/// One storage-buffer binding: `range` bytes of `buffer` from `offset`.
#[derive(Clone, Copy, Debug)]
pub struct Binding {
    /// Buffer handle.
    pub buffer: vk::Buffer,
    /// Byte offset (a multiple of the device's storage offset alignment).
    pub offset: u64,
    /// Bytes bound.
    pub range: u64,
}

/// Device properties the backend plans with.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `maxStorageBufferRange`.
    pub max_storage_range: u64,
    /// Bytes of one pool window: the largest power of two ≤ `maxStorageBufferRange` and ≤ 2 GiB.
    pub window: u64,
    /// Storage buffer descriptors one dispatch may bind (per stage and per set).
    pub max_storage_per_stage: u32,
    /// `minStorageBufferOffsetAlignment`.
    pub storage_offset_alignment: u64,
    /// `maxMemoryAllocationSize`: the largest single allocation.
    pub max_allocation: u64,
    /// Nanoseconds per timestamp tick, or `None` without timestamp support.
    pub timestamp_period: Option<f64>,
    /// Alignment of imported host pointers, when host import is available.
    pub import_alignment: Option<u64>,
    /// Whether the device is a GPU (discrete, integrated or virtual), not a CPU implementation
    /// such as lavapipe: copies of many small regions then run as compute shaders.
    pub gpu: bool,
    /// Whether device memory is host memory (CPU devices and integrated GPUs).
    pub unified: bool,
    /// Whether `VK_EXT_memory_budget` reports per-heap budgets.
    pub memory_budget: bool,
    /// Whether compute shaders have subgroup arithmetic (the resolver's scans use it).
    pub subgroup_arithmetic: bool,
    /// Whether the one-dispatch resolver runs here: workgroups of 1024 invocations with
    /// [`RESOLVE_WG_SHARED_BYTES`] of workgroup memory.
    pub workgroup_resolver: bool,
    /// Whether its variant with the larger hash table fits ([`RESOLVE_WG_LARGE_SHARED_BYTES`]).
    pub workgroup_resolver_large: bool,
}

/// Workgroup memory the one-dispatch resolver (`shaders/resolve_wg.wgsl`) declares with its
/// 2560-entry hash table (lavapipe offers 32 KiB).
pub const RESOLVE_WG_SHARED_BYTES: u32 = 31_904;

/// Workgroup memory of its variant with a 4096-entry hash table (NVIDIA GPUs offer 48 KiB, AMD
/// and Intel GPUs 64 KiB).
pub const RESOLVE_WG_LARGE_SHARED_BYTES: u32 = 44_192;

/// A queue the backend submits to.
#[derive(Clone, Copy, Debug)]
pub struct Lane {
    queue: vk::Queue,
    /// Index into [`Context::families`] (its command pools).
    family_slot: usize,
    /// A dedicated transfer queue (copies only).
    transfer: bool,
}

struct Pipeline {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

/// A command buffer with its pools and the resources its work references.
struct Submission {
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    family_slot: usize,
    desc_pools: Vec<vk::DescriptorPool>,
    desc_pool_at: usize,
    arena: Option<RawBuffer>,
    arena_used: u64,
    retired: Vec<RawBuffer>,
    /// The timeline value whose signal marks this submission complete.
    signal: (vk::Semaphore, u64),
    /// Profiling only: timestamp queries (null until the first profiled batch), how many this
    /// batch wrote, and the operation each one after the first ended.
    queries: vk::QueryPool,
    queries_used: u32,
    query_ops: Vec<(&'static str, &'static str)>,
}

/// A stream's command buffer being recorded.
struct Open {
    sub: Submission,
    lane: usize,
    commands: u32,
    hazards: record::Hazards,
    /// The first command the current recording call recorded (for the profile).
    first: &'static str,
}

/// One stream: a timeline semaphore and the chain of submissions signalling it.
struct StreamState {
    sem: vk::Semaphore,
    /// Last value a submission of this stream signals (0: nothing submitted yet).
    submitted: u64,
    /// The compute lane this stream's compute batches go to.
    lane: usize,
    open: Option<Open>,
    /// Semaphore waits for the next submission (events this stream waits for).
    waits: Vec<(vk::Semaphore, u64)>,
    /// Stream 0's value the last submission waited for.
    internal_seen: u64,
    /// Scratch memory of the stream's resolves (never shared between streams).
    scratch: Option<RawBuffer>,
    /// Whether a `VulkanStream` owns the slot (stream 0 always does).
    live: bool,
    /// When the stream last submitted.
    last_submit: Option<std::time::Instant>,
}

struct State {
    /// Index = stream id; slot 0 is the internal stream.
    streams: Vec<StreamState>,
    next_lane: usize,
    /// Recycled submissions, per family slot.
    free: Vec<Vec<Submission>>,
    inflight: Vec<Submission>,
    /// Buffers waiting for every listed timeline value.
    garbage: Vec<(Vec<(vk::Semaphore, u64)>, RawBuffer)>,
    pipelines: Vec<Option<Pipeline>>,
    /// Capture mode (see the module docs).
    capture: bool,
    /// The profile, when `VulkanOptions::profile` turned it on.
    profile: Option<profile::Profile>,
}

/// A Vulkan instance, device and queues with everything the backend submits through.
pub struct Context {
    _entry: ash::Entry,
    instance: ash::Instance,
    pdev: vk::PhysicalDevice,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    device: ash::Device,
    host_import: Option<ash::ext::external_memory_host::Device>,
    /// Compute lanes first, then the transfer lane (if any).
    lanes: Vec<Lane>,
    compute_lanes: usize,
    transfer_lane: Option<usize>,
    /// Queue family index of each family slot (slot 0: the compute family).
    families: Vec<u32>,
    mem: vk::PhysicalDeviceMemoryProperties,
    /// Device name and driver, for reports.
    pub name: String,
    /// Planning limits.
    pub limits: Limits,
    query_pool: Option<vk::QueryPool>,
    state: Mutex<State>,
    /// Device-local bytes this context has allocated (for the budget without
    /// `VK_EXT_memory_budget`).
    device_allocated: AtomicU64,
    /// Fail operations after which validation messages appeared.
    pub strict: bool,
    /// Fault injection for tests: `wait_event` does nothing (see
    /// `TestShape::ignore_event_waits`).
    pub ignore_event_waits: bool,
    /// Process-wide message count already reported.
    checked: AtomicUsize,
    /// Queue submissions so far (a diagnostic for benches).
    pub submissions: AtomicU64,
    /// How long a host wait polls (yielding) after [`WAIT_SPIN`] before it blocks: [`WAIT_POLL`]
    /// on GPUs, zero on CPU devices or with `HostWait::Block`.
    pub wait_poll: std::time::Duration,
    /// Whether a barrier between two compute dispatches (with no copy or fill recorded since the
    /// previous barrier) covers only the compute-shader stage and shader accesses instead of
    /// every stage and access (`Barriers::All` clears it, for comparisons).
    pub compute_barriers: bool,
}

// SAFETY: `ash::Instance`/`ash::Device` are function tables plus handles; Vulkan objects that
// need external synchronisation (queues, command pools, descriptor pools, submissions) are used
// only under `state`'s mutex, and everything else is immutable after creation.
unsafe impl Send for Context {}
// SAFETY: see `Send`: all externally synchronised objects are reached through `state`.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = self.wait_all();
        // SAFETY: valid device; waiting makes every queue idle before anything is destroyed.
        unsafe {
            let _ = self.device.device_wait_idle();
        }
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut bufs: Vec<RawBuffer> = Vec::new();
        let mut subs: Vec<Submission> = st.free.drain(..).flatten().collect();
        subs.append(&mut st.inflight);
        let mut sems = Vec::new();
        for s in &mut st.streams {
            subs.extend(s.open.take().map(|o| o.sub));
            bufs.extend(s.scratch.take());
            sems.push(s.sem);
        }
        bufs.extend(st.garbage.drain(..).map(|(_, b)| b));
        let pipes: Vec<Pipeline> = st.pipelines.iter_mut().filter_map(Option::take).collect();
        for s in &mut subs {
            bufs.append(&mut s.retired);
            bufs.extend(s.arena.take());
        }
        if let Some(p) = &st.profile {
            eprint!("{}", p.report(&self.name));
        }
        for b in bufs {
            self.destroy_now(b);
        }
        // SAFETY: the device is idle (waited above) and every object below was created from
        // it and is destroyed exactly once, children before the device and instance.
        unsafe {
            for s in subs {
                for p in s.desc_pools {
                    self.device.destroy_descriptor_pool(p, None);
                }
                if s.queries != vk::QueryPool::null() {
                    self.device.destroy_query_pool(s.queries, None);
                }
                self.device.destroy_command_pool(s.pool, None);
            }
            for p in pipes {
                self.device.destroy_pipeline(p.pipeline, None);
                self.device.destroy_pipeline_layout(p.layout, None);
                self.device
                    .destroy_descriptor_set_layout(p.set_layout, None);
            }
            if let Some(q) = self.query_pool {
                self.device.destroy_query_pool(q, None);
            }
            for s in sems {
                self.device.destroy_semaphore(s, None);
            }
            self.device.destroy_device(None);
            if let Some((du, m)) = &self.debug {
                du.destroy_debug_utils_messenger(*m, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

impl Context {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent handles; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Compute lanes (queues of the compute family) this context submits to.
    pub fn compute_lanes(&self) -> usize {
        self.compute_lanes
    }

    /// Whether the device has a dedicated transfer queue that copy-only batches go to.
    pub fn has_transfer_lane(&self) -> bool {
        self.transfer_lane.is_some()
    }

    /// Reshapes the lanes before any work: `compute` compute lanes (beyond the queues created,
    /// lanes share them round-robin) and a transfer lane or none (without a dedicated transfer
    /// queue, a transfer lane that shares compute queue 0). Lanes sharing a queue are still
    /// correct — every submission happens under the state lock — they just do not overlap; this
    /// runs the multi-queue routing on single-queue devices, and turns queues off for
    /// comparisons.
    pub fn reshape_lanes(&mut self, compute: usize, transfer: bool) {
        let real: Vec<Lane> = self.lanes[..self.compute_lanes].to_vec();
        let dedicated = self.transfer_lane.map(|t| self.lanes[t]);
        let mut lanes: Vec<Lane> = (0..compute.max(1)).map(|i| real[i % real.len()]).collect();
        let n = lanes.len();
        self.transfer_lane = transfer.then(|| {
            lanes.push(dedicated.unwrap_or(Lane {
                transfer: true,
                ..real[0]
            }));
            n
        });
        self.compute_lanes = n;
        self.lanes = lanes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::{Error, ErrorKind};

    #[test]
    fn strict_mode_fails_work_that_draws_validation_messages() {
        let required = std::env::var("HISPARSE_REQUIRE_DEVICE").is_ok_and(|v| v.trim() == "1");
        let ctx = match Context::open_with("", true, true, false) {
            Ok(c) => c,
            Err(e)
                if !required
                    && (e.kind() == ErrorKind::NotFound
                        || matches!(
                            e,
                            VulkanError::Vk {
                                result: vk::Result::ERROR_LAYER_NOT_PRESENT,
                                ..
                            }
                        )) =>
            {
                eprintln!("SKIPPED: no Vulkan device or validation layer: {e}");
                return;
            }
            Err(e) => panic!("open with the validation layer: {e}"),
        };
        let b = ctx.create_buffer(64, MemKind::Device).expect("buffer");
        let h = b.buffer;
        ctx.record(0, Engine::Copy, "test", |rec| {
            rec.zero(h, 0, 64);
            Ok(())
        })
        .expect("valid work passes");
        ctx.synchronize(0).expect("valid work completes");
        ctx.record(0, Engine::Compute, "test", |rec| {
            let bad = vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::SHADER_READ);
            // SAFETY: recording command buffer. The access masks deliberately do not match the
            // transfer stages: invalid usage the validation layer reports, and that drivers
            // ignore.
            unsafe {
                rec.ctx.device.cmd_pipeline_barrier(
                    rec.cmd(),
                    vk::PipelineStageFlags::TRANSFER,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::DependencyFlags::empty(),
                    &[bad],
                    &[],
                    &[],
                )
            };
            Ok(())
        })
        .and_then(|()| ctx.synchronize(0))
        .map(|()| panic!("strict mode did not report the invalid barrier"))
        .unwrap_or_else(|err| {
            assert!(matches!(err, VulkanError::Validation { messages } if messages > 0));
            assert_eq!(err.kind(), ErrorKind::Other);
        });
        ctx.retire(b);
        ctx.wait_all().expect("no new messages");
    }
}
