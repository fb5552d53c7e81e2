//! HiSparse's one bench tree. The criterion benches of the planning core (pools, scheduler step,
//! the CPU gather) live in `benches/benches/`; the device benchmark routines behind
//! `hisparse bench`, generic over `hisparse_core::Device` and so run on whichever backend the
//! runtime's `AnyDevice` opens, are the published crate `hisparse-device-bench` in
//! `benches/device/`; an engine's decode step with and without HiSparse is
//! `benches/decode-step/`.
//! Per-backend kernel benches (CUDA graphs, Vulkan timestamps) are the unpublished
//! `hisparse-kernel-lab`.
//!
//! This library holds no code of its own: it compiles the repository README's Rust snippets as
//! doctests, so the embedding example cannot rot.

/// The repository README's Rust snippets, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
