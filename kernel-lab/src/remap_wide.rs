//! The plain remap with one top-k entry per thread (`kernels/remap_wide.cu`, whose header says
//! why): the host side of the experiment. The emulation test (`tests/emulation.rs`) checks it bit
//! for bit against the core's reference on the CPU, and `cuda_bench`'s remap section checks it
//! against the reference before timing it beside `hs_remap`.

use std::ffi::c_void;

use hisparse_backend_cuda::{CudaDevice, CudaStream};
use hisparse_core::ops::RemapDesc;
use hisparse_gpu_kernels as gk;

use crate::module::{LabError, LabFunction, LabModule};

/// The kernel's source (after a vendor prelude and [`gk::COMMON_SOURCE`]).
pub const SOURCE: &str = include_str!("../kernels/remap_wide.cu");

/// The kernel's symbol.
pub const SYMBOL: &str = "lab_remap_wide";

/// Block sizes measured: 128 threads (vLLM's programs of 4 warps) and 64.
pub const THREADS: [u32; 2] = [128, 64];

/// Whether the kernel takes the remap `d`: plain rows (no idx_mapping, counts or compaction).
pub fn eligible(d: &RemapDesc) -> bool {
    d.idx_mapping_len.is_none() && !d.write_counts && !d.compact && d.top_k > 0
}

/// The grid of a launch of `d` with `threads` threads a block: `(top_k / threads, num_tokens)`.
pub fn grid(d: &RemapDesc, threads: u32) -> (u32, u32) {
    (d.top_k.div_ceil(threads), d.num_tokens)
}

/// Device addresses of a launch: `req_id`, `block_table`, `topk`, `out`.
#[derive(Clone, Copy, Debug)]
pub struct WideAddrs {
    /// `i32[num_tokens]`.
    pub req_id: u64,
    /// `i32[table_rows * max_blocks]`.
    pub block_table: u64,
    /// `i32[num_tokens * top_k]`.
    pub topk: u64,
    /// `i32[num_tokens * top_k]`, written.
    pub out: u64,
}

/// The kernel loaded for one device.
pub struct WideRemap {
    module: LabModule,
    f: LabFunction,
}

impl WideRemap {
    /// Compiles (NVRTC, `compute_{major}{minor}` of `dev`) and loads the kernel.
    pub fn load(dev: &CudaDevice, ordinal: usize) -> Result<WideRemap, LabError> {
        let (major, minor) = dev.compute_capability();
        let source = format!("{}{}", gk::CUDA_SOURCE, SOURCE);
        let ptx =
            crate::module::compile(&source, "remap_wide.cu", &format!("compute_{major}{minor}"))?;
        let module = LabModule::load(dev, ordinal, &ptx)?;
        let f = module.function(SYMBOL)?;
        Ok(WideRemap { module, f })
    }

    /// Enqueues the plain remap `d` on `stream`, `threads` threads a block.
    ///
    /// # Safety
    /// Every address of `a` is a live device buffer of the size the remap `d` needs, alive until
    /// the launch completed on `stream`.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        d: &RemapDesc,
        threads: u32,
        a: &WideAddrs,
    ) -> Result<(), LabError> {
        if !eligible(d) || !THREADS.contains(&threads) {
            return Err(LabError(format!(
                "{SYMBOL} takes plain remaps only, at {THREADS:?} threads a block"
            )));
        }
        if d.num_tokens == 0 {
            return Ok(());
        }
        let (gx, gy) = grid(d, threads);
        let mut ptrs = [a.req_id, a.block_table, a.topk, a.out];
        let mut words = [
            d.num_tokens,
            d.top_k,
            d.table_rows,
            d.max_blocks,
            d.block_size,
            d.block_stride_rows,
        ];
        let mut params: Vec<*mut c_void> = Vec::with_capacity(10);
        for p in ptrs.iter_mut() {
            params.push((p as *mut u64).cast());
        }
        for w in words.iter_mut() {
            params.push((w as *mut u32).cast());
        }
        // SAFETY: `params` holds one pointer per parameter of lab_remap_wide in its order (four
        // pointers, six u32), each alive for the call; the buffers per the caller's contract.
        unsafe {
            self.module
                .launch_2d(self.f, (gx, gy), threads, 0, stream, &mut params)
        }
    }
}
