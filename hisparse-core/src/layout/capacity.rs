//! What a layout holds: GPU blocks per request and requests per context length.

use core::fmt;

use super::{ACTIVE_TAIL_PAGES, KvCacheConfig};

/// GPU blocks one request needs at a context length, per strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GpuBlocksPerRequest {
    /// Everything on the GPU: indexer + resident + regular pages.
    pub all_on_gpu: u64,
    /// HiSparse: indexer + regular pages, the `ACTIVE_TAIL_PAGES` resident tail per bucket, and a
    /// hot region per bucket.
    pub hisparse: u64,
}

impl GpuBlocksPerRequest {
    /// The cheaper of the two (a request whose pages all fit stays fully resident).
    pub fn min_needed(&self) -> u64 {
        self.all_on_gpu.min(self.hisparse)
    }
}

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
        let b = u64::from(self.num_buckets);
        let base = pages.saturating_add(regular);
        GpuBlocksPerRequest {
            all_on_gpu: base.saturating_add(b.saturating_mul(pages)),
            hisparse: base
                .saturating_add(b.saturating_mul(pages.min(u64::from(ACTIVE_TAIL_PAGES))))
                .saturating_add(b.saturating_mul(u64::from(self.hot_blocks_per_request))),
        }
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
        }
    }
}
