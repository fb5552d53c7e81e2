//! NVRTC: its version and the compilation of a translation unit to PTX.

use std::ffi::CString;

use cudarc::nvrtc::sys as nvrtc;

fn nvrtc_check(call: &str, code: nvrtc::nvrtcResult) -> std::result::Result<(), String> {
    if code == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {code:?}"))
    }
}

/// NVRTC's version `(major, minor)`. Call only after NVRTC was found.
pub(crate) fn nvrtc_version() -> std::result::Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid out-pointers.
    nvrtc_check("nvrtcVersion", unsafe {
        nvrtc::nvrtcVersion(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

/// Compiles `source` with `options`; returns the PTX (NUL-terminated) or the log.
/// Call only after NVRTC was found.
pub(crate) fn nvrtc_compile(
    source: &str,
    name: &str,
    options: &[&str],
) -> std::result::Result<CString, String> {
    let src = CString::new(source).map_err(|_| "source contains NUL".to_owned())?;
    let cname = CString::new(name).map_err(|_| "name contains NUL".to_owned())?;
    let opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(*o).map_err(|_| "option contains NUL".to_owned()))
        .collect::<std::result::Result<_, _>>()?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = std::ptr::null_mut();
    // SAFETY: `src` and `cname` are NUL-terminated and outlive the call; no headers are passed.
    nvrtc_check("nvrtcCreateProgram", unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    // SAFETY: `prog` is a live program; `opt_ptrs` holds `opts.len()` NUL-terminated strings.
    let compiled =
        unsafe { nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let mut log_len = 0usize;
    // SAFETY: `prog` is live; `log_len` is an out-pointer.
    let _ = unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut log_len) };
    let mut log = vec![0u8; log_len.max(1)];
    // SAFETY: `log` holds `log_len` bytes, what NVRTC said the log needs.
    let _ = unsafe { nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) };
    let log = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .trim()
        .to_owned();
    let result = if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Err(format!("nvrtcCompileProgram: {compiled:?}\n{log}"))
    } else {
        let mut n = 0usize;
        // SAFETY: `prog` compiled; `n` is an out-pointer.
        let sized = nvrtc_check("nvrtcGetPTXSize", unsafe {
            nvrtc::nvrtcGetPTXSize(prog, &mut n)
        });
        sized.and_then(|()| {
            let mut ptx = vec![0u8; n.max(1)];
            // SAFETY: `ptx` holds `n` bytes, the size NVRTC reported (NUL included).
            nvrtc_check("nvrtcGetPTX", unsafe {
                nvrtc::nvrtcGetPTX(prog, ptx.as_mut_ptr().cast())
            })?;
            let end = ptx.iter().position(|&b| b == 0).unwrap_or(ptx.len());
            ptx.truncate(end);
            CString::new(ptx).map_err(|_| "PTX contains NUL".to_owned())
        })
    };
    // SAFETY: destroys the program created above once.
    let _ = unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    result
}
