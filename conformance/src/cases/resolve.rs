//! Residency resolve + swap-in (contract §5.2) over multi-step sequences: the per-request state
//! (`slot_host_rows`, `lru`) lives on the device across steps and is compared with the reference after every
//! step, together with every output. Some scenarios also apply each step's miss plan with
//! `gather_rows` to several layers (a leader and its followers) and compare the device pool.

use hisparse_core::Device;
use hisparse_core::ops::copy::gather_rows as reference_gather;
use hisparse_core::ops::invalidate::invalidate as reference_invalidate;
use hisparse_core::ops::resolve::resolve as reference;
use hisparse_core::ops::{
    GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, LayerPair, ResolveDesc,
};

use super::copies::{Rows, layouts, pool_sizes};
use super::resolve_io::{
    Asked, Coverage, DevOutputs, DevState, HostState, Outputs, SMALL, initial_stats, stats_slot,
};
use crate::util::{Ctx, at_step, dev_bytes, dev_i32, pinned_bytes, read_bytes, same};
use crate::{Case, CaseError, CaseResult, SplitMix64};

/// One random scenario.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    k: u32,
    hot_slots: u32,
    requests: u32,
    /// Token rows per request per step (speculative decoding when > 1).
    rows_per_request: u32,
    steps: usize,
    block_size: u32,
    /// Percent of pages still resident on the GPU.
    resident_pct: u64,
    /// Percent of pages whose host block lies beyond the host pool.
    beyond_pct: u64,
    /// Padding rows per step.
    padding_rows: u32,
    /// Percent of entries copied from another entry of the same row.
    dup_pct: u64,
    /// Percent of entries that are invalid (negative, past the pages).
    invalid_pct: u64,
    /// Percent of each request's top-k kept from the previous step.
    overlap_pct: u64,
    /// Shuffle the token rows of a step (rows of one request are then not adjacent).
    shuffle: bool,
    /// Start request 0 with a corrupt LRU and garbage `slot_host_rows`.
    corrupt: bool,
    /// Reclaim resident pages and invalidate host rows between steps.
    churn: bool,
    /// Layers gathered with each step's plan (0: no gather).
    layers: u32,
    /// Smallest context length (tokens) of a request (0: the default, `2 * k + 1`).
    min_ctx: u32,
    /// Split rows (values then scales) in the gathered pages.
    split: bool,
    /// The steps add to a stats buffer (at the slots of `resolve_io::stats_slot`).
    stats: bool,
}

const BASE: Scenario = Scenario {
    k: 64,
    hot_slots: 128,
    requests: 1,
    rows_per_request: 1,
    steps: 8,
    block_size: 16,
    resident_pct: 0,
    beyond_pct: 0,
    padding_rows: 0,
    dup_pct: 0,
    invalid_pct: 5,
    overlap_pct: 85,
    shuffle: false,
    corrupt: false,
    churn: false,
    layers: 0,
    split: false,
    min_ctx: 0,
    stats: false,
};

fn scenarios() -> Vec<(&'static str, Scenario)> {
    vec![
        ("basic", BASE),
        (
            "v32-k2048",
            Scenario {
                k: 2048,
                hot_slots: 4096,
                requests: 2,
                steps: 4,
                block_size: 64,
                ..BASE
            },
        ),
        (
            "k2176",
            Scenario {
                k: 2176,
                hot_slots: 4352,
                steps: 3,
                block_size: 64,
                ..BASE
            },
        ),
        (
            "speculative",
            Scenario {
                k: 128,
                hot_slots: 512,
                requests: 2,
                rows_per_request: 3,
                steps: 6,
                ..BASE
            },
        ),
        (
            "misses-beyond-evictable-slots",
            Scenario {
                k: 128,
                hot_slots: 128,
                rows_per_request: 3,
                overlap_pct: 30,
                ..BASE
            },
        ),
        (
            "resident-first",
            Scenario {
                resident_pct: 50,
                requests: 2,
                ..BASE
            },
        ),
        (
            "fully-resident",
            Scenario {
                resident_pct: 100,
                steps: 3,
                ..BASE
            },
        ),
        (
            "padding-rows",
            Scenario {
                requests: 3,
                padding_rows: 4,
                shuffle: true,
                ..BASE
            },
        ),
        (
            "host-row-beyond-pool",
            Scenario {
                beyond_pct: 20,
                requests: 2,
                ..BASE
            },
        ),
        (
            "several-requests-shuffled",
            Scenario {
                requests: 8,
                rows_per_request: 2,
                hot_slots: 256,
                shuffle: true,
                padding_rows: 2,
                ..BASE
            },
        ),
        (
            "duplicate-entries",
            Scenario {
                dup_pct: 40,
                rows_per_request: 2,
                ..BASE
            },
        ),
        (
            "corrupt-lru-repaired",
            Scenario {
                corrupt: true,
                requests: 2,
                ..BASE
            },
        ),
        (
            "reclaim-and-invalidate",
            Scenario {
                churn: true,
                resident_pct: 60,
                requests: 2,
                steps: 10,
                ..BASE
            },
        ),
        (
            "max-hot-slots-32768",
            Scenario {
                k: 2048,
                hot_slots: 32768,
                steps: 20,
                block_size: 64,
                // More distinct rows than slots: the LRU wraps around.
                min_ctx: 50_000,
                overlap_pct: 0,
                invalid_pct: 1,
                ..BASE
            },
        ),
        (
            "stats-speculative-padding",
            Scenario {
                k: 128,
                hot_slots: 512,
                requests: 3,
                rows_per_request: 2,
                padding_rows: 2,
                shuffle: true,
                resident_pct: 20,
                stats: true,
                ..BASE
            },
        ),
        (
            "stats-fully-resident",
            Scenario {
                resident_pct: 100,
                steps: 5,
                stats: true,
                ..BASE
            },
        ),
        (
            "stats-v32-k2048",
            Scenario {
                k: 2048,
                hot_slots: 4096,
                requests: 3,
                steps: 5,
                block_size: 64,
                padding_rows: 1,
                stats: true,
                ..BASE
            },
        ),
        (
            "followers-gather",
            Scenario {
                layers: 3,
                requests: 2,
                resident_pct: 30,
                beyond_pct: 30,
                ..BASE
            },
        ),
        (
            "followers-gather-split-rows",
            Scenario {
                layers: 2,
                split: true,
                requests: 2,
                churn: true,
                resident_pct: 30,
                ..BASE
            },
        ),
        (
            "speculative-gather",
            Scenario {
                layers: 2,
                k: 32,
                hot_slots: 96,
                rows_per_request: 3,
                requests: 3,
                shuffle: true,
                padding_rows: 1,
                ..BASE
            },
        ),
    ]
}

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (name, scn) in scenarios() {
        for s in 0..2 {
            v.push(Case::seeded(
                format!("resolve/{name}/{s}"),
                move |d: &D, seed| random(d, seed, scn),
            ));
        }
    }
    v.push(Case::fixed(
        "resolve/fixed/known-lru-trace",
        known_trace::<D>,
    ));
    v.push(Case::fixed("resolve/fixed/empty-batch", empty_batch::<D>));
}

/// The host copy of everything a resolve sequence carries, and its device twin.
struct State<D: Device> {
    desc: ResolveDesc,
    h: HostState,
    d: DevState<D>,
    /// Calls made so far (which stats slot the next one adds to: `stats_slot`).
    calls: usize,
}

impl<D: Device> State<D> {
    fn new(dev: &D, desc: ResolveDesc, h: HostState) -> Result<Self, CaseError> {
        Ok(State {
            d: DevState::upload(dev, &h)?,
            desc,
            h,
            calls: 0,
        })
    }

    /// Re-uploads the page tables after the host copy changed.
    fn sync_tables(&mut self, dev: &D) -> CaseResult {
        self.d.sync_tables(dev, &self.h)
    }

    /// Runs one step on the reference and on the device, compares outputs and state.
    fn step(
        &mut self,
        dev: &D,
        req_id: &[i32],
        topk: &[i32],
    ) -> Result<(Outputs, DevOutputs<D>), CaseError> {
        let slot = stats_slot(self.calls);
        self.calls += 1;
        let desc = ResolveDesc {
            num_tokens: req_id.len() as u32,
            stats_slot: slot.unwrap_or(0),
            ..self.desc
        };
        // A call without stats: the buffer is parked (and compared below, unchanged).
        let parked = slot
            .is_none()
            .then(|| (self.h.stats.take(), self.d.stats.take()));
        let t = req_id.len();
        let k = desc.top_k as usize;
        let mut want = Outputs::sentinels(t, k);
        reference(&desc, self.h.slices(req_id, topk, &mut want)).ctx("reference resolve")?;

        let s = dev.create_stream().ctx("create_stream")?;
        let d_req = dev_i32(dev, req_id)?;
        let d_topk = dev_i32(dev, topk)?;
        let mut d_out = DevOutputs::upload(dev, &Outputs::sentinels(t, k))?;
        dev.resolve(&s, &desc, self.d.args(&d_req, &d_topk, &mut d_out))
            .ctx("resolve")?;
        if let Some((h, d)) = parked {
            (self.h.stats, self.d.stats) = (h, d);
        }
        dev.synchronize(&s).ctx("synchronize")?;
        let got = d_out.read(dev, t, k)?;
        got.expect("", &want)?;
        self.compare_state(dev)?;
        Ok((got, d_out))
    }

    fn compare_state(&self, dev: &D) -> CaseResult {
        self.d.expect_hot_state(dev, "", &self.h)
    }

    /// Invalidates `ranges` on both sides and compares `slot_host_rows`.
    fn invalidate(&mut self, dev: &D, ranges: &[i32]) -> CaseResult {
        let desc = InvalidateDesc {
            num_requests: self.desc.num_requests,
            hot_slots: self.desc.hot_slots,
            num_ranges: (ranges.len() / 2) as u32,
        };
        reference_invalidate(
            &desc,
            InvalidateArgs {
                ranges,
                slot_host_rows: &mut self.h.slot_host_rows[..],
            },
        )
        .ctx("reference invalidate")?;
        let s = dev.create_stream().ctx("create_stream")?;
        let d_ranges = dev_i32(dev, ranges)?;
        dev.invalidate(
            &s,
            &desc,
            InvalidateArgs {
                ranges: &d_ranges,
                slot_host_rows: &mut self.d.slot_host_rows,
            },
        )
        .ctx("invalidate")?;
        self.compare_state(dev)
    }
}

/// The pools a gathering scenario moves rows between.
struct Pools<D: Device> {
    layers: Vec<LayerPair>,
    host: Vec<u8>,
    device: Vec<u8>,
    d_host: D::HostBuffer,
    d_device: D::Buffer,
}

impl<D: Device> Pools<D> {
    fn new(
        dev: &D,
        rng: &mut SplitMix64,
        scn: &Scenario,
        host_blocks: u32,
        device_blocks: u32,
    ) -> Result<Self, CaseError> {
        let (row_bytes, value_bytes) = if scn.split { (64u32, 48u32) } else { (48, 48) };
        let rows = Rows {
            row_bytes,
            value_bytes,
            block_size: scn.block_size,
            layers: scn.layers,
            extra_rows: 0,
            page_alignment: 1,
        };
        let layers = layouts(rows, host_blocks, device_blocks);
        let (host_len, device_len) = pool_sizes(rows, host_blocks, device_blocks);
        let mut host = vec![0u8; host_len];
        rng.fill(&mut host);
        let mut device = vec![0u8; device_len];
        rng.fill(&mut device);
        Ok(Pools {
            d_host: pinned_bytes(dev, &host)?,
            d_device: dev_bytes(dev, &device)?,
            layers,
            host,
            device,
        })
    }

    /// Applies a step's plan: layer 0 (the leader) in one call, the followers in a second call,
    /// on the device; all layers at once on the reference. Compares the device pool.
    fn gather(
        &mut self,
        dev: &D,
        t: usize,
        k: u32,
        plan: &Outputs,
        d_plan: &DevOutputs<D>,
    ) -> CaseResult {
        let all = GatherDesc {
            num_tokens: t as u32,
            top_k: k,
            layers: &self.layers,
        };
        reference_gather(
            &all,
            GatherArgs {
                plan_src: &plan.miss_src[..],
                plan_dst: &plan.miss_dst[..],
                plan_counts: &plan.misses[..],
                host: &self.host[..],
                device: &mut self.device[..],
            },
        )
        .ctx("reference gather")?;
        let s = dev.create_stream().ctx("create_stream")?;
        let (leader, followers) = self.layers.split_at(1);
        for group in [leader, followers] {
            if group.is_empty() {
                continue;
            }
            let desc = GatherDesc {
                num_tokens: t as u32,
                top_k: k,
                layers: group,
            };
            dev.gather_rows(
                &s,
                &desc,
                GatherArgs {
                    plan_src: &d_plan.miss_src,
                    plan_dst: &d_plan.miss_dst,
                    plan_counts: &d_plan.misses,
                    host: &self.d_host,
                    device: &mut self.d_device,
                },
            )
            .ctx("gather_rows")?;
        }
        dev.synchronize(&s).ctx("synchronize")?;
        same(
            "device pool after gather",
            &read_bytes(dev, &self.d_device, self.device.len())?,
            &self.device,
        )
    }
}

/// Builds a scenario's tables and runs its steps.
fn random<D: Device>(dev: &D, seed: u64, scn: Scenario) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (k, n, r_count, bs) = (scn.k, scn.hot_slots, scn.requests, scn.block_size);
    // Context lengths and page tables.
    let lo = (2 * k + 1).max(scn.min_ctx);
    let hi = (6 * k + bs).max(lo + k);
    let ctx_len: Vec<u32> = (0..r_count).map(|_| rng.u32_in(lo, hi)).collect();
    let max_pages = ctx_len.iter().max().copied().unwrap_or(1).div_ceil(bs) + 1;
    let pages_used: Vec<u32> = ctx_len.iter().map(|l| l.div_ceil(bs)).collect();
    let total_pages: u32 = pages_used.iter().sum();
    // Host blocks: a shuffled permutation of 1..=total (block 0 is the null block).
    let mut host_blocks: Vec<i32> = (1..=total_pages as i32).collect();
    rng.shuffle(&mut host_blocks);
    let beyond =
        ((u64::from(total_pages) * scn.beyond_pct / 100) as u32).max(u32::from(scn.beyond_pct > 0));
    let host_num_blocks = total_pages + 1 - beyond;
    let mut host = vec![-1i32; (r_count * max_pages) as usize];
    let mut resident = vec![0i32; (r_count * max_pages) as usize];
    let mut next = host_blocks.into_iter();
    // Hot blocks first, then resident blocks, all distinct GPU block ids.
    let width = n.div_ceil(bs);
    let hot: Vec<i32> = (0..r_count * width).map(|i| 1 + i as i32).collect();
    let mut next_gpu = 1 + (r_count * width) as i32;
    for r in 0..r_count {
        for p in 0..pages_used[r as usize] {
            let at = (r * max_pages + p) as usize;
            host[at] = next.next().unwrap_or(-1);
            if rng.percent(scn.resident_pct) {
                resident[at] = next_gpu;
                next_gpu += 1;
            } else if rng.percent(30) {
                resident[at] = -1;
            }
        }
    }
    if scn.resident_pct > 0 && !resident.iter().any(|&b| b > 0) {
        // Every page drew "host": make one resident so the scenario tests what it says.
        resident[0] = next_gpu;
        next_gpu += 1;
    }
    let device_blocks = next_gpu as u32;
    let stride = if scn.layers > 0 {
        scn.layers * bs
    } else {
        bs * rng.pick(&[1u32, 3])
    };
    let desc = ResolveDesc {
        num_tokens: 0,
        top_k: k,
        num_requests: r_count,
        max_pages,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: stride,
        host_num_blocks,
        num_state_rows: None,
        stats_slot: 0,
    };
    let mut lru: Vec<u16> = (0..r_count * n).map(|s| (s % n) as u16).collect();
    let mut slot_host_rows = vec![-1i32; (r_count * n) as usize];
    for r in 0..r_count as usize {
        let l = &mut lru[r * n as usize..(r + 1) * n as usize];
        rng.shuffle(l);
    }
    if scn.corrupt {
        // Request 0: a repeated slot (not a permutation) and garbage cached rows.
        lru[1] = lru[0];
        for d in &mut slot_host_rows[..n as usize] {
            *d = rng.i32_in(-5, (host_num_blocks * bs) as i32 + 50);
        }
    }
    let mut st = State::new(
        dev,
        desc,
        HostState {
            resident,
            host,
            hot,
            slot_host_rows,
            lru,
            idx_mapping: None,
            stats: scn.stats.then(|| initial_stats(&mut rng)),
        },
    )?;
    let mut pools = if scn.layers > 0 {
        Some(Pools::new(
            dev,
            &mut rng,
            &scn,
            host_num_blocks + 4,
            device_blocks,
        )?)
    } else {
        None
    };

    // Each request's current top-k (token positions), evolved step by step.
    let mut current: Vec<Vec<i32>> = ctx_len
        .iter()
        .map(|&l| (0..k).map(|_| rng.i32_in(0, l as i32)).collect())
        .collect();
    let span = (max_pages * bs) as i32;
    let mut seen = Coverage::default();
    for step in 0..scn.steps {
        let mut rows: Vec<(i32, Vec<i32>)> = Vec::new();
        for r in 0..r_count as usize {
            // Most steps every request decodes; sometimes one sits out.
            if r_count > 1 && rng.percent(10) {
                continue;
            }
            let l = ctx_len[r] as i32;
            for tok in current[r].iter_mut() {
                if !rng.percent(scn.overlap_pct) {
                    *tok = rng.i32_in(0, l);
                }
            }
            for q in 0..scn.rows_per_request {
                let mut row = current[r].clone();
                if q > 0 {
                    for tok in row.iter_mut() {
                        if rng.percent(20) {
                            *tok = rng.i32_in(0, l);
                        }
                    }
                }
                for j in 0..row.len() {
                    if rng.percent(scn.dup_pct) {
                        row[j] = row[rng.below(row.len() as u64) as usize];
                    }
                    if rng.percent(scn.invalid_pct) {
                        row[j] = match rng.below(4) {
                            0 => -1,
                            1 => rng.i32_in(i32::MIN, 0),
                            2 => span + rng.i32_in(0, 100),
                            // Inside the pages but past the context: host block -1.
                            _ => rng.i32_in(l, span),
                        };
                    }
                }
                rows.push((r as i32, row));
            }
        }
        for _ in 0..scn.padding_rows {
            let id = rng.pick(&[-1, -7, r_count as i32, i32::MAX]);
            let row = (0..k).map(|_| rng.i32_in(0, span)).collect();
            let at = rng.below(rows.len() as u64 + 1) as usize;
            rows.insert(at, (id, row));
        }
        if scn.shuffle {
            rng.shuffle(&mut rows);
        }
        let req_id: Vec<i32> = rows.iter().map(|(id, _)| *id).collect();
        let topk: Vec<i32> = rows
            .iter()
            .flat_map(|(_, row)| row.iter().copied())
            .collect();
        let lru_before = st.h.lru.clone();
        let (out, d_out) = at_step(step, st.step(dev, &req_id, &topk))?;
        seen.add(&st.desc, &st.h, (&req_id, &topk), &out);
        if scn.resident_pct == 100 {
            same("lru of a fully resident step", &st.h.lru, &lru_before)?;
        }
        if let Some(p) = pools.as_mut() {
            at_step(step, p.gather(dev, req_id.len(), k, &out, &d_out))?;
        }
        if scn.churn {
            // Reclaim a few resident pages (their host copies are durable) ...
            for e in st.h.resident.iter_mut() {
                if *e > 0 && rng.percent(15) {
                    *e = 0;
                }
            }
            at_step(step, st.sync_tables(dev))?;
            // ... and invalidate a few host row ranges (rewritten or recycled host blocks),
            // including an empty range.
            let rows = (host_num_blocks * bs) as i32;
            let mut ranges = Vec::new();
            for _ in 0..rng.below(4) {
                let a = rng.i32_in(0, rows);
                ranges.extend_from_slice(&[a, a + rng.i32_in(0, 3 * bs as i32)]);
            }
            ranges.extend_from_slice(&[5, 5]);
            at_step(step, st.invalidate(dev, &ranges))?;
        }
    }
    seen.expect(&asked(&scn))
}

/// What `scn` asks its sequence to exercise.
fn asked(scn: &Scenario) -> Asked {
    Asked {
        fully_resident: scn.resident_pct == 100,
        hits: scn.overlap_pct > 0,
        resident: scn.resident_pct > 0,
        beyond_pool: scn.beyond_pct > 0,
        beyond_slots: scn.rows_per_request * scn.k > scn.hot_slots,
    }
}

/// A hand-computed trace (independent of the reference): 4 slots, top-k 2, block size 4.
fn known_trace<D: Device>(dev: &D) -> CaseResult {
    let desc = SMALL;
    // Page p lives in host block p; nothing resident; the hot region is GPU block 5, so slot s
    // is physical row 20 + s.
    let mut st = State::new(
        dev,
        desc,
        HostState {
            resident: vec![0; 4],
            host: vec![0, 1, 2, 3],
            hot: vec![5],
            slot_host_rows: vec![-1; 4],
            lru: vec![0, 1, 2, 3],
            idx_mapping: None,
            stats: None,
        },
    )?;
    struct Expect {
        topk: [i32; 2],
        indices: [i32; 2],
        valid: i32,
        hits: i32,
        misses: i32,
        src: [i32; 2],
        dst: [i32; 2],
        slot_host_rows: [i32; 4],
        lru: [u16; 4],
    }
    let trace = [
        // Two misses take the two least recent slots.
        Expect {
            topk: [0, 1],
            indices: [20, 21],
            valid: 2,
            hits: 0,
            misses: 2,
            src: [0, 1],
            dst: [20, 21],
            slot_host_rows: [0, 1, -1, -1],
            lru: [2, 3, 0, 1],
        },
        // One hit (slot 1), one miss (host row 5) into the least recent evictable slot 2;
        // new order: unused evictables (3, 0), the miss (2), the hit (1).
        Expect {
            topk: [1, 5],
            indices: [21, 22],
            valid: 2,
            hits: 1,
            misses: 1,
            src: [5, -1],
            dst: [22, -1],
            slot_host_rows: [0, 1, 5, -1],
            lru: [3, 0, 2, 1],
        },
        // A hit and an invalid entry: no miss, but the hit moves to the most recent end.
        Expect {
            topk: [5, -1],
            indices: [22, -1],
            valid: 1,
            hits: 1,
            misses: 0,
            src: [-1, -1],
            dst: [-1, -1],
            slot_host_rows: [0, 1, 5, -1],
            lru: [3, 0, 1, 2],
        },
        // Host row 0 hits slot 0; host row 9 misses into slot 3.
        Expect {
            topk: [0, 9],
            indices: [20, 23],
            valid: 2,
            hits: 1,
            misses: 1,
            src: [9, -1],
            dst: [23, -1],
            slot_host_rows: [0, 1, 5, 9],
            lru: [1, 2, 3, 0],
        },
    ];
    for (step, e) in trace.iter().enumerate() {
        let (out, _) = at_step(step, st.step(dev, &[0], &e.topk))?;
        let check = || -> CaseResult {
            same("indices", &out.indices[..2], &e.indices)?;
            same(
                "counts (valid, hits, misses)",
                &[out.valid[0], out.hits[0], out.misses[0]],
                &[e.valid, e.hits, e.misses],
            )?;
            same("miss_src", &out.miss_src[..2], &e.src)?;
            same("miss_dst", &out.miss_dst[..2], &e.dst)?;
            same("slot_host_rows", &st.h.slot_host_rows, &e.slot_host_rows)?;
            same("lru", &st.h.lru, &e.lru)
        };
        at_step(step, check())?;
    }
    // Page 0 becomes resident on GPU block 7: entries resolve there, the LRU is untouched.
    st.h.resident[0] = 7;
    st.sync_tables(dev)?;
    let (out, _) = at_step(4, st.step(dev, &[0], &[1, 2]))?;
    same("resident indices", &out.indices[..2], &[29, 30])?;
    same("lru after a fully resident row", &st.h.lru, &[1, 2, 3, 0])?;
    // Page 3's host block lies beyond the 4-block pool: both rows miss, their plan sources are
    // -1 (zero-fill) and their slots cache nothing.
    st.h.host[3] = 9;
    st.sync_tables(dev)?;
    let (out, _) = at_step(5, st.step(dev, &[0], &[12, 13]))?;
    same("beyond-pool indices", &out.indices[..2], &[21, 22])?;
    same("beyond-pool miss_src", &out.miss_src[..2], &[-1, -1])?;
    same("beyond-pool miss_dst", &out.miss_dst[..2], &[21, 22])?;
    same(
        "beyond-pool slot_host_rows",
        &st.h.slot_host_rows,
        &[0, -1, -1, 9],
    )?;
    same("beyond-pool lru", &st.h.lru, &[3, 0, 1, 2])?;
    // A padding row touches nothing.
    let (out, _) = at_step(6, st.step(dev, &[-1], &[0, 1]))?;
    same("padding indices", &out.indices[..2], &[-1, -1])?;
    same("padding lru", &st.h.lru, &[3, 0, 1, 2])
}

fn empty_batch<D: Device>(dev: &D) -> CaseResult {
    let desc = ResolveDesc {
        num_tokens: 0,
        top_k: 8,
        num_requests: 2,
        hot_slots: 16,
        attention_block_stride: 8,
        host_num_blocks: 8,
        ..SMALL
    };
    let lru: Vec<u16> = (0..32).map(|i| (31 - i) as u16 % 16).collect();
    let mut st = State::new(
        dev,
        desc,
        HostState {
            resident: vec![0; 8],
            host: (0..8).collect(),
            hot: vec![1, 2, 3, 4, 5, 6, 7, 8],
            slot_host_rows: (0..32).collect(),
            lru: lru.clone(),
            idx_mapping: None,
            stats: None,
        },
    )?;
    st.step(dev, &[], &[])?;
    same("lru after an empty batch", &st.h.lru, &lru)
}
