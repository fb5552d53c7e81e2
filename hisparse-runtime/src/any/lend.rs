//! Engine-owned memory and streams: the backends' own `unsafe` lending entries (CUDA and ROCm
//! `lend_*`, the CPU backend's `CpuBuffer::from_raw_parts`) behind one set of names, so that a
//! binding that picks its backend by name can lend an engine's tensors and stream without
//! matching on the backend itself. The only module of the crate that may use `unsafe`.

use super::*;

impl AnyDevice {
    /// Uses `len` bytes of the engine's device memory at `ptr` (a CUDA or HIP device pointer; on
    /// the CPU backend, host memory) as a buffer of this device, without owning it: the CUDA
    /// and ROCm backends' `lend_device_memory`, the CPU backend's
    /// [`CpuBuffer::from_raw_parts`]. The Vulkan backend cannot adopt lent memory this way and
    /// answers an `Unsupported` error.
    ///
    /// # Safety
    ///
    /// The contract of the backend's entry: the memory stays allocated while the buffer lives
    /// and until every operation enqueued with it has completed; nothing else writes it (or
    /// reads what the backend writes) without ordering through a stream, an event or a
    /// synchronisation; it belongs to this device.
    pub unsafe fn lend_device_memory(&self, ptr: u64, len: usize) -> Result<AnyBuffer, AnyError> {
        let _ = (ptr, len);
        match self {
            #[cfg(feature = "cpu")]
            AnyDevice::Cpu(_) => {
                let ptr = ptr as usize as *mut u8;
                // SAFETY: forwarded contract (device memory is host memory on this backend).
                let buf = unsafe { CpuBuffer::from_raw_parts(ptr, len) }?;
                Ok(buf.into())
            }
            #[cfg(feature = "cuda")]
            // SAFETY: forwarded contract.
            AnyDevice::Cuda(d) => Ok(unsafe { d.lend_device_memory(ptr, len) }?.into()),
            #[cfg(feature = "rocm")]
            AnyDevice::Rocm(d) => {
                let ptr = ptr as usize as *mut core::ffi::c_void;
                // SAFETY: forwarded contract.
                let buf = unsafe { d.lend_device_memory(ptr, len) }?;
                Ok(buf.into())
            }
            #[cfg(feature = "vulkan")]
            AnyDevice::Vulkan(_) => Err(lending_unsupported("device memory")),
        }
    }

    /// Uses `len` bytes of the engine's host memory at `ptr` (a pinned tensor, a numpy array) as
    /// a pinned buffer of this device, without owning it: the CUDA and ROCm backends'
    /// `lend_host_memory` (which registers unpinned memory with the driver), the CPU backend's
    /// [`CpuBuffer::from_raw_parts`]. A runtime's host pool must also be page-aligned. Vulkan:
    /// an `Unsupported` error.
    ///
    /// # Safety
    ///
    /// The contract of the backend's entry: `[ptr, ptr + len)` is live, readable and writable
    /// host memory that stays allocated while the buffer lives and until every operation
    /// enqueued with it has completed; the host touches it only after synchronising.
    pub unsafe fn lend_host_memory(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<AnyHostBuffer, AnyError> {
        let _ = (ptr, len);
        match self {
            #[cfg(feature = "cpu")]
            // SAFETY: forwarded contract.
            AnyDevice::Cpu(_) => Ok(unsafe { CpuBuffer::from_raw_parts(ptr, len) }?.into()),
            #[cfg(feature = "cuda")]
            // SAFETY: forwarded contract.
            AnyDevice::Cuda(d) => Ok(unsafe { d.lend_host_memory(ptr, len) }?.into()),
            #[cfg(feature = "rocm")]
            // SAFETY: forwarded contract.
            AnyDevice::Rocm(d) => Ok(unsafe { d.lend_host_memory(ptr, len) }?.into()),
            #[cfg(feature = "vulkan")]
            AnyDevice::Vulkan(_) => Err(lending_unsupported("host memory")),
        }
    }

    /// Enqueues this device's work on the engine's stream `raw` (a `CUstream` or `hipStream_t`,
    /// e.g. `torch.cuda.current_stream().cuda_stream`) instead of a stream of its own: the CUDA
    /// and ROCm backends' `lend_stream`. The CPU backend runs every call to completion on the
    /// calling thread, so any value (`0` included) gives its ordinary stream. Vulkan: an
    /// `Unsupported` error.
    ///
    /// # Safety
    ///
    /// The contract of the backend's entry: `raw` is a live stream of this device (or the null
    /// or per-thread stream) that outlives the returned stream and the work enqueued on it.
    pub unsafe fn lend_stream(&self, raw: *mut core::ffi::c_void) -> Result<AnyStream, AnyError> {
        let _ = raw;
        match self {
            #[cfg(feature = "cpu")]
            AnyDevice::Cpu(_) => Ok(CpuStream.into()),
            #[cfg(feature = "cuda")]
            // SAFETY: forwarded contract.
            AnyDevice::Cuda(d) => Ok(unsafe { d.lend_stream(raw.cast()) }?.into()),
            #[cfg(feature = "rocm")]
            // SAFETY: forwarded contract.
            AnyDevice::Rocm(d) => Ok(unsafe { d.lend_stream(raw) }?.into()),
            #[cfg(feature = "vulkan")]
            AnyDevice::Vulkan(_) => Err(lending_unsupported("a stream")),
        }
    }
}

/// The Vulkan backend's answer to a lending entry.
#[cfg(feature = "vulkan")]
fn lending_unsupported(what: &str) -> AnyError {
    AnyError::Vulkan(VulkanError::Unsupported(format!(
        "the Vulkan backend cannot adopt an engine's {what}: let the runtime allocate its pools \
         and streams (Runtime::new), or use the cuda, rocm or cpu backend"
    )))
}

#[cfg(all(test, feature = "cpu"))]
mod lending_tests {
    use super::*;

    #[test]
    fn cpu_lends_engine_memory_and_ignores_the_stream_handle() {
        let dev = AnyDevice::open(BackendKind::Cpu, "").unwrap();
        let mut device_mem = vec![0u128; 4];
        let mut host_mem = vec![0u128; 4];
        // SAFETY: both vectors outlive the buffers (dropped first) and are only touched through
        // them meanwhile; the CPU stream handle is never dereferenced.
        let (mut buf, mut host, stream) = unsafe {
            (
                dev.lend_device_memory(device_mem.as_mut_ptr() as u64, 64)
                    .unwrap(),
                dev.lend_host_memory(host_mem.as_mut_ptr().cast(), 64)
                    .unwrap(),
                dev.lend_stream(core::ptr::null_mut()).unwrap(),
            )
        };
        dev.upload_i32(&mut buf, 0, &[1, 2, 3, 4]).unwrap();
        dev.copy_to_host(&stream, &buf, 0, &mut host, 16, 16)
            .unwrap();
        let mut back = [0u8; 16];
        dev.read_pinned(&host, 16, &mut back).unwrap();
        assert_eq!(back[..4], 1i32.to_ne_bytes());
        assert_eq!(back[12..], 4i32.to_ne_bytes());
        drop((buf, host));
        assert_eq!(
            host_mem[1] as u32, 1,
            "the copy landed in the engine's memory"
        );
        // SAFETY: a null pointer is refused before anything is kept.
        let e = unsafe { dev.lend_device_memory(0, 64) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("null"), "{e}");
    }
}
