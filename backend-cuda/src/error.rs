//! The CUDA backend's error type, classified portably through [`hisparse_core::Error`].

use std::fmt;

use cudarc::driver::sys::CUresult;
use hisparse_core::error::{Error, ErrorKind, OpError};
use hisparse_core::ops::PinnedBudgetError;
use hisparse_host_memory::HostMemoryError;

/// Everything that can go wrong in the CUDA backend. Each variant says what is missing or what
/// failed; [`Error::kind`] classifies it for generic callers.
#[derive(Debug)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library (`libcuda.so.1`) could not be loaded: no NVIDIA driver.
    NoDriver,
    /// The driver loaded but has no device with this ordinal.
    NoDevice {
        /// Ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
    },
    /// The runtime compiler NVRTC (`libnvrtc.so.13`) was not found; kernels cannot be built.
    NoNvrtc {
        /// Directories searched besides the default library path.
        searched: Vec<String>,
    },
    /// A driver call failed.
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result code.
        code: CUresult,
    },
    /// NVRTC failed to compile the kernel source, or the driver refused the result.
    Compile {
        /// What failed and the compiler log.
        log: String,
    },
    /// Device memory could not be allocated.
    OutOfDeviceMemory {
        /// Bytes asked for.
        bytes: usize,
        /// Driver result code.
        code: CUresult,
    },
    /// Pinned host memory could not be allocated.
    OutOfPinnedMemory {
        /// Bytes asked for.
        bytes: usize,
        /// Driver result code.
        code: CUresult,
    },
    /// A host pool beyond a limit of the host (available RAM, the locked-memory limit,
    /// `/dev/shm` space), refused before anything was reserved or pinned.
    PinnedBudget(PinnedBudgetError),
    /// The host pool could not be set up (the operating system refused a mapping, too few
    /// explicit huge pages); nothing stayed reserved or pinned.
    HostPool(HostMemoryError),
    /// The device cannot give the resolver kernel the shared memory it needs.
    SharedMemory {
        /// Hot slots of the resolve call.
        hot_slots: u32,
        /// Bytes of shared memory per block needed.
        needed: u64,
        /// Bytes of shared memory per block the device allows.
        available: u64,
    },
    /// The device lacks a capability this backend needs (mapped pinned memory, unified
    /// addressing) or a call exceeds a backend limit.
    Unsupported(String),
    /// A malformed descriptor or argument, found before anything was enqueued.
    Op(OpError),
    /// Memory or a stream an engine lends (`CudaDevice::lend_device_memory`,
    /// `lend_host_memory`, `lend_stream`) cannot be used; nothing was registered or kept.
    Lent {
        /// What was lent: `"device memory"`, `"host memory"` or `"stream"`.
        what: &'static str,
        /// What is wrong with it and what to pass instead.
        problem: String,
    },
    /// An environment variable the backend reads at open holds a value it does not take.
    Environment {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// The values it takes.
        expected: &'static str,
    },
}

impl CudaError {
    /// The error of a failed driver call, classified by its code.
    pub(crate) fn driver(call: &'static str, code: CUresult) -> Self {
        CudaError::Driver { call, code }
    }
}

fn code_kind(code: CUresult) -> ErrorKind {
    use CUresult::*;
    match code {
        CUDA_ERROR_OUT_OF_MEMORY => ErrorKind::OutOfDeviceMemory,
        CUDA_ERROR_NO_DEVICE
        | CUDA_ERROR_INVALID_DEVICE
        | CUDA_ERROR_STUB_LIBRARY
        | CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
        | CUDA_ERROR_NOT_INITIALIZED => ErrorKind::NotFound,
        CUDA_ERROR_NO_BINARY_FOR_GPU
        | CUDA_ERROR_INVALID_PTX
        | CUDA_ERROR_UNSUPPORTED_PTX_VERSION => ErrorKind::Compilation,
        CUDA_ERROR_ILLEGAL_ADDRESS
        | CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_LAUNCH_TIMEOUT
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_MISALIGNED_ADDRESS
        | CUDA_ERROR_INVALID_ADDRESS_SPACE
        | CUDA_ERROR_INVALID_PC
        | CUDA_ERROR_ASSERT
        | CUDA_ERROR_ECC_UNCORRECTABLE => ErrorKind::DeviceLost,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => ErrorKind::Unsupported,
        _ => ErrorKind::Other,
    }
}

impl Error for CudaError {
    fn kind(&self) -> ErrorKind {
        match self {
            CudaError::NoDriver | CudaError::NoDevice { .. } => ErrorKind::NotFound,
            CudaError::NoNvrtc { .. } => ErrorKind::NotFound,
            CudaError::Driver { code, .. } => code_kind(*code),
            CudaError::Compile { .. } => ErrorKind::Compilation,
            CudaError::OutOfDeviceMemory { .. } => ErrorKind::OutOfDeviceMemory,
            CudaError::OutOfPinnedMemory { .. } => ErrorKind::OutOfPinnedMemory,
            CudaError::PinnedBudget(e) => e.kind(),
            CudaError::HostPool(e) => e.kind(),
            CudaError::SharedMemory { .. } | CudaError::Unsupported(_) => ErrorKind::Unsupported,
            CudaError::Op(e) => e.kind(),
            CudaError::Lent { .. } | CudaError::Environment { .. } => ErrorKind::InvalidArgument,
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NoDriver => f.write_str(
                "CUDA driver library (libcuda.so.1) not found: install the NVIDIA driver, or pick \
                 another backend",
            ),
            CudaError::NoDevice { ordinal, count } => write!(
                f,
                "no CUDA device with ordinal {ordinal}: the driver reports {count} device(s)"
            ),
            CudaError::NoNvrtc { searched } => write!(
                f,
                "NVRTC (libnvrtc.so.13, CUDA 13) not found on the library path nor in [{}]: \
                 install the CUDA 13 toolkit or the `nvidia-cuda-nvrtc` wheel and set CUDA_PATH \
                 or LD_LIBRARY_PATH to its lib directory",
                searched.join(", ")
            ),
            CudaError::Driver { call, code } => {
                write!(f, "CUDA driver call {call} failed: {code:?}")
            }
            CudaError::Compile { log } => write!(f, "CUDA kernel build failed: {log}"),
            CudaError::OutOfDeviceMemory { bytes, code } => {
                write!(
                    f,
                    "out of device memory allocating {bytes} bytes ({code:?})"
                )
            }
            CudaError::OutOfPinnedMemory { bytes, code } => write!(
                f,
                "could not pin {bytes} bytes of host memory ({code:?}); lower the host budget \
                 (`--host-mem`, `host_mem=`, `HiSparseConfig::host_budget_bytes`)"
            ),
            CudaError::PinnedBudget(e) => write!(f, "{e}"),
            CudaError::HostPool(e) => write!(f, "{e}"),
            CudaError::SharedMemory {
                hot_slots,
                needed,
                available,
            } => write!(
                f,
                "resolve with {hot_slots} hot slots needs {needed} bytes of shared memory per \
                 block but this device allows {available}; use a smaller device_buffer_size or \
                 another device"
            ),
            CudaError::Unsupported(what) => write!(f, "unsupported: {what}"),
            CudaError::Op(e) => write!(f, "{e}"),
            CudaError::Lent { what, problem } => write!(f, "cannot use the {what}: {problem}"),
            CudaError::Environment {
                name,
                value,
                expected,
            } => write!(
                f,
                "environment variable {name}={value:?} is not a value it takes; set it to one of \
                 {expected}, or unset it"
            ),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<OpError> for CudaError {
    fn from(e: OpError) -> Self {
        CudaError::Op(e)
    }
}

impl From<PinnedBudgetError> for CudaError {
    fn from(e: PinnedBudgetError) -> Self {
        CudaError::PinnedBudget(e)
    }
}

impl From<hisparse_host_memory::NotOneDeviceRange> for CudaError {
    fn from(e: hisparse_host_memory::NotOneDeviceRange) -> Self {
        CudaError::Unsupported(e.to_string())
    }
}

impl From<HostMemoryError> for CudaError {
    fn from(e: HostMemoryError) -> Self {
        match e {
            HostMemoryError::Budget(b) => CudaError::PinnedBudget(b),
            HostMemoryError::Lent(problem) => CudaError::Lent {
                what: "host memory",
                problem,
            },
            other => CudaError::HostPool(other),
        }
    }
}
