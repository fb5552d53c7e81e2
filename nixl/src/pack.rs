//! The packed write: a request's pages gathered on the prefill device into one staging buffer,
//! in the order the decode host pool holds them, so the transfer moves a few long runs instead
//! of one descriptor per (layer, page).
//!
//! The decode host pool is layer-major: layer `i`'s pages are one array of `num_blocks` pages,
//! so the pages of one layer in consecutive host blocks are one contiguous run of the pool (the
//! layers of one block are not: they lie a whole array apart). The staging buffer therefore holds
//! the request's pages layer by layer, page by page — the order of [`PoolGeometry::spans`] —
//! and each layer's run of consecutive host blocks becomes one descriptor. A request whose host
//! blocks are consecutive (what a fresh pool hands out) moves as one descriptor per layer.
//!
//! Packing itself is plain copies of whole pages (one per (layer, page), or fewer where source
//! pages are adjacent), which the caller enqueues with its backend's copy op and waits for before
//! the write: device → device into a staging buffer on the prefill device, or device → host into
//! a pinned host staging buffer (registered as host memory), whose write then takes the host →
//! host path. The plan is the same for both; only the staging buffer's memory differs.

use hisparse_core::MemoryInfo;
use serde::{Deserialize, Serialize};

use crate::{ImportNotice, PageManifest, PdError, PoolGeometry, Span, plan_write};

/// One contiguous copy of the packing: `len` bytes at `src` of the prefill pool to `dst` of the
/// staging buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopy {
    /// Byte offset in the prefill pool.
    pub src: u64,
    /// Byte offset in the staging buffer.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

/// What a packed write of one request does: the copies that fill the staging buffer, then the
/// write of `local[i]` of the staging buffer into `remote[i]` of the decode host pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedWrite {
    /// Prefill pool → staging buffer, in staging order.
    pub copies: Vec<PageCopy>,
    /// Source ranges of the write, in the staging buffer.
    pub local: Vec<Span>,
    /// Destination ranges of the write, in the decode host pool.
    pub remote: Vec<Span>,
    /// The notification (the same as the page-by-page write's).
    pub notice: ImportNotice,
    /// Bytes of the staging buffer the request fills (from offset 0).
    pub staging_bytes: u64,
}

/// How a prefill node writes a request into the decode host pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteLayout {
    /// One descriptor per (layer, page), straight from the prefill pool ([`plan_write`]).
    Pages,
    /// Gathered on the prefill device into a device staging buffer in the host pool's order,
    /// then one descriptor per layer and run of consecutive host blocks ([`plan_packed_write`]).
    Packed,
    /// Gathered into a pinned host staging buffer laid out as [`WriteLayout::Packed`]'s (the
    /// backend's device → host copies), then written host → decode host pool with the same
    /// descriptors. GPU memory into another process's host memory has no zero-copy transport
    /// (UCX emulates those puts over TCP loopback); host → host memory has one.
    PackedHost,
}

impl WriteLayout {
    /// The layout that writes fastest from a prefill pool in GPU memory (`gpu_source`) or in
    /// host memory: packed into host staging from GPU memory, page by page from host memory.
    pub fn fastest_for(gpu_source: bool) -> Self {
        if gpu_source {
            WriteLayout::PackedHost
        } else {
            WriteLayout::Pages
        }
    }

    /// Its name (as serialised).
    pub fn name(self) -> &'static str {
        match self {
            WriteLayout::Pages => "pages",
            WriteLayout::Packed => "packed",
            WriteLayout::PackedHost => "packed-host",
        }
    }

    /// Whether it writes through a staging buffer.
    pub fn stages(self) -> bool {
        self != WriteLayout::Pages
    }

    /// The memory the writes read from, for a prefill pool in `source_memory` (`host` or
    /// `gpu`): the pool's, or its device staging buffer's (the same memory), or host memory
    /// for the pinned host staging buffer.
    pub fn write_memory(self, source_memory: &str) -> &str {
        match self {
            WriteLayout::Pages | WriteLayout::Packed => source_memory,
            WriteLayout::PackedHost => "host",
        }
    }

    /// The most staging memory this layout may take, given what the device reports (`info`):
    /// at most [`STAGING_BUDGET_BYTES`] and half the memory the staging buffer comes out of
    /// (the device's free memory for [`WriteLayout::Packed`], the host's available memory for
    /// [`WriteLayout::PackedHost`] and on a device whose memory is host memory; no limit but
    /// the fixed one when the backend cannot tell). 0 for [`WriteLayout::Pages`].
    pub fn staging_limit(self, info: Option<MemoryInfo>) -> u64 {
        if !self.stages() {
            return 0;
        }
        let on_host = self == WriteLayout::PackedHost;
        let free = info.map_or(u64::MAX, |m| {
            if m.unified || on_host {
                m.host_available
            } else {
                m.device_free
            }
        });
        STAGING_BUDGET_BYTES.min(free / 2)
    }
}

/// The most staging memory a packed write may take (one request's pages), before the memory it
/// comes out of is also checked ([`WriteLayout::staging_limit`]).
pub const STAGING_BUDGET_BYTES: u64 = 8 << 30;

/// Bytes of staging a packed write of a request of `tokens` tokens needs on a decode host pool
/// of geometry `host`: every page of every sparse layer.
pub fn staging_bytes_for(host: &PoolGeometry, tokens: u32) -> u64 {
    host.request_bytes(host.pages_for(tokens))
}

/// Checks, before any staging memory is taken, that `needed` bytes fit the staging budget.
pub fn check_staging_budget(needed: u64, budget: u64) -> Result<(), PdError> {
    if needed > budget {
        return Err(PdError::StagingBudget { needed, budget });
    }
    Ok(())
}

/// Plans the packed write of the request whose page `p` of bucket `k` lies in block
/// `source_blocks[k][p]` of the prefill pool (`local`) into the decode host blocks of
/// `manifest` (pool `host`), through a staging buffer of `staging_len` bytes. Every check of
/// [`plan_write`] applies; a request larger than the staging buffer is refused.
pub fn plan_packed_write(
    local: &PoolGeometry,
    source_blocks: &[&[u32]],
    host: &PoolGeometry,
    manifest: &PageManifest,
    staging_len: u64,
) -> Result<PackedWrite, PdError> {
    let pages = plan_write(local, source_blocks, host, manifest)?;
    check_staging_budget(pages.notice.bytes, staging_len)?;
    let mut copies: Vec<PageCopy> = Vec::with_capacity(pages.local.len());
    let mut staged: Vec<Span> = Vec::new();
    let mut remote: Vec<Span> = Vec::new();
    let mut cursor = 0u64;
    for (src, dst) in pages.local.iter().zip(&pages.remote) {
        match copies.last_mut() {
            Some(c) if c.src + c.len == src.offset && c.dst + c.len == cursor => c.len += src.len,
            _ => copies.push(PageCopy {
                src: src.offset,
                dst: cursor,
                len: src.len,
            }),
        }
        // The staging side is contiguous by construction: a run continues while the host pool's
        // side does.
        match (staged.last_mut(), remote.last_mut()) {
            (Some(s), Some(r)) if r.offset + r.len == dst.offset => {
                s.len += dst.len;
                r.len += dst.len;
            }
            _ => {
                staged.push(Span {
                    offset: cursor,
                    len: dst.len,
                });
                remote.push(*dst);
            }
        }
        cursor += src.len;
    }
    Ok(PackedWrite {
        copies,
        local: staged,
        remote,
        notice: pages.notice,
        staging_bytes: cursor,
    })
}

/// The ranges of a bulk write (the transport's own figure): `bytes` from offset 0 cut into
/// ranges of `descriptor_bytes` (the last one shorter; one range when `descriptor_bytes >=
/// bytes`).
pub fn bulk_spans(bytes: u64, descriptor_bytes: u64) -> Result<Vec<Span>, PdError> {
    if bytes == 0 || descriptor_bytes == 0 {
        return Err(PdError::Region {
            detail: format!(
                "a bulk write of {bytes} bytes in descriptors of {descriptor_bytes}: both must \
                 be positive"
            ),
        });
    }
    let step = descriptor_bytes.min(bytes);
    Ok((0..bytes.div_ceil(step))
        .map(|i| Span {
            offset: i * step,
            len: step.min(bytes - i * step),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::config::HiSparseConfig;
    use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
    use hisparse_core::presets;

    /// DeepSeek V3.2's first 4 layers, 120 GPU and 40 host blocks (pools of a few MB, so tests
    /// hold them whole).
    fn kv() -> KvCacheConfig {
        let model = presets::DEEPSEEK_V32;
        let four = hisparse_core::model::ModelSpec {
            layers: &model.layers[..4],
            ..model
        };
        let config = HiSparseConfig::new(model.top_k, 40 * 4 * 64 * 656);
        let mut input = LayoutInput::new(&four, &config, 0, 1024);
        input.num_gpu_blocks_override = Some(120);
        plan_layout(&input).expect("layout")
    }

    /// Applies a plan on plain memory: the copies, then the write, as the two sides would.
    fn apply(plan: &PackedWrite, pool: &[u8], staging: &mut [u8], host: &mut [u8]) {
        for c in &plan.copies {
            let (s, d, n) = (c.src as usize, c.dst as usize, c.len as usize);
            staging[d..d + n].copy_from_slice(&pool[s..s + n]);
        }
        for (l, r) in plan.local.iter().zip(&plan.remote) {
            assert_eq!(l.len, r.len);
            let (s, d, n) = (l.offset as usize, r.offset as usize, l.len as usize);
            host[d..d + n].copy_from_slice(&staging[s..s + n]);
        }
    }

    fn pattern(len: u64) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 13) as u8 ^ (i as u8))
            .collect()
    }

    #[test]
    fn packed_and_page_by_page_writes_put_the_same_bytes_in_the_host_pool() {
        let kv = kv();
        let (dev, host) = (
            PoolGeometry::device(&kv).unwrap(),
            PoolGeometry::host(&kv).unwrap(),
        );
        let pool = pattern(dev.pool_bytes);
        // Consecutive host blocks with a gap, a block at the pool's end, scattered GPU blocks.
        let m = PageManifest {
            request: 4,
            tokens: 5 * 64 - 3,
            host_blocks: vec![7, 8, 9, 3, host.num_blocks - 1],
        };
        let lists: Vec<Vec<u32>> = (0..dev.buckets)
            .map(|k| vec![20 + k, 21 + k, 40, 2, dev.num_blocks - 1 - k])
            .collect();
        let src: Vec<&[u32]> = lists.iter().map(|v| &v[..]).collect();
        let need = staging_bytes_for(&host, m.tokens);
        let plan = plan_packed_write(&dev, &src, &host, &m, need).unwrap();
        assert_eq!(plan.staging_bytes, need);
        assert_eq!(
            plan.notice,
            plan_write(&dev, &src, &host, &m).unwrap().notice
        );
        // Per layer: blocks 7..=9 are one run, 3 and the last block one each.
        assert_eq!(plan.local.len(), 3 * host.layers.len());
        assert_eq!(plan.local.iter().map(|s| s.len).sum::<u64>(), need);
        let mut staging = vec![0u8; need as usize];
        let mut packed = vec![0xA5u8; host.pool_bytes as usize];
        apply(&plan, &pool, &mut staging, &mut packed);
        let mut by_page = vec![0xA5u8; host.pool_bytes as usize];
        let pages = plan_write(&dev, &src, &host, &m).unwrap();
        for (l, r) in pages.local.iter().zip(&pages.remote) {
            let (s, d, n) = (l.offset as usize, r.offset as usize, l.len as usize);
            by_page[d..d + n].copy_from_slice(&pool[s..s + n]);
        }
        assert!(
            packed == by_page,
            "the packed write differs from the page-by-page one"
        );
    }

    #[test]
    fn consecutive_host_blocks_move_as_one_descriptor_per_layer() {
        let kv = kv();
        let (dev, host) = (
            PoolGeometry::device(&kv).unwrap(),
            PoolGeometry::host(&kv).unwrap(),
        );
        let m = PageManifest {
            request: 1,
            tokens: 640,
            host_blocks: (20..30).collect(),
        };
        let lists: Vec<Vec<u32>> = (0..dev.buckets).map(|_| (30..40).collect()).collect();
        let src: Vec<&[u32]> = lists.iter().map(|v| &v[..]).collect();
        let plan = plan_packed_write(&dev, &src, &host, &m, u64::MAX).unwrap();
        assert_eq!(plan.local.len(), host.layers.len());
        for (s, l) in plan.remote.iter().zip(&host.layers) {
            assert_eq!(s.offset, l.base + 20 * l.block_stride);
            assert_eq!(s.len, 10 * l.page_bytes);
        }
        // GPU pages of one layer are a block apart (block-major pool): one copy per page,
        // unless a block holds that one page only (then consecutive GPU blocks are one copy).
        let expected: usize = dev
            .layers
            .iter()
            .map(|l| {
                if l.block_stride == l.page_bytes {
                    1
                } else {
                    10
                }
            })
            .sum();
        assert_eq!(plan.copies.len(), expected);
        assert_eq!(
            plan.copies.iter().map(|c| c.len).sum::<u64>(),
            plan.staging_bytes
        );
    }

    #[test]
    fn a_request_larger_than_the_staging_buffer_is_refused() {
        let kv = kv();
        let (dev, host) = (
            PoolGeometry::device(&kv).unwrap(),
            PoolGeometry::host(&kv).unwrap(),
        );
        let m = PageManifest {
            request: 2,
            tokens: 100,
            host_blocks: vec![1, 2],
        };
        let lists: Vec<Vec<u32>> = (0..dev.buckets).map(|_| vec![1, 2]).collect();
        let src: Vec<&[u32]> = lists.iter().map(|v| &v[..]).collect();
        let need = staging_bytes_for(&host, 100);
        let e = plan_packed_write(&dev, &src, &host, &m, need - 1).unwrap_err();
        assert_eq!(
            e,
            PdError::StagingBudget {
                needed: need,
                budget: need - 1
            }
        );
        assert!(e.to_string().contains("staging"));
        assert!(check_staging_budget(need, need).is_ok());
        // The page-by-page checks come first: a bad manifest is named as such.
        let bad = PageManifest {
            host_blocks: vec![1, 1],
            ..m
        };
        assert!(matches!(
            plan_packed_write(&dev, &src, &host, &bad, u64::MAX),
            Err(PdError::ManifestDuplicate { block: 1, .. })
        ));
    }

    #[test]
    fn staging_is_limited_by_the_memory_it_comes_out_of() {
        let info = |device_free: u64, host_available: u64, unified: bool| {
            Some(MemoryInfo {
                device_free,
                host_available,
                unified,
            })
        };
        let gib = 1u64 << 30;
        // Plenty of host memory, little device memory: only host staging has room.
        let lean_gpu = info(gib, 64 * gib, false);
        assert_eq!(WriteLayout::PackedHost.staging_limit(lean_gpu), 8 * gib);
        assert_eq!(WriteLayout::Packed.staging_limit(lean_gpu), gib / 2);
        // Device memory that is host memory: both draw on the host's.
        let unified = info(64 * gib, gib, true);
        assert_eq!(WriteLayout::Packed.staging_limit(unified), gib / 2);
        // The fixed cap holds when the backend cannot tell; page by page stages nothing.
        assert_eq!(
            WriteLayout::PackedHost.staging_limit(None),
            STAGING_BUDGET_BYTES
        );
        assert_eq!(WriteLayout::Pages.staging_limit(None), 0);
        assert_eq!(WriteLayout::fastest_for(true), WriteLayout::PackedHost);
        assert_eq!(WriteLayout::fastest_for(false), WriteLayout::Pages);
        assert_eq!(WriteLayout::PackedHost.write_memory("gpu"), "host");
        assert_eq!(WriteLayout::Packed.write_memory("gpu"), "gpu");
        assert_eq!(
            serde_json::to_string(&WriteLayout::PackedHost).unwrap(),
            "\"packed-host\""
        );
    }

    #[test]
    fn bulk_descriptors_cover_the_bytes_once() {
        for (bytes, per) in [(10u64, 3u64), (9, 3), (5, 100), (1, 1), (7, 7)] {
            let spans = bulk_spans(bytes, per).unwrap();
            assert_eq!(spans.len() as u64, bytes.div_ceil(per.min(bytes)));
            let mut at = 0;
            for s in &spans {
                assert_eq!(s.offset, at);
                assert!(s.len > 0 && s.len <= per);
                at += s.len;
            }
            assert_eq!(at, bytes);
        }
        assert!(bulk_spans(0, 4).is_err());
        assert!(bulk_spans(4, 0).is_err());
    }
}
