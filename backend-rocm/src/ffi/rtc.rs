//! The hiprtc library: compiling the kernel source where no embedded code object fits.

use std::ffi::{CStr, c_char, c_int};

use libloading::Library;

use super::{Handle, RTC_SUCCESS, RtcFns, RtcStatus, load_library};

/// The loaded hiprtc library.
pub struct Rtc {
    fns: RtcFns,
    _lib: Library,
}

// SAFETY: plain function pointers into a library kept loaded by the value; hiprtc programs are
// only used by the thread that created them.
unsafe impl Send for Rtc {}
// SAFETY: as above.
unsafe impl Sync for Rtc {}

/// A compile failure: the hiprtc status, its name, and the compiler log.
#[derive(Debug)]
pub struct RtcFailure {
    /// Which hiprtc call failed.
    pub call: &'static str,
    /// Status name.
    pub status: String,
    /// Compiler log (may be empty).
    pub log: String,
}

impl Rtc {
    /// Loads `libhiprtc` and resolves every entry point.
    pub fn load() -> Result<Rtc, String> {
        let (lib, path) = load_library("hiprtc")?;
        let fns = RtcFns::resolve(&lib).map_err(|e| format!("{path}: {e}"))?;
        Ok(Rtc { fns, _lib: lib })
    }

    fn status_name(&self, s: RtcStatus) -> String {
        // SAFETY: accepts any value; returns a static string or null.
        let p = unsafe { (self.fns.hiprtcGetErrorString)(s) };
        if p.is_null() {
            return format!("hiprtcResult {s}");
        }
        // SAFETY: non-null results are NUL-terminated static strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Compiles `source` with `options`, returning the code object.
    pub fn compile(
        &self,
        source: &CStr,
        name: &CStr,
        options: &[&CStr],
    ) -> Result<Vec<u8>, RtcFailure> {
        let fail = |call, s, log| RtcFailure {
            call,
            status: self.status_name(s),
            log,
        };
        let mut prog: Handle = std::ptr::null_mut();
        // SAFETY: `prog` is a valid out-pointer; `source` and `name` are NUL-terminated; no
        // headers are passed (count 0, null arrays).
        let s = unsafe {
            (self.fns.hiprtcCreateProgram)(
                &mut prog,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if s != RTC_SUCCESS {
            return Err(fail("hiprtcCreateProgram", s, String::new()));
        }
        let result = self.compile_program(prog, options);
        // SAFETY: `prog` was created above and is not used after this call.
        unsafe { (self.fns.hiprtcDestroyProgram)(&mut prog) };
        result
    }

    fn compile_program(&self, prog: Handle, options: &[&CStr]) -> Result<Vec<u8>, RtcFailure> {
        let opts: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog` is a live program; `opts` holds `opts.len()` NUL-terminated strings that
        // outlive the call.
        let s =
            unsafe { (self.fns.hiprtcCompileProgram)(prog, opts.len() as c_int, opts.as_ptr()) };
        if s != RTC_SUCCESS {
            return Err(RtcFailure {
                call: "hiprtcCompileProgram",
                status: self.status_name(s),
                log: self.log(prog),
            });
        }
        let mut size = 0usize;
        // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
        let s = unsafe { (self.fns.hiprtcGetCodeSize)(prog, &mut size) };
        if s != RTC_SUCCESS {
            return Err(RtcFailure {
                call: "hiprtcGetCodeSize",
                status: self.status_name(s),
                log: String::new(),
            });
        }
        let mut code = vec![0u8; size];
        // SAFETY: `code` holds exactly the `size` bytes hiprtc reported.
        let s = unsafe { (self.fns.hiprtcGetCode)(prog, code.as_mut_ptr().cast()) };
        if s != RTC_SUCCESS {
            return Err(RtcFailure {
                call: "hiprtcGetCode",
                status: self.status_name(s),
                log: String::new(),
            });
        }
        Ok(code)
    }

    fn log(&self, prog: Handle) -> String {
        let mut size = 0usize;
        // SAFETY: `prog` is live; `size` is a valid out-pointer.
        if unsafe { (self.fns.hiprtcGetProgramLogSize)(prog, &mut size) } != RTC_SUCCESS {
            return String::new();
        }
        let mut log = vec![0u8; size.max(1)];
        // SAFETY: `log` holds at least the `size` bytes hiprtc reported.
        if unsafe { (self.fns.hiprtcGetProgramLog)(prog, log.as_mut_ptr().cast()) } != RTC_SUCCESS {
            return String::new();
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        String::from_utf8_lossy(&log[..end]).into_owned()
    }
}
