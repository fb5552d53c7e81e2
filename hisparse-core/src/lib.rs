#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Without `alloc` the heap-backed planning items (`KvCacheConfig`, `plan_layout`, `BlockPool`, ...)
// do not exist, yet the docs of what is always built name them, linked where they exist. Every such
// link is checked by the default build's docs (CI runs both), so only this configuration lets
// them dangle.
#![cfg_attr(not(feature = "alloc"), allow(rustdoc::broken_intra_doc_links))]

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
