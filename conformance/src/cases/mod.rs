//! The cases, one module per family. Each case is a generic function over `D: Device`; random
//! cases draw their inputs from the seed the runner prints on failure, and compare the device's
//! outputs bit-exactly with the core reference run on host copies of the same inputs.

use hisparse_core::Device;

use crate::Case;

mod copies;
mod invalidate;
mod malformed;
mod pinned;
mod pipeline;
mod remap;
mod resolve;
mod slot_mapping;
mod streams;
mod tables;

/// Every case of the suite, in a stable order, for backend `D`.
pub fn cases<D: Device + 'static>() -> Vec<Case<D>> {
    let mut v = Vec::new();
    remap::cases(&mut v);
    resolve::cases(&mut v);
    copies::cases(&mut v);
    invalidate::cases(&mut v);
    slot_mapping::cases(&mut v);
    pinned::cases(&mut v);
    malformed::cases(&mut v);
    pipeline::cases(&mut v);
    tables::cases(&mut v);
    streams::cases(&mut v);
    v
}
