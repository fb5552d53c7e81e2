//! The hot manager: a request's hot region, where the data plane caches the host rows it
//! gathers.
//!
//! A region is exactly `hot_blocks_per_request` GPU blocks per bucket (hot group
//! `2 + num_buckets + bucket`), allocated all at once when the request first needs to read from
//! host, and never partially: callers account for its whole cost first. It is released with the
//! request.

use alloc::vec::Vec;

use crate::coordinator::command::{HotAssignment, OffloadCommand};
use crate::pool::BlockPool;

/// The hot region of one request.
#[derive(Clone, Debug, Default)]
pub(in crate::coordinator) struct HotRegion {
    /// `bucket * hot_blocks_per_request + i` → GPU block; empty = no hot region.
    pub(in crate::coordinator) blocks: Vec<u32>,
}

/// Hot regions of `hot_blocks_per_request` blocks per bucket.
#[derive(Clone, Copy, Debug)]
pub(in crate::coordinator) struct HotManager {
    num_buckets: u32,
    hot_per: u32,
}

impl HotManager {
    /// The hot manager for `num_buckets` buckets of `hot_per` blocks per request.
    #[inline]
    pub(in crate::coordinator) fn new(num_buckets: u32, hot_per: u32) -> Self {
        HotManager {
            num_buckets,
            hot_per,
        }
    }

    /// Blocks per request and bucket (`hot_blocks_per_request`).
    #[inline]
    pub(in crate::coordinator) fn blocks_per_request(&self) -> u32 {
        self.hot_per
    }

    /// GPU blocks one whole region costs (every bucket).
    #[inline]
    pub(in crate::coordinator) fn cost(&self) -> u32 {
        self.num_buckets * self.hot_per
    }

    /// Gives the request in state row `row` its region, all at once, and records the
    /// assignments. Does nothing when it has one already, or when the GPU pool cannot pay the
    /// whole region (callers account for it first; never a partial one).
    #[inline]
    pub(in crate::coordinator) fn give(
        &self,
        t: &mut HotRegion,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        row: u32,
    ) {
        if !t.blocks.is_empty() {
            return;
        }
        let cost = self.cost();
        if gpu.num_free() < cost {
            return;
        }
        t.blocks.reserve(cost as usize);
        for _ in 0..cost {
            if let Some(b) = gpu.allocate() {
                t.blocks.push(b);
            }
        }
        for b in 0..self.num_buckets {
            let s = (b * self.hot_per) as usize;
            out.hot_assign.push(HotAssignment {
                slot: row,
                group: 2 + self.num_buckets + b,
                blocks: t.blocks[s..s + self.hot_per as usize].to_vec(),
            });
        }
    }

    /// Gives back the region (reverse order; its rows are caches, so never deferred) and
    /// records the release for state row `row`.
    #[inline]
    pub(in crate::coordinator) fn release(
        &self,
        t: &mut HotRegion,
        gpu: &mut BlockPool,
        out: &mut OffloadCommand,
        row: u32,
    ) {
        for &b in t.blocks.iter().rev() {
            let _ = gpu.free(b);
        }
        if !t.blocks.is_empty() {
            out.hot_release.push(row);
        }
        t.blocks.clear();
    }

    /// Writes the region of `bucket` as an `i32` row of `hot_blocks_per_request` GPU blocks, or
    /// `-1`s when there is none.
    #[inline]
    pub(in crate::coordinator) fn row(&self, t: &HotRegion, bucket: u32, out: &mut [i32]) {
        let s = (u64::from(bucket) * u64::from(self.hot_per)).min(usize::MAX as u64) as usize;
        for (i, o) in out.iter_mut().enumerate() {
            *o = if i < self.hot_per as usize && bucket < self.num_buckets {
                t.blocks.get(s + i).map_or(-1, |&b| b as i32)
            } else {
                -1
            };
        }
    }

    /// The region's invariants: whole or absent, and present whenever the request reads from
    /// host or may (`needs_region`: null entries, pages marked for release, unpinned pages).
    pub(in crate::coordinator) fn check(
        &self,
        t: &HotRegion,
        needs_region: bool,
    ) -> Result<(), (&'static str, Option<u32>)> {
        if !t.blocks.is_empty() && t.blocks.len() != self.cost() as usize {
            return Err(("partial hot region", None));
        }
        if needs_region && t.blocks.is_empty() {
            return Err(("reads from host without a hot region", None));
        }
        Ok(())
    }
}
