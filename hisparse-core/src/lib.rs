#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod device;
pub mod error;
pub mod ops;

pub use device::Device;
pub use error::{Error, ErrorKind, OpError, OpName};
