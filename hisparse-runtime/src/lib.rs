#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// Unsafe code lives only in `any::lend` (the engine-lending entries), which allows it.
#![deny(unsafe_code)]

#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
mod any;
mod config;
mod counters;
mod decode;
mod error;
mod indexer;
mod kind;
mod modes;
pub mod plan;
mod runtime;
mod shared;
mod slots;
mod stats;
mod step;
mod streams;
mod tables;

#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
pub use any::{
    AnyBuffer, AnyDevice, AnyError, AnyEvent, AnyHostBuffer, AnyStream, DeviceVisitor, OpenError,
    open_with,
};
pub use config::{DEFAULT_MAX_BATCHED_TOKENS, RuntimeConfig};
pub use counters::{Counters, PoolUsage};
pub use decode::{Indices, LayerCall, Swap, TopK};
pub use error::RuntimeError;
/// Host pools: their configuration ([`host_memory::HostPoolConfig`]), set-up reports, releases
/// and the host's limits.
pub use hisparse_host_memory as host_memory;
pub use kind::{BackendKind, UnknownBackend};
pub use modes::{CompressedSlots, IndexerCacheSide, PrefillWorkspace, RemapModes};
pub use runtime::{Pools, Runtime};
pub use shared::{SharedHostPool, SharedSegment, ShmError};
pub use step::{ReportError, WorkerReport};
pub use streams::{MAX_LENT_STREAMS, StreamId};
