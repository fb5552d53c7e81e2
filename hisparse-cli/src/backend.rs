//! Run-time backend selection over the backends compiled into this binary.
//!
//! Each backend is a Cargo feature of the CLI (`cpu` by default; `cuda`, `vulkan`, `rocm`),
//! forwarded to `hisparse-runtime`, whose [`hisparse_runtime::AnyDevice::open`] opens it. The
//! commands are generic over [`hisparse_core::Device`]; [`with_device!`](crate::with_device!) binds the opened
//! device's concrete type and runs one generic body with it, so dispatch is static (one
//! instantiation per compiled-in backend).

use crate::error::CliError;

pub use hisparse_runtime::BackendKind;

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

/// Whether this binary was built with backend `kind`'s feature.
pub const fn compiled(kind: BackendKind) -> bool {
    match kind {
        BackendKind::Cpu => cfg!(feature = "cpu"),
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Vulkan => cfg!(feature = "vulkan"),
        BackendKind::Rocm => cfg!(feature = "rocm"),
    }
}

/// Opens the backend `$kind` (a [`BackendKind`]) with device selector `$sel` (`&str`), binds it to
/// `$dev` and evaluates `$body` (a `Result<_, CliError>`) with it. A backend that is not compiled
/// in gives [`CliError::NotCompiled`]; a backend that cannot open its device gives a one-line
/// [`CliError::Failed`] naming the backend and the portable error kind.
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
#[macro_export]
macro_rules! with_device {
    ($kind:expr, $sel:expr, |$dev:ident| $body:expr) => {{
        use hisparse_runtime::{AnyDevice, OpenError};
        let kind: $crate::backend::BackendKind = $kind;
        // This binary's features decide, not the runtime's (a workspace build may compile more
        // backends into the runtime than the CLI asked for).
        let opened = if $crate::backend::compiled(kind) {
            AnyDevice::open(kind, $sel)
        } else {
            Err(OpenError::NotCompiled(kind))
        };
        match opened {
            Err(OpenError::NotCompiled(k)) => Err($crate::error::CliError::NotCompiled(k.name())),
            Err(e @ OpenError::BadSelector { .. }) => {
                Err($crate::error::CliError::usage(format!("--{e}")))
            }
            Err(e) => Err($crate::error::CliError::device("cannot open the device", e)),
            #[cfg(feature = "cpu")]
            Ok(AnyDevice::Cpu($dev)) => $body,
            #[cfg(feature = "cuda")]
            Ok(AnyDevice::Cuda($dev)) => $body,
            #[cfg(feature = "vulkan")]
            Ok(AnyDevice::Vulkan($dev)) => $body,
            #[cfg(feature = "rocm")]
            Ok(AnyDevice::Rocm($dev)) => $body,
            #[allow(unreachable_patterns)]
            Ok(other) => Err($crate::error::CliError::NotCompiled(other.kind().name())),
        }
    }};
}

/// Without any backend compiled in, every device command says which feature to enable.
#[cfg(not(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
)))]
#[macro_export]
macro_rules! with_device {
    ($kind:expr, $sel:expr, |$dev:ident| $body:expr) => {{
        let kind: $crate::backend::BackendKind = $kind;
        let _ = $sel;
        Err($crate::error::CliError::NotCompiled(kind.name()))
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
        let e = "metal".parse::<BackendKind>().unwrap_err().to_string();
        assert!(e.contains("metal") && !e.contains('\n'));
    }

    #[test]
    fn not_compiled_names_the_feature() {
        let e = CliError::NotCompiled("cuda").to_string();
        assert!(e.contains("--features cuda"), "{e}");
        assert!(!e.contains('\n'));
    }
}
