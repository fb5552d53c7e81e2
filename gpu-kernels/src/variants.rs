//! Earlier kernel variants, kept for A/B measurements only (feature `variants`): the symbols in
//! [`crate::VARIANTS_SOURCE`] and their launch shapes. Each gives results identical to the
//! production kernel with the same parameters; a benchmark runs them side by side and checks
//! every output byte for byte.

use hisparse_core::ops::{GatherDesc, RemapDesc, ResolveDesc};

use crate::plan::{self, GatherAddrs, Plan, PlanError, RemapAddrs, ResolveAddrs, Target};
use crate::{GATHER_ROWS, Kernel};

/// `hs_remap_v2` flag (not in the production ABI): look table entries up in global memory.
pub const REMAP_DIRECT: u32 = 8;
/// Threads per block of `hs_remap_v1` and `hs_remap_v2`.
pub const REMAP_V2_THREADS: u32 = 256;

/// A remap kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RemapVariant {
    /// `hs_remap_v1`: one block of 256 threads per row, the table row staged with 4-byte loads.
    V1,
    /// `hs_remap_v2`: one block of 256 threads per row, top-k loads issued first, the table row
    /// staged with asynchronous 16-byte copies.
    V2,
    /// `hs_remap_v2` with table entries read through the read-only cache instead of staged.
    V2Direct,
    /// `hs_remap` (production): one 16-byte top-k vector per thread, direct table lookups,
    /// single-barrier counts and compaction.
    V3,
}

impl RemapVariant {
    /// Every variant, production last.
    pub const ALL: [RemapVariant; 4] = [
        RemapVariant::V1,
        RemapVariant::V2,
        RemapVariant::V2Direct,
        RemapVariant::V3,
    ];

    /// The variant's name: `v1`, `v2`, `v2-direct` or `v3`.
    pub const fn name(self) -> &'static str {
        match self {
            RemapVariant::V1 => "v1",
            RemapVariant::V2 => "v2",
            RemapVariant::V2Direct => "v2-direct",
            RemapVariant::V3 => "v3",
        }
    }

    /// The variant named `name`, if any.
    pub fn from_name(name: &str) -> Option<RemapVariant> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }
}

/// A swap-in gather kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GatherVariant {
    /// `hs_gather_rows_v1`: grid `(ceil(top_k / 16), T, layers)`, count read before the plan.
    V1,
    /// `hs_gather_rows_v2`: the same grid, plan read together with the count.
    V2,
    /// `hs_gather_rows_v2` with 8 plan entries per block (twice the blocks).
    V2Rows8,
    /// `hs_gather_rows_v2` with 4 plan entries per block (four times the blocks).
    V2Rows4,
    /// `hs_gather_rows` (production): a persistent grid walking work items first chunks first.
    V3,
}

impl GatherVariant {
    /// Every variant, production last.
    pub const ALL: [GatherVariant; 5] = [
        GatherVariant::V1,
        GatherVariant::V2,
        GatherVariant::V2Rows8,
        GatherVariant::V2Rows4,
        GatherVariant::V3,
    ];

    /// The variant's name: `v1`, `v2`, `v2-r8`, `v2-r4` or `v3`.
    pub const fn name(self) -> &'static str {
        match self {
            GatherVariant::V1 => "v1",
            GatherVariant::V2 => "v2",
            GatherVariant::V2Rows8 => "v2-r8",
            GatherVariant::V2Rows4 => "v2-r4",
            GatherVariant::V3 => "v3",
        }
    }

    /// The variant named `name`, if any.
    pub fn from_name(name: &str) -> Option<GatherVariant> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }
}

/// A resolver kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResolveVariant {
    /// `hs_resolve_v1`: 512 threads, every phase classifying entries again, one item in flight
    /// per thread.
    V1,
    /// `hs_resolve` (production): 1024 threads, every pass's loads issued together, a one-row
    /// request's entries classified once, one barrier per block scan.
    V2,
}

impl ResolveVariant {
    /// Every variant, production last.
    pub const ALL: [ResolveVariant; 2] = [ResolveVariant::V1, ResolveVariant::V2];

    /// The variant's name: `v1` or `v2`.
    pub const fn name(self) -> &'static str {
        match self {
            ResolveVariant::V1 => "v1",
            ResolveVariant::V2 => "v2",
        }
    }

    /// The variant named `name`, if any.
    pub fn from_name(name: &str) -> Option<ResolveVariant> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }
}

/// An empty kernel without parameters (`hs_empty`): the floor of a launch, for benchmarks.
pub const EMPTY_KERNEL: &str = "hs_empty";

/// Threads per block of `hs_resolve_v1`.
pub const RESOLVE_V1_THREADS: u32 = 512;

/// Every variant symbol of [`crate::VARIANTS_SOURCE`].
pub const SYMBOLS: [&str; 5] = [
    "hs_remap_v1",
    "hs_remap_v2",
    "hs_gather_rows_v1",
    "hs_gather_rows_v2",
    "hs_resolve_v1",
];

/// The resolve of `d` with kernel `v` (same shared memory and workspace for both).
pub fn resolve(
    t: &Target,
    d: &ResolveDesc,
    a: &ResolveAddrs,
    force_global: bool,
    v: ResolveVariant,
) -> Result<Plan, PlanError> {
    let mut p = plan::resolve(t, d, a, force_global)?;
    if v == ResolveVariant::V1 {
        for l in &mut p.launches {
            l.block = RESOLVE_V1_THREADS;
            l.variant = Some("hs_resolve_v1");
        }
    }
    Ok(p)
}

/// The remap of `d` with kernel `v`.
pub fn remap(
    t: &Target,
    d: &RemapDesc,
    a: &RemapAddrs,
    v: RemapVariant,
) -> Result<Plan, PlanError> {
    let mut p = plan::remap(t, d, a)?;
    if v == RemapVariant::V3 {
        return Ok(p);
    }
    for l in &mut p.launches {
        l.block = REMAP_V2_THREADS;
        l.variant = Some(if v == RemapVariant::V1 {
            "hs_remap_v1"
        } else {
            "hs_remap_v2"
        });
        if v == RemapVariant::V2Direct {
            // `flags` is the last parameter.
            let mut args = crate::args::Args::default();
            let n = Kernel::Remap.abi().params.len();
            for i in 0..n - 1 {
                let b = l.args.value(i).expect("packed by plan::remap");
                match b.len() {
                    8 => args.ptr(u64::from_ne_bytes(b.try_into().expect("8 bytes"))),
                    _ => args.u32(u32::from_ne_bytes(b.try_into().expect("4 bytes"))),
                };
            }
            let flags = u32::from_ne_bytes(
                l.args
                    .value(n - 1)
                    .expect("flags")
                    .try_into()
                    .expect("4 bytes"),
            );
            args.u32(flags | REMAP_DIRECT);
            l.args = args;
        }
    }
    Ok(p)
}

/// The gather of `d` with kernel `v` (the v1 and v2 kernels take one block per chunk of plan
/// entries of every row: grid `(ceil(top_k / rows), T, layers)`, `T ≤ 65535`).
pub fn gather(
    t: &Target,
    d: &GatherDesc<'_>,
    a: &GatherAddrs,
    v: GatherVariant,
) -> Result<Plan, PlanError> {
    let mut p = plan::gather(t, d, a)?;
    let rows = match v {
        GatherVariant::V3 => return Ok(p),
        GatherVariant::V1 | GatherVariant::V2 => GATHER_ROWS,
        GatherVariant::V2Rows8 => 8,
        GatherVariant::V2Rows4 => 4,
    };
    if d.num_tokens > 65_535 {
        return Err(PlanError {
            what: "gather num_tokens (kernels v1 and v2)",
            value: d.num_tokens.into(),
            limit: 65_535,
        });
    }
    for l in &mut p.launches {
        l.grid = [d.top_k.div_ceil(rows), d.num_tokens, l.grid[2]];
        l.variant = Some(if v == GatherVariant::V1 {
            "hs_gather_rows_v1"
        } else {
            "hs_gather_rows_v2"
        });
    }
    Ok(p)
}
