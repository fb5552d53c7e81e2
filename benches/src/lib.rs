//! The criterion benches of the planning core (pools, scheduler step, the CPU gather) live in
//! `benches/benches/`; the device benchmark routines behind `hisparse bench` are the published
//! crate `hisparse-device-bench`.
//!
//! This library holds no code of its own: it compiles the repository README's Rust snippets as
//! doctests, so the embedding example cannot rot.

/// The repository README's Rust snippets, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
