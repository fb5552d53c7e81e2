//! The decode path's counters, kept on the device so that they stay true when an engine replays
//! its per-layer calls in a graph the host never sees.
//!
//! Every per-layer call adds its hits, misses, valid entries and one call into its own slot of
//! one device buffer ([`hisparse_core::ops::stats`]): index group `g`'s resolves into slot `g`,
//! its fully-resident remaps into slot `G + g`, prefill remaps into slot `2G`. Every
//! `stats_every`-th `end_step` copies the whole buffer into a slot of a small pinned ring (one
//! copy, on the step's stream, after the step's calls or their replay); [`crate::Runtime::poll`]
//! reads the copies whose event completed and folds the differences since the last one (modulo
//! 2³²) into [`Counters`].

use std::collections::VecDeque;

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::stats::{
    STATS_CALLS, STATS_HITS, STATS_MISSES, STATS_SLOT_BYTES, STATS_SLOT_WORDS, STATS_VALID,
};

use crate::counters::Counters;
use crate::error::RuntimeError;

/// Snapshots of the buffer that may be on their way to the host at once.
const RING: usize = 4;

/// What a per-layer call counts into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatsSlot {
    /// A resolve of index group `g`.
    Resolve(usize),
    /// A fully-resident remap of index group `g`.
    Remap(usize),
    /// A prefill remap.
    Prefill,
}

/// The device buffer, the pinned ring and what was folded so far.
pub(crate) struct DeviceStats<D: Device> {
    /// `u32[4 * (2G + 1)]`.
    pub(crate) buf: D::Buffer,
    groups: usize,
    /// Host→device bytes one miss of each index group costs (its leader's and followers' rows).
    miss_bytes: Vec<u64>,
    ring: D::HostBuffer,
    next: usize,
    in_flight: VecDeque<(usize, D::Event)>,
    /// The words of the last snapshot folded.
    last: Vec<u32>,
}

impl<D: Device> DeviceStats<D> {
    /// Slots of `kv`'s layout.
    fn slots(kv: &KvCacheConfig) -> usize {
        2 * kv.index_groups.len() + 1
    }

    /// Device bytes of the buffer for `kv`.
    pub(crate) fn bytes(kv: &KvCacheConfig) -> u64 {
        Self::slots(kv) as u64 * STATS_SLOT_BYTES
    }

    pub(crate) fn new(dev: &D, kv: &KvCacheConfig) -> Result<Self, RuntimeError<D::Error>> {
        let bytes = Self::bytes(kv) as usize;
        let buf = dev
            .alloc(bytes)
            .map_err(RuntimeError::device("allocating the decode counters"))?;
        let ring = dev
            .alloc_pinned(bytes * RING)
            .map_err(RuntimeError::device("allocating the pinned counter ring"))?;
        let miss_bytes = kv
            .index_groups
            .iter()
            .map(|g| u64::from(kv.row_bytes) * g.layers.len() as u64)
            .collect();
        Ok(DeviceStats {
            buf,
            groups: kv.index_groups.len(),
            miss_bytes,
            ring,
            next: 0,
            in_flight: VecDeque::new(),
            last: vec![0; Self::slots(kv) * STATS_SLOT_WORDS as usize],
        })
    }

    /// The buffer slot of `s`.
    pub(crate) fn slot(&self, s: StatsSlot) -> u32 {
        (match s {
            StatsSlot::Resolve(g) => g,
            StatsSlot::Remap(g) => self.groups + g,
            StatsSlot::Prefill => 2 * self.groups,
        }) as u32
    }

    /// Copies the buffer into the next ring slot on `stream` (after everything enqueued on it)
    /// and records the event [`DeviceStats::fold_ready`] waits for. With every ring slot in
    /// flight, the oldest is folded first (waiting for it: rare, the device is then far behind).
    pub(crate) fn snapshot(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        counters: &mut Counters,
    ) -> Result<(), RuntimeError<D::Error>> {
        if self.in_flight.len() == RING
            && let Some((slot, event)) = self.in_flight.pop_front()
        {
            self.fold(dev, slot, &event, counters)?;
        }
        let bytes = self.last.len() * 4;
        let slot = self.next;
        self.next = (slot + 1) % RING;
        dev.copy_to_host(stream, &self.buf, 0, &mut self.ring, slot * bytes, bytes)
            .map_err(RuntimeError::device("copying the decode counters to host"))?;
        let event = dev
            .record_event(stream)
            .map_err(RuntimeError::device("recording the decode counters"))?;
        self.in_flight.push_back((slot, event));
        Ok(())
    }

    /// Folds every snapshot whose copy has completed, without blocking.
    pub(crate) fn fold_ready(
        &mut self,
        dev: &D,
        counters: &mut Counters,
    ) -> Result<(), RuntimeError<D::Error>> {
        while let Some((_, event)) = self.in_flight.front() {
            let done = dev
                .query_event(event)
                .map_err(RuntimeError::device("polling the decode counters"))?;
            if !done {
                break;
            }
            let (slot, event) = self.in_flight.pop_front().expect("front exists");
            self.fold(dev, slot, &event, counters)?;
        }
        Ok(())
    }

    /// Adds the differences between ring slot `slot` and the last snapshot folded.
    fn fold(
        &mut self,
        dev: &D,
        slot: usize,
        event: &D::Event,
        counters: &mut Counters,
    ) -> Result<(), RuntimeError<D::Error>> {
        let bytes = self.last.len() * 4;
        let mut raw = vec![0u8; bytes];
        dev.read_pinned_after(event, &self.ring, slot * bytes, &mut raw)
            .map_err(RuntimeError::device("reading the decode counters"))?;
        let words: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let w = STATS_SLOT_WORDS as usize;
        let delta = |s: usize, word: usize| -> u64 {
            u64::from(words[s * w + word].wrapping_sub(self.last[s * w + word]))
        };
        let c = counters;
        for g in 0..self.groups {
            let (hits, misses, valid) = (
                delta(g, STATS_HITS),
                delta(g, STATS_MISSES),
                delta(g, STATS_VALID),
            );
            c.hot_hits += hits;
            c.hot_misses += misses;
            c.resident_reads += valid.saturating_sub(hits + misses);
            c.resolve_calls += delta(g, STATS_CALLS);
            c.h2d_bytes += misses * self.miss_bytes[g];
            let r = self.groups + g;
            c.resident_reads += delta(r, STATS_VALID);
            c.remap_calls += delta(r, STATS_CALLS);
        }
        c.prefill_remap_calls += delta(2 * self.groups, STATS_CALLS);
        c.sampled_steps += 1;
        self.last = words;
        Ok(())
    }
}
