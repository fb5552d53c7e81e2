//! The per-request tables the data plane reads, exported as `i32` rows.

use super::request::{Req, Status};
use super::{CoordError, Coordinator, RequestId};
use crate::layout::GroupKind;

impl Coordinator {
    /// The running request `id`.
    pub(super) fn running_req(&self, id: RequestId) -> Result<&Req, CoordError> {
        let r = self.req(id).ok_or(CoordError::UnknownRequest { id })?;
        if r.status != Status::Running {
            return Err(r.status_error());
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
        self.resident.row(&r.resident, r.pages, bucket, out);
        Ok(())
    }

    /// Writes the request's host table as an `i32` row: page → host block, `-1` beyond the
    /// request.
    pub fn host_row(&self, id: RequestId, out: &mut [i32]) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        self.source.row(&r.source, out);
        Ok(())
    }

    /// Writes the request's hot region for `bucket` as an `i32` row of `hot_blocks_per_request`
    /// GPU blocks, or `-1`s when it has none.
    pub fn hot_row(&self, id: RequestId, bucket: u32, out: &mut [i32]) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        self.hot.row(&r.hot, bucket, out);
        Ok(())
    }

    /// Writes the request's block table of layout group `group` (indexer, resident or regular)
    /// as an `i32` row: column → GPU block (a page for the indexer and resident groups, a block
    /// of the group's own size for a regular one), `0` for null entries and columns beyond the
    /// request.
    pub fn block_table_row(
        &self,
        id: RequestId,
        group: usize,
        out: &mut [i32],
    ) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let kind = self.kv.groups.get(group).map(|g| g.kind);
        let pages = r.pages as usize;
        for (p, o) in out.iter_mut().enumerate() {
            *o = match kind {
                Some(GroupKind::Indexer) if p < pages => {
                    r.paged.indexer.get(p).copied().unwrap_or(0) as i32
                }
                Some(GroupKind::Resident) if p < pages => {
                    let b = self.kv.groups[group].bucket.unwrap_or(0);
                    self.resident.block(&r.resident, p as u32, b) as i32
                }
                Some(GroupKind::Regular) => {
                    let gi = group - self.kv.regular_groups().start;
                    self.paged.regular_block(&r.paged, p as u32, gi) as i32
                }
                Some(GroupKind::Source) if p < pages => {
                    r.source.blocks.get(p).copied().unwrap_or(0) as i32
                }
                _ => 0,
            };
        }
        Ok(())
    }
}
