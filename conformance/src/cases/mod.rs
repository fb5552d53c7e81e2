//! The cases, one module per family. Each case is a generic function over `D: Device`; random
//! cases draw their inputs from the seed the runner prints on failure, and compare the device's
//! outputs bit-exactly with the core reference run on host copies of the same inputs.

use hisparse_core::{Device, Error, ErrorKind};

use crate::{Case, CaseError};

mod copies;
mod indexer_backup;
mod invalidate;
mod malformed;
mod pinned;
mod pipeline;
mod remap;
mod remap_modes;
mod resolve;
pub(crate) mod resolve_io;
mod resolve_order;
mod slot_mapping;
mod stats;
mod streams;
mod swap_in;
mod tables;

/// Every case of the suite, in a stable order, for backend `D`.
pub fn cases<D: Device + 'static>() -> Vec<Case<D>> {
    let mut v = Vec::new();
    remap::cases(&mut v);
    remap_modes::cases(&mut v);
    resolve::cases(&mut v);
    swap_in::cases(&mut v);
    resolve_order::cases(&mut v);
    copies::cases(&mut v);
    invalidate::cases(&mut v);
    slot_mapping::cases(&mut v);
    indexer_backup::cases(&mut v);
    pinned::cases(&mut v);
    malformed::cases(&mut v);
    pipeline::cases(&mut v);
    tables::cases(&mut v);
    streams::cases(&mut v);
    stats::cases(&mut v);
    v
}

/// A capability skip: an operation the backend answers with an `Unsupported` error (a mode or an
/// operation it does not implement yet) makes the case skipped, with the backend's message;
/// any other error is a failure.
pub(crate) fn unsupported_is_skip<T, E: Error>(
    r: Result<T, E>,
    what: &str,
) -> Result<T, CaseError> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            Err(CaseError::Skip(format!("{what}: {e}")))
        }
        Err(e) => Err(CaseError::Fail(format!("{what}: {e}"))),
    }
}
