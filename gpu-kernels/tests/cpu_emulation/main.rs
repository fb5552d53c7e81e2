//! Executes the shared kernel source on the CPU (compiled as C++20 with `emu/vendor_cpu.h`) and
//! compares every kernel bit for bit with the core's reference on
//! random inputs, launched exactly as the backends launch them (the planners of `plan` decide every
//! grid, block, shared memory size, staged list and workspace). The per-kernel launch
//! wrappers are generated from the ABI table, so a table that disagrees with the source fails to
//! compile here.
//!
//! Accesses are alignment-checked (`-fsanitize=alignment`): a kernel access a GPU would fault on
//! aborts the check. Rows include scale parts of 8 and 4 bytes (DeepSeek V4's 584 = 576 + 8 in
//! padded pages, 132 = 128 + 4, 20 = 16 + 4 with odd row counts) for every copy kernel.
//!
//! Needs a C++20 compiler with UBSan (`$CXX`, else `c++`, `g++` or `clang++`). Without one the check prints
//! `SKIPPED` and succeeds, unless `HISPARSE_REQUIRE_CXX=1`. `HISPARSE_EMU_CASES=n` runs `n` random
//! seeds instead of 8 (about a second a seed). The emulation runs on one OS thread: each block's
//! GPU threads are fibers that park at every barrier, a warp runs on once its own lanes met, the
//! order between barriers is drawn per interval (threads forward, backward, shuffled, or warp
//! after warp), and a barrier some threads never reach aborts the check (`emu/driver.cpp`).

use std::ffi::c_void;
use std::path::PathBuf;

use gk::plan::{self, Plan, Target};
use gk::{Kernel, Param};
use hisparse_conformance::SplitMix64;
use hisparse_conformance::check::{Check, EmulationBuildError, REQUIRE_CXX_ENV, build_emulation};
use hisparse_core::ops::copy::{copy_host_pages, copy_pages, copy_rows, gather_rows};
use hisparse_core::ops::indexer_backup::indexer_backup;
use hisparse_core::ops::invalidate::invalidate;
use hisparse_core::ops::remap::{remap, remap_modes};
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping;
use hisparse_core::ops::table::{reset_hot_state, write_table};
use hisparse_core::ops::{
    BlockPair, DcpSplit, Direction, GatherArgs, GatherDesc, HotResetDesc, IndexerBackupArgs,
    IndexerBackupDesc, InvalidateArgs, InvalidateDesc, LayerPair, PageCopyDesc, PageLayout,
    RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, ResolveDesc, ResolveSlices, RowCopyDesc,
    RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
};
use hisparse_gpu_kernels as gk;

mod copies;
mod emu;
mod remap;
mod resolve;
mod tables;

use copies::*;
use emu::*;
use remap::*;
use resolve::*;
use tables::*;

/// The device address of a host vector (the emulated device reads and writes host memory).
pub(crate) fn a<T>(v: &[T]) -> u64 {
    v.as_ptr() as u64
}

/// The device address of a host vector the kernel writes.
pub(crate) fn am<T>(v: &mut [T]) -> u64 {
    v.as_mut_ptr() as u64
}

/// Devices the planners are asked about: a large one (shared memory of an H200), and small ones
/// whose limits push the planners onto their other paths (tiny grids, small shared tables; two
/// resolver blocks per multiprocessor, so a launch of more rows than multiprocessors splits the
/// shared memory and its tables shrink further).
pub(crate) fn target(multiprocessors: u32, shared_per_block: u64) -> Target {
    Target {
        multiprocessors,
        shared_per_block,
        shared_per_multiprocessor: shared_per_block + 1024,
        resolve_blocks_per_multiprocessor: 2,
    }
}

pub(crate) const BIG: Target = Target {
    multiprocessors: 132,
    shared_per_block: 227 * 1024,
    shared_per_multiprocessor: 228 * 1024,
    resolve_blocks_per_multiprocessor: 1,
};

/// The workspace counters after a resolve: the allocator and the finished-blocks count back to
/// zero, the most entries taken within what the host sized.
pub(crate) fn check_counter(words: Vec<u32>, sized: u64, what: &str) -> Result<(), String> {
    if let Some((at, w)) = words
        .iter()
        .enumerate()
        .find(|&(i, &w)| i != gk::WORKSPACE_HIGH_WATER_WORD && w != 0)
    {
        return Err(format!(
            "{what} left counter word {at} at {w}: the next launch would not find it zero"
        ));
    }
    if u64::from(words[gk::WORKSPACE_HIGH_WATER_WORD]) > sized {
        return Err(format!(
            "{what} took {} workspace entries, the host sized {sized}",
            words[gk::WORKSPACE_HIGH_WATER_WORD]
        ));
    }
    Ok(())
}

/// A stats buffer of three slots (`hisparse_core::ops::stats`) for a call that adds to one of
/// them, or `None` for a call without stats (`pct` percent of calls have them): random words,
/// half within a few thousand of `u32::MAX` so the kernels' sums wrap; and the slot.
pub(crate) fn maybe_stats(rng: &mut SplitMix64, pct: u64) -> (Option<Vec<i32>>, u32) {
    if !rng.percent(pct) {
        return (None, 0);
    }
    let words = (0..12)
        .map(|_| {
            if rng.percent(50) {
                (u32::MAX - rng.below(5000) as u32) as i32
            } else {
                rng.next_u64() as i32
            }
        })
        .collect();
    (Some(words), rng.below(3) as u32)
}

/// The device address of an optional buffer the kernel writes (0: none).
pub(crate) fn am_opt(v: &mut Option<Vec<i32>>) -> u64 {
    v.as_deref_mut().map_or(0, am)
}

pub(crate) fn fill(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

fn main() {
    let check = Check::one("kernels_match_reference_on_cpu");
    let emu = match build() {
        Ok(e) => e,
        Err(e @ EmulationBuildError::NoCompiler) => check.missing(REQUIRE_CXX_ENV, e),
        Err(e) => check.finish(Err(e)),
    };
    let cases: u64 = std::env::var("HISPARSE_EMU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let mut failures = Vec::new();
    for seed in 0..cases {
        let mut rng = SplitMix64::new(0xC0FFEE ^ seed.wrapping_mul(0x9E37_79B9));
        let smem = match seed % 3 {
            0 => None,
            1 => Some(0),
            _ => Some(64),
        };
        let shared = ResolveMode {
            smem_table: smem,
            global: false,
            hot_slots: None,
            multiprocessors: if seed % 2 == 0 { 132 } else { 2 },
        };
        // The same launches with the per-request state in the workspace, and the largest
        // hot-slot count (32768, beyond any AMD GPU's shared memory) in global-state mode.
        let global = ResolveMode {
            global: true,
            ..shared
        };
        let global_max = ResolveMode {
            global: true,
            hot_slots: Some(hisparse_core::ops::MAX_HOT_SLOTS),
            ..shared
        };
        for (name, r) in [
            // Several remaps a seed: one call draws one mode, one batch and one device, and the
            // column tiles of a few plain rows (with or without stats) are one draw of many.
            (
                "remap",
                (0..REMAPS_PER_SEED).try_for_each(|_| check_remap(&emu, &mut rng, false)),
            ),
            (
                "remap with modes",
                (0..REMAPS_PER_SEED).try_for_each(|_| check_remap(&emu, &mut rng, true)),
            ),
            ("resolve", check_resolve(&emu, &mut rng, shared)),
            (
                "resolve (global state)",
                check_resolve(&emu, &mut rng, global),
            ),
            (
                "resolve (global state, max hot slots)",
                check_resolve(&emu, &mut rng, global_max),
            ),
            ("copies", {
                let g = row_geometry(&mut rng);
                check_copies(&emu, &mut rng, g)
            }),
            // Every geometry with 8- and 4-byte scale words, every seed.
            (
                "copies (584 = 576 + 8)",
                check_copies(&emu, &mut rng, WORD_GEOMETRIES[0]),
            ),
            (
                "copies (132 = 128 + 4)",
                check_copies(&emu, &mut rng, WORD_GEOMETRIES[1]),
            ),
            (
                "copies (20 = 16 + 4)",
                check_copies(&emu, &mut rng, WORD_GEOMETRIES[2]),
            ),
            ("small ops", check_small_ops(&emu, &mut rng)),
            ("indexer backup", check_indexer_backup(&emu, &mut rng)),
            ("tables", check_tables(&emu, &mut rng)),
        ] {
            if let Err(e) = r {
                failures.push(format!("seed {seed} {name}: {e}"));
            }
        }
    }
    for f in &failures {
        println!("FAILED: {f}");
    }
    let result = if failures.is_empty() {
        println!("ok: {cases} random seeds of every kernel match the reference on the CPU");
        Ok(())
    } else {
        Err(format!("{} failures", failures.len()))
    };
    check.finish(result)
}
