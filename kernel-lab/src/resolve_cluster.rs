//! The resolver's decode path spread over a thread-block cluster (`kernels/resolve_cluster.cu`,
//! whose header says why and how): the host side of the experiment. The kernel is compiled after
//! the production source, whose helpers it shares; the emulation test
//! (`tests/cluster_emulation.rs`) checks it bit for bit against the core's reference on the CPU,
//! and `cuda_bench`'s resolve section checks it against `hs_resolve` over the same walk before
//! timing it beside it.

use std::ffi::c_void;

use hisparse_backend_cuda::{CudaDevice, CudaStream};
use hisparse_core::ops::ResolveDesc;
use hisparse_gpu_kernels as gk;

use crate::module::{LabError, LabFunction, LabModule};

/// The kernel's source (after a vendor prelude and [`gk::COMMON_SOURCE`]).
pub const SOURCE: &str = include_str!("../kernels/resolve_cluster.cu");

/// The cluster sizes built (`lab_resolve_c{2,4,8}`).
pub const CLUSTERS: [u32; 3] = [2, 4, 8];

/// Threads of one block of all of a cluster's 1024 (each thread's work as in the production
/// decode path: two entries, four positions and slots).
pub const fn threads(cluster: u32) -> u32 {
    gk::RESOLVE_THREADS / cluster
}

/// The kernel of cluster size `cluster`.
pub fn symbol(cluster: u32) -> String {
    format!("lab_resolve_c{cluster}")
}

/// Whether a launch's shape is the kernel's: one pass of entries and slots over the cluster's
/// `threads × cluster` threads, an even top-k, slots a multiple of four that a `u16` numbers,
/// state-row order. (That each request has one token row is found on the device: `refused`.)
pub fn eligible(d: &ResolveDesc, threads: u32, cluster: u32) -> bool {
    let all = u64::from(threads) * u64::from(cluster);
    cluster.is_power_of_two()
        && (1..=8).contains(&cluster)
        && threads.is_multiple_of(32)
        && d.num_state_rows.is_none()
        && d.top_k > 0
        && d.top_k.is_multiple_of(2)
        && u64::from(d.top_k) <= 2 * all
        && d.hot_slots > 0
        && d.hot_slots.is_multiple_of(4)
        && u64::from(d.hot_slots) <= 4 * all
        && d.hot_slots <= 1 << 16
}

/// Entries of the cluster's wanted-row table for a top-k of `top_k`: the production decode
/// path's quarter-full table ([`gk::resolve_table_goal`] of one row), at least four per block.
pub fn table_entries(top_k: u32, cluster: u32) -> u32 {
    (gk::resolve_table_goal(1, top_k) as u32).max(4 * cluster)
}

/// Bytes of one block's dynamic shared memory (`lab_cluster_shared_bytes` of the kernel, which
/// the emulation test compares with this).
pub fn shared_bytes(threads: u32, table_per_block: u32) -> u32 {
    let align16 = |x: u32| x.div_ceil(16) * 16;
    let np = 4 * threads;
    4 * gk::RESOLVE_HOT_STAGE
        + 2 * align16(2 * np)
        + align16(4 * (np / 32))
        + 4 * align16(4 * table_per_block)
        + 16 * 32
        + 64
        + 32
}

/// Device addresses of one launch's buffers, in the kernel's parameter order: the production
/// resolve's thirteen (`req_id` .. `miss_dst`), then `stats` (0: none) and `refused` (one `u32`
/// the kernel ORs 1 into when it met a request with several rows).
#[derive(Clone, Copy, Debug)]
pub struct ClusterAddrs {
    /// `req_id`, `topk`, `resident_table`, `host_table`, `hot_table`, `slot_host_rows`, `lru`,
    /// `indices`, `valid_counts`, `hit_counts`, `miss_counts`, `miss_src`, `miss_dst`.
    pub buffers: [u64; 13],
    /// The stats slot's four words, or 0.
    pub stats: u64,
    /// The refusal word.
    pub refused: u64,
}

/// The cluster kernels loaded for one device (sm_90 or later).
pub struct ClusterResolver {
    module: LabModule,
    functions: Vec<(u32, LabFunction)>,
}

impl ClusterResolver {
    /// Compiles (NVRTC, `compute_{major}{minor}` of `dev`) and loads the kernels; a device
    /// before sm_90 has no clusters and is refused.
    pub fn load(dev: &CudaDevice, ordinal: usize) -> Result<ClusterResolver, LabError> {
        let (major, minor) = dev.compute_capability();
        if major < 9 {
            return Err(LabError(format!(
                "thread-block clusters need sm_90 or later; this device is sm_{major}{minor}"
            )));
        }
        let source = format!("{}{}", gk::CUDA_SOURCE, SOURCE);
        let ptx = crate::module::compile(
            &source,
            "resolve_cluster.cu",
            &format!("compute_{major}{minor}"),
        )?;
        let module = LabModule::load(dev, ordinal, &ptx)?;
        let mut functions = Vec::new();
        for c in CLUSTERS {
            let f = module.function(&symbol(c))?;
            let most = shared_bytes(threads(c), table_entries(2 * gk::RESOLVE_THREADS, c) / c);
            module.allow_dynamic_shared(f, most)?;
            functions.push((c, f));
        }
        Ok(ClusterResolver { module, functions })
    }

    /// Enqueues the resolve of `d` on `stream` in clusters of `cluster` blocks.
    ///
    /// # Safety
    /// Every address of `a` is a live device buffer of the size the production resolve of `d`
    /// needs (`stats`: four words or 0; `refused`: one word), alive until the launch completed.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        d: &ResolveDesc,
        cluster: u32,
        a: &ClusterAddrs,
    ) -> Result<(), LabError> {
        let threads = threads(cluster);
        if !eligible(d, threads, cluster) {
            return Err(LabError(format!(
                "the cluster resolver does not take this launch ({} × top-k {}, {} slots, clusters of {cluster})",
                d.num_tokens, d.top_k, d.hot_slots
            )));
        }
        let f = self
            .functions
            .iter()
            .find(|(c, _)| *c == cluster)
            .map(|(_, f)| *f)
            .ok_or_else(|| LabError(format!("no kernel for clusters of {cluster}")))?;
        if d.num_tokens == 0 {
            return Ok(());
        }
        let table = table_entries(d.top_k, cluster);
        let shared = shared_bytes(threads, table / cluster);
        let mut ptrs = a.buffers;
        let mut words = [
            table,
            d.num_tokens,
            d.top_k,
            d.num_requests,
            d.max_pages,
            d.block_size,
            d.hot_slots,
            d.attention_block_stride,
            d.host_num_blocks,
        ];
        let (mut stats, mut refused) = (a.stats, a.refused);
        let mut params: Vec<*mut c_void> = Vec::with_capacity(24);
        for p in ptrs.iter_mut() {
            params.push((p as *mut u64).cast());
        }
        for w in words.iter_mut() {
            params.push((w as *mut u32).cast());
        }
        params.push((&raw mut stats).cast());
        params.push((&raw mut refused).cast());
        let grid = d
            .num_tokens
            .checked_mul(cluster)
            .ok_or_else(|| LabError("grid".into()))?;
        // SAFETY: `params` holds one pointer per parameter of `lab_resolve_c{cluster}` in its
        // order (thirteen pointers, nine u32, two pointers), each alive for the call; the
        // buffers per the caller's contract.
        unsafe {
            self.module
                .launch(f, grid, threads, shared, stream, &mut params)
        }
    }
}
