//! Decode-path counters kept on the device (`hisparse_core::ops::stats`): hand-counted calls of
//! `resolve`, `resolve_and_gather` and `remap` into one stats buffer at several slots — padding
//! rows, an empty batch, speculative rows of one request, a remap without per-row counts, sums
//! that wrap around `u32::MAX`, a call without the buffer — and a buffer too small for its slot
//! refused before anything is written. The random sequences of `resolve/stats-*`,
//! `resolve_and_gather/stats-*` and `remap/*/stats*` compare the words with the reference.

use hisparse_core::Device;
use hisparse_core::ops::{
    LayerPair, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, STATS_SLOT_WORDS,
};

use super::resolve_io::SMALL;
use crate::util::{
    Ctx, SENTINEL, dev_bytes, dev_i32, dev_u16, ensure, expect_invalid, pinned_bytes, read_i32,
    read_u16, same,
};
use crate::{Case, CaseError, CaseResult};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    v.push(Case::fixed("stats/resolve/hand-counted", |d: &D| {
        resolve_hand_counted(d, Call::Resolve)
    }));
    v.push(Case::fixed(
        "stats/resolve_and_gather/hand-counted",
        |d: &D| resolve_hand_counted(d, Call::ResolveAndGather),
    ));
    v.push(Case::fixed(
        "stats/remap/hand-counted",
        remap_hand_counted::<D>,
    ));
    v.push(Case::fixed(
        "stats/too-small-refused-before-any-write",
        too_small_refused::<D>,
    ));
}

const MAX: i32 = u32::MAX as i32;

/// How a resolve-family call is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Resolve,
    /// `resolve_and_gather` with one 16-byte-row layer.
    ResolveAndGather,
}

/// Two requests, top-k 2, 4 hot slots, blocks of 4 rows in an attention view of stride 4.
/// Request `r`'s page `p` lives in host block `4r + p` (token `tok` is host row `16r + tok`);
/// request 1's page 3 is still resident on GPU block 9 (tokens 12..16 are rows 36..40); the hot
/// regions are GPU blocks 10 and 11.
struct Resolver<D: Device> {
    desc: ResolveDesc,
    resident: D::Buffer,
    host: D::Buffer,
    hot: D::Buffer,
    slot_host_rows: D::Buffer,
    lru: D::Buffer,
    /// For `resolve_and_gather`: the one layer, the host pool and the device pool.
    layer: [LayerPair; 1],
    host_pool: D::HostBuffer,
    device_pool: D::Buffer,
}

/// The outputs of a resolve call, each followed by one sentinel (the plan's are not read).
struct Counts {
    indices: Vec<i32>,
    hits: Vec<i32>,
    misses: Vec<i32>,
    valid: Vec<i32>,
}

impl<D: Device> Resolver<D> {
    fn new(dev: &D) -> Result<Self, CaseError> {
        let desc = ResolveDesc {
            num_tokens: 0,
            num_requests: 2,
            host_num_blocks: 8,
            ..SMALL
        };
        let rows = PageLayout::contiguous(0, 64, 8, 4, 16);
        let device_rows = PageLayout::contiguous(0, 64, 12, 4, 16);
        Ok(Resolver {
            desc,
            resident: dev_i32(dev, &[0, 0, 0, 0, 0, 0, 0, 9])?,
            host: dev_i32(dev, &[0, 1, 2, 3, 4, 5, 6, 7])?,
            hot: dev_i32(dev, &[10, 11])?,
            slot_host_rows: dev_i32(dev, &[-1; 8])?,
            lru: dev_u16(dev, &[0, 1, 2, 3, 0, 1, 2, 3])?,
            layer: [LayerPair {
                host: rows,
                device: device_rows,
            }],
            host_pool: pinned_bytes(dev, &[7u8; 8 * 64])?,
            device_pool: dev_bytes(dev, &[0u8; 12 * 64])?,
        })
    }

    /// One call of `how` over rows `req_id` (top-k `topk`) adding to slot `slot` of `stats`
    /// (`None`: without the buffer); returns the per-row counts.
    fn call(
        &mut self,
        dev: &D,
        how: Call,
        rows: (&[i32], &[i32]),
        stats: Option<(&mut D::Buffer, u32)>,
    ) -> Result<Counts, CaseError> {
        let counted = stats.is_some();
        let (r, out) = self.issue(dev, how, rows, stats)?;
        r.ctx(if counted {
            "a call with stats"
        } else {
            "a call without stats"
        })?;
        Ok(out)
    }

    /// [`Resolver::call`]'s call: the device's answer, and the outputs after it (sentinels
    /// where it wrote nothing).
    fn issue(
        &mut self,
        dev: &D,
        how: Call,
        (req_id, topk): (&[i32], &[i32]),
        stats: Option<(&mut D::Buffer, u32)>,
    ) -> Result<(Result<(), D::Error>, Counts), CaseError> {
        let t = req_id.len();
        let desc = ResolveDesc {
            num_tokens: t as u32,
            stats_slot: stats.as_ref().map_or(0, |s| s.1),
            ..self.desc
        };
        let s = dev.create_stream().ctx("create_stream")?;
        let d_req = dev_i32(dev, req_id)?;
        let d_topk = dev_i32(dev, topk)?;
        let mut indices = dev_i32(dev, &vec![SENTINEL; 2 * t + 1])?;
        let mut valid = dev_i32(dev, &vec![SENTINEL; t + 1])?;
        let mut hits = dev_i32(dev, &vec![SENTINEL; t + 1])?;
        let mut misses = dev_i32(dev, &vec![SENTINEL; t + 1])?;
        let mut src = dev_i32(dev, &vec![SENTINEL; 2 * t])?;
        let mut dst = dev_i32(dev, &vec![SENTINEL; 2 * t])?;
        let args = ResolveArgs {
            req_id: &d_req,
            topk: &d_topk,
            resident_table: &self.resident,
            host_table: &self.host,
            hot_table: &self.hot,
            slot_host_rows: &mut self.slot_host_rows,
            lru: &mut self.lru,
            idx_mapping: None,
            indices: &mut indices,
            valid_counts: &mut valid,
            hit_counts: &mut hits,
            miss_counts: &mut misses,
            miss_src: &mut src,
            miss_dst: &mut dst,
            stats: stats.map(|s| s.0),
        };
        let r = match how {
            Call::Resolve => dev.resolve(&s, &desc, args),
            Call::ResolveAndGather => dev.resolve_and_gather(
                &s,
                &desc,
                args,
                &self.layer,
                &self.host_pool,
                &mut self.device_pool,
            ),
        };
        dev.synchronize(&s).ctx("synchronize")?;
        let out = Counts {
            indices: read_i32(dev, &indices, 2 * t + 1)?,
            hits: read_i32(dev, &hits, t + 1)?,
            misses: read_i32(dev, &misses, t + 1)?,
            valid: read_i32(dev, &valid, t + 1)?,
        };
        Ok((r, out))
    }
}

/// Expects the per-row `(hits, misses, valid)` of a call, its sentinel after them intact.
fn expect_counts(what: &str, got: &Counts, rows: &[(i32, i32, i32)]) -> CaseResult {
    let col = |f: fn(&(i32, i32, i32)) -> i32| {
        let mut v: Vec<i32> = rows.iter().map(f).collect();
        v.push(SENTINEL);
        v
    };
    same(&format!("{what}: hit_counts"), &got.hits, &col(|r| r.0))?;
    same(&format!("{what}: miss_counts"), &got.misses, &col(|r| r.1))?;
    same(&format!("{what}: valid_counts"), &got.valid, &col(|r| r.2))
}

/// Five calls into one buffer of three slots, each expected value counted by hand.
fn resolve_hand_counted<D: Device>(dev: &D, how: Call) -> CaseResult {
    let mut w = Resolver::new(dev)?;
    // Slot 0 one below wrapping in hits and valid; slot 1 at u32::MAX calls; slot 2 never named.
    let mut want = vec![MAX - 1, 5, MAX, 7, 0, 0, 0, MAX, 1, 2, 3, 4];
    let mut stats = dev_i32(dev, &want)?;
    let words = |dev: &D, stats: &D::Buffer| read_i32(dev, stats, 12);

    // Request 0's rows 0 and 2 together (speculative) around a padding row, then request 1.
    // Request 0 wants host rows 0, 1 (row 0) and 2 (row 2; its token 1 was wanted by row 0 and
    // counts nothing): three misses. Request 1 misses host row 21 and reads token 13 resident.
    let c = w.call(
        dev,
        how,
        (&[0, -1, 0, 1], &[0, 1, 0, 1, 1, 2, 5, 13]),
        Some((&mut stats, 0)),
    )?;
    expect_counts("call 1", &c, &[(0, 2, 2), (0, 0, 0), (0, 1, 2), (0, 1, 2)])?;
    // Hits +0, misses +4, valid +6 (wrapping to 5), calls +1.
    want[..4].copy_from_slice(&[MAX - 1, 9, 5, 8]);
    same("stats after call 1", &words(dev, &stats)?, &want)?;

    // An empty batch counts the call.
    w.call(dev, how, (&[], &[]), Some((&mut stats, 0)))?;
    want[3] = 9;
    same("stats after an empty batch", &words(dev, &stats)?, &want)?;

    // Slot 1: host row 2 hits (cached by call 1), host row 3 misses.
    let c = w.call(dev, how, (&[0], &[2, 3]), Some((&mut stats, 1)))?;
    expect_counts("call 3", &c, &[(1, 1, 2)])?;
    want[4..8].copy_from_slice(&[1, 1, 2, 0]);
    same("stats after call 3", &words(dev, &stats)?, &want)?;

    // Without the buffer: request 1 hits host row 21 and misses 22; nothing is counted.
    let c = w.call(dev, how, (&[1], &[5, 6]), None)?;
    expect_counts("call 4", &c, &[(1, 1, 2)])?;
    same(
        "stats after a call without them",
        &words(dev, &stats)?,
        &want,
    )?;

    // Slot 0 again, two rows of request 1: row 0 hits 21 and 22; row 1 wants 22 again (no
    // count) and reads token 14 resident.
    let c = w.call(dev, how, (&[1, 1], &[5, 6, 6, 14]), Some((&mut stats, 0)))?;
    expect_counts("call 5", &c, &[(2, 0, 2), (0, 0, 2)])?;
    want[..4].copy_from_slice(&[0, 9, 9, 10]);
    same("stats after call 5", &words(dev, &stats)?, &want)
}

/// A remap of `desc` over `(req_id, block_table, topk)` writing `out` (and `counts`), adding to
/// `stats`.
fn remap_into<D: Device>(
    dev: &D,
    s: &D::Stream,
    desc: &RemapDesc,
    (req_id, block_table, topk): (&D::Buffer, &D::Buffer, &D::Buffer),
    (out, counts): (&mut D::Buffer, Option<&mut D::Buffer>),
    stats: &mut D::Buffer,
) -> Result<(), D::Error> {
    dev.remap(
        s,
        desc,
        RemapArgs {
            req_id,
            block_table,
            topk,
            idx_mapping: None,
            out,
            counts,
            stats: Some(stats),
        },
    )
}

/// Remaps into slot 2 with and without per-row counts and compaction, and an empty batch into
/// slot 0, counted by hand.
fn remap_hand_counted<D: Device>(dev: &D) -> CaseResult {
    let mut want = vec![3, 4, 5, 6, 0, 0, 0, 0, 7, 8, MAX - 2, MAX];
    let mut stats = dev_i32(dev, &want)?;
    let s = dev.create_stream().ctx("create_stream")?;
    let table = dev_i32(dev, &[3, 5, 7, -1])?;
    // Row 0 of table row 0: 0 → 30, 5 → 51, -1, 8 (beyond the table); row 1 is padding;
    // row 2 of table row 1: 1 → 71, 4 (block -1), 2 → 72, 3 → 73. Five valid entries.
    let req = dev_i32(dev, &[0, -1, 1])?;
    let topk = dev_i32(dev, &[0, 5, -1, 8, 0, 1, 2, 3, 1, 4, 2, 3])?;
    let base = RemapDesc {
        num_tokens: 3,
        top_k: 4,
        table_rows: 2,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 10,
        idx_mapping_len: None,
        write_counts: false,
        compact: false,
        stats_slot: 2,
    };
    for (step, (counts, compact)) in [(false, false), (true, true), (false, true)]
        .into_iter()
        .enumerate()
    {
        let desc = RemapDesc {
            write_counts: counts,
            compact,
            ..base
        };
        let mut out = dev_i32(dev, &[SENTINEL; 12])?;
        let mut row_counts = dev_i32(dev, &[SENTINEL; 3])?;
        let r = remap_into(
            dev,
            &s,
            &desc,
            (&req, &table, &topk),
            (&mut out, counts.then_some(&mut row_counts)),
            &mut stats,
        );
        r.ctx("remap with stats")?;
        dev.synchronize(&s).ctx("synchronize")?;
        let rows: &[i32] = if compact {
            &[30, 51, -1, -1, -1, -1, -1, -1, 71, 72, 73, -1]
        } else {
            &[30, 51, -1, -1, -1, -1, -1, -1, 71, -1, 72, 73]
        };
        same(
            &format!("remap {step}: out"),
            &read_i32(dev, &out, 12)?,
            rows,
        )?;
        // Valid +5 (from u32::MAX - 2, wrapping at the first call), calls +1.
        want[10] = (want[10] as u32).wrapping_add(5) as i32;
        want[11] = (want[11] as u32).wrapping_add(1) as i32;
        same(
            &format!("remap {step}: stats"),
            &read_i32(dev, &stats, 12)?,
            &want,
        )?;
    }
    ensure!(
        want[8..] == [7, 8, 12, 2],
        "the hand count itself: {want:?}"
    );
    // An empty batch into slot 0 counts the call only.
    let empty = dev_i32(dev, &[SENTINEL])?;
    let mut out = dev_i32(dev, &[SENTINEL])?;
    let r = remap_into(
        dev,
        &s,
        &RemapDesc {
            num_tokens: 0,
            stats_slot: 0,
            ..base
        },
        (&empty, &table, &empty),
        (&mut out, None),
        &mut stats,
    );
    r.ctx("remap with stats")?;
    dev.synchronize(&s).ctx("synchronize")?;
    want[3] = 7;
    same(
        "stats after an empty remap",
        &read_i32(dev, &stats, 12)?,
        &want,
    )?;
    same(
        "out of an empty remap",
        &read_i32(dev, &out, 1)?,
        &[SENTINEL],
    )
}

/// A stats buffer one word short of its slot is refused with an invalid-argument error before
/// anything is written — by remap, resolve and resolve_and_gather — and the same calls with the
/// slot inside the buffer then succeed.
fn too_small_refused<D: Device>(dev: &D) -> CaseResult {
    let slot = 2u32;
    let short_words = (STATS_SLOT_WORDS * (slot + 1) - 1) as usize;
    let init: Vec<i32> = (0..short_words as i32).map(|i| 100 + i).collect();
    let mut short = dev_i32(dev, &init)?;
    let mut enough = dev_i32(dev, &vec![0; short_words + 1])?;
    let s = dev.create_stream().ctx("create_stream")?;

    // Remap.
    let req = dev_i32(dev, &[0])?;
    let table = dev_i32(dev, &[1, 2])?;
    let topk = dev_i32(dev, &[0, 5])?;
    let desc = RemapDesc {
        num_tokens: 1,
        top_k: 2,
        table_rows: 1,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 4,
        idx_mapping_len: None,
        write_counts: true,
        compact: false,
        stats_slot: slot,
    };
    for fits in [false, true] {
        let mut out = dev_i32(dev, &[SENTINEL; 2])?;
        let mut counts = dev_i32(dev, &[SENTINEL])?;
        let r = remap_into(
            dev,
            &s,
            &desc,
            (&req, &table, &topk),
            (&mut out, Some(&mut counts)),
            if fits { &mut enough } else { &mut short },
        );
        if fits {
            r.ctx("remap with stats")?;
            dev.synchronize(&s).ctx("synchronize")?;
            same("remap: out", &read_i32(dev, &out, 2)?, &[4, 9])?;
            continue;
        }
        expect_invalid("remap with a stats buffer one word short", r)?;
        dev.synchronize(&s).ctx("synchronize")?;
        same(
            "refused remap: out",
            &read_i32(dev, &out, 2)?,
            &[SENTINEL; 2],
        )?;
        same(
            "refused remap: counts",
            &read_i32(dev, &counts, 1)?,
            &[SENTINEL],
        )?;
        same(
            "refused remap: stats",
            &read_i32(dev, &short, short_words)?,
            &init,
        )?;
    }

    // Resolve and resolve_and_gather.
    for how in [Call::Resolve, Call::ResolveAndGather] {
        let mut w = Resolver::new(dev)?;
        for fits in [false, true] {
            let buffer = if fits { &mut enough } else { &mut short };
            let (r, out) = w.issue(dev, how, (&[0], &[0, 1]), Some((buffer, slot)))?;
            let what = format!("{how:?}");
            if fits {
                r.ctx(&format!("{what} with stats"))?;
                same(
                    &format!("{what}: indices"),
                    &out.indices,
                    &[40, 41, SENTINEL],
                )?;
                continue;
            }
            expect_invalid(&format!("{what} with a stats buffer one word short"), r)?;
            let kept = format!("refused {what}: ");
            same(&format!("{kept}indices"), &out.indices, &[SENTINEL; 3])?;
            for (name, got) in [
                ("valid_counts", &out.valid),
                ("hit_counts", &out.hits),
                ("miss_counts", &out.misses),
            ] {
                same(&format!("{kept}{name}"), got, &[SENTINEL; 2])?;
            }
            same(
                &format!("{kept}slot_host_rows"),
                &read_i32(dev, &w.slot_host_rows, 8)?,
                &[-1; 8],
            )?;
            same(
                &format!("{kept}lru"),
                &read_u16(dev, &w.lru, 8)?,
                &[0, 1, 2, 3, 0, 1, 2, 3],
            )?;
            same(
                &format!("{kept}stats"),
                &read_i32(dev, &short, short_words)?,
                &init,
            )?;
        }
    }
    // Each accepted call (one remap, two resolves) added its call to slot 2 of the buffer that
    // fits.
    same(
        "stats of the accepted calls",
        &read_i32(dev, &enough, short_words + 1)?[8..],
        &[0, 4, 6, 3],
    )
}
