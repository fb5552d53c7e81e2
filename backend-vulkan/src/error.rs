//! The backend's error type and its portable classification.

use core::fmt;

use ash::vk;
use hisparse_core::error::{Error, ErrorKind, OpError};
use hisparse_core::ops::PinnedBudgetError;

/// Everything the Vulkan backend can fail with. [`Error::kind`] classifies it portably.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VulkanError {
    /// The Vulkan loader (`libvulkan.so.1` / `vulkan-1.dll`) could not be loaded.
    LoaderNotFound(String),
    /// No Vulkan device matches the selector (or none exists).
    NoDevice(String),
    /// The device lacks a feature, extension or limit this backend needs.
    Unsupported(String),
    /// A Vulkan call failed.
    Vk {
        /// The failing call.
        call: &'static str,
        /// Its result code.
        result: vk::Result,
    },
    /// An operation's descriptor or buffers are malformed (checked before anything runs).
    Op(OpError),
    /// A pinned allocation exceeds the safe share of RAM, or is empty.
    PinnedBudget(PinnedBudgetError),
    /// A device allocation is larger than the device memory free now (checked before anything
    /// is allocated).
    OutOfDeviceMemory {
        /// Bytes asked for.
        bytes: u64,
        /// Device memory free (the driver's budget with `VK_EXT_memory_budget`).
        free: u64,
    },
    /// Page-aligned host memory for a pinned buffer could not be allocated.
    HostAllocation {
        /// Bytes asked for.
        bytes: usize,
    },
    /// An argument outside an operation descriptor is malformed (offset beyond a buffer, …).
    InvalidArgument(String),
    /// The Vulkan validation layer reported warnings or errors during the work (strict mode).
    Validation {
        /// Messages reported (printed on stderr).
        messages: usize,
    },
}

impl VulkanError {
    pub(crate) fn vk(call: &'static str) -> impl FnOnce(vk::Result) -> VulkanError {
        move |result| VulkanError::Vk { call, result }
    }
}

impl fmt::Display for VulkanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VulkanError::LoaderNotFound(why) => write!(
                f,
                "no Vulkan loader found ({why}); install the Vulkan runtime (libvulkan1) and a \
                 driver, or pick another backend"
            ),
            VulkanError::NoDevice(why) => write!(f, "no suitable Vulkan device: {why}"),
            VulkanError::Unsupported(why) => write!(f, "Vulkan device unsupported: {why}"),
            VulkanError::Vk { call, result } => write!(f, "{call} failed: {result}"),
            VulkanError::Op(e) => write!(f, "{e}"),
            VulkanError::PinnedBudget(e) => write!(f, "{e}"),
            VulkanError::OutOfDeviceMemory { bytes, free } => write!(
                f,
                "a device allocation of {bytes} bytes exceeds the {free} bytes of device memory \
                 free now; free buffers or plan a smaller pool (`hisparse layout` shows what fits)"
            ),
            VulkanError::HostAllocation { bytes } => {
                write!(
                    f,
                    "could not allocate {bytes} bytes of page-aligned host memory"
                )
            }
            VulkanError::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            VulkanError::Validation { messages } => write!(
                f,
                "the Vulkan validation layer reported {messages} warning(s) or error(s) (printed \
                 on stderr); this is a backend bug"
            ),
        }
    }
}

impl std::error::Error for VulkanError {}

impl Error for VulkanError {
    fn kind(&self) -> ErrorKind {
        match self {
            VulkanError::LoaderNotFound(_) | VulkanError::NoDevice(_) => ErrorKind::NotFound,
            VulkanError::Unsupported(_) => ErrorKind::Unsupported,
            VulkanError::Op(e) => e.kind(),
            VulkanError::PinnedBudget(e) => e.kind(),
            VulkanError::HostAllocation { .. } => ErrorKind::OutOfPinnedMemory,
            VulkanError::OutOfDeviceMemory { .. } => ErrorKind::OutOfDeviceMemory,
            VulkanError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            VulkanError::Validation { .. } => ErrorKind::Other,
            VulkanError::Vk { result, .. } => match *result {
                vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => ErrorKind::OutOfDeviceMemory,
                vk::Result::ERROR_DEVICE_LOST => ErrorKind::DeviceLost,
                vk::Result::ERROR_INCOMPATIBLE_DRIVER | vk::Result::ERROR_INITIALIZATION_FAILED => {
                    ErrorKind::NotFound
                }
                vk::Result::ERROR_FEATURE_NOT_PRESENT
                | vk::Result::ERROR_EXTENSION_NOT_PRESENT
                | vk::Result::ERROR_LAYER_NOT_PRESENT
                | vk::Result::ERROR_INVALID_EXTERNAL_HANDLE => ErrorKind::Unsupported,
                vk::Result::ERROR_INVALID_SHADER_NV => ErrorKind::Compilation,
                _ => ErrorKind::Other,
            },
        }
    }
}

impl From<OpError> for VulkanError {
    fn from(e: OpError) -> Self {
        VulkanError::Op(e)
    }
}

impl From<PinnedBudgetError> for VulkanError {
    fn from(e: PinnedBudgetError) -> Self {
        VulkanError::PinnedBudget(e)
    }
}
