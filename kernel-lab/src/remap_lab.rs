//! Remap experiments on CUDA (`kernels/remap_lab.cu`): decode-size remaps stripped to one
//! geometry (a power-of-two block size, state-row order), timed by `cuda_bench` beside the
//! production `hs_remap` / `hs_remap_wide` on the same inputs, to show what the production
//! kernels' dependent chain pays for (the read-only load path, the stats, the counting sum).
//! Never part of a published crate.

use std::ffi::c_void;

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaStream};

use crate::module::{LabError, LabFunction, LabModule};

/// The experiments' source.
pub const SOURCE: &str = include_str!("../kernels/remap_lab.cu");

/// Compiles [`SOURCE`] for the virtual architecture `arch` (e.g. `compute_90`) and returns the
/// PTX. Needs NVRTC, not a GPU.
pub fn compile(arch: &str) -> Result<String, LabError> {
    crate::module::compile(SOURCE, "remap_lab.cu", arch)
}

/// The plain kernels (one entry a thread, grid `(top_k / 128, rows)` of 128 threads).
pub const WIDE: [&str; 5] = [
    "lab_wide_nc",
    "lab_wide_ld",
    "lab_wide_nc_stats_block",
    "lab_wide_ld_stats_block",
    "lab_wide_ld_stats_warp",
];

/// The counting kernels (one block a row) and the 16-byte vectors each thread takes.
pub const COUNTS: [(&str, u32); 3] = [
    ("lab_counts_nc_v1", 1),
    ("lab_counts_ld_v1", 1),
    ("lab_counts_ld_v2", 2),
];

/// Threads per block of the plain kernels.
pub const WIDE_THREADS: u32 = 128;

/// The buffers and sizes of one remap (state-row order, no idx_mapping).
pub struct LabRemap<'a> {
    /// `i32[rows]`.
    pub req_id: &'a CudaBuffer,
    /// `i32[table_rows][max_blocks]`.
    pub table: &'a CudaBuffer,
    /// `i32[rows][top_k]`.
    pub topk: &'a CudaBuffer,
    /// Token rows.
    pub rows: u32,
    /// Entries a row (a multiple of 128 and of 16 for the counting kernels).
    pub top_k: u32,
    /// Rows of the table.
    pub table_rows: u32,
    /// Columns of the table.
    pub max_blocks: u32,
    /// log2 of the block size.
    pub shift: u32,
    /// Physical rows between blocks.
    pub stride: u32,
}

impl LabRemap<'_> {
    /// The sizes every lab kernel takes after its buffers, in their parameter order.
    fn sizes(&self) -> [u32; 5] {
        [
            self.top_k,
            self.table_rows,
            self.max_blocks,
            self.shift,
            self.stride,
        ]
    }
}

/// A launch's parameter pointers: the device addresses `addrs`, then the sizes `sizes` (every
/// lab kernel's order). The pointers are valid while both arrays are.
fn param_ptrs(addrs: &mut [u64], sizes: &mut [u32]) -> Vec<*mut c_void> {
    let mut params: Vec<*mut c_void> = addrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
    params.extend(sizes.iter_mut().map(|p| (p as *mut u32).cast::<c_void>()));
    params
}

/// The experiments loaded into the primary context of one device.
pub struct RemapLab {
    module: LabModule,
}

impl RemapLab {
    /// Compiles and loads the experiments for `dev`, CUDA device `ordinal`.
    pub fn load(dev: &CudaDevice, ordinal: usize) -> Result<RemapLab, LabError> {
        let (major, minor) = dev.compute_capability();
        let ptx = compile(&format!("compute_{major}{minor}"))?;
        Ok(RemapLab {
            module: LabModule::load(dev, ordinal, &ptx)?,
        })
    }

    fn function(&self, name: &str) -> Result<LabFunction, LabError> {
        self.module.function(name)
    }

    /// Enqueues plain kernel `name` (one of [`WIDE`]) on `stream`; `stats` (two `u32`) or none.
    pub fn launch_wide(
        &self,
        name: &str,
        r: &LabRemap<'_>,
        out: &mut CudaBuffer,
        stats: Option<&mut CudaBuffer>,
        stream: &CudaStream,
    ) -> Result<(), LabError> {
        let f = self.function(name)?;
        let mut a = [
            r.req_id.device_address(),
            r.table.device_address(),
            r.topk.device_address(),
            out.device_address(),
            stats.map_or(0, |s| s.device_address()),
        ];
        let mut s = r.sizes();
        let mut params = param_ptrs(&mut a, &mut s);
        let grid = (r.top_k.div_ceil(WIDE_THREADS), r.rows);
        // SAFETY: `params` holds one pointer per parameter of the lab_wide_* kernels, in order
        // (five device addresses, five u32), each alive for the call; the buffers are the
        // caller's, alive until the stream's work completed (the bench synchronizes or keeps
        // them for the graph's life).
        unsafe {
            self.module
                .launch_2d(f, grid, WIDE_THREADS, 0, stream, &mut params)
        }
    }

    /// Enqueues counting kernel `name` (one of [`COUNTS`], taking `vectors` 16-byte vectors a
    /// thread) on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_counts(
        &self,
        name: &str,
        vectors: u32,
        r: &LabRemap<'_>,
        out: &mut CudaBuffer,
        counts: &mut CudaBuffer,
        stats: Option<&mut CudaBuffer>,
        stream: &CudaStream,
    ) -> Result<(), LabError> {
        let f = self.function(name)?;
        let mut a = [
            r.req_id.device_address(),
            r.table.device_address(),
            r.topk.device_address(),
            out.device_address(),
            counts.device_address(),
            stats.map_or(0, |s| s.device_address()),
        ];
        let mut s = r.sizes();
        let mut params = param_ptrs(&mut a, &mut s);
        let threads = r.top_k / (4 * vectors);
        // SAFETY: as `launch_wide`, for the lab_counts_* parameter list (six device addresses,
        // five u32).
        unsafe {
            self.module
                .launch(f, r.rows, threads, 0, stream, &mut params)
        }
    }
}
