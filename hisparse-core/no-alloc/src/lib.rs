//! Planning and allocating with no allocator, as a runtime without a heap (firmware, a DPU)
//! does with `hisparse-core` built `--no-default-features`: a DeepSeek V3.2 layout planned into
//! fixed arrays, a GPU block pool of fixed capacity, and one request's resident pages allocated
//! from it. A crate of its own (no dev-dependencies, which need `std`) and a library (no entry
//! point to write for a bare-metal target): CI builds it for `thumbv7em-none-eabihf`, where
//! `hisparse-core` builds without `alloc`, and its tests run it on the host.

#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

use hisparse_core::config::HiSparseConfig;
use hisparse_core::layout::{GroupKind, LayoutError, LayoutInput, plan_layout_fixed};
use hisparse_core::pool::{FixedBlockPool, PoolError, key_slots};
use hisparse_core::presets::DEEPSEEK_V32;

/// GPU blocks the device pool has room for (null block included).
pub const GPU_BLOCKS: usize = 512;

/// The GPU block pool: about 35 KiB of bookkeeping for [`GPU_BLOCKS`] blocks.
pub type GpuPool = FixedBlockPool<GPU_BLOCKS, { key_slots(GPU_BLOCKS) }>;

/// Longest request, in tokens.
pub const MAX_MODEL_LEN: u32 = 4096;

/// Why planning or allocating failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The layout could not be planned.
    Layout(LayoutError),
    /// The pool refused.
    Pool(PoolError),
}

/// What [`plan_and_admit`] planned and allocated.
#[derive(Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Bytes of one GPU block.
    pub bytes_per_block: u64,
    /// Resident groups (one per bucket).
    pub resident_groups: usize,
    /// GPU blocks left free once the request's pages are allocated.
    pub free_blocks: u32,
}

/// Plans DeepSeek V3.2 for [`MAX_MODEL_LEN`]-token requests on a GPU pool of [`GPU_BLOCKS`]
/// blocks and allocates `pages.len()` pages of one request in every resident group; `pages`
/// receives the last group's block ids.
pub fn plan_and_admit(pages: &mut [u32]) -> Result<Admitted, Refused> {
    let model = DEEPSEEK_V32;
    let config = HiSparseConfig::new(model.top_k, 1 << 30);
    let mut input = LayoutInput::new(&model, &config, 0, MAX_MODEL_LEN);
    input.num_gpu_blocks_override = Some(GPU_BLOCKS as u32);
    let layout = plan_layout_fixed::<16, 256>(&input).map_err(Refused::Layout)?;
    let mut pool = GpuPool::new(layout.sizes.num_gpu_blocks).map_err(Refused::Pool)?;
    let resident = layout
        .groups()
        .iter()
        .filter(|g| g.kind == GroupKind::Resident);
    let mut resident_groups = 0;
    for _ in resident {
        pool.allocate_into(pages).map_err(Refused::Pool)?;
        resident_groups += 1;
    }
    Ok(Admitted {
        bytes_per_block: layout.sizes.bytes_per_block,
        resident_groups,
        free_blocks: pool.num_free(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_allocates_without_an_allocator() {
        let mut pages = [0u32; 64];
        let admitted = plan_and_admit(&mut pages).unwrap();
        assert_eq!(
            admitted,
            Admitted {
                bytes_per_block: 545792,
                resident_groups: 6,
                free_blocks: GPU_BLOCKS as u32 - 1 - 6 * 64,
            }
        );
        // The last resident group's pages: the blocks after the first five groups', in order.
        assert!(pages.iter().copied().eq(5 * 64 + 1..6 * 64 + 1));
    }

    #[test]
    fn a_request_larger_than_the_pool_is_refused() {
        let mut pages = [0u32; 100];
        assert_eq!(
            plan_and_admit(&mut pages),
            Err(Refused::Pool(PoolError::OutOfBlocks {
                requested: 100,
                free: GPU_BLOCKS as u32 - 1 - 5 * 100,
            }))
        );
    }
}
