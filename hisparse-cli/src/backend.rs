//! Run-time backend selection over the backends compiled into this binary.
//!
//! Each backend is a Cargo feature of the CLI (`cpu` by default; `cuda`, `vulkan`, `rocm`),
//! forwarded to `hisparse-runtime`, whose [`hisparse_runtime::AnyDevice::open`] opens it. The
//! commands are generic over [`hisparse_core::Device`]; [`with_device!`](crate::with_device!) binds the opened
//! device's concrete type and runs one generic body with it, so dispatch is static (one
//! instantiation per compiled-in backend).

use crate::error::CliError;

pub use hisparse_runtime::BackendKind;
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
use hisparse_runtime::{AnyDevice, OpenError};

/// Whether this binary was built with backend `kind`'s feature.
pub const fn compiled(kind: BackendKind) -> bool {
    match kind {
        BackendKind::Cpu => cfg!(feature = "cpu"),
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Vulkan => cfg!(feature = "vulkan"),
        BackendKind::Rocm => cfg!(feature = "rocm"),
    }
}

/// Opens backend `kind` with device selector `selector` through the runtime. The outer error is
/// the command line's to fix: a backend this binary was not built with, a selector that is no
/// device ([`CliError::usage`]). The inner one is the device's ([`OpenError::Device`]: no driver,
/// no such device), for the caller to report, or to count as skipped cases.
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
pub fn open(kind: BackendKind, selector: &str) -> Result<Result<AnyDevice, OpenError>, CliError> {
    // This binary's features decide, not the runtime's (a workspace build may compile more
    // backends into the runtime than the CLI asked for).
    if !compiled(kind) {
        return Err(CliError::NotCompiled(kind.name()));
    }
    match AnyDevice::open(kind, selector) {
        Ok(dev) => Ok(Ok(dev)),
        Err(OpenError::NotCompiled(k)) => Err(CliError::NotCompiled(k.name())),
        Err(e @ OpenError::BadSelector { .. }) => Err(CliError::usage(format!("--{e}"))),
        Err(e) => Ok(Err(e)),
    }
}

/// Opens the backend `$kind` (a [`BackendKind`]) with device selector `$sel` (`&str`) through
/// [`open`], binds the concrete device inside the runtime's [`AnyDevice`] to `$dev` and
/// evaluates `$body` (a `Result<_, CliError>`) with it, so the commands' generic code gets one
/// static instantiation per compiled-in backend. A backend that is not compiled in gives
/// [`CliError::NotCompiled`]; a backend that cannot open its device gives a one-line
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
        use hisparse_runtime::AnyDevice;
        match $crate::backend::open($kind, $sel) {
            Err(e) => Err(e),
            Ok(Err(e)) => Err($crate::error::CliError::device("cannot open the device", e)),
            #[cfg(feature = "cpu")]
            Ok(Ok(AnyDevice::Cpu($dev))) => $body,
            #[cfg(feature = "cuda")]
            Ok(Ok(AnyDevice::Cuda($dev))) => $body,
            #[cfg(feature = "vulkan")]
            Ok(Ok(AnyDevice::Vulkan($dev))) => $body,
            #[cfg(feature = "rocm")]
            Ok(Ok(AnyDevice::Rocm($dev))) => $body,
            #[allow(unreachable_patterns)]
            Ok(Ok(other)) => Err($crate::error::CliError::NotCompiled(other.kind().name())),
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
