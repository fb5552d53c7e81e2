//! The reference resolver: hits, misses, LRU order, requests that share nothing.

use super::*;
use alloc::vec;

/// A small world: `R` requests, block size 4, 4 pages per request; page `p` of request `r`
/// lives in host block `4r + p` (so token `tok` of request `r` is host row `16r + tok`); the
/// hot region of request `r` is GPU blocks `10 + r*w ..`, attention stride 4, so slot `s` of
/// request 0 is physical row `40 + s`.
struct World {
    desc: ResolveDesc,
    resident: Vec<i32>,
    host: Vec<i32>,
    hot: Vec<i32>,
    slot_host_rows: Vec<i32>,
    lru: Vec<u16>,
    /// The stats buffer the calls add to (slot `desc.stats_slot`), if any.
    stats: Option<Vec<i32>>,
}

#[derive(Debug, PartialEq)]
struct Out {
    indices: Vec<i32>,
    valid: Vec<i32>,
    hits: Vec<i32>,
    misses: Vec<i32>,
    src: Vec<i32>,
    dst: Vec<i32>,
}

impl World {
    fn new(requests: u32, top_k: u32, hot_slots: u32) -> Self {
        Self::with_state_rows(requests, None, top_k, hot_slots)
    }

    /// The tables of a batch-row-order call: `state_rows` state rows (resident, slot_host_rows, LRU)
    /// and `batch_rows` batch rows (host, hot), 2 top-k entries and 4 hot slots (one GPU
    /// block per hot-table row: batch row b's slot s is physical row 40 + 4b + s).
    fn batch(batch_rows: u32, state_rows: u32) -> Self {
        Self::with_state_rows(batch_rows, Some(state_rows), 2, 4)
    }

    /// `requests` rows of host and hot tables; `state_rows` of resident, slot_host_rows and LRU when
    /// given (batch-row order), else `requests` of them too (state-row order).
    fn with_state_rows(requests: u32, state_rows: Option<u32>, top_k: u32, hot_slots: u32) -> Self {
        let desc = ResolveDesc {
            num_tokens: 0,
            top_k,
            num_requests: requests,
            max_pages: 4,
            block_size: 4,
            hot_slots,
            attention_block_stride: 4,
            host_num_blocks: 4 * requests,
            num_state_rows: state_rows,
            stats_slot: 0,
        };
        let w = desc.hot_table_width() as i32;
        let n = hot_slots as usize;
        let state = state_rows.unwrap_or(requests) as usize;
        World {
            desc,
            resident: vec![0; 4 * state],
            host: (0..4 * requests as i32).collect(),
            hot: (0..requests as i32 * w).map(|i| 10 + i).collect(),
            slot_host_rows: vec![-1; state * n],
            lru: (0..state * n).map(|i| (i % n) as u16).collect(),
            stats: None,
        }
    }

    fn lru(&self, r: usize) -> &[u16] {
        let n = self.desc.hot_slots as usize;
        &self.lru[r * n..(r + 1) * n]
    }

    fn slot_host_rows(&self, r: usize) -> &[i32] {
        let n = self.desc.hot_slots as usize;
        &self.slot_host_rows[r * n..(r + 1) * n]
    }

    fn step(&mut self, req_id: &[i32], topk: &[i32]) -> Out {
        self.call(None, req_id, topk).unwrap()
    }

    /// One resolve call, in batch-row order when `map` (the `idx_mapping`) is given.
    fn call(&mut self, map: Option<&[i32]>, req_id: &[i32], topk: &[i32]) -> Result<Out, OpError> {
        let t = req_id.len();
        let tk = topk.len();
        let desc = ResolveDesc {
            num_tokens: t as u32,
            ..self.desc
        };
        let mut o = Out {
            indices: vec![7; tk],
            valid: vec![7; t],
            hits: vec![7; t],
            misses: vec![7; t],
            src: vec![7; tk],
            dst: vec![7; tk],
        };
        resolve(
            &desc,
            ResolveSlices {
                req_id,
                topk,
                resident_table: &self.resident,
                host_table: &self.host,
                hot_table: &self.hot,
                slot_host_rows: &mut self.slot_host_rows,
                lru: &mut self.lru,
                indices: &mut o.indices,
                valid_counts: &mut o.valid,
                hit_counts: &mut o.hits,
                miss_counts: &mut o.misses,
                miss_src: &mut o.src,
                miss_dst: &mut o.dst,
                idx_mapping: map,
                stats: self.stats.as_deref_mut(),
            },
        )?;
        Ok(o)
    }
}

#[test]
fn exact_hits_misses_slot_choice_and_lru_order() {
    let mut w = World::new(1, 2, 4);
    // Two misses take the two least recent slots (0, 1).
    let o = w.step(&[0], &[0, 1]);
    assert_eq!(o.indices, [40, 41]);
    assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (2, 0, 2));
    assert_eq!((o.src, o.dst), (vec![0, 1], vec![40, 41]));
    assert_eq!(w.slot_host_rows(0), [0, 1, -1, -1]);
    assert_eq!(w.lru(0), [2, 3, 0, 1]);
    // Host row 1 hits slot 1; host row 5 misses into the least recent evictable slot (2).
    // New order: unused evictables (3, 0), the miss (2), the hit (1).
    let o = w.step(&[0], &[1, 5]);
    assert_eq!(o.indices, [41, 42]);
    assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (2, 1, 1));
    assert_eq!((o.src, o.dst), (vec![5, -1], vec![42, -1]));
    assert_eq!(w.slot_host_rows(0), [0, 1, 5, -1]);
    assert_eq!(w.lru(0), [3, 0, 2, 1]);
    // A hit and no miss: the hit still moves to the most recent end.
    let o = w.step(&[0], &[5, -1]);
    assert_eq!(o.indices, [42, -1]);
    assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (1, 1, 0));
    assert_eq!(w.lru(0), [3, 0, 1, 2]);
    // Row 0 hits slot 0, row 9 misses into slot 3.
    let o = w.step(&[0], &[0, 9]);
    assert_eq!(o.indices, [40, 43]);
    assert_eq!(w.slot_host_rows(0), [0, 1, 5, 9]);
    assert_eq!(w.lru(0), [1, 2, 3, 0]);
}

#[test]
fn misses_follow_a_non_identity_lru() {
    let mut w = World::new(1, 2, 4);
    w.lru = vec![3, 1, 0, 2];
    let o = w.step(&[0], &[6, 2]);
    // First miss (row 6) takes slot 3, the second (row 2) slot 1.
    assert_eq!(o.indices, [43, 41]);
    assert_eq!(o.dst[..2], [43, 41]);
    assert_eq!(w.slot_host_rows(0), [-1, 2, -1, 6]);
    assert_eq!(w.lru(0), [0, 2, 3, 1]);
}

#[test]
fn padding_rows_output_minus_one_and_touch_nothing() {
    let mut w = World::new(2, 2, 4);
    w.slot_host_rows[0] = 3;
    let (slot_host_rows, lru) = (w.slot_host_rows.clone(), w.lru.clone());
    let o = w.step(&[-1, 2, i32::MIN], &[0, 1, 2, 3, 4, 5]);
    assert_eq!(o.indices, [-1; 6]);
    assert_eq!(
        (o.valid, o.hits, o.misses),
        (vec![0; 3], vec![0; 3], vec![0; 3])
    );
    assert_eq!((o.src, o.dst), (vec![-1; 6], vec![-1; 6]));
    assert_eq!((w.slot_host_rows, w.lru), (slot_host_rows, lru));
}

#[test]
fn duplicates_within_a_row_resolve_once() {
    let mut w = World::new(1, 4, 4);
    let o = w.step(&[0], &[1, 1, 5, 1]);
    assert_eq!(o.indices, [40, 40, 41, 40]);
    assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (4, 0, 2));
    assert_eq!(o.src, [1, 5, -1, -1]);
    assert_eq!(w.lru(0), [2, 3, 0, 1]);
    // Again: both are hits, counted once each.
    let o = w.step(&[0], &[5, 1, 5, 5]);
    assert_eq!(o.indices, [41, 40, 41, 41]);
    assert_eq!((o.hits[0], o.misses[0]), (2, 0));
}

#[test]
fn resident_pages_come_first_and_leave_the_lru_alone() {
    let mut w = World::new(1, 2, 4);
    w.step(&[0], &[0, 1]);
    let lru = w.lru.clone();
    // Page 0 is resident on GPU block 7 although host rows 0 and 1 are cached hot.
    w.resident[0] = 7;
    let o = w.step(&[0], &[1, 3]);
    assert_eq!(o.indices, [29, 31]);
    assert_eq!((o.valid[0], o.hits[0], o.misses[0]), (2, 0, 0));
    assert_eq!(w.lru, lru, "a fully resident row changes no LRU");
    // Mixed: the resident entry bypasses the slots, the host entry misses.
    let o = w.step(&[0], &[2, 4]);
    assert_eq!(o.indices, [30, 42]);
    assert_eq!(o.misses[0], 1);
    // A null block (0) or a negative one means "read from host".
    w.resident[0] = -1;
    let o = w.step(&[0], &[0, 4]);
    assert_eq!(o.indices, [40, 42]);
    assert_eq!(o.hits[0], 2);
}

#[test]
fn invalid_entries_are_minus_one() {
    let mut w = World::new(1, 4, 4);
    w.host[2] = -1; // page 2 has no host block
    let o = w.step(&[0], &[-1, 16, 9, i32::MIN]);
    assert_eq!(o.indices, [-1; 4]);
    assert_eq!(o.valid[0], 0);
    assert_eq!(w.lru(0), [0, 1, 2, 3], "nothing wanted: no LRU change");
    let o = w.step(&[0], &[15, i32::MAX, 3, -7]);
    assert_eq!(o.indices, [40, -1, 41, -1]);
    assert_eq!(o.valid[0], 2);
}

#[test]
fn host_row_beyond_the_pool_zero_fills_and_never_hits() {
    let mut w = World::new(1, 2, 4);
    w.host[3] = 9; // beyond the 4-block pool: rows 36..40
    let o = w.step(&[0], &[12, 1]);
    assert_eq!(o.indices, [40, 41]);
    assert_eq!((o.src, o.dst), (vec![-1, 1], vec![40, 41]));
    assert_eq!(w.slot_host_rows(0), [-1, 1, -1, -1]);
    // Even a (corrupt) slot_host_rows naming the beyond-pool row is not a hit: it misses again.
    w.slot_host_rows[0] = 36;
    let o = w.step(&[0], &[12, 13]);
    assert_eq!(o.hits[0], 0);
    assert_eq!(o.misses[0], 2);
    assert_eq!(o.src[..2], [-1, -1]);
}

#[test]
fn several_requests_keep_separate_state() {
    let mut w = World::new(2, 2, 4);
    // Interleaved rows; request 1's tokens are host rows 16 + tok.
    let o = w.step(&[1, 0, 1], &[0, 1, 0, 1, 2, 0]);
    // Request 1 resolves rows 0 and 2 together: wanted 16, 17, 18; slots 0, 1, 2 of its
    // region (GPU block 11 → rows 44..48).
    assert_eq!(o.indices, [44, 45, 40, 41, 46, 44]);
    assert_eq!(o.misses, [2, 2, 1]);
    assert_eq!(o.src, [16, 17, 0, 1, 18, -1]);
    assert_eq!(o.dst, [44, 45, 40, 41, 46, -1]);
    assert_eq!(w.slot_host_rows(0), [0, 1, -1, -1]);
    assert_eq!(w.slot_host_rows(1), [16, 17, 18, -1]);
    assert_eq!(w.lru(1), [3, 0, 1, 2]);
}

#[test]
fn speculative_rows_share_one_state_and_number_misses_by_first_appearance() {
    let mut w = World::new(1, 2, 4);
    w.step(&[0], &[0, 1]); // slots 0, 1 hold rows 0, 1; lru [2, 3, 0, 1]
    let o = w.step(&[0, 0], &[2, 1, 3, 2]);
    // Wanted in order: 2 (row 0), 1 (row 0, hit), 3 (row 1). Misses: 2 → slot 2, 3 → slot 3.
    assert_eq!(o.indices, [42, 41, 43, 42]);
    assert_eq!((o.hits.clone(), o.misses.clone()), (vec![1, 0], vec![1, 1]));
    assert_eq!((o.src, o.dst), (vec![2, -1, 3, -1], vec![42, -1, 43, -1]));
    assert_eq!(o.valid, [2, 2]);
    assert_eq!(w.lru(0), [0, 2, 3, 1]);
}

/// The LRU order after a call with several rows of one request (module docs): unused
/// evictables in old order, then misses by first appearance across the rows, then hits in
/// their old LRU order — here with the request's rows interleaved with another request's.
#[test]
fn several_rows_of_one_request_give_the_documented_lru_order() {
    let mut w = World::new(2, 3, 8);
    // Request 0: slots 0..3 cache rows 0, 1, 2; LRU [3, 4, 5, 6, 7, 0, 1, 2].
    w.step(&[0], &[0, 1, 2]);
    assert_eq!(w.lru(0), [3, 4, 5, 6, 7, 0, 1, 2]);
    let other = w.lru(1).to_vec();
    // Rows of request 0 (rows 0 and 2) around a row of request 1. Request 0 wants, in order
    // of first appearance: 2 (hit, slot 2), 6 (miss), 0 (hit, slot 0) from row 0; then 7
    // (miss), 6 (again: no count), 1 (hit, slot 1) from row 2.
    let o = w.step(&[0, 1, 0], &[2, 6, 0, 4, 5, 6, 7, 6, 1]);
    // Misses take the least recent evictables 3 and 4, in first-appearance order.
    assert_eq!(o.indices[..3], [42, 43, 40]);
    assert_eq!(o.indices[6..], [44, 43, 41]);
    assert_eq!((o.hits[0], o.misses[0]), (2, 1));
    assert_eq!((o.hits[2], o.misses[2]), (1, 1));
    assert_eq!(
        (o.src[..1].to_vec(), o.dst[..1].to_vec()),
        (vec![6], vec![43])
    );
    assert_eq!(
        (o.src[6..7].to_vec(), o.dst[6..7].to_vec()),
        (vec![7], vec![44])
    );
    // Unused evictables (5, 6, 7), the misses (3, 4), the hits in old order (0, 1, 2) —
    // not in the order the rows asked for them (2, 0, 1).
    assert_eq!(w.lru(0), [5, 6, 7, 3, 4, 0, 1, 2]);
    assert_eq!(w.slot_host_rows(0), [0, 1, 2, 6, 7, -1, -1, -1]);
    // Request 1's row missed rows 4, 5 and 6 (host rows 20, 21, 22 of its own table) in its
    // own state only.
    assert_eq!(&w.lru(1)[5..], &[other[0], other[1], other[2]]);
}

#[test]
fn misses_beyond_the_evictable_slots_get_minus_one() {
    let mut w = World::new(1, 2, 2);
    let o = w.step(&[0, 0], &[0, 1, 2, 3]);
    assert_eq!(o.indices, [40, 41, -1, -1]);
    assert_eq!(o.valid, [2, 0]);
    assert_eq!(o.misses, [2, 0]);
    assert_eq!(o.src, [0, 1, -1, -1]);
    assert_eq!(w.lru(0), [0, 1]);
    // Hits are kept before misses take slots: row 1 hits, 2 takes the only evictable slot.
    let o = w.step(&[0, 0], &[1, 2, 3, 1]);
    assert_eq!(o.indices, [41, 40, -1, 41]);
    assert_eq!(w.slot_host_rows(0), [2, 1]);
}

#[test]
fn a_corrupt_lru_is_repaired_first() {
    for bad in [vec![0u16, 0, 1, 2], vec![0, 1, 2, 4], vec![3, 2, 1, 9]] {
        let mut w = World::new(1, 2, 4);
        w.lru = bad;
        w.slot_host_rows = vec![5, 6, 7, 8];
        let o = w.step(&[0], &[5, 6]);
        // Reset to identity, slot_host_rows cleared: both miss into slots 0 and 1.
        assert_eq!(o.indices, [40, 41]);
        assert_eq!(o.hits[0], 0);
        assert_eq!(w.slot_host_rows(0), [5, 6, -1, -1]);
        assert_eq!(w.lru(0), [2, 3, 0, 1]);
    }
    // A corrupt LRU with nothing wanted is left as it is.
    let mut w = World::new(1, 2, 4);
    w.lru = vec![1, 1, 1, 1];
    w.step(&[0], &[-1, -1]);
    assert_eq!(w.lru(0), [1, 1, 1, 1]);
}

#[test]
fn stats_add_the_sums_of_the_row_counts_and_one_call() {
    let mut w = World::new(2, 2, 4);
    w.stats = Some(vec![1, 2, 3, 4, -1, -2, 0, -1]);
    w.desc.stats_slot = 1;
    // Request 0 misses 0 and 1 in row 0 and 2 in row 2 (row 2's 1 counts nothing); a
    // padding row; request 1 misses 16 + 3.
    let o = w.step(&[0, -1, 0, 1], &[0, 1, 0, 1, 1, 2, 3, -1]);
    assert_eq!((o.hits, o.misses), (vec![0; 4], vec![2, 0, 1, 1]));
    assert_eq!(o.valid, [2, 0, 2, 1]);
    // Slot 0 untouched; slot 1: hits +0, misses +4 (wraps), valid +5, calls +1 (wraps).
    assert_eq!(w.stats.as_deref(), Some(&[1, 2, 3, 4, -1, 2, 5, 0][..]));
    // An empty batch counts the call; a hit counts in word 0.
    w.step(&[], &[]);
    let o = w.step(&[0], &[2, -1]);
    assert_eq!((o.hits[0], o.misses[0], o.valid[0]), (1, 0, 1));
    assert_eq!(w.stats.as_deref(), Some(&[1, 2, 3, 4, 0, 2, 6, 2][..]));
    // A buffer without the slot is refused before anything is written.
    w.stats = Some(vec![9; 7]);
    let (slot_host_rows, lru) = (w.slot_host_rows.clone(), w.lru.clone());
    let e = w.call(None, &[0], &[5, 6]).unwrap_err();
    assert!(
        matches!(
            e,
            OpError::BufferTooSmall {
                buffer: "stats",
                needed: 32,
                actual: 28,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        (w.slot_host_rows, w.lru, w.stats),
        (slot_host_rows, lru, Some(vec![9; 7]))
    );
}

#[test]
fn empty_batch_changes_nothing() {
    let mut w = World::new(2, 2, 4);
    let (slot_host_rows, lru) = (w.slot_host_rows.clone(), w.lru.clone());
    let o = w.step(&[], &[]);
    assert!(o.indices.is_empty());
    assert_eq!((w.slot_host_rows, w.lru), (slot_host_rows, lru));
}

#[test]
fn short_buffers_are_rejected_before_any_write() {
    let w = World::new(1, 2, 4);
    let desc = ResolveDesc {
        num_tokens: 1,
        ..w.desc
    };
    let (mut slot_host_rows, mut lru) = (w.slot_host_rows.clone(), w.lru.clone());
    let mut indices = vec![7; 2];
    let mut short = vec![7; 1];
    let err = resolve(
        &desc,
        ResolveSlices {
            req_id: &[0],
            topk: &[0, 1],
            resident_table: &w.resident,
            host_table: &w.host,
            hot_table: &w.hot,
            slot_host_rows: &mut slot_host_rows,
            lru: &mut lru,
            indices: &mut indices,
            valid_counts: &mut [7],
            hit_counts: &mut [7],
            miss_counts: &mut [7],
            miss_src: &mut [7, 7],
            miss_dst: &mut short,
            idx_mapping: None,
            stats: None,
        },
    )
    .unwrap_err();
    assert!(matches!(
        err,
        OpError::BufferTooSmall {
            buffer: "miss_dst",
            ..
        }
    ));
    assert_eq!(
        (slot_host_rows, lru, indices),
        (w.slot_host_rows, w.lru, vec![7, 7])
    );
    let bad = ResolveDesc {
        hot_slots: 1,
        ..desc
    };
    assert!(matches!(
        bad.validate(),
        Err(OpError::OutOfRange {
            field: "hot_slots",
            ..
        })
    ));
}

#[test]
fn batch_row_order_reads_host_and_hot_by_batch_row_and_state_by_state_row() {
    // Batch rows 0, 1 own state rows 2, 0; state row 1 is untouched.
    let mut w = World::batch(2, 3);
    let map = [2, 0];
    // State row 0 (batch row 1) has page 0 resident on GPU block 7.
    w.resident[0] = 7;
    // Batch row 1 wants tokens 1 (resident: 7*4+1) and 5 (host row 16+5 → slot 0 of block 11).
    // Batch row 0 wants tokens 2 and 3 (host rows 2, 3 → slots 0, 1 of block 10).
    let o = w.call(Some(&map), &[1, 0], &[1, 5, 2, 3]).unwrap();
    assert_eq!(o.indices, [29, 44, 40, 41]);
    assert_eq!(
        (o.valid, o.hits, o.misses),
        (vec![2, 2], vec![0, 0], vec![1, 2])
    );
    assert_eq!((o.src, o.dst), (vec![21, -1, 2, 3], vec![44, -1, 40, 41]));
    assert_eq!(w.slot_host_rows(0), [21, -1, -1, -1]);
    assert_eq!(w.slot_host_rows(1), [-1; 4]);
    assert_eq!(w.slot_host_rows(2), [2, 3, -1, -1]);
    assert_eq!(w.lru(0), [1, 2, 3, 0]);
    assert_eq!(w.lru(1), [0, 1, 2, 3]);
    assert_eq!(w.lru(2), [2, 3, 0, 1]);
    // Next step the batch is reordered: batch row 0 is now state row 0's request and batch
    // row 1 state row 2's. Host rows follow the batch rows' host tables (token 5 of batch
    // row 0 is host row 5, not the 21 state row 0 caches; tokens 3, 2 of batch row 1 are
    // host rows 19, 18, not state row 2's cached 3, 2), hot rows the batch rows' hot tables.
    let o = w.call(Some(&[0, 2]), &[0, 1], &[5, -1, 3, 2]).unwrap();
    assert_eq!(o.indices, [41, -1, 46, 47]);
    assert_eq!((o.hits, o.misses), (vec![0, 0], vec![1, 2]));
    assert_eq!(w.slot_host_rows(0), [21, 5, -1, -1]);
    assert_eq!(w.slot_host_rows(2), [2, 3, 19, 18]);
    assert_eq!(w.lru(2), [0, 1, 2, 3]);
}

#[test]
fn unowned_duplicate_negative_and_out_of_range_state_rows_are_padding() {
    let mut w = World::batch(5, 3);
    w.slot_host_rows[0] = 9;
    let (slot_host_rows, lru) = (w.slot_host_rows.clone(), w.lru.clone());
    // Batch row 0 → -1, 1 → 3 (≥ S), 2 → 1, 3 → 1 (owned by 2: padding), 4 → i32::MIN.
    let map = [-1, 3, 1, 1, i32::MIN];
    let o = w.call(Some(&map), &[0, 1, 3, 4, 5, -1], &[0; 12]).unwrap();
    assert_eq!(o.indices, [-1; 12]);
    assert_eq!(
        (o.valid, o.hits, o.misses),
        (vec![0; 6], vec![0; 6], vec![0; 6])
    );
    assert_eq!((o.src, o.dst), (vec![-1; 12], vec![-1; 12]));
    assert_eq!(
        (w.slot_host_rows.clone(), w.lru.clone()),
        (slot_host_rows, lru)
    );
    // The owner (batch row 2) resolves against state row 1; its rows interleave with the
    // duplicate's, which stays padding.
    let o = w.call(Some(&map), &[3, 2, 2], &[0, 1, 0, 1, 6, 1]).unwrap();
    assert_eq!(o.indices[..2], [-1, -1]);
    assert_eq!(o.indices[2..], [48, 49, 50, 49]);
    assert_eq!(o.misses, [0, 2, 1]);
    assert_eq!(w.slot_host_rows(1), [32, 33, 38, -1]);
    // The owner does not need token rows of its own: batch row 3 stays padding.
    let o = w.call(Some(&map), &[3], &[0, 1]).unwrap();
    assert_eq!(o.indices, [-1, -1]);
    let desc = w.desc;
    assert_eq!(desc.owned_state_row(&map, 2), Some(1));
    assert_eq!(desc.owned_state_row(&map, 3), None);
    assert_eq!(
        desc.request_rows(2, Some(&map)),
        Some(RequestRows { batch: 2, state: 1 })
    );
    assert_eq!(desc.request_rows(5, Some(&map)), None);
}

#[test]
fn batch_row_order_equals_state_row_order_over_permuted_tables() {
    // Four batch rows over six state rows; the same workload in state-row order: req_id
    // names state rows, host and hot tables permuted to state rows.
    let map = [4, 1, 5, 0];
    let mut batch = World::batch(4, 6);
    let mut state = World::new(6, 2, 4);
    state.desc.host_num_blocks = batch.desc.host_num_blocks;
    for (b, &s) in map.iter().enumerate() {
        let s = s as usize;
        state.host[4 * s..4 * s + 4].copy_from_slice(&batch.host[4 * b..4 * b + 4]);
        state.hot[s] = batch.hot[b];
        batch.resident[4 * s + 1] = 20 + s as i32;
        state.resident[4 * s + 1] = 20 + s as i32;
    }
    let steps: [(&[i32], &[i32]); 4] = [
        (&[0, 1, 2, 3], &[0, 1, 2, 3, 4, 5, 6, 7]),
        (&[2, 2, 0, -1], &[5, 9, 9, 10, 0, 14, 3, 3]),
        (&[3, 1, 3], &[7, 0, 7, 12, 13, 1]),
        (&[], &[]),
    ];
    for (req, topk) in steps {
        let o = batch.call(Some(&map), req, topk).unwrap();
        let mapped: Vec<i32> = req
            .iter()
            .map(|&b| usize::try_from(b).map_or(-1, |b| map[b]))
            .collect();
        assert_eq!(o, state.step(&mapped, topk), "req {req:?}");
        assert_eq!(
            (&batch.slot_host_rows, &batch.lru),
            (&state.slot_host_rows, &state.lru)
        );
    }
}

#[test]
fn batch_row_order_is_checked_before_any_write() {
    let mut w = World::batch(2, 3);
    let before = (w.slot_host_rows.clone(), w.lru.clone());
    let err = w.call(None, &[0], &[0, 1]).unwrap_err();
    assert!(
        matches!(
            err,
            OpError::BufferTooSmall {
                buffer: "idx_mapping",
                ..
            }
        ),
        "{err}"
    );
    let err = w.call(Some(&[0]), &[0], &[0, 1]).unwrap_err();
    assert!(
        matches!(
            err,
            OpError::BufferTooSmall {
                buffer: "idx_mapping",
                ..
            }
        ),
        "{err}"
    );
    // Resident table, slot_host_rows and LRU are sized by the state rows.
    w.resident.truncate(8);
    let err = w.call(Some(&[0, 1]), &[0], &[0, 1]).unwrap_err();
    assert!(
        matches!(
            err,
            OpError::BufferTooSmall {
                buffer: "resident_table",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!((w.slot_host_rows.clone(), w.lru.clone()), before);
    // A mapping without the declared order, and an empty state-row count, are refused.
    let mut s = World::new(1, 2, 4);
    s.desc.num_tokens = 1;
    let (mut slot_host_rows, mut lru) = (s.slot_host_rows.clone(), s.lru.clone());
    let err = resolve(
        &s.desc,
        ResolveSlices {
            req_id: &[0],
            topk: &[0, 1],
            resident_table: &s.resident,
            host_table: &s.host,
            hot_table: &s.hot,
            slot_host_rows: &mut slot_host_rows,
            lru: &mut lru,
            indices: &mut [7; 2],
            valid_counts: &mut [7],
            hit_counts: &mut [7],
            miss_counts: &mut [7],
            miss_src: &mut [7; 2],
            miss_dst: &mut [7; 2],
            idx_mapping: Some(&[0]),
            stats: None,
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            OpError::Mismatch {
                field: "idx_mapping (given)",
                ..
            }
        ),
        "{err}"
    );
    let zero = ResolveDesc {
        num_state_rows: Some(0),
        ..s.desc
    };
    assert!(matches!(
        zero.validate(),
        Err(OpError::OutOfRange {
            field: "num_state_rows",
            ..
        })
    ));
}
