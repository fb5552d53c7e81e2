//! The raw Vulkan layer: instance and device creation, memory, pipelines, command recording and
//! submission. Every `unsafe` call of the backend lives in this module and its submodules:
//! `device` (instance, device selection, validation messenger), `memory` (buffers, host import),
//! `submit` (timeline submission, batches, deferred destruction) and `record` (pipelines and the
//! command recorder).
//!
//! Execution model: one compute queue and one timeline semaphore per device. Every submission
//! signals the next timeline value, and every recorded command is preceded by a full memory
//! barrier, so all work executes in submission order (stronger than the per-stream order the
//! `Device` trait asks for). Resources released while work may still use them are destroyed once
//! the timeline passes the last value that could reference them.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::ffi::{CString, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use ash::vk;

use crate::error::VulkanError;
use crate::shaders::Shader;

mod device;
mod memory;
mod record;
mod submit;

pub use memory::{read_host, write_host};
pub use record::Rec;

type Result<T> = core::result::Result<T, VulkanError>;

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
    /// Storage buffer descriptors per stage.
    pub max_storage_per_stage: u32,
    /// Nanoseconds per timestamp tick, or `None` without timestamp support.
    pub timestamp_period: Option<f64>,
    /// Alignment of imported host pointers, when host import is available.
    pub import_alignment: Option<u64>,
}

struct Pipeline {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

struct Submission {
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    desc_pools: Vec<vk::DescriptorPool>,
    desc_pool_at: usize,
    arena: Option<RawBuffer>,
    arena_used: u64,
    retired: Vec<RawBuffer>,
    value: u64,
}

struct State {
    /// Last timeline value submitted.
    last: u64,
    /// An open command buffer that ops append to instead of submitting (timed batches).
    batch: Option<Submission>,
    free: Vec<Submission>,
    inflight: VecDeque<Submission>,
    garbage: Vec<(u64, RawBuffer)>,
    pipelines: Vec<Option<Pipeline>>,
    scratch: Option<RawBuffer>,
}

/// A Vulkan instance, device and queue with everything the backend submits through.
pub struct Context {
    _entry: ash::Entry,
    instance: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    device: ash::Device,
    host_import: Option<ash::ext::external_memory_host::Device>,
    queue: vk::Queue,
    queue_family: u32,
    mem: vk::PhysicalDeviceMemoryProperties,
    /// Device name and driver, for reports.
    pub name: String,
    /// Planning limits.
    pub limits: Limits,
    timeline: vk::Semaphore,
    query_pool: Option<vk::QueryPool>,
    state: Mutex<State>,
    /// Fail operations after which validation messages appeared.
    pub strict: bool,
    /// Process-wide message count already reported.
    checked: AtomicUsize,
}

// SAFETY: `ash::Instance`/`ash::Device` are function tables plus handles; Vulkan objects are used
// from several threads only under `state`'s mutex (the queue, command pools and descriptor pools)
// or are immutable after creation.
unsafe impl Send for Context {}
// SAFETY: see `Send`: all externally synchronised objects are reached through `state`.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = self.wait_idle();
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut bufs: Vec<RawBuffer> = Vec::new();
        let mut subs: Vec<Submission> = st.free.drain(..).collect();
        subs.extend(st.inflight.drain(..));
        subs.extend(st.batch.take());
        bufs.extend(st.garbage.drain(..).map(|(_, b)| b));
        bufs.extend(st.scratch.take());
        let pipes: Vec<Pipeline> = st.pipelines.iter_mut().filter_map(Option::take).collect();
        for s in &mut subs {
            bufs.append(&mut s.retired);
            bufs.extend(s.arena.take());
        }
        for b in bufs {
            self.destroy_now(b);
        }
        // SAFETY: the device is idle (waited above) and every object below was created from
        // it and is destroyed exactly once, children before the device and instance.
        unsafe {
            let _ = self.device.device_wait_idle();
            for s in subs {
                for p in s.desc_pools {
                    self.device.destroy_descriptor_pool(p, None);
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
            self.device.destroy_semaphore(self.timeline, None);
            self.device.destroy_device(None);
            if let Some((du, m)) = &self.debug {
                du.destroy_debug_utils_messenger(*m, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

/// Bytes of RAM the OS reports available (`MemAvailable`), or `None` when unknown.
pub fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::{Error, ErrorKind};

    #[test]
    fn strict_mode_fails_work_that_draws_validation_messages() {
        let required = std::env::var("HISPARSE_REQUIRE_DEVICE").is_ok_and(|v| v.trim() == "1");
        let ctx = match Context::open_with("", true, true) {
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
        ctx.record(|rec| {
            rec.zero(h, 0, 64);
            Ok(())
        })
        .expect("valid work passes");
        let err = ctx
            .record(|rec| {
                let bad = vk::MemoryBarrier::default()
                    .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                    .dst_access_mask(vk::AccessFlags::SHADER_READ);
                // SAFETY: recording command buffer. The access masks deliberately do not match
                // the transfer stages: invalid usage the validation layer reports, and that
                // drivers ignore.
                unsafe {
                    rec.ctx.device.cmd_pipeline_barrier(
                        rec.sub.cmd,
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
            .expect_err("strict mode reports the message");
        assert!(matches!(err, VulkanError::Validation { messages } if messages > 0));
        assert_eq!(err.kind(), ErrorKind::Other);
        ctx.retire(b);
        ctx.wait_idle().expect("no new messages");
    }
}
