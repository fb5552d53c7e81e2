//! The resolver's decode path spread over a thread-block cluster, or packed two requests to a
//! multiprocessor (`kernels/resolve_cluster.cu`, whose header says why and how): the host side
//! of the experiment. The kernel is compiled after
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

/// One kernel of the experiment: `cluster` blocks of `threads` threads a request, each thread
/// owning `entries` top-k entries and `slots` LRU positions and slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// The kernel's symbol.
    pub symbol: &'static str,
    /// Blocks of a request's cluster (1: no cluster).
    pub cluster: u32,
    /// Threads of one block.
    pub threads: u32,
    /// Top-k entries of one thread.
    pub entries: u32,
    /// LRU positions (and slots) of one thread.
    pub slots: u32,
    /// The wanted-row table at 2^table_shift times the production decode path's (a quarter-full
    /// table for one row), never below twice the top-k: larger for a cluster (the shared memory
    /// of several multiprocessors, and a probe that leaves the block crosses the cluster),
    /// smaller for two blocks a multiprocessor (both blocks' shared memory in one).
    pub table_shift: i32,
}

impl Variant {
    /// How the bench and the reports name it.
    pub fn label(&self) -> String {
        let table = match self.table_shift {
            0 => String::new(),
            s if s > 0 => format!(", table x{}", 1u32 << s),
            s => format!(", table /{}", 1u32 << -s),
        };
        if self.cluster == 1 {
            format!(
                "lab: one block of {} threads, {} entries a thread{table}",
                self.threads, self.entries
            )
        } else {
            format!(
                "lab: clusters of {} x {} threads{table}",
                self.cluster, self.threads
            )
        }
    }

    /// Entries of the wanted-row table for a top-k of `top_k`: the production decode path's
    /// quarter-full table ([`gk::resolve_table_goal`] of one row) scaled by `table_shift`, at
    /// least twice the top-k and four per block.
    pub fn table_entries(&self, top_k: u32) -> u32 {
        let goal = gk::resolve_table_goal(1, top_k) as u32;
        let scaled = if self.table_shift >= 0 {
            goal << self.table_shift
        } else {
            goal >> -self.table_shift
        };
        scaled
            .max((2 * top_k).next_power_of_two())
            .max(4 * self.cluster)
    }

    /// Bytes of one block's dynamic shared memory for a top-k of `top_k`
    /// (`lab_cluster_shared_bytes` of the kernel, which the emulation test compares with this).
    pub fn shared_bytes(&self, top_k: u32) -> u32 {
        let align16 = |x: u32| x.div_ceil(16) * 16;
        let np = self.slots * self.threads;
        let per_block = self.table_entries(top_k) / self.cluster;
        4 * gk::RESOLVE_HOT_STAGE
            + 2 * align16(2 * np)
            + align16(4 * (np / 32))
            + 4 * align16(4 * per_block)
            + 16 * 32
            + 64
            + 32
    }

    /// Whether a launch's shape is the kernel's: one pass of entries and slots over its
    /// threads, an even top-k, slots a multiple of four that a `u16` numbers, state-row order.
    /// (Rows that are not decode requests are found on the device and handed to the general
    /// body: `fallbacks`.)
    pub fn eligible(&self, d: &ResolveDesc) -> bool {
        let all = u64::from(self.threads) * u64::from(self.cluster);
        d.num_state_rows.is_none()
            && d.top_k > 0
            && d.top_k.is_multiple_of(2)
            && u64::from(d.top_k) <= u64::from(self.entries) * all
            && d.hot_slots > 0
            && d.hot_slots.is_multiple_of(4)
            && u64::from(d.hot_slots) <= u64::from(self.slots) * all
            && d.hot_slots <= 1 << 16
    }
}

/// The variants measured: clusters of 2, 4 and 8 blocks sharing a request's 1024 threads (the
/// production decode path's work per thread; clusters of 4 also with a table twice as large),
/// and one 512-thread block a request with twice that work per thread and half the table (two
/// requests a multiprocessor: 87 KB of shared memory each at top-k 2048).
pub const VARIANTS: [Variant; 5] = [
    Variant {
        symbol: "lab_resolve_c2",
        cluster: 2,
        threads: 512,
        entries: 2,
        slots: 4,
        table_shift: 0,
    },
    Variant {
        symbol: "lab_resolve_c4",
        cluster: 4,
        threads: 256,
        entries: 2,
        slots: 4,
        table_shift: 0,
    },
    Variant {
        symbol: "lab_resolve_c8",
        cluster: 8,
        threads: 128,
        entries: 2,
        slots: 4,
        table_shift: 0,
    },
    Variant {
        symbol: "lab_resolve_w512",
        cluster: 1,
        threads: 512,
        entries: 4,
        slots: 8,
        table_shift: -1,
    },
    Variant {
        symbol: "lab_resolve_c4",
        cluster: 4,
        threads: 256,
        entries: 2,
        slots: 4,
        table_shift: 1,
    },
];

/// Device addresses of one launch's buffers, in the kernel's parameter order: the production
/// resolve's thirteen (`req_id` .. `miss_dst`), the workspace its fallback takes (the general
/// body in global-state mode: [`workspace_entries`] 16-byte entries, and four counter words
/// that are zero before the first launch and that every launch leaves zero), then `stats` (0:
/// none) and `fallbacks` (one `u32` the kernel adds each row it handed to the body to).
#[derive(Clone, Copy, Debug)]
pub struct ClusterAddrs {
    /// `req_id`, `topk`, `resident_table`, `host_table`, `hot_table`, `slot_host_rows`, `lru`,
    /// `indices`, `valid_counts`, `hit_counts`, `miss_counts`, `miss_src`, `miss_dst`.
    pub buffers: [u64; 13],
    /// The workspace (16-byte entries).
    pub workspace: u64,
    /// Its four counter words.
    pub workspace_counter: u64,
    /// The stats slot's four words, or 0.
    pub stats: u64,
    /// The fallback counter.
    pub fallbacks: u64,
}

/// Workspace entries a launch of `d` needs for rows the kernel hands to the general body: its
/// global-state mode with every table in the workspace.
pub fn workspace_entries(d: &ResolveDesc) -> u64 {
    gk::resolve_global_workspace_entries(d.num_tokens, d.top_k, d.num_requests, d.hot_slots, true)
}

/// The experiment's kernels loaded for one device (sm_90 or later).
pub struct ClusterResolver {
    module: LabModule,
    functions: Vec<(Variant, LabFunction)>,
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
        for v in VARIANTS {
            let f = module.function(v.symbol)?;
            // The largest top-k any variant of this kernel takes sizes its largest table.
            let most = VARIANTS
                .iter()
                .filter(|x| x.symbol == v.symbol)
                .map(|x| x.shared_bytes(x.entries * x.threads * x.cluster))
                .max()
                .unwrap_or(0);
            module.allow_dynamic_shared(f, most)?;
            functions.push((v, f));
        }
        Ok(ClusterResolver { module, functions })
    }

    /// Enqueues the resolve of `d` on `stream` by kernel `v`.
    ///
    /// # Safety
    /// Every address of `a` is a live device buffer of the size the production resolve of `d`
    /// needs (the workspace: [`workspace_entries`] of `d`, its counters four zero words;
    /// `stats`: four words or 0; `fallbacks`: one word), alive until the launch completed.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        d: &ResolveDesc,
        v: &Variant,
        a: &ClusterAddrs,
    ) -> Result<(), LabError> {
        if !v.eligible(d) {
            return Err(LabError(format!(
                "{} does not take this launch ({} × top-k {}, {} slots)",
                v.symbol, d.num_tokens, d.top_k, d.hot_slots
            )));
        }
        let f = self
            .functions
            .iter()
            .find(|(x, _)| x == v)
            .map(|(_, f)| *f)
            .ok_or_else(|| LabError(format!("{} is not loaded", v.symbol)))?;
        if d.num_tokens == 0 {
            return Ok(());
        }
        let mut ptrs = a.buffers;
        let (mut workspace, mut counter) = (a.workspace, a.workspace_counter);
        let mut entries = u32::try_from(workspace_entries(d))
            .map_err(|_| LabError("the fallback's workspace exceeds 2^32 entries".into()))?;
        let mut words = [
            v.table_entries(d.top_k),
            d.num_tokens,
            d.top_k,
            d.num_requests,
            d.max_pages,
            d.block_size,
            d.hot_slots,
            d.attention_block_stride,
            d.host_num_blocks,
        ];
        let (mut stats, mut fallbacks) = (a.stats, a.fallbacks);
        let mut params: Vec<*mut c_void> = Vec::with_capacity(27);
        for p in ptrs.iter_mut() {
            params.push((p as *mut u64).cast());
        }
        params.push((&raw mut workspace).cast());
        params.push((&raw mut counter).cast());
        params.push((&raw mut entries).cast());
        for w in words.iter_mut() {
            params.push((w as *mut u32).cast());
        }
        params.push((&raw mut stats).cast());
        params.push((&raw mut fallbacks).cast());
        let grid = d
            .num_tokens
            .checked_mul(v.cluster)
            .ok_or_else(|| LabError("grid".into()))?;
        let shared = v.shared_bytes(d.top_k);
        // SAFETY: `params` holds one pointer per parameter of the variant's kernel in its order
        // (fifteen pointers, ten u32, two pointers), each alive for the call; the buffers per the
        // caller's contract.
        unsafe {
            self.module
                .launch(f, grid, v.threads, shared, stream, &mut params)
        }
    }
}
