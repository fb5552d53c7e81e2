//! The per-request tables the data plane reads, exported as `i32` rows.

use super::request::{Req, Status};
use super::{CoordError, Coordinator, RequestId};
use crate::layout::GroupKind;

impl Coordinator {
    pub(super) fn running_req(&self, id: RequestId) -> Result<&Req, CoordError> {
        let r = self.req(id).ok_or(CoordError::UnknownRequest { id })?;
        if r.status != Status::Running {
            return Err(CoordError::NotRunning { id });
        }
        Ok(r)
    }

    /// Writes the request's resident table for `bucket` as an `i32` row: page → GPU block, `0`
    /// (the null block) for pages read from host and for pages beyond the request. Writes
    /// `min(out.len(), max_pages)` entries.
    pub fn resident_row(
        &self,
        id: RequestId,
        bucket: u32,
        out: &mut [i32],
    ) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let nb = self.num_buckets as usize;
        for (p, o) in out.iter_mut().enumerate() {
            *o = if p < r.pages as usize && (bucket as usize) < nb {
                r.resident[p * nb + bucket as usize] as i32
            } else {
                0
            };
        }
        Ok(())
    }

    /// Writes the request's host table as an `i32` row: page → host block, `-1` beyond the
    /// request.
    pub fn host_row(&self, id: RequestId, out: &mut [i32]) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        for (p, o) in out.iter_mut().enumerate() {
            *o = r.host.get(p).map_or(-1, |&b| b as i32);
        }
        Ok(())
    }

    /// Writes the request's hot region for `bucket` as an `i32` row of `hot_blocks_per_request`
    /// GPU blocks, or `-1`s when it has none.
    pub fn hot_row(&self, id: RequestId, bucket: u32, out: &mut [i32]) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let s = (u64::from(bucket) * u64::from(self.hot_per)).min(usize::MAX as u64) as usize;
        for (i, o) in out.iter_mut().enumerate() {
            *o = if i < self.hot_per as usize && bucket < self.num_buckets {
                r.hot.get(s + i).map_or(-1, |&b| b as i32)
            } else {
                -1
            };
        }
        Ok(())
    }

    /// Writes the request's block table of layout group `group` (indexer, resident or regular)
    /// as an `i32` row: page → GPU block, `0` for null entries and pages beyond the request.
    pub fn block_table_row(
        &self,
        id: RequestId,
        group: usize,
        out: &mut [i32],
    ) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let kind = self.kv.groups.get(group).map(|g| g.kind);
        let nr = self.regular_groups.len();
        for (p, o) in out.iter_mut().enumerate() {
            *o = if p >= r.pages as usize {
                0
            } else {
                match kind {
                    Some(GroupKind::Indexer) => r.indexer[p] as i32,
                    Some(GroupKind::Resident) => {
                        let b = self.kv.groups[group].bucket.unwrap_or(0) as usize;
                        r.resident[p * self.num_buckets as usize + b] as i32
                    }
                    Some(GroupKind::Regular) => {
                        let gi = group - self.kv.regular_groups().start;
                        r.regular[p * nr + gi] as i32
                    }
                    Some(GroupKind::Source) => r.host[p] as i32,
                    _ => 0,
                }
            };
        }
        Ok(())
    }
}
