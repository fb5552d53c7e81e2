//! Run-time backend selection over the backends compiled into this binary.
//!
//! Each backend is a Cargo feature of the CLI (`cpu` by default; `cuda`, `vulkan`, `rocm`). The
//! commands are generic over [`hisparse_core::Device`]; [`with_device!`] opens the chosen backend
//! and runs one generic body with it, so dispatch is static (one instantiation per compiled-in
//! backend) and no trait object or dummy backend is needed.

use std::fmt;
use std::str::FromStr;

use crate::error::CliError;

/// A backend name given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// The name used on the command line and as the Cargo feature.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Vulkan => "vulkan",
            BackendKind::Rocm => "rocm",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" | "nvidia" => Ok(BackendKind::Cuda),
            "vulkan" | "vk" => Ok(BackendKind::Vulkan),
            "rocm" | "hip" | "amd" => Ok(BackendKind::Rocm),
            other => Err(format!(
                "unknown backend `{other}`; use one of cpu, cuda, vulkan, rocm"
            )),
        }
    }
}

/// Parses a CUDA/ROCm device ordinal from `--device` (empty = 0).
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub fn ordinal(selector: &str, backend: BackendKind) -> Result<usize, CliError> {
    if selector.trim().is_empty() {
        return Ok(0);
    }
    selector.trim().parse().map_err(|_| {
        CliError::usage(format!(
            "--device `{selector}` is not a device number; {backend} devices are chosen by ordinal (0, 1, ...)"
        ))
    })
}

/// Opens the backend `$kind` (a [`BackendKind`]) with device selector `$sel` (`&str`), binds it to
/// `$dev` and evaluates `$body` (a `Result<_, CliError>`) with it. A backend that is not compiled
/// in gives [`CliError::NotCompiled`]; a backend that cannot open its device gives a one-line
/// [`CliError::Failed`] naming the backend and the portable error kind.
#[macro_export]
macro_rules! with_device {
    ($kind:expr, $sel:expr, |$dev:ident| $body:expr) => {{
        #[allow(unused_variables)]
        let sel: &str = $sel;
        match $kind {
            #[cfg(feature = "cpu")]
            $crate::backend::BackendKind::Cpu => {
                let $dev = hisparse_backend_cpu::CpuDevice::new();
                $body
            }
            #[cfg(feature = "cuda")]
            $crate::backend::BackendKind::Cuda => {
                let ord = $crate::backend::ordinal(sel, $crate::backend::BackendKind::Cuda)?;
                let $dev = hisparse_backend_cuda::CudaDevice::open(ord).map_err(|e| {
                    $crate::error::CliError::device(&format!("cannot open CUDA device {ord}"), e)
                })?;
                $body
            }
            #[cfg(feature = "vulkan")]
            $crate::backend::BackendKind::Vulkan => {
                let $dev = hisparse_backend_vulkan::VulkanDevice::open(sel).map_err(|e| {
                    $crate::error::CliError::device(
                        &format!("cannot open a Vulkan device matching `{sel}`"),
                        e,
                    )
                })?;
                $body
            }
            #[cfg(feature = "rocm")]
            $crate::backend::BackendKind::Rocm => {
                let ord = $crate::backend::ordinal(sel, $crate::backend::BackendKind::Rocm)?;
                let $dev = hisparse_backend_rocm::RocmDevice::open(ord).map_err(|e| {
                    $crate::error::CliError::device(&format!("cannot open ROCm device {ord}"), e)
                })?;
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err($crate::error::CliError::NotCompiled(other.name())),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_one_line() {
        for k in [
            BackendKind::Cpu,
            BackendKind::Cuda,
            BackendKind::Vulkan,
            BackendKind::Rocm,
        ] {
            assert_eq!(k.name().parse::<BackendKind>(), Ok(k));
        }
        let e = "metal".parse::<BackendKind>().unwrap_err();
        assert!(e.contains("metal") && !e.contains('\n'));
    }

    #[test]
    fn not_compiled_names_the_feature() {
        let e = CliError::NotCompiled("cuda").to_string();
        assert!(e.contains("--features cuda"), "{e}");
        assert!(!e.contains('\n'));
    }
}
