//! Scenarios that need a backend hook beyond [`Device`]: engine-lent buffers and streams
//! ([`lending`]), a graph captured through the driver's own API ([`capture`]), a backend's fused
//! swap-in launch ([`fused`]). Each is generic over the device and a small trait the backend's
//! test implements; the CUDA backend runs them on a GPU, the ROCm backend against the HIP test
//! double (and on a GPU).

pub mod capture;
pub mod fused;
pub mod lending;

use hisparse_core::{Device, Error};

use crate::util;

/// Result of the scenarios and their hooks: a message naming what failed.
pub type Res<T> = Result<T, String>;

/// A backend error as a message with its portable kind.
pub fn device_err<E: Error>(err: E) -> String {
    format!("{err} [{}]", err.kind())
}

/// A device buffer holding `data` as `i32`s.
fn upload_i32<D: Device>(dev: &D, data: &[i32]) -> Res<D::Buffer> {
    util::dev_i32(dev, data).map_err(|e| e.to_string())
}

/// The first `n` `i32`s of a device buffer.
fn download_i32<D: Device>(dev: &D, buf: &D::Buffer, n: usize) -> Res<Vec<i32>> {
    util::read_i32(dev, buf, n).map_err(|e| e.to_string())
}
