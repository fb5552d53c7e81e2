//! The per-layer swap-in critical path as one operation: a [`super::resolve::resolve`] call and
//! the [`super::copy::gather_rows`] of the miss plan it wrote, over one or more layers.
//!
//! [`resolve_and_gather`] is, by definition, exactly that pair run back to back: every output of
//! the resolve (indices, valid, hit and miss counts, the miss plan), the updated `slot_host_rows` and LRU
//! rows, and every byte of the device pool are what the two references give when called one
//! after the other with the same arguments. It exists so a backend can *overlap* the two — copy a
//! request's missed rows while other requests still resolve — behind one call
//! (`Device::resolve_and_gather`), without a second launch that waits for the slowest request.
//!
//! The gather uses the resolve call's shape: its token rows and top-k ([`plan_gather`]), the plan
//! `(miss_src, miss_dst, miss_counts)` the resolve just wrote, and `layers`, the layer pairs the
//! plan is applied to — an index group's leader alone, or the leader and its followers (every
//! layer that shares the leader's hot slots). `layers` must not be empty.
//!
//! Both halves are checked ([`check`]) before anything is written, so a refused call leaves the
//! hot state, the outputs and the pools exactly as they were.

use super::copy::gather_rows;
use super::resolve::{ResolveDesc, ResolveSizes, ResolveSlices, resolve};
use super::{GatherArgs, GatherDesc, LayerPair};
use crate::error::OpError;

/// The gather of a resolve call's miss plan: the call's token rows and top-k, applied to
/// `layers`.
pub const fn plan_gather<'a>(desc: &ResolveDesc, layers: &'a [LayerPair]) -> GatherDesc<'a> {
    GatherDesc {
        num_tokens: desc.num_tokens,
        top_k: desc.top_k,
        layers,
    }
}

/// Checks a [`resolve_and_gather`] call before anything is written: the resolve descriptor and
/// every resolve buffer (`sizes`), then the gather of its miss plan — the plan buffers
/// (`sizes.miss_src`, `sizes.miss_dst`, `sizes.miss_counts`), `layers` (not empty, each layer
/// inside its pool) against the host pool's `host_len` and the device pool's `device_len` bytes.
/// The first problem found is returned, as [`ResolveDesc::check`] or [`GatherDesc::check`]
/// would report it.
pub fn check(
    desc: &ResolveDesc,
    sizes: &ResolveSizes,
    layers: &[LayerPair],
    host_len: u64,
    device_len: u64,
) -> Result<(), OpError> {
    desc.check(sizes)?;
    plan_gather(desc, layers).check_lens(
        sizes.miss_src,
        sizes.miss_dst,
        sizes.miss_counts,
        host_len,
        device_len,
    )
}

/// Reference swap-in: [`resolve`] of `desc` over `a`, then [`gather_rows`] of the miss plan it
/// wrote from `host` into `device` for every layer of `layers`. Checks both first ([`check`]);
/// writes nothing on error.
pub fn resolve_and_gather(
    desc: &ResolveDesc,
    a: ResolveSlices<'_>,
    layers: &[LayerPair],
    host: &[u8],
    device: &mut [u8],
) -> Result<(), OpError> {
    check(
        desc,
        &a.sizes(),
        layers,
        host.len() as u64,
        device.len() as u64,
    )?;
    let mut a = a;
    resolve(desc, a.reborrow())?;
    gather_rows(
        &plan_gather(desc, layers),
        GatherArgs {
            plan_src: a.miss_src,
            plan_dst: a.miss_dst,
            plan_counts: a.miss_counts,
            host,
            device,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::PageLayout;
    use alloc::vec;
    use alloc::vec::Vec;

    /// One request, 4 hot slots in GPU block 1, pages of 4 rows of 16 bytes, 8 rows per block in
    /// the flat attention view (another group owns rows 4..8 of a block), so slot `s` is device
    /// row `8 + s`; page `p < 4` lives in host block `p` (page 4 has none); host row `g` holds bytes `g` (layer 0) and
    /// `100 + g` (layer 1).
    struct World {
        desc: ResolveDesc,
        layers: [LayerPair; 2],
        host: Vec<u8>,
        device: Vec<u8>,
        slot_host_rows: Vec<i32>,
        lru: Vec<u16>,
    }

    const ROW: usize = 16;

    impl World {
        fn new() -> Self {
            let desc = ResolveDesc {
                num_tokens: 1,
                top_k: 2,
                num_requests: 1,
                max_pages: 5,
                block_size: 4,
                hot_slots: 4,
                attention_block_stride: 8,
                host_num_blocks: 3,
                num_state_rows: None,
                stats_slot: 0,
            };
            let page = 4 * ROW as u64;
            let layer = |l: u64| LayerPair {
                host: PageLayout::contiguous(l * 3 * page, page, 3, 4, ROW as u32),
                device: PageLayout {
                    index_stride_rows: 8,
                    ..PageLayout::contiguous(l * 2 * page, page, 2, 4, ROW as u32)
                },
            };
            let host = (0..2 * 12)
                .flat_map(|r: u8| [(r / 12) * 100 + r % 12; ROW])
                .collect();
            World {
                desc,
                layers: [layer(0), layer(1)],
                host,
                device: vec![0xEE; 4 * page as usize],
                slot_host_rows: vec![-1; 4],
                lru: vec![0, 1, 2, 3],
            }
        }

        /// Runs one call; returns (indices, miss_counts, miss_src, miss_dst) or the error.
        #[allow(clippy::type_complexity)]
        fn call(
            &mut self,
            topk: &[i32],
            layers: usize,
        ) -> Result<(Vec<i32>, i32, Vec<i32>, Vec<i32>), OpError> {
            let (mut ind, mut src, mut dst) = (vec![7; 2], vec![7; 2], vec![7; 2]);
            let (mut valid, mut hits, mut misses) = ([7], [7], [7]);
            resolve_and_gather(
                &self.desc,
                ResolveSlices {
                    req_id: &[0],
                    topk,
                    resident_table: &[0; 5],
                    host_table: &[0, 1, 2, 3, -1],
                    hot_table: &[1],
                    slot_host_rows: &mut self.slot_host_rows,
                    lru: &mut self.lru,
                    indices: &mut ind,
                    valid_counts: &mut valid,
                    hit_counts: &mut hits,
                    miss_counts: &mut misses,
                    miss_src: &mut src,
                    miss_dst: &mut dst,
                    idx_mapping: None,
                    stats: None,
                },
                &self.layers[..layers],
                &self.host,
                &mut self.device,
            )?;
            Ok((ind, misses[0], src, dst))
        }

        /// The bytes of hot slot `slot` (in GPU block 1) of layer `l`.
        fn hot_row(&self, l: usize, slot: usize) -> &[u8] {
            let d = &self.layers[l].device;
            let at = (d.base + d.block_stride) as usize + slot * ROW;
            &self.device[at..at + ROW]
        }
    }

    #[test]
    fn misses_land_in_their_hot_rows_in_every_layer() {
        let mut w = World::new();
        // Host rows 1 and 6 miss into slots 0 and 1: device rows 8 and 9.
        let (ind, misses, src, dst) = w.call(&[1, 6], 2).unwrap();
        assert_eq!((ind, misses), (vec![8, 9], 2));
        assert_eq!((src, dst), (vec![1, 6], vec![8, 9]));
        assert_eq!(w.hot_row(0, 0), [1; ROW]);
        assert_eq!(w.hot_row(0, 1), [6; ROW]);
        assert_eq!(w.hot_row(1, 0), [101; ROW]);
        assert_eq!(w.hot_row(1, 1), [106; ROW]);
        assert_eq!(w.hot_row(0, 2), [0xEE; ROW], "an unused slot is untouched");
        // Host row 13 lies beyond the 3-block pool: its slot (2) is zero-filled; row 6 hits.
        let (ind, misses, src, _) = w.call(&[6, 13], 1).unwrap();
        assert_eq!((ind, misses, src), (vec![9, 10], 1, vec![-1, -1]));
        assert_eq!(w.hot_row(0, 2), [0; ROW]);
        assert_eq!(
            w.hot_row(1, 2),
            [0xEE; ROW],
            "the leader only: layer 1 untouched"
        );
        assert_eq!(w.slot_host_rows, [1, 6, -1, -1]);
        // No miss (row 6 hits, token 17's page has no host block): the pool is left as it was.
        let pool = w.device.clone();
        let (ind, misses, _, _) = w.call(&[17, 6], 2).unwrap();
        assert_eq!((ind, misses), (vec![-1, 9], 0));
        assert_eq!(w.device, pool);
    }

    #[test]
    fn a_refused_gather_writes_nothing_not_even_the_resolve() {
        let mut w = World::new();
        let before = (w.slot_host_rows.clone(), w.lru.clone(), w.device.clone());
        let err = w.call(&[1, 6], 0).unwrap_err();
        assert!(
            matches!(
                err,
                OpError::Zero {
                    field: "layers",
                    ..
                }
            ),
            "{err}"
        );
        w.device.truncate(ROW);
        let err = w.call(&[1, 6], 1).unwrap_err();
        assert!(
            matches!(
                err,
                OpError::BufferTooSmall {
                    buffer: "device",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            (w.slot_host_rows.clone(), w.lru.clone()),
            (before.0, before.1)
        );
        assert_eq!(w.device, before.2[..ROW]);
    }
}
