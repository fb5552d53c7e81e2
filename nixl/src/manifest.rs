//! Pages of a pool and the manifest that says which decode host blocks receive a request.
//!
//! A HiSparse pool holds, for every sparse layer, one page per block: the decode node's host pool
//! is layer-major (`[layer][block]`, [`KvCacheConfig::host_layout`]), the prefill node's GPU pool
//! block-major (`[block][layer]`, [`KvCacheConfig::device_layout`]). Within a page the rows have
//! the same format on both (values, then scales for split rows), so a request's KV moves as one
//! contiguous copy per (layer, page). [`PoolGeometry`] describes where each layer's pages lie in
//! one pool; [`PageManifest`] names the blocks of a request's pages; [`PoolGeometry::spans`]
//! turns the two into byte ranges, in the one order both sides use: layer by layer, page by page.
//!
//! In the GPU pool each bucket of layers has its own resident table, so a page's block depends
//! on the layer's bucket; in the host pool one block holds the page of every layer (one bucket).

use hisparse_core::layout::KvCacheConfig;
use serde::{Deserialize, Serialize};

use crate::PdError;

/// Where one sparse layer's pages lie in a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPages {
    /// Model layer.
    pub layer: u32,
    /// The bucket whose block list gives this layer's pages (0 in the host pool).
    pub bucket: u32,
    /// Byte offset of block 0's page of this layer.
    pub base: u64,
    /// Bytes between the pages of consecutive blocks.
    pub block_stride: u64,
    /// Bytes of one page (what moves per page).
    pub page_bytes: u64,
}

/// Where every sparse layer's pages lie in one pool, and how many blocks it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolGeometry {
    /// The sparse layers, in model order.
    pub layers: Vec<LayerPages>,
    /// Blocks in the pool (block 0 is the null block).
    pub num_blocks: u32,
    /// Block lists a request's pages need: one per bucket (1 in the host pool).
    pub buckets: u32,
    /// Bytes of the pool.
    pub pool_bytes: u64,
    /// Tokens one page covers.
    pub block_tokens: u32,
    /// Rows one page holds.
    pub block_size: u32,
}

/// One contiguous byte range of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Byte offset in the pool.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

impl PoolGeometry {
    /// The host pool of `kv` (the decode side's, which imported pages are written into).
    pub fn host(kv: &KvCacheConfig) -> Result<Self, PdError> {
        let layers = sparse_layers(kv)?
            .into_iter()
            .map(|layer| {
                let l = kv.host_layout(layer)?;
                Ok(LayerPages {
                    layer,
                    bucket: 0,
                    base: l.base,
                    block_stride: l.block_stride,
                    page_bytes: l.block_stride,
                })
            })
            .collect::<Result<Vec<_>, PdError>>()?;
        Self::checked(layers, kv.host_num_blocks, 1, kv.host_pool_bytes(), kv)
    }

    /// The GPU pool of `kv` (the prefill side's resident pages, which are read).
    pub fn device(kv: &KvCacheConfig) -> Result<Self, PdError> {
        let layers = sparse_layers(kv)?
            .into_iter()
            .map(|layer| {
                let (bucket, gl) = kv.bucket_of(layer)?;
                let d = kv.device_layout(layer)?;
                debug_assert!(kv.groups[kv.resident_group(bucket)].layers.contains(gl));
                Ok(LayerPages {
                    layer,
                    bucket,
                    base: d.base,
                    block_stride: d.block_stride,
                    page_bytes: gl.page_bytes,
                })
            })
            .collect::<Result<Vec<_>, PdError>>()?;
        Self::checked(
            layers,
            kv.num_gpu_blocks,
            kv.num_buckets,
            kv.gpu_pool_bytes(),
            kv,
        )
    }

    fn checked(
        layers: Vec<LayerPages>,
        num_blocks: u32,
        buckets: u32,
        pool_bytes: u64,
        kv: &KvCacheConfig,
    ) -> Result<Self, PdError> {
        let g = PoolGeometry {
            layers,
            num_blocks,
            buckets,
            pool_bytes,
            block_tokens: kv.block_tokens,
            block_size: kv.block_size,
        };
        g.validate()?;
        Ok(g)
    }

    /// Checks that every layer's last page lies inside the pool, that layers are unique and
    /// pages non-empty (a description received from the other side is checked before use).
    pub fn validate(&self) -> Result<(), PdError> {
        let bad = |detail: String| Err(PdError::Geometry { detail });
        if self.layers.is_empty() {
            return bad("no sparse layer".into());
        }
        if self.num_blocks < 2 {
            return bad(format!(
                "{} blocks: a pool needs the null block and at least one more",
                self.num_blocks
            ));
        }
        if self.block_tokens == 0 || self.block_size == 0 {
            return bad("pages of no tokens".into());
        }
        let mut seen: Vec<u32> = self.layers.iter().map(|l| l.layer).collect();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return bad("a layer is listed twice".into());
        }
        for l in &self.layers {
            if l.bucket >= self.buckets {
                return bad(format!(
                    "layer {} is in bucket {} of a pool of {} buckets",
                    l.layer, l.bucket, self.buckets
                ));
            }
            if l.page_bytes == 0 || l.page_bytes > l.block_stride {
                return bad(format!(
                    "layer {}: pages of {} bytes every {} bytes",
                    l.layer, l.page_bytes, l.block_stride
                ));
            }
            let end = u64::from(self.num_blocks - 1)
                .checked_mul(l.block_stride)
                .and_then(|v| v.checked_add(l.base))
                .and_then(|v| v.checked_add(l.page_bytes));
            match end {
                Some(end) if end <= self.pool_bytes => {}
                _ => {
                    return bad(format!(
                        "layer {}: its last page ends past the pool's {} bytes",
                        l.layer, self.pool_bytes
                    ));
                }
            }
        }
        Ok(())
    }

    /// Pages a request of `tokens` tokens occupies.
    pub fn pages_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_tokens)
    }

    /// Checks that pages of this pool and of `other` (the other side's) have the same layers in
    /// the same order and the same bytes, so one page of one is one page of the other.
    pub fn check_compatible(&self, other: &PoolGeometry) -> Result<(), PdError> {
        let differ = |detail: String| Err(PdError::Incompatible { detail });
        if (self.block_tokens, self.block_size) != (other.block_tokens, other.block_size) {
            return differ(format!(
                "pages of {} tokens / {} rows here, {} / {} there",
                self.block_tokens, self.block_size, other.block_tokens, other.block_size
            ));
        }
        if self.layers.len() != other.layers.len() {
            return differ(format!(
                "{} sparse layers here, {} there",
                self.layers.len(),
                other.layers.len()
            ));
        }
        for (a, b) in self.layers.iter().zip(&other.layers) {
            if (a.layer, a.page_bytes) != (b.layer, b.page_bytes) {
                return differ(format!(
                    "layer {} pages of {} bytes here, layer {} pages of {} bytes there",
                    a.layer, a.page_bytes, b.layer, b.page_bytes
                ));
            }
        }
        Ok(())
    }

    /// The byte ranges of a request's pages, page `p` of a layer of bucket `k` being in block
    /// `blocks[k][p]`, layer by layer, page by page. There is one list per bucket, all of one
    /// length, and every block is a usable block of this pool.
    pub fn spans(&self, blocks: &[&[u32]]) -> Result<Vec<Span>, PdError> {
        let bad = |detail: String| Err(PdError::Geometry { detail });
        if blocks.len() != self.buckets as usize {
            return bad(format!(
                "{} block lists for a pool of {} buckets",
                blocks.len(),
                self.buckets
            ));
        }
        let pages = blocks.first().map_or(0, |b| b.len());
        if blocks.iter().any(|b| b.len() != pages) {
            return bad("block lists of different lengths: one block per page per bucket".into());
        }
        for &b in blocks.iter().flat_map(|b| b.iter()) {
            if b == 0 || b >= self.num_blocks {
                return bad(format!(
                    "block {b} is not a usable block of a pool of {} blocks",
                    self.num_blocks
                ));
            }
        }
        let mut out = Vec::with_capacity(pages * self.layers.len());
        for l in &self.layers {
            for &b in blocks[l.bucket as usize] {
                // In range: `validate` bounded the last block's page by the pool size.
                out.push(Span {
                    offset: l.base + u64::from(b) * l.block_stride,
                    len: l.page_bytes,
                });
            }
        }
        Ok(out)
    }

    /// Bytes a request of `pages` pages moves.
    pub fn request_bytes(&self, pages: u32) -> u64 {
        self.layers
            .iter()
            .map(|l| l.page_bytes * u64::from(pages))
            .sum()
    }
}

fn sparse_layers(kv: &KvCacheConfig) -> Result<Vec<u32>, PdError> {
    let layers: Vec<u32> = kv
        .groups
        .get(KvCacheConfig::SOURCE_GROUP)
        .map(|g| g.layers.iter().map(|l| l.layer).collect())
        .unwrap_or_default();
    if layers.is_empty() {
        return Err(PdError::Geometry {
            detail: "the layout has no sparse layer whose KV could be imported".into(),
        });
    }
    Ok(layers)
}

/// The decode host blocks that receive a request's pages: page `p` goes to `host_blocks[p]`.
/// The decode side's coordinator assigns them; the prefill side writes exactly these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageManifest {
    /// The request (the decode side's id for it).
    pub request: u64,
    /// Its tokens (prompt tokens whose KV is written).
    pub tokens: u32,
    /// Per page, the host block of the decode pool.
    pub host_blocks: Vec<u32>,
}

impl PageManifest {
    /// Checks the manifest against the decode host pool `host`: one block per page of its
    /// tokens, each a usable block of the pool, none twice.
    pub fn validate(&self, host: &PoolGeometry) -> Result<(), PdError> {
        if self.tokens == 0 {
            return Err(PdError::EmptyRequest {
                request: self.request,
            });
        }
        let expected = host.pages_for(self.tokens);
        if self.host_blocks.len() != expected as usize {
            return Err(PdError::ManifestPages {
                request: self.request,
                tokens: self.tokens,
                expected,
                given: self.host_blocks.len().min(u32::MAX as usize) as u32,
            });
        }
        let mut sorted = self.host_blocks.clone();
        for (page, &block) in self.host_blocks.iter().enumerate() {
            if block == 0 || block >= host.num_blocks {
                return Err(PdError::ManifestBlock {
                    request: self.request,
                    page: page as u32,
                    block,
                    num_blocks: host.num_blocks,
                });
            }
        }
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(PdError::ManifestDuplicate {
                request: self.request,
                block: w[0],
            });
        }
        Ok(())
    }

    /// Pages of the request.
    pub fn pages(&self) -> u32 {
        self.host_blocks.len() as u32
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hisparse_core::config::HiSparseConfig;
    use hisparse_core::layout::{LayoutInput, plan_layout};
    use hisparse_core::presets;

    /// A small plan of DeepSeek V3.2: all 61 sparse layers, 600 GPU and 80 host blocks.
    pub(crate) fn kv() -> KvCacheConfig {
        let model = presets::DEEPSEEK_V32;
        let config = HiSparseConfig::new(model.top_k, 80 * 61 * 64 * 656);
        let mut input = LayoutInput::new(&model, &config, 0, 4096);
        input.num_gpu_blocks_override = Some(600);
        plan_layout(&input).expect("layout")
    }

    #[test]
    fn host_and_device_pages_match_the_layouts() {
        let kv = kv();
        let host = PoolGeometry::host(&kv).unwrap();
        let dev = PoolGeometry::device(&kv).unwrap();
        host.check_compatible(&dev).unwrap();
        assert_eq!(host.layers.len(), 61);
        for l in &host.layers {
            let hl = kv.host_layout(l.layer).unwrap();
            // A page is `block_size` rows; the row format is the same on both sides.
            assert_eq!(
                l.page_bytes,
                u64::from(hl.block_size) * u64::from(hl.row_bytes)
            );
            let [(voff, vlen), _] = hl.row_parts(3, 5);
            let span =
                host.spans(&[&[3]]).unwrap()[host.layers.iter().position(|x| x == l).unwrap()];
            assert_eq!(voff, span.offset + 5 * u64::from(hl.row_bytes));
            assert_eq!(vlen, u64::from(hl.row_bytes));
        }
        for l in &dev.layers {
            let dl = kv.device_layout(l.layer).unwrap();
            let [(voff, _), _] = dl.row_parts(7, 0);
            let i = dev.layers.iter().position(|x| x == l).unwrap();
            let lists: Vec<&[u32]> = (0..dev.buckets)
                .map(|k| {
                    if k == l.bucket {
                        &[7u32][..]
                    } else {
                        &[1u32][..]
                    }
                })
                .collect();
            assert_eq!(dev.spans(&lists).unwrap()[i].offset, voff);
        }
    }

    #[test]
    fn spans_are_layer_major_and_inside_the_pool() {
        let kv = kv();
        let host = PoolGeometry::host(&kv).unwrap();
        let blocks = [5, 1, host.num_blocks - 1];
        let spans = host.spans(&[&blocks]).unwrap();
        assert_eq!(spans.len(), blocks.len() * host.layers.len());
        for (i, s) in spans.iter().enumerate() {
            let (l, b) = (&host.layers[i / blocks.len()], blocks[i % blocks.len()]);
            assert_eq!(s.offset, l.base + u64::from(b) * l.block_stride);
            assert!(s.offset + s.len <= host.pool_bytes);
        }
        // Pages never overlap.
        let mut sorted = spans.clone();
        sorted.sort_by_key(|s| s.offset);
        assert!(
            sorted
                .windows(2)
                .all(|w| w[0].offset + w[0].len <= w[1].offset)
        );
        assert!(host.spans(&[&[0]]).is_err());
        assert!(host.spans(&[&[host.num_blocks]]).is_err());
        assert!(host.spans(&[&[1], &[2]]).is_err());
        let dev = PoolGeometry::device(&kv).unwrap();
        assert_eq!(dev.buckets, kv.num_buckets);
        let lists: Vec<Vec<u32>> = (0..dev.buckets).map(|k| vec![k + 1, k + 2]).collect();
        let refs: Vec<&[u32]> = lists.iter().map(|v| &v[..]).collect();
        let spans = dev.spans(&refs).unwrap();
        for (i, s) in spans.iter().enumerate() {
            let l = &dev.layers[i / 2];
            let b = lists[l.bucket as usize][i % 2];
            assert_eq!(s.offset, l.base + u64::from(b) * l.block_stride);
        }
        let mut short = refs.clone();
        short[0] = &[1];
        assert!(dev.spans(&short).is_err());
    }

    #[test]
    fn manifests_are_checked_against_the_pool() {
        let kv = kv();
        let host = PoolGeometry::host(&kv).unwrap();
        let ok = PageManifest {
            request: 9,
            tokens: 130,
            host_blocks: vec![4, 2, 7],
        };
        ok.validate(&host).unwrap();
        let with = |tokens, host_blocks: Vec<u32>| PageManifest {
            request: 9,
            tokens,
            host_blocks,
        };
        assert!(matches!(
            with(0, vec![]).validate(&host),
            Err(PdError::EmptyRequest { request: 9 })
        ));
        assert!(matches!(
            with(130, vec![4, 2]).validate(&host),
            Err(PdError::ManifestPages {
                expected: 3,
                given: 2,
                ..
            })
        ));
        assert!(matches!(
            with(128, vec![4, 2, 7]).validate(&host),
            Err(PdError::ManifestPages { expected: 2, .. })
        ));
        assert!(matches!(
            with(130, vec![4, 0, 7]).validate(&host),
            Err(PdError::ManifestBlock {
                page: 1,
                block: 0,
                ..
            })
        ));
        let past = host.num_blocks;
        assert!(matches!(
            with(130, vec![4, 2, past]).validate(&host),
            Err(PdError::ManifestBlock { page: 2, .. })
        ));
        assert!(matches!(
            with(130, vec![4, 2, 4]).validate(&host),
            Err(PdError::ManifestDuplicate { block: 4, .. })
        ));
        let e = with(130, vec![4, 2, 4]).validate(&host).unwrap_err();
        assert!(e.to_string().contains("assign each page its own block"));
    }

    #[test]
    fn foreign_descriptions_are_refused() {
        let kv = kv();
        let host = PoolGeometry::host(&kv).unwrap();
        let mut g = host.clone();
        g.pool_bytes -= 1;
        assert!(matches!(g.validate(), Err(PdError::Geometry { .. })));
        let mut g = host.clone();
        g.layers[1].layer = g.layers[0].layer;
        assert!(g.validate().is_err());
        let mut g = host.clone();
        g.layers.clear();
        assert!(g.validate().is_err());
        let mut g = host.clone();
        g.layers[3].block_stride = u64::MAX;
        assert!(g.validate().is_err());
        let mut g = host.clone();
        g.num_blocks = 1;
        assert!(g.validate().is_err());
        let mut g = host.clone();
        g.layers[0].bucket = 1;
        assert!(g.validate().is_err());
        let mut g = host.clone();
        g.layers[2].page_bytes += 16;
        g.layers[2].block_stride += 16;
        assert!(matches!(
            host.check_compatible(&g),
            Err(PdError::Incompatible { .. })
        ));
        let mut g = host.clone();
        g.layers.pop();
        assert!(host.check_compatible(&g).is_err());
        let mut g = host.clone();
        g.block_tokens *= 2;
        assert!(host.check_compatible(&g).is_err());
    }
}
