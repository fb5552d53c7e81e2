//! Adversarial calls to the CPU backend, against the core's reference: random and edge-value
//! descriptors (zero, one, 2^15, `i32::MAX`, `u32::MAX` sizes; `-1`, negative, out-of-range and
//! duplicate entries; buffers one element short or long; corrupt hot state) for every operation,
//! each run on the backend and on the reference with the same inputs. Both must agree exactly:
//! the same typed error, or the same bytes in every output and state buffer. The backend's own
//! remap, resolve and gather are the paths this mostly exercises. Built with the test profile's
//! `overflow-checks`, so an overflow anywhere is a failure too.
//!
//! Deterministic: `HISPARSE_ADVERSARIAL_SEED=<n>` explores other inputs (a failure names its
//! round); `HISPARSE_ADVERSARIAL_ROUNDS=<n>` scales the rounds (the default keeps each test to a
//! few seconds in a debug build).

use hisparse_backend_cpu::{CpuBuffer, CpuDevice, CpuError};
use hisparse_conformance::SplitMix64;
use hisparse_core::Device;
use hisparse_core::OpError;
use hisparse_core::ops::copy::{copy_host_pages, copy_pages, copy_rows, gather_rows};
use hisparse_core::ops::invalidate::invalidate;
use hisparse_core::ops::remap::remap;
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping;
use hisparse_core::ops::table::{reset_hot_state, write_table};
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, HotResetDesc, InvalidateArgs, InvalidateDesc,
    LayerPair, PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc,
    ResolveSlices, RowCopyDesc, RowSpan, SlotMappingArgs, SlotMappingDesc, TableWrite,
    TableWriteDesc,
};

/// Edge-value generator over the conformance suite's PRNG.
struct Gen(SplitMix64);

impl Gen {
    fn new(salt: u64) -> Self {
        let seed = std::env::var("HISPARSE_ADVERSARIAL_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0x5eed_u64);
        Gen(SplitMix64::new(
            seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// A `u32` that is usually in `0..=small` and sometimes an edge value.
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
        if self.chance(12) {
            EDGES[self.below(EDGES.len() as u64) as usize]
        } else {
            self.below(u64::from(small) + 1) as u32
        }
    }
    /// An `i32` entry: mostly in `-1..=limit`, sometimes an edge value.
    fn entry(&mut self, limit: i32) -> i32 {
        const EDGES: [i32; 6] = [-1, -2, 0, i32::MAX, i32::MIN, 1 << 30];
        match self.below(10) {
            0 => EDGES[self.below(EDGES.len() as u64) as usize],
            1 => -1,
            _ => self.below(limit.max(1) as u64 + 1) as i32,
        }
    }
    /// A buffer length for `need` elements: usually exact, sometimes short or long; small
    /// whatever a (refused) shape claims.
    fn len_for(&mut self, need: u64) -> usize {
        if need > 1 << 12 {
            return self.below(64) as usize;
        }
        match self.below(12) {
            0 => (need as usize).saturating_sub(1 + self.below(3) as usize),
            1 => need as usize + self.below(5) as usize,
            _ => need as usize,
        }
    }
    fn buf(&mut self, need: u64, limit: i32) -> Vec<i32> {
        let n = self.len_for(need);
        (0..n).map(|_| self.entry(limit)).collect()
    }
}

fn rounds(default: u64) -> u64 {
    std::env::var("HISPARSE_ADVERSARIAL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The backend and the reference must agree: the same error, or both succeed.
fn same_outcome(what: &str, round: u64, dev: Result<(), CpuError>, reference: Result<(), OpError>) {
    match (dev, reference) {
        (Ok(()), Ok(())) => {}
        (Err(CpuError::Op(d)), Err(r)) if d == r => {}
        (d, r) => panic!("{what}, round {round}: backend {d:?}, reference {r:?}"),
    }
}

struct Dev {
    dev: CpuDevice,
    stream: <CpuDevice as Device>::Stream,
}

impl Dev {
    fn new() -> Self {
        let dev = CpuDevice::new();
        let stream = dev.create_stream().expect("stream");
        Dev { dev, stream }
    }
    fn i32s(&self, v: &[i32]) -> CpuBuffer {
        let mut b = self.dev.alloc(v.len() * 4).expect("alloc");
        self.dev.upload_i32(&mut b, 0, v).expect("upload");
        b
    }
    fn u16s(&self, v: &[u16]) -> CpuBuffer {
        let mut b = self.dev.alloc(v.len() * 2).expect("alloc");
        self.dev.upload_u16(&mut b, 0, v).expect("upload");
        b
    }
    fn bytes(&self, v: &[u8]) -> CpuBuffer {
        let mut b = self.dev.alloc(v.len()).expect("alloc");
        self.dev.upload(&mut b, 0, v).expect("upload");
        b
    }
    fn pinned(&self, v: &[u8]) -> CpuBuffer {
        let mut b = self.dev.alloc_pinned(v.len()).expect("alloc_pinned");
        self.dev.write_pinned(&mut b, 0, v).expect("write_pinned");
        b
    }
    fn read_i32(&self, b: &CpuBuffer, n: usize) -> Vec<i32> {
        let mut v = vec![0; n];
        self.dev.download_i32(b, 0, &mut v).expect("download");
        v
    }
    fn read_u16(&self, b: &CpuBuffer, n: usize) -> Vec<u16> {
        let mut v = vec![0; n];
        self.dev.download_u16(b, 0, &mut v).expect("download");
        v
    }
    fn read_bytes(&self, b: &CpuBuffer, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.dev.download(b, 0, &mut v).expect("download");
        v
    }
    fn read_pinned(&self, b: &CpuBuffer, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.dev.read_pinned(b, 0, &mut v).expect("read_pinned");
        v
    }
}

#[test]
fn remap_matches_the_reference_on_hostile_inputs() {
    let d = Dev::new();
    let mut g = Gen::new(11);
    let mut ran = 0;
    let n = rounds(3000);
    for round in 0..n {
        let bs = 1 + g.below(6) as u32;
        let mut desc = RemapDesc {
            num_tokens: g.below(6) as u32,
            top_k: 1 + g.below(6) as u32,
            table_rows: 1 + g.below(4) as u32,
            max_blocks: 1 + g.below(5) as u32,
            block_size: bs,
            block_stride_rows: bs + g.below(4) as u32,
            idx_mapping_len: g.chance(30).then(|| 1 + g.below(5) as u32),
            write_counts: g.chance(50),
            compact: g.chance(50),
            stats_slot: 0,
        };
        if g.chance(25) {
            let v = g.size(8);
            match g.below(6) {
                0 => desc.num_tokens = v,
                1 => desc.top_k = v,
                2 => desc.table_rows = v,
                3 => desc.max_blocks = v,
                4 => desc.block_size = v,
                _ => desc.block_stride_rows = v,
            }
        }
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let req_id = g.buf(t, 5);
        let table = g.buf(
            u64::from(desc.table_rows) * u64::from(desc.max_blocks),
            1 << 20,
        );
        let topk = g.buf(tk, 40);
        let map = desc.idx_mapping_len.map(|n| g.buf(n.into(), 5));
        let out_len = g.len_for(tk);
        let counts_len = g.len_for(t);
        // Reference.
        let mut out = vec![-7; out_len];
        let mut counts = desc.write_counts.then(|| vec![-7; counts_len]);
        let reference = remap(
            &desc,
            RemapArgs {
                req_id: &req_id[..],
                block_table: &table[..],
                topk: &topk[..],
                idx_mapping: map.as_deref(),
                out: &mut out[..],
                counts: counts.as_deref_mut(),
                stats: None,
            },
        );
        // Backend.
        let (rb, tb, kb) = (d.i32s(&req_id), d.i32s(&table), d.i32s(&topk));
        let mb = map.as_ref().map(|m| d.i32s(m));
        let mut ob = d.i32s(&vec![-7; out_len]);
        let mut cb = desc.write_counts.then(|| d.i32s(&vec![-7; counts_len]));
        let backend = d.dev.remap(
            &d.stream,
            &desc,
            RemapArgs {
                req_id: &rb,
                block_table: &tb,
                topk: &kb,
                idx_mapping: mb.as_ref(),
                out: &mut ob,
                counts: cb.as_mut(),
                stats: None,
            },
        );
        ran += u32::from(reference.is_ok());
        same_outcome("remap", round, backend, reference);
        assert_eq!(d.read_i32(&ob, out_len), out, "remap out, round {round}");
        if let (Some(cb), Some(c)) = (&cb, &counts) {
            assert_eq!(
                d.read_i32(cb, counts_len),
                *c,
                "remap counts, round {round}"
            );
        }
    }
    assert!(u64::from(ran) * 4 > n, "only {ran} of {n} remaps ran");
}

#[test]
fn resolve_matches_the_reference_on_hostile_inputs() {
    let d = Dev::new();
    let mut g = Gen::new(12);
    let mut ran = 0;
    let n = rounds(2000);
    for round in 0..n {
        let top_k = 1 + g.below(4) as u32;
        let bs = 1 + g.below(4) as u32;
        let mut desc = ResolveDesc {
            num_tokens: g.below(6) as u32,
            top_k,
            num_requests: 1 + g.below(3) as u32,
            max_pages: 1 + g.below(4) as u32,
            block_size: bs,
            hot_slots: top_k * (1 + g.below(2) as u32) + g.below(4) as u32,
            attention_block_stride: bs + g.below(3) as u32,
            host_num_blocks: 1 + g.below(12) as u32,
            num_state_rows: None,
            stats_slot: 0,
        };
        if g.chance(25) {
            let v = g.size(12);
            match g.below(8) {
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
        let t = u64::from(desc.num_tokens);
        let tk = t * u64::from(desc.top_k);
        let r = u64::from(desc.num_requests);
        let pages = r * u64::from(desc.max_pages);
        let slots = r * u64::from(desc.hot_slots);
        let width = r * u64::from(desc.hot_table_width());
        let req_id = g.buf(t, 3);
        let topk = g.buf(tk, 20);
        let resident = g.buf(pages, 10);
        let host = g.buf(pages, 14);
        let hot_table = g.buf(width, 10);
        // Hot state from earlier calls: usually a valid permutation with cached rows, sometimes
        // corrupt (duplicate or out-of-range LRU entries).
        let slot_host_rows0 = g.buf(slots, 50);
        let lru_len = g.len_for(slots);
        let per = desc.hot_slots.clamp(1, 1 << 15) as usize;
        let lru0: Vec<u16> = (0..lru_len)
            .map(|i| {
                if g.chance(95) {
                    ((i % per + g.below(2) as usize * (per - 1 - i % per)) % per) as u16
                } else {
                    g.0.next_u64() as u16
                }
            })
            .collect();
        let lens: Vec<usize> = [tk, t, t, t, tk, tk]
            .iter()
            .map(|&n| g.len_for(n))
            .collect();
        let mut outs: Vec<Vec<i32>> = lens.iter().map(|&n| vec![-7; n]).collect();
        let (mut slot_host_rows, mut lru) = (slot_host_rows0.clone(), lru0.clone());
        let reference = {
            let [indices, valid, hits, misses, src, dst] = &mut outs[..] else {
                unreachable!()
            };
            resolve(
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
                    miss_counts: misses,
                    miss_src: src,
                    miss_dst: dst,
                    idx_mapping: None,
                    stats: None,
                },
            )
        };
        let (rb, kb, resb, hb, htb) = (
            d.i32s(&req_id),
            d.i32s(&topk),
            d.i32s(&resident),
            d.i32s(&host),
            d.i32s(&hot_table),
        );
        let (mut gb, mut lb) = (d.i32s(&slot_host_rows0), d.u16s(&lru0));
        let mut ob: Vec<CpuBuffer> = lens.iter().map(|&n| d.i32s(&vec![-7; n])).collect();
        let backend = {
            let [indices, valid, hits, misses, src, dst] = &mut ob[..] else {
                unreachable!()
            };
            d.dev.resolve(
                &d.stream,
                &desc,
                ResolveArgs {
                    req_id: &rb,
                    topk: &kb,
                    resident_table: &resb,
                    host_table: &hb,
                    hot_table: &htb,
                    slot_host_rows: &mut gb,
                    lru: &mut lb,
                    indices,
                    valid_counts: valid,
                    hit_counts: hits,
                    miss_counts: misses,
                    miss_src: src,
                    miss_dst: dst,
                    idx_mapping: None,
                    stats: None,
                },
            )
        };
        ran += u32::from(reference.is_ok());
        same_outcome("resolve", round, backend, reference);
        for (i, (b, want)) in ob.iter().zip(&outs).enumerate() {
            assert_eq!(
                &d.read_i32(b, want.len()),
                want,
                "resolve output {i}, round {round}"
            );
        }
        assert_eq!(
            d.read_i32(&gb, slot_host_rows.len()),
            slot_host_rows,
            "resolve slot_host_rows, round {round}"
        );
        assert_eq!(
            d.read_u16(&lb, lru.len()),
            lru,
            "resolve lru, round {round}"
        );
    }
    assert!(u64::from(ran) * 4 > n, "only {ran} of {n} resolves ran");
}

/// A page layout: usually coherent (16-byte rows, strides at least a page), sometimes with one
/// field at an edge value.
fn layout(g: &mut Gen, num_blocks: u32) -> PageLayout {
    let block_size = 1 + g.below(4) as u32;
    let row_bytes = 16 * (1 + g.below(3) as u32);
    let value_bytes = if g.chance(70) { row_bytes } else { 16 };
    let page = u64::from(block_size) * u64::from(row_bytes);
    let mut l = PageLayout {
        base: 16 * g.below(3),
        block_stride: page + 16 * g.below(3),
        num_blocks,
        block_size,
        row_bytes,
        value_bytes,
        index_stride_rows: block_size + g.below(3) as u32,
    };
    if g.chance(15) {
        let v = g.size(8);
        match g.below(6) {
            0 => l.block_size = v,
            1 => l.row_bytes = v,
            2 => l.value_bytes = v,
            3 => l.index_stride_rows = v,
            4 => l.num_blocks = v,
            _ => l.block_stride = u64::from(v),
        }
    }
    l
}

fn pool_len(g: &mut Gen, layers: &[PageLayout]) -> usize {
    let end = layers
        .iter()
        .filter_map(|l| l.end(hisparse_core::OpName::CopyPages).ok())
        .max()
        .unwrap_or(64)
        .min(1 << 14) as usize;
    // Pinned buffers cannot be empty; a short pool is still refused by the checks.
    (match g.below(10) {
        0 => end.saturating_sub(16),
        1 => end + 16,
        _ => end,
    })
    .max(16)
}

/// Two layers sharing one pool pair the way a leader and a follower (or a bucket's layers) do:
/// the second layer's pages follow the first's.
fn layer_pairs(g: &mut Gen) -> Vec<LayerPair> {
    let (hb, db) = (1 + g.below(6) as u32, 1 + g.below(6) as u32);
    let mut host = layout(g, hb);
    let mut device = layout(g, db);
    device.block_size = host.block_size;
    device.row_bytes = host.row_bytes;
    device.value_bytes = host.value_bytes;
    if g.chance(10) {
        device.block_size = g.size(6);
    }
    if device.block_stride < device.page_bytes() && g.chance(80) {
        device.block_stride = device.page_bytes();
    }
    if host.block_stride < host.page_bytes() && g.chance(80) {
        host.block_stride = host.page_bytes();
    }
    let mut layers = vec![LayerPair { host, device }];
    if g.chance(40) {
        let mut second = layers[0];
        second.host.base = host.end(hisparse_core::OpName::CopyPages).unwrap_or(0);
        second.device.base += device.page_bytes();
        second.device.block_stride = device.block_stride.max(2 * device.page_bytes());
        layers[0].device.block_stride = second.device.block_stride;
        layers.push(second);
    }
    layers
}

fn block(g: &mut Gen, n: u32) -> u32 {
    if g.chance(90) {
        g.below(u64::from(n) + 1) as u32
    } else {
        g.size(8)
    }
}

#[test]
fn copies_and_gathers_match_the_reference_on_hostile_inputs() {
    let d = Dev::new();
    let mut g = Gen::new(13);
    let mut ran = [0u32; 4];
    let n = rounds(2000);
    for round in 0..n {
        let layers = layer_pairs(&mut g);
        let hosts: Vec<PageLayout> = layers.iter().map(|l| l.host).collect();
        let devices: Vec<PageLayout> = layers.iter().map(|l| l.device).collect();
        let host_len = pool_len(&mut g, &hosts);
        let dev_len = pool_len(&mut g, &devices);
        let host0: Vec<u8> = (0..host_len).map(|i| (i * 7 + 1) as u8).collect();
        let dev0: Vec<u8> = (0..dev_len).map(|i| (i * 13 + 5) as u8).collect();
        let (hn, dn) = (layers[0].host.num_blocks, layers[0].device.num_blocks);
        let direction = if g.chance(50) {
            Direction::DeviceToHost
        } else {
            Direction::HostToDevice
        };
        // Whole pages.
        let pairs: Vec<BlockPair> = (0..g.below(4))
            .map(|_| BlockPair {
                src: block(&mut g, hn.max(dn)),
                dst: block(&mut g, hn.max(dn)),
            })
            .collect();
        let pairs = distinct_dst(pairs);
        let desc = PageCopyDesc {
            direction,
            layers: &layers,
        };
        let (mut h, mut dv) = (host0.clone(), dev0.clone());
        let reference = copy_pages(&desc, &pairs, &mut h, &mut dv);
        let (mut hb, mut db) = (d.pinned(&host0), d.bytes(&dev0));
        let backend = d.dev.copy_pages(&d.stream, &desc, &pairs, &mut hb, &mut db);
        ran[0] += u32::from(reference.is_ok());
        same_outcome("copy_pages", round, backend, reference);
        assert_eq!(
            d.read_pinned(&hb, host_len),
            h,
            "copy_pages host, round {round}"
        );
        assert_eq!(
            d.read_bytes(&db, dev_len),
            dv,
            "copy_pages device, round {round}"
        );
        // Row spans.
        let bs = layers[0].host.block_size;
        let spans: Vec<RowSpan> = (0..g.below(4))
            .map(|_| {
                let first = g.below(u64::from(bs) + 1) as u32;
                RowSpan {
                    device_block: block(&mut g, dn),
                    host_block: block(&mut g, hn),
                    first_row: if g.chance(90) { first } else { g.size(6) },
                    num_rows: if g.chance(90) {
                        g.below(u64::from(bs - first.min(bs)) + 1) as u32
                    } else {
                        g.size(6)
                    },
                }
            })
            .collect();
        let spans = distinct_span_dst(spans, direction);
        let desc = RowCopyDesc {
            direction,
            layers: &layers,
        };
        let (mut h, mut dv) = (host0.clone(), dev0.clone());
        let reference = copy_rows(&desc, &spans, &mut h, &mut dv);
        let (mut hb, mut db) = (d.pinned(&host0), d.bytes(&dev0));
        let backend = d.dev.copy_rows(&d.stream, &desc, &spans, &mut hb, &mut db);
        ran[1] += u32::from(reference.is_ok());
        same_outcome("copy_rows", round, backend, reference);
        assert_eq!(
            d.read_pinned(&hb, host_len),
            h,
            "copy_rows host, round {round}"
        );
        assert_eq!(
            d.read_bytes(&db, dev_len),
            dv,
            "copy_rows device, round {round}"
        );
        // Host → host pages.
        let cow: Vec<BlockPair> = (0..g.below(3))
            .map(|_| BlockPair {
                src: block(&mut g, hn),
                dst: block(&mut g, hn),
            })
            .collect();
        let cow = distinct_dst(cow);
        let mut h = host0.clone();
        let reference = copy_host_pages(&hosts, &cow, &mut h);
        let mut hb = d.pinned(&host0);
        let backend = d.dev.copy_host_pages(&d.stream, &hosts, &cow, &mut hb);
        ran[2] += u32::from(reference.is_ok());
        same_outcome("copy_host_pages", round, backend, reference);
        assert_eq!(
            d.read_pinned(&hb, host_len),
            h,
            "copy_host_pages, round {round}"
        );
        // A miss plan: host rows → device rows, for every layer.
        let num_tokens = g.below(4) as u32;
        let top_k = if g.chance(95) {
            1 + g.below(4) as u32
        } else {
            g.size(4)
        };
        let tk = u64::from(num_tokens) * u64::from(top_k);
        let host_rows = i32::try_from(u64::from(hn) * u64::from(bs)).unwrap_or(i32::MAX);
        let dev_rows = i32::try_from(u64::from(dn) * u64::from(layers[0].device.index_stride_rows))
            .unwrap_or(i32::MAX);
        let src = g.buf(tk, host_rows.saturating_add(2));
        let mut dst: Vec<i32> = g.buf(tk, dev_rows.saturating_add(2));
        // The resolver's plans have distinct destinations; keep most of them so.
        if g.chance(90) {
            let mut seen = std::collections::HashSet::new();
            for v in &mut dst {
                if *v >= 0 && !seen.insert(*v) {
                    *v = -1;
                }
            }
        }
        let counts = g.buf(num_tokens.into(), top_k.min(8) as i32 + 1);
        let desc = GatherDesc {
            num_tokens,
            top_k,
            layers: &layers,
        };
        let mut dv = dev0.clone();
        let reference = gather_rows(
            &desc,
            GatherArgs {
                plan_src: &src[..],
                plan_dst: &dst[..],
                plan_counts: &counts[..],
                host: &host0[..],
                device: &mut dv[..],
            },
        );
        let (sb, tb, cb, hb) = (
            d.i32s(&src),
            d.i32s(&dst),
            d.i32s(&counts),
            d.pinned(&host0),
        );
        let mut db = d.bytes(&dev0);
        let backend = d.dev.gather_rows(
            &d.stream,
            &desc,
            GatherArgs {
                plan_src: &sb,
                plan_dst: &tb,
                plan_counts: &cb,
                host: &hb,
                device: &mut db,
            },
        );
        ran[3] += u32::from(reference.is_ok());
        same_outcome("gather_rows", round, backend, reference);
        assert_eq!(
            d.read_bytes(&db, dev_len),
            dv,
            "gather_rows device, round {round}"
        );
    }
    for (what, r) in ["copy_pages", "copy_rows", "copy_host_pages", "gather_rows"]
        .iter()
        .zip(ran)
    {
        assert!(u64::from(r) * 5 > n, "only {r} of {n} {what} calls ran");
    }
}

/// Destinations must be distinct (the documented contract); which source lands on a repeated
/// destination is unspecified, so repeated ones are dropped here.
fn distinct_dst(pairs: Vec<BlockPair>) -> Vec<BlockPair> {
    let mut seen = std::collections::HashSet::new();
    pairs.into_iter().filter(|p| seen.insert(p.dst)).collect()
}

fn distinct_span_dst(spans: Vec<RowSpan>, direction: Direction) -> Vec<RowSpan> {
    let mut seen = std::collections::HashSet::new();
    spans
        .into_iter()
        .filter(|s| {
            seen.insert(match direction {
                Direction::DeviceToHost => s.host_block,
                Direction::HostToDevice => s.device_block,
            })
        })
        .collect()
}

#[test]
fn tables_invalidation_and_slot_mapping_match_the_reference() {
    let d = Dev::new();
    let mut g = Gen::new(14);
    let n = rounds(3000);
    for round in 0..n {
        // write_table
        let table_len = g.size(16);
        let table0 = g.buf(table_len.into(), 9);
        let mut writes: Vec<TableWrite> = (0..g.below(6))
            .map(|_| TableWrite {
                index: g.size(18),
                value: g.entry(9),
            })
            .collect();
        if g.chance(60) {
            writes.sort();
            writes.dedup_by_key(|w| w.index);
        }
        let desc = TableWriteDesc { table_len };
        let mut t = table0.clone();
        let reference = write_table(&desc, &writes, &mut t);
        let mut tb = d.i32s(&table0);
        let backend = d.dev.write_table(&d.stream, &desc, &writes, &mut tb);
        same_outcome("write_table", round, backend, reference);
        assert_eq!(d.read_i32(&tb, t.len()), t, "write_table, round {round}");
        // reset_hot_state
        let desc = HotResetDesc {
            num_requests: g.size(3),
            hot_slots: g.size(8),
        };
        let slots = u64::from(desc.num_requests) * u64::from(desc.hot_slots);
        let slot_host_rows0 = g.buf(slots, 9);
        let lru0: Vec<u16> = (0..g.len_for(slots)).map(|_| g.below(9) as u16).collect();
        let rows: Vec<u32> = (0..g.below(3)).map(|_| g.size(3)).collect();
        let (mut slot_host_rows, mut lru) = (slot_host_rows0.clone(), lru0.clone());
        let reference = reset_hot_state(&desc, &rows, &mut slot_host_rows, &mut lru);
        let (mut gb, mut lb) = (d.i32s(&slot_host_rows0), d.u16s(&lru0));
        let backend = d
            .dev
            .reset_hot_state(&d.stream, &desc, &rows, &mut gb, &mut lb);
        same_outcome("reset_hot_state", round, backend, reference);
        assert_eq!(
            d.read_i32(&gb, slot_host_rows.len()),
            slot_host_rows,
            "reset slot_host_rows, round {round}"
        );
        assert_eq!(d.read_u16(&lb, lru.len()), lru, "reset lru, round {round}");
        // invalidate
        let desc = InvalidateDesc {
            num_requests: g.size(3),
            hot_slots: g.size(8),
            num_ranges: g.size(3),
        };
        let ranges = g.buf(u64::from(desc.num_ranges) * 2, 12);
        let slot_host_rows0 = g.buf(u64::from(desc.num_requests) * u64::from(desc.hot_slots), 12);
        let mut slot_host_rows = slot_host_rows0.clone();
        let reference = invalidate(
            &desc,
            InvalidateArgs {
                ranges: &ranges[..],
                slot_host_rows: &mut slot_host_rows[..],
            },
        );
        let rb = d.i32s(&ranges);
        let mut gb = d.i32s(&slot_host_rows0);
        let backend = d.dev.invalidate(
            &d.stream,
            &desc,
            InvalidateArgs {
                ranges: &rb,
                slot_host_rows: &mut gb,
            },
        );
        same_outcome("invalidate", round, backend, reference);
        assert_eq!(
            d.read_i32(&gb, slot_host_rows.len()),
            slot_host_rows,
            "invalidate, round {round}"
        );
        // compressed slot mapping
        let ratio = 1 + g.below(4) as u32;
        let mut desc = SlotMappingDesc {
            num_tokens: g.below(8) as u32,
            ratio,
            block_size: ratio * (1 + g.below(4) as u32),
            table_rows: 1 + g.below(3) as u32,
            max_blocks: 1 + g.below(4) as u32,
        };
        if g.chance(25) {
            let v = g.size(16);
            match g.below(5) {
                0 => desc.num_tokens = v,
                1 => desc.ratio = v,
                2 => desc.block_size = v,
                3 => desc.table_rows = v,
                _ => desc.max_blocks = v,
            }
        }
        let t = u64::from(desc.num_tokens);
        let (positions, slot_mapping, table_row) = (g.buf(t, 40), g.buf(t, 40), g.buf(t, 3));
        let table = g.buf(
            u64::from(desc.table_rows) * u64::from(desc.max_blocks),
            1 << 20,
        );
        let out_len = g.len_for(t);
        let mut out = vec![-7; out_len];
        let reference = compressed_slot_mapping(
            &desc,
            SlotMappingArgs {
                positions: &positions[..],
                slot_mapping: &slot_mapping[..],
                table_row: &table_row[..],
                block_table: &table[..],
                out: &mut out[..],
            },
        );
        let (pb, sb, rb, bb) = (
            d.i32s(&positions),
            d.i32s(&slot_mapping),
            d.i32s(&table_row),
            d.i32s(&table),
        );
        let mut ob = d.i32s(&vec![-7; out_len]);
        let backend = d.dev.compressed_slot_mapping(
            &d.stream,
            &desc,
            SlotMappingArgs {
                positions: &pb,
                slot_mapping: &sb,
                table_row: &rb,
                block_table: &bb,
                out: &mut ob,
            },
        );
        same_outcome("compressed_slot_mapping", round, backend, reference);
        assert_eq!(d.read_i32(&ob, out_len), out, "slot mapping, round {round}");
    }
}
