//! [`RocmError`]: every failure of this backend, classified portably through
//! [`hisparse_core::Error::kind`].

use std::fmt;

use hisparse_core::ops::PinnedBudgetError;
use hisparse_core::{ErrorKind, OpError};

use crate::ffi::{Hip, HipStatus};

/// An error of the ROCm backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum RocmError {
    /// A malformed descriptor or argument, found before anything was enqueued.
    Op(OpError),
    /// A host pool beyond a limit of the host (available RAM, the locked-memory limit,
    /// `/dev/shm` space), refused before anything was reserved or pinned.
    PinnedBudget(PinnedBudgetError),
    /// The host pool could not be set up (the operating system refused a mapping, too few
    /// explicit huge pages); nothing stayed reserved or pinned. The message says what to change.
    HostPool(String),
    /// The HIP runtime (or hiprtc) library could not be loaded, or lacks an entry point.
    RuntimeNotFound(String),
    /// The runtime loaded but reports no device with this ordinal.
    NoDevice {
        /// Ordinal asked for.
        ordinal: usize,
        /// Devices the runtime reports.
        count: usize,
    },
    /// A HIP call failed.
    Hip {
        /// The HIP entry point.
        call: &'static str,
        /// Its `hipError_t`.
        status: HipStatus,
        /// `hipGetErrorName` of the status.
        name: String,
        /// The portable classification, which may depend on the call (an out-of-memory status
        /// from `hipHostMalloc` is pinned memory, from `hipMalloc` device memory).
        kind: ErrorKind,
    },
    /// Run-time compilation of the kernels failed.
    Compile {
        /// The target architecture.
        arch: String,
        /// What failed, with the compiler log.
        message: String,
    },
    /// The device cannot run this operation with these sizes (a hardware limit such as shared
    /// memory or a grid dimension); the message names the limit.
    Unsupported(String),
    /// A kernel module or function could not be loaded.
    Module {
        /// Where the code came from (an embedded code object or hiprtc) and what failed.
        message: String,
    },
    /// Memory or a stream an engine lends (`RocmDevice::lend_device_memory`,
    /// `lend_host_memory`, `lend_stream`) cannot be used; nothing was registered or kept.
    Lent {
        /// What was lent: `"device memory"`, `"host memory"` or `"stream"`.
        what: &'static str,
        /// What is wrong with it and what to pass instead.
        problem: String,
    },
}

impl RocmError {
    /// Classifies a failed HIP call.
    pub(crate) fn hip(hip: &Hip, call: &'static str, status: HipStatus) -> RocmError {
        RocmError::Hip {
            call,
            status,
            name: hip.error_name(status),
            kind: classify(call, status),
        }
    }
}

/// Portable kind of a HIP status returned by `call`.
fn classify(call: &str, status: HipStatus) -> ErrorKind {
    match status {
        // hipErrorOutOfMemory
        2 if call.starts_with("hipHost") => ErrorKind::OutOfPinnedMemory,
        2 => ErrorKind::OutOfDeviceMemory,
        // hipErrorNotInitialized, hipErrorDeinitialized, hipErrorInsufficientDriver,
        // hipErrorNoDevice, hipErrorInvalidDevice
        3 | 4 | 35 | 100 | 101 => ErrorKind::NotFound,
        // hipErrorInvalidDeviceFunction, hipErrorInvalidImage, hipErrorNoBinaryForGpu,
        // hipErrorInvalidKernelFile, hipErrorInvalidSource, hipErrorSharedObjectSymbolNotFound,
        // hipErrorSharedObjectInitFailed, hipErrorNotFound (a kernel symbol)
        98 | 200 | 209 | 218 | 300 | 302 | 303 | 500 => ErrorKind::Compilation,
        // hipErrorIllegalAddress, hipErrorLaunchOutOfResources, hipErrorLaunchTimeOut,
        // hipErrorAssert, hipErrorLaunchFailure, hipErrorPriorLaunchFailure, hipErrorContextIsDestroyed
        700 | 701 | 702 | 710 | 719 | 53 | 709 => ErrorKind::DeviceLost,
        // hipErrorNotSupported
        801 => ErrorKind::Unsupported,
        _ => ErrorKind::Other,
    }
}

impl fmt::Display for RocmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RocmError::Op(e) => write!(f, "{e}"),
            RocmError::PinnedBudget(e) => write!(f, "{e}"),
            RocmError::HostPool(m) => write!(f, "{m}"),
            RocmError::RuntimeNotFound(m) => write!(f, "HIP runtime not found: {m}"),
            RocmError::NoDevice { ordinal, count } => write!(
                f,
                "no HIP device {ordinal}: the runtime reports {count} device(s)"
            ),
            RocmError::Hip {
                call, status, name, ..
            } => write!(f, "{call} failed: {name} ({status})"),
            RocmError::Compile { arch, message } => {
                write!(f, "compiling the HIP kernels for {arch} failed: {message}")
            }
            RocmError::Module { message } => write!(f, "loading the HIP kernels failed: {message}"),
            RocmError::Unsupported(m) => write!(f, "unsupported on this HIP device: {m}"),
            RocmError::Lent { what, problem } => write!(f, "cannot use the {what}: {problem}"),
        }
    }
}

impl std::error::Error for RocmError {}

impl hisparse_core::Error for RocmError {
    fn kind(&self) -> ErrorKind {
        match self {
            RocmError::Op(e) => hisparse_core::Error::kind(e),
            RocmError::PinnedBudget(e) => hisparse_core::Error::kind(e),
            RocmError::HostPool(_) => ErrorKind::OutOfPinnedMemory,
            RocmError::RuntimeNotFound(_) | RocmError::NoDevice { .. } => ErrorKind::NotFound,
            RocmError::Hip { kind, .. } => *kind,
            RocmError::Compile { .. } | RocmError::Module { .. } => ErrorKind::Compilation,
            RocmError::Unsupported(_) => ErrorKind::Unsupported,
            RocmError::Lent { .. } => ErrorKind::InvalidArgument,
        }
    }
}

impl From<OpError> for RocmError {
    fn from(e: OpError) -> Self {
        RocmError::Op(e)
    }
}

impl From<PinnedBudgetError> for RocmError {
    fn from(e: PinnedBudgetError) -> Self {
        RocmError::PinnedBudget(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_portable_kinds() {
        assert_eq!(classify("hipMalloc", 2), ErrorKind::OutOfDeviceMemory);
        assert_eq!(classify("hipHostMalloc", 2), ErrorKind::OutOfPinnedMemory);
        assert_eq!(classify("hipGetDeviceCount", 100), ErrorKind::NotFound);
        assert_eq!(classify("hipInit", 35), ErrorKind::NotFound);
        assert_eq!(classify("hipModuleLoadData", 209), ErrorKind::Compilation);
        assert_eq!(
            classify("hipModuleGetFunction", 500),
            ErrorKind::Compilation
        );
        assert_eq!(classify("hipStreamSynchronize", 700), ErrorKind::DeviceLost);
        assert_eq!(
            classify("hipModuleLaunchKernel", 719),
            ErrorKind::DeviceLost
        );
        assert_eq!(classify("hipMemcpyAsync", 801), ErrorKind::Unsupported);
        assert_eq!(classify("hipMemcpyAsync", 1), ErrorKind::Other);
    }
}
