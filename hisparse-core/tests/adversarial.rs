//! Adversarial use of the core's public API: random and edge-value descriptors for every
//! reference operation, the helpers, hand-edited layouts and hostile coordinator call sequences.
//! Every call must return — a typed error or a result — without a panic or an abort (the test
//! profile builds with `overflow-checks`, so an arithmetic overflow is a panic too), a reference
//! operation that fails must leave its outputs untouched, and a coordinator must keep every
//! invariant after every call, failed ones included.
//!
//! Deterministic: `HISPARSE_ADVERSARIAL_SEED=<n>` explores other inputs (a failure prints its
//! seed and round); `HISPARSE_ADVERSARIAL_ROUNDS=<n>` scales the rounds (the default keeps each
//! test to a few seconds in a debug build).
// These tests drive the planning side (layouts, the coordinator), which needs `alloc`.
#![cfg(feature = "alloc")]

use std::panic::{AssertUnwindSafe, catch_unwind};

use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, RequestId};
use hisparse_core::error::OpName;
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec, RegularLayer};
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
    RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc, check_pinned_budget,
    physical_row,
};
use hisparse_core::presets;

/// xorshift64*: small, deterministic, good enough to pick edge values.
struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Self {
        let seed = std::env::var("HISPARSE_ADVERSARIAL_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0x5eed_u64);
        Rng((seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// A `u32` that is usually small and sometimes an edge value.
    fn size(&mut self, small: u32) -> u32 {
        const EDGES: [u32; 9] = [
            0,
            1,
            2,
            16,
            32768,
            32769,
            i32::MAX as u32,
            i32::MAX as u32 + 1,
            u32::MAX,
        ];
        if self.chance(15) {
            EDGES[self.below(EDGES.len() as u64) as usize]
        } else {
            self.below(u64::from(small) + 1) as u32
        }
    }
    /// An `i32` table entry: mostly in `-1..limit`, sometimes anything.
    fn entry(&mut self, limit: i32) -> i32 {
        const EDGES: [i32; 6] = [-1, -2, 0, i32::MAX, i32::MIN, 1 << 30];
        match self.below(10) {
            0 => EDGES[self.below(EDGES.len() as u64) as usize],
            1 => -1,
            _ => self.below(limit.max(1) as u64 + 1) as i32,
        }
    }
    fn entries(&mut self, len: usize, limit: i32) -> Vec<i32> {
        (0..len).map(|_| self.entry(limit)).collect()
    }
    /// Entries for a buffer of `need` elements ([`Rng::len_for`]).
    fn buf(&mut self, need: u64, limit: i32) -> Vec<i32> {
        let n = self.len_for(need);
        self.entries(n, limit)
    }
    /// A buffer length for `need` elements: usually exact, sometimes short or long.
    fn len_for(&mut self, need: u64) -> usize {
        if need > 1 << 12 {
            // A shape this large is refused whatever the buffers; keep them small.
            return self.below(64) as usize;
        }
        let need = need as usize;
        match self.below(10) {
            0 => need.saturating_sub(1 + self.below(3) as usize),
            1 => need + self.below(5) as usize,
            _ => need,
        }
    }
}

fn rounds(default: u64) -> u64 {
    std::env::var("HISPARSE_ADVERSARIAL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `f` for `n` rounds; a panic fails the test naming the round.
fn each_round(what: &str, salt: u64, n: u64, mut f: impl FnMut(&mut Rng)) {
    let mut rng = Rng::new(salt);
    for round in 0..n {
        let before = rng.0;
        if catch_unwind(AssertUnwindSafe(|| f(&mut rng))).is_err() {
            panic!(
                "{what}: panicked in round {round} (rng state {before:#x}; seed from HISPARSE_ADVERSARIAL_SEED)"
            );
        }
    }
}

fn layout(rng: &mut Rng) -> PageLayout {
    let block_size = rng.size(8);
    let row_bytes = if rng.chance(90) {
        16 * (1 + rng.below(3) as u32)
    } else {
        rng.size(64)
    };
    let value_bytes = if rng.chance(80) {
        row_bytes
    } else {
        rng.size(row_bytes.saturating_add(16))
    };
    let page = u64::from(block_size) * u64::from(row_bytes);
    PageLayout {
        base: if rng.chance(90) {
            16 * rng.below(4)
        } else {
            rng.next()
        },
        block_stride: if rng.chance(85) {
            page + 16 * rng.below(3)
        } else {
            rng.next() >> rng.below(64)
        },
        num_blocks: rng.size(6),
        block_size,
        row_bytes,
        value_bytes,
        index_stride_rows: if rng.chance(85) {
            block_size.saturating_add(rng.below(3) as u32)
        } else {
            rng.size(16)
        },
    }
}

fn pool_len(l: &PageLayout, rng: &mut Rng) -> usize {
    let end = l.end(OpName::CopyPages).unwrap_or(0).min(1 << 15);
    rng.len_for(end)
}

#[test]
fn remap_on_hostile_descriptors() {
    let mut ok = 0u64;
    let n = rounds(4000);
    each_round("remap", 1, n, |rng| {
        let desc = RemapDesc {
            num_tokens: rng.size(6),
            top_k: rng.size(6),
            table_rows: rng.size(4),
            max_blocks: rng.size(5),
            block_size: rng.size(6),
            block_stride_rows: rng.size(12),
            idx_mapping_len: rng.chance(30).then(|| rng.size(5)),
            write_counts: rng.chance(50),
            compact: rng.chance(50),
            stats_slot: 0,
        };
        let tk = u64::from(desc.num_tokens) * u64::from(desc.top_k);
        let req_id = rng.buf(desc.num_tokens.into(), 5);
        let table_len = rng.len_for(u64::from(desc.table_rows) * u64::from(desc.max_blocks));
        let block_table = rng.entries(table_len, 40);
        let topk = rng.buf(tk, 40);
        let map = desc.idx_mapping_len.map(|n| rng.buf(n.into(), 5));
        let mut out = vec![123; rng.len_for(tk)];
        let mut counts = desc
            .write_counts
            .then(|| vec![123; rng.len_for(desc.num_tokens.into())]);
        let res = remap(
            &desc,
            RemapArgs {
                req_id: &req_id[..],
                block_table: &block_table[..],
                topk: &topk[..],
                idx_mapping: map.as_deref(),
                out: &mut out[..],
                counts: counts.as_deref_mut(),
                stats: None,
            },
        );
        match res {
            Ok(()) => ok += 1,
            Err(_) => assert!(out.iter().all(|&v| v == 123), "remap wrote on error"),
        }
        // The helpers take anything.
        for _ in 0..4 {
            let row = rng.size(8) as usize;
            let _ = desc.map_token(&block_table, row, rng.entry(64));
            let _ = desc.table_row(rng.entry(8), map.as_deref());
        }
    });
    assert!(
        ok * 10 > n,
        "only {ok} of {n} remaps ran: the test lost its teeth"
    );
}

/// The remap modes (decode context parallelism, prefill workspace) on hostile descriptors: a
/// typed error that writes nothing, or a result; without modes, exactly the plain remap.
#[test]
fn remap_modes_on_hostile_descriptors() {
    let mut ok = 0u64;
    let n = rounds(4000);
    each_round("remap_modes", 11, n, |rng| {
        let remap_desc = RemapDesc {
            num_tokens: rng.size(6),
            top_k: rng.size(6),
            table_rows: rng.size(4),
            max_blocks: rng.size(5),
            block_size: rng.size(6),
            block_stride_rows: rng.size(12),
            idx_mapping_len: None,
            write_counts: rng.chance(50),
            compact: rng.chance(50),
            stats_slot: 0,
        };
        let desc = RemapModesDesc {
            remap: remap_desc,
            dcp: rng.chance(60).then(|| DcpSplit {
                size: rng.size(4),
                rank: rng.size(4),
                interleave: rng.size(5),
            }),
            prefill_requests: rng.chance(40).then(|| rng.size(3)),
        };
        let tk = u64::from(remap_desc.num_tokens) * u64::from(remap_desc.top_k);
        let req_id = rng.buf(remap_desc.num_tokens.into(), 5);
        let table_len =
            rng.len_for(u64::from(remap_desc.table_rows) * u64::from(remap_desc.max_blocks));
        let block_table = rng.entries(table_len, 40);
        let topk = rng.buf(tk, 60);
        let prefill_ids = (desc.prefill_requests.is_some() || rng.chance(5))
            .then(|| rng.buf(remap_desc.num_tokens.into(), 4));
        let starts = (desc.prefill_requests.is_some() || rng.chance(5))
            .then(|| rng.buf(desc.prefill_requests.unwrap_or(1).into(), 1 << 30));
        let mut out = vec![123; rng.len_for(tk)];
        let mut counts = remap_desc
            .write_counts
            .then(|| vec![123; rng.len_for(remap_desc.num_tokens.into())]);
        let res = remap_modes(
            &desc,
            RemapModesArgs {
                remap: RemapArgs {
                    req_id: &req_id[..],
                    block_table: &block_table[..],
                    topk: &topk[..],
                    idx_mapping: None,
                    out: &mut out[..],
                    counts: counts.as_deref_mut(),
                    stats: None,
                },
                prefill_req_id: prefill_ids.as_deref(),
                workspace_starts: starts.as_deref(),
            },
        );
        match res {
            Ok(()) => {
                ok += 1;
                if !desc.has_modes() {
                    let mut plain = vec![123; out.len()];
                    remap(
                        &remap_desc,
                        RemapArgs {
                            req_id: &req_id[..],
                            block_table: &block_table[..],
                            topk: &topk[..],
                            idx_mapping: None,
                            out: &mut plain[..],
                            counts: None,
                            stats: None,
                        },
                    )
                    .map(|()| assert_eq!(plain[..tk as usize], out[..tk as usize]))
                    .ok();
                }
            }
            Err(_) => assert!(out.iter().all(|&v| v == 123), "remap_modes wrote on error"),
        }
        if let Some(d) = desc.dcp {
            for _ in 0..4 {
                let _ = d.local(rng.entry(1 << 20).unsigned_abs());
            }
        }
    });
    assert!(
        ok * 30 > n,
        "only {ok} of {n} remaps with modes ran: the test lost its teeth"
    );
}

/// The indexer backup on hostile layouts and slots: a typed error that writes nothing, or a
/// copy that stays inside the host cache.
#[test]
fn indexer_backup_on_hostile_layouts() {
    let mut ok = 0u64;
    let n = rounds(3000);
    each_round("indexer_backup", 12, n, |rng| {
        let host = layout(rng);
        let mut device = layout(rng);
        if rng.chance(70) {
            device.block_size = host.block_size;
            device.row_bytes = host.row_bytes;
            device.value_bytes = host.value_bytes;
        }
        let layers = [LayerPair { host, device }];
        let t = rng.size(8);
        let device_slots = rng.buf(t.into(), 200);
        let host_slots = rng.buf(t.into(), 200);
        let dev_pool: Vec<u8> = (0..pool_len(&device, rng)).map(|i| i as u8).collect();
        let mut host_pool = vec![0xEEu8; pool_len(&host, rng)];
        let desc = IndexerBackupDesc {
            num_tokens: t,
            layers: &layers,
        };
        let res = indexer_backup(
            &desc,
            IndexerBackupArgs {
                device_slots: &device_slots[..],
                host_slots: &host_slots[..],
                device: &dev_pool[..],
                host: &mut host_pool[..],
            },
        );
        match res {
            Ok(()) => ok += 1,
            Err(_) => assert!(host_pool.iter().all(|&b| b == 0xEE), "wrote on error"),
        }
    });
    assert!(
        ok * 50 > n,
        "only {ok} of {n} indexer backups ran: the test lost its teeth"
    );
}

#[test]
fn resolve_on_hostile_descriptors() {
    let mut ok = 0u64;
    let n = rounds(3000);
    each_round("resolve", 2, n, |rng| {
        // A coherent shape most of the time, then (sometimes) one field at an edge value.
        let top_k = 1 + rng.below(4) as u32;
        let block_size = 1 + rng.below(4) as u32;
        let mut desc = ResolveDesc {
            num_tokens: rng.below(6) as u32,
            top_k,
            num_requests: 1 + rng.below(3) as u32,
            max_pages: 1 + rng.below(4) as u32,
            block_size,
            hot_slots: top_k + rng.below(6) as u32,
            attention_block_stride: block_size + rng.below(3) as u32,
            host_num_blocks: 1 + rng.below(12) as u32,
            num_state_rows: None,
            stats_slot: 0,
        };
        if rng.chance(30) {
            let v = rng.size(12);
            match rng.below(8) {
                0 => desc.num_tokens = v,
                1 => desc.top_k = v,
                2 => desc.num_requests = v,
                3 => desc.max_pages = v,
                4 => desc.block_size = v,
                5 => desc.hot_slots = v,
                6 => desc.attention_block_stride = v,
                _ => desc.host_num_blocks = v,
            }
        }
        let _ = (desc.hot_table_width(), desc.host_rows(), desc.validate());
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let r = u64::from(desc.num_requests);
        let pages = r * u64::from(desc.max_pages);
        let slots = r * u64::from(desc.hot_slots);
        let hot = r * u64::from(desc.hot_table_width());
        let req_id = rng.buf(t, 3);
        let topk = rng.buf(tk, 20);
        let resident = rng.buf(pages, 10);
        let host = rng.buf(pages, 14);
        let hot_table = rng.buf(hot, 10);
        let mut slot_host_rows = rng.buf(slots, 60);
        let mut lru: Vec<u16> = {
            let n = rng.len_for(slots);
            let per = desc.hot_slots.max(1) as usize;
            (0..n)
                .map(|i| {
                    if rng.chance(90) {
                        (i % per) as u16
                    } else {
                        rng.next() as u16
                    }
                })
                .collect()
        };
        let outs: Vec<usize> = [tk, t, t, t, tk, tk]
            .into_iter()
            .map(|n| rng.len_for(n))
            .collect();
        let mut o: Vec<Vec<i32>> = outs.iter().map(|&n| vec![123; n]).collect();
        let (slot_host_rows0, lru0) = (slot_host_rows.clone(), lru.clone());
        let [indices, valid, hits, miss_counts, miss_src, miss_dst] = &mut o[..] else {
            unreachable!()
        };
        let res = resolve(
            &desc,
            ResolveSlices {
                req_id: &req_id,
                topk: &topk,
                resident_table: &resident,
                host_table: &host,
                hot_table: &hot_table,
                slot_host_rows: &mut slot_host_rows,
                lru: &mut lru,
                indices,
                valid_counts: valid,
                hit_counts: hits,
                miss_counts,
                miss_src,
                miss_dst,
                idx_mapping: None,
                stats: None,
            },
        );
        if res.is_err() {
            assert!(
                o.iter().flatten().all(|&v| v == 123),
                "resolve wrote on error"
            );
            assert_eq!(
                (slot_host_rows, lru),
                (slot_host_rows0, lru0),
                "resolve changed state on error"
            );
        } else {
            ok += 1;
            // A request whose rows wanted nothing keeps its (possibly corrupt) state as it was;
            // the check itself must answer any state.
            let _ = desc.lru_is_permutation(&lru);
        }
    });
    assert!(
        ok * 20 > n,
        "only {ok} of {n} resolves ran: the test lost its teeth"
    );
}

#[test]
fn copies_on_hostile_layouts() {
    each_round("copies", 3, rounds(4000), |rng| {
        let pair = LayerPair {
            host: layout(rng),
            device: if rng.chance(70) {
                let mut d = layout(rng);
                d.block_size = pair_like(rng, d.block_size);
                d
            } else {
                layout(rng)
            },
        };
        for l in [pair.host, pair.device] {
            let _ = l.end(OpName::CopyPages);
            let _ = l.check(OpName::CopyPages, "pool", rng.next() >> rng.below(64));
            let _ = l.locate(rng.entry(1 << 12).into());
            let _ = (l.page_bytes(), l.is_split());
        }
        let layers = [pair];
        let mut host = vec![7u8; pool_len(&pair.host, rng)];
        let mut device = vec![9u8; pool_len(&pair.device, rng)];
        let pairs: Vec<BlockPair> = (0..rng.below(4))
            .map(|_| BlockPair {
                src: rng.size(6),
                dst: rng.size(6),
            })
            .collect();
        let (h0, d0) = (host.clone(), device.clone());
        let direction = if rng.chance(50) {
            Direction::DeviceToHost
        } else {
            Direction::HostToDevice
        };
        let layers_arg: &[LayerPair] = if rng.chance(5) { &[] } else { &layers };
        if copy_pages(
            &PageCopyDesc {
                direction,
                layers: layers_arg,
            },
            &pairs,
            &mut host,
            &mut device,
        )
        .is_err()
        {
            assert!(host == h0 && device == d0, "copy_pages wrote on error");
        }
        let spans: Vec<RowSpan> = (0..rng.below(4))
            .map(|_| RowSpan {
                device_block: rng.size(6),
                host_block: rng.size(6),
                first_row: rng.size(6),
                num_rows: rng.size(6),
            })
            .collect();
        let (h0, d0) = (host.clone(), device.clone());
        if copy_rows(
            &RowCopyDesc {
                direction,
                layers: layers_arg,
            },
            &spans,
            &mut host,
            &mut device,
        )
        .is_err()
        {
            assert!(host == h0 && device == d0, "copy_rows wrote on error");
        }
        let h0 = host.clone();
        if copy_host_pages(&[pair.host], &pairs, &mut host).is_err() {
            assert!(host == h0, "copy_host_pages wrote on error");
        }
        let num_tokens = rng.size(3);
        let top_k = rng.size(4);
        let tk = u64::from(num_tokens) * u64::from(top_k);
        let src = rng.buf(tk, 40);
        let dst = rng.buf(tk, 40);
        let counts = rng.buf(num_tokens.into(), 6);
        let d0 = device.clone();
        let res = gather_rows(
            &GatherDesc {
                num_tokens,
                top_k,
                layers: layers_arg,
            },
            GatherArgs {
                plan_src: &src[..],
                plan_dst: &dst[..],
                plan_counts: &counts[..],
                host: &host[..],
                device: &mut device[..],
            },
        );
        if res.is_err() {
            assert!(device == d0, "gather_rows wrote on error");
        }
    });
}

fn pair_like(rng: &mut Rng, v: u32) -> u32 {
    if rng.chance(80) { v } else { rng.size(8) }
}

/// A plan of `top_k ≥ 2^31` entries per row is refused by `check` (plan counts are `i32`),
/// before the gather could clamp a count against a negative bound.
#[test]
fn gather_refuses_top_k_beyond_i32() {
    let l = PageLayout::contiguous(0, 64, 2, 4, 16);
    let layers = [LayerPair { host: l, device: l }];
    let mut device = [0u8; 128];
    for top_k in [1u32 << 31, u32::MAX] {
        let e = gather_rows(
            &GatherDesc {
                num_tokens: 0,
                top_k,
                layers: &layers,
            },
            GatherArgs {
                plan_src: &[][..],
                plan_dst: &[][..],
                plan_counts: &[][..],
                host: &[0u8; 128][..],
                device: &mut device[..],
            },
        )
        .unwrap_err();
        assert!(format!("{e}").contains("top_k"), "{e}");
    }
}

/// The descriptor helpers named in the robustness issue answer every value.
#[test]
fn descriptor_helpers_never_panic() {
    let resolve = |block_size, host_num_blocks| ResolveDesc {
        num_tokens: 1,
        top_k: 1,
        num_requests: 1,
        max_pages: 1,
        block_size,
        hot_slots: 8,
        attention_block_stride: 8,
        host_num_blocks,
        num_state_rows: None,
        stats_slot: 0,
    };
    assert_eq!(resolve(0, 1).hot_table_width(), 0);
    assert_eq!(resolve(u32::MAX, u32::MAX).host_rows(), i64::MAX);
    assert!(resolve(u32::MAX, u32::MAX).validate().is_err());
    let slot = SlotMappingDesc {
        num_tokens: 1,
        ratio: 0,
        block_size: 8,
        table_rows: 1,
        max_blocks: 1,
    };
    assert_eq!(slot.compressed_block_size(), 0);
    assert_eq!(slot.map(&[1], 3, 0, 0), -1);
    let empty = PageLayout::contiguous(0, 64, 0, 4, 16);
    assert!(empty.end(OpName::CopyPages).is_err());
    let remap = RemapDesc {
        num_tokens: 1,
        top_k: 1,
        table_rows: 1,
        max_blocks: 4,
        block_size: 4,
        block_stride_rows: 4,
        idx_mapping_len: None,
        write_counts: false,
        compact: false,
        stats_slot: 0,
    };
    // Row 5 of a 1-row table: no entry there.
    assert_eq!(remap.map_token(&[3, 4, 5, 6], 5, 2), -1);
    assert_eq!(remap.map_token(&[3, 4], 0, 9), -1);
    assert_eq!(remap.map_token(&[3, 4, 5, 6], usize::MAX, 2), -1);
    assert_eq!(
        RemapDesc {
            block_size: 0,
            ..remap
        }
        .map_token(&[3], 0, 2),
        -1
    );
    assert_eq!(physical_row(i32::MAX, u32::MAX, u32::MAX), -1);
    assert!(check_pinned_budget(u64::MAX, u64::MAX).is_err());
}

#[test]
fn table_and_state_ops_on_hostile_descriptors() {
    each_round("tables", 4, rounds(4000), |rng| {
        let table_len = rng.size(16);
        let mut table = rng.buf(table_len.into(), 9);
        let mut writes: Vec<TableWrite> = (0..rng.below(6))
            .map(|_| TableWrite {
                index: rng.size(18),
                value: rng.entry(9),
            })
            .collect();
        if rng.chance(60) {
            writes.sort();
            writes.dedup_by_key(|w| w.index);
        }
        let t0 = table.clone();
        if write_table(&TableWriteDesc { table_len }, &writes, &mut table).is_err() {
            assert_eq!(table, t0, "write_table wrote on error");
        }
        let d = HotResetDesc {
            num_requests: rng.size(3),
            hot_slots: rng.size(8),
        };
        let slots = u64::from(d.num_requests) * u64::from(d.hot_slots);
        let mut slot_host_rows = rng.buf(slots, 9);
        let mut lru: Vec<u16> = (0..rng.len_for(slots)).map(|_| rng.next() as u16).collect();
        let rows: Vec<u32> = (0..rng.below(3)).map(|_| rng.size(3)).collect();
        let (g0, l0) = (slot_host_rows.clone(), lru.clone());
        if reset_hot_state(&d, &rows, &mut slot_host_rows, &mut lru).is_err() {
            assert_eq!(
                (&slot_host_rows, &lru),
                (&g0, &l0),
                "reset_hot_state wrote on error"
            );
        }
        let inv = InvalidateDesc {
            num_requests: rng.size(3),
            hot_slots: rng.size(8),
            num_ranges: rng.size(3),
        };
        let ranges = rng.buf(u64::from(inv.num_ranges) * 2, 12);
        let g0 = slot_host_rows.clone();
        if invalidate(
            &inv,
            InvalidateArgs {
                ranges: &ranges[..],
                slot_host_rows: &mut slot_host_rows[..],
            },
        )
        .is_err()
        {
            assert_eq!(slot_host_rows, g0, "invalidate wrote on error");
        }
        let sm = SlotMappingDesc {
            num_tokens: rng.size(6),
            ratio: rng.size(5),
            block_size: rng.size(16),
            table_rows: rng.size(3),
            max_blocks: rng.size(4),
        };
        let t = u64::from(sm.num_tokens);
        let positions = rng.buf(t, 40);
        let slot_mapping = rng.buf(t, 40);
        let table_row = rng.buf(t, 3);
        let block_table = rng.buf(u64::from(sm.table_rows) * u64::from(sm.max_blocks), 9);
        let mut out = vec![123; rng.len_for(t)];
        let _ = sm.compressed_block_size();
        if compressed_slot_mapping(
            &sm,
            SlotMappingArgs {
                positions: &positions[..],
                slot_mapping: &slot_mapping[..],
                table_row: &table_row[..],
                block_table: &block_table[..],
                out: &mut out[..],
            },
        )
        .is_err()
        {
            assert!(out.iter().all(|&v| v == 123), "slot mapping wrote on error");
        }
    });
}

/// A small layout every coordinator test below starts from (2 buckets, a regular group).
fn small_layout(gpu_blocks: u32, host_blocks: u32, max_len: u32) -> KvCacheConfig {
    const LAYERS: [LayerSpec; 4] = [
        LayerSpec::sparse_leader(16, 16),
        LayerSpec::sparse_follower(16),
        LayerSpec::sparse_leader(16, 16),
        LayerSpec::Regular(RegularLayer {
            row_bytes: 32,
            compress_ratio: 1,
            sliding_window: None,
            block_tokens: None,
            page_alignment: 1,
            kind: hisparse_core::model::RegularKind::Attention,
        }),
    ];
    let model = ModelSpec {
        name: "adversarial",
        block_tokens: 4,
        top_k: 4,
        layers: &LAYERS,
    };
    // Per host block: 3 sparse layers' 64-B pages and 2 leaders' 64-B indexer pages.
    let cfg = HiSparseConfig::new(4, u64::from(host_blocks) * 5 * 64);
    let mut input = LayoutInput::new(&model, &cfg, 0, max_len);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    plan_layout(&input).expect("layout")
}

/// Hand-edited layouts: one or two fields set to edge values. `validate` (and so
/// `Coordinator::new`) answers every one, the helpers answer every one, and a layout that
/// passes runs a short workload with every invariant kept.
#[test]
fn hand_edited_layouts_are_refused_or_work() {
    let bases = [
        small_layout(64, 40, 32),
        plan_layout(&LayoutInput::new(
            &presets::DEEPSEEK_V4,
            &HiSparseConfig::new(presets::DEEPSEEK_V4.top_k, 1 << 30),
            1 << 30,
            16384,
        ))
        .expect("v4"),
    ];
    let mut accepted = 0;
    each_round("layouts", 5, rounds(1000), |rng| {
        let mut kv = bases[rng.below(2) as usize].clone();
        for _ in 0..1 + rng.below(2) {
            let v = rng.size(8);
            match rng.below(16) {
                0 => kv.hot_blocks_per_request = v,
                1 => kv.num_buckets = v,
                2 => kv.block_tokens = v,
                3 => kv.block_size = v,
                4 => kv.sparse_compress_ratio = v,
                5 => kv.max_model_len = v.saturating_mul(4),
                6 => kv.max_pages_per_request = v,
                7 => kv.num_gpu_blocks = v.saturating_mul(8),
                8 => kv.host_num_blocks = v.saturating_mul(8),
                9 => kv.config.max_query_len = v,
                10 => kv.device_buffer_size = v,
                11 => kv.attention_block_stride = v,
                12 => {
                    let g = rng.below(kv.groups.len() as u64) as usize;
                    if let Some(g) = kv.groups.get_mut(g) {
                        g.bucket = Some(v);
                    }
                }
                13 => {
                    let n = rng.below(kv.groups.len() as u64 + 1) as usize;
                    kv.groups.truncate(n);
                }
                14 => {
                    if let Some(g) = kv.index_groups.first_mut() {
                        g.bucket = v;
                    }
                }
                _ => kv.bytes_per_block = u64::from(v),
            }
        }
        let _ = kv.capacity(rng.size(100));
        let _ = kv.gpu_blocks_per_request(rng.size(100));
        let _ = kv.all_layer_pairs();
        let _ = kv.host_layout(rng.size(4));
        let _ = kv.bucket_layer_pairs(rng.size(4));
        let _ = kv.index_group_pairs(rng.size(4) as usize);
        let _ = kv.device_offset(rng.size(64), rng.below(8) as usize, rng.below(4) as usize);
        let Ok(mut c) = Coordinator::new(kv.clone(), CoordinatorConfig::default()) else {
            assert!(kv.validate().is_err(), "new refused a valid layout");
            return;
        };
        accepted += 1;
        let len = kv.max_model_len.min(40);
        match c.admit(1, &(0..len).collect::<Vec<u32>>()) {
            // A pool too small to hold the prompt's context for its prefill: a typed refusal.
            Err(hisparse_core::coordinator::CoordError::PrefillNeverFits { .. }) => return,
            other => other.unwrap(),
        }
        for _ in 0..4 {
            let cmd = c.step().unwrap();
            if let Some(id) = cmd.transfer_id {
                c.report(0, &[id], &[id]).unwrap();
            }
            c.check_invariants().unwrap();
        }
    });
    assert!(
        accepted > 0,
        "no hand-edited layout was valid: the test lost its teeth"
    );
}

/// Hostile call sequences: unknown and duplicate ids, empty and oversized prompts, appends past
/// `max_model_len`, scheduling more tokens than exist, reports out of order or from workers
/// that do not exist, preempting and finishing at random. Every call returns; every invariant
/// holds after every call.
#[test]
fn hostile_call_sequences_keep_every_invariant() {
    each_round("call sequences", 6, rounds(400), |rng| {
        let gpu = 40 + rng.below(80) as u32;
        let kv = small_layout(gpu, 14 + rng.below(40) as u32, 48);
        let workers = 1 + rng.below(3) as u32;
        let mut c = Coordinator::new(
            kv,
            CoordinatorConfig {
                max_running: 1 + rng.below(4) as u32,
                max_batched_tokens: 1 + rng.below(40) as u32,
                max_spill_pages_per_step: 1 + rng.below(4) as u32,
                num_workers: workers,
                enable_prefix_caching: rng.chance(70),
                reclaim_min_blocks: rng.below(20) as u32,
            },
        )
        .unwrap();
        let mut issued: Vec<u64> = Vec::new();
        let id = |rng: &mut Rng| -> RequestId {
            if rng.chance(90) {
                rng.below(6)
            } else {
                rng.next()
            }
        };
        for _ in 0..60 {
            let token_count = |rng: &mut Rng| {
                if rng.chance(90) {
                    rng.below(50) as usize
                } else {
                    rng.below(200) as usize
                }
            };
            match rng.below(11) {
                0 | 1 => {
                    let n = token_count(rng);
                    let prompt: Vec<u32> = (0..n as u32).map(|i| i % 7).collect();
                    let _ = c.admit(id(rng), &prompt);
                }
                2 | 3 => {
                    if let Ok(cmd) = c.step()
                        && let Some(t) = cmd.transfer_id
                    {
                        issued.push(t);
                    }
                }
                4 => {
                    let n = token_count(rng);
                    let _ = c.append_tokens(id(rng), &vec![3; n]);
                }
                5 => {
                    let _ = c.append_token_by_slot(rng.size(5), 1);
                }
                6 => {
                    let _ = c.schedule(id(rng), rng.size(6));
                }
                7 => {
                    let _ = c.start(id(rng), rng.size(16));
                }
                8 => {
                    // Honest reports most of the time, garbage sometimes.
                    let w = if rng.chance(90) {
                        rng.below(u64::from(workers)) as u32
                    } else {
                        rng.size(4)
                    };
                    let pick = |rng: &mut Rng| -> Vec<u64> {
                        if rng.chance(80) || issued.is_empty() {
                            let n = rng.below(issued.len() as u64 + 1) as usize;
                            issued[..n].to_vec()
                        } else {
                            (0..rng.below(3)).map(|_| rng.below(8)).collect()
                        }
                    };
                    let (e, d) = (pick(rng), pick(rng));
                    let _ = c.report(w, &e, &d);
                }
                9 => {
                    if rng.chance(50) {
                        let _ = c.finish(id(rng));
                    } else {
                        let _ = c.preempt(id(rng));
                    }
                }
                _ => {
                    let _ = c.reclaim_resident_blocks(rng.size(30));
                }
            }
            c.check_invariants()
                .unwrap_or_else(|v| panic!("invariant broken: {v}"));
        }
    });
}

/// Whether this machine's allocator refuses a single allocation of `bytes` (Linux with
/// heuristic or strict overcommit refuses one larger than RAM + swap). Elsewhere the caller
/// says loudly that it cannot check the refusal, instead of letting the allocation succeed and
/// the machine run out of memory.
fn allocator_refuses(bytes: u64) -> bool {
    let overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").ok();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let total = kib("MemTotal:").unwrap_or(u64::MAX / 2048) + kib("SwapTotal:").unwrap_or(0);
    let refuses = matches!(overcommit.as_deref().map(str::trim), Some("0" | "2"))
        && total.saturating_mul(1024) < bytes;
    if !refuses {
        use std::io::Write;
        // Straight to the terminal: a passing test's captured output would hide the skip.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: this machine's allocator may grant {bytes} B (overcommit {overcommit:?}, \
             RAM + swap {total} KiB); the out-of-memory path was not exercised"
        );
    }
    refuses
}

/// Pools of `i32::MAX` blocks need over 100 GiB of bookkeeping: a typed error, not an abort.
#[test]
fn a_pool_too_large_to_allocate_is_a_typed_error() {
    use hisparse_core::coordinator::CoordError;
    use hisparse_core::pool::{BlockPool, PoolError};
    let n = i32::MAX as u32;
    if !allocator_refuses(16 * u64::from(n)) {
        return;
    }
    assert!(matches!(
        BlockPool::new(n),
        Err(PoolError::OutOfMemory { num_blocks, .. }) if num_blocks == n
    ));
    // The same through a planned layout: 16-byte rows, one row per block, so the planner allows
    // a GPU pool of up to i32::MAX blocks.
    const TINY: [LayerSpec; 1] = [LayerSpec::sparse_leader(16, 16)];
    let model = ModelSpec {
        name: "tiny-rows",
        block_tokens: 1,
        top_k: 1,
        layers: &TINY,
    };
    let cfg = HiSparseConfig::new(1, 1 << 20);
    let mut input = LayoutInput::new(&model, &cfg, 0, 64);
    input.num_gpu_blocks_override = Some(n - 1);
    let kv = plan_layout(&input).expect("the planner allows it");
    let e = Coordinator::new(kv, CoordinatorConfig::default()).unwrap_err();
    assert!(
        matches!(e, CoordError::Pool(PoolError::OutOfMemory { .. })),
        "{e:?}"
    );
    assert!(format!("{e}").contains("plan a smaller pool"), "{e}");
}
