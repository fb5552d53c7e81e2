//! Loading the driver and NVRTC: probes that call nothing, and libraries loaded by full path.

use std::path::Path;
use std::sync::Mutex;

use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc;

/// Whether the CUDA driver library can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names; calls nothing in it.
    unsafe { sys::is_culib_present() }
}

/// Whether NVRTC can be loaded by cudarc (by name, through the dynamic loader).
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc by its usual names; calls nothing in it.
    unsafe { nvrtc::is_culib_present() }
}

/// Libraries loaded by full path, kept loaded for the life of the process so that later loads by
/// name (cudarc's) resolve to them through their SONAME.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// Loads the shared library at `path` and keeps it loaded. Returns whether it loaded.
pub(crate) fn preload(path: &Path) -> bool {
    // SAFETY: loading NVIDIA's NVRTC libraries runs only their (side-effect-free) initialisers;
    // the handle is kept in a process-wide list and never unloaded, so no symbol outlives it.
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            PRELOADED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lib);
            true
        }
        Err(_) => false,
    }
}
