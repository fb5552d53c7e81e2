//! Launching a [`Plan`] on a [`CudaStream`]: the compiled kernels of a device, their
//! dynamic-shared-memory limits, and the one path every operation's launches take.

use hisparse_gpu_kernels::plan::Plan;
use hisparse_gpu_kernels::{self as gk, Kernel};

use crate::device::{CudaDevice, Result, lock};
use crate::error::CudaError;
use crate::ffi::{self, Function, LaunchShape, Module};
use crate::handles::CudaStream;

/// Resource use of one compiled kernel ([`CudaDevice::kernel_report`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelReport {
    /// The kernel's symbol.
    pub name: &'static str,
    /// Registers per thread.
    pub registers: i32,
    /// Local memory (register spills, stack) per thread, in bytes.
    pub local_bytes: i32,
    /// Static shared memory per block, in bytes.
    pub shared_bytes: i32,
    /// Threads per block the report assumes (the largest the backend launches it with).
    pub block_threads: u32,
    /// Blocks one multiprocessor holds at once at that block size.
    pub blocks_per_multiprocessor: i32,
}

/// The loaded module and its kernels.
pub(crate) struct Kernels {
    _module: Module,
    /// One function per entry of [`Kernel::ALL`], in that order.
    f: [Function; Kernel::ALL.len()],
    /// Dynamic shared memory the resolver functions accept (their attribute is raised to it);
    /// every other function accepts [`DEFAULT_DYNAMIC_SHARED`].
    large_dynamic_shared: u32,
    /// Resolver blocks one multiprocessor runs at once by registers and threads
    /// (`Target::resolve_blocks_per_multiprocessor`).
    pub(crate) resolve_blocks_per_multiprocessor: u32,
}

/// Dynamic shared memory a CUDA function accepts without opting in.
const DEFAULT_DYNAMIC_SHARED: u32 = 48 * 1024;

impl Kernels {
    pub(crate) fn get(&self, k: Kernel) -> Function {
        self.f[Kernel::ALL.iter().position(|x| *x == k).unwrap_or(0)]
    }

    /// Dynamic shared memory a launch of `k` may ask for.
    fn dynamic_shared_limit(&self, k: Kernel) -> u32 {
        if k.large_dynamic_shared() {
            self.large_dynamic_shared
        } else {
            DEFAULT_DYNAMIC_SHARED
        }
    }
}

/// Kernels that run `HS_GRID_DEP_WAIT` before touching memory, so they may be launched with
/// programmatic stream serialisation: the decode path (remap, resolve, gather).
const fn waits_for_grid_dependency(k: Kernel) -> bool {
    matches!(
        k,
        Kernel::Remap
            | Kernel::RemapModes
            | Kernel::RemapWide
            | Kernel::Resolve
            | Kernel::GatherRows
            | Kernel::ResolveGather
    )
}

impl CudaDevice {
    /// What the driver made of the decode-path kernels: registers per thread, local (spill)
    /// bytes per thread, static shared bytes per block, and blocks one multiprocessor holds at
    /// the largest block size the backend launches.
    pub fn kernel_report(&self) -> Result<Vec<KernelReport>> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let k = self.kernels()?;
        let list: Vec<(&'static str, Function, u32)> = [
            Kernel::Remap,
            Kernel::RemapWide,
            Kernel::Resolve,
            Kernel::GatherRows,
            Kernel::ResolveGather,
        ]
        .into_iter()
        .map(|x| (x.name(), k.get(x), x.abi().block_threads))
        .collect();
        let mut out = Vec::new();
        for (name, f, block) in list {
            out.push(KernelReport {
                name,
                registers: f.attribute(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                local_bytes: f.attribute(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                shared_bytes: f.attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
                block_threads: block,
                blocks_per_multiprocessor: f.max_active_blocks(block, 0)?,
            });
        }
        Ok(out)
    }

    pub(crate) fn kernels(&self) -> Result<&Kernels> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let _guard = lock(&self.kernels_init);
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let ptx = crate::nvrtc::cached_ptx(self.cc.0, self.cc.1)?;
        // A first call may come while a stream is being captured: loading is no stream work.
        let module = ffi::relaxed_capture(|| Module::load_ptx(&self.ctx, &ptx))?;
        let mut f = Vec::with_capacity(Kernel::ALL.len());
        for k in Kernel::ALL {
            f.push(module.function(k.name())?);
        }
        let f: [Function; Kernel::ALL.len()] = f.try_into().map_err(|_| CudaError::Compile {
            log: "kernel table".into(),
        })?;
        // The resolvers' shared state and table are sized by the planner up to the device's
        // per-block maximum: raise their limit (so no planned launch is refused by the driver).
        let dynamic = self
            .target
            .shared_per_block
            .saturating_sub(gk::RESOLVE_STATIC_SHARED_BYTES) as u32;
        for (k, func) in Kernel::ALL.iter().zip(&f) {
            if k.large_dynamic_shared() {
                func.set_max_dynamic_shared(dynamic)?;
            }
        }
        let mut kernels = Kernels {
            _module: module,
            f,
            large_dynamic_shared: dynamic,
            resolve_blocks_per_multiprocessor: 0,
        };
        // How many resolver blocks share a multiprocessor decides how the planner splits its
        // shared memory: ask the driver what the compiled kernels' registers allow (a query, no
        // stream work: relaxed like the load, as the first call may come during a capture).
        kernels.resolve_blocks_per_multiprocessor = ffi::relaxed_capture(|| {
            let mut blocks = u32::MAX;
            for k in Kernel::RESOLVERS {
                let n = kernels.get(k).max_active_blocks(k.abi().block_threads, 0)?;
                blocks = blocks.min(u32::try_from(n).unwrap_or(0));
            }
            Ok(blocks)
        })?;
        let _ = self.kernels.set(kernels);
        self.kernels.get().ok_or_else(|| CudaError::Compile {
            log: "kernel table".into(),
        })
    }

    /// Enqueues `plan` on `stream`: places its lists (constant ones, and every list of work being
    /// captured, in the device's list arena; the others through one asynchronous copy into the
    /// staging ring, reserved until the launches completed), places the symbolic pointers (the
    /// stream's workspace and resolver counters among them) and launches each kernel in order.
    /// An empty plan enqueues nothing; a plan without lists or workspace (the decode path) costs
    /// its launches and nothing else. A launch asking for more dynamic shared memory than its
    /// function accepts is refused before anything of the plan is enqueued.
    pub(crate) fn execute(&self, stream: &CudaStream, mut plan: Plan) -> Result<()> {
        if plan.launches.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // Only lists and scratch depend on whether the stream is being captured.
        let capturing = (!plan.staged.is_empty() || plan.workspace_bytes > 0)
            && stream.inner.capture_status()? != ffi::CaptureStatus::None;
        let workspace = if plan.workspace_bytes > 0 {
            let bytes = usize::try_from(plan.workspace_bytes)
                .map_err(|_| CudaError::Unsupported("resolve workspace exceeds memory".into()))?;
            stream.scratch.workspace(&self.ctx, bytes)?
        } else {
            0
        };
        if capturing {
            // Every replay of the graph uses this stream's counters and workspace.
            self.lasting.retain(&stream.scratch);
        }
        let kernels = self.kernels()?;
        for l in &plan.launches {
            let limit = kernels.dynamic_shared_limit(l.kernel);
            if l.shared > limit {
                return Err(CudaError::Unsupported(format!(
                    "{} asks for {} bytes of dynamic shared memory; the function accepts {limit}",
                    l.kernel.name(),
                    l.shared
                )));
            }
        }
        // Each part's address in the arena, or `None`: staged through the ring.
        let kept = plan
            .staged
            .iter()
            .map(|p| self.lasting.lasting_address(&p.bytes, p.kind, capturing))
            .collect::<Result<Vec<Option<u64>>>>()?;
        let ringed: Vec<&[u8]> = plan
            .staged
            .iter()
            .zip(&kept)
            .filter(|(_, k)| k.is_none())
            .map(|(p, _)| p.bytes.as_slice())
            .collect();
        let mut staging = lock(&self.staging);
        let lease = if ringed.is_empty() {
            None
        } else {
            Some(staging.stage(&stream.inner, &ringed)?)
        };
        let mut from_ring = lease.iter().flat_map(|l| l.ptrs.iter().copied());
        let placed: Vec<u64> = kept
            .iter()
            .map(|k| k.or_else(|| from_ring.next()).unwrap_or(0))
            .collect();
        let result = (|| {
            for l in &mut plan.launches {
                l.args
                    .resolve(&placed, workspace, stream.scratch.counters())
                    .map_err(|log| CudaError::Compile { log })?;
                let abi = l.kernel.abi();
                debug_assert!(l.args.matches(&abi).is_ok(), "{:?}", l.args.matches(&abi));
                let f = kernels.get(l.kernel);
                let programmatic =
                    self.programmatic_launch() && waits_for_grid_dependency(l.kernel);
                let shape = LaunchShape {
                    grid: (l.grid[0], l.grid[1], l.grid[2]),
                    block: l.block,
                    shared: l.shared,
                };
                let mut params = l
                    .args
                    .pointers()
                    .map_err(|log| CudaError::Compile { log })?;
                // SAFETY: `params` holds one pointer per parameter of the kernel `f`, each to a value of the ABI type (packed
                // by the planner through `Args`, checked against the ABI table above in debug
                // builds), alive until the call returns. Every device address among them belongs
                // to a buffer the caller checked with the core's `check` and keeps alive until the
                // work completes (the `Device` contract), to the staging region reserved until
                // then, or to the stream's workspace (freed only with the stream, after the
                // context synchronised). With `programmatic`, the kernel waits for the previous
                // grid (`griddepcontrol.wait`) before touching memory (`waits_for_grid_dependency`,
                // compute capability 9.0+).
                unsafe { ffi::launch(f, shape, &stream.inner, &mut params, programmatic) }?;
            }
            Ok(())
        })();
        if let Some(lease) = lease {
            staging.finish(lease, &stream.inner)?;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kernels_that_wait_for_their_grid_dependency_launch_programmatically() {
        assert!(waits_for_grid_dependency(Kernel::Remap));
        assert!(waits_for_grid_dependency(Kernel::RemapModes));
        assert!(waits_for_grid_dependency(Kernel::Resolve));
        assert!(waits_for_grid_dependency(Kernel::GatherRows));
        assert!(waits_for_grid_dependency(Kernel::ResolveGather));
        for k in Kernel::ALL {
            if waits_for_grid_dependency(k) {
                // The kernel body starts with the wait (HS_GRID_DEP_WAIT) before any access.
                let at = gk::COMMON_SOURCE
                    .find(&format!(" {}(", k.name()))
                    .expect("kernel in source");
                let body = &gk::COMMON_SOURCE[at..];
                let open = body.find('{').expect("body");
                let first = body[open + 1..].trim_start();
                let first = first
                    .lines()
                    .find(|l| {
                        let l = l.trim();
                        !l.starts_with("HS_SHARED") && !l.starts_with("HS_DYN_SHARED")
                    })
                    .unwrap_or_default();
                assert!(
                    first.trim().starts_with("HS_GRID_DEP_WAIT()"),
                    "{}: {first}",
                    k.name()
                );
            }
        }
    }
}
