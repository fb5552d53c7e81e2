//! The data plane: what a backend executes, and nothing of what decides it.
//!
//! * [`device`]: the [`Device`](device::Device) trait every backend implements;
//! * [`ops`]: each operation's descriptor (its shape, checked before anything is enqueued) and
//!   the reference implementation that *is* its specification;
//! * [`error`]: the portable [`ErrorKind`](error::ErrorKind) and the descriptors' typed
//!   [`OpError`](error::OpError).
//!
//! The contract: these modules import nothing of the planning side (`model`, `presets`,
//! `config`, `layout`, `pool`, `coordinator`, `wire`); the planning side builds on them. A
//! backend therefore depends on plain descriptors and slices, never on a planner's state, and
//! the test `tests/data_plane.rs` keeps the rule. They are reached at their old paths too
//! (`hisparse_core::device`, `::ops`, `::error`).

pub mod device;
pub mod error;
pub mod ops;
