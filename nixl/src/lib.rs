//! Disaggregated prefill → decode for HiSparse: a prefill node writes each request's KV pages
//! straight into the decode node's host pool, into the blocks the decode coordinator assigned,
//! and the decode node imports the request.
//!
//! * [`PoolGeometry`] and [`PageManifest`]: where a pool's pages lie, and which decode host block
//!   receives each page of a request;
//! * [`DecodeOffer`], [`ImportNotice`], [`ImportLedger`]: what the sides exchange, checked on
//!   arrival;
//! * [`plan_write`]: the byte ranges one request moves, source and destination, one per
//!   (layer, page); [`plan_packed_write`]: the same request gathered into a staging buffer in
//!   the host pool's order first, then written as one range per layer and run of consecutive
//!   host blocks (the fast path from GPU memory);
//! * with the `nixl` feature, `Endpoint` (a NIXL agent with the UCX backend),
//!   `DecodeSide` and `PrefillSide`: registration, metadata, the write with its
//!   notification, and notification polling that never blocks the decode loop;
//! * with the `nixl` feature, `PrefillWriter`: the prefill node's executor over a
//!   `hisparse-runtime` runtime: a prefilled request's resident pages written into the decode
//!   host blocks of its manifest, page by page or packed into a staging buffer first
//!   ([`WriteLayout`]).
//!
//! NIXL's C API is loaded at run time (`libnixl_capi.so`, from the `nixl-cu13` wheel); a machine
//! without it gets [`PdError::LibraryNotFound`], which says what to install.

#![warn(missing_docs)]

mod error;
mod manifest;
mod pack;
mod wire;

#[cfg(feature = "nixl")]
mod endpoint;
#[cfg(feature = "nixl")]
pub mod ffi;
#[cfg(feature = "nixl")]
mod sides;
#[cfg(feature = "nixl")]
mod writer;

pub use error::PdError;
pub use manifest::{LayerPages, PageManifest, PoolGeometry, Span};
pub use pack::{
    PackedWrite, PageCopy, STAGING_BUDGET_BYTES, WriteLayout, bulk_spans, check_staging_budget,
    plan_packed_write, staging_bytes_for,
};
pub use wire::{
    Arrival, DecodeOffer, ImportLedger, ImportNotice, MemoryKind, Region, WIRE_VERSION, bulk_notice,
};

#[cfg(feature = "nixl")]
pub use endpoint::{Endpoint, PLUGIN, Transfer};
#[cfg(feature = "nixl")]
pub use sides::{DecodeSide, PrefillSide};
#[cfg(feature = "nixl")]
pub use writer::{PostedWrite, PrefillWriter, device_region, wait_for};

/// The byte ranges one request's write moves: `local[i]` of the prefill pool into `remote[i]`
/// of the decode host pool, and the notice that goes with them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// Source ranges in the prefill side's pool.
    pub local: Vec<Span>,
    /// Destination ranges in the decode side's host pool.
    pub remote: Vec<Span>,
    /// The notification.
    pub notice: ImportNotice,
}

/// Plans the write of a request whose page `p` of bucket `k` lies in block
/// `source_blocks[k][p]` of the prefill pool (`local`) into the decode host blocks of `manifest`
/// (pool `host`): every block checked, the two pools' pages checked to be the same bytes.
pub fn plan_write(
    local: &PoolGeometry,
    source_blocks: &[&[u32]],
    host: &PoolGeometry,
    manifest: &PageManifest,
) -> Result<WritePlan, PdError> {
    local.check_compatible(host)?;
    manifest.validate(host)?;
    if let Some(short) = source_blocks
        .iter()
        .find(|b| b.len() != manifest.host_blocks.len())
    {
        return Err(PdError::ManifestPages {
            request: manifest.request,
            tokens: manifest.tokens,
            expected: short.len().min(u32::MAX as usize) as u32,
            given: manifest.pages(),
        });
    }
    Ok(WritePlan {
        local: local.spans(source_blocks)?,
        remote: host.spans(&[&manifest.host_blocks])?,
        notice: ImportNotice::for_manifest(manifest, host),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_pairs_equal_pages() {
        let kv = manifest::tests::kv();
        let (dev, host) = (
            PoolGeometry::device(&kv).unwrap(),
            PoolGeometry::host(&kv).unwrap(),
        );
        let m = PageManifest {
            request: 1,
            tokens: 200,
            host_blocks: vec![3, 1, 2, 9],
        };
        let lists: Vec<Vec<u32>> = (0..dev.buckets).map(|k| vec![10 + k, 11, 40, 2]).collect();
        let src: Vec<&[u32]> = lists.iter().map(|v| &v[..]).collect();
        let p = plan_write(&dev, &src, &host, &m).unwrap();
        assert_eq!(p.local.len(), 4 * 61);
        assert!(p.local.iter().zip(&p.remote).all(|(a, b)| a.len == b.len));
        assert_eq!(p.local.iter().map(|s| s.len).sum::<u64>(), p.notice.bytes);
        let with = |last: &[u32]| {
            let mut src = src.clone();
            src[0] = last;
            plan_write(&dev, &src, &host, &m)
        };
        assert!(with(&[10, 11, 40]).is_err());
        assert!(with(&[10, 11, 40, 0]).is_err());
        assert!(with(&[10, 11, 40, dev.num_blocks]).is_err());
        assert!(plan_write(&dev, &src[..src.len() - 1], &host, &m).is_err());
    }
}
