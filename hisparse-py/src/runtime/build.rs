//! Building a runtime: the backend opened by name, the engine's pools and stream lent to it (or
//! the runtime's own allocated), everything checked before anything is taken.

use hisparse_core::Device;
use hisparse_core::ops::BufferLen;
use hisparse_runtime::{AnyDevice, BackendKind, Pools, Runtime as Core, RuntimeConfig};
use pyo3::prelude::*;

use super::lend::{TapMessage, lend_device};
use super::streams::Streams;
use super::{Owned, State};
use crate::arrays::{Array, Memory, array, check_disjoint};
use crate::errors::{invalid, to_py};
use crate::layout::Layout;

/// What `Runtime(...)` was asked for.
pub(super) struct Request<'a, 'py> {
    pub layout: &'a Layout,
    pub backend: &'a str,
    pub device: &'a str,
    pub cfg: RuntimeConfig,
    pub device_pool: Option<&'a Bound<'py, PyAny>>,
    pub host_pool: Option<&'a Bound<'py, PyAny>>,
    pub stream: Option<u64>,
}

/// The device ordinal of a CUDA or ROCm selector (`""` = 0); other backends' selectors name no
/// ordinal PyTorch knows.
fn device_index(kind: BackendKind, selector: &str) -> i32 {
    match kind {
        BackendKind::Cuda | BackendKind::Rocm => selector.trim().parse().unwrap_or(0),
        _ => 0,
    }
}

/// Reads `obj` as the device pool: writable, checked against the backend when lent.
fn device_pool_array(obj: &Bound<'_, PyAny>) -> PyResult<Array> {
    let arr = array(obj, "device_pool")?;
    arr.expect_writable("device_pool")?;
    Ok(arr)
}

/// Reads `obj` as the host pool: writable host memory.
fn host_pool_array(obj: &Bound<'_, PyAny>) -> PyResult<Array> {
    let arr = array(obj, "host_pool")?;
    arr.expect_writable("host_pool")?;
    arr.expect_memory(
        "host_pool",
        "host memory (pinned or not)",
        arr.memory == Memory::Host,
    )?;
    Ok(arr)
}

/// Builds the runtime's state.
pub(super) fn build(req: Request<'_, '_>) -> PyResult<State> {
    let kind: BackendKind = req.backend.parse().map_err(|e| invalid(format!("{e}")))?;
    // Lent arrays are read (and checked against each other) before the device opens.
    let device_arr = req.device_pool.map(device_pool_array).transpose()?;
    let host_arr = req.host_pool.map(host_pool_array).transpose()?;
    if let (Some(d), Some(h)) = (&device_arr, &host_arr) {
        check_disjoint(&[("device_pool", d), ("host_pool", h)])?;
    }
    let dev = AnyDevice::open(kind, req.device).map_err(to_py)?;
    let kv = req.layout.kv.clone();
    let device_index = device_index(kind, req.device);
    let streams = Streams::new(kind, device_index, req.stream);
    let fingerprint = req.layout.fingerprint;
    if device_arr.is_none() && host_arr.is_none() && req.stream.is_none() {
        let rt = Core::new(dev, kv, req.cfg).map_err(to_py)?;
        return Ok(State {
            rt: Owned::new(rt),
            lent: Vec::new(),
            streams,
            device_index,
            fingerprint,
            release_in_background: false,
        });
    }
    let mut lent = Vec::new();
    let device_buf = match device_arr {
        Some(arr) => {
            let buf = lend_device(&dev, &arr, "device_pool")?;
            lent.push(arr);
            buf
        }
        None => {
            let bytes = usize::try_from(kv.gpu_pool_bytes())
                .map_err(|_| invalid("the device pool exceeds the address space"))?;
            dev.alloc(bytes).map_err(to_py)?
        }
    };
    let host_lent = host_arr.is_some();
    let host_buf = match host_arr {
        Some(arr) => {
            // SAFETY: as for `lend_device`: the object is kept in `lent` for the runtime's life
            // and the runtime drains its work before dropping it; the backend checks alignment
            // and, on GPUs, pins or checks the pinning with the driver.
            let buf = unsafe { dev.lend_host_memory(arr.ptr as usize as *mut u8, arr.bytes) }
                .map_err(|e| to_py(e).tap_message("host_pool"))?;
            lent.push(arr);
            buf
        }
        None => {
            let bytes = usize::try_from(kv.host_pool_bytes())
                .map_err(|_| invalid("the host pool exceeds the address space"))?;
            dev.alloc_pinned(bytes).map_err(to_py)?
        }
    };
    let stream = match req.stream {
        // SAFETY: the engine passes a live stream handle of this device and keeps it alive for
        // the runtime's life (documented on `Runtime`); the backend checks its context.
        Some(raw) => Some(
            unsafe { dev.lend_stream(raw as usize as *mut core::ffi::c_void) }
                .map_err(|e| to_py(e).tap_message("stream"))?,
        ),
        None => None,
    };
    // A lent pool this process registered (not one pinned already by its owner), large enough
    // that unregistering it is worth a thread of its own.
    let release_in_background = host_lent
        && host_buf.setup().is_some()
        && host_buf.byte_len() >= hisparse_runtime::host_memory::PARALLEL_FROM as u64;
    let pools = Pools {
        device: device_buf,
        host: host_buf,
    };
    let rt = Core::with_pools(dev, kv, req.cfg, pools, stream).map_err(to_py)?;
    Ok(State {
        rt: Owned::new(rt),
        lent,
        streams,
        device_index,
        fingerprint,
        release_in_background,
    })
}
