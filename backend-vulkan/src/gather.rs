//! The swap-in gather (`gather_rows`): a resolver miss plan executed by the gather shader,
//! host pool → device pool, every layer of the call in one dispatch (per window group).

use hisparse_core::ops::{GatherArgs, GatherDesc, PageLayout};

use crate::shaders::Shader;
use crate::vk::Engine;
use crate::windows::PoolPlan;
use crate::{Result, VulkanBuffer, VulkanDevice, VulkanHostBuffer, u32_of};

/// Plan entries one workgroup copies (keep in sync with `ROWS` in `shaders/gather.wgsl`).
const ROWS_PER_GROUP: u32 = 16;

/// Layout words for the gather shader (16-byte units).
fn layout_words(l: &PageLayout) -> Result<[u32; 8]> {
    let stride = if l.num_blocks > 1 {
        u32_of(l.block_stride / 16, "layout.block_stride / 16")?
    } else {
        0
    };
    Ok([
        u32_of(l.base / 16, "layout.base / 16")?,
        stride,
        l.num_blocks,
        l.block_size,
        l.row_bytes / 16,
        l.value_bytes / 16,
        l.index_stride_rows,
        0,
    ])
}

impl VulkanDevice {
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
        let row_chunks = desc.top_k.div_ceil(ROWS_PER_GROUP);
        let groups = u32_of(
            desc.layers.len() as u64 * t * u64::from(row_chunks),
            "gather workgroups (layers × tokens × top_k / 16)",
        )?;
        let mut layer_words = Vec::with_capacity(desc.layers.len() * 16);
        for l in desc.layers {
            layer_words.extend(layout_words(&l.host)?);
            layer_words.extend(layout_words(&l.device)?);
        }
        let host = args.host.raw();
        let dev = args.device.raw();
        let pools = PoolPlan::new(&self.ctx.limits, host.size, dev.size, 4, "gather_rows")?;
        let (shift, mask) = pools.shift_mask();
        let index = [
            self.bind_index(args.plan_src.raw(), 4 * tk, "plan_src")?,
            self.bind_index(args.plan_dst.raw(), 4 * tk, "plan_dst")?,
            self.bind_index(args.plan_counts.raw(), 4 * t, "plan_counts")?,
        ];
        self.ctx.record(s, Engine::Compute, |rec| {
            let layers = rec.params(&layer_words)?;
            for (a, b) in pools.groups() {
                let mut bindings = index.to_vec();
                bindings.push(layers);
                bindings.extend(pools.bindings(host, dev, a, b));
                let push = [
                    desc.num_tokens,
                    desc.top_k,
                    row_chunks,
                    groups,
                    shift,
                    mask,
                    a,
                    b,
                ];
                rec.dispatch(
                    Shader::Gather(pools.windows),
                    &bindings,
                    &push,
                    u64::from(groups),
                )?;
            }
            Ok(())
        })
    }
}
