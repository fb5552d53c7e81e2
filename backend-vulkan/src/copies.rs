//! Byte copies: bulk copies, page and row copies between the pools, host copy-on-write, copies
//! inside one device buffer — each planned as a [`CopyPlan`] and run by `vkCmdCopyBuffer` or by
//! the copy shader.
//!
//! Which engine runs a plan ([`CopyEngine::Auto`]): a DMA engine pays a fixed cost per region
//! (on the H200, about 7 µs per 41 KiB page region: a backup of 768 pages ran at 6 GB/s), while
//! the copy shader spreads all regions over the GPU's compute units, as the CUDA backend's copy
//! kernels do. So on GPUs the shader runs device-to-device copies and copies of many small
//! regions across the bus (average region below [`DMA_MIN_REGION`]), and `vkCmdCopyBuffer` runs
//! large contiguous copies across the bus; CPU devices (lavapipe) always use `vkCmdCopyBuffer`
//! (a `memcpy` there). The shader needs 16-byte aligned regions and pools of at most 64 GiB;
//! other plans use `vkCmdCopyBuffer` whatever the choice.

use std::sync::atomic::Ordering;

use hisparse_core::ops::{BlockPair, Direction, PageCopyDesc, PageLayout, RowCopyDesc, RowSpan};

use crate::copy::{CopyPlan, tile_spans, tiles};
use crate::shaders::Shader;
use crate::vk::{Engine, RawBuffer, Span};
use crate::windows::{PoolPlan, SHADER_ADDRESSABLE};
use crate::{Result, VulkanDevice};

/// Average region size from which a copy across the bus uses `vkCmdCopyBuffer` on a GPU.
pub const DMA_MIN_REGION: u64 = 1 << 20;

/// Which engine runs the backend's copies ([`VulkanOptions::copy_engine`](crate::VulkanOptions)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum CopyEngine {
    /// Per plan, as the module docs describe.
    #[default]
    Auto = 0,
    /// Always `vkCmdCopyBuffer`.
    Dma = 1,
    /// The copy shader wherever it can run (16-byte aligned plans), else `vkCmdCopyBuffer`.
    Shader = 2,
}

impl CopyEngine {
    pub(crate) fn from_u8(v: u8) -> CopyEngine {
        match v {
            1 => CopyEngine::Dma,
            2 => CopyEngine::Shader,
            _ => CopyEngine::Auto,
        }
    }
}

/// Byte ranges `(offset, len)` of rows `first..first + n` of `block`: value part, scale part.
fn span_parts(l: &PageLayout, block: u32, first: u32, n: u32) -> [(u64, u64); 2] {
    let [(v, _), (s, _)] = l.row_parts(block, first);
    let vb = u64::from(l.value_bytes);
    let sb = u64::from(l.row_bytes - l.value_bytes);
    [(v, vb * u64::from(n)), (s, sb * u64::from(n))]
}

/// The pool word (bytes) in which a plan runs as the copy shader, or `None` for
/// `vkCmdCopyBuffer`: 16-byte words where the plan is 16-byte aligned, else 4-byte words where it
/// is 4-byte aligned (small unaligned copies, such as the runtime's counters of a few requests,
/// would otherwise each pay a DMA engine's fixed cost).
fn shader_unit(
    engine: CopyEngine,
    gpu: bool,
    plan: &CopyPlan,
    largest_buffer: u64,
    across_bus: bool,
) -> Option<u64> {
    let unit = if plan.aligned(16) && largest_buffer <= SHADER_ADDRESSABLE {
        16
    } else if plan.aligned(4) && largest_buffer <= SHADER_ADDRESSABLE / 4 {
        4
    } else {
        return None;
    };
    let chosen = match engine {
        CopyEngine::Dma => false,
        CopyEngine::Shader => true,
        CopyEngine::Auto => {
            let average = plan.bytes() / plan.regions().max(1) as u64;
            gpu && !(across_bus && average >= DMA_MIN_REGION)
        }
    };
    chosen.then_some(unit)
}

impl VulkanDevice {
    /// The copy engine in use.
    pub fn copy_engine(&self) -> CopyEngine {
        CopyEngine::from_u8(self.copy_engine.load(Ordering::Relaxed))
    }

    /// Chooses the copy engine for later calls (benches compare them; correctness does not
    /// depend on it).
    pub fn set_copy_engine(&self, engine: CopyEngine) {
        self.copy_engine.store(engine as u8, Ordering::Relaxed);
    }

    /// Runs `plan` of operation `op` (named in the profile) from `src` to `dst` (the same
    /// buffer for copies within one) on stream `s`.
    pub(crate) fn run_plan(
        &self,
        s: usize,
        op: &'static str,
        plan: &CopyPlan,
        src: &RawBuffer,
        dst: &RawBuffer,
        across_bus: bool,
    ) -> Result<()> {
        if plan.regions() == 0 {
            return Ok(());
        }
        let limits = &self.ctx.limits;
        let unit = shader_unit(
            self.copy_engine(),
            limits.gpu,
            plan,
            src.size.max(dst.size),
            across_bus,
        );
        let pools = unit.and_then(|u| {
            PoolPlan::new(limits, src.size, dst.size, 1, "copy")
                .ok()
                .map(|p| (p, u))
        });
        let Some((pools, unit)) = pools else {
            return self.ctx.record(s, Engine::Copy, op, |rec| {
                for batch in plan.batches() {
                    rec.copy(src.buffer, dst.buffer, batch);
                }
                Ok(())
            });
        };
        let (shift, mask) = pools.shift_mask_words(unit);
        let groups = pools.groups();
        let shader = if unit == 16 {
            Shader::Copy(pools.windows)
        } else {
            Shader::CopyWords(pools.windows)
        };
        // Tiles per dispatch: one binding of the list, one workgroup each.
        let per_dispatch = ((limits.window / 16) as usize).min(1 << 24);
        let batches: Vec<Vec<[u32; 4]>> =
            plan.batches().into_iter().map(|b| tiles(b, unit)).collect();
        self.ctx.record(s, Engine::Compute, op, |rec| {
            for batch in &batches {
                for chunk in batch.chunks(per_dispatch) {
                    let list = rec.params(chunk)?;
                    // The hazard tracker sees the bytes the tiles really read and write, not the
                    // whole pool windows: copies into disjoint parts of one buffer (the counters
                    // of every index group, row mirrors beside page backups) need no barrier
                    // between them.
                    let [read, written] = tile_spans(chunk, unit, src.buffer, dst.buffer);
                    let access = [Span::of(&list), read];
                    for &(a, b) in &groups {
                        let mut bindings = vec![list];
                        bindings.extend(pools.bindings(src, dst, a, b));
                        let push = [chunk.len() as u32, shift, mask, a, b, 0];
                        rec.dispatch_with_access(
                            shader,
                            &bindings,
                            &push,
                            chunk.len() as u64,
                            (&access, &[written]),
                        )?;
                    }
                }
            }
            Ok(())
        })
    }

    /// One contiguous copy of operation `op` between two buffers (checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bulk_copy(
        &self,
        s: usize,
        op: &'static str,
        src: &RawBuffer,
        src_offset: usize,
        dst: &RawBuffer,
        dst_offset: usize,
        bytes: usize,
        across_bus: bool,
    ) -> Result<()> {
        let mut plan = CopyPlan::new(false);
        plan.push(src_offset as u64, dst_offset as u64, bytes as u64);
        self.run_plan(s, op, &plan, src, dst, across_bus)
    }

    /// A copy between disjoint ranges of one buffer (checked by the caller).
    pub(crate) fn copy_within(
        &self,
        s: usize,
        buf: &RawBuffer,
        src_offset: u64,
        dst_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        let mut plan = CopyPlan::new(true);
        plan.push(src_offset, dst_offset, bytes);
        self.run_plan(s, "copy_within_device", &plan, buf, buf, false)
    }

    /// Whole pages between the pools, every layer of `desc` (checked by the caller).
    pub(crate) fn pages(
        &self,
        s: usize,
        desc: &PageCopyDesc<'_>,
        pairs: &[BlockPair],
        host: &RawBuffer,
        device: &RawBuffer,
    ) -> Result<()> {
        let mut plan = CopyPlan::new(false);
        for l in desc.layers {
            let len = l.host.page_bytes();
            for p in pairs {
                let (from, to) = match desc.direction {
                    Direction::DeviceToHost => {
                        (l.device.page_offset(p.src), l.host.page_offset(p.dst))
                    }
                    Direction::HostToDevice => {
                        (l.host.page_offset(p.src), l.device.page_offset(p.dst))
                    }
                };
                plan.push(from, to, len);
            }
        }
        match desc.direction {
            Direction::DeviceToHost => {
                self.run_plan(s, "copy_pages backup", &plan, device, host, true)
            }
            Direction::HostToDevice => {
                self.run_plan(s, "copy_pages restore", &plan, host, device, true)
            }
        }
    }

    /// Row spans between the pools, every layer of `desc` (checked by the caller).
    pub(crate) fn rows(
        &self,
        s: usize,
        desc: &RowCopyDesc<'_>,
        spans: &[RowSpan],
        host: &RawBuffer,
        device: &RawBuffer,
    ) -> Result<()> {
        let mut plan = CopyPlan::new(false);
        for l in desc.layers {
            for sp in spans {
                let hp = span_parts(&l.host, sp.host_block, sp.first_row, sp.num_rows);
                let dp = span_parts(&l.device, sp.device_block, sp.first_row, sp.num_rows);
                for ((h, len), (d, _)) in hp.into_iter().zip(dp) {
                    match desc.direction {
                        Direction::DeviceToHost => plan.push(d, h, len),
                        Direction::HostToDevice => plan.push(h, d, len),
                    }
                }
            }
        }
        match desc.direction {
            Direction::DeviceToHost => {
                self.run_plan(s, "copy_rows to host", &plan, device, host, true)
            }
            Direction::HostToDevice => {
                self.run_plan(s, "copy_rows to device", &plan, host, device, true)
            }
        }
    }

    /// Host → host page copies, in pair order (checked by the caller).
    pub(crate) fn host_pages(
        &self,
        s: usize,
        layers: &[PageLayout],
        pairs: &[BlockPair],
        host: &RawBuffer,
    ) -> Result<()> {
        let mut plan = CopyPlan::new(true);
        for l in layers {
            for p in pairs {
                plan.push(l.page_offset(p.src), l.page_offset(p.dst), l.page_bytes());
            }
        }
        // Both sides are host memory: the bytes cross the bus twice on a GPU.
        self.run_plan(s, "copy_host_pages", &plan, host, host, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(regions: &[(u64, u64, u64)]) -> CopyPlan {
        let mut p = CopyPlan::new(false);
        for &(s, d, l) in regions {
            p.push(s, d, l);
        }
        p
    }

    #[test]
    fn gpus_copy_small_regions_with_the_shader_and_bulk_across_the_bus_with_dma() {
        let pages = plan(&[(0, 0, 41984), (41984, 1 << 20, 41984)]);
        let bulk = plan(&[(0, 0, 256 << 20)]);
        let odd = plan(&[(4, 0, 64)]);
        let bytes = plan(&[(1, 0, 64)]);
        let a = CopyEngine::Auto;
        let unit = |e, gpu, p: &CopyPlan, largest, bus| shader_unit(e, gpu, p, largest, bus);
        assert_eq!(unit(a, true, &pages, 1 << 30, true), Some(16));
        assert_eq!(unit(a, true, &bulk, 1 << 30, true), None);
        assert_eq!(
            unit(a, true, &bulk, 1 << 30, false),
            Some(16),
            "device-to-device"
        );
        assert_eq!(unit(a, false, &pages, 1 << 30, true), None, "CPU device");
        assert_eq!(
            unit(a, true, &odd, 1 << 30, false),
            Some(4),
            "4-byte aligned"
        );
        assert_eq!(unit(a, true, &bytes, 1 << 30, false), None, "unaligned");
        assert_eq!(unit(a, true, &pages, 80 << 30, true), None, "beyond 64 GiB");
        assert_eq!(unit(a, true, &odd, 20 << 30, true), None, "beyond 16 GiB");
        assert_eq!(
            unit(CopyEngine::Shader, false, &bulk, 1 << 30, true),
            Some(16)
        );
        assert_eq!(unit(CopyEngine::Shader, true, &odd, 1 << 30, true), Some(4));
        assert_eq!(unit(CopyEngine::Dma, true, &pages, 1 << 30, true), None);
    }
}
