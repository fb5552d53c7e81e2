//! The only unsafe code of the crate: finding NIXL's C API before anything calls it, and
//! describing memory this crate does not own to NIXL.
//!
//! `nixl-sys` is built with its `stub-api` feature: its functions `dlopen("libnixl_capi.so")` on
//! first use and forward to the real library, and abort the process when it is missing. So the
//! library is loaded here first, with the same name and search path, and every symbol this crate
//! reaches is looked up: a machine without NIXL gets a typed error instead of an abort. The
//! handle stays open for the life of the process, so the stubs' own `dlopen` finds the same
//! library.

use std::sync::OnceLock;

use crate::{MemoryKind, PdError, Region};

/// The library `nixl-sys`'s stubs load.
pub const CAPI_LIBRARY: &str = "libnixl_capi.so";

/// The C API functions the endpoint's calls reach (through `nixl-sys`).
const SYMBOLS: &[&str] = &[
    "nixl_capi_create_agent",
    "nixl_capi_destroy_agent",
    "nixl_capi_get_available_plugins",
    "nixl_capi_get_plugin_params",
    "nixl_capi_create_backend",
    "nixl_capi_register_mem",
    "nixl_capi_deregister_mem",
    "nixl_capi_get_local_md",
    "nixl_capi_load_remote_md",
    "nixl_capi_create_xfer_dlist",
    "nixl_capi_xfer_dlist_add_desc",
    "nixl_capi_create_xfer_req",
    "nixl_capi_post_xfer_req",
    "nixl_capi_get_xfer_status",
    "nixl_capi_create_notif_map",
    "nixl_capi_get_notifs",
    "nixl_capi_notif_map_get_notif",
    "nixl_capi_create_opt_args",
    "nixl_capi_opt_args_set_has_notif",
    "nixl_capi_opt_args_set_notif_msg",
];

static LOADED: OnceLock<Result<libloading::Library, PdError>> = OnceLock::new();

/// Loads NIXL's C API and checks every function this crate uses; the first call decides, later
/// calls return its verdict.
pub fn probe() -> Result<(), PdError> {
    match LOADED.get_or_init(load) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.clone()),
    }
}

fn load() -> Result<libloading::Library, PdError> {
    // SAFETY: loading runs the library's initialisers. libnixl_capi.so and its dependencies are
    // NIXL's own shared objects, whose initialisers only set up their statics; no Rust state is
    // touched and nothing is unloaded while this process runs (the handle lives in a static).
    let lib = unsafe { libloading::Library::new(CAPI_LIBRARY) }.map_err(|e| {
        PdError::LibraryNotFound {
            detail: e.to_string(),
        }
    })?;
    for &symbol in SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this pointer type.
        let found = unsafe { lib.get::<*const ()>(symbol.as_bytes()) };
        if let Err(e) = found {
            return Err(PdError::MissingSymbol {
                symbol: symbol.to_string(),
                detail: e.to_string(),
            });
        }
    }
    Ok(lib)
}

/// A region of memory described to NIXL by address, for registration and transfer lists.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRegion(pub(crate) Region);

impl nixl_sys::MemoryRegion for RawRegion {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.0.address as usize as *const u8
    }

    fn size(&self) -> usize {
        self.0.len as usize
    }
}

impl nixl_sys::NixlDescriptor for RawRegion {
    fn mem_type(&self) -> nixl_sys::MemType {
        mem_type(self.0.memory)
    }

    fn device_id(&self) -> u64 {
        device_id(self.0.memory)
    }
}

/// NIXL's memory type of `kind`.
pub(crate) fn mem_type(kind: MemoryKind) -> nixl_sys::MemType {
    match kind {
        MemoryKind::Host => nixl_sys::MemType::Dram,
        MemoryKind::Device { .. } => nixl_sys::MemType::Vram,
    }
}

/// NIXL's device id of `kind` (0 for host memory).
pub(crate) fn device_id(kind: MemoryKind) -> u64 {
    match kind {
        MemoryKind::Host => 0,
        MemoryKind::Device { ordinal } => u64::from(ordinal),
    }
}

/// The variable that tells UCX where its log goes.
pub const UCX_LOG_FILE: &str = "UCX_LOG_FILE";

/// Sends UCX's log (warnings, and what `UCX_PROTO_INFO` prints) to standard error when the
/// environment does not say where it goes: UCX writes it to standard output by default, where a
/// program's report, or a protocol between processes, goes. Must run before the first agent is
/// created (UCX reads the variable when it is loaded).
///
/// # Safety
///
/// No other thread may read or write the environment during the call: call it before the
/// program starts threads (or before any that touches the environment).
pub unsafe fn transport_log_to_stderr() {
    if std::env::var_os(UCX_LOG_FILE).is_none() {
        // SAFETY: the caller guarantees that no other thread uses the environment meanwhile.
        unsafe { std::env::set_var(UCX_LOG_FILE, "stderr") };
    }
}
