//! `hisparse simulate`: the simulation engine, generic over [`hisparse_core::Device`].
//!
//! * [`workload`]: top-k selections with realistic structure;
//! * [`kv`]: synthetic KV rows, deterministic from (request, layer, position);
//! * [`plot`]: the SVG of per-step hit rate and transferred bytes.

pub mod dataplane;
pub mod kv;
pub mod plot;
pub mod report;
pub mod workload;
