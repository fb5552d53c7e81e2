//! Earlier kernel variants, kept for A/B measurements only (feature `variants`): the symbols in
//! [`crate::VARIANTS_SOURCE`] and their launch shapes. Each gives results identical to the
//! production kernel with the same parameters; a benchmark runs them side by side and checks
//! every output byte for byte.

use hisparse_core::ops::{GatherDesc, RemapDesc, ResolveDesc};

use crate::plan::{self, GatherAddrs, Plan, PlanError, RemapAddrs, ResolveAddrs, Target};
use crate::{GATHER_ROWS, Kernel};

/// `hs_remap_v2` flag (not in the production ABI): look table entries up in global memory.
pub const REMAP_DIRECT: u32 = 8;
/// `hs_remap_v5` flag (not set by the production planner): stage the request's block-table row
/// in shared memory before the lookups.
pub const REMAP_TABLE: u32 = 32;
/// Most bytes of a block-table row `hs_remap_v5` stages (longer rows are looked up directly, as
/// `hs_remap` does).
pub const REMAP_TABLE_STAGE_MAX_BYTES: u32 = 16 * 1024;
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
    /// `hs_remap_v3`: one 16-byte top-k vector per thread, direct table lookups, single-barrier
    /// counts and compaction in place, one block per row.
    V3,
    /// `hs_remap` (production): as v3, plus the next row's inputs loaded one row ahead by a grid
    /// the device holds at once, and compaction staged in shared memory (whole-vector stores).
    V4,
    /// `hs_remap_v5`: v4 with the request's block-table row staged in shared memory (one
    /// coalesced 16-byte load per thread right after the request id, a barrier, lookups from
    /// shared memory) instead of a scattered dependent load per entry; rows longer than
    /// [`REMAP_TABLE_STAGE_MAX_BYTES`] are looked up as v4 does.
    V5,
}

impl RemapVariant {
    /// Every variant.
    pub const ALL: [RemapVariant; 6] = [
        RemapVariant::V1,
        RemapVariant::V2,
        RemapVariant::V2Direct,
        RemapVariant::V3,
        RemapVariant::V5,
        RemapVariant::V4,
    ];

    /// The production kernel.
    pub const PRODUCTION: RemapVariant = RemapVariant::V4;

    /// The variant's name: `v1`, `v2`, `v2-direct`, `v3`, `v4` or `v5`.
    pub const fn name(self) -> &'static str {
        match self {
            RemapVariant::V1 => "v1",
            RemapVariant::V2 => "v2",
            RemapVariant::V2Direct => "v2-direct",
            RemapVariant::V3 => "v3",
            RemapVariant::V4 => "v4",
            RemapVariant::V5 => "v5",
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
    /// `hs_gather_rows` (production, measured fastest on the H200): a persistent grid walking
    /// work items first chunks first, each item's rows spread over the whole block after a
    /// barrier, the count read before the plan; scale parts in the layout's scale words.
    V3,
    /// `hs_gather_rows_v4` (round 2, 10-13% slower on the H200): the v3 grid; each group of 8
    /// threads copies one row, its count and plan entry loaded together, no barrier.
    V4,
    /// `hs_gather_rows_w16`: v3 with only its 16-byte path (no scale words below 16 bytes, so
    /// no spill at the 64-register bound; v3 spills 20 bytes), for layouts whose parts are whole
    /// 16-byte chunks.
    V3W16,
}

impl GatherVariant {
    /// Every variant.
    pub const ALL: [GatherVariant; 7] = [
        GatherVariant::V1,
        GatherVariant::V2,
        GatherVariant::V2Rows8,
        GatherVariant::V2Rows4,
        GatherVariant::V4,
        GatherVariant::V3W16,
        GatherVariant::V3,
    ];

    /// The production kernel.
    pub const PRODUCTION: GatherVariant = GatherVariant::V3;

    /// The variant's name: `v1`, `v2`, `v2-r8`, `v2-r4`, `v3`, `v4` or `v3-w16`.
    pub const fn name(self) -> &'static str {
        match self {
            GatherVariant::V1 => "v1",
            GatherVariant::V2 => "v2",
            GatherVariant::V2Rows8 => "v2-r8",
            GatherVariant::V2Rows4 => "v2-r4",
            GatherVariant::V3 => "v3",
            GatherVariant::V4 => "v4",
            GatherVariant::V3W16 => "v3-w16",
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
    /// `hs_resolve` (production, measured fastest on the H200): 1024 threads, every pass's loads
    /// issued together, a one-row request's entries classified once, one barrier per block scan,
    /// hits found in LRU order (a dependent load of each position's dgi), the table cleared at its
    /// full shared capacity.
    V2,
    /// `hs_resolve_v3` (round 2, slower on the H200):
    /// v2's passes with hits found in slot order (LRU and dgi read coalesced at once with the page
    /// tables, the inverse permutation in shared memory), the hot-table row staged, the table
    /// cleared at the request's size while the loads travel, two sums per barrier.
    V3,
}

impl ResolveVariant {
    /// Every variant.
    pub const ALL: [ResolveVariant; 3] =
        [ResolveVariant::V1, ResolveVariant::V3, ResolveVariant::V2];

    /// The production kernel.
    pub const PRODUCTION: ResolveVariant = ResolveVariant::V2;

    /// The variant's name: `v1`, `v2` or `v3`.
    pub const fn name(self) -> &'static str {
        match self {
            ResolveVariant::V1 => "v1",
            ResolveVariant::V2 => "v2",
            ResolveVariant::V3 => "v3",
        }
    }

    /// The variant named `name`, if any.
    pub fn from_name(name: &str) -> Option<ResolveVariant> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }
}

/// An empty kernel without parameters (`hs_empty`): the floor of a launch, for benchmarks.
pub const EMPTY_KERNEL: &str = "hs_empty";

/// `hs_clock_probe(u64* out, u64 ns)`: every block spins until `ns` nanoseconds of the GPU's
/// global timer have passed (sustained work that keeps the clocks up), and block 0 writes the SM
/// clock cycles and timer nanoseconds of its spin to `out[0]` and `out[1]` (their ratio is the
/// SM clock it ran at). CUDA only, for benchmarks.
pub const CLOCK_PROBE_KERNEL: &str = "hs_clock_probe";

/// Threads per block of `hs_resolve_v1`.
pub const RESOLVE_V1_THREADS: u32 = 512;

/// Every variant symbol of [`crate::VARIANTS_SOURCE`] with a production kernel's parameters.
pub const SYMBOLS: [&str; 10] = [
    "hs_remap_v1",
    "hs_remap_v2",
    "hs_remap_v3",
    "hs_remap_v5",
    "hs_gather_rows_v1",
    "hs_gather_rows_v2",
    "hs_gather_rows_v4",
    "hs_gather_rows_w16",
    "hs_resolve_v1",
    "hs_resolve_v3",
];

/// Refuses a stats buffer (`stats`, its address) for bench variant `symbol`, which counts
/// nothing: the production kernel (and remap v5, which shares its rows) counts.
fn no_stats(stats: u64, symbol: &'static str) -> Result<(), PlanError> {
    if stats == 0 {
        return Ok(());
    }
    Err(PlanError::Geometry {
        what: symbol,
        value: stats,
        need: "no stats buffer (bench variants other than the production kernels and remap v5 \
               count nothing); use the production kernel",
    })
}

/// The resolve of `d` with kernel `v` (same shared memory and workspace for both).
pub fn resolve(
    t: &Target,
    d: &ResolveDesc,
    a: &ResolveAddrs,
    force_global: bool,
    v: ResolveVariant,
) -> Result<Plan, PlanError> {
    if v != ResolveVariant::V2 && d.num_state_rows.is_some() {
        return Err(PlanError::Geometry {
            what: "resolve num_state_rows (batch-row order)",
            value: d.num_state_rows.map_or(0, u64::from),
            need: "state-row order for the bench variants hs_resolve_v1 and hs_resolve_v3; use \
                   the production kernel",
        });
    }
    if v != ResolveVariant::V2 {
        no_stats(
            a.stats,
            "resolve stats buffer (bench variants hs_resolve_v1 and hs_resolve_v3)",
        )?;
    }
    let mut p = plan::resolve(t, d, a, force_global)?;
    for l in &mut p.launches {
        match v {
            ResolveVariant::V1 => {
                l.block = RESOLVE_V1_THREADS;
                l.variant = Some("hs_resolve_v1");
            }
            ResolveVariant::V3 => l.variant = Some("hs_resolve_v3"),
            ResolveVariant::V2 => {}
        }
    }
    Ok(p)
}

/// `l` (a launch of `hs_remap`'s parameters) with `extra` set in its flags, the last parameter.
fn with_flags(l: &mut crate::plan::Launch, extra: u32) {
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
    args.u32(flags | extra);
    l.args = args;
}

/// The remap of `d` with kernel `v`.
pub fn remap(
    t: &Target,
    d: &RemapDesc,
    a: &RemapAddrs,
    v: RemapVariant,
) -> Result<Plan, PlanError> {
    if !matches!(v, RemapVariant::V4 | RemapVariant::V5) {
        no_stats(
            a.stats,
            "remap stats buffer (bench variants hs_remap_v1, hs_remap_v2 and hs_remap_v3)",
        )?;
    }
    let mut p = plan::remap(t, d, a)?;
    if v == RemapVariant::V4 {
        return Ok(p);
    }
    if v == RemapVariant::V5 {
        // hs_remap's launch; the staged table row after its dynamic shared memory (16-byte
        // aligned), when the row fits.
        let row_bytes = 4 * u64::from(d.max_blocks);
        for l in &mut p.launches {
            l.variant = Some("hs_remap_v5");
            if row_bytes <= u64::from(REMAP_TABLE_STAGE_MAX_BYTES) {
                l.shared = l.shared.next_multiple_of(16) + row_bytes as u32;
                with_flags(l, REMAP_TABLE);
            }
        }
        return Ok(p);
    }
    for l in &mut p.launches {
        // The earlier kernels take one block per row and no dynamic shared memory (they ignore
        // the staging flag).
        l.grid = [d.num_tokens, 1, 1];
        l.shared = 0;
        if v == RemapVariant::V3 {
            l.variant = Some("hs_remap_v3");
            continue;
        }
        l.block = REMAP_V2_THREADS;
        l.variant = Some(if v == RemapVariant::V1 {
            "hs_remap_v1"
        } else {
            "hs_remap_v2"
        });
        if v == RemapVariant::V2Direct {
            with_flags(l, REMAP_DIRECT);
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
    if !matches!(v, GatherVariant::V3 | GatherVariant::V4) {
        // The earlier kernels copy whole 16-byte chunks only.
        for l in d.layers {
            let scale = l.host.row_bytes - l.host.value_bytes;
            if crate::scale_word(&l.host) != 16 {
                return Err(PlanError::Geometry {
                    what: "layout scale part (row_bytes - value_bytes) for gather variants v1-v2 and v3-w16",
                    value: scale.into(),
                    need: "a multiple of 16 (use the production gather, v3, or v4)",
                });
            }
        }
    }
    let rows = match v {
        GatherVariant::V3 => return Ok(p),
        GatherVariant::V4 | GatherVariant::V3W16 => {
            // The same persistent grid as production.
            for l in &mut p.launches {
                l.variant = Some(if v == GatherVariant::V4 {
                    "hs_gather_rows_v4"
                } else {
                    "hs_gather_rows_w16"
                });
            }
            return Ok(p);
        }
        GatherVariant::V1 | GatherVariant::V2 => GATHER_ROWS,
        GatherVariant::V2Rows8 => 8,
        GatherVariant::V2Rows4 => 4,
    };
    if d.num_tokens > 65_535 {
        return Err(PlanError::TooLarge {
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

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::ops::{LayerPair, PageLayout};

    const H200: Target = Target {
        multiprocessors: 132,
        shared_per_block: 227 * 1024,
        shared_per_multiprocessor: 228 * 1024,
    };

    /// What a backend's driver accepts from every variant's launches: whole warps, packed
    /// arguments of the production kernel's ABI, and dynamic shared memory above the default
    /// limit only for kernels the backend raises the limit of (`Kernel::large_dynamic_shared`).
    fn accepted(p: &Plan) {
        for l in &p.launches {
            l.args.matches(&l.kernel.abi()).unwrap();
            assert!(l.block % 32 == 0 && l.block <= 1024, "{l:?}");
            assert!(l.grid.iter().all(|&g| g > 0), "{l:?}");
            let limit = if l.kernel.large_dynamic_shared() {
                H200.shared_per_block - crate::RESOLVE_STATIC_SHARED_BYTES
            } else {
                48 * 1024
            };
            assert!(
                u64::from(l.shared) <= limit,
                "{:?}: {} bytes",
                l.variant,
                l.shared
            );
        }
    }

    #[test]
    fn every_variant_launch_is_one_the_device_accepts() {
        for (t, k) in [(1u32, 2048u32), (64, 2048), (1024, 2048), (3, 2052)] {
            for compact in [false, true] {
                let d = RemapDesc {
                    num_tokens: t,
                    top_k: k,
                    table_rows: t,
                    max_blocks: 2048,
                    block_size: 64,
                    block_stride_rows: 64,
                    idx_mapping_len: None,
                    write_counts: true,
                    compact,
                    stats_slot: 0,
                };
                for v in RemapVariant::ALL {
                    let p = remap(&H200, &d, &RemapAddrs::default(), v).unwrap();
                    accepted(&p);
                    if !matches!(v, RemapVariant::V4 | RemapVariant::V5) {
                        assert_eq!(p.launches[0].grid[0], t, "{v:?}: one block per row");
                    }
                }
            }
            let r = ResolveDesc {
                num_tokens: t,
                top_k: k,
                num_requests: t,
                max_pages: 512,
                block_size: 64,
                hot_slots: 4096,
                attention_block_stride: 64,
                host_num_blocks: 1 << 14,
                num_state_rows: None,
                stats_slot: 0,
            };
            for v in ResolveVariant::ALL {
                accepted(&resolve(&H200, &r, &ResolveAddrs::default(), false, v).unwrap());
                accepted(&resolve(&H200, &r, &ResolveAddrs::default(), true, v).unwrap());
            }
            let l = PageLayout::contiguous(0, 41984, 1024, 64, 656);
            let layers = [LayerPair { host: l, device: l }; 4];
            for v in GatherVariant::ALL {
                let g = GatherDesc {
                    num_tokens: t,
                    top_k: k,
                    layers: &layers,
                };
                accepted(&gather(&H200, &g, &GatherAddrs::default(), v).unwrap());
            }
        }
    }

    #[test]
    fn earlier_gathers_refuse_scale_words_below_16_bytes() {
        let l = PageLayout {
            value_bytes: 576,
            ..PageLayout::contiguous(0, 37_440, 64, 64, 584)
        };
        let layers = [LayerPair { host: l, device: l }];
        let g = GatherDesc {
            num_tokens: 2,
            top_k: 64,
            layers: &layers,
        };
        for v in GatherVariant::ALL {
            let r = gather(&H200, &g, &GatherAddrs::default(), v);
            if matches!(v, GatherVariant::V3 | GatherVariant::V4) {
                accepted(&r.unwrap());
            } else {
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains("gather variants v1-v2 and v3-w16 = 8"),
                    "{v:?}: {e}"
                );
            }
        }
    }
}
