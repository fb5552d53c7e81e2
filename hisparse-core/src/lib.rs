#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod config;
#[cfg(feature = "alloc")]
pub mod coordinator;
pub mod device;
pub mod error;
pub mod layout;
pub mod model;
pub mod ops;
pub mod pool;
pub mod presets;
#[cfg(feature = "alloc")]
pub mod wire;

pub use device::{Device, MemoryInfo};
pub use error::{Error, ErrorKind, OpError, OpName};
