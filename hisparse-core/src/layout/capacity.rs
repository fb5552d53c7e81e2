//! What a layout holds: GPU blocks per request, requests per context length, and whether one
//! request's prefill fits the GPU pool.

use alloc::vec::Vec;
use core::fmt;

use super::{GpuBlocksPerRequest, KvCacheConfig};

/// Which tier limits concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum CapacityLimit {
    /// The GPU pool: indexer, regular, resident tails and hot regions fill it first.
    Gpu,
    /// The host pool: the full KV of every request must fit in pinned host memory.
    Host,
    /// Keeping every page on the GPU already admits at least as many requests; HiSparse's hot
    /// regions would cost more than the pages they free (short contexts).
    AllOnGpu,
}

/// Max concurrent requests at one context length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CapacityReport {
    /// Context length in tokens.
    pub context_len: u32,
    /// Pages (blocks) per request.
    pub pages_per_request: u64,
    /// Usable GPU blocks (null block excluded).
    pub gpu_blocks: u64,
    /// Usable host blocks (null block and one copy-on-write block excluded).
    pub host_blocks: u64,
    /// GPU blocks per request.
    pub gpu_blocks_per_request: GpuBlocksPerRequest,
    /// Max requests with every page on the GPU.
    pub all_on_gpu_max: u64,
    /// Max requests the GPU pool admits under HiSparse.
    pub hisparse_gpu_max: u64,
    /// Max requests the host pool admits.
    pub host_max: u64,
    /// Max concurrent requests with HiSparse: `max(all_on_gpu_max, min(hisparse_gpu_max,
    /// host_max))`.
    pub hisparse_max: u64,
    /// The tier that limits `hisparse_max`.
    pub limit: CapacityLimit,
    /// GPU blocks one request's exact prefill at this context holds at once
    /// ([`KvCacheConfig::prefill_gpu_blocks`]).
    pub prefill_gpu_blocks: u64,
    /// Whether one request's prefill at this context fits the GPU pool (the coordinator admits
    /// the prompt; otherwise it refuses it with `CoordError::PrefillNeverFits`).
    pub prefill_fits: bool,
}

impl fmt::Display for CapacityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "context {} tokens ({} pages): all-on-GPU {} requests ({} GPU blocks each of {}); HiSparse {} requests (GPU allows {} at {} blocks each, host allows {} at {} blocks each); limited by ",
            self.context_len,
            self.pages_per_request,
            self.all_on_gpu_max,
            self.gpu_blocks_per_request.all_on_gpu,
            self.gpu_blocks,
            self.hisparse_max,
            self.hisparse_gpu_max,
            self.gpu_blocks_per_request.hisparse,
            self.host_max,
            self.pages_per_request,
        )?;
        match self.limit {
            CapacityLimit::Gpu => f.write_str(
                "the GPU pool (indexer, regular pages, resident tails and hot regions); add GPU memory or shrink device_buffer_size",
            ),
            CapacityLimit::Host => f.write_str(
                "the host pool (every request's full KV lives in pinned host memory); raise host_budget_bytes",
            ),
            CapacityLimit::AllOnGpu => f.write_str(
                "nothing HiSparse can improve: at this context every page fits on the GPU, and hot regions would cost more than they free",
            ),
        }?;
        if !self.prefill_fits {
            write!(
                f,
                "; its prefill never fits: it holds the whole context on the GPU ({} blocks of {})",
                self.prefill_gpu_blocks, self.gpu_blocks
            )?;
        }
        Ok(())
    }
}

/// Something a plan allows but a user should know: [`KvCacheConfig::warnings`] (in the layout
/// report, `hisparse layout` and `Layout.to_dict()`). Messages say what to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum LayoutWarning {
    /// The GPU pool holds a `max_model_len` request under HiSparse (its decode fits) but not
    /// its prefill, which reads the whole context on the GPU: the coordinator refuses prompts
    /// longer than `max_prefill_context` (`CoordError::PrefillNeverFits`).
    MaxModelLenPrefillNeverFits {
        /// The layout's longest request, in tokens.
        max_model_len: u32,
        /// GPU blocks its prefill holds at once ([`KvCacheConfig::prefill_gpu_blocks`]).
        needed_blocks: u64,
        /// Usable GPU blocks (null block excluded).
        gpu_blocks: u64,
        /// The longest prompt whose prefill fits ([`KvCacheConfig::max_prefill_context`]).
        max_prefill_context: u32,
        /// Bytes per GPU block.
        bytes_per_block: u64,
    },
}

impl fmt::Display for LayoutWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LayoutWarning::MaxModelLenPrefillNeverFits {
                max_model_len,
                needed_blocks,
                gpu_blocks,
                max_prefill_context,
                bytes_per_block,
            } => write!(
                f,
                "layout: a max_model_len ({max_model_len}-token) prompt cannot be prefilled: exact prefill holds its whole context on the GPU ({needed_blocks} blocks) but the GPU pool has {gpu_blocks}; prompts up to {max_prefill_context} tokens prefill, longer ones are refused (PrefillNeverFits); raise the GPU budget to at least {} B or lower max_model_len to {max_prefill_context}",
                (needed_blocks + 1).saturating_mul(bytes_per_block)
            ),
        }
    }
}

impl KvCacheConfig {
    /// GPU blocks one request needs at `context_len` tokens (saturating, so a hand-edited layout
    /// gives huge counts rather than a panic).
    pub fn gpu_blocks_per_request(&self, context_len: u32) -> GpuBlocksPerRequest {
        let pages = u64::from(self.pages_for(context_len));
        let regular = self.groups[self.regular_groups()]
            .iter()
            .fold(0u64, |acc, g| {
                acc.saturating_add(self.regular_blocks_for(g, context_len))
            });
        GpuBlocksPerRequest::of(
            pages,
            regular,
            self.num_buckets,
            self.hot_blocks_per_request,
        )
    }

    /// GPU blocks exact prefill of a `context_len`-token prompt holds at once: its last chunk
    /// reads every earlier page through the resident table (pages that are not on the GPU are
    /// staged there) and writes its own, so the whole context sits in the indexer, resident and
    /// regular groups together (sliding windows only their window) — the blocks of
    /// [`GpuBlocksPerRequest::all_on_gpu`]. No hot region: once staged nothing it reads is on
    /// host. This is the coordinator's admission rule (`CoordError::PrefillNeverFits` above the
    /// usable pool); [`KvCacheConfig::capacity`] and [`KvCacheConfig::warnings`] report it.
    pub fn prefill_gpu_blocks(&self, context_len: u32) -> u64 {
        self.gpu_blocks_per_request(context_len).all_on_gpu
    }

    /// Whether one request's prefill of a `context_len`-token prompt fits the usable GPU pool
    /// (null block excluded): [`KvCacheConfig::prefill_gpu_blocks`] against it.
    pub fn prefill_fits(&self, context_len: u32) -> bool {
        self.prefill_gpu_blocks(context_len) <= u64::from(self.num_gpu_blocks).saturating_sub(1)
    }

    /// The longest prompt, up to `max_model_len`, whose prefill fits the GPU pool
    /// ([`KvCacheConfig::prefill_fits`]); 0 when not even one token's does.
    pub fn max_prefill_context(&self) -> u32 {
        // `prefill_gpu_blocks` grows with the context: bisect for the last length that fits.
        let (mut lo, mut hi) = (0u32, self.max_model_len);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.prefill_fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// What the plan allows but a user should know (empty for most plans): a `max_model_len`
    /// prompt whose prefill the GPU pool cannot hold
    /// ([`LayoutWarning::MaxModelLenPrefillNeverFits`]).
    pub fn warnings(&self) -> Vec<LayoutWarning> {
        let mut w = Vec::new();
        if !self.prefill_fits(self.max_model_len) {
            w.push(LayoutWarning::MaxModelLenPrefillNeverFits {
                max_model_len: self.max_model_len,
                needed_blocks: self.prefill_gpu_blocks(self.max_model_len),
                gpu_blocks: u64::from(self.num_gpu_blocks).saturating_sub(1),
                max_prefill_context: self.max_prefill_context(),
                bytes_per_block: self.bytes_per_block,
            });
        }
        w
    }

    /// Max concurrent requests at `context_len` tokens, all-on-GPU vs HiSparse, and why.
    pub fn capacity(&self, context_len: u32) -> CapacityReport {
        let pages = u64::from(self.pages_for(context_len)).max(1);
        let per = self.gpu_blocks_per_request(context_len.max(1));
        let gpu_blocks = u64::from(self.num_gpu_blocks).saturating_sub(1);
        let host_blocks = u64::from(self.host_num_blocks).saturating_sub(2);
        let all_on_gpu_max = gpu_blocks / per.all_on_gpu.max(1);
        let hisparse_gpu_max = gpu_blocks / per.hisparse.max(1);
        let host_max = host_blocks / pages;
        let offload = hisparse_gpu_max.min(host_max);
        let (hisparse_max, limit) = if all_on_gpu_max >= offload {
            (all_on_gpu_max, CapacityLimit::AllOnGpu)
        } else if hisparse_gpu_max <= host_max {
            (offload, CapacityLimit::Gpu)
        } else {
            (offload, CapacityLimit::Host)
        };
        CapacityReport {
            context_len,
            pages_per_request: pages,
            gpu_blocks,
            host_blocks,
            gpu_blocks_per_request: per,
            all_on_gpu_max,
            hisparse_gpu_max,
            host_max,
            hisparse_max,
            limit,
            prefill_gpu_blocks: self.prefill_gpu_blocks(context_len.max(1)),
            prefill_fits: self.prefill_fits(context_len.max(1)),
        }
    }
}
