//! Batch-row order (the resolve module's *Table row order*): `req_id` names batch rows, the host
//! and hot tables are rebuilt by batch row every step, `idx_mapping` maps each batch row to its
//! persistent state row (resident table, `slot_host_rows`, LRU), over multi-step sequences in which the
//! batch changes its order and membership every step.
//!
//! Every step runs three calls and compares them:
//! * the reference in batch-row order, and the device in batch-row order (its `resolve`, or its
//!   `resolve_and_gather` for the gathering shapes, with the device pool compared too): every
//!   output, with the sentinels past them, and the `slot_host_rows` and LRU rows;
//! * the *reordering equivalence*: the same workload in state-row order — `req_id` naming each
//!   owning batch row's state row (`-1` for the rows the rule makes padding, decided here by
//!   first occurrence in `idx_mapping`, independently of the core), the host and hot tables kept
//!   by state row — on the reference and on the device, on their own copies of the hot state:
//!   the outputs, the hot state and the device pool must equal the batch-order call's.
//!
//! Mappings cover a random permutation with more state rows than batch rows, duplicate state
//! rows (the smallest batch row owns one, the others are padding whether or not the owner has
//! token rows), negative and out-of-range state rows, padding rows, speculative rows (several
//! token rows of one batch row, shuffled), an empty step, resident pages and their reclaim.

use std::collections::HashSet;

use hisparse_core::Device;
use hisparse_core::ops::resolve::resolve as reference_resolve;
use hisparse_core::ops::swap_in::resolve_and_gather as reference_swap_in;
use hisparse_core::ops::{LayerPair, ResolveDesc};

use super::copies::{Rows, layouts, pool_sizes};
use super::resolve_io::{Coverage, DevOutputs, DevState, HostState, Outputs, SMALL};
use crate::util::{
    Ctx, at_step, dev_bytes, dev_i32, ensure, expect_invalid, pinned_bytes, read_bytes, same,
};
use crate::{Case, CaseError, CaseResult, SplitMix64};

/// One random batch-row-order sequence.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Batch rows (`num_requests`, the length of `idx_mapping`).
    batch_rows: u32,
    /// State rows (`num_state_rows`).
    state_rows: u32,
    /// Batch rows per step that repeat an earlier batch row's state row.
    duplicates: u32,
    /// Batch rows per step whose state row is negative or `≥ state_rows`.
    out_of_range: u32,
    /// Token rows per batch row (speculative decoding when > 1).
    rows_per_request: u32,
    /// Padding rows per step (`req_id` `-1`, `-7`, `batch_rows`, `i32::MAX`).
    padding_rows: u32,
    top_k: u32,
    hot_slots: u32,
    block_size: u32,
    /// Pages of each state row's context.
    pages: u32,
    /// Percent of pages resident on the GPU (reclaimed between steps).
    resident_pct: u64,
    /// Layers the plan is gathered into with `resolve_and_gather` (0: `resolve` only).
    layers: u32,
    /// Step 1 has no token rows.
    empty_step: bool,
    steps: usize,
}

const BASE: Shape = Shape {
    batch_rows: 4,
    state_rows: 9,
    duplicates: 0,
    out_of_range: 0,
    rows_per_request: 1,
    padding_rows: 0,
    top_k: 32,
    hot_slots: 64,
    block_size: 8,
    pages: 24,
    resident_pct: 0,
    layers: 0,
    empty_step: false,
    steps: 6,
};

fn shapes() -> Vec<(&'static str, Shape)> {
    vec![
        ("permutation", BASE),
        (
            "more-state-rows",
            Shape {
                batch_rows: 3,
                state_rows: 40,
                resident_pct: 30,
                ..BASE
            },
        ),
        (
            "duplicate-state-rows",
            Shape {
                batch_rows: 7,
                duplicates: 3,
                ..BASE
            },
        ),
        (
            "out-of-range-state-rows",
            Shape {
                batch_rows: 7,
                out_of_range: 3,
                padding_rows: 3,
                ..BASE
            },
        ),
        (
            // At least 64 token rows: the row count from which the CUDA and ROCm devices' swap-in
            // is their one fused launch.
            "decode-batch-80",
            Shape {
                batch_rows: 80,
                state_rows: 120,
                duplicates: 3,
                out_of_range: 3,
                padding_rows: 2,
                steps: 4,
                ..BASE
            },
        ),
        (
            "speculative-padding",
            Shape {
                batch_rows: 5,
                duplicates: 1,
                out_of_range: 1,
                rows_per_request: 3,
                padding_rows: 2,
                hot_slots: 128,
                empty_step: true,
                ..BASE
            },
        ),
    ]
}

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (name, shape) in shapes() {
        for (family, layers) in [("resolve", 0), ("resolve_and_gather", 2)] {
            let shape = Shape { layers, ..shape };
            for s in 0..2 {
                v.push(Case::seeded(
                    format!("{family}/batch-order/{name}/{s}"),
                    move |d: &D, seed| random(d, seed, shape),
                ));
            }
        }
    }
    v.push(Case::fixed(
        "resolve/batch-order/refused-before-any-write",
        refused_before_any_write::<D>,
    ));
}

/// The persistent per-state-row world: contexts, host pages, hot regions, resident pages.
struct Persistent {
    ctx_len: Vec<u32>,
    /// `[state][page]` host blocks.
    host: Vec<i32>,
    /// `[state][column]` hot-region GPU blocks.
    hot: Vec<i32>,
    /// Each state row's current top-k, evolved step by step.
    current: Vec<Vec<i32>>,
}

/// The pools a gathering shape moves rows between (host copies and device twins).
struct Pools<D: Device> {
    layers: Vec<LayerPair>,
    host: Vec<u8>,
    /// The reference's device pool (both orders give the same bytes).
    device: Vec<u8>,
    d_host: D::HostBuffer,
    /// The device pool of the batch-order call and of the state-order call.
    d_batch: D::Buffer,
    d_state: D::Buffer,
}

/// The state row batch row `b` owns under the rule, computed here by first occurrence.
fn owners(map: &[i32], state_rows: u32) -> Vec<Option<i32>> {
    let mut seen = HashSet::new();
    map.iter()
        .map(|&s| (s >= 0 && (s as u32) < state_rows && seen.insert(s)).then_some(s))
        .collect()
}

fn random<D: Device>(dev: &D, seed: u64, sh: Shape) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (rb, sr, k, n, bs) = (
        sh.batch_rows as usize,
        sh.state_rows as usize,
        sh.top_k,
        sh.hot_slots,
        sh.block_size,
    );
    let m = sh.pages + 1; // one more page column, with no host block
    let width = n.div_ceil(bs) as usize;
    let span = (m * bs) as i32;
    // Host blocks: a shuffled permutation of 1..=S·pages.
    let mut blocks: Vec<i32> = (1..=(sh.state_rows * sh.pages) as i32).collect();
    rng.shuffle(&mut blocks);
    let host_num_blocks = sh.state_rows * sh.pages + 1;
    let mut p = Persistent {
        ctx_len: (0..sr)
            .map(|_| rng.u32_in(2 * k + 1, sh.pages * bs))
            .collect(),
        host: vec![-1; sr * m as usize],
        hot: (0..(sr * width) as i32).map(|i| 1 + i).collect(),
        current: Vec::new(),
    };
    let mut next_gpu = 1 + (sr * width) as i32;
    let mut resident = vec![0i32; sr * m as usize];
    for s in 0..sr {
        for page in 0..p.ctx_len[s].div_ceil(bs) as usize {
            let at = s * m as usize + page;
            p.host[at] = blocks[s * sh.pages as usize + page];
            if rng.percent(sh.resident_pct) {
                resident[at] = next_gpu;
                next_gpu += 1;
            }
        }
    }
    p.current = p
        .ctx_len
        .iter()
        .map(|&l| (0..k).map(|_| rng.i32_in(0, l as i32)).collect())
        .collect();
    let device_blocks = next_gpu as u32;
    let stride = if sh.layers > 0 { sh.layers * bs } else { bs };
    let batch_desc = ResolveDesc {
        num_tokens: 0,
        top_k: k,
        num_requests: sh.batch_rows,
        max_pages: m,
        block_size: bs,
        hot_slots: n,
        attention_block_stride: stride,
        host_num_blocks,
        num_state_rows: Some(sh.state_rows),
        stats_slot: 0,
    };
    let state_desc = ResolveDesc {
        num_requests: sh.state_rows,
        num_state_rows: None,
        ..batch_desc
    };
    let mut lru: Vec<u16> = (0..sr * n as usize)
        .map(|i| (i % n as usize) as u16)
        .collect();
    for l in lru.chunks_mut(n as usize) {
        rng.shuffle(l);
    }
    // Batch order: host and hot tables by batch row (rebuilt each step), idx_mapping.
    let mut batch = HostState {
        resident: resident.clone(),
        host: vec![-1; rb * m as usize],
        hot: vec![0; rb * width],
        slot_host_rows: vec![-1; sr * n as usize],
        lru: lru.clone(),
        idx_mapping: Some(vec![-1; rb]),
        stats: None,
    };
    // State order: the persistent tables themselves.
    let mut state = HostState {
        resident,
        host: p.host.clone(),
        hot: p.hot.clone(),
        slot_host_rows: vec![-1; sr * n as usize],
        lru,
        idx_mapping: None,
        stats: None,
    };
    let mut d_batch = DevState::upload(dev, &batch)?;
    let mut d_state = DevState::upload(dev, &state)?;
    let mut pools = if sh.layers > 0 {
        let rows = Rows {
            row_bytes: 32,
            value_bytes: 32,
            block_size: bs,
            layers: sh.layers,
            extra_rows: 0,
            page_alignment: 1,
        };
        let (host_len, device_len) = pool_sizes(rows, host_num_blocks, device_blocks);
        let mut host = vec![0u8; host_len];
        rng.fill(&mut host);
        let mut device = vec![0u8; device_len];
        rng.fill(&mut device);
        Some(Pools::<D> {
            layers: layouts(rows, host_num_blocks, device_blocks),
            d_host: pinned_bytes(dev, &host)?,
            d_batch: dev_bytes(dev, &device)?,
            d_state: dev_bytes(dev, &device)?,
            host,
            device,
        })
    } else {
        None
    };

    let mut seen = Coverage::default();
    let (mut padded_by_mapping, mut duplicate_padded) = (0, 0);
    for step in 0..sh.steps {
        // This step's batch: distinct state rows in random order, then duplicates and
        // out-of-range state rows at random batch rows.
        let mut states: Vec<i32> = (0..sh.state_rows as i32).collect();
        rng.shuffle(&mut states);
        let distinct = rb - (sh.duplicates + sh.out_of_range) as usize;
        let mut map: Vec<i32> = states[..distinct].to_vec();
        for _ in 0..sh.duplicates {
            let s = map[rng.below(distinct as u64) as usize];
            map.push(s);
        }
        for _ in 0..sh.out_of_range {
            let bad = [-1, -5, i32::MIN, sh.state_rows as i32, i32::MAX];
            map.push(rng.pick(&bad));
        }
        rng.shuffle(&mut map);
        let owned = owners(&map, sh.state_rows);
        // The tables an engine builds for this batch: by batch row; rows that own no state row
        // get some other state's tables (a backend that read them would differ).
        for (b, &s) in map.iter().enumerate() {
            let s = usize::try_from(s)
                .ok()
                .filter(|&s| s < sr)
                .unwrap_or(rng.below(sr as u64) as usize);
            let (mu, bu) = (m as usize, b * m as usize);
            batch.host[bu..bu + mu].copy_from_slice(&p.host[s * mu..(s + 1) * mu]);
            batch.hot[b * width..(b + 1) * width]
                .copy_from_slice(&p.hot[s * width..(s + 1) * width]);
        }
        batch.idx_mapping = Some(map.clone());
        at_step(step, d_batch.sync_batch_tables(dev, &batch))?;

        // Token rows: every batch row (owner or not) asks; an owner may sit a step out.
        let mut rows: Vec<(i32, Vec<i32>)> = Vec::new();
        if !(sh.empty_step && step == 1) {
            for (b, &s) in map.iter().enumerate() {
                if owned[b].is_some() && rb > 1 && rng.percent(10) {
                    continue;
                }
                let (l, cur) = match owned[b].or((s >= 0 && (s as usize) < sr).then_some(s)) {
                    Some(s) => {
                        let s = s as usize;
                        let l = p.ctx_len[s] as i32;
                        if owned[b].is_some() {
                            for tok in p.current[s].iter_mut() {
                                if rng.percent(20) {
                                    *tok = rng.i32_in(0, l);
                                }
                            }
                        }
                        (l, p.current[s].clone())
                    }
                    None => (span, (0..k).map(|_| rng.i32_in(0, span)).collect()),
                };
                for q in 0..sh.rows_per_request {
                    let mut row = cur.clone();
                    for tok in row.iter_mut() {
                        if (q > 0 && rng.percent(20)) || rng.percent(3) {
                            *tok = match rng.below(3) {
                                0 => -1,
                                1 => span + 3,
                                _ => rng.i32_in(0, l),
                            };
                        }
                    }
                    rows.push((b as i32, row));
                }
            }
            for _ in 0..sh.padding_rows {
                let id = rng.pick(&[-1, -7, sh.batch_rows as i32, i32::MAX]);
                let row = (0..k).map(|_| rng.i32_in(0, span)).collect();
                rows.push((id, row));
            }
            rng.shuffle(&mut rows);
        }
        let req_id: Vec<i32> = rows.iter().map(|r| r.0).collect();
        let topk: Vec<i32> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
        // The same rows in state-row order.
        let state_req: Vec<i32> = req_id
            .iter()
            .map(|&b| {
                usize::try_from(b)
                    .ok()
                    .and_then(|b| owned.get(b).copied().flatten())
                    .unwrap_or(-1)
            })
            .collect();
        for (&b, &s) in req_id.iter().zip(&state_req) {
            if b >= 0 && (b as usize) < rb && s == -1 {
                padded_by_mapping += 1;
                let v = map[b as usize];
                duplicate_padded += i32::from(v >= 0 && (v as usize) < sr);
            }
        }

        let r = at_step(
            step,
            order_step(
                dev,
                (&batch_desc, &state_desc),
                (&mut batch, &mut state),
                (&mut d_batch, &mut d_state),
                pools.as_mut(),
                (&req_id, &state_req, &topk),
            ),
        )?;
        seen.add(
            &ResolveDesc {
                num_tokens: req_id.len() as u32,
                ..batch_desc
            },
            &batch,
            (&req_id, &topk),
            &r,
        );
        // Reclaim a few resident pages (host copies durable) on every copy.
        if sh.resident_pct > 0 {
            for e in state.resident.iter_mut() {
                if *e > 0 && rng.percent(15) {
                    *e = 0;
                }
            }
            batch.resident.clone_from(&state.resident);
            at_step(step, d_batch.sync_tables(dev, &batch))?;
            at_step(step, d_state.sync_tables(dev, &state))?;
        }
    }
    ensure!(seen.misses > 0, "no miss was exercised: {seen:?}");
    ensure!(seen.hits > 0, "no hit was exercised: {seen:?}");
    ensure!(
        sh.resident_pct == 0 || seen.resident > 0,
        "no resident entry: {seen:?}"
    );
    ensure!(
        sh.duplicates + sh.out_of_range == 0 || padded_by_mapping > 0,
        "no token row was padding by its mapping"
    );
    ensure!(
        sh.duplicates == 0 || duplicate_padded > 0,
        "no token row of a duplicate batch row was exercised"
    );
    Ok(())
}

/// One step in both orders on the reference and on the device; returns the outputs.
fn order_step<D: Device>(
    dev: &D,
    (batch_desc, state_desc): (&ResolveDesc, &ResolveDesc),
    (batch, state): (&mut HostState, &mut HostState),
    (d_batch, d_state): (&mut DevState<D>, &mut DevState<D>),
    mut pools: Option<&mut Pools<D>>,
    (req_id, state_req, topk): (&[i32], &[i32], &[i32]),
) -> Result<Outputs, CaseError> {
    let (t, k) = (req_id.len(), batch_desc.top_k as usize);
    let bd = ResolveDesc {
        num_tokens: t as u32,
        ..*batch_desc
    };
    let sd = ResolveDesc {
        num_tokens: t as u32,
        ..*state_desc
    };
    // References: batch order (with the gather where the shape gathers), then state order.
    let mut want = Outputs::sentinels(t, k);
    let mut want_state = Outputs::sentinels(t, k);
    match pools.as_deref_mut() {
        Some(p) => {
            let before = p.device.clone();
            reference_swap_in(
                &bd,
                batch.slices(req_id, topk, &mut want),
                &p.layers,
                &p.host,
                &mut p.device,
            )
            .ctx("reference resolve_and_gather, batch order")?;
            let mut state_pool = before;
            reference_swap_in(
                &sd,
                state.slices(state_req, topk, &mut want_state),
                &p.layers,
                &p.host,
                &mut state_pool,
            )
            .ctx("reference resolve_and_gather, state order")?;
            same(
                "reordering equivalence (reference): device pool",
                &state_pool,
                &p.device,
            )?;
        }
        None => {
            reference_resolve(&bd, batch.slices(req_id, topk, &mut want))
                .ctx("reference resolve, batch order")?;
            reference_resolve(&sd, state.slices(state_req, topk, &mut want_state))
                .ctx("reference resolve, state order")?;
        }
    }
    want_state.expect("reordering equivalence (reference): ", &want)?;
    same(
        "reordering equivalence (reference): slot_host_rows",
        &state.slot_host_rows,
        &batch.slot_host_rows,
    )?;
    same(
        "reordering equivalence (reference): lru",
        &state.lru,
        &batch.lru,
    )?;

    // The device, in both orders.
    for (label, desc, req, d) in [
        ("device, batch order: ", &bd, req_id, &mut *d_batch),
        ("device, state order: ", &sd, state_req, &mut *d_state),
    ] {
        let stream = dev.create_stream().ctx("create_stream")?;
        let d_req = dev_i32(dev, req)?;
        let d_topk = dev_i32(dev, topk)?;
        let mut out = DevOutputs::upload(dev, &Outputs::sentinels(t, k))?;
        let args = d.args(&d_req, &d_topk, &mut out);
        match pools.as_deref_mut() {
            Some(p) => {
                let pool = if desc.num_state_rows.is_some() {
                    &mut p.d_batch
                } else {
                    &mut p.d_state
                };
                dev.resolve_and_gather(&stream, desc, args, &p.layers, &p.d_host, pool)
                    .ctx(&format!("{label}resolve_and_gather"))?;
            }
            None => dev
                .resolve(&stream, desc, args)
                .ctx(&format!("{label}resolve"))?,
        }
        dev.synchronize(&stream).ctx("synchronize")?;
        out.read(dev, t, k)?.expect(label, &want)?;
        d.expect_hot_state(dev, label, batch)?;
        if let Some(p) = pools.as_deref() {
            let pool = if desc.num_state_rows.is_some() {
                &p.d_batch
            } else {
                &p.d_state
            };
            same(
                &format!("{label}device pool"),
                &read_bytes(dev, pool, p.device.len())?,
                &p.device,
            )?;
        }
    }
    Ok(want)
}

/// Batch-row-order calls the device cannot accept are refused with an invalid-argument error
/// before anything is written: an `idx_mapping` without `num_state_rows`, `num_state_rows`
/// without an `idx_mapping`, an `idx_mapping` shorter than the batch rows, a resident table or
/// LRU shorter than the state rows, `num_state_rows` 0. Then the valid call succeeds, and a
/// batch row whose state row is owned by a smaller batch row without token rows is padding.
fn refused_before_any_write<D: Device>(dev: &D) -> CaseResult {
    // Two batch rows over three state rows, top-k 2, block size 4, 4 hot slots (one block).
    let desc = ResolveDesc {
        num_tokens: 2,
        num_requests: 2,
        max_pages: 2,
        num_state_rows: Some(3),
        ..SMALL
    };
    let h = HostState {
        resident: vec![0; 6],
        host: vec![0, 1, 2, 3],
        hot: vec![5, 6],
        slot_host_rows: vec![-1; 12],
        lru: (0..12).map(|i| i % 4).collect(),
        idx_mapping: Some(vec![2, 2]),
        stats: None,
    };
    let stream = dev.create_stream().ctx("create_stream")?;
    let mut d = DevState::upload(dev, &h)?;
    let d_req = dev_i32(dev, &[1, 0])?;
    let d_topk = dev_i32(dev, &[0, 5, 1, 6])?;
    let short_map = dev_i32(dev, &[2])?;
    let short_resident = dev_i32(dev, &[0; 5])?;
    let init = Outputs::sentinels(2, 2);
    let mut out = DevOutputs::upload(dev, &init)?;
    let zero = ResolveDesc {
        num_state_rows: Some(0),
        ..desc
    };
    let state_order = ResolveDesc {
        num_state_rows: None,
        ..desc
    };
    for what in [
        "an idx_mapping without num_state_rows",
        "num_state_rows without an idx_mapping",
        "an idx_mapping of one entry for two batch rows",
        "a resident table of 5 entries for 3 state rows of 2 pages",
        "num_state_rows 0",
    ] {
        let mut args = d.args(&d_req, &d_topk, &mut out);
        let mut call = &desc;
        match what {
            "an idx_mapping without num_state_rows" => call = &state_order,
            "num_state_rows without an idx_mapping" => args.idx_mapping = None,
            "an idx_mapping of one entry for two batch rows" => args.idx_mapping = Some(&short_map),
            "num_state_rows 0" => call = &zero,
            _ => args.resident_table = &short_resident,
        }
        expect_invalid(what, dev.resolve(&stream, call, args))?;
        dev.synchronize(&stream).ctx("synchronize")?;
        let kept = format!("after a refused call ({what}): ");
        d.expect_hot_state(dev, &kept, &h)?;
        out.read(dev, 2, 2)?.expect(&kept, &init)?;
    }
    // Valid: batch rows 0 and 1 both map to state row 2, which batch row 0 owns: row 0 of the
    // call (batch row 1) is padding; row 1 (batch row 0) misses into state row 2's slots
    // through batch row 0's host table (blocks 0, 1) and hot table (GPU block 5, rows 20..24).
    dev.resolve(&stream, &desc, d.args(&d_req, &d_topk, &mut out))
        .ctx("the valid call")?;
    dev.synchronize(&stream).ctx("synchronize")?;
    let got = out.read(dev, 2, 2)?;
    let mut want = Outputs::sentinels(2, 2);
    want.indices[..4].copy_from_slice(&[-1, -1, 20, 21]);
    want.valid[..2].copy_from_slice(&[0, 2]);
    want.hits[..2].copy_from_slice(&[0, 0]);
    want.misses[..2].copy_from_slice(&[0, 2]);
    want.miss_src[..4].copy_from_slice(&[-1, -1, 1, 6]);
    want.miss_dst[..4].copy_from_slice(&[-1, -1, 20, 21]);
    got.expect("the valid call: ", &want)?;
    let mut after = h.clone();
    after.slot_host_rows[8..12].copy_from_slice(&[1, 6, -1, -1]);
    after.lru[8..12].copy_from_slice(&[2, 3, 0, 1]);
    d.expect_hot_state(dev, "the valid call: ", &after)?;
    // Batch row 1 alone: still padding although its owner has no token row in this call.
    let d_req = dev_i32(dev, &[1, 1])?;
    let mut out = DevOutputs::upload(dev, &init)?;
    dev.resolve(&stream, &desc, d.args(&d_req, &d_topk, &mut out))
        .ctx("the call naming only the non-owner")?;
    dev.synchronize(&stream).ctx("synchronize")?;
    let mut want = Outputs::sentinels(2, 2);
    want.indices[..4].fill(-1);
    want.miss_src[..4].fill(-1);
    want.miss_dst[..4].fill(-1);
    for c in [&mut want.valid, &mut want.hits, &mut want.misses] {
        c[..2].fill(0);
    }
    out.read(dev, 2, 2)?
        .expect("the call naming only the non-owner: ", &want)?;
    d.expect_hot_state(dev, "the call naming only the non-owner: ", &after)
}
