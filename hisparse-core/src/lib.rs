#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(test)]
extern crate std;

// The data plane: what a backend executes (see the module docs for the contract).
pub mod data_plane;
pub use data_plane::{device, error, ops};

// The planning side: what lives where, decided on the scheduler.
pub mod config;
#[cfg(feature = "alloc")]
pub mod coordinator;
pub mod layout;
pub mod model;
pub mod pool;
pub mod presets;
#[cfg(feature = "alloc")]
pub mod wire;

pub use device::{Device, MemoryInfo};
pub use error::{Error, ErrorKind, OpError, OpName};
