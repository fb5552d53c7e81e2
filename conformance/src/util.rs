//! Helpers the cases share: buffers holding typed data, bit-exact comparison, error context.

use std::fmt::{self, Display};

use hisparse_core::{Device, Error, ErrorKind};

use crate::{CaseError, CaseResult};

/// Returns a failure from the enclosing case when `cond` is false.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::CaseError::Fail(format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;

/// A failure with a message.
pub(crate) fn fail(msg: impl Into<String>) -> CaseError {
    CaseError::Fail(msg.into())
}

/// Adds context to a device error.
pub(crate) trait Ctx<T> {
    /// Maps an error into a failure that names `what` was being done.
    fn ctx(self, what: &str) -> Result<T, CaseError>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, CaseError> {
        self.map_err(|e| fail(format!("{what}: {e}")))
    }
}

/// A device buffer holding `data` (at least 4 bytes, so empty inputs need no zero-size buffer).
pub(crate) fn dev_bytes<D: Device>(dev: &D, data: &[u8]) -> Result<D::Buffer, CaseError> {
    let mut b = dev
        .alloc(data.len().max(4))
        .ctx(&format!("alloc {} bytes", data.len().max(4)))?;
    dev.upload(&mut b, 0, data).ctx("upload")?;
    Ok(b)
}

/// A device buffer holding `data` as `i32`s (at least 4 bytes).
pub(crate) fn dev_i32<D: Device>(dev: &D, data: &[i32]) -> Result<D::Buffer, CaseError> {
    let mut b = dev
        .alloc((data.len() * 4).max(4))
        .ctx(&format!("alloc {} i32s", data.len()))?;
    dev.upload_i32(&mut b, 0, data).ctx("upload_i32")?;
    Ok(b)
}

/// A device buffer holding `data` as `u16`s (at least 4 bytes).
pub(crate) fn dev_u16<D: Device>(dev: &D, data: &[u16]) -> Result<D::Buffer, CaseError> {
    let mut b = dev
        .alloc((data.len() * 2).max(4))
        .ctx(&format!("alloc {} u16s", data.len()))?;
    dev.upload_u16(&mut b, 0, data).ctx("upload_u16")?;
    Ok(b)
}

/// The first `n` bytes of a device buffer.
pub(crate) fn read_bytes<D: Device>(
    dev: &D,
    buf: &D::Buffer,
    n: usize,
) -> Result<Vec<u8>, CaseError> {
    let mut v = vec![0u8; n];
    dev.download(buf, 0, &mut v).ctx("download")?;
    Ok(v)
}

/// The first `n` `i32`s of a device buffer.
pub(crate) fn read_i32<D: Device>(
    dev: &D,
    buf: &D::Buffer,
    n: usize,
) -> Result<Vec<i32>, CaseError> {
    let mut v = vec![0; n];
    dev.download_i32(buf, 0, &mut v).ctx("download_i32")?;
    Ok(v)
}

/// The first `n` `u16`s of a device buffer.
pub(crate) fn read_u16<D: Device>(
    dev: &D,
    buf: &D::Buffer,
    n: usize,
) -> Result<Vec<u16>, CaseError> {
    let mut v = vec![0; n];
    dev.download_u16(buf, 0, &mut v).ctx("download_u16")?;
    Ok(v)
}

/// A pinned host buffer holding `data` (at least 16 bytes).
pub(crate) fn pinned_bytes<D: Device>(dev: &D, data: &[u8]) -> Result<D::HostBuffer, CaseError> {
    let len = data.len().max(16);
    let mut b = dev
        .alloc_pinned(len)
        .ctx(&format!("alloc_pinned {len} bytes"))?;
    dev.write_pinned(&mut b, 0, data).ctx("write_pinned")?;
    Ok(b)
}

/// The first `n` bytes of a pinned buffer.
pub(crate) fn read_pinned<D: Device>(
    dev: &D,
    buf: &D::HostBuffer,
    n: usize,
) -> Result<Vec<u8>, CaseError> {
    let mut v = vec![0u8; n];
    dev.read_pinned(buf, 0, &mut v).ctx("read_pinned")?;
    Ok(v)
}

/// Compares two sequences bit-exactly; on a difference names the first mismatch and how many
/// elements differ.
pub(crate) fn same<T: PartialEq + fmt::Debug>(what: &str, got: &[T], want: &[T]) -> CaseResult {
    if got.len() != want.len() {
        return Err(fail(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        )));
    }
    let mut diffs = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g != w);
    if let Some((i, (g, w))) = diffs.next() {
        let more = diffs.count();
        return Err(fail(format!(
            "{what}[{i}] = {g:?}, expected {w:?} ({} element(s) differ)",
            more + 1
        )));
    }
    Ok(())
}

/// Checks that a call was refused with an `InvalidArgument` error.
pub(crate) fn expect_invalid<T, E: Error>(what: &str, r: Result<T, E>) -> CaseResult {
    match r {
        Ok(_) => Err(fail(format!(
            "{what}: accepted, expected an invalid-argument error"
        ))),
        Err(e) if e.kind() == ErrorKind::InvalidArgument => Ok(()),
        Err(e) => Err(fail(format!(
            "{what}: error kind `{}` ({e}), expected `invalid argument`",
            e.kind()
        ))),
    }
}

/// A sentinel pattern for output buffers whose untouched parts must survive a call.
pub(crate) const SENTINEL: i32 = 0x5A5A_5A5A;

/// Adds a seed-independent label to a failure message.
pub(crate) fn at_step<T>(step: usize, r: Result<T, CaseError>) -> Result<T, CaseError> {
    r.map_err(|e| match e {
        CaseError::Fail(m) => CaseError::Fail(format!("step {step}: {m}")),
        other => other,
    })
}
