//! The double's hiprtc: programs hold their source; "compiling" checks the options and that the
//! source defines every kernel of the ABI table, and produces a marker blob naming the
//! architecture and the kernels, which the double's `hipModuleLoadData` accepts.

use std::ffi::{CStr, c_char, c_int};
use std::sync::Mutex;

use crate::status::*;

/// First bytes of a blob produced by the double's hiprtc.
const MAGIC: &[u8; 16] = b"HISPARSE-HIPRTC\0";

struct Program {
    source: String,
    code: Option<Vec<u8>>,
    log: String,
}

static PROGRAMS: Mutex<Vec<Option<Program>>> = Mutex::new(Vec::new());

fn programs() -> std::sync::MutexGuard<'static, Vec<Option<Program>>> {
    PROGRAMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Program handles are `index + 1`, so 0 stays invalid.
fn index(handle: *mut std::ffi::c_void) -> Option<usize> {
    (handle as usize).checked_sub(1)
}

/// Length recorded in a marker blob's header, if `head` starts one.
pub fn marker_len(head: &[u8]) -> Option<usize> {
    if head.len() < 20 || head[..16] != MAGIC[..] {
        return None;
    }
    Some(u32::from_le_bytes([head[16], head[17], head[18], head[19]]) as usize)
}

/// The architecture and kernel names of a complete marker blob.
pub fn parse_marker(blob: &[u8]) -> Option<(String, Vec<String>)> {
    let body = blob.get(20..)?;
    let mut parts = body
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let arch = parts.next()?;
    let kernels = parts.take_while(|p| !p.is_empty()).collect();
    Some((arch, kernels))
}

fn marker(arch: &str, kernels: &[&str]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(arch.as_bytes());
    body.push(0);
    for k in kernels {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
    }
    body.push(0);
    // Pad so the blob is never shorter than the 64 bytes the module loader peeks at.
    while body.len() < 64 {
        body.push(0);
    }
    let mut blob = MAGIC.to_vec();
    blob.extend_from_slice(&((20 + body.len()) as u32).to_le_bytes());
    blob.extend_from_slice(&body);
    blob
}

/// Whether `source` defines `name` as a kernel: `name` followed by `(` (after optional spaces),
/// not preceded by an identifier character.
fn defines(source: &str, name: &str) -> bool {
    source.match_indices(name).any(|(at, _)| {
        let before_ok = source[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let after = source[at + name.len()..].trim_start();
        before_ok && after.starts_with('(')
    })
}

/// # Safety
/// hiprtc contract: `prog` is a valid out-pointer; `src` is NUL-terminated; `name` is null or
/// NUL-terminated; no headers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcCreateProgram(
    prog: *mut *mut std::ffi::c_void,
    src: *const c_char,
    _name: *const c_char,
    num_headers: c_int,
    _headers: *const *const c_char,
    _include_names: *const *const c_char,
) -> u32 {
    if prog.is_null() || src.is_null() || num_headers != 0 {
        return RTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: hiprtc contract: `src` is NUL-terminated.
    let source = unsafe { CStr::from_ptr(src) }
        .to_string_lossy()
        .into_owned();
    let mut p = programs();
    p.push(Some(Program {
        source,
        code: None,
        log: String::new(),
    }));
    let handle = p.len();
    // SAFETY: `prog` is a valid out-pointer (checked non-null; hiprtc contract).
    unsafe { prog.write(handle as *mut std::ffi::c_void) };
    RTC_SUCCESS
}

/// # Safety
/// hiprtc contract: `options` holds `num_options` NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcCompileProgram(
    prog: *mut std::ffi::c_void,
    num_options: c_int,
    options: *const *const c_char,
) -> u32 {
    let opts: Vec<String> = (0..num_options.max(0) as usize)
        .map(|i| {
            // SAFETY: hiprtc contract: `options` has `num_options` valid string pointers.
            let p = unsafe { *options.add(i) };
            // SAFETY: each option is NUL-terminated.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        })
        .collect();
    let mut all = programs();
    let Some(Some(p)) = index(prog).and_then(|i| all.get_mut(i)) else {
        return RTC_ERROR_INVALID_PROGRAM;
    };
    let arch = opts.iter().find_map(|o| {
        o.strip_prefix("--gpu-architecture=")
            .or_else(|| o.strip_prefix("--offload-arch="))
    });
    let Some(arch) = arch.map(|a| a.split(':').next().unwrap_or_default().to_owned()) else {
        p.log = "no --gpu-architecture option".into();
        return RTC_ERROR_INVALID_OPTION;
    };
    if !arch.starts_with("gfx") {
        p.log = format!("unknown architecture {arch}");
        return RTC_ERROR_INVALID_OPTION;
    }
    if std::env::var("HISPARSE_HIP_DOUBLE_RTC_FAIL").is_ok_and(|v| v == "1") {
        p.log = "error: injected failure (HISPARSE_HIP_DOUBLE_RTC_FAIL=1)".into();
        return RTC_ERROR_COMPILATION;
    }
    let names: Vec<&str> = crate::exec::kernel_names().collect();
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !defines(&p.source, n))
        .collect();
    if !missing.is_empty() {
        p.log = format!("error: the source defines no kernel {}", missing.join(", "));
        return RTC_ERROR_COMPILATION;
    }
    p.code = Some(marker(&arch, &names));
    p.log = format!("compiled {} kernels for {arch} (test double)", names.len());
    RTC_SUCCESS
}

/// # Safety
/// hiprtc contract: `size` is a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcGetCodeSize(prog: *mut std::ffi::c_void, size: *mut usize) -> u32 {
    let all = programs();
    match index(prog).and_then(|i| all.get(i)) {
        Some(Some(Program { code: Some(c), .. })) if !size.is_null() => {
            // SAFETY: non-null out-pointer per the hiprtc contract.
            unsafe { size.write(c.len()) };
            RTC_SUCCESS
        }
        _ => RTC_ERROR_INVALID_PROGRAM,
    }
}

/// # Safety
/// hiprtc contract: `code` holds at least `hiprtcGetCodeSize` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcGetCode(prog: *mut std::ffi::c_void, code: *mut c_char) -> u32 {
    let all = programs();
    match index(prog).and_then(|i| all.get(i)) {
        Some(Some(Program { code: Some(c), .. })) if !code.is_null() => {
            // SAFETY: the caller sized `code` with hiprtcGetCodeSize.
            unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), code.cast(), c.len()) };
            RTC_SUCCESS
        }
        _ => RTC_ERROR_INVALID_PROGRAM,
    }
}

/// # Safety
/// hiprtc contract: `size` is a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcGetProgramLogSize(
    prog: *mut std::ffi::c_void,
    size: *mut usize,
) -> u32 {
    let all = programs();
    match index(prog).and_then(|i| all.get(i)) {
        Some(Some(p)) if !size.is_null() => {
            // SAFETY: non-null out-pointer per the hiprtc contract.
            unsafe { size.write(p.log.len() + 1) };
            RTC_SUCCESS
        }
        _ => RTC_ERROR_INVALID_PROGRAM,
    }
}

/// # Safety
/// hiprtc contract: `log` holds at least `hiprtcGetProgramLogSize` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcGetProgramLog(prog: *mut std::ffi::c_void, log: *mut c_char) -> u32 {
    let all = programs();
    match index(prog).and_then(|i| all.get(i)) {
        Some(Some(p)) if !log.is_null() => {
            let mut bytes = p.log.clone().into_bytes();
            bytes.push(0);
            // SAFETY: the caller sized `log` with hiprtcGetProgramLogSize (= len + 1).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), log.cast(), bytes.len()) };
            RTC_SUCCESS
        }
        _ => RTC_ERROR_INVALID_PROGRAM,
    }
}

/// # Safety
/// hiprtc contract: `prog` points at a handle from `hiprtcCreateProgram`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hiprtcDestroyProgram(prog: *mut *mut std::ffi::c_void) -> u32 {
    if prog.is_null() {
        return RTC_ERROR_INVALID_INPUT;
    }
    // SAFETY: non-null, per the hiprtc contract a valid handle slot.
    let handle = unsafe { prog.read() };
    let mut all = programs();
    match index(handle).and_then(|i| all.get_mut(i)) {
        Some(slot @ Some(_)) => {
            *slot = None;
            // SAFETY: as above.
            unsafe { prog.write(std::ptr::null_mut()) };
            RTC_SUCCESS
        }
        _ => RTC_ERROR_INVALID_PROGRAM,
    }
}

/// `hiprtcGetErrorString`.
#[unsafe(no_mangle)]
pub extern "C" fn hiprtcGetErrorString(status: u32) -> *const c_char {
    rtc_name(status).as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trips() {
        let blob = marker("gfx1201", &["hs_a", "hs_b"]);
        assert_eq!(marker_len(&blob), Some(blob.len()));
        let (arch, kernels) = parse_marker(&blob).unwrap();
        assert_eq!(arch, "gfx1201");
        assert_eq!(kernels, ["hs_a", "hs_b"]);
        assert_eq!(marker_len(b"\x7fELF0123456789abcdef"), None);
    }

    #[test]
    fn kernel_definitions_are_found_by_name() {
        let src = "HS_KERNEL void hs_remap(int x) {}\nvoid not_hs_copy(int);";
        assert!(defines(src, "hs_remap"));
        assert!(!defines(src, "hs_copy"));
        assert!(!defines(src, "hs_resolve"));
        assert!(crate::exec::kernel_names().all(|k| defines(hisparse_gpu_kernels::HIP_SOURCE, k)));
    }
}
