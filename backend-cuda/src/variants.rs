//! Kernel variants for A/B measurements (feature `bench-variants`): the earlier remap and gather
//! kernels selectable at run time, and a switch that forces the resolver's global-state mode.
//! Every variant gives results identical to the production kernels; `cuda_bench` measures them
//! side by side and checks every output byte for byte. Production builds do not contain any of
//! this.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

pub use hisparse_gpu_kernels::variants::{GatherVariant, RemapVariant, ResolveVariant};

use crate::device::{CudaDevice, CudaStream};
use crate::error::CudaError;
use crate::ffi::{self, LaunchShape};

/// Environment variable that, set to `1`, makes `resolve` keep each request's LRU copy, partition
/// and bitmap in the global workspace even when they fit shared memory (global-state mode of
/// `hs_resolve`, which the planner picks by itself only when shared memory is too small), so the
/// conformance suite can check that mode on a large GPU.
pub const RESOLVE_GLOBAL_ENV: &str = "HISPARSE_CUDA_RESOLVE_GLOBAL";

/// The selected variants of one device.
#[derive(Debug)]
pub(crate) struct BenchSwitches {
    remap: AtomicU8,
    gather: AtomicU8,
    resolve: AtomicU8,
    resolve_global: AtomicBool,
}

fn index_of<T: PartialEq>(all: &[T], v: &T) -> u8 {
    all.iter().position(|x| x == v).unwrap_or(all.len() - 1) as u8
}

impl BenchSwitches {
    /// Production kernels; global-state resolves when [`RESOLVE_GLOBAL_ENV`] is `1`.
    pub(crate) fn from_env() -> Result<BenchSwitches, CudaError> {
        let global = match std::env::var(RESOLVE_GLOBAL_ENV) {
            Ok(v) if matches!(v.trim(), "1" | "true" | "yes") => true,
            Ok(v) if v.trim().is_empty() || matches!(v.trim(), "0" | "false" | "no") => false,
            Ok(v) => {
                return Err(CudaError::Unsupported(format!(
                    "{RESOLVE_GLOBAL_ENV}={v}: expected 1 or 0"
                )));
            }
            Err(_) => false,
        };
        Ok(BenchSwitches {
            remap: AtomicU8::new(index_of(&RemapVariant::ALL, &RemapVariant::PRODUCTION)),
            gather: AtomicU8::new(index_of(&GatherVariant::ALL, &GatherVariant::PRODUCTION)),
            resolve: AtomicU8::new(index_of(&ResolveVariant::ALL, &ResolveVariant::PRODUCTION)),
            resolve_global: AtomicBool::new(global),
        })
    }

    pub(crate) fn remap(&self) -> RemapVariant {
        RemapVariant::ALL[usize::from(self.remap.load(Ordering::Relaxed))]
    }

    pub(crate) fn gather(&self) -> GatherVariant {
        GatherVariant::ALL[usize::from(self.gather.load(Ordering::Relaxed))]
    }

    pub(crate) fn resolve(&self) -> ResolveVariant {
        ResolveVariant::ALL[usize::from(self.resolve.load(Ordering::Relaxed))]
    }

    pub(crate) fn resolve_global(&self) -> bool {
        self.resolve_global.load(Ordering::Relaxed)
    }
}

impl CudaDevice {
    /// The remap kernel launched from now on.
    pub fn remap_variant(&self) -> RemapVariant {
        self.bench.remap()
    }

    /// Chooses the remap kernel for later remaps (results are identical).
    pub fn set_remap_variant(&self, v: RemapVariant) {
        self.bench
            .remap
            .store(index_of(&RemapVariant::ALL, &v), Ordering::Relaxed);
    }

    /// The gather kernel launched from now on.
    pub fn gather_variant(&self) -> GatherVariant {
        self.bench.gather()
    }

    /// Chooses the gather kernel for later gathers (results are identical).
    pub fn set_gather_variant(&self, v: GatherVariant) {
        self.bench
            .gather
            .store(index_of(&GatherVariant::ALL, &v), Ordering::Relaxed);
    }

    /// The resolver kernel launched from now on.
    pub fn resolve_variant(&self) -> ResolveVariant {
        self.bench.resolve()
    }

    /// Chooses the resolver kernel for later resolves (results are identical).
    pub fn set_resolve_variant(&self, v: ResolveVariant) {
        self.bench
            .resolve
            .store(index_of(&ResolveVariant::ALL, &v), Ordering::Relaxed);
    }

    /// Enqueues one launch of an empty kernel (one block of one thread) on `stream`: the floor
    /// of a kernel's cost, inside a graph or not.
    pub fn launch_empty(&self, stream: &CudaStream) -> Result<(), CudaError> {
        let f = self
            .kernels()?
            .variants
            .iter()
            .find(|(s, _)| *s == hisparse_gpu_kernels::variants::EMPTY_KERNEL)
            .map(|&(_, f)| f)
            .ok_or_else(|| CudaError::Compile {
                log: "the empty kernel is not loaded".into(),
            })?;
        self.ctx.bind()?;
        let shape = LaunchShape {
            grid: (1, 1, 1),
            block: 1,
            shared: 0,
        };
        // SAFETY: `hs_empty` takes no parameters and touches no memory.
        unsafe { ffi::launch(f, shape, &stream.inner, &mut [], false) }
    }

    /// Enqueues `hs_clock_probe` on `stream`: one block per multiprocessor spinning for `ns`
    /// nanoseconds of the GPU's timer (sustained work that brings the clocks up), block 0
    /// measuring the SM clock over its spin into `out` (two `u64`: cycles, nanoseconds; see
    /// [`CudaDevice::clock_mhz`]).
    pub fn launch_clock_probe(
        &self,
        stream: &CudaStream,
        out: &mut crate::CudaBuffer,
        ns: u64,
    ) -> Result<(), CudaError> {
        if out.mem.len() < 16 {
            return Err(CudaError::Unsupported(
                "the clock probe writes 16 bytes: pass a buffer of at least 16".into(),
            ));
        }
        let f = self
            .kernels()?
            .variants
            .iter()
            .find(|(s, _)| *s == hisparse_gpu_kernels::variants::CLOCK_PROBE_KERNEL)
            .map(|&(_, f)| f)
            .ok_or_else(|| CudaError::Compile {
                log: "the clock probe is not loaded".into(),
            })?;
        self.ctx.bind()?;
        let shape = LaunchShape {
            grid: (self.target.multiprocessors, 1, 1),
            block: 32,
            shared: 0,
        };
        let mut addr = out.mem.ptr();
        let mut spin = ns;
        let mut params = [
            (&raw mut addr).cast::<std::ffi::c_void>(),
            (&raw mut spin).cast::<std::ffi::c_void>(),
        ];
        // SAFETY: `hs_clock_probe(u64* out, u64 ns)` takes exactly these two parameters; `addr`
        // is a live device buffer of at least 16 bytes (checked), which the caller keeps alive
        // until the stream's work completed (the `Device` contract for every buffer).
        unsafe { ffi::launch(f, shape, &stream.inner, &mut params, false) }
    }

    /// The SM clock in MHz from a probe's output (`[cycles, nanoseconds]`, downloaded after
    /// [`CudaDevice::launch_clock_probe`] completed), or `None` when the probe measured nothing.
    pub fn clock_mhz(probe: [u64; 2]) -> Option<f64> {
        (probe[1] > 0).then(|| probe[0] as f64 * 1e3 / probe[1] as f64)
    }

    /// Forces (or stops forcing) the resolver's global-state mode.
    pub fn set_resolve_global(&self, on: bool) {
        self.bench.resolve_global.store(on, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_round_trip_and_production_is_last() {
        for v in RemapVariant::ALL {
            assert_eq!(RemapVariant::from_name(v.name()), Some(v));
        }
        for v in GatherVariant::ALL {
            assert_eq!(GatherVariant::from_name(v.name()), Some(v));
        }
        assert_eq!(RemapVariant::ALL.last(), Some(&RemapVariant::PRODUCTION));
        assert_eq!(GatherVariant::ALL.last(), Some(&GatherVariant::PRODUCTION));
        assert_eq!(
            ResolveVariant::ALL.last(),
            Some(&ResolveVariant::PRODUCTION)
        );
        for sym in hisparse_gpu_kernels::variants::SYMBOLS {
            assert!(
                hisparse_gpu_kernels::VARIANTS_SOURCE.contains(&format!(" {sym}(")),
                "{sym}"
            );
        }
    }
}
