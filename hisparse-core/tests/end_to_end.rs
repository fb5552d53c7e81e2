//! End to end on the reference data plane: the coordinator's commands drive real byte pools
//! through the core's reference operations (table updates, copy-on-write, restores, forward
//! writes, resolve + gather of top-k rows, row mirrors and page spills), and every row attention
//! reads is compared with the KV the forward pass wrote for that token.
//!
//! Copies of a transfer batch are executed only when the (simulated) worker completes it, at a
//! random later time, reading the device pool *then* — so a block reused or reclaimed before its
//! copy ran shows up as wrong bytes. Prefix sharing, split value/scale rows, leaders with
//! followers and two buckets are all exercised.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand, RequestId};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec, RegularLayer, SparseLayer};
use hisparse_core::ops::copy::{copy_host_pages, copy_pages, copy_rows, gather_rows};
use hisparse_core::ops::invalidate::invalidate;
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, LayerPair,
    PageCopyDesc, ResolveDesc, RowCopyDesc,
};
use proptest::prelude::*;

const BT: u32 = 4;
const TOP_K: u32 = 4;
const HOT: u32 = 8;
const MAX_LEN: u32 = 40;

static READS: AtomicU64 = AtomicU64::new(0);
static HOST_READS: AtomicU64 = AtomicU64::new(0);
static COW: AtomicU64 = AtomicU64::new(0);
static RECLAIMS: AtomicU64 = AtomicU64::new(0);

static LAYERS: [LayerSpec; 4] = [
    LayerSpec::Sparse(SparseLayer {
        row_bytes: 32,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: Some(16),
    }),
    LayerSpec::Sparse(SparseLayer {
        row_bytes: 32,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: None,
    }),
    LayerSpec::Sparse(SparseLayer {
        row_bytes: 32,
        value_bytes: 16,
        compress_ratio: 1,
        indexer_row_bytes: Some(16),
    }),
    LayerSpec::Regular(RegularLayer {
        row_bytes: 16,
        compress_ratio: 1,
        sliding_window: None,
    }),
];

static MODEL: ModelSpec<'static> = ModelSpec {
    name: "e2e",
    block_tokens: BT,
    top_k: TOP_K,
    layers: &LAYERS,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

/// The KV row the forward pass writes for `layer` at a token whose prefix hashes to `prefix`.
fn row_bytes_for(layer: u32, prefix: u64, len: usize) -> Vec<u8> {
    let mut h = mix(prefix, u64::from(layer) + 1);
    (0..len)
        .map(|i| {
            if i % 8 == 0 {
                h = mix(h, i as u64);
            }
            (h >> ((i % 8) * 8)) as u8
        })
        .collect()
}

struct Engine {
    kv: KvCacheConfig,
    host: Vec<u8>,
    device: Vec<u8>,
    rows: usize,
    /// row → bucket → page → block (i32 tables as the data plane holds them).
    resident: Vec<Vec<i32>>,
    host_table: Vec<i32>,
    hot: Vec<Vec<i32>>,
    /// index group → dgi / lru per row.
    dgi: Vec<Vec<i32>>,
    lru: Vec<Vec<u16>>,
    pairs_by_bucket: Vec<Vec<LayerPair>>,
    pairs_by_group: Vec<Vec<LayerPair>>,
    bucket_of_group: Vec<usize>,
    /// Copies waiting for their batch's completion.
    queued: VecDeque<(u64, OffloadCommand)>,
}

impl Engine {
    fn new(kv: KvCacheConfig, rows: usize) -> Self {
        let mp = kv.max_pages_per_request as usize;
        let nb = kv.num_buckets as usize;
        let ng = kv.index_groups.len();
        let pairs_by_bucket = (0..kv.num_buckets)
            .map(|b| {
                kv.groups[kv.resident_group(b)]
                    .layers
                    .iter()
                    .map(|l| kv.layer_pair(l.layer).unwrap())
                    .collect()
            })
            .collect();
        let pairs_by_group = (0..ng).map(|g| kv.index_group_pairs(g).unwrap()).collect();
        let bucket_of_group = kv.index_groups.iter().map(|g| g.bucket as usize).collect();
        Engine {
            host: vec![0xEE; kv.host_pool_bytes() as usize],
            device: vec![0xDD; kv.gpu_pool_bytes() as usize],
            rows,
            resident: vec![vec![0; rows * mp]; nb],
            host_table: vec![-1; rows * mp],
            hot: vec![vec![-1; rows * kv.hot_blocks_per_request as usize]; nb],
            dgi: vec![vec![-1; rows * HOT as usize]; ng],
            lru: vec![(0..rows).flat_map(|_| 0..HOT as u16).collect(); ng],
            pairs_by_bucket,
            pairs_by_group,
            bucket_of_group,
            queued: VecDeque::new(),
            kv,
        }
    }

    fn reset_hot_state(&mut self, row: usize, bucket: usize) {
        for g in 0..self.dgi.len() {
            if self.bucket_of_group[g] == bucket {
                let n = HOT as usize;
                self.dgi[g][row * n..(row + 1) * n].fill(-1);
                for (i, v) in self.lru[g][row * n..(row + 1) * n].iter_mut().enumerate() {
                    *v = i as u16;
                }
            }
        }
    }

    /// Applies the before-forward part of a command.
    fn before_forward(&mut self, cmd: &OffloadCommand) {
        let mp = self.kv.max_pages_per_request as usize;
        let hb = self.kv.hot_blocks_per_request as usize;
        let nb = self.kv.num_buckets as usize;
        for &row in &cmd.started {
            let row = row as usize;
            self.host_table[row * mp..(row + 1) * mp].fill(-1);
            for b in 0..nb {
                self.resident[b][row * mp..(row + 1) * mp].fill(0);
                self.hot[b][row * hb..(row + 1) * hb].fill(-1);
                self.reset_hot_state(row, b);
            }
        }
        for &row in &cmd.hot_release {
            for b in 0..nb {
                self.hot[b][row as usize * hb..(row as usize + 1) * hb].fill(-1);
            }
        }
        for u in &cmd.host_blocks {
            self.host_table[u.slot as usize * mp + u.page as usize] = u.block as i32;
        }
        for u in &cmd.residency {
            let b = u.group as usize - 2;
            self.resident[b][u.slot as usize * mp + u.page as usize] = u.block as i32;
        }
        for a in &cmd.hot_assign {
            let b = a.group as usize - 2 - nb;
            let row = a.slot as usize;
            for (i, &blk) in a.blocks.iter().enumerate() {
                self.hot[b][row * hb + i] = blk as i32;
            }
            self.reset_hot_state(row, b);
        }
        if !cmd.new_host_blocks.is_empty() {
            let bs = self.kv.block_size as i32;
            let ranges: Vec<i32> = cmd
                .new_host_blocks
                .iter()
                .flat_map(|&h| [h as i32 * bs, (h as i32 + 1) * bs])
                .collect();
            for dgi in &mut self.dgi {
                let desc = InvalidateDesc {
                    num_requests: self.rows as u32,
                    hot_slots: HOT,
                    num_ranges: cmd.new_host_blocks.len() as u32,
                };
                invalidate(
                    &desc,
                    InvalidateArgs {
                        ranges: &ranges[..],
                        dgi: &mut dgi[..],
                    },
                )
                .unwrap();
            }
        }
        if !cmd.host_cow.is_empty() {
            let layers: Vec<_> = self.kv.all_layer_pairs().iter().map(|p| p.host).collect();
            copy_host_pages(&layers, &cmd.host_cow, &mut self.host).unwrap();
        }
        for r in &cmd.restores {
            let desc = PageCopyDesc {
                direction: Direction::HostToDevice,
                layers: &self.pairs_by_bucket[r.bucket as usize],
            };
            let pair = BlockPair {
                src: r.host_block,
                dst: r.device_block,
            };
            copy_pages(&desc, &[pair], &mut self.host, &mut self.device).unwrap();
        }
        let bpb = self.kv.bytes_per_block as usize;
        for p in &cmd.gpu_cow {
            let s = p.src as usize * bpb;
            self.device.copy_within(s..s + bpb, p.dst as usize * bpb);
        }
    }

    /// Executes the after-forward copies of a batch (when its worker completes it).
    fn run_copies(&mut self, cmd: &OffloadCommand) {
        for (b, layers) in self.pairs_by_bucket.iter().enumerate() {
            let spans: Vec<_> = cmd
                .row_mirrors
                .iter()
                .filter(|m| m.bucket as usize == b)
                .map(|m| m.span)
                .collect();
            if !spans.is_empty() {
                let desc = RowCopyDesc {
                    direction: Direction::DeviceToHost,
                    layers,
                };
                copy_rows(&desc, &spans, &mut self.host, &mut self.device).unwrap();
            }
            let pairs: Vec<_> = cmd
                .page_transfers
                .iter()
                .filter(|t| t.bucket as usize == b)
                .map(|t| BlockPair {
                    src: t.device_block,
                    dst: t.host_block,
                })
                .collect();
            if !pairs.is_empty() {
                let desc = PageCopyDesc {
                    direction: Direction::DeviceToHost,
                    layers,
                };
                copy_pages(&desc, &pairs, &mut self.host, &mut self.device).unwrap();
            }
        }
    }
}

struct Req {
    tokens: Vec<u32>,
    /// Prefix hash after each token.
    prefix: Vec<u64>,
}

impl Req {
    fn new(tokens: Vec<u32>) -> Self {
        let mut r = Req {
            tokens: Vec::new(),
            prefix: Vec::new(),
        };
        for t in tokens {
            r.push(t);
        }
        r
    }
    fn push(&mut self, t: u32) {
        let p = self.prefix.last().copied().unwrap_or(1);
        self.tokens.push(t);
        self.prefix.push(mix(p, u64::from(t)));
    }
}

fn run(
    seed: u64,
    gpu_blocks: u32,
    eager: bool,
    prefix: bool,
    steps: u32,
) -> Result<(), TestCaseError> {
    let mut rng = Rng(seed | 1);
    let mut cfg = HiSparseConfig::new(TOP_K, 48 * 3 * 128);
    cfg.device_buffer_size = Some(HOT);
    cfg.eager_host_mirror = eager;
    let mut input = LayoutInput::new(&MODEL, &cfg, 0, MAX_LEN);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    let kv = plan_layout(&input).unwrap();
    let rows = 4usize;
    let mut c = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: rows as u32,
            max_batched_tokens: 24,
            max_spill_pages_per_step: 2,
            num_workers: 1,
            enable_prefix_caching: prefix,
            reclaim_min_blocks: 0,
        },
    )
    .unwrap();
    let mut e = Engine::new(kv.clone(), rows);
    let mut reqs: HashMap<RequestId, Req> = HashMap::new();
    let mut next_id = 1;
    let mut checked_reads = 0u64;
    let mut host_reads = 0u64;
    let bs = kv.block_size;
    let mp = kv.max_pages_per_request as usize;
    for _ in 0..steps {
        while reqs.len() < 6 && rng.below(3) == 0 {
            let len = 1 + rng.below(u64::from(MAX_LEN) - 8) as u32;
            let family = rng.below(3) as u32;
            let toks: Vec<u32> = (0..len).map(|i| family * 100 + i).collect();
            c.admit(next_id, &toks).unwrap();
            reqs.insert(next_id, Req::new(toks));
            next_id += 1;
        }
        let cmd = c.step().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        e.before_forward(&cmd);
        COW.fetch_add(cmd.host_cow.len() as u64, Relaxed);
        RECLAIMS.fetch_add(
            cmd.residency.iter().filter(|u| u.block == 0).count() as u64,
            Relaxed,
        );
        // Forward: write every computed token's KV into its resident page.
        for s in &cmd.scheduled {
            let r = &reqs[&s.id];
            let row = s.slot as usize;
            for pos in s.first_token..s.first_token + s.num_tokens {
                let page = (pos / bs) as usize;
                for (b, layers) in e.pairs_by_bucket.iter().enumerate() {
                    let blk = e.resident[b][row * mp + page];
                    prop_assert!(
                        blk > 0,
                        "token {} of request {} written to a null page",
                        pos,
                        s.id
                    );
                    for (li, l) in layers.iter().enumerate() {
                        let layer = kv.groups[kv.resident_group(b as u32)].layers[li].layer;
                        let bytes = row_bytes_for(layer, r.prefix[pos as usize], 32);
                        let [(vo, vl), (so, sl)] = l.device.row_parts(blk as u32, pos % bs);
                        e.device[vo as usize..(vo + vl) as usize]
                            .copy_from_slice(&bytes[..vl as usize]);
                        e.device[so as usize..(so + sl) as usize]
                            .copy_from_slice(&bytes[vl as usize..]);
                    }
                }
            }
        }
        // Attention of each scheduled request's last token: resolve + gather per index group,
        // then read the rows back.
        if !cmd.scheduled.is_empty() {
            let t = cmd.scheduled.len();
            let mut req_id = vec![-1i32; t];
            let mut topk = vec![-1i32; t * TOP_K as usize];
            for (i, s) in cmd.scheduled.iter().enumerate() {
                req_id[i] = s.slot as i32;
                let last = s.first_token + s.num_tokens;
                for j in 0..TOP_K as usize {
                    topk[i * TOP_K as usize + j] = rng.below(u64::from(last)) as i32;
                }
            }
            for g in 0..kv.index_groups.len() {
                let b = e.bucket_of_group[g];
                let desc = ResolveDesc {
                    num_tokens: t as u32,
                    top_k: TOP_K,
                    num_requests: rows as u32,
                    max_pages: mp as u32,
                    block_size: bs,
                    hot_slots: HOT,
                    attention_block_stride: kv.attention_block_stride,
                    host_num_blocks: kv.host_num_blocks,
                };
                let k = TOP_K as usize;
                let (mut idx, mut valid, mut hits, mut misses) =
                    (vec![0; t * k], vec![0; t], vec![0; t], vec![0; t]);
                let (mut msrc, mut mdst) = (vec![0; t * k], vec![0; t * k]);
                resolve(
                    &desc,
                    hisparse_core::ops::ResolveSlices {
                        req_id: &req_id,
                        topk: &topk,
                        resident_table: &e.resident[b],
                        host_table: &e.host_table,
                        hot_table: &e.hot[b],
                        dgi: &mut e.dgi[g],
                        lru: &mut e.lru[g],
                        indices: &mut idx,
                        valid_counts: &mut valid,
                        hit_counts: &mut hits,
                        miss_counts: &mut misses,
                        miss_src: &mut msrc,
                        miss_dst: &mut mdst,
                    },
                )
                .unwrap();
                let gdesc = GatherDesc {
                    num_tokens: t as u32,
                    top_k: TOP_K,
                    layers: &e.pairs_by_group[g],
                };
                gather_rows(
                    &gdesc,
                    GatherArgs {
                        plan_src: &msrc[..],
                        plan_dst: &mdst[..],
                        plan_counts: &misses[..],
                        host: &e.host[..],
                        device: &mut e.device[..],
                    },
                )
                .unwrap();
                host_reads += misses.iter().map(|&m| m as u64).sum::<u64>();
                for (i, s) in cmd.scheduled.iter().enumerate() {
                    let r = &reqs[&s.id];
                    for j in 0..k {
                        let tok = topk[i * k + j] as usize;
                        let phys = idx[i * k + j];
                        prop_assert!(phys >= 0, "valid top-k entry resolved to -1");
                        for (li, &layer) in kv.index_groups[g].layers.iter().enumerate() {
                            let l = &e.pairs_by_group[g][li].device;
                            let (blk, off) = l.locate(phys.into()).unwrap();
                            let [(vo, vl), (so, sl)] = l.row_parts(blk, off);
                            let mut got = e.device[vo as usize..(vo + vl) as usize].to_vec();
                            got.extend_from_slice(&e.device[so as usize..(so + sl) as usize]);
                            let want = row_bytes_for(layer, r.prefix[tok], 32);
                            prop_assert_eq!(
                                got,
                                want,
                                "request {} token {} layer {} read wrong bytes (resident page {})",
                                s.id,
                                tok,
                                layer,
                                e.resident[b][s.slot as usize * mp + tok / bs as usize]
                            );
                            checked_reads += 1;
                        }
                    }
                }
            }
        }
        if let Some(id) = cmd.transfer_id {
            e.queued.push_back((id, cmd));
        }
        // The worker completes a random number of queued batches, running their copies now.
        let n = rng.below(e.queued.len() as u64 + 1);
        for _ in 0..n {
            let (id, batch) = e.queued.pop_front().unwrap();
            e.run_copies(&batch);
            c.report(0, &[id], &[id]).unwrap();
        }
        // Sample or finish.
        let ids: Vec<RequestId> = c.running_ids().collect();
        for id in ids {
            if c.num_computed(id) == c.num_tokens(id) {
                let r = reqs.get_mut(&id).unwrap();
                if r.tokens.len() as u32 >= MAX_LEN - 1 || rng.below(8) == 0 {
                    c.finish(id).unwrap();
                    reqs.remove(&id);
                } else {
                    let t = 7 + rng.below(2) as u32;
                    c.append_tokens(id, &[t]).unwrap();
                    r.push(t);
                }
            }
        }
        c.check_invariants()
            .map_err(|v| TestCaseError::fail(format!("{v}")))?;
    }
    READS.fetch_add(checked_reads, Relaxed);
    HOST_READS.fetch_add(host_reads, Relaxed);
    Ok(())
}

#[test]
fn reads_match_writes() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    });
    let strategy = (any::<u64>(), 60u32..140, any::<bool>(), any::<bool>());
    if let Err(e) = runner.run(&strategy, |(seed, gpu, eager, prefix)| {
        run(seed, gpu, eager, prefix, 120)
    }) {
        panic!("{e}");
    }
    let counts = [
        ("rows read back", READS.load(Relaxed)),
        ("rows gathered from host", HOST_READS.load(Relaxed)),
        ("copy-on-write tails", COW.load(Relaxed)),
        ("pages reclaimed", RECLAIMS.load(Relaxed)),
    ];
    println!("coverage over {cases} runs: {counts:?}");
    if cases >= 100 {
        for (what, n) in counts {
            assert!(n > 0, "no {what} in {cases} runs: the test lost its teeth");
        }
    }
}
