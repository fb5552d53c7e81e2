//! Where an [`AnyBuffer`] lies, for what registers memory by address (a transfer library such
//! as NIXL, which writes a pool of another process or node).

use super::*;

impl AnyBuffer {
    /// The address of the buffer's first byte in the memory the buffer is in: a host address
    /// on the CPU backend (its device memory is host memory), a device address on CUDA and
    /// ROCm; `None` on Vulkan, whose buffers have no address outside the API.
    pub fn address(&self) -> Option<u64> {
        match self {
            #[cfg(feature = "cpu")]
            AnyBuffer::Cpu(b) => Some(b.address() as u64),
            #[cfg(feature = "cuda")]
            AnyBuffer::Cuda(b) => Some(b.device_address()),
            #[cfg(feature = "rocm")]
            AnyBuffer::Rocm(b) => Some(b.device_address()),
            #[cfg(feature = "vulkan")]
            AnyBuffer::Vulkan(_) => None,
        }
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_buffer_is_addressed_in_host_memory() {
        let dev = AnyDevice::open(BackendKind::Cpu, "").unwrap();
        let mut buf = dev.alloc(64).unwrap();
        dev.upload_i32(&mut buf, 0, &[7; 16]).unwrap();
        // Irrefutable in a build with the CPU backend only.
        #[allow(irrefutable_let_patterns)]
        let AnyBuffer::Cpu(inner) = &buf else {
            unreachable!("a CPU device allocates CPU buffers")
        };
        assert_eq!(buf.address(), Some(inner.address() as u64));
        assert_ne!(buf.address(), Some(0));
    }
}
