//! The raw Vulkan layer: instance and device creation, memory, pipelines, command recording and
//! submission. Every `unsafe` call of the backend lives in this module.
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

fn api_version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

fn c_name(bytes: &[std::ffi::c_char]) -> String {
    // The Vulkan spec guarantees NUL-terminated fixed arrays; fall back to the whole array.
    let bytes: Vec<u8> = bytes
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

struct Candidate {
    index: usize,
    pdev: vk::PhysicalDevice,
    name: String,
}

impl Context {
    /// Opens the device chosen by `selector` (see `VulkanDevice::open`); with `strict`, work
    /// after which the validation layer reported warnings or errors fails.
    pub fn open(selector: &str, strict: bool) -> Result<Context> {
        Self::open_with(selector, strict, false)
    }

    /// [`Context::open`], enabling the Khronos validation layer explicitly with `layer`.
    pub fn open_with(selector: &str, strict: bool, layer: bool) -> Result<Context> {
        let before = validation_message_count();
        let mut ctx = Self::open_inner(selector, layer)?;
        ctx.strict = strict;
        ctx.checked = AtomicUsize::new(before);
        ctx.check_validation()?;
        Ok(ctx)
    }

    /// In strict mode, an error when validation messages appeared since the last check.
    pub fn check_validation(&self) -> Result<()> {
        let now = validation_message_count();
        let before = self.checked.swap(now, Ordering::SeqCst);
        if self.strict && now > before {
            return Err(VulkanError::Validation {
                messages: now - before,
            });
        }
        Ok(())
    }

    fn open_inner(selector: &str, layer: bool) -> Result<Context> {
        // SAFETY: loading the system Vulkan loader runs its initialisers; this is the documented
        // way to use ash with run-time linking, and the library stays loaded inside `Entry`.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| VulkanError::LoaderNotFound(e.to_string()))?;
        // SAFETY: a global command with no handles; the entry is valid.
        let exts = unsafe { entry.enumerate_instance_extension_properties(None) }
            .map_err(VulkanError::vk("vkEnumerateInstanceExtensionProperties"))?;
        let validation = c"VK_LAYER_KHRONOS_validation";
        let layer_exts = if layer {
            // SAFETY: a global command with no handles; the layer name is NUL-terminated.
            unsafe { entry.enumerate_instance_extension_properties(Some(validation)) }
                .map_err(VulkanError::vk("vkEnumerateInstanceExtensionProperties"))?
        } else {
            Vec::new()
        };
        let has_debug = exts
            .iter()
            .chain(&layer_exts)
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::debug_utils::NAME));
        let layers = if layer {
            vec![validation.as_ptr()]
        } else {
            Vec::new()
        };
        let app_name = c"hisparse";
        let app = vk::ApplicationInfo::default()
            .application_name(app_name)
            .engine_name(app_name)
            .api_version(vk::API_VERSION_1_2);
        let mut ext_names = Vec::new();
        if has_debug {
            ext_names.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        let info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&ext_names);
        // SAFETY: `info` and everything it points to live until the call returns.
        let instance = unsafe { entry.create_instance(&info, None) }.map_err(|r| match r {
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => VulkanError::NoDevice(
                "the Vulkan loader found no driver (ICD) supporting Vulkan 1.2".into(),
            ),
            r => VulkanError::Vk {
                call: "vkCreateInstance",
                result: r,
            },
        })?;
        let debug = if has_debug {
            let du = ash::ext::debug_utils::Instance::new(&entry, &instance);
            let ci = vk::DebugUtilsMessengerCreateInfoEXT::default()
                .message_severity(
                    vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                        | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
                )
                .message_type(
                    vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                        | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                        | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
                )
                .pfn_user_callback(Some(debug_callback));
            // SAFETY: valid instance with VK_EXT_debug_utils enabled; the callback is a plain
            // function that stays valid for the program's life.
            match unsafe { du.create_debug_utils_messenger(&ci, None) } {
                Ok(m) => Some((du, m)),
                Err(_) => None,
            }
        } else {
            None
        };
        let destroy_instance =
            |debug: &Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>| {
                // SAFETY: the messenger and instance were created above and nothing else uses them.
                unsafe {
                    if let Some((du, m)) = debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
            };
        match Self::create_device(&entry, &instance, selector) {
            Ok(parts) => Self::finish(entry, instance, debug, parts),
            Err(e) => {
                destroy_instance(&debug);
                Err(e)
            }
        }
    }

    fn suitability(
        instance: &ash::Instance,
        pdev: vk::PhysicalDevice,
    ) -> core::result::Result<u32, String> {
        // SAFETY: `pdev` was enumerated from `instance`.
        let props = unsafe { instance.get_physical_device_properties(pdev) };
        if props.api_version < vk::API_VERSION_1_2 {
            return Err(format!(
                "Vulkan {} (1.2 needed)",
                api_version_string(props.api_version)
            ));
        }
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f12);
        // SAFETY: as above; the chain is a valid Vulkan 1.2 feature query.
        unsafe { instance.get_physical_device_features2(pdev, &mut f2) };
        if f12.timeline_semaphore == vk::FALSE {
            return Err("no timelineSemaphore feature".into());
        }
        let l = props.limits;
        if l.max_compute_work_group_invocations < 256 || l.max_compute_work_group_size[0] < 256 {
            return Err("compute workgroups of 256 invocations unsupported".into());
        }
        if l.max_per_stage_descriptor_storage_buffers < Shader::Resolve.bindings()
            || l.max_descriptor_set_storage_buffers < Shader::Resolve.bindings()
        {
            return Err(format!(
                "only {} storage buffers per stage ({} needed)",
                l.max_per_stage_descriptor_storage_buffers,
                Shader::Resolve.bindings()
            ));
        }
        if l.max_push_constants_size < 64 || l.max_compute_shared_memory_size < 8192 {
            return Err("push constants or shared memory too small".into());
        }
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pdev) };
        families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .map(|i| i as u32)
            .ok_or_else(|| "no compute queue".into())
    }

    #[allow(clippy::type_complexity)]
    fn create_device(
        _entry: &ash::Entry,
        instance: &ash::Instance,
        selector: &str,
    ) -> Result<(vk::PhysicalDevice, ash::Device, u32, String, bool)> {
        // SAFETY: valid instance.
        let pdevs = unsafe { instance.enumerate_physical_devices() }
            .map_err(VulkanError::vk("vkEnumeratePhysicalDevices"))?;
        if pdevs.is_empty() {
            return Err(VulkanError::NoDevice(
                "the Vulkan loader lists no physical device".into(),
            ));
        }
        let cands: Vec<Candidate> = pdevs
            .iter()
            .enumerate()
            .map(|(index, &pdev)| {
                // SAFETY: `pdev` was enumerated from `instance`.
                let props = unsafe { instance.get_physical_device_properties(pdev) };
                Candidate {
                    index,
                    pdev,
                    name: c_name(&props.device_name),
                }
            })
            .collect();
        let all: Vec<String> = cands
            .iter()
            .map(|c| format!("{}: {}", c.index, c.name))
            .collect();
        let sel = selector.trim();
        let matching: Vec<&Candidate> = if sel.is_empty() {
            cands.iter().collect()
        } else if let Ok(i) = sel.parse::<usize>() {
            cands.iter().filter(|c| c.index == i).collect()
        } else {
            let s = sel.to_lowercase();
            cands
                .iter()
                .filter(|c| c.name.to_lowercase().contains(&s))
                .collect()
        };
        if matching.is_empty() {
            return Err(VulkanError::NoDevice(format!(
                "no Vulkan device matches {sel:?} (devices: {})",
                all.join(", ")
            )));
        }
        let mut reasons = Vec::new();
        let mut chosen = None;
        for c in matching {
            match Self::suitability(instance, c.pdev) {
                Ok(qf) => {
                    chosen = Some((c, qf));
                    break;
                }
                Err(why) => reasons.push(format!("{}: {}: {why}", c.index, c.name)),
            }
        }
        let Some((cand, qf)) = chosen else {
            return Err(VulkanError::Unsupported(reasons.join("; ")));
        };
        // SAFETY: `cand.pdev` was enumerated from `instance`.
        let dev_exts = unsafe { instance.enumerate_device_extension_properties(cand.pdev) }
            .map_err(VulkanError::vk("vkEnumerateDeviceExtensionProperties"))?;
        let has_import = dev_exts
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::external_memory_host::NAME));
        let mut ext_names = Vec::new();
        if has_import {
            ext_names.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        let prio = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(qf)
            .queue_priorities(&prio)];
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&ext_names)
            .push_next(&mut f12);
        // SAFETY: `info` and its chain live until the call returns; the features and extensions
        // were checked above.
        let device = unsafe { instance.create_device(cand.pdev, &info, None) }
            .map_err(VulkanError::vk("vkCreateDevice"))?;
        Ok((cand.pdev, device, qf, cand.name.clone(), has_import))
    }

    fn finish(
        entry: ash::Entry,
        instance: ash::Instance,
        debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
        (pdev, device, queue_family, name, has_import): (
            vk::PhysicalDevice,
            ash::Device,
            u32,
            String,
            bool,
        ),
    ) -> Result<Context> {
        let mut host_props = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut driver);
        if has_import {
            props2 = props2.push_next(&mut host_props);
        }
        // SAFETY: valid physical device; the chained structs are supported (1.2 core / enabled
        // extension).
        unsafe { instance.get_physical_device_properties2(pdev, &mut props2) };
        let props = props2.properties;
        // SAFETY: as above.
        let mem = unsafe { instance.get_physical_device_memory_properties(pdev) };
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pdev) };
        let ts_bits = families[queue_family as usize].timestamp_valid_bits;
        // SAFETY: the queue family and index were requested at device creation.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        let max_range = u64::from(props.limits.max_storage_buffer_range);
        let window = 1u64 << (63 - max_range.min(1 << 31).leading_zeros());
        let limits = Limits {
            max_storage_range: max_range,
            window,
            max_storage_per_stage: props
                .limits
                .max_per_stage_descriptor_storage_buffers
                .min(props.limits.max_descriptor_set_storage_buffers),
            timestamp_period: (ts_bits > 0).then_some(f64::from(props.limits.timestamp_period)),
            import_alignment: has_import
                .then_some(host_props.min_imported_host_pointer_alignment.max(4096)),
        };
        let driver_name = c_name(&driver.driver_name);
        let full_name = if driver_name.is_empty() {
            name
        } else {
            format!(
                "{name} ({driver_name}, Vulkan {})",
                api_version_string(props.api_version)
            )
        };
        let host_import =
            has_import.then(|| ash::ext::external_memory_host::Device::new(&instance, &device));
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid device with the timelineSemaphore feature enabled.
        let timeline = unsafe { device.create_semaphore(&sem_info, None) };
        let timeline = match timeline {
            Ok(t) => t,
            Err(r) => {
                // SAFETY: nothing was created on the device yet.
                unsafe {
                    device.destroy_device(None);
                    if let Some((du, m)) = &debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                return Err(VulkanError::Vk {
                    call: "vkCreateSemaphore",
                    result: r,
                });
            }
        };
        let query_pool = if limits.timestamp_period.is_some() {
            let qi = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(2);
            // SAFETY: valid device; the pool is destroyed in `Drop`.
            unsafe { device.create_query_pool(&qi, None) }.ok()
        } else {
            None
        };
        let limits = Limits {
            timestamp_period: query_pool.and(limits.timestamp_period),
            ..limits
        };
        Ok(Context {
            _entry: entry,
            instance,
            debug,
            device,
            host_import,
            queue,
            queue_family,
            mem,
            name: full_name,
            limits,
            timeline,
            query_pool,
            state: Mutex::new(State {
                last: 0,
                batch: None,
                free: Vec::new(),
                inflight: VecDeque::new(),
                garbage: Vec::new(),
                pipelines: (0..Shader::ALL.len()).map(|_| None).collect(),
                scratch: None,
            }),
            strict: false,
            checked: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent handles; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn memory_type(&self, bits: u32, want: &[vk::MemoryPropertyFlags]) -> Option<u32> {
        for &flags in want {
            for i in 0..self.mem.memory_type_count {
                let t = self.mem.memory_types[i as usize];
                if bits & (1 << i) != 0 && t.property_flags.contains(flags) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Creates a buffer of at least `len` bytes (rounded up to 16, at least 16) in `kind` memory.
    /// Host-accessible kinds are zeroed; device memory is zeroed by the caller on the queue.
    pub fn create_buffer(&self, len: u64, kind: MemKind) -> Result<RawBuffer> {
        let size = len.max(16).div_ceil(16) * 16;
        if kind == MemKind::Pinned
            && let Some(align) = self.limits.import_alignment
            && let Some(b) = self.import_host(size, align)?
        {
            return Ok(b);
        }
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid device and create info.
        let buffer = unsafe { self.device.create_buffer(&info, None) }
            .map_err(VulkanError::vk("vkCreateBuffer"))?;
        // SAFETY: `buffer` was just created on this device.
        let req = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        use vk::MemoryPropertyFlags as F;
        let want: &[F] = match kind {
            MemKind::Device => &[F::DEVICE_LOCAL, F::empty()],
            MemKind::Pinned | MemKind::Staging => &[
                F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
                F::HOST_VISIBLE | F::HOST_COHERENT,
            ],
            MemKind::Arena => &[
                F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT,
                F::HOST_VISIBLE | F::HOST_COHERENT,
            ],
        };
        let destroy = |e: VulkanError| {
            // SAFETY: the buffer is unused and owned here.
            unsafe { self.device.destroy_buffer(buffer, None) };
            e
        };
        let Some(type_index) = self.memory_type(req.memory_type_bits, want) else {
            return Err(destroy(VulkanError::Unsupported(format!(
                "no memory type for {kind:?} buffers"
            ))));
        };
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(type_index);
        // SAFETY: valid allocate info for this device.
        let memory = unsafe { self.device.allocate_memory(&alloc, None) }.map_err(|r| {
            destroy(VulkanError::Vk {
                call: "vkAllocateMemory",
                result: r,
            })
        })?;
        let free = |e: VulkanError| {
            // SAFETY: memory and buffer are unused and owned here.
            unsafe {
                self.device.destroy_buffer(buffer, None);
                self.device.free_memory(memory, None);
            }
            e
        };
        // SAFETY: the memory type matches the buffer's requirements and the memory is unbound.
        unsafe { self.device.bind_buffer_memory(buffer, memory, 0) }.map_err(|r| {
            free(VulkanError::Vk {
                call: "vkBindBufferMemory",
                result: r,
            })
        })?;
        let mut ptr = std::ptr::null_mut();
        if kind != MemKind::Device {
            // SAFETY: host-visible memory, mapped once for the buffer's life.
            let p = unsafe {
                self.device
                    .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .map_err(|r| {
                free(VulkanError::Vk {
                    call: "vkMapMemory",
                    result: r,
                })
            })?;
            ptr = p.cast::<u8>();
            // SAFETY: the mapping covers at least `size` bytes (the allocation holds the buffer).
            unsafe { std::ptr::write_bytes(ptr, 0, size as usize) };
        }
        Ok(RawBuffer {
            buffer,
            memory,
            size,
            ptr,
            host: None,
            imported: false,
        })
    }

    /// Imports a fresh zeroed page-aligned host allocation; `Ok(None)` when the driver refuses
    /// (the caller falls back to host-visible memory).
    fn import_host(&self, size: u64, align: u64) -> Result<Option<RawBuffer>> {
        let Some(ext) = &self.host_import else {
            return Ok(None);
        };
        let bytes = size.div_ceil(align) * align;
        let Ok(layout) = Layout::from_size_align(bytes as usize, align as usize) else {
            return Err(VulkanError::HostAllocation {
                bytes: bytes as usize,
            });
        };
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(VulkanError::HostAllocation {
                bytes: bytes as usize,
            });
        }
        let host = HostAlloc { ptr, layout };
        let dealloc = |h: &HostAlloc| {
            // SAFETY: allocated above with this layout and not imported (or already released).
            unsafe { std::alloc::dealloc(h.ptr, h.layout) };
        };
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut hp = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: `ptr` is a live allocation aligned to the import alignment; the function
        // pointer was loaded for this device with the extension enabled.
        let r = unsafe {
            (ext.fp().get_memory_host_pointer_properties_ext)(
                self.device.handle(),
                handle,
                ptr.cast_const().cast(),
                &mut hp,
            )
        };
        if r != vk::Result::SUCCESS {
            dealloc(&host);
            return Ok(None);
        }
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let info = vk::BufferCreateInfo::default()
            .size(bytes)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut ext_info);
        // SAFETY: valid device and create info.
        let buffer = match unsafe { self.device.create_buffer(&info, None) } {
            Ok(b) => b,
            Err(_) => {
                dealloc(&host);
                return Ok(None);
            }
        };
        // SAFETY: `buffer` was just created on this device.
        let req = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        use vk::MemoryPropertyFlags as F;
        let Some(type_index) = self.memory_type(
            req.memory_type_bits & hp.memory_type_bits,
            &[F::HOST_VISIBLE | F::HOST_COHERENT, F::HOST_COHERENT],
        ) else {
            // SAFETY: unused buffer owned here.
            unsafe { self.device.destroy_buffer(buffer, None) };
            dealloc(&host);
            return Ok(None);
        };
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(handle)
            .host_pointer(ptr.cast());
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(bytes)
            .memory_type_index(type_index)
            .push_next(&mut import);
        // SAFETY: the host range [ptr, ptr + bytes) stays allocated until the memory is freed
        // (`destroy_buffer` frees the Vulkan memory before deallocating).
        let memory = match unsafe { self.device.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(_) => {
                // SAFETY: unused buffer owned here.
                unsafe { self.device.destroy_buffer(buffer, None) };
                dealloc(&host);
                return Ok(None);
            }
        };
        // SAFETY: compatible memory type, unbound memory of the full buffer size.
        if unsafe { self.device.bind_buffer_memory(buffer, memory, 0) }.is_err() {
            // SAFETY: unused objects owned here; memory freed before the host range.
            unsafe {
                self.device.destroy_buffer(buffer, None);
                self.device.free_memory(memory, None);
            }
            dealloc(&host);
            return Ok(None);
        }
        Ok(Some(RawBuffer {
            buffer,
            memory,
            size: bytes,
            ptr,
            host: Some(host),
            imported: true,
        }))
    }

    /// Destroys a buffer no submitted work uses any more.
    fn destroy_now(&self, b: RawBuffer) {
        // SAFETY: the caller guarantees no pending work references the buffer; the memory is
        // freed before the imported host range is released.
        unsafe {
            self.device.destroy_buffer(b.buffer, None);
            self.device.free_memory(b.memory, None);
            if let Some(h) = &b.host {
                std::alloc::dealloc(h.ptr, h.layout);
            }
        }
    }

    /// Releases a buffer once all work submitted (or being recorded) so far has completed.
    pub fn retire(&self, b: RawBuffer) {
        let mut st = self.lock();
        let threshold = st.last + u64::from(st.batch.is_some());
        if threshold <= self.completed() {
            drop(st);
            self.destroy_now(b);
        } else {
            st.garbage.push((threshold, b));
        }
    }

    /// The last timeline value submitted.
    pub fn last_submitted(&self) -> u64 {
        self.lock().last
    }

    fn completed(&self) -> u64 {
        // SAFETY: valid timeline semaphore of this device.
        unsafe { self.device.get_semaphore_counter_value(self.timeline) }.unwrap_or(0)
    }

    /// Recycles finished submissions and destroys garbage whose work has completed.
    fn reclaim(&self, st: &mut State) {
        let done = self.completed();
        while st.inflight.front().is_some_and(|s| s.value <= done) {
            let Some(mut s) = st.inflight.pop_front() else {
                break;
            };
            for b in s.retired.drain(..) {
                self.destroy_now(b);
            }
            // SAFETY: the submission's work has completed, so its pools are idle.
            unsafe {
                let _ = self
                    .device
                    .reset_command_pool(s.pool, vk::CommandPoolResetFlags::empty());
                for &p in &s.desc_pools {
                    let _ = self
                        .device
                        .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty());
                }
            }
            s.desc_pool_at = 0;
            s.arena_used = 0;
            st.free.push(s);
        }
        let mut i = 0;
        while i < st.garbage.len() {
            if st.garbage[i].0 <= done {
                let (_, b) = st.garbage.swap_remove(i);
                self.destroy_now(b);
            } else {
                i += 1;
            }
        }
    }

    fn new_submission(&self) -> Result<Submission> {
        let pi = vk::CommandPoolCreateInfo::default().queue_family_index(self.queue_family);
        // SAFETY: valid device and queue family.
        let pool = unsafe { self.device.create_command_pool(&pi, None) }
            .map_err(VulkanError::vk("vkCreateCommandPool"))?;
        let ai = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: `pool` was just created.
        let cmd = match unsafe { self.device.allocate_command_buffers(&ai) } {
            Ok(c) => c[0],
            Err(r) => {
                // SAFETY: unused pool.
                unsafe { self.device.destroy_command_pool(pool, None) };
                return Err(VulkanError::Vk {
                    call: "vkAllocateCommandBuffers",
                    result: r,
                });
            }
        };
        Ok(Submission {
            pool,
            cmd,
            desc_pools: Vec::new(),
            desc_pool_at: 0,
            arena: None,
            arena_used: 0,
            retired: Vec::new(),
            value: 0,
        })
    }

    fn begin(&self, st: &mut State) -> Result<Submission> {
        self.reclaim(st);
        let sub = match st.free.pop() {
            Some(s) => s,
            None => self.new_submission()?,
        };
        let bi = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the command buffer's pool was reset (or is new); nothing else records into it.
        if let Err(r) = unsafe { self.device.begin_command_buffer(sub.cmd, &bi) } {
            st.free.push(sub);
            return Err(VulkanError::Vk {
                call: "vkBeginCommandBuffer",
                result: r,
            });
        }
        Ok(sub)
    }

    fn submit(&self, st: &mut State, mut sub: Submission) -> Result<()> {
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ | vk::AccessFlags::HOST_WRITE);
        // SAFETY: `sub.cmd` is in the recording state; the barrier makes device writes visible
        // to the host once the timeline value is reached.
        let ended = unsafe {
            self.device.cmd_pipeline_barrier(
                sub.cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
            self.device.end_command_buffer(sub.cmd)
        };
        if let Err(r) = ended {
            self.abandon(st, sub);
            return Err(VulkanError::Vk {
                call: "vkEndCommandBuffer",
                result: r,
            });
        }
        let value = st.last + 1;
        let values = [value];
        let sems = [self.timeline];
        let cmds = [sub.cmd];
        let mut ti = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let si = vk::SubmitInfo::default()
            .command_buffers(&cmds)
            .signal_semaphores(&sems)
            .push_next(&mut ti);
        // SAFETY: the queue is externally synchronised by `state`'s lock (held by the caller);
        // the command buffer is executable and every resource it uses stays alive until the
        // timeline reaches `value` (buffers are retired against the timeline).
        let r = unsafe {
            self.device
                .queue_submit(self.queue, &[si], vk::Fence::null())
        };
        if let Err(r) = r {
            self.abandon(st, sub);
            return Err(VulkanError::Vk {
                call: "vkQueueSubmit",
                result: r,
            });
        }
        st.last = value;
        sub.value = value;
        st.inflight.push_back(sub);
        Ok(())
    }

    /// Drops a submission that could not be submitted (waits for the device so its resources
    /// are idle before reuse).
    fn abandon(&self, st: &mut State, mut sub: Submission) {
        // SAFETY: valid device; waiting makes every pool idle.
        unsafe {
            let _ = self.device.device_wait_idle();
            let _ = self
                .device
                .reset_command_pool(sub.pool, vk::CommandPoolResetFlags::empty());
        }
        for b in sub.retired.drain(..) {
            self.destroy_now(b);
        }
        sub.value = 0;
        sub.arena_used = 0;
        sub.desc_pool_at = 0;
        st.free.push(sub);
    }

    /// Records work with `f`: into the open batch, or into a fresh command buffer submitted when
    /// `f` returns (also when it fails after recording, so the queue stays consistent).
    pub fn record<R>(&self, f: impl FnOnce(&mut Rec<'_>) -> Result<R>) -> Result<R> {
        let mut st = self.lock();
        if let Some(mut sub) = st.batch.take() {
            let r = {
                let mut rec = Rec {
                    ctx: self,
                    st: &mut st,
                    sub: &mut sub,
                };
                f(&mut rec)
            };
            st.batch = Some(sub);
            return r;
        }
        let mut sub = self.begin(&mut st)?;
        let r = {
            let mut rec = Rec {
                ctx: self,
                st: &mut st,
                sub: &mut sub,
            };
            f(&mut rec)
        };
        let s = self.submit(&mut st, sub);
        drop(st);
        let v = r?;
        s?;
        self.check_validation()?;
        Ok(v)
    }

    /// Submits the open batch, if any, and blocks until every submitted command has completed.
    pub fn wait_idle(&self) -> Result<()> {
        let mut st = self.lock();
        if let Some(sub) = st.batch.take() {
            self.submit(&mut st, sub)?;
        }
        let last = st.last;
        drop(st);
        let sems = [self.timeline];
        let values = [last];
        let wi = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        // SAFETY: valid timeline semaphore; waiting needs no external synchronisation.
        unsafe { self.device.wait_semaphores(&wi, u64::MAX) }
            .map_err(VulkanError::vk("vkWaitSemaphores"))?;
        let mut st = self.lock();
        self.reclaim(&mut st);
        drop(st);
        self.check_validation()
    }

    /// Opens a batch: later `record` calls append to one command buffer until `end_batch`.
    /// With `timestamp`, the batch starts by writing timestamp query 0.
    pub fn begin_batch(&self, timestamp: bool) -> Result<()> {
        self.wait_idle()?;
        let mut st = self.lock();
        let mut sub = self.begin(&mut st)?;
        if timestamp && let Some(pool) = self.query_pool {
            let mut rec = Rec {
                ctx: self,
                st: &mut st,
                sub: &mut sub,
            };
            rec.barrier();
            // SAFETY: recording command buffer; the pool has 2 queries.
            unsafe {
                self.device.cmd_reset_query_pool(sub.cmd, pool, 0, 2);
                self.device.cmd_write_timestamp(
                    sub.cmd,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    pool,
                    0,
                );
            }
        }
        st.batch = Some(sub);
        Ok(())
    }

    /// Ends the batch (writing timestamp 1 when asked), submits it and waits; returns the
    /// nanoseconds between the two timestamps when both were written.
    pub fn end_batch(&self, timestamp: bool) -> Result<Option<f64>> {
        if timestamp && let Some(pool) = self.query_pool {
            self.record(|rec| {
                rec.barrier();
                // SAFETY: recording command buffer; query 1 of the pool was reset at the
                // batch's start.
                unsafe {
                    rec.ctx.device.cmd_write_timestamp(
                        rec.sub.cmd,
                        vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                        pool,
                        1,
                    )
                };
                Ok(())
            })?;
        }
        self.wait_idle()?;
        let (Some(pool), Some(period), true) =
            (self.query_pool, self.limits.timestamp_period, timestamp)
        else {
            return Ok(None);
        };
        let mut ticks = [0u64; 2];
        // SAFETY: both queries were written by completed work (waited above).
        unsafe {
            self.device.get_query_pool_results(
                pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(VulkanError::vk("vkGetQueryPoolResults"))?;
        Ok(Some(ticks[1].wrapping_sub(ticks[0]) as f64 * period))
    }

    fn pipeline(
        &self,
        st: &mut State,
        shader: Shader,
    ) -> Result<(vk::PipelineLayout, vk::Pipeline, vk::DescriptorSetLayout)> {
        if let Some(p) = &st.pipelines[shader.index()] {
            return Ok((p.layout, p.pipeline, p.set_layout));
        }
        let n = shader.bindings();
        if n > self.limits.max_storage_per_stage {
            return Err(VulkanError::Unsupported(format!(
                "{} needs {n} storage buffers per stage; the device allows {}",
                shader.name(),
                self.limits.max_storage_per_stage
            )));
        }
        let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..n)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let li = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: valid device and create info.
        let set_layout = unsafe { self.device.create_descriptor_set_layout(&li, None) }
            .map_err(VulkanError::vk("vkCreateDescriptorSetLayout"))?;
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(shader.push_bytes())];
        let layouts = [set_layout];
        let pli = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&layouts)
            .push_constant_ranges(&ranges);
        // SAFETY: valid device and create info.
        let layout = match unsafe { self.device.create_pipeline_layout(&pli, None) } {
            Ok(l) => l,
            Err(r) => {
                // SAFETY: unused layout.
                unsafe { self.device.destroy_descriptor_set_layout(set_layout, None) };
                return Err(VulkanError::Vk {
                    call: "vkCreatePipelineLayout",
                    result: r,
                });
            }
        };
        let cleanup = || {
            // SAFETY: unused layouts owned here.
            unsafe {
                self.device.destroy_pipeline_layout(layout, None);
                self.device.destroy_descriptor_set_layout(set_layout, None);
            }
        };
        let words = match ash::util::read_spv(&mut std::io::Cursor::new(shader.spirv())) {
            Ok(w) => w,
            Err(e) => {
                cleanup();
                return Err(VulkanError::Unsupported(format!(
                    "embedded SPIR-V of {} unreadable: {e}",
                    shader.name()
                )));
            }
        };
        let mi = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: valid SPIR-V produced and validated at build time.
        let module = match unsafe { self.device.create_shader_module(&mi, None) } {
            Ok(m) => m,
            Err(r) => {
                cleanup();
                return Err(VulkanError::Vk {
                    call: "vkCreateShaderModule",
                    result: r,
                });
            }
        };
        let entry = CString::new("main").unwrap_or_default();
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(entry.as_c_str());
        let ci = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)];
        // SAFETY: valid module, layout and entry point name.
        let created = unsafe {
            self.device
                .create_compute_pipelines(vk::PipelineCache::null(), &ci, None)
        };
        // SAFETY: the module is no longer needed once the pipeline is created (or failed).
        unsafe { self.device.destroy_shader_module(module, None) };
        let pipeline = match created {
            Ok(p) => p[0],
            Err((_, r)) => {
                cleanup();
                return Err(VulkanError::Vk {
                    call: "vkCreateComputePipelines",
                    result: r,
                });
            }
        };
        st.pipelines[shader.index()] = Some(Pipeline {
            set_layout,
            layout,
            pipeline,
        });
        Ok((layout, pipeline, set_layout))
    }
}

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

/// A command buffer being recorded.
pub struct Rec<'a> {
    ctx: &'a Context,
    st: &'a mut State,
    sub: &'a mut Submission,
}

impl Rec<'_> {
    /// A full memory barrier: every earlier command (of this and earlier submissions) completes
    /// and its writes become visible before any later command starts.
    pub fn barrier(&mut self) {
        let b = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE);
        // SAFETY: recording command buffer.
        unsafe {
            self.ctx.device.cmd_pipeline_barrier(
                self.sub.cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[b],
                &[],
                &[],
            )
        };
    }

    /// Fills `size` bytes (a multiple of 4) of `buffer` from `offset` with zeros.
    pub fn zero(&mut self, buffer: vk::Buffer, offset: u64, size: u64) {
        if size == 0 {
            return;
        }
        self.barrier();
        // SAFETY: recording command buffer; the range lies in the buffer (caller).
        unsafe {
            self.ctx
                .device
                .cmd_fill_buffer(self.sub.cmd, buffer, offset, size, 0)
        };
    }

    /// Copies regions between buffers (after a barrier). The regions must not overlap each
    /// other's destinations, nor (for one buffer) each other's sources.
    pub fn copy(&mut self, src: vk::Buffer, dst: vk::Buffer, regions: &[vk::BufferCopy]) {
        if regions.is_empty() {
            return;
        }
        self.barrier();
        // SAFETY: recording command buffer; regions lie inside the buffers (checked by the ops)
        // and do not overlap (caller).
        unsafe {
            self.ctx
                .device
                .cmd_copy_buffer(self.sub.cmd, src, dst, regions)
        };
    }

    /// Takes the device's scratch buffer, grown to at least `bytes`.
    pub fn scratch(&mut self, bytes: u64) -> Result<vk::Buffer> {
        if let Some(s) = &self.st.scratch
            && s.size >= bytes
        {
            return Ok(s.buffer);
        }
        let b = self
            .ctx
            .create_buffer(bytes.max(1 << 16), MemKind::Device)?;
        let handle = b.buffer;
        if let Some(old) = self.st.scratch.replace(b) {
            self.sub.retired.push(old);
        }
        Ok(handle)
    }

    /// Copies `words` into this submission's parameter arena; returns their binding.
    pub fn params(&mut self, words: &[u32]) -> Result<Binding> {
        let bytes = (words.len() as u64 * 4).max(16);
        let need = self.sub.arena_used + bytes;
        if self.sub.arena.as_ref().is_none_or(|a| a.size < need) {
            let size = need.max(64 << 10).next_power_of_two();
            let fresh = self.ctx.create_buffer(size, MemKind::Arena)?;
            if let Some(old) = self.sub.arena.replace(fresh) {
                if self.sub.arena_used > 0 {
                    self.sub.retired.push(old);
                } else {
                    self.ctx.destroy_now(old);
                }
            }
            self.sub.arena_used = 0;
        }
        let Some(arena) = &self.sub.arena else {
            return Err(VulkanError::Unsupported("no parameter arena".into()));
        };
        let offset = self.sub.arena_used;
        // SAFETY: the arena is mapped host-coherent memory of `arena.size ≥ offset + bytes`
        // bytes that no submitted work reads (this submission is still being recorded).
        unsafe {
            std::ptr::copy_nonoverlapping(
                words.as_ptr().cast::<u8>(),
                arena.ptr.add(offset as usize),
                words.len() * 4,
            )
        };
        self.sub.arena_used = (offset + bytes).div_ceil(256) * 256;
        Ok(Binding {
            buffer: arena.buffer,
            offset,
            range: bytes,
        })
    }

    fn descriptor_set(&mut self, set_layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        loop {
            if self.sub.desc_pool_at == self.sub.desc_pools.len() {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(64 * 40)];
                let pi = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(64)
                    .pool_sizes(&sizes);
                // SAFETY: valid device and create info.
                let pool = unsafe { self.ctx.device.create_descriptor_pool(&pi, None) }
                    .map_err(VulkanError::vk("vkCreateDescriptorPool"))?;
                self.sub.desc_pools.push(pool);
            }
            let pool = self.sub.desc_pools[self.sub.desc_pool_at];
            let layouts = [set_layout];
            let ai = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts);
            // SAFETY: the pool belongs to this submission, which only this recorder uses.
            match unsafe { self.ctx.device.allocate_descriptor_sets(&ai) } {
                Ok(s) => return Ok(s[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {
                    self.sub.desc_pool_at += 1;
                }
                Err(r) => {
                    return Err(VulkanError::Vk {
                        call: "vkAllocateDescriptorSets",
                        result: r,
                    });
                }
            }
        }
    }

    /// Dispatches `shader` over `groups` workgroups (split over x and y) after a barrier.
    pub fn dispatch(
        &mut self,
        shader: Shader,
        bindings: &[Binding],
        push: &[u32],
        groups: u64,
    ) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        let (layout, pipeline, set_layout) = self.ctx.pipeline(self.st, shader)?;
        debug_assert_eq!(bindings.len() as u32, shader.bindings());
        debug_assert_eq!(push.len() as u32 * 4, shader.push_bytes());
        for b in bindings {
            if b.range > self.ctx.limits.max_storage_range {
                return Err(VulkanError::Unsupported(format!(
                    "{}: a binding of {} bytes exceeds maxStorageBufferRange ({})",
                    shader.name(),
                    b.range,
                    self.ctx.limits.max_storage_range
                )));
            }
        }
        let x = groups.min(65535);
        let y = groups.div_ceil(x);
        if y > 65535 {
            return Err(VulkanError::Unsupported(format!(
                "{}: {groups} workgroups exceed one dispatch",
                shader.name()
            )));
        }
        let set = self.descriptor_set(set_layout)?;
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bindings
            .iter()
            .map(|b| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(b.buffer)
                    .offset(b.offset)
                    .range(b.range)]
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        let push_bytes: Vec<u8> = push.iter().flat_map(|w| w.to_ne_bytes()).collect();
        self.barrier();
        // SAFETY: the set was allocated from this submission's pool and is not in use; the
        // command buffer is recording; bindings, push constants and group counts were checked
        // against the pipeline's layout and the device limits above.
        unsafe {
            self.ctx.device.update_descriptor_sets(&writes, &[]);
            let d = &self.ctx.device;
            d.cmd_bind_pipeline(self.sub.cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_bind_descriptor_sets(
                self.sub.cmd,
                vk::PipelineBindPoint::COMPUTE,
                layout,
                0,
                &[set],
                &[],
            );
            d.cmd_push_constants(
                self.sub.cmd,
                layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &push_bytes,
            );
            d.cmd_dispatch(self.sub.cmd, x as u32, y as u32, 1);
        }
        Ok(())
    }
}

/// Reads `dst.len()` bytes at `offset` of a host-accessible buffer.
pub fn read_host(b: &RawBuffer, offset: usize, dst: &mut [u8]) {
    assert!(
        !b.ptr.is_null() && offset + dst.len() <= b.size as usize,
        "host read out of bounds"
    );
    // SAFETY: `ptr` addresses `size` bytes of live host-accessible memory (checked above); the
    // caller waited for all device work, so nothing writes concurrently.
    unsafe { std::ptr::copy_nonoverlapping(b.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
}

/// Writes `src` at `offset` of a host-accessible buffer.
pub fn write_host(b: &mut RawBuffer, offset: usize, src: &[u8]) {
    assert!(
        !b.ptr.is_null() && offset + src.len() <= b.size as usize,
        "host write out of bounds"
    );
    // SAFETY: as in `read_host`; `&mut` excludes other host accesses.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr.add(offset), src.len()) };
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
