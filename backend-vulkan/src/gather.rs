//! The swap-in gather (`gather_rows`): a resolver miss plan executed by a gather shader, host
//! pool → device pool, every layer of the call in one dispatch (per window group).
//!
//! Two kernels ([`GatherKernel`]): the pipelined one (`shaders/gather.wgsl`) spreads the 16-byte
//! words of 16 plan entries over a workgroup with eight loads in flight per invocation, as the
//! CUDA kernel does; the per-entry one (`shaders/gather_per_entry.wgsl`) gives each entry 32
//! lanes. On GPUs the pipelined kernel keeps more bytes in flight across the bus; on CPU
//! implementations (lavapipe) the per-entry kernel is several times faster, because the
//! pipelined kernel's per-word division is scalarised there. Split rows whose scale part is not a
//! multiple of 16 bytes (DeepSeek V4's 576 + 8-byte rows, its indexer's 128 + 4) run the
//! per-entry kernel over 4-byte pool words (`gather_per_entry_words`), whatever the choice.

use std::sync::atomic::Ordering;

use hisparse_core::ops::{
    GatherArgs, GatherDesc, IndexerBackupArgs, IndexerBackupDesc, PageLayout,
};

use crate::shaders::Shader;
use crate::vk::Engine;
use crate::windows::PoolPlan;
use crate::{Result, VulkanBuffer, VulkanDevice, VulkanError, VulkanHostBuffer, u32_of};

/// Which shader runs `gather_rows` (both give identical results;
/// [`VulkanOptions::gather_kernel`](crate::VulkanOptions)).
// Accepted twin of copies.rs's CopyEngine (CONTRIBUTING.md, "One rule, one place"):
// an option enum and its stored byte, named values of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum GatherKernel {
    /// `Pipelined` on GPUs, `PerEntry` on CPU devices.
    #[default]
    Auto = 0,
    /// `shaders/gather_per_entry.wgsl`: 32 lanes copy one plan entry.
    PerEntry = 1,
    /// `shaders/gather.wgsl`: 16 plan entries per workgroup, eight loads in flight per
    /// invocation.
    Pipelined = 2,
}

impl GatherKernel {
    pub(crate) fn from_u8(v: u8) -> GatherKernel {
        match v {
            1 => GatherKernel::PerEntry,
            2 => GatherKernel::Pipelined,
            _ => GatherKernel::Auto,
        }
    }
}

/// Plan entries one workgroup copies (keep in sync with `ROWS` in `shaders/gather.wgsl`).
const ROWS_PER_GROUP: u32 = 16;

/// Layout words for the gather shader, sizes in pool words of `unit` bytes (16, or 4 for split
/// rows whose scale part is not a multiple of 16).
fn layout_words(l: &PageLayout, unit: u64) -> Result<[u32; 8]> {
    let stride = if l.num_blocks > 1 {
        u32_of(l.block_stride / unit, "layout.block_stride in pool words")?
    } else {
        0
    };
    let unit32 = unit as u32;
    Ok([
        u32_of(l.base / unit, "layout.base in pool words")?,
        stride,
        l.num_blocks,
        l.block_size,
        l.row_bytes / unit32,
        l.value_bytes / unit32,
        l.index_stride_rows,
        0,
    ])
}

/// Whether a layout's rows need 4-byte pool words: split rows whose scale part is not a multiple
/// of 16 bytes (values are always a multiple of 16).
fn needs_words(l: &PageLayout) -> bool {
    !(l.row_bytes - l.value_bytes).is_multiple_of(16)
}

impl VulkanDevice {
    /// The gather kernel in use.
    pub fn gather_kernel(&self) -> GatherKernel {
        GatherKernel::from_u8(self.gather_kernel.load(Ordering::Relaxed))
    }

    /// Chooses the gather kernel for later calls (benches compare them; results are identical).
    pub fn set_gather_kernel(&self, kernel: GatherKernel) {
        self.gather_kernel.store(kernel as u8, Ordering::Relaxed);
    }

    /// Runs a checked gather on stream `s`.
    pub(crate) fn gather(
        &self,
        s: usize,
        desc: &GatherDesc<'_>,
        args: GatherArgs<'_, VulkanBuffer, VulkanHostBuffer>,
    ) -> Result<()> {
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        if tk == 0 || desc.layers.is_empty() {
            return Ok(());
        }
        // 4-byte words for rows with 4-byte scale parts (on the per-entry kernel), else 16-byte words.
        let words = desc
            .layers
            .iter()
            .any(|l| needs_words(&l.host) || needs_words(&l.device));
        let unit: u64 = if words { 4 } else { 16 };
        let pipelined = !words
            && match self.gather_kernel() {
                GatherKernel::Auto => self.ctx.limits.gpu,
                k => k == GatherKernel::Pipelined,
            };
        let row_chunks = desc.top_k.div_ceil(ROWS_PER_GROUP);
        // Pipelined: one workgroup per (layer, token, 16 entries); per entry: four entries per
        // workgroup.
        let (work, groups) = if pipelined {
            let g = u32_of(
                desc.layers.len() as u64 * t * u64::from(row_chunks),
                "gather workgroups (layers × tokens × top_k / 16)",
            )?;
            (g, u64::from(g))
        } else {
            let items = u32_of(
                desc.layers.len() as u64 * tk,
                "gather work items (layers × tokens × top_k)",
            )?;
            (items, u64::from(items).div_ceil(4))
        };
        let mut layer_words = Vec::with_capacity(desc.layers.len() * 16);
        for l in desc.layers {
            layer_words.extend(layout_words(&l.host, unit)?);
            layer_words.extend(layout_words(&l.device, unit)?);
        }
        let host = args.host.raw();
        let dev = args.device.raw();
        let largest = host.size.max(dev.size);
        if words && largest > unit << 32 {
            return Err(VulkanError::Unsupported(format!(
                "gather_rows: rows with a scale part that is not a multiple of 16 bytes are \
                 addressed in 32-bit counts of 4-byte words, so pools of at most 16 GiB; this \
                 pool has {largest} bytes (for `hisparse simulate`: a smaller --gpu-mem or \
                 --host-mem)"
            )));
        }
        let pools = PoolPlan::new(&self.ctx.limits, host.size, dev.size, 4, "gather_rows")?;
        let (shift, mask) = pools.shift_mask_words(unit);
        let index = [
            self.bind_index(args.plan_src.raw(), 4 * tk, "plan_src")?,
            self.bind_index(args.plan_dst.raw(), 4 * tk, "plan_dst")?,
            self.bind_index(args.plan_counts.raw(), 4 * t, "plan_counts")?,
        ];
        self.ctx.record(s, Engine::Compute, "gather_rows", |rec| {
            let layers = rec.params(&layer_words)?;
            for (a, b) in pools.groups() {
                let mut bindings = index.to_vec();
                bindings.push(layers);
                bindings.extend(pools.bindings(host, dev, a, b));
                let push = [
                    desc.num_tokens,
                    desc.top_k,
                    row_chunks,
                    work,
                    shift,
                    mask,
                    a,
                    b,
                ];
                let shader = if words {
                    Shader::GatherPerEntryWords(pools.windows)
                } else if pipelined {
                    Shader::Gather(pools.windows)
                } else {
                    Shader::GatherPerEntry(pools.windows)
                };
                rec.dispatch(shader, &bindings, &push, groups)?;
            }
            Ok(())
        })
    }
}

impl VulkanDevice {
    /// A checked indexer backup on stream `s` (`shaders/indexer_backup.wgsl`): every layer and
    /// token in one dispatch per window group, rows in 4-byte pool words (indexer rows have no
    /// 16-byte rule), 32 lanes per row.
    pub(crate) fn indexer_rows(
        &self,
        s: usize,
        desc: &IndexerBackupDesc<'_>,
        args: IndexerBackupArgs<'_, VulkanBuffer, VulkanHostBuffer>,
    ) -> Result<()> {
        let t = u64::from(desc.num_tokens);
        if t == 0 || desc.layers.is_empty() {
            return Ok(());
        }
        let items = u32_of(
            desc.layers.len() as u64 * t,
            "indexer_backup work items (layers × tokens)",
        )?;
        let mut layer_words = Vec::with_capacity(desc.layers.len() * 16);
        for l in desc.layers {
            layer_words.extend(layout_words(&l.host, 4)?);
            layer_words.extend(layout_words(&l.device, 4)?);
        }
        let (dev, host) = (args.device.raw(), args.host.raw());
        let largest = host.size.max(dev.size);
        if largest > 4 << 32 {
            return Err(VulkanError::Unsupported(format!(
                "indexer_backup: rows are addressed in 32-bit counts of 4-byte words, so pools of \
                 at most 16 GiB; this pool has {largest} bytes (split the indexer host cache)"
            )));
        }
        let pools = PoolPlan::new(&self.ctx.limits, dev.size, host.size, 3, "indexer_backup")?;
        let (shift, mask) = pools.shift_mask_words(4);
        let slots = [
            self.bind_index(args.device_slots.raw(), 4 * t, "device_slots")?,
            self.bind_index(args.host_slots.raw(), 4 * t, "host_slots")?,
        ];
        self.ctx
            .record(s, Engine::Compute, "indexer_backup", |rec| {
                let layers = rec.params(&layer_words)?;
                for (a, b) in pools.groups() {
                    let mut bindings = slots.to_vec();
                    bindings.push(layers);
                    // Pool A (read) is the device pool, pool B (written) the host cache.
                    bindings.extend(pools.bindings(dev, host, a, b));
                    let push = [desc.num_tokens, items, shift, mask, a, b];
                    rec.dispatch(
                        Shader::IndexerBackup(pools.windows),
                        &bindings,
                        &push,
                        u64::from(items).div_ceil(4),
                    )?;
                }
                Ok(())
            })
    }
}
