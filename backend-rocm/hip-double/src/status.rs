//! `hipError_t` and `hiprtcResult` values the double returns, with their names.

/// `hipSuccess`.
pub const HIP_SUCCESS: u32 = 0;
/// `hipErrorInvalidValue`.
pub const HIP_ERROR_INVALID_VALUE: u32 = 1;
/// `hipErrorOutOfMemory`.
pub const HIP_ERROR_OUT_OF_MEMORY: u32 = 2;
/// `hipErrorInvalidConfiguration`.
pub const HIP_ERROR_INVALID_CONFIGURATION: u32 = 9;
/// `hipErrorNoDevice`.
pub const HIP_ERROR_NO_DEVICE: u32 = 100;
/// `hipErrorInvalidDevice`.
pub const HIP_ERROR_INVALID_DEVICE: u32 = 101;
/// `hipErrorInvalidImage`.
pub const HIP_ERROR_INVALID_IMAGE: u32 = 200;
/// `hipErrorNoBinaryForGpu`.
pub const HIP_ERROR_NO_BINARY_FOR_GPU: u32 = 209;
/// `hipErrorInvalidHandle`.
pub const HIP_ERROR_INVALID_HANDLE: u32 = 400;
/// `hipErrorNotFound`.
pub const HIP_ERROR_NOT_FOUND: u32 = 500;
/// `hipErrorNotReady`.
pub const HIP_ERROR_NOT_READY: u32 = 600;
/// `hipErrorIllegalAddress`.
pub const HIP_ERROR_ILLEGAL_ADDRESS: u32 = 700;
/// `hipErrorHostMemoryAlreadyRegistered`.
pub const HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;
/// `hipErrorHostMemoryNotRegistered`.
pub const HIP_ERROR_HOST_MEMORY_NOT_REGISTERED: u32 = 713;
/// `hipErrorStreamCaptureUnsupported`: an operation a capture in progress forbids.
pub const HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED: u32 = 900;
/// `hipErrorStreamCaptureInvalidated`: the capture was invalidated by a forbidden operation.
pub const HIP_ERROR_STREAM_CAPTURE_INVALIDATED: u32 = 901;
/// `hipErrorIllegalState`: e.g. ending a capture that was never begun.
pub const HIP_ERROR_ILLEGAL_STATE: u32 = 401;
/// `hipErrorCapturedEvent`: an event recorded in a capture, used outside it.
pub const HIP_ERROR_CAPTURED_EVENT: u32 = 907;

/// `HIPRTC_SUCCESS`.
pub const RTC_SUCCESS: u32 = 0;
/// `HIPRTC_ERROR_INVALID_INPUT`.
pub const RTC_ERROR_INVALID_INPUT: u32 = 3;
/// `HIPRTC_ERROR_INVALID_PROGRAM`.
pub const RTC_ERROR_INVALID_PROGRAM: u32 = 4;
/// `HIPRTC_ERROR_INVALID_OPTION`.
pub const RTC_ERROR_INVALID_OPTION: u32 = 5;
/// `HIPRTC_ERROR_COMPILATION`.
pub const RTC_ERROR_COMPILATION: u32 = 6;

/// `hipGetErrorName` of the statuses above, as NUL-terminated static strings.
pub fn hip_name(status: u32) -> &'static [u8] {
    match status {
        HIP_SUCCESS => b"hipSuccess\0",
        HIP_ERROR_INVALID_VALUE => b"hipErrorInvalidValue\0",
        HIP_ERROR_OUT_OF_MEMORY => b"hipErrorOutOfMemory\0",
        HIP_ERROR_INVALID_CONFIGURATION => b"hipErrorInvalidConfiguration\0",
        HIP_ERROR_NO_DEVICE => b"hipErrorNoDevice\0",
        HIP_ERROR_INVALID_DEVICE => b"hipErrorInvalidDevice\0",
        HIP_ERROR_INVALID_IMAGE => b"hipErrorInvalidImage\0",
        HIP_ERROR_NO_BINARY_FOR_GPU => b"hipErrorNoBinaryForGpu\0",
        HIP_ERROR_INVALID_HANDLE => b"hipErrorInvalidHandle\0",
        HIP_ERROR_NOT_FOUND => b"hipErrorNotFound\0",
        HIP_ERROR_ILLEGAL_ADDRESS => b"hipErrorIllegalAddress\0",
        HIP_ERROR_NOT_READY => b"hipErrorNotReady\0",
        HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED => b"hipErrorHostMemoryAlreadyRegistered\0",
        HIP_ERROR_HOST_MEMORY_NOT_REGISTERED => b"hipErrorHostMemoryNotRegistered\0",
        HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED => b"hipErrorStreamCaptureUnsupported\0",
        HIP_ERROR_STREAM_CAPTURE_INVALIDATED => b"hipErrorStreamCaptureInvalidated\0",
        HIP_ERROR_ILLEGAL_STATE => b"hipErrorIllegalState\0",
        HIP_ERROR_CAPTURED_EVENT => b"hipErrorCapturedEvent\0",
        _ => b"hipErrorUnknown\0",
    }
}

/// `hiprtcGetErrorString` of the results above.
pub fn rtc_name(status: u32) -> &'static [u8] {
    match status {
        RTC_SUCCESS => b"HIPRTC_SUCCESS\0",
        RTC_ERROR_INVALID_INPUT => b"HIPRTC_ERROR_INVALID_INPUT\0",
        RTC_ERROR_INVALID_PROGRAM => b"HIPRTC_ERROR_INVALID_PROGRAM\0",
        RTC_ERROR_INVALID_OPTION => b"HIPRTC_ERROR_INVALID_OPTION\0",
        RTC_ERROR_COMPILATION => b"HIPRTC_ERROR_COMPILATION\0",
        _ => b"HIPRTC_ERROR_INTERNAL_ERROR\0",
    }
}
