#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod capture;
mod context;
mod device;
pub mod elf;
mod error;
mod ffi;
pub mod kernels;
mod lent;
mod memory;
mod pinned;

pub use device::RocmDevice;
pub use error::RocmError;
pub use kernels::KernelSource;
pub use memory::{RocmBuffer, RocmEvent, RocmHostBuffer, RocmStream};
