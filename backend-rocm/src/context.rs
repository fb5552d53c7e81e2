//! The opened device: the runtime, the ordinal, and the loaded kernel module.

use std::ffi::{CString, c_int, c_void};
use std::sync::Mutex;

use crate::error::RocmError;
use crate::ffi::{HIP_SUCCESS, Handle, Hip, HipStatus, Rtc};
use crate::kernels::{self, KernelSource};
use hisparse_gpu_kernels::Kernel;

/// State shared by the device and every object it hands out (buffers free through it).
pub(crate) struct Context {
    pub(crate) hip: Hip,
    pub(crate) ordinal: c_int,
    pub(crate) arch: String,
    pub(crate) name: String,
    pub(crate) source: KernelSource,
    /// `hipRuntimeGetVersion`, 0 when unknown.
    pub(crate) runtime_version: i32,
    pub(crate) shared_mem_per_block: usize,
    /// Shared memory of one compute unit (the per-block figure when the runtime reports none).
    pub(crate) shared_mem_per_multiprocessor: usize,
    pub(crate) total_global_mem: usize,
    pub(crate) multiprocessors: u32,
    /// Resolver blocks one compute unit runs at once by registers and threads, from the loaded
    /// kernels (`Target::resolve_blocks_per_multiprocessor`).
    pub(crate) resolve_blocks_per_multiprocessor: u32,
    /// PCI address of the device (`domain:bus:device.0`).
    pub(crate) pci_bus_id: String,
    /// Whether the device reaches registered host memory at its host address.
    pub(crate) host_pointer_registration: bool,
    /// Pinned staging buffers for host-side lists read by kernels (page pairs, spans, layouts).
    staging: Mutex<Vec<Staging>>,
    module: Handle,
    /// One function per entry of [`kernels::KERNELS`], in the same order.
    functions: Vec<Handle>,
}

// SAFETY: the module and function handles are immutable after loading and HIP allows launching
// them from any thread; `Hip` is itself Send + Sync.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal)
            .field("arch", &self.arch)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Makes this device current on the calling thread (HIP's current device is per thread).
    pub(crate) fn bind(&self) -> Result<(), RocmError> {
        self.check("hipSetDevice", self.hip.set_device(self.ordinal))
    }

    /// [`Context::bind`] for destructors, which cannot report errors.
    pub(crate) fn bind_quietly(&self) {
        let _ = self.hip.set_device(self.ordinal);
    }

    /// Runs `f` with the calling thread in relaxed stream-capture mode, then restores the
    /// thread's mode: while a stream is being captured in global mode (`torch.cuda.graph` on
    /// ROCm), allocations and synchronisations of other streams are refused unless the calling
    /// thread is relaxed (PyTorch's allocator does the same). `f` must not touch a stream being
    /// captured.
    pub(crate) fn relaxed_capture<T>(
        &self,
        f: impl FnOnce() -> Result<T, RocmError>,
    ) -> Result<T, RocmError> {
        let mut mode = crate::ffi::CAPTURE_MODE_RELAXED;
        self.check(
            "hipThreadExchangeStreamCaptureMode",
            self.hip.exchange_capture_mode(&mut mode),
        )?;
        let result = f();
        // `mode` now holds the thread's previous mode: put it back.
        let restored = self.check(
            "hipThreadExchangeStreamCaptureMode",
            self.hip.exchange_capture_mode(&mut mode),
        );
        let value = result?;
        restored.map(|()| value)
    }

    /// Turns a HIP status into a result.
    pub(crate) fn check(&self, call: &'static str, status: HipStatus) -> Result<(), RocmError> {
        if status == HIP_SUCCESS {
            Ok(())
        } else {
            Err(RocmError::hip(&self.hip, call, status))
        }
    }

    /// The loaded function of kernel `index` in [`kernels::KERNELS`].
    pub(crate) fn function(&self, index: usize) -> Handle {
        self.functions[index]
    }

    /// Opens device `ordinal`: loads the runtime, checks the device, loads the kernels.
    pub(crate) fn open(ordinal: usize) -> Result<Context, RocmError> {
        let hip = Hip::load().map_err(RocmError::RuntimeNotFound)?;
        let status = hip.init();
        if status != HIP_SUCCESS {
            return Err(RocmError::hip(&hip, "hipInit", status));
        }
        let count = hip
            .device_count()
            .map_err(|s| RocmError::hip(&hip, "hipGetDeviceCount", s))?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(RocmError::NoDevice { ordinal, count });
        }
        let ordinal = ordinal as c_int;
        let status = hip.set_device(ordinal);
        if status != HIP_SUCCESS {
            return Err(RocmError::hip(&hip, "hipSetDevice", status));
        }
        let props = hip
            .properties(ordinal)
            .map_err(|s| RocmError::hip(&hip, "hipGetDevicePropertiesR0600", s))?;
        let arch = props.gcn_arch_name.clone();
        let (image, source) = match kernels::code_object_for(&arch) {
            Some((target, image)) => (image.to_vec(), KernelSource::CodeObject(target)),
            None => (compile(&arch)?, KernelSource::Hiprtc(arch.clone())),
        };
        // SAFETY: `image` is a complete code object (embedded, or returned whole by hiprtc) that
        // outlives the call; HIP copies what it needs.
        let module = unsafe { hip.module_load_data(image.as_ptr().cast()) }.map_err(|s| {
            RocmError::Module {
                message: format!("hipModuleLoadData({source}): {} ({s})", hip.error_name(s)),
            }
        })?;
        let runtime_version = hip.runtime_version().unwrap_or(0);
        let mut ctx = Context {
            hip,
            ordinal,
            arch,
            name: props.name,
            source,
            runtime_version: 0,
            shared_mem_per_block: props.shared_mem_per_block,
            shared_mem_per_multiprocessor: if props.shared_mem_per_multiprocessor > 0 {
                props.shared_mem_per_multiprocessor
            } else {
                props.shared_mem_per_block
            },
            total_global_mem: props.total_global_mem,
            multiprocessors: props.multiprocessors,
            resolve_blocks_per_multiprocessor: 0,
            pci_bus_id: props.pci_bus_id,
            host_pointer_registration: props.host_pointer_registration,
            staging: Mutex::new(Vec::new()),
            module,
            functions: Vec::with_capacity(kernels::KERNELS.len()),
        };
        for k in kernels::KERNELS {
            let name = CString::new(k.name).expect("kernel names hold no NUL");
            let f = ctx
                .hip
                .module_get_function(ctx.module, &name)
                .map_err(|s| RocmError::Module {
                    message: format!(
                        "hipModuleGetFunction({}) in {}: {} ({s})",
                        k.name,
                        ctx.source,
                        ctx.hip.error_name(s)
                    ),
                })?;
            ctx.functions.push(f);
        }
        // How many resolver blocks share a compute unit decides how the planner splits its
        // shared memory: ask the runtime what the loaded kernels' registers allow.
        let mut resolve_blocks = u32::MAX;
        for k in Kernel::RESOLVERS {
            let f = ctx.function(kernels::index(k));
            let blocks = ctx
                .hip
                .max_active_blocks(f, k.abi().block_threads, 0)
                .map_err(|s| {
                    RocmError::hip(
                        &ctx.hip,
                        "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
                        s,
                    )
                })?;
            resolve_blocks = resolve_blocks.min(blocks);
        }
        ctx.resolve_blocks_per_multiprocessor = resolve_blocks;
        ctx.runtime_version = runtime_version;
        Ok(ctx)
    }
}

/// Compiles the kernel source for `arch` with hiprtc.
fn compile(arch: &str) -> Result<Vec<u8>, RocmError> {
    let rtc = Rtc::load().map_err(|e| RocmError::Compile {
        arch: arch.to_owned(),
        message: format!("no embedded code object fits and hiprtc is unavailable: {e}"),
    })?;
    let source = CString::new(kernels::hip_source()).map_err(|_| RocmError::Compile {
        arch: arch.to_owned(),
        message: "kernel source holds a NUL byte".to_owned(),
    })?;
    let arch_opt =
        CString::new(format!("--gpu-architecture={arch}")).map_err(|_| RocmError::Compile {
            arch: arch.to_owned(),
            message: "architecture name holds a NUL byte".to_owned(),
        })?;
    let opts = [arch_opt.as_c_str(), c"-O3"];
    rtc.compile(&source, c"hisparse_kernels.hip", &opts)
        .map_err(|f| RocmError::Compile {
            arch: arch.to_owned(),
            message: format!("{} returned {}; log:\n{}", f.call, f.status, f.log),
        })
}

/// A pinned, mapped staging buffer and the event after the last work that reads it.
struct Staging {
    host: *mut u8,
    device: u64,
    cap: usize,
    event: Handle,
}

impl Context {
    /// Copies `bytes` into a pinned staging buffer that kernels read through its device address,
    /// runs `enqueue(device_address)`, then records an event on `stream` so the buffer is reused
    /// only after that work completed. Never blocks on the device.
    pub(crate) fn with_staging(
        &self,
        stream: Handle,
        bytes: &[u8],
        enqueue: impl FnOnce(u64) -> Result<(), RocmError>,
    ) -> Result<(), RocmError> {
        let s = self.take_staging(bytes.len())?;
        // SAFETY: `s.host` holds `s.cap >= bytes.len()` bytes of pinned memory that no enqueued
        // work reads any more (its event completed, or it is new) and that only this call holds.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), s.host, bytes.len()) };
        let result = enqueue(s.device);
        let recorded = self.check("hipEventRecord", self.hip.event_record(s.event, stream));
        if recorded.is_err() {
            // Unknown completion point: wait for everything before the buffer is reused.
            let _ = self.hip.device_synchronize();
        }
        self.staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(s);
        result.and(recorded)
    }

    fn take_staging(&self, len: usize) -> Result<Staging, RocmError> {
        {
            let mut pool = self.staging.lock().unwrap_or_else(|e| e.into_inner());
            let free = pool
                .iter()
                .position(|s| s.cap >= len && self.hip.event_query(s.event) == HIP_SUCCESS);
            if let Some(i) = free {
                return Ok(pool.swap_remove(i));
            }
        }
        let cap = len.next_power_of_two().max(4096);
        let host = self
            .hip
            .host_malloc(
                cap,
                crate::ffi::HOST_MALLOC_MAPPED | crate::ffi::HOST_MALLOC_PORTABLE,
            )
            .map_err(|s| RocmError::hip(&self.hip, "hipHostMalloc", s))?;
        let free_host = |e| {
            // SAFETY: `host` was allocated just above and is not used after this.
            let _ = unsafe { self.hip.host_free(host) };
            e
        };
        let device = self
            .hip
            .host_device_pointer(host)
            .map_err(|s| free_host(RocmError::hip(&self.hip, "hipHostGetDevicePointer", s)))?;
        let event = self
            .hip
            .event_create()
            .map_err(|s| free_host(RocmError::hip(&self.hip, "hipEventCreateWithFlags", s)))?;
        Ok(Staging {
            host: host.cast(),
            device: device as u64,
            cap,
            event,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.bind_quietly();
        let _ = self.hip.device_synchronize();
        for s in self
            .staging
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: the device is idle (synchronised above); the event and the pinned buffer
            // were created in `take_staging` and are released exactly once, here.
            unsafe {
                let _ = self.hip.event_destroy(s.event);
                let _ = self.hip.host_free(s.host.cast::<c_void>());
            }
        }
        // SAFETY: the module was loaded in `open`; every object that could launch one of its
        // functions holds an `Arc<Context>`, so none is alive any more.
        let _ = unsafe { self.hip.module_unload(self.module) };
    }
}
