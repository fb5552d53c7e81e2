//! The resolver (`resolve`): residency resolve with the per-request hot-state update, as one of
//! two kernels ([`ResolveKernel`]).
//!
//! * **Workgroup** (`shaders/resolve_wg.wgsl`, the default on GPUs that run workgroups of 1024
//!   invocations with 32 KiB of workgroup memory; with 44 KiB its hash table is larger, at most
//!   half full): one dispatch; per request one workgroup
//!   keeps the wanted-row hash table, the evictable list and the LRU bitmap in workgroup memory
//!   and its entries and LRU positions in registers, as the CUDA kernel does, so a decode-sized
//!   request (top-k up to 2048, up to 4096 hot slots) costs a handful of dependent device-memory
//!   round trips. Larger requests (speculative rows beyond 2048 entries, more hot slots) take the
//!   same phases with those arrays in a scratch buffer (global mode), decided per request on the
//!   device.
//! * **Portable** (`shaders/resolve_prep.wgsl` + `shaders/resolve.wgsl`, for devices with
//!   smaller workgroups, and the default on CPU devices: lavapipe runs a workgroup's invocations
//!   on one thread, so a request's 1024 invocations there take longer than 256 of the portable
//!   kernel): a grouping pass, then one 256-invocation workgroup per request with every array in
//!   the scratch buffer.
//!
//! In batch-row order (`ResolveDesc::num_state_rows`) a first pass (`shaders/resolve_order.wgsl`)
//! writes each token row's batch row, or `-1` where the batch row owns no state row, into the
//! scratch buffer; both kernels read that in place of `req_id` and read the state row of the
//! resident table, `slot_host_rows` and LRU through `idx_mapping` (flags bit 2), the host and hot tables by
//! batch row. State-row order records exactly what it did before the option existed.
//!
//! Both give results identical to the reference; [`VulkanOptions::resolve_kernel`] chooses for
//! comparisons,
//! and `global` forces the workgroup kernel's global mode for every request (tests cover that
//! mode with it).
//!
//! With a stats buffer (`hisparse_core::ops::stats`) one more dispatch in the same recording
//! (`shaders/resolve_stats.wgsl`) adds the call's row counts and the call to its slot; an empty
//! batch records that dispatch alone.

use std::sync::atomic::Ordering;

use hisparse_core::ops::{ResolveArgs, ResolveDesc};

#[cfg(doc)]
use crate::VulkanOptions;
use crate::shaders::Shader;
use crate::vk::{Binding, Engine, Rec};
use crate::{Result, VulkanBuffer, VulkanDevice, VulkanError};

/// Which kernel runs `resolve` (all give identical results; [`VulkanOptions::resolve_kernel`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ResolveKernel {
    /// `Workgroup` on GPUs that can run it, else `Portable`.
    #[default]
    Auto = 0,
    /// One dispatch, per-request state in workgroup memory where the request fits.
    Workgroup = 1,
    /// The workgroup kernel with every request in global mode (state in the scratch buffer).
    Global = 2,
    /// The grouping pass and the 256-invocation kernel with its state in the scratch buffer.
    Portable = 3,
}

impl ResolveKernel {
    pub(crate) fn from_u8(v: u8) -> ResolveKernel {
        match v {
            1 => ResolveKernel::Workgroup,
            2 => ResolveKernel::Global,
            3 => ResolveKernel::Portable,
            _ => ResolveKernel::Auto,
        }
    }
}

/// Words of the workgroup kernel's scratch buffer (its global mode; the layout is described in
/// `shaders/resolve_wg.wgsl`): `7·T·K + 4·T + G·(2N + ⌈N/32⌉)` with `G = min(R, T)`.
pub(crate) fn resolve_wg_scratch_words(desc: &ResolveDesc) -> u64 {
    let t = u64::from(desc.num_tokens);
    let tk = t * u64::from(desc.top_k);
    let n = u64::from(desc.hot_slots);
    let groups = u64::from(desc.num_requests).min(t);
    7 * tk + 4 * t + groups * (2 * n + n.div_ceil(32))
}

impl VulkanDevice {
    /// The resolver in use ([`ResolveKernel::Auto`] resolved for this device).
    pub fn resolve_kernel(&self) -> ResolveKernel {
        match ResolveKernel::from_u8(self.resolve_kernel.load(Ordering::Relaxed)) {
            ResolveKernel::Auto if self.ctx.limits.workgroup_resolver && self.ctx.limits.gpu => {
                ResolveKernel::Workgroup
            }
            ResolveKernel::Auto => ResolveKernel::Portable,
            k => k,
        }
    }

    /// Chooses the resolver for later calls (benches and tests compare them; results are
    /// identical). The workgroup kernels need workgroups of 1024 invocations and 32 KiB of
    /// workgroup memory: on a device without them, an `Unsupported` error.
    pub fn set_resolve_kernel(&self, kernel: ResolveKernel) -> Result<()> {
        if matches!(kernel, ResolveKernel::Workgroup | ResolveKernel::Global)
            && !self.ctx.limits.workgroup_resolver
        {
            return Err(VulkanError::Unsupported(format!(
                "resolve kernel {kernel:?} needs compute workgroups of 1024 invocations and {} \
                 bytes of workgroup memory, which this device lacks; use the portable kernel (or auto)",
                crate::vk::RESOLVE_WG_SHARED_BYTES
            )));
        }
        self.resolve_kernel.store(kernel as u8, Ordering::Relaxed);
        Ok(())
    }

    /// The bindings the resolve arguments share by both kernels (0..=12), then `idx_mapping`
    /// (the kernels bind it after their scratch; `req_id` stands in for it in state-row order,
    /// where the kernels do not read it).
    fn resolve_bindings(
        &self,
        desc: &ResolveDesc,
        args: &ResolveArgs<'_, VulkanBuffer>,
    ) -> Result<(Vec<Binding>, Binding)> {
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let r = u64::from(desc.num_requests);
        let state = u64::from(desc.state_table_rows());
        let resident = state * u64::from(desc.max_pages);
        let pages = r * u64::from(desc.max_pages);
        let slots = state * u64::from(desc.hot_slots);
        let hot = r * u64::from(desc.hot_table_width());
        let req_id = self.bind_index(args.req_id.raw(), 4 * t, "req_id")?;
        let idx_mapping = match args.idx_mapping {
            Some(m) => self.bind_index(m.raw(), 4 * r, "idx_mapping")?,
            None => req_id,
        };
        let common = vec![
            req_id,
            self.bind_index(args.topk.raw(), 4 * tk, "topk")?,
            self.bind_index(args.resident_table.raw(), 4 * resident, "resident_table")?,
            self.bind_index(args.host_table.raw(), 4 * pages, "host_table")?,
            self.bind_index(args.hot_table.raw(), 4 * hot, "hot_table")?,
            self.bind_index(args.slot_host_rows.raw(), 4 * slots, "slot_host_rows")?,
            self.bind_index(args.lru.raw(), 2 * slots, "lru")?,
            self.bind_index(args.indices.raw(), 4 * tk, "indices")?,
            self.bind_index(args.valid_counts.raw(), 4 * t, "valid_counts")?,
            self.bind_index(args.hit_counts.raw(), 4 * t, "hit_counts")?,
            self.bind_index(args.miss_counts.raw(), 4 * t, "miss_counts")?,
            self.bind_index(args.miss_src.raw(), 4 * tk, "miss_src")?,
            self.bind_index(args.miss_dst.raw(), 4 * tk, "miss_dst")?,
        ];
        Ok((common, idx_mapping))
    }

    /// Takes the call's `total` bytes of scratch and, in batch-row order, records the pass
    /// writing each token row's owning batch row (or -1) into the scratch's `eff` region (from
    /// `eff_at`) and rebinds binding 0 to it; in state-row order records nothing. Returns the
    /// scratch buffer and the flags bit the kernels read (bit 2).
    fn scratch_with_batch_order(
        rec: &mut crate::vk::Rec<'_>,
        desc: &ResolveDesc,
        b: &mut [Binding],
        idx_mapping: Binding,
        (eff_at, total): (u64, u64),
    ) -> Result<(ash::vk::Buffer, u32)> {
        let scratch = rec.scratch(total)?;
        let Some(state_rows) = desc.num_state_rows else {
            return Ok((scratch, 0));
        };
        let eff = Binding {
            buffer: scratch,
            offset: eff_at,
            range: total - eff_at,
        };
        let push = [desc.num_tokens, desc.num_requests, state_rows];
        rec.dispatch(
            Shader::ResolveOrder,
            &[b[0], idx_mapping, eff],
            &push,
            u64::from(desc.num_tokens).div_ceil(256),
        )?;
        b[0] = eff;
        Ok((scratch, 4))
    }

    /// Bytes at which the batch-order pass's `eff` region starts after `bytes` of scratch, and
    /// the scratch bytes with it (`bytes` alone in state-row order).
    fn with_eff_region(&self, desc: &ResolveDesc, bytes: u64) -> (u64, u64) {
        if desc.num_state_rows.is_none() {
            return (bytes, bytes);
        }
        let align = self.ctx.limits.storage_offset_alignment.max(256);
        let at = bytes.div_ceil(align) * align;
        (at, at + (4 * u64::from(desc.num_tokens)).max(16))
    }

    /// The push constants both kernels take: the descriptor, then `flags`.
    fn resolve_push(desc: &ResolveDesc, flags: u32) -> [u32; 10] {
        [
            desc.num_tokens,
            desc.top_k,
            desc.num_requests,
            desc.max_pages,
            desc.block_size,
            desc.hot_slots,
            desc.attention_block_stride,
            desc.host_rows() as u32,
            desc.hot_table_width(),
            flags,
        ]
    }

    /// A checked resolve on stream `s` with the kernel in use.
    pub(crate) fn resolve_rows(
        &self,
        s: usize,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        let stats = match &args.stats {
            Some(st) => Some(self.bind_stats(st, desc.stats_slot)?),
            None => None,
        };
        if desc.num_tokens == 0 {
            // Nothing to resolve; with stats the call still counts.
            let Some(stats) = stats else {
                return Ok(());
            };
            let (b, _) = self.resolve_bindings(desc, &args)?;
            return self.ctx.record(s, Engine::Compute, "resolve", |rec| {
                Self::record_stats(rec, desc, &b, stats)
            });
        }
        match self.resolve_kernel() {
            ResolveKernel::Portable | ResolveKernel::Auto => {
                self.resolve_portable(s, desc, args, stats)
            }
            k => self.resolve_workgroup(s, desc, args, stats, k == ResolveKernel::Workgroup),
        }
    }

    /// Records the stats pass after a resolver dispatch over bindings `b` (its counts at
    /// 8, 9, 10: valid, hits, misses): the call's sums and the call into slot word `stats.1` of
    /// `stats.0`.
    fn record_stats(
        rec: &mut Rec<'_>,
        desc: &ResolveDesc,
        b: &[Binding],
        stats: (Binding, u32),
    ) -> Result<()> {
        let push = [desc.num_tokens, stats.1];
        rec.dispatch(
            Shader::ResolveStats,
            &[b[9], b[10], b[8], stats.0],
            &push,
            u64::from(desc.num_tokens).div_ceil(256).max(1),
        )
    }

    /// The one-dispatch kernel (and the stats pass with `stats`); `fast` allows workgroup mode.
    fn resolve_workgroup(
        &self,
        s: usize,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, VulkanBuffer>,
        stats: Option<(Binding, u32)>,
        fast: bool,
    ) -> Result<()> {
        let (mut b, idx_mapping) = self.resolve_bindings(desc, &args)?;
        let words = resolve_wg_scratch_words(desc);
        let bytes = (4 * words).max(16);
        let region = self.with_eff_region(desc, bytes);
        let max = self.ctx.limits.max_storage_range;
        if bytes > max || words >= 1 << 32 {
            return Err(VulkanError::Unsupported(format!(
                "resolve scratch of {bytes} bytes exceeds one storage binding \
                 (maxStorageBufferRange = {max} bytes); split the batch (fewer tokens per call)"
            )));
        }
        let group_by_request = desc.num_requests <= desc.num_tokens;
        let flags = u32::from(group_by_request) | u32::from(fast) << 1;
        let l = &self.ctx.limits;
        let shader = match (l.workgroup_resolver_large, l.subgroup_arithmetic) {
            (true, true) => Shader::ResolveWgLargeSubgroup,
            (true, false) => Shader::ResolveWgLarge,
            (false, true) => Shader::ResolveWgSubgroup,
            (false, false) => Shader::ResolveWg,
        };
        self.ctx.record(s, Engine::Compute, "resolve", |rec| {
            let (scratch, order) =
                Self::scratch_with_batch_order(rec, desc, &mut b, idx_mapping, region)?;
            let push = Self::resolve_push(desc, flags | order);
            b.push(Binding {
                buffer: scratch,
                offset: 0,
                range: bytes,
            });
            b.push(idx_mapping);
            rec.dispatch(shader, &b, &push, u64::from(desc.num_tokens))?;
            match stats {
                Some(st) => Self::record_stats(rec, desc, &b, st),
                None => Ok(()),
            }
        })
    }

    /// The grouping pass, then one 256-invocation workgroup per request (and the stats pass with
    /// `stats`).
    fn resolve_portable(
        &self,
        s: usize,
        desc: &ResolveDesc,
        args: ResolveArgs<'_, VulkanBuffer>,
        stats: Option<(Binding, u32)>,
    ) -> Result<()> {
        let t = u64::from(desc.num_tokens);
        let k = u64::from(desc.top_k);
        let r = u64::from(desc.num_requests);
        let n = u64::from(desc.hot_slots);
        let tk = t * k;
        let (mut b, idx_mapping) = self.resolve_bindings(desc, &args)?;
        // Scratch regions (words): info 4T, perm T, gval TK, xmiss TK, hash 8TK, rowc 4T,
        // old G*N, evl G*N with G = min(R, T) groups.
        let groups = r.min(t);
        let words = [4 * t, t, tk, tk, 8 * tk, 4 * t, groups * n, groups * n];
        let align = self.ctx.limits.storage_offset_alignment.max(256);
        let mut regions = Vec::with_capacity(words.len());
        let mut at = 0u64;
        for w in words {
            let bytes = (4 * w).max(16);
            if bytes > self.ctx.limits.max_storage_range {
                return Err(VulkanError::Unsupported(format!(
                    "resolve scratch of {bytes} bytes exceeds one storage binding \
                     (maxStorageBufferRange = {} bytes); split the batch (fewer tokens per call)",
                    self.ctx.limits.max_storage_range
                )));
            }
            regions.push((at, bytes));
            at = (at + bytes).div_ceil(align) * align;
        }
        let resolver = if self.ctx.limits.subgroup_arithmetic {
            Shader::ResolveSubgroup
        } else {
            Shader::Resolve
        };
        let push_prep = [desc.num_tokens, desc.num_requests];
        let region = self.with_eff_region(desc, at);
        self.ctx.record(s, Engine::Compute, "resolve", |rec| {
            let (scratch, order) =
                Self::scratch_with_batch_order(rec, desc, &mut b, idx_mapping, region)?;
            let push = Self::resolve_push(desc, u32::from(r <= t) | order);
            let sb: Vec<Binding> = regions
                .iter()
                .map(|&(offset, range)| Binding {
                    buffer: scratch,
                    offset,
                    range,
                })
                .collect();
            rec.dispatch(
                Shader::ResolvePrep,
                &[b[0], sb[0], sb[1]],
                &push_prep,
                t.div_ceil(256),
            )?;
            b.extend_from_slice(&sb);
            b.push(idx_mapping);
            rec.dispatch(resolver, &b, &push, t)?;
            match stats {
                Some(st) => Self::record_stats(rec, desc, &b, st),
                None => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_words_cover_every_region_of_the_shader() {
        let desc = ResolveDesc {
            num_tokens: 3,
            top_k: 5,
            num_requests: 2,
            max_pages: 1,
            block_size: 1,
            hot_slots: 33,
            attention_block_stride: 1,
            host_num_blocks: 1,
            num_state_rows: None,
            stats_slot: 0,
        };
        // 7·15 + 4·3 + 2·(66 + 2)
        assert_eq!(resolve_wg_scratch_words(&desc), 105 + 12 + 136);
    }
}
