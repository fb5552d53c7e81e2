//! Lending the engine's arrays to the device: where each may live, and errors that name it.

use hisparse_runtime::{AnyBuffer, AnyDevice, BackendKind};
use pyo3::prelude::*;

use crate::arrays::{Array, Memory};
use crate::errors::{invalid, to_py};

/// Whether memory `m` can be device data of backend `kind`.
fn device_memory_ok(kind: BackendKind, m: Memory) -> bool {
    match kind {
        BackendKind::Cpu => m == Memory::Host,
        BackendKind::Cuda => matches!(m, Memory::Cuda(_)),
        BackendKind::Rocm => matches!(m, Memory::Rocm(_)),
        // The Vulkan backend answers every lending call with its own `Unsupported` error.
        BackendKind::Vulkan => true,
    }
}

fn device_memory_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cpu => "host memory (a numpy array or a CPU tensor)",
        BackendKind::Cuda => "CUDA device memory (a CUDA tensor)",
        BackendKind::Rocm => "ROCm device memory",
        BackendKind::Vulkan => "runtime-owned memory",
    }
}

/// Lends `arr` to `dev` as a device buffer, after checking where it lives.
pub(super) fn lend_device(dev: &AnyDevice, arr: &Array, what: &str) -> PyResult<AnyBuffer> {
    let kind = dev.kind();
    arr.expect_memory(
        what,
        device_memory_name(kind),
        device_memory_ok(kind, arr.memory),
    )?;
    if arr.bytes == 0 {
        return Err(invalid(format!(
            "{what} is empty; pass at least one element"
        )));
    }
    // SAFETY: the array's Python object (or DLPack capsule) is held in `arr`, which the caller
    // keeps for as long as the buffer lives (a call, a prepared call, or — for pools — the
    // runtime's life, drained on drop); its memory is where `expect_memory` checked, the
    // backend checks what its driver can tell (device, extent), and the engine's duty not to
    // touch the memory unordered while work is in flight is stated in the Python API's
    // documentation.
    unsafe { dev.lend_device_memory(arr.ptr, arr.bytes) }.map_err(|e| to_py(e).tap_message(what))
}

/// Adds the array's name to a lending error.
pub(super) trait TapMessage {
    fn tap_message(self, what: &str) -> PyErr;
}

impl TapMessage for PyErr {
    fn tap_message(self, what: &str) -> PyErr {
        Python::attach(|py| {
            let v = self.value(py);
            if let Ok(m) = v.getattr("message").and_then(|m| m.extract::<String>()) {
                let m = format!("{what}: {m}");
                let _ = v.setattr("message", m.clone());
                let _ = v.setattr("args", (m,));
            }
        });
        self
    }
}
