//! What the resolve families (`resolve/*`, `resolve_and_gather/*`) share: a call's outputs and
//! the tables and hot state it reads and updates, on the host (for the reference) and on the
//! device, and the tally of what a sequence exercised.

use hisparse_core::Device;
use hisparse_core::ops::resolve::Entry;
use hisparse_core::ops::{RemapDesc, ResolveArgs, ResolveDesc, ResolveSlices};

use crate::util::{Ctx, SENTINEL, dev_i32, dev_u16, ensure, read_i32, read_u16, same};
use crate::{CaseError, CaseResult, SplitMix64};

/// Elements past every output that must keep their sentinel.
pub(crate) const SLACK: usize = 3;

/// The small world of the hand-computed cases: one token row of top-k 2 over 4 pages of 4 rows,
/// 4 hot slots, an attention stride of 4 rows and 4 host blocks, in state-row order, stats slot
/// 0. A case states what it changes (`ResolveDesc { top_k: 8, ..SMALL }`).
pub(crate) const SMALL: ResolveDesc = ResolveDesc {
    num_tokens: 1,
    top_k: 2,
    num_requests: 1,
    max_pages: 4,
    block_size: 4,
    hot_slots: 4,
    attention_block_stride: 4,
    host_num_blocks: 4,
    num_state_rows: None,
    stats_slot: 0,
};

/// Slots of a sequence's stats buffer (`hisparse_core::ops::stats`): its calls add to the first
/// three ([`stats_slot`]); the last must never change.
pub(crate) const STATS_SLOTS: u32 = 4;

/// The remap of `resolve`'s batch through page tables of its shape (its token rows, top-k,
/// requests as table rows, pages, block size and attention stride), without an `idx_mapping`:
/// what a scenario that runs both index paths over one batch gives the remap.
pub(crate) fn remap_of(
    resolve: &ResolveDesc,
    write_counts: bool,
    compact: bool,
    stats_slot: u32,
) -> RemapDesc {
    RemapDesc {
        num_tokens: resolve.num_tokens,
        top_k: resolve.top_k,
        table_rows: resolve.num_requests,
        max_blocks: resolve.max_pages,
        block_size: resolve.block_size,
        block_stride_rows: resolve.attention_block_stride,
        idx_mapping_len: None,
        write_counts,
        compact,
        stats_slot,
    }
}

/// The stats slot call `call` of a sequence adds to, or `None` for a call given no stats
/// buffer (every fourth: the buffer must then keep its words): one buffer takes calls at
/// several slots, the same slot again, and calls that leave it alone.
pub(crate) fn stats_slot(call: usize) -> Option<u32> {
    match call % 4 {
        3 => None,
        c => Some(((call / 4 + c) % 3) as u32),
    }
}

/// A sequence's first stats words: random, half of them within a few thousand of `u32::MAX` so
/// that the sums wrap around.
pub(crate) fn initial_stats(rng: &mut SplitMix64) -> Vec<i32> {
    (0..4 * STATS_SLOTS)
        .map(|_| {
            if rng.percent(50) {
                (u32::MAX - rng.u32_in(0, 5000)) as i32
            } else {
                rng.next_u64() as i32
            }
        })
        .collect()
}

/// The arguments (`$args`: the reference's slices or the device's buffers) of a call over the
/// tables and hot state `$s` with inputs `$req_id`, `$topk`, `idx_mapping` `$map` and stats
/// buffer `$stats`, writing the outputs `$out`.
macro_rules! args_over {
    ($args:ident, $s:expr, $req_id:expr, $topk:expr, $out:expr, $map:expr, $stats:expr) => {
        $args {
            req_id: $req_id,
            topk: $topk,
            resident_table: &$s.resident,
            host_table: &$s.host,
            hot_table: &$s.hot,
            slot_host_rows: &mut $s.slot_host_rows,
            lru: &mut $s.lru,
            indices: &mut $out.indices,
            valid_counts: &mut $out.valid,
            hit_counts: &mut $out.hits,
            miss_counts: &mut $out.misses,
            miss_src: &mut $out.miss_src,
            miss_dst: &mut $out.miss_dst,
            idx_mapping: $map,
            stats: $stats,
        }
    };
}

/// Outputs of one resolve call (host copies), each followed by [`SLACK`] elements.
#[derive(Debug, PartialEq)]
pub(crate) struct Outputs {
    pub(crate) indices: Vec<i32>,
    pub(crate) valid: Vec<i32>,
    pub(crate) hits: Vec<i32>,
    pub(crate) misses: Vec<i32>,
    pub(crate) miss_src: Vec<i32>,
    pub(crate) miss_dst: Vec<i32>,
}

impl Outputs {
    /// Outputs of `t` token rows of top-k `k`, every element (and the slack) a sentinel.
    pub(crate) fn sentinels(t: usize, k: usize) -> Self {
        let (tk, tu) = (vec![SENTINEL; t * k + SLACK], vec![SENTINEL; t + SLACK]);
        Outputs {
            indices: tk.clone(),
            valid: tu.clone(),
            hits: tu.clone(),
            misses: tu,
            miss_src: tk.clone(),
            miss_dst: tk,
        }
    }

    /// The outputs of token rows `rows` (in that order) of these outputs of top-k `k`, each
    /// followed by [`SLACK`] sentinels: what a call over just those rows must write when no
    /// other row of their requests is left out.
    pub(crate) fn rows(&self, rows: &[usize], k: usize) -> Outputs {
        let per_row = |v: &[i32]| -> Vec<i32> {
            let mut out: Vec<i32> = rows
                .iter()
                .flat_map(|&t| v[t * k..][..k].iter().copied())
                .collect();
            out.extend([SENTINEL; SLACK]);
            out
        };
        let per_token = |v: &[i32]| -> Vec<i32> {
            let mut out: Vec<i32> = rows.iter().map(|&t| v[t]).collect();
            out.extend([SENTINEL; SLACK]);
            out
        };
        Outputs {
            indices: per_row(&self.indices),
            valid: per_token(&self.valid),
            hits: per_token(&self.hits),
            misses: per_token(&self.misses),
            miss_src: per_row(&self.miss_src),
            miss_dst: per_row(&self.miss_dst),
        }
    }

    /// Compares every output with `want`, naming `path` on a difference.
    pub(crate) fn expect(&self, path: &str, want: &Outputs) -> CaseResult {
        let name = |what: &str| format!("{path}{what}");
        same(&name("indices"), &self.indices, &want.indices)?;
        same(&name("valid_counts"), &self.valid, &want.valid)?;
        same(&name("hit_counts"), &self.hits, &want.hits)?;
        same(&name("miss_counts"), &self.misses, &want.misses)?;
        same(&name("miss_src"), &self.miss_src, &want.miss_src)?;
        same(&name("miss_dst"), &self.miss_dst, &want.miss_dst)
    }
}

/// Device buffers of one resolve call's outputs.
pub(crate) struct DevOutputs<D: Device> {
    pub(crate) indices: D::Buffer,
    pub(crate) valid: D::Buffer,
    pub(crate) hits: D::Buffer,
    pub(crate) misses: D::Buffer,
    pub(crate) miss_src: D::Buffer,
    pub(crate) miss_dst: D::Buffer,
}

impl<D: Device> DevOutputs<D> {
    /// Device buffers holding `init`.
    pub(crate) fn upload(dev: &D, init: &Outputs) -> Result<Self, CaseError> {
        Ok(DevOutputs {
            indices: dev_i32(dev, &init.indices)?,
            valid: dev_i32(dev, &init.valid)?,
            hits: dev_i32(dev, &init.hits)?,
            misses: dev_i32(dev, &init.misses)?,
            miss_src: dev_i32(dev, &init.miss_src)?,
            miss_dst: dev_i32(dev, &init.miss_dst)?,
        })
    }

    /// The outputs of `t` token rows of top-k `k`, with their slack.
    pub(crate) fn read(&self, dev: &D, t: usize, k: usize) -> Result<Outputs, CaseError> {
        let (tk, tu) = (t * k + SLACK, t + SLACK);
        Ok(Outputs {
            indices: read_i32(dev, &self.indices, tk)?,
            valid: read_i32(dev, &self.valid, tu)?,
            hits: read_i32(dev, &self.hits, tu)?,
            misses: read_i32(dev, &self.misses, tu)?,
            miss_src: read_i32(dev, &self.miss_src, tk)?,
            miss_dst: read_i32(dev, &self.miss_dst, tk)?,
        })
    }
}

/// The page tables and hot state a resolve call reads and updates (host copies), and in
/// batch-row order the call's `idx_mapping`.
#[derive(Clone, Debug)]
pub(crate) struct HostState {
    pub(crate) resident: Vec<i32>,
    pub(crate) host: Vec<i32>,
    pub(crate) hot: Vec<i32>,
    pub(crate) slot_host_rows: Vec<i32>,
    pub(crate) lru: Vec<u16>,
    pub(crate) idx_mapping: Option<Vec<i32>>,
    /// The stats words a sequence's calls add to (`hisparse_core::ops::stats`), kept across
    /// calls; `None`: the calls count nothing.
    pub(crate) stats: Option<Vec<i32>>,
}

impl HostState {
    /// The reference's arguments of a call over these tables writing `out`.
    pub(crate) fn slices<'a>(
        &'a mut self,
        req_id: &'a [i32],
        topk: &'a [i32],
        out: &'a mut Outputs,
    ) -> ResolveSlices<'a> {
        args_over!(
            ResolveSlices,
            self,
            req_id,
            topk,
            out,
            self.idx_mapping.as_deref(),
            self.stats.as_deref_mut()
        )
    }
}

/// The device twin of a [`HostState`].
pub(crate) struct DevState<D: Device> {
    pub(crate) resident: D::Buffer,
    pub(crate) host: D::Buffer,
    pub(crate) hot: D::Buffer,
    pub(crate) slot_host_rows: D::Buffer,
    pub(crate) lru: D::Buffer,
    pub(crate) idx_mapping: Option<D::Buffer>,
    pub(crate) stats: Option<D::Buffer>,
}

impl<D: Device> DevState<D> {
    /// Device buffers holding `h`.
    pub(crate) fn upload(dev: &D, h: &HostState) -> Result<Self, CaseError> {
        Ok(DevState {
            resident: dev_i32(dev, &h.resident)?,
            host: dev_i32(dev, &h.host)?,
            hot: dev_i32(dev, &h.hot)?,
            slot_host_rows: dev_i32(dev, &h.slot_host_rows)?,
            lru: dev_u16(dev, &h.lru)?,
            idx_mapping: h
                .idx_mapping
                .as_ref()
                .map(|m| dev_i32(dev, m))
                .transpose()?,
            stats: h.stats.as_ref().map(|w| dev_i32(dev, w)).transpose()?,
        })
    }

    /// Re-uploads the page tables of `h` after they changed.
    pub(crate) fn sync_tables(&mut self, dev: &D, h: &HostState) -> CaseResult {
        dev.upload_i32(&mut self.resident, 0, &h.resident)
            .ctx("upload resident table")?;
        dev.upload_i32(&mut self.host, 0, &h.host)
            .ctx("upload host table")
    }

    /// Re-uploads what a batch-row-order engine rebuilds every step: the host and hot tables
    /// (by batch row) and `idx_mapping`, after `h`'s changed.
    pub(crate) fn sync_batch_tables(&mut self, dev: &D, h: &HostState) -> CaseResult {
        dev.upload_i32(&mut self.host, 0, &h.host)
            .ctx("upload host table")?;
        dev.upload_i32(&mut self.hot, 0, &h.hot)
            .ctx("upload hot table")?;
        if let (Some(d), Some(m)) = (self.idx_mapping.as_mut(), h.idx_mapping.as_ref()) {
            dev.upload_i32(d, 0, m).ctx("upload idx_mapping")?;
        }
        Ok(())
    }

    /// The device's arguments of a call over these tables writing `out`.
    pub(crate) fn args<'a>(
        &'a mut self,
        req_id: &'a D::Buffer,
        topk: &'a D::Buffer,
        out: &'a mut DevOutputs<D>,
    ) -> ResolveArgs<'a, D::Buffer> {
        args_over!(
            ResolveArgs,
            self,
            req_id,
            topk,
            out,
            self.idx_mapping.as_ref(),
            self.stats.as_mut()
        )
    }

    /// Compares the device's `slot_host_rows` and LRU rows, and its stats words, with `want`'s, naming
    /// `path` on a difference.
    pub(crate) fn expect_hot_state(&self, dev: &D, path: &str, want: &HostState) -> CaseResult {
        same(
            &format!("{path}lru"),
            &read_u16(dev, &self.lru, want.lru.len())?,
            &want.lru,
        )?;
        same(
            &format!("{path}slot_host_rows"),
            &read_i32(dev, &self.slot_host_rows, want.slot_host_rows.len())?,
            &want.slot_host_rows,
        )?;
        match (&self.stats, &want.stats) {
            (Some(got), Some(words)) => same(
                &format!("{path}stats"),
                &read_i32(dev, got, words.len())?,
                words,
            ),
            (None, None) => Ok(()),
            _ => Err(CaseError::Fail(format!(
                "{path}the device and the reference disagree on whether the calls have a \
                 stats buffer"
            ))),
        }
    }
}

/// What a sequence exercised, so a scenario that silently stopped testing its feature fails.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    pub(crate) hits: i64,
    pub(crate) misses: i64,
    pub(crate) resident: i64,
    /// Host entries left without a slot (misses beyond the evictable slots).
    pub(crate) unslotted: i64,
    /// Plan entries with source -1 (host rows beyond the pool, zero-filled).
    pub(crate) zero_fill: i64,
}

/// What a sequence was built to exercise ([`Coverage::expect`] checks it did).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asked {
    /// Every page resident: no hit and no miss may happen.
    pub(crate) fully_resident: bool,
    /// Top-k entries kept between steps: some must hit.
    pub(crate) hits: bool,
    /// Resident pages: some entries must resolve to them.
    pub(crate) resident: bool,
    /// Host blocks beyond the pool: some plan entries must zero-fill.
    pub(crate) beyond_pool: bool,
    /// More distinct rows per request than hot slots: some misses must get no slot.
    pub(crate) beyond_slots: bool,
}

impl Coverage {
    /// Fails when the sequence did not exercise what `asked` says it was built for.
    pub(crate) fn expect(&self, asked: &Asked) -> CaseResult {
        let c = self;
        ensure!(
            !asked.resident || c.resident > 0,
            "no resident entry: {c:?}"
        );
        if asked.fully_resident {
            ensure!(c.hits == 0 && c.misses == 0, "fully resident, yet {c:?}");
            return Ok(());
        }
        ensure!(c.misses > 0, "no miss was exercised: {c:?}");
        ensure!(!asked.hits || c.hits > 0, "no hit was exercised: {c:?}");
        ensure!(
            !asked.beyond_pool || c.zero_fill > 0,
            "no host row beyond the pool: {c:?}"
        );
        ensure!(
            !asked.beyond_slots || c.unslotted > 0,
            "no miss beyond the evictable slots: {c:?}"
        );
        Ok(())
    }

    /// Tallies one call of `desc`'s shape over `h`'s tables; returns its hits and misses.
    pub(crate) fn add(
        &mut self,
        desc: &ResolveDesc,
        h: &HostState,
        (req_id, topk): (&[i32], &[i32]),
        out: &Outputs,
    ) -> (i64, i64) {
        let k = desc.top_k as usize;
        let (mut hits, mut misses) = (0, 0);
        for (t, &id) in req_id.iter().enumerate() {
            let Some(rows) = desc.request_rows(id, h.idx_mapping.as_deref()) else {
                continue;
            };
            hits += i64::from(out.hits[t]);
            misses += i64::from(out.misses[t]);
            for m in 0..out.misses[t].max(0) as usize {
                self.zero_fill += i64::from(out.miss_src[t * k + m] == -1);
            }
            for j in 0..k {
                match desc.classify_rows(&h.resident, &h.host, rows, topk[t * k + j]) {
                    Entry::Resident(_) => self.resident += 1,
                    Entry::Host(_) => self.unslotted += i64::from(out.indices[t * k + j] == -1),
                    Entry::Invalid => {}
                }
            }
        }
        self.hits += hits;
        self.misses += misses;
        (hits, misses)
    }
}
