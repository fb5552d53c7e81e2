//! Finding NVRTC and compiling the kernel source with it.
//!
//! cudarc loads `libnvrtc` by name through the dynamic loader, which only searches the default
//! path and `LD_LIBRARY_PATH` (read once at process start). CUDA installs NVRTC elsewhere
//! (`/usr/local/cuda-13.0/targets/x86_64-linux/lib`), so when the name lookup fails this module
//! searches the usual CUDA locations, honouring `CUDA_PATH`, `CUDA_HOME` and `CUDA_ROOT`, and
//! loads `libnvrtc-builtins.so.13.*` and `libnvrtc.so.13` from the first directory that has them
//! by full path. Once loaded, the dynamic loader answers later loads by name (cudarc's) with the
//! same libraries through their SONAME.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::CudaError;
use crate::ffi;

/// File name of the CUDA 13 NVRTC library.
pub const NVRTC_SONAME: &str = "libnvrtc.so.13";

/// Directories searched for NVRTC when it is not on the loader's path, in order.
pub fn candidate_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("cuda-"))
                })
                .collect()
        })
        .unwrap_or_default();
    versioned.sort();
    versioned.reverse();
    roots.extend(versioned);
    let mut dirs = Vec::new();
    for r in roots {
        for sub in ["", "lib64", "lib", "targets/x86_64-linux/lib"] {
            let d = if sub.is_empty() {
                r.clone()
            } else {
                r.join(sub)
            };
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

fn load_from(dir: &Path) -> bool {
    let lib = dir.join(NVRTC_SONAME);
    if !lib.is_file() {
        return false;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut builtins: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.13"))
            })
            .collect();
        builtins.sort();
        for b in builtins {
            ffi::preload(&b);
        }
    }
    ffi::preload(&lib) && ffi::nvrtc_present()
}

/// Makes NVRTC loadable: `Ok` if it already is or was found in [`candidate_dirs`], otherwise
/// [`CudaError::NoNvrtc`] naming the directories searched. The answer is cached.
pub fn ensure() -> Result<(), CudaError> {
    static FOUND: OnceLock<Result<(), Vec<String>>> = OnceLock::new();
    let r = FOUND.get_or_init(|| {
        if ffi::nvrtc_present() {
            return Ok(());
        }
        let dirs = candidate_dirs();
        if dirs.iter().any(|d| load_from(d)) {
            return Ok(());
        }
        Err(dirs.iter().map(|d| d.display().to_string()).collect())
    });
    r.clone()
        .map_err(|searched| CudaError::NoNvrtc { searched })
}

/// NVRTC's version `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    ensure()?;
    ffi::nvrtc_version().map_err(|log| CudaError::Compile { log })
}

/// NVRTC options for a virtual architecture such as `compute_90`.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
        "-lineinfo".to_owned(),
    ]
}

/// The translation unit the backend compiles: [`hisparse_gpu_kernels::CUDA_SOURCE`].
pub fn source() -> &'static str {
    hisparse_gpu_kernels::CUDA_SOURCE
}

/// Compiles the CUDA kernel source ([`source`]) for the virtual architecture `arch` (e.g.
/// `compute_90`) and returns the PTX. Needs NVRTC, not a GPU.
pub fn compile(arch: &str) -> Result<CString, CudaError> {
    ensure()?;
    let opts = options(arch);
    let refs: Vec<&str> = opts.iter().map(String::as_str).collect();
    ffi::nvrtc_compile(source(), hisparse_gpu_kernels::SOURCE_NAME, &refs).map_err(|log| {
        CudaError::Compile {
            log: format!("{arch}: {log}"),
        }
    })
}

/// PTX per architecture, compiled once per process.
pub(crate) fn cached_ptx(major: i32, minor: i32) -> Result<std::sync::Arc<CString>, CudaError> {
    type Cache = Mutex<Vec<((i32, i32), std::sync::Arc<CString>)>>;
    static CACHE: Cache = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, ptx)) = cache.iter().find(|(k, _)| *k == (major, minor)) {
        return Ok(ptx.clone());
    }
    let ptx = std::sync::Arc::new(compile(&format!("compute_{major}{minor}"))?);
    cache.push(((major, minor), ptx.clone()));
    Ok(ptx)
}
