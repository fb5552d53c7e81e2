#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod config;
mod counters;
mod decode;
mod error;
mod runtime;
mod step;
mod tables;

pub use config::RuntimeConfig;
pub use counters::{Counters, PoolUsage};
pub use decode::{Indices, TopK};
pub use error::RuntimeError;
pub use runtime::{Pools, Runtime};
pub use step::{ReportError, WorkerReport};
