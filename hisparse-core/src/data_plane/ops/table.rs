//! Stream-ordered table maintenance: sparse writes into `i32` tables and hot-state resets
//! (contract §7, item 1, "table updates (incremental), hot-state resets").
//!
//! An engine keeps the per-request tables the decode path reads (resident, host and hot tables,
//! the indexer's and regular groups' block tables) in device memory. Each step changes only a few
//! entries of them: a page gets its first block, a page is reclaimed, a hot region is given out.
//! [`write_table`] applies such a list of `(index, value)` writes in one call, so a backend can
//! stage the list once and scatter it with one launch, ordered on a stream like every other
//! operation (no synchronous upload of whole tables, no host synchronisation).
//!
//! [`reset_hot_state`] puts the hot state of chosen state rows back to "nothing cached": every
//! `slot_host_rows` entry `-1` and the LRU order the identity `0, 1, …, N-1`. It runs when a hot region is
//! given to a request or released, and when a state row is handed to a new request.
//!
//! Both take their lists from the host; a backend copies them before the call returns.

use super::{BufferLen, I32_BYTES, MAX_HOT_SLOTS, U16_BYTES, in_range, mul, need, nonzero};
use crate::error::{OpError, OpName};

/// One entry of a sparse table write: `table[index] = value`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C)]
pub struct TableWrite {
    /// Element index into the table (`i32` elements, not bytes).
    pub index: u32,
    /// The value written.
    pub value: i32,
}

/// Shape of one [`write_table`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableWriteDesc {
    /// Elements (`i32`) of the table; every write's index must lie below it.
    pub table_len: u32,
}

impl TableWriteDesc {
    /// Checks the descriptor, the write list and the table's size.
    ///
    /// Indices must be strictly increasing: the list names each element at most once (so the
    /// writes are independent and a backend may apply them in any order), and the check is one
    /// pass without allocation. Sort and deduplicate before calling (later writes winning).
    pub fn check<B: BufferLen + ?Sized>(
        &self,
        writes: &[TableWrite],
        table: &B,
    ) -> Result<(), OpError> {
        const OP: OpName = OpName::TableWrite;
        need(
            OP,
            "table",
            table.byte_len(),
            self.table_len.into(),
            I32_BYTES,
        )?;
        let mut prev: Option<u32> = None;
        for (i, w) in writes.iter().enumerate() {
            if w.index >= self.table_len {
                return Err(OpError::ElementOutOfRange {
                    op: OP,
                    list: "writes",
                    index: i,
                    field: "index",
                    value: w.index.into(),
                    limit: self.table_len.into(),
                });
            }
            if let Some(p) = prev
                && w.index <= p
            {
                return Err(OpError::NotIncreasing {
                    op: OP,
                    list: "writes",
                    index: i,
                    field: "index",
                    value: w.index.into(),
                    previous: p.into(),
                });
            }
            prev = Some(w.index);
        }
        Ok(())
    }
}

/// Reference sparse table write: `table[w.index] = w.value` for every write.
pub fn write_table(
    desc: &TableWriteDesc,
    writes: &[TableWrite],
    table: &mut [i32],
) -> Result<(), OpError> {
    desc.check(writes, table)?;
    for w in writes {
        table[w.index as usize] = w.value;
    }
    Ok(())
}

/// Shape of one [`reset_hot_state`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotResetDesc {
    /// State rows `R` of the `slot_host_rows` and `lru` buffers.
    pub num_requests: u32,
    /// Hot slots per state row `N` (`1..=32768`).
    pub hot_slots: u32,
}

impl HotResetDesc {
    /// Checks the descriptor, the row list and both buffers' sizes. A row may be listed more
    /// than once (resetting is idempotent).
    pub fn check<G: BufferLen + ?Sized, L: BufferLen + ?Sized>(
        &self,
        rows: &[u32],
        slot_host_rows: &G,
        lru: &L,
    ) -> Result<(), OpError> {
        const OP: OpName = OpName::HotReset;
        nonzero(OP, "num_requests", self.num_requests.into())?;
        in_range(
            OP,
            "hot_slots",
            self.hot_slots.into(),
            1,
            MAX_HOT_SLOTS.into(),
        )?;
        let slots = mul(
            OP,
            "slot_host_rows",
            self.num_requests.into(),
            self.hot_slots.into(),
        )?;
        need(
            OP,
            "slot_host_rows",
            slot_host_rows.byte_len(),
            slots,
            I32_BYTES,
        )?;
        need(OP, "lru", lru.byte_len(), slots, U16_BYTES)?;
        for (i, &r) in rows.iter().enumerate() {
            if r >= self.num_requests {
                return Err(OpError::ElementOutOfRange {
                    op: OP,
                    list: "rows",
                    index: i,
                    field: "row",
                    value: r.into(),
                    limit: self.num_requests.into(),
                });
            }
        }
        Ok(())
    }
}

/// Reference hot-state reset: for every listed state row `r`, `slot_host_rows[r][..] = -1` and
/// `lru[r][s] = s`.
pub fn reset_hot_state(
    desc: &HotResetDesc,
    rows: &[u32],
    slot_host_rows: &mut [i32],
    lru: &mut [u16],
) -> Result<(), OpError> {
    desc.check(rows, slot_host_rows, lru)?;
    let n = desc.hot_slots as usize;
    for &r in rows {
        let r = r as usize;
        slot_host_rows[r * n..(r + 1) * n].fill(-1);
        for (s, v) in lru[r * n..(r + 1) * n].iter_mut().enumerate() {
            *v = s as u16;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_at_their_indices_only() {
        let mut t = [7i32; 6];
        let w = [
            TableWrite {
                index: 0,
                value: -1,
            },
            TableWrite { index: 4, value: 9 },
        ];
        write_table(&TableWriteDesc { table_len: 6 }, &w, &mut t).unwrap();
        assert_eq!(t, [-1, 7, 7, 7, 9, 7]);
    }

    #[test]
    fn empty_write_list_is_a_no_op() {
        let mut t = [3i32; 2];
        write_table(&TableWriteDesc { table_len: 2 }, &[], &mut t).unwrap();
        assert_eq!(t, [3, 3]);
    }

    #[test]
    fn duplicate_or_unsorted_indices_are_refused() {
        let mut t = [0i32; 4];
        let d = TableWriteDesc { table_len: 4 };
        for w in [
            [
                TableWrite { index: 1, value: 1 },
                TableWrite { index: 1, value: 2 },
            ],
            [
                TableWrite { index: 2, value: 1 },
                TableWrite { index: 1, value: 2 },
            ],
        ] {
            assert!(matches!(
                write_table(&d, &w, &mut t),
                Err(OpError::NotIncreasing { index: 1, .. })
            ));
        }
        assert_eq!(t, [0; 4], "a refused call writes nothing");
    }

    #[test]
    fn out_of_range_index_and_short_table_are_refused() {
        let mut t = [0i32; 4];
        let w = [TableWrite { index: 4, value: 1 }];
        assert!(matches!(
            write_table(&TableWriteDesc { table_len: 4 }, &w, &mut t),
            Err(OpError::ElementOutOfRange { value: 4, .. })
        ));
        assert!(matches!(
            write_table(&TableWriteDesc { table_len: 5 }, &[], &mut t),
            Err(OpError::BufferTooSmall {
                buffer: "table",
                ..
            })
        ));
    }

    #[test]
    fn reset_restores_identity_lru_and_empty_slots_of_listed_rows() {
        let d = HotResetDesc {
            num_requests: 3,
            hot_slots: 3,
        };
        let mut slot_host_rows = [5i32; 9];
        let mut lru = [2u16, 0, 1, 2, 1, 0, 1, 2, 0];
        reset_hot_state(&d, &[2, 0, 2], &mut slot_host_rows, &mut lru).unwrap();
        assert_eq!(slot_host_rows, [-1, -1, -1, 5, 5, 5, -1, -1, -1]);
        assert_eq!(lru, [0, 1, 2, 2, 1, 0, 0, 1, 2]);
        assert!(matches!(
            reset_hot_state(&d, &[3], &mut slot_host_rows, &mut lru),
            Err(OpError::ElementOutOfRange { list: "rows", .. })
        ));
    }
}
