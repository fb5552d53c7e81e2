//! Splitting lists of byte copies into `vkCmdCopyBuffer` batches that give the reference's
//! sequential result: regions inside one batch run in any order, so a region that writes bytes an
//! earlier region of the batch reads or writes (or reads bytes it writes) starts a new batch, and
//! a copy whose source and destination overlap in one buffer is cut into memmove-ordered pieces.

use std::collections::BTreeMap;

use ash::vk;

/// Disjoint half-open byte intervals, merged on insertion.
#[derive(Default, Debug)]
struct Intervals(BTreeMap<u64, u64>);

impl Intervals {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    fn insert(&mut self, mut start: u64, mut end: u64) {
        while let Some((&s, &e)) = self.0.range(..=end).next_back() {
            if e < start {
                break;
            }
            start = start.min(s);
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Batches of copy regions in execution order.
#[derive(Debug)]
pub struct CopyPlan {
    same_buffer: bool,
    batches: Vec<Vec<vk::BufferCopy>>,
    srcs: Intervals,
    dsts: Intervals,
}

impl CopyPlan {
    /// A plan for copies from one buffer to another (`same_buffer = false`) or within one.
    pub fn new(same_buffer: bool) -> Self {
        CopyPlan {
            same_buffer,
            batches: vec![Vec::new()],
            srcs: Intervals::default(),
            dsts: Intervals::default(),
        }
    }

    fn flush(&mut self) {
        if self.batches.last().is_some_and(|b| !b.is_empty()) {
            self.batches.push(Vec::new());
        }
        self.srcs.clear();
        self.dsts.clear();
    }

    fn add(&mut self, src: u64, dst: u64, len: u64) {
        let conflict = self.dsts.overlaps(dst, dst + len)
            || (self.same_buffer
                && (self.dsts.overlaps(src, src + len) || self.srcs.overlaps(dst, dst + len)));
        if conflict {
            self.flush();
        }
        self.srcs.insert(src, src + len);
        self.dsts.insert(dst, dst + len);
        if let Some(b) = self.batches.last_mut() {
            b.push(vk::BufferCopy {
                src_offset: src,
                dst_offset: dst,
                size: len,
            });
        }
    }

    /// Appends the copy of `len` bytes from `src` to `dst`, after every copy pushed before.
    pub fn push(&mut self, src: u64, dst: u64, len: u64) {
        if len == 0 || (self.same_buffer && src == dst) {
            return;
        }
        let overlapping = self.same_buffer && src < dst + len && dst < src + len;
        if !overlapping {
            self.add(src, dst, len);
            return;
        }
        // memmove: pieces of the distance's length, moving away from the destination side.
        let step = src.abs_diff(dst);
        if dst > src {
            let mut end = len;
            while end > 0 {
                let start = end.saturating_sub(step);
                self.add(src + start, dst + start, end - start);
                end = start;
            }
        } else {
            let mut start = 0;
            while start < len {
                let end = (start + step).min(len);
                self.add(src + start, dst + start, end - start);
                start = end;
            }
        }
    }

    /// The batches, each to be recorded as one `vkCmdCopyBuffer` (or one copy dispatch) after a
    /// barrier.
    pub fn batches(&self) -> impl Iterator<Item = &[vk::BufferCopy]> {
        self.batches
            .iter()
            .filter(|b| !b.is_empty())
            .map(Vec::as_slice)
    }

    /// Regions of the plan.
    pub fn regions(&self) -> usize {
        self.batches.iter().map(Vec::len).sum()
    }

    /// Bytes the plan copies.
    pub fn bytes(&self) -> u64 {
        self.batches.iter().flatten().map(|r| r.size).sum()
    }

    /// Whether every offset and length is a multiple of `align`.
    pub fn aligned(&self, align: u64) -> bool {
        self.batches
            .iter()
            .flatten()
            .all(|r| (r.src_offset | r.dst_offset | r.size) % align == 0)
    }
}

/// Words (16 bytes) of one tile of the copy shader: a workgroup copies one tile.
pub const TILE_WORDS: u64 = 4096;

/// The copy shader's tiles of a batch of 16-byte aligned regions: `[src word, dst word, words,
/// 0]`, each at most [`TILE_WORDS`] words. Regions of one batch do not conflict, so neither do
/// their tiles.
pub fn tiles(batch: &[vk::BufferCopy]) -> Vec<[u32; 4]> {
    let mut v = Vec::new();
    for r in batch {
        let (s, d, n) = (r.src_offset / 16, r.dst_offset / 16, r.size / 16);
        let mut at = 0;
        while at < n {
            let len = (n - at).min(TILE_WORDS);
            v.push([(s + at) as u32, (d + at) as u32, len as u32, 0]);
            at += len;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Executes the plan batch by batch, each batch reading before writing (the worst order a
    /// device may pick), and compares with sequential `copy_within`.
    fn check(same: bool, copies: &[(u64, u64, u64)]) {
        let n = 256usize;
        let init: Vec<u8> = (0..n as u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut plan = CopyPlan::new(same);
        for &(s, d, l) in copies {
            plan.push(s, d, l);
        }
        let (mut src_buf, mut dst_buf) = (init.clone(), vec![0u8; n]);
        let (mut ref_src, mut ref_dst) = (init.clone(), vec![0u8; n]);
        for &(s, d, l) in copies {
            let (s, d, l) = (s as usize, d as usize, l as usize);
            if same {
                ref_src.copy_within(s..s + l, d);
            } else {
                ref_dst[d..d + l].copy_from_slice(&ref_src[s..s + l]);
            }
        }
        for batch in plan.batches() {
            let reads: Vec<Vec<u8>> = batch
                .iter()
                .map(|r| {
                    let (s, l) = (r.src_offset as usize, r.size as usize);
                    src_buf[s..s + l].to_vec()
                })
                .collect();
            for (r, bytes) in batch.iter().zip(reads) {
                let d = r.dst_offset as usize;
                let target = if same { &mut src_buf } else { &mut dst_buf };
                target[d..d + bytes.len()].copy_from_slice(&bytes);
            }
        }
        if same {
            assert_eq!(src_buf, ref_src);
        } else {
            assert_eq!(dst_buf, ref_dst);
        }
    }

    #[test]
    fn chained_and_overlapping_copies_match_sequential_order() {
        check(true, &[(0, 64, 64), (64, 128, 64), (128, 192, 64)]);
        check(true, &[(0, 10, 100)]);
        check(true, &[(50, 3, 100), (7, 7, 9)]);
        check(false, &[(0, 0, 64), (64, 0, 64), (128, 32, 16)]);
        check(true, &[(0, 128, 16), (16, 144, 16), (32, 160, 16)]);
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
        let t = tiles(&regions);
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
    fn independent_copies_share_one_batch() {
        let mut p = CopyPlan::new(true);
        p.push(0, 128, 16);
        p.push(16, 144, 16);
        assert_eq!(p.batches().count(), 1);
        p.push(128, 0, 16);
        assert_eq!(p.batches().count(), 2);
    }
}
