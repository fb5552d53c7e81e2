use core::ops::Range;

use hisparse_core::ops::{
    BlockPair, Direction, GatherDesc, HotResetDesc, InvalidateDesc, LayerPair, RemapDesc,
    RemapModesDesc, ResolveDesc, RowCopyDesc, RowSpan, SlotMappingDesc, TableWrite, TableWriteDesc,
};

use super::copy::rectangles;
use super::*;
use crate::{
    REMAP_COUNTS, REMAP_MAX_THREADS, REMAP_PAIR, RESOLVE_STATIC_SHARED_BYTES, resolve_shared_bytes,
    resolve_workspace_entries,
};

/// The H200 as the CUDA backend sees it: `hs_resolve` compiles to 64 registers a thread, so one
/// block of 1024 threads fills a multiprocessor's registers.
const H200: Target = Target {
    multiprocessors: 132,
    shared_per_block: 227 * 1024,
    shared_per_multiprocessor: 228 * 1024,
    resolve_blocks_per_multiprocessor: 1,
};
const MI300: Target = Target {
    multiprocessors: 304,
    shared_per_block: 64 * 1024,
    shared_per_multiprocessor: 64 * 1024,
    resolve_blocks_per_multiprocessor: 2,
};

fn resolve_desc(t: u32, k: u32, n: u32) -> ResolveDesc {
    ResolveDesc {
        num_tokens: t,
        top_k: k,
        num_requests: t.max(1),
        max_pages: 1024,
        block_size: 64,
        hot_slots: n,
        attention_block_stride: 64,
        host_num_blocks: 1 << 16,
        num_state_rows: None,
        stats_slot: 0,
    }
}

#[test]
fn every_launch_matches_its_abi() {
    let a = ResolveAddrs::default();
    let mut plans = vec![
        resolve(&H200, &resolve_desc(64, 2048, 4096), &a, false).unwrap(),
        resolve(&MI300, &resolve_desc(3, 2048, 32768), &a, false).unwrap(),
        remap(
            &H200,
            &RemapDesc {
                num_tokens: 3,
                top_k: 2048,
                table_rows: 3,
                max_blocks: 8,
                block_size: 64,
                block_stride_rows: 64,
                idx_mapping_len: Some(3),
                write_counts: true,
                compact: true,
                stats_slot: 0,
            },
            &RemapAddrs::default(),
        )
        .unwrap(),
        invalidate(
            &H200,
            &InvalidateDesc {
                num_requests: 2,
                hot_slots: 16,
                num_ranges: 1,
            },
            1,
            2,
        ),
        slot_mapping(
            &SlotMappingDesc {
                num_tokens: 9,
                ratio: 4,
                block_size: 64,
                table_rows: 1,
                max_blocks: 4,
            },
            &SlotMappingAddrs::default(),
        ),
        write_table(
            &H200,
            &TableWriteDesc { table_len: 4 },
            &[TableWrite { index: 1, value: 2 }],
            8,
        )
        .unwrap(),
        reset_hot_state(
            &H200,
            &HotResetDesc {
                num_requests: 2,
                hot_slots: 8,
            },
            &[1, 1],
            8,
            16,
        )
        .unwrap(),
    ];
    let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
    plans.push(
        gather(
            &H200,
            &GatherDesc {
                num_tokens: 2,
                top_k: 40,
                layers: &[LayerPair { host: l, device: l }; 20],
            },
            &GatherAddrs::default(),
            GatherWalk::Auto,
        )
        .unwrap(),
    );
    plans.push(
        copy_pages(
            &H200,
            &[(l, l); 3],
            &[BlockPair { src: 1, dst: 2 }],
            0,
            0,
            true,
        )
        .unwrap(),
    );
    for p in plans {
        assert!(!p.launches.is_empty());
        for mut l in p.launches {
            l.args.matches(&l.kernel.abi()).unwrap();
            assert!(l.block <= l.kernel.abi().block_threads);
            let staged: Vec<u64> = (0..p.staged.len() as u64).map(|i| 4096 * (i + 1)).collect();
            l.args.resolve(&staged, 1 << 20, 1 << 19).unwrap();
            assert!(l.args.pointers().is_ok());
        }
    }
}

/// The fused launch: one block per token row, the gather's arguments after the resolve's,
/// the counters placed only with a workspace; the pair below FUSED_MIN_ROWS.
#[test]
fn fused_launch_has_the_resolve_grid_and_the_gather_arguments() {
    let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
    let layers = [LayerPair { host: l, device: l }; 2];
    let fused = |t: u32| {
        let d = resolve_desc(t, 2048, 4096);
        let p = resolve_gather(&H200, &d, &ResolveAddrs::default(), &layers, 0, 0, false).unwrap();
        let l = p.launches[0].clone();
        assert_eq!(l.kernel, Kernel::ResolveGather);
        l.args.matches(&l.kernel.abi()).unwrap();
        (l.grid[0], l.args.has_pending())
    };
    let auto = GatherWalk::Auto;
    assert!(!swap_in_fused(&resolve_desc(1, 2048, 4096), &layers, auto));
    assert!(swap_in_fused(&resolve_desc(64, 2048, 4096), &layers, auto));
    // A host pool spread beyond GATHER_LOCAL_SPAN, or the in-order walk forced: the pair.
    let big = PageLayout::contiguous(0, 1 << 20, 2048, 16, 64);
    let spread = [LayerPair {
        host: big,
        device: l,
    }];
    assert!(!swap_in_fused(&resolve_desc(64, 2048, 4096), &spread, auto));
    assert!(!swap_in_fused(
        &resolve_desc(64, 2048, 4096),
        &layers,
        GatherWalk::InOrder
    ));
    // 64 requests: their tables need the global workspace and its counters.
    assert_eq!(fused(64), (64, true));
    assert_eq!(fused(256), (256, true));
    // One request: its table fits shared memory, so no workspace and no counters.
    assert_eq!(fused(1), (1, false));
}

/// A remap of `num_tokens` rows of `top_k` entries over 64-row blocks.
fn remap_desc(num_tokens: u32, top_k: u32, write_counts: bool, compact: bool) -> RemapDesc {
    RemapDesc {
        num_tokens,
        top_k,
        table_rows: 4,
        max_blocks: 64,
        block_size: 64,
        block_stride_rows: 64,
        idx_mapping_len: None,
        write_counts,
        compact,
        stats_slot: 0,
    }
}

/// The H200's launch of a remap of `num_tokens` rows of `top_k` entries (64-row blocks).
fn remap_launch(num_tokens: u32, top_k: u32, write_counts: bool, compact: bool) -> Launch {
    let d = remap_desc(num_tokens, top_k, write_counts, compact);
    remap(&H200, &d, &RemapAddrs::default())
        .unwrap()
        .launches
        .remove(0)
}

/// A plain remap of few rows ([`REMAP_WIDE_MAX_ROWS`] at most) takes `hs_remap_wide`, one entry
/// a thread; beyond, while the rows leave the device idle, `hs_remap` cuts each into column tiles
/// until the launch has about two blocks per multiprocessor; counts and compaction keep one
/// block per row.
#[test]
fn few_plain_remap_rows_are_cut_into_column_tiles() {
    assert_eq!(remap_tiles(&H200, 1, 2048), (8, 64));
    assert_eq!(remap_tiles(&H200, 16, 2048), (8, 64));
    assert_eq!(remap_tiles(&H200, 64, 2048), (4, 128));
    assert_eq!(remap_tiles(&H200, 128, 2048), (2, 256));
    assert_eq!(remap_tiles(&H200, 256, 2048), (1, 512));
    assert_eq!(remap_tiles(&H200, 1, 4096), (16, 64));
    assert_eq!(remap_tiles(&H200, 1, 100), (1, 64));
    assert_eq!(remap_tiles(&H200, 1, 2047), (32, 64));
    let shape = |write_counts: bool, compact: bool| {
        let l = remap_launch(1, 2048, write_counts, compact);
        (l.grid, l.block)
    };
    assert_eq!(shape(false, false), ([16, 1, 1], 128));
    assert_eq!(
        remap_launch(1, 2048, false, false).kernel,
        Kernel::RemapWide
    );
    let wide = remap_launch(REMAP_WIDE_MAX_ROWS, 2047, false, false);
    assert_eq!(
        (wide.kernel, wide.grid, wide.block),
        (Kernel::RemapWide, [16, REMAP_WIDE_MAX_ROWS, 1], 128)
    );
    let tiled = remap_launch(REMAP_WIDE_MAX_ROWS + 1, 2048, false, false);
    let (tiles, threads) = remap_tiles(&H200, REMAP_WIDE_MAX_ROWS + 1, 2048);
    assert_eq!(
        (tiled.kernel, tiled.grid, tiled.block),
        (Kernel::Remap, [REMAP_WIDE_MAX_ROWS + 1, tiles, 1], threads)
    );
    assert!(tiles > 1);
    assert_eq!(shape(true, false), ([1, 1, 1], 512));
    assert_eq!(shape(false, true), ([1, 1, 1], 512));
    // Either layout can be forced for a plain remap (a benchmark times both); the wide one
    // refuses counts and compaction.
    let desc =
        |num_tokens, write_counts, compact| remap_desc(num_tokens, 2048, write_counts, compact);
    let forced = |d: &RemapDesc, layout: RemapLayout| {
        remap_as(&H200, d, &RemapAddrs::default(), layout).map(|mut p| p.launches.remove(0).kernel)
    };
    assert_eq!(
        forced(&desc(1, false, false), RemapLayout::Vectors),
        Ok(Kernel::Remap)
    );
    assert_eq!(
        forced(&desc(1024, false, false), RemapLayout::Wide),
        Ok(Kernel::RemapWide)
    );
    assert!(forced(&desc(1, true, false), RemapLayout::Wide).is_err());
    assert!(forced(&desc(1, false, true), RemapLayout::Wide).is_err());
    assert!(forced(&desc(65_536, false, false), RemapLayout::Wide).is_err());
    // Every tile count covers the row exactly once.
    for tokens in [1, 3, 17, 64, 200, 300] {
        for k in [1, 4, 64, 100, 2047, 2048, 4096, 8192] {
            let (tiles, threads) = remap_tiles(&H200, tokens, k);
            let per = if k % 4 == 0 { 4 } else { 1 };
            assert!(threads % 64 == 0 && threads <= REMAP_MAX_THREADS);
            assert!(
                u64::from(tiles) * u64::from(threads) * per
                    >= u64::from(k).min(u64::from(REMAP_MAX_THREADS) * per)
            );
            assert!((tiles - 1) * threads * (per as u32) < k.max(64 * per as u32));
        }
    }
}

/// A plain remap of more rows than the device holds at once (at one vector per thread) gives
/// each thread two vectors: half the threads per block, twice the blocks at once.
#[test]
fn many_plain_remap_rows_give_each_thread_two_vectors() {
    let launch = remap_launch;
    let flags = |l: &Launch| {
        let params = Kernel::Remap.abi().params;
        let i = params.iter().position(|p| p.name == "flags").unwrap();
        u32::from_ne_bytes(l.args.value(i).unwrap().try_into().unwrap())
    };
    // 132 multiprocessors hold 528 blocks of 512 threads: 1,024 rows of 2,048 do not fit.
    for counts in [false, true] {
        let l = launch(1024, 2048, counts, false);
        assert_eq!((l.grid, l.block), ([1024, 1, 1], 256));
        assert_ne!(flags(&l) & REMAP_PAIR, 0);
        assert_eq!(flags(&l) & REMAP_COUNTS != 0, counts);
    }
    // 1,100 rows: as many blocks of 256 as the device holds at once, rows grid-stride.
    assert_eq!(launch(1100, 2048, true, false).grid, [1056, 1, 1]);
    // Rows that fit, compaction, and rows not of whole pairs of vectors keep one vector each.
    for (t, k, compact) in [(528, 2048, false), (256, 2048, false), (1024, 2048, true)] {
        let l = launch(t, k, true, compact);
        assert_eq!(flags(&l) & REMAP_PAIR, 0, "{t} x {k}, compact {compact}");
        assert_eq!(l.block, 512);
    }
    assert_eq!(flags(&launch(4096, 2052, false, false)) & REMAP_PAIR, 0);
    assert!(remap_pairs(&H200, 529, 2048, false) && !remap_pairs(&H200, 528, 2048, false));
    // Rows of 8,192 entries: two vectors per thread would need 1,024 threads.
    assert!(!remap_pairs(&H200, 10_000, 8192, false));
}

#[test]
fn remap_modes_take_their_own_kernel_with_the_plain_shape() {
    let plain = RemapDesc {
        num_tokens: 700,
        top_k: 2048,
        table_rows: 4,
        max_blocks: 64,
        block_size: 64,
        block_stride_rows: 64,
        idx_mapping_len: None,
        write_counts: true,
        compact: true,
        stats_slot: 0,
    };
    let a = RemapModesAddrs {
        prefill_req_id: 32,
        workspace_starts: 48,
        ..RemapModesAddrs::default()
    };
    let p = remap_modes(&H200, &RemapModesDesc::plain(plain), &a).unwrap();
    assert_eq!(
        p.launches[0].kernel,
        Kernel::Remap,
        "no mode: the plain kernel"
    );
    let base = remap(&H200, &plain, &a.remap).unwrap().launches.remove(0);
    for (dcp, prefill) in [
        (
            Some(hisparse_core::ops::DcpSplit {
                size: 4,
                rank: 1,
                interleave: 2,
            }),
            None,
        ),
        (None, Some(3)),
    ] {
        let d = RemapModesDesc {
            remap: plain,
            dcp,
            prefill_requests: prefill,
        };
        let mut l = remap_modes(&H200, &d, &a).unwrap().launches.remove(0);
        assert_eq!(l.kernel, Kernel::RemapModes);
        assert_eq!(
            (l.grid, l.block, l.shared),
            (base.grid, base.block, base.shared)
        );
        l.args.matches(&Kernel::RemapModes.abi()).unwrap();
        let ptrs = l.args.pointers().unwrap();
        // The workspace buffers are passed only with a workspace.
        assert_eq!(ptrs.len(), Kernel::RemapModes.abi().params.len());
        let at = |name: &str| {
            let params = Kernel::RemapModes.abi().params;
            let i = params.iter().position(|p| p.name == name).unwrap();
            u64::from_ne_bytes(l.args.value(i).unwrap().try_into().unwrap())
        };
        assert_eq!(
            (at("prefill_req_id"), at("workspace_starts")),
            if prefill.is_some() { (32, 48) } else { (0, 0) }
        );
    }
}

/// The `stats` argument of a launch (its address).
fn stats_arg(l: &Launch) -> u64 {
    let i = l.kernel.abi().params.iter().position(|p| p.name == "stats");
    u64::from_ne_bytes(l.args.value(i.unwrap()).unwrap().try_into().unwrap())
}

#[test]
fn stats_take_their_slot_address_and_an_empty_batch_one_block() {
    let remap_desc = |num_tokens, stats_slot| RemapDesc {
        num_tokens,
        top_k: 8,
        table_rows: 1,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 4,
        idx_mapping_len: None,
        write_counts: false,
        compact: false,
        stats_slot,
    };
    let counted = RemapAddrs {
        stats: 4096,
        ..RemapAddrs::default()
    };
    let p = remap(&H200, &remap_desc(3, 2), &counted).unwrap();
    assert_eq!(stats_arg(&p.launches[0]), 4096 + 32);
    // Without stats the argument is null and an empty batch launches nothing.
    let p = remap(&H200, &remap_desc(3, 2), &RemapAddrs::default()).unwrap();
    assert_eq!(stats_arg(&p.launches[0]), 0);
    assert!(
        remap(&H200, &remap_desc(0, 0), &RemapAddrs::default())
            .unwrap()
            .launches
            .is_empty()
    );
    // With stats an empty batch is one block that counts the call.
    let p = remap(&H200, &remap_desc(0, 1), &counted).unwrap();
    assert_eq!((p.launches.len(), p.launches[0].grid), (1, [1, 1, 1]));
    assert_eq!(stats_arg(&p.launches[0]), 4096 + 16);

    let d = ResolveDesc {
        stats_slot: 5,
        ..resolve_desc(0, 64, 128)
    };
    let counted = ResolveAddrs {
        stats: Some(8192),
        ..ResolveAddrs::default()
    };
    assert!(
        resolve(&H200, &d, &ResolveAddrs::default(), false)
            .unwrap()
            .launches
            .is_empty()
    );
    let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
    let layers = [LayerPair { host: l, device: l }];
    for p in [
        resolve(&H200, &d, &counted, false).unwrap(),
        resolve_gather(&H200, &d, &counted, &layers, 64, 128, false).unwrap(),
    ] {
        assert_eq!(p.launches.len(), 1);
        let l = &p.launches[0];
        assert_eq!((l.kernel, l.grid), (Kernel::Resolve, [1, 1, 1]));
        assert_eq!(stats_arg(l), 8192 + 80);
        assert_eq!(p.workspace_bytes, 0, "an empty batch takes no workspace");
    }
    let p = resolve_gather(
        &H200,
        &resolve_desc(64, 64, 128),
        &counted,
        &layers,
        64,
        128,
        false,
    )
    .unwrap();
    assert_eq!(p.launches[0].kernel, Kernel::ResolveGather);
    assert_eq!(stats_arg(&p.launches[0]), 8192);
    // A slot address beyond the address space is refused, not wrapped.
    let far = ResolveAddrs {
        stats: Some(u64::MAX - 8),
        ..ResolveAddrs::default()
    };
    assert!(resolve(&H200, &d, &far, false).is_err());
}

#[test]
fn remap_blocks_cover_a_row_with_vectors() {
    assert_eq!(remap_threads(2048), 512);
    assert_eq!(remap_threads(512), 128);
    assert_eq!(remap_threads(8), 64);
    assert_eq!(remap_threads(2052), REMAP_MAX_THREADS);
    assert_eq!(remap_threads(130), 192);
    assert_eq!(remap_threads(100), 64);
    assert_eq!(remap_threads(1 << 20), REMAP_MAX_THREADS);
}

#[test]
fn resolver_memory_follows_one_rule_on_every_device() {
    // H200, 64 requests of one row: the table the whole launch could need does not fit; the
    // largest that does (8192 entries, room for two rows) is shared, the rest in workspace.
    let s = resolve_shape(&H200, &resolve_desc(64, 2048, 4096), false);
    assert!(!s.global_state);
    assert_eq!(s.shared_table, 8192);
    assert_eq!(s.shared_bytes, resolve_shared_bytes(4096, 8192));
    assert_eq!(s.workspace_entries, resolve_workspace_entries(64, 2048));
    // One row: a quarter-full table (twice what it needs), nothing in the workspace.
    let s = resolve_shape(&H200, &resolve_desc(1, 2048, 4096), false);
    assert_eq!((s.shared_table, s.workspace_entries), (8192, 0));
    // More rows than multiprocessors, but one block fills a multiprocessor's registers: each
    // block keeps the whole table (a second wave waits either way).
    let s = resolve_shape(&H200, &resolve_desc(200, 2048, 4096), false);
    assert_eq!(s.shared_table, 8192);
    assert_eq!(s.shared_bytes, resolve_shared_bytes(4096, 8192));
    // A kernel two blocks of which fit a multiprocessor: they split its shared memory, once the
    // rows give each multiprocessor two.
    let two = Target {
        resolve_blocks_per_multiprocessor: 2,
        ..H200
    };
    let s = resolve_shape(&two, &resolve_desc(200, 2048, 4096), false);
    assert!(s.shared_bytes <= 114 * 1024 - RESOLVE_STATIC_SHARED_BYTES);
    assert_eq!(s.shared_table, 4096);
    let s = resolve_shape(&two, &resolve_desc(132, 2048, 4096), false);
    assert_eq!(s.shared_table, 8192);
    // An occupancy the backend could not learn (0) counts as one block.
    let unknown = Target {
        resolve_blocks_per_multiprocessor: 0,
        ..H200
    };
    assert_eq!(
        resolve_shape(&unknown, &resolve_desc(200, 2048, 4096), false),
        resolve_shape(&H200, &resolve_desc(200, 2048, 4096), false)
    );
    // 64 KiB (AMD): state of 32768 slots does not fit, global-state mode.
    let s = resolve_shape(&MI300, &resolve_desc(2, 2048, 32768), false);
    assert!(s.global_state);
    assert!(s.shared_bytes <= 64 * 1024 - RESOLVE_STATIC_SHARED_BYTES);
    let s = resolve_shape(&MI300, &resolve_desc(2, 2048, 4096), false);
    assert!(!s.global_state);
    assert_eq!(s.shared_table, 2048);
    assert!(s.workspace_entries > 0);
    // Forced global-state mode.
    assert!(resolve_shape(&H200, &resolve_desc(2, 64, 4096), true).global_state);
    // A device without shared memory to speak of: everything in the workspace.
    let tiny = Target {
        shared_per_block: 256,
        ..MI300
    };
    let s = resolve_shape(&tiny, &resolve_desc(2, 64, 4096), false);
    assert!(s.global_state);
    assert_eq!(s.shared_table, 0);
}

/// The host work of a call is its plan: the decode path stages nothing (one launch, its
/// arguments by value), and a copy's layer table is marked constant, so a backend keeps it
/// once instead of staging it on every call (`crate::arena`); only the call's own list is
/// staged.
#[test]
fn decode_plans_stage_nothing_and_copies_mark_their_layer_table_constant() {
    let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
    let layers = [LayerPair { host: l, device: l }; 3];
    let a = ResolveAddrs::default();
    for p in [
        resolve(&H200, &resolve_desc(64, 2048, 4096), &a, false).unwrap(),
        resolve(&H200, &resolve_desc(4, 2048, 4096), &a, false).unwrap(),
        resolve_gather(
            &H200,
            &resolve_desc(64, 2048, 4096),
            &a,
            &layers,
            64,
            128,
            false,
        )
        .unwrap(),
        gather(
            &H200,
            &GatherDesc {
                num_tokens: 4,
                top_k: 2048,
                layers: &layers,
            },
            &GatherAddrs {
                host: 64,
                device: 128,
                ..GatherAddrs::default()
            },
            GatherWalk::Auto,
        )
        .unwrap(),
    ] {
        assert!(p.staged.is_empty(), "{p:?}");
        assert_eq!(p.launches.len(), 1);
    }
    let span = |device_block| RowSpan {
        device_block,
        host_block: 1,
        first_row: 0,
        num_rows: 3,
    };
    let desc = RowCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    let a = copy_rows(&H200, &desc, &[span(1)], 64, 128).unwrap();
    let b = copy_rows(&H200, &desc, &[span(2), span(3)], 64, 128).unwrap();
    let kinds = |p: &Plan| p.staged.iter().map(|s| s.kind).collect::<Vec<_>>();
    assert_eq!(kinds(&a), [PartKind::Constant, PartKind::PerCall]);
    // The same layers give the same constant bytes whatever the spans: one arena entry.
    assert_eq!(a.staged[0].bytes, b.staged[0].bytes);
    assert_ne!(a.staged[1].bytes, b.staged[1].bytes);
    let pages = copy_pages(
        &H200,
        &[(l, l)],
        &[BlockPair { src: 1, dst: 2 }],
        64,
        128,
        false,
    )
    .unwrap();
    assert_eq!(kinds(&pages), [PartKind::Constant, PartKind::PerCall]);
}

#[test]
fn copies_split_only_where_tiles_conflict() {
    let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
    let pairs = [
        BlockPair { src: 1, dst: 2 },
        BlockPair { src: 3, dst: 4 },
        BlockPair { src: 5, dst: 6 },
    ];
    // Between buffers: one launch over 3 layers × 3 pairs... with distinct layer bases.
    let jobs: Vec<(PageLayout, PageLayout)> = (0..3)
        .map(|i| {
            let m = PageLayout {
                base: i * 8 * 1024,
                ..l
            };
            (m, m)
        })
        .collect();
    let p = copy_pages(&H200, &jobs, &pairs, 0, 1 << 30, false).unwrap();
    assert_eq!(p.launches.len(), 1);
    assert_eq!(p.staged.len(), 2);
    // A chain in one buffer (2 -> 3 after 1 -> 2): split before the second pair.
    let chain = [BlockPair { src: 1, dst: 2 }, BlockPair { src: 2, dst: 3 }];
    let p = copy_pages(&H200, &[(l, l)], &chain, 0, 0, true).unwrap();
    assert_eq!(p.launches.len(), 2);
    // Rectangles: batches cut inside layers become per-layer pair ranges.
    let all: Vec<Range<usize>> = core::iter::once(0..9).collect();
    let whole = rectangles(&all, 3);
    assert_eq!((whole.len(), whole[0].clone()), (1, (0..3, 0..3)));
    assert_eq!(
        rectangles(&[0..4, 4..9], 3),
        [(0..1, 0..3), (1..2, 0..1), (1..2, 1..3), (2..3, 0..3)]
    );
}

#[test]
fn copies_plan_scale_words_and_refuse_what_the_kernels_cannot_address() {
    let split = |row: u32, value: u32| PageLayout {
        value_bytes: value,
        ..PageLayout::contiguous(0, 37_440, 8, 64, row)
    };
    // One rule for the scale words, in every layout a planner packs.
    for (row, value, word) in [
        (656, 656, 16),
        (656, 640, 16),
        (584, 576, 8),
        (132, 128, 4),
        (20, 16, 4),
    ] {
        let l = split(row, value);
        assert_eq!(crate::scale_word(&l), word, "{row} = {value} + scale");
        assert_eq!(crate::Layout::from(&l).scale_word, word);
        check_layout(&l).unwrap();
        let g = gather(
            &H200,
            &GatherDesc {
                num_tokens: 1,
                top_k: 8,
                layers: &[LayerPair { host: l, device: l }],
            },
            &GatherAddrs::default(),
            GatherWalk::Auto,
        )
        .unwrap();
        assert_eq!(g.launches.len(), 1);
    }
    let refused = |l: PageLayout| {
        let e = copy_pages(
            &H200,
            &[(l, l)],
            &[BlockPair { src: 0, dst: 1 }],
            0,
            0,
            false,
        )
        .unwrap_err();
        let PlanError::Geometry { what, .. } = e else {
            panic!("{e:?}");
        };
        what
    };
    assert_eq!(
        refused(PageLayout {
            base: 8,
            ..split(584, 576)
        }),
        "layout.base"
    );
    assert_eq!(
        refused(PageLayout {
            block_stride: 37_448,
            ..split(584, 576)
        }),
        "layout.block_stride"
    );
    assert_eq!(
        refused(split(22, 16)),
        "layout scale part (row_bytes - value_bytes)"
    );
    // A contiguous row is all values: whole 16-byte chunks.
    assert_eq!(refused(split(584, 584)), "layout.value_bytes");
    assert_eq!(refused(split(584, 568)), "layout.value_bytes");
    assert_eq!(refused(split(576, 592)), "layout.row_bytes");
    // Pool addresses the 16-byte chunks cannot start at.
    let l = split(584, 576);
    let e = copy_pages(
        &H200,
        &[(l, l)],
        &[BlockPair { src: 0, dst: 1 }],
        4,
        0,
        false,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("copy_pages source address = 4"),
        "{e}"
    );
    let e = gather(
        &H200,
        &GatherDesc {
            num_tokens: 1,
            top_k: 8,
            layers: &[LayerPair { host: l, device: l }],
        },
        &GatherAddrs {
            device: 8,
            ..GatherAddrs::default()
        },
        GatherWalk::Auto,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("gather device pool address = 8"),
        "{e}"
    );
    let spans = [RowSpan {
        device_block: 0,
        host_block: 1,
        first_row: 0,
        num_rows: 3,
    }];
    let bad = PageLayout {
        base: 4,
        ..split(132, 128)
    };
    let desc = RowCopyDesc {
        direction: Direction::HostToDevice,
        layers: &[LayerPair {
            host: split(132, 128),
            device: bad,
        }],
    };
    assert!(matches!(
        copy_rows(&H200, &desc, &spans, 0, 0),
        Err(PlanError::Geometry {
            what: "layout.base",
            value: 4,
            ..
        })
    ));
}

#[test]
fn gather_grid_holds_every_item_or_fills_the_device() {
    let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
    let layer = [LayerPair { host: l, device: l }];
    let g = |t: u32| {
        gather(
            &H200,
            &GatherDesc {
                num_tokens: t,
                top_k: 2048,
                layers: &layer,
            },
            &GatherAddrs::default(),
            GatherWalk::Auto,
        )
        .unwrap()
        .launches[0]
            .grid
    };
    assert_eq!(g(1), [128, 1, 1]);
    assert_eq!(g(64), [132 * 8, 1, 1]);
    assert!(
        gather(
            &H200,
            &GatherDesc {
                num_tokens: 0,
                top_k: 8,
                layers: &layer
            },
            &GatherAddrs::default(),
            GatherWalk::Auto,
        )
        .unwrap()
        .launches
        .is_empty()
    );
}

/// The gather's walk: every row at once fills the device (walk argument 0); rows in order shares
/// GATHER_IN_ORDER_BLOCKS blocks among at most GATHER_ROWS_IN_FLIGHT rows (walk argument: blocks
/// per row); Auto takes rows in order exactly when a layer's host pages spread beyond
/// GATHER_LOCAL_SPAN.
#[test]
fn gather_walks_rows_in_order_over_a_spread_host_pool() {
    let small = PageLayout::contiguous(0, 1024, 8, 16, 64);
    // 1025 pages of 1 MiB: 1 MiB past the span; 1024 pages: exactly the span.
    let wide = PageLayout::contiguous(0, 1 << 20, 1025, 16, 64);
    let edge = PageLayout::contiguous(0, 1 << 20, 1024, 16, 64);
    let plan_of = |host: PageLayout, rows: u32, walk: GatherWalk| {
        let layers = [LayerPair {
            host,
            device: small,
        }];
        let d = GatherDesc {
            num_tokens: rows,
            top_k: 2048,
            layers: &layers,
        };
        let addrs = GatherAddrs {
            host: 64,
            device: 128,
            ..GatherAddrs::default()
        };
        let p = gather(&H200, &d, &addrs, walk).unwrap();
        let l = p.launches[0].clone();
        l.args.matches(&l.kernel.abi()).unwrap();
        let walk_arg = u32::from_ne_bytes(l.args.value(8).unwrap().try_into().unwrap());
        (l.grid[0], walk_arg)
    };
    let every =
        u32::try_from(u64::from(H200.multiprocessors) * GATHER_BLOCKS_PER_MULTIPROCESSOR).unwrap();
    assert_eq!(plan_of(small, 64, GatherWalk::Auto), (every, 0));
    assert_eq!(plan_of(edge, 64, GatherWalk::Auto), (every, 0));
    let per_row = GATHER_IN_ORDER_BLOCKS / GATHER_ROWS_IN_FLIGHT;
    let in_order = (GATHER_IN_ORDER_BLOCKS, per_row);
    assert_eq!(plan_of(wide, 64, GatherWalk::Auto), in_order);
    assert_eq!(plan_of(small, 64, GatherWalk::InOrder), in_order);
    assert_eq!(plan_of(wide, 64, GatherWalk::AllRows), (every, 0));
    // Fewer rows than GATHER_ROWS_IN_FLIGHT share the same blocks: one row takes them all, three
    // take 10 each.
    assert_eq!(
        plan_of(wide, 1, GatherWalk::Auto),
        (GATHER_IN_ORDER_BLOCKS, GATHER_IN_ORDER_BLOCKS)
    );
    assert_eq!(gather_in_order_grid(3), (10, 30));
    assert_eq!(gather_in_order_grid(0), gather_in_order_grid(1));
}
