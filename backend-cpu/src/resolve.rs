//! Residency resolve (contract §5.2), a faster equivalent of
//! [`hisparse_core::ops::resolve::resolve`].
//!
//! Same rules, same outputs bit for bit (the conformance suite compares them after every step of
//! multi-step sequences); what differs is the bookkeeping: token rows are grouped by request with
//! one sort instead of a quadratic scan, wanted host rows are found through an open-addressing
//! table instead of a `BTreeMap`, and the scratch vectors are allocated once per call, not per
//! request. The entry classification and the hot-row arithmetic are the core's own
//! ([`ResolveDesc::classify_rows`], [`ResolveDesc::hot_row`]). In batch-row order the owners of
//! the state rows are found with one sort of `idx_mapping` ([`owned_state_rows`]) instead of the
//! reference's scan of the batch rows before each one. It does not call the reference's
//! request loop, which it is checked against: where the two read alike they are accepted twins
//! (CONTRIBUTING.md, "One rule, one place").

use hisparse_core::ops::ResolveDesc;
use hisparse_core::ops::resolve::{Entry, RequestRows};

/// The resolve arguments as typed slices (already checked against the descriptor): the
/// reference's own form; the stats words are added by the caller after the resolve.
pub(crate) use hisparse_core::ops::ResolveSlices as Slices;

/// The state row each batch row owns in batch-row order
/// ([`ResolveDesc::owned_state_row`]: in range, and the smallest batch row mapping to it), for
/// every batch row at once.
fn owned_state_rows(desc: &ResolveDesc, idx_mapping: &[i32]) -> Vec<Option<usize>> {
    let rows = desc.num_requests as usize;
    let bound = desc.state_table_rows() as usize;
    let mut pairs: Vec<(usize, usize)> = idx_mapping[..rows]
        .iter()
        .enumerate()
        .filter_map(|(b, &s)| {
            usize::try_from(s)
                .ok()
                .filter(|&s| s < bound)
                .map(|s| (s, b))
        })
        .collect();
    pairs.sort_unstable();
    let mut owned = vec![None; rows];
    for same in pairs.chunk_by(|x, y| x.0 == y.0) {
        let (s, b) = same[0];
        owned[b] = Some(s);
    }
    owned
}

/// Host row → index in the wanted list: open addressing, linear probing, keys are `>= 0`.
struct Wanted {
    keys: Vec<i32>,
    vals: Vec<u32>,
    mask: usize,
}

impl Wanted {
    fn with_capacity(n: usize) -> Self {
        let cap = (2 * n.max(1)).next_power_of_two();
        Wanted {
            keys: vec![-1; cap],
            vals: vec![0; cap],
            mask: cap - 1,
        }
    }

    fn clear(&mut self) {
        self.keys.fill(-1);
    }

    #[inline]
    fn slot(&self, key: i32) -> usize {
        ((key as u32).wrapping_mul(0x9e37_79b1) as usize) & self.mask
    }

    /// The index stored for `key`, or `insert` it with `next` and return `None`.
    #[inline]
    fn get_or_insert(&mut self, key: i32, next: u32) -> Option<u32> {
        let mut i = self.slot(key);
        loop {
            match self.keys[i] {
                -1 => {
                    self.keys[i] = key;
                    self.vals[i] = next;
                    return None;
                }
                k if k == key => return Some(self.vals[i]),
                _ => i = (i + 1) & self.mask,
            }
        }
    }

    #[inline]
    fn get(&self, key: i32) -> Option<u32> {
        if key < 0 {
            return None;
        }
        let mut i = self.slot(key);
        loop {
            match self.keys[i] {
                -1 => return None,
                k if k == key => return Some(self.vals[i]),
                _ => i = (i + 1) & self.mask,
            }
        }
    }
}

/// Resolves every request of the batch. `a` must have been checked against `desc`.
pub(crate) fn resolve(desc: &ResolveDesc, a: Slices<'_>) {
    let t_count = desc.num_tokens as usize;
    let k = desc.top_k as usize;
    let n = desc.hot_slots as usize;
    let tk = t_count * k;
    a.indices[..tk].fill(-1);
    a.miss_src[..tk].fill(-1);
    a.miss_dst[..tk].fill(-1);
    a.valid_counts[..t_count].fill(0);
    a.hit_counts[..t_count].fill(0);
    a.miss_counts[..t_count].fill(0);

    // Token rows grouped by request (batch row, then state row: one per request in either
    // order), each group in row order (padding rows dropped).
    let owned = a.idx_mapping.map(|m| owned_state_rows(desc, m));
    let mut order: Vec<(RequestRows, usize)> = (0..t_count)
        .filter_map(|t| {
            let batch = desc.state_row(a.req_id[t])?;
            let state = match &owned {
                Some(owned) => owned[batch]?,
                None => batch,
            };
            Some((RequestRows { batch, state }, t))
        })
        .collect();
    order.sort_unstable();

    let max_rows = order
        .chunk_by(|x, y| x.0 == y.0)
        .map(<[_]>::len)
        .max()
        .unwrap_or(0);
    let mut entries: Vec<Entry> = Vec::with_capacity(max_rows * k);
    // (host row, first token row) of each wanted row, in order of first appearance.
    let mut wanted: Vec<(i32, usize)> = Vec::with_capacity(max_rows * k);
    let mut table = Wanted::with_capacity(max_rows * k);
    let mut slot_of: Vec<u32> = Vec::with_capacity(max_rows * k);
    let mut evictable: Vec<u16> = Vec::with_capacity(n);
    let mut hits: Vec<u16> = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    const NO_SLOT: u32 = u32::MAX;

    for group in order.chunk_by(|x, y| x.0 == y.0) {
        let rows = group[0].0;
        // `h`: row of the host and hot tables; `r`: row of the resident table, slot_host_rows and LRU.
        let (h, r) = (rows.batch, rows.state);
        entries.clear();
        wanted.clear();
        table.clear();
        for &(_, t) in group {
            for &tok in &a.topk[t * k..(t + 1) * k] {
                let e = desc.classify_rows(a.resident_table, a.host_table, rows, tok);
                if let Entry::Host(g) = e
                    && table.get_or_insert(g, wanted.len() as u32).is_none()
                {
                    wanted.push((g, t));
                }
                entries.push(e);
            }
        }
        slot_of.clear();
        slot_of.resize(wanted.len(), NO_SLOT);
        if !wanted.is_empty() {
            let slot_host_rows = &mut a.slot_host_rows[r * n..(r + 1) * n];
            let lru = &mut a.lru[r * n..(r + 1) * n];
            // Repair a corrupt LRU (not a permutation of 0..n).
            seen.fill(false);
            let permutation = lru.iter().all(|&s| match seen.get_mut(s as usize) {
                Some(v) if !*v => {
                    *v = true;
                    true
                }
                _ => false,
            });
            if !permutation {
                for (i, s) in lru.iter_mut().enumerate() {
                    *s = i as u16;
                }
                slot_host_rows.fill(-1);
            }
            // Hits and evictable slots, in LRU order.
            let host_rows = desc.host_rows();
            evictable.clear();
            hits.clear();
            for &s in lru.iter() {
                let cached = slot_host_rows[s as usize];
                let in_pool = cached >= 0 && i64::from(cached) < host_rows;
                match table.get(cached) {
                    Some(w) if in_pool && slot_of[w as usize] == NO_SLOT => {
                        slot_of[w as usize] = u32::from(s);
                        hits.push(s);
                        a.hit_counts[wanted[w as usize].1] += 1;
                    }
                    _ => evictable.push(s),
                }
            }
            // Misses take evictable slots in order; those beyond get none.
            let mut used = 0;
            for (w, &(g, t)) in wanted.iter().enumerate() {
                if slot_of[w] != NO_SLOT || used == evictable.len() {
                    continue;
                }
                let s = evictable[used];
                used += 1;
                let src = if i64::from(g) < host_rows { g } else { -1 };
                slot_host_rows[s as usize] = src;
                slot_of[w] = u32::from(s);
                let m = a.miss_counts[t] as usize;
                a.miss_src[t * k + m] = src;
                a.miss_dst[t * k + m] = desc.hot_row(a.hot_table, h, u32::from(s));
                a.miss_counts[t] += 1;
            }
            // New order: unused evictables, then the miss slots (in miss order, which is the
            // order they were taken from `evictable`), then the hits.
            let (taken, unused) = evictable.split_at(used);
            let (front, rest) = lru.split_at_mut(unused.len());
            front.copy_from_slice(unused);
            let (mid, back) = rest.split_at_mut(taken.len());
            mid.copy_from_slice(taken);
            back.copy_from_slice(&hits);
        }
        // Outputs.
        for (i, &(_, t)) in group.iter().enumerate() {
            let mut valid = 0;
            for j in 0..k {
                let v = match entries[i * k + j] {
                    Entry::Invalid => -1,
                    Entry::Resident(row) => row,
                    Entry::Host(g) => match table.get(g).map(|w| slot_of[w as usize]) {
                        Some(s) if s != NO_SLOT => desc.hot_row(a.hot_table, h, s),
                        _ => -1,
                    },
                };
                a.indices[t * k + j] = v;
                valid += i32::from(v != -1);
            }
            a.valid_counts[t] = valid;
        }
    }
}
