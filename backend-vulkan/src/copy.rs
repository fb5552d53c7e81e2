//! A list of byte copies split into batches that each run as one `vkCmdCopyBuffer` or one copy
//! dispatch (regions of a batch in any order) and together give the reference's sequential
//! result. The split is the core's copy-conflict rule ([`copy_batches`]); this module only turns
//! its batches into Vulkan regions and copy-shader tiles.

use ash::vk;
use hisparse_core::ops::copy::{CopyFootprint, copy_batches};

use crate::vk::Span;

/// Batches of copy regions in execution order.
#[derive(Debug)]
pub struct CopyPlan {
    same_buffer: bool,
    regions: Vec<vk::BufferCopy>,
}

impl CopyPlan {
    /// A plan for copies from one buffer to another (`same_buffer = false`) or within one.
    pub fn new(same_buffer: bool) -> Self {
        CopyPlan {
            same_buffer,
            regions: Vec::new(),
        }
    }

    /// Appends the copy of `len` bytes from `src` to `dst`, after every copy pushed before. In
    /// one buffer, source and destination must be equal (a no-op, skipped) or disjoint: every
    /// caller's copies are (pages and rows of one layout, checked `copy_within` ranges).
    pub fn push(&mut self, src: u64, dst: u64, len: u64) {
        if len == 0 || (self.same_buffer && src == dst) {
            return;
        }
        debug_assert!(
            !self.same_buffer || src + len <= dst || dst + len <= src,
            "overlapping copy inside one buffer"
        );
        self.regions.push(vk::BufferCopy {
            src_offset: src,
            dst_offset: dst,
            size: len,
        });
    }

    /// The batches, each to be recorded as one `vkCmdCopyBuffer` (or one copy dispatch) after a
    /// barrier.
    pub fn batches(&self) -> Vec<&[vk::BufferCopy]> {
        let footprints: Vec<CopyFootprint> = self
            .regions
            .iter()
            .map(|r| CopyFootprint::contiguous(r.src_offset, r.dst_offset, r.size))
            .collect();
        copy_batches(&footprints, self.same_buffer)
            .into_iter()
            .map(|b| &self.regions[b])
            .collect()
    }

    /// Regions of the plan.
    pub fn regions(&self) -> usize {
        self.regions.len()
    }

    /// Bytes the plan copies.
    pub fn bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }

    /// Whether every offset and length is a multiple of `align`.
    pub fn aligned(&self, align: u64) -> bool {
        self.regions
            .iter()
            .all(|r| (r.src_offset | r.dst_offset | r.size) % align == 0)
    }
}

/// Pool words of one tile of the copy shader: a workgroup copies one tile.
pub const TILE_WORDS: u64 = 4096;

/// The copy shader's tiles of a batch of regions aligned to `unit`-byte pool words (16, or 4 for
/// the 4-byte-word variant): `[src word, dst word, words, 0]`, each at most [`TILE_WORDS`]
/// words. Regions of one batch do not conflict, so neither do their tiles.
pub fn tiles(batch: &[vk::BufferCopy], unit: u64) -> Vec<[u32; 4]> {
    let mut v = Vec::new();
    for r in batch {
        let (s, d, n) = (r.src_offset / unit, r.dst_offset / unit, r.size / unit);
        let mut at = 0;
        while at < n {
            let len = (n - at).min(TILE_WORDS);
            v.push([(s + at) as u32, (d + at) as u32, len as u32, 0]);
            at += len;
        }
    }
    v
}

/// The bytes a list of copy-shader tiles of `unit`-byte words reads from `src` and writes to
/// `dst`: the hull of each side's tiles (for the hazard tracker, which only needs to know what
/// may be touched).
pub fn tile_spans(tiles: &[[u32; 4]], unit: u64, src: vk::Buffer, dst: vk::Buffer) -> [Span; 2] {
    let hull = |buffer, side: usize| {
        let start = tiles.iter().map(|t| u64::from(t[side])).min().unwrap_or(0);
        let end = tiles
            .iter()
            .map(|t| u64::from(t[side]) + u64::from(t[2]))
            .max()
            .unwrap_or(0);
        Span {
            buffer,
            start: start * unit,
            end: end * unit,
        }
    };
    [hull(src, 0), hull(dst, 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_tiles_count_four_byte_words() {
        let regions = [vk::BufferCopy {
            src_offset: 4,
            dst_offset: 40,
            size: 12,
        }];
        assert_eq!(tiles(&regions, 4), vec![[1, 10, 3, 0]]);
    }

    #[test]
    fn tiles_cover_each_region_in_order() {
        let regions = [
            vk::BufferCopy {
                src_offset: 0,
                dst_offset: 1 << 20,
                size: 16 * (TILE_WORDS * 2 + 3),
            },
            vk::BufferCopy {
                src_offset: 32,
                dst_offset: 16,
                size: 16,
            },
        ];
        let t = tiles(&regions, 16);
        let w = TILE_WORDS as u32;
        assert_eq!(
            t,
            vec![
                [0, 65536, w, 0],
                [w, 65536 + w, w, 0],
                [2 * w, 65536 + 2 * w, 3, 0],
                [2, 1, 1, 0]
            ]
        );
    }

    #[test]
    fn tile_spans_are_the_hull_of_each_side() {
        use ash::vk::Handle;
        let (a, b) = (vk::Buffer::from_raw(1), vk::Buffer::from_raw(2));
        let [r, w] = tile_spans(&[[10, 100, 2, 0], [4, 200, 1, 0]], 16, a, b);
        assert_eq!((r.buffer, r.start, r.end), (a, 64, 192));
        assert_eq!((w.buffer, w.start, w.end), (b, 1600, 3216));
        let [r, _] = tile_spans(&[[10, 100, 2, 0]], 4, a, b);
        assert_eq!((r.start, r.end), (40, 48));
    }

    #[test]
    fn dependent_copies_start_new_batches_and_no_ops_are_dropped() {
        let mut p = CopyPlan::new(true);
        p.push(0, 128, 16);
        p.push(16, 144, 16);
        p.push(64, 64, 16);
        assert_eq!(p.regions(), 2);
        assert_eq!(p.batches().len(), 1);
        // Reads bytes the first copy wrote: a new batch.
        p.push(128, 0, 16);
        assert_eq!(
            p.batches().iter().map(|b| b.len()).collect::<Vec<_>>(),
            [2, 1]
        );
        assert_eq!(p.bytes(), 48);
        assert!(p.aligned(16));
        p.push(200, 300, 4);
        assert!(!p.aligned(16) && p.aligned(4));
    }
}
