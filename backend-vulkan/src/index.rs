//! The index operations (remap, invalidation, compressed slot mapping) and the table maintenance
//! ones (sparse table writes, hot-state resets), one dispatch each (the resolver is in
//! `resolve`).

use hisparse_core::ops::{
    HotResetDesc, InvalidateArgs, InvalidateDesc, RemapArgs, RemapDesc, STATS_SLOT_WORDS,
    SlotMappingArgs, SlotMappingDesc, TableWrite,
};

use crate::shaders::Shader;
use crate::vk::{Binding, Engine, RawBuffer};
use crate::{Result, VulkanBuffer, VulkanDevice, VulkanError};

/// `x` rounded down to a multiple of `align`.
fn align_down(x: u64, align: u64) -> u64 {
    x / align * align
}

/// Splits sorted table writes into runs whose indices fit one binding of `window` bytes starting
/// at an `align`ed byte offset, at most `max_len` writes each: `(first, end, base byte)`.
fn table_runs(
    writes: &[TableWrite],
    window: u64,
    align: u64,
    max_len: usize,
) -> Vec<(usize, usize, u64)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < writes.len() {
        let base = align_down(u64::from(writes[i].index) * 4, align);
        let mut j = i + 1;
        while j < writes.len()
            && j - i < max_len
            && u64::from(writes[j].index) * 4 + 4 - base <= window
        {
            j += 1;
        }
        runs.push((i, j, base));
        i = j;
    }
    runs
}

/// Splits sorted, distinct state rows into groups whose `slot_host_rows` rows (`4n` bytes each) and LRU
/// words fit one binding each: `(first, end, slot_host_rows base byte, lru base byte)`.
fn reset_groups(rows: &[u32], n: u64, window: u64, align: u64) -> Vec<(usize, usize, u64, u64)> {
    let slot_host_rows_end = |r: u32| (u64::from(r) + 1) * n * 4;
    let lru_end = |r: u32| ((u64::from(r) * n + n - 1) / 2 + 1) * 4;
    let mut groups = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let r0 = u64::from(rows[i]);
        let slot_host_rows_base = align_down(r0 * n * 4, align);
        let lru_base = align_down(r0 * n / 2 * 4, align);
        let mut j = i + 1;
        while j < rows.len()
            && slot_host_rows_end(rows[j]) - slot_host_rows_base <= window
            && lru_end(rows[j]) - lru_base <= window
        {
            j += 1;
        }
        groups.push((i, j, slot_host_rows_base, lru_base));
        i = j;
    }
    groups
}

impl VulkanDevice {
    /// A sub-range binding of `b` (`[offset, end)`, within the buffer).
    pub(crate) fn range(b: &RawBuffer, offset: u64, end: u64) -> Binding {
        Binding {
            buffer: b.buffer,
            offset,
            range: end.min(b.size) - offset,
        }
    }

    /// Checked sparse writes into an `i32` table on stream `s`: one dispatch per run of writes
    /// that fits one binding (one dispatch for any table up to `maxStorageBufferRange`).
    pub(crate) fn table_writes(
        &self,
        s: usize,
        writes: &[TableWrite],
        table: &RawBuffer,
    ) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let limits = &self.ctx.limits;
        let max_len = ((limits.window / 8) as usize).min(1 << 24);
        let runs = table_runs(
            writes,
            limits.window,
            limits.storage_offset_alignment,
            max_len,
        );
        self.ctx.record(s, Engine::Compute, "write_table", |rec| {
            for &(i, j, base) in &runs {
                let list = rec.params(&writes[i..j])?;
                let end = u64::from(writes[j - 1].index) * 4 + 4;
                let push = [(j - i) as u32, (base / 4) as u32];
                rec.dispatch(
                    Shader::TableWrite,
                    &[list, Self::range(table, base, end)],
                    &push,
                    ((j - i) as u64).div_ceil(256),
                )?;
            }
            Ok(())
        })
    }

    /// Checked hot-state resets on stream `s`: one dispatch per group of listed rows whose
    /// state fits one binding (one dispatch for states up to `maxStorageBufferRange`).
    pub(crate) fn hot_reset(
        &self,
        s: usize,
        desc: &HotResetDesc,
        rows: &[u32],
        slot_host_rows: &RawBuffer,
        lru: &RawBuffer,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (r, n) = (desc.num_requests, desc.hot_slots);
        if u64::from(r) * u64::from(n) >= 1 << 31 {
            return Err(VulkanError::Unsupported(format!(
                "reset_hot_state: {r} state rows × {n} hot slots exceed the shader's 31-bit entry \
                 index; use fewer rows per state buffer"
            )));
        }
        let mut sorted = rows.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut bitmap = vec![0u32; r.div_ceil(32) as usize];
        for &row in &sorted {
            bitmap[(row / 32) as usize] |= 1 << (row % 32);
        }
        let limits = &self.ctx.limits;
        let groups = reset_groups(
            &sorted,
            u64::from(n),
            limits.window,
            limits.storage_offset_alignment,
        );
        self.ctx
            .record(s, Engine::Compute, "reset_hot_state", |rec| {
                for &(i, j, slot_host_rows_base, lru_base) in &groups {
                    let mut list: Vec<u32> = sorted[i..j].to_vec();
                    list.extend_from_slice(&bitmap);
                    let list = rec.params(&list)?;
                    let last = u64::from(sorted[j - 1]);
                    let n64 = u64::from(n);
                    let slot_host_rows_end = (last + 1) * n64 * 4;
                    let lru_end = ((last * n64 + n64 - 1) / 2 + 1) * 4;
                    let push = [
                        (j - i) as u32,
                        n,
                        r,
                        (slot_host_rows_base / 4) as u32,
                        (lru_base / 4) as u32,
                        0,
                    ];
                    rec.dispatch(
                        Shader::HotReset,
                        &[
                            list,
                            Self::range(slot_host_rows, slot_host_rows_base, slot_host_rows_end),
                            Self::range(lru, lru_base, lru_end),
                        ],
                        &push,
                        ((j - i) as u64 * n64).div_ceil(256),
                    )?;
                }
                Ok(())
            })
    }

    /// A checked remap on stream `s` (an empty batch with stats is one workgroup that counts the
    /// call).
    pub(crate) fn remap_rows(
        &self,
        s: usize,
        desc: &RemapDesc,
        args: RemapArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        if desc.num_tokens == 0 && args.stats.is_none() {
            return Ok(());
        }
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let table = u64::from(desc.table_rows) * u64::from(desc.max_blocks);
        let mut b = vec![
            self.bind_index(args.req_id.raw(), 4 * t, "req_id")?,
            self.bind_index(args.block_table.raw(), 4 * table, "block_table")?,
            self.bind_index(args.topk.raw(), 4 * tk, "topk")?,
        ];
        let map = args.idx_mapping.map(|m| {
            let n = u64::from(desc.idx_mapping_len.unwrap_or(0));
            self.bind_index(m.raw(), 4 * n, "idx_mapping")
        });
        let out = self.bind_index(args.out.raw(), 4 * tk, "out")?;
        let counts = match &args.counts {
            Some(c) => Some(self.bind_index(c.raw(), 4 * t, "counts")?),
            None => None,
        };
        let stats = match &args.stats {
            Some(st) => Some(self.bind_stats(st, desc.stats_slot)?),
            None => None,
        };
        let map = map.transpose()?;
        let flags = u32::from(desc.write_counts)
            | u32::from(desc.compact) << 1
            | u32::from(desc.idx_mapping_len.is_some()) << 2
            | u32::from(stats.is_some()) << 3;
        let push = [
            desc.num_tokens,
            desc.top_k,
            desc.table_rows,
            desc.max_blocks,
            desc.block_size,
            desc.block_stride_rows,
            desc.idx_mapping_len.unwrap_or(0),
            flags,
            stats.map_or(0, |(_, word)| word),
        ];
        self.ctx.record(s, Engine::Compute, "remap", |rec| {
            // Without counts or stats the shader writes none; the bindings must still be valid.
            let mut unused = || -> Result<Binding> {
                Ok(Binding {
                    buffer: rec.scratch(16)?,
                    offset: 0,
                    range: 16,
                })
            };
            let counts = match counts {
                Some(c) => c,
                None => unused()?,
            };
            let stats = match stats {
                Some((b, _)) => b,
                None => unused()?,
            };
            b.push(map.unwrap_or(b[0]));
            b.push(out);
            b.push(counts);
            b.push(stats);
            // One workgroup at least: an empty batch with stats counts the call.
            rec.dispatch(Shader::Remap, &b, &push, t.max(1))
        })
    }

    /// The binding of a stats buffer (from its start) and the index of slot `slot`'s first word
    /// in it (`hisparse_core::ops::stats`; the core checked that the buffer holds the slot).
    pub(crate) fn bind_stats(&self, stats: &VulkanBuffer, slot: u32) -> Result<(Binding, u32)> {
        let words = (u64::from(slot) + 1) * u64::from(STATS_SLOT_WORDS);
        let binding = self.bind_index(stats.raw(), 4 * words, "stats")?;
        // Inside one binding, so the word index fits the shaders' u32.
        Ok((binding, slot * STATS_SLOT_WORDS))
    }

    /// A checked invalidation on stream `s`.
    pub(crate) fn invalidate_rows(
        &self,
        s: usize,
        desc: &InvalidateDesc,
        args: InvalidateArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        let entries = u64::from(desc.num_requests) * u64::from(desc.hot_slots);
        if desc.num_ranges == 0 {
            return Ok(());
        }
        let b = [
            self.bind_index(args.ranges.raw(), 8 * u64::from(desc.num_ranges), "ranges")?,
            self.bind_index(args.slot_host_rows.raw(), 4 * entries, "slot_host_rows")?,
        ];
        let push = [entries as u32, desc.num_ranges];
        self.ctx.record(s, Engine::Compute, "invalidate", |rec| {
            rec.dispatch(Shader::Invalidate, &b, &push, entries.div_ceil(256))
        })
    }

    /// A checked compressed slot mapping on stream `s`.
    pub(crate) fn slot_mapping(
        &self,
        s: usize,
        desc: &SlotMappingDesc,
        args: SlotMappingArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        let t = u64::from(desc.num_tokens);
        if t == 0 {
            return Ok(());
        }
        let table = u64::from(desc.table_rows) * u64::from(desc.max_blocks);
        let b = [
            self.bind_index(args.positions.raw(), 4 * t, "positions")?,
            self.bind_index(args.slot_mapping.raw(), 4 * t, "slot_mapping")?,
            self.bind_index(args.table_row.raw(), 4 * t, "table_row")?,
            self.bind_index(args.block_table.raw(), 4 * table, "block_table")?,
            self.bind_index(args.out.raw(), 4 * t, "out")?,
        ];
        let push = [
            desc.num_tokens,
            desc.ratio,
            desc.block_size,
            desc.table_rows,
            desc.max_blocks,
        ];
        self.ctx
            .record(s, Engine::Compute, "compressed_slot_mapping", |rec| {
                rec.dispatch(Shader::SlotMapping, &b, &push, t.div_ceil(256))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_runs_split_at_the_binding_window() {
        let w = |index| TableWrite { index, value: 0 };
        let writes = [w(0), w(5), w(40), w(41), w(100)];
        // Window of 64 bytes = 16 elements; 16-byte aligned bases.
        assert_eq!(
            table_runs(&writes, 64, 16, 1 << 20),
            vec![(0, 2, 0), (2, 4, 160), (4, 5, 400)]
        );
        // At most two writes per run.
        assert_eq!(table_runs(&writes, 1 << 20, 16, 2).len(), 3);
        assert_eq!(table_runs(&writes, 1 << 20, 16, 1 << 20), vec![(0, 5, 0)]);
    }

    #[test]
    fn reset_groups_keep_each_group_inside_one_binding() {
        // 4 slots per row: 16 slot_host_rows bytes and 8 LRU bytes per row; a 32-byte window.
        let g = reset_groups(&[0, 1, 2, 7], 4, 32, 16);
        assert_eq!(g, vec![(0, 2, 0, 0), (2, 3, 32, 16), (3, 4, 112, 48)]);
        // Odd slot counts: row 1's LRU words start inside row 0's last word.
        let g = reset_groups(&[1], 3, 1 << 20, 4);
        assert_eq!(g, vec![(0, 1, 12, 4)]);
    }
}
