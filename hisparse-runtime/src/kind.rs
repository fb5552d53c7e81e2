//! Backends by name, whether or not this build contains them.

use core::fmt;
use std::str::FromStr;

/// A backend by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The CPU backend (host memory).
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// Any Vulkan 1.2+ device.
    Vulkan,
    /// AMD GPUs through HIP.
    Rocm,
}

impl BackendKind {
    /// Every backend, compiled in or not.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Cpu,
        BackendKind::Cuda,
        BackendKind::Vulkan,
        BackendKind::Rocm,
    ];

    /// The name (also the Cargo feature that compiles it in).
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Vulkan => "vulkan",
            BackendKind::Rocm => "rocm",
        }
    }

    /// Whether this build contains the backend.
    pub const fn is_compiled(self) -> bool {
        match self {
            BackendKind::Cpu => cfg!(feature = "cpu"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Vulkan => cfg!(feature = "vulkan"),
            BackendKind::Rocm => cfg!(feature = "rocm"),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownBackend(pub String);

impl fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown backend `{}`; use one of cpu, cuda, vulkan, rocm",
            self.0
        )
    }
}

impl std::error::Error for UnknownBackend {}

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    /// `cpu`; `cuda` or `nvidia`; `vulkan` or `vk`; `rocm`, `hip` or `amd` (any case).
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" | "nvidia" => Ok(BackendKind::Cuda),
            "vulkan" | "vk" => Ok(BackendKind::Vulkan),
            "rocm" | "hip" | "amd" => Ok(BackendKind::Rocm),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}
