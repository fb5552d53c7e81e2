//! Benchmark routines shared by the criterion benches and `hisparse bench`.
//!
//! [`device`] measures the data-plane operations of any [`hisparse_core::Device`] — remap, the
//! resolver, the swap-in gather of 656 B rows and the multi-layer page backup and restore — and,
//! in the same run, the ceilings they are judged against: host `memcpy`, the device's own
//! bandwidth (`copy_on_device`) and host↔device bulk copies (`copy_to_device` /
//! `copy_to_host`). Every figure is reported beside its ceiling, so a number is never read
//! without what it could have been.
//!
//! Not here: the criterion benches of the planning core (pools, scheduler step) live in
//! `benches/benches/`.

pub mod device;

pub use device::{BenchConfig, Ceiling, Figure, Report, run};

/// The repository README's Rust snippets, compiled and run as doctests so the embedding example
/// cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
