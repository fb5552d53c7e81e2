//! The kernels: embedded code objects for gfx90a, gfx942, gfx1100 and gfx1201, the source for
//! hiprtc, and
//! the ABI table (from `hisparse-gpu-kernels`).
//!
//! The code objects in `kernels/` are built by `scripts/build-code-objects.sh` with clang 19 from
//! the one source shared with CUDA (`hisparse_gpu_kernels::HIP_SOURCE`) plus `kernels/hip_offline.h`
//! (the HIP device environment without ROCm headers). They are checked in, so building this crate
//! needs no compiler for AMD GPUs; CI rebuilds them and fails on any difference, and the tests
//! check that they define every kernel and were built from the current sources.

use std::fmt;

use hisparse_gpu_kernels::{Kernel, KernelAbi};

/// Where the loaded kernels came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// The embedded code object for this processor.
    CodeObject(&'static str),
    /// Compiled at run time by hiprtc for this architecture (no embedded code object fits).
    Hiprtc(String),
}

impl fmt::Display for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSource::CodeObject(arch) => write!(f, "embedded {arch} code object"),
            KernelSource::Hiprtc(arch) => write!(f, "hiprtc for {arch}"),
        }
    }
}

/// Every kernel, in the order of [`Kernel::ALL`].
pub(crate) const KERNELS: [KernelAbi; Kernel::ALL.len()] = {
    let mut out = [Kernel::ALL[0].abi(); Kernel::ALL.len()];
    let mut i = 0;
    while i < Kernel::ALL.len() {
        out[i] = Kernel::ALL[i].abi();
        i += 1;
    }
    out
};

/// Position of `k` in [`KERNELS`].
pub(crate) fn index(k: Kernel) -> usize {
    Kernel::ALL
        .iter()
        .position(|&x| x == k)
        .expect("Kernel::ALL lists every kernel")
}

/// The HIP device environment for offline clang builds (`kernels/hip_offline.h`).
pub const HIP_OFFLINE_H: &str = include_str!("../kernels/hip_offline.h");

/// FNV-1a (64-bit) of the sources the code objects were built from, recorded by the build script.
#[cfg(test)]
pub(crate) const BUILT_FROM_FNV: &str = include_str!("../kernels/SOURCE_FNV1A64");

/// 16-byte aligned storage for an embedded code object (HIP reads the ELF in place).
#[repr(C, align(16))]
struct Aligned<T: ?Sized>(T);

static GFX90A: &Aligned<[u8]> = &Aligned(*include_bytes!("../kernels/hisparse-gfx90a.co"));
static GFX942: &Aligned<[u8]> = &Aligned(*include_bytes!("../kernels/hisparse-gfx942.co"));
static GFX1100: &Aligned<[u8]> = &Aligned(*include_bytes!("../kernels/hisparse-gfx1100.co"));
static GFX1201: &Aligned<[u8]> = &Aligned(*include_bytes!("../kernels/hisparse-gfx1201.co"));

/// The embedded code objects by processor name.
pub const CODE_OBJECTS: [(&str, &[u8]); 4] = [
    ("gfx90a", &GFX90A.0),
    ("gfx942", &GFX942.0),
    ("gfx1100", &GFX1100.0),
    ("gfx1201", &GFX1201.0),
];

/// The processor part of a `gcnArchName` (`gfx942:sramecc+:xnack-` → `gfx942`).
pub fn processor(gcn_arch_name: &str) -> &str {
    gcn_arch_name.split(':').next().unwrap_or_default()
}

/// The embedded code object for a device's `gcnArchName`, if one was built for its processor.
/// The code objects are built without `xnack`/`sramecc` settings, so they load on either setting.
pub fn code_object_for(gcn_arch_name: &str) -> Option<(&'static str, &'static [u8])> {
    let p = processor(gcn_arch_name);
    CODE_OBJECTS.iter().copied().find(|(arch, _)| *arch == p)
}

/// The complete HIP translation unit hiprtc compiles (hiprtc supplies the HIP runtime header).
pub fn hip_source() -> &'static str {
    hisparse_gpu_kernels::HIP_SOURCE
}

/// FNV-1a (64-bit) of `parts` concatenated.
#[cfg(test)]
pub(crate) fn fnv1a64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf;

    #[test]
    fn every_code_object_targets_its_processor_and_defines_every_kernel() {
        for (arch, image) in CODE_OBJECTS {
            let info = elf::parse(image).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(info.machine, elf::EM_AMDGPU, "{arch}");
            assert_eq!(
                Some(info.flags & elf::EF_AMDGPU_MACH),
                elf::mach_of(arch),
                "{arch}: e_flags {:#x}",
                info.flags
            );
            assert_eq!(elf::extent(image).unwrap(), image.len(), "{arch}");
            for k in KERNELS {
                assert!(
                    info.has_kernel(k.name),
                    "{arch} lacks {} or {}.kd",
                    k.name,
                    k.name
                );
            }
        }
    }

    #[test]
    fn code_objects_were_built_from_the_current_sources() {
        let now = fnv1a64(&[
            HIP_OFFLINE_H,
            hisparse_gpu_kernels::HIP_PRELUDE,
            hisparse_gpu_kernels::COMMON_SOURCE,
        ]);
        assert_eq!(
            format!("{now:016x}"),
            BUILT_FROM_FNV.trim(),
            "the kernel sources changed since the code objects were built: run \
             backend-rocm/scripts/build-code-objects.sh and commit backend-rocm/kernels"
        );
    }

    #[test]
    fn code_object_choice_follows_the_processor() {
        assert_eq!(
            code_object_for("gfx942:sramecc+:xnack-").unwrap().0,
            "gfx942"
        );
        assert_eq!(
            code_object_for("gfx90a:sramecc-:xnack+").unwrap().0,
            "gfx90a"
        );
        assert_eq!(code_object_for("gfx1100").unwrap().0, "gfx1100");
        assert_eq!(code_object_for("gfx1201").unwrap().0, "gfx1201");
        assert!(code_object_for("gfx908:sramecc+:xnack-").is_none());
        assert!(code_object_for("gfx94").is_none());
        assert!(code_object_for("").is_none());
    }

    #[test]
    fn kernel_table_is_in_abi_order() {
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(index(*k), i);
            assert_eq!(KERNELS[i].name, k.name());
        }
    }
}
