//! Hot-entry invalidation (contract §5.4).
//!
//! After host rows are rewritten, or host blocks are recycled to another owner, any hot slot that
//! caches one of those rows holds stale bytes. `invalidate` sets every `slot_host_rows[r][slot]` whose value
//! lies in one of the half-open ranges `[start, end)` to `-1`, for every state row `r`. Ranges with
//! `start >= end` match nothing. LRU orders are left unchanged: an invalidated slot simply stops
//! being a hit and becomes evictable in its current position.

use super::{BufferLen, I32_BYTES, MAX_HOT_SLOTS, in_range, mul, need, nonzero};
use crate::error::{OpError, OpName};

const OP: OpName = OpName::Invalidate;

/// Shape of one invalidate call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InvalidateDesc {
    /// State rows `R`.
    pub num_requests: u32,
    /// Hot slots per request `N`.
    pub hot_slots: u32,
    /// Ranges in `ranges` (0 is a no-op).
    pub num_ranges: u32,
}

/// Buffers of an invalidate call.
#[derive(Debug)]
pub struct InvalidateArgs<'a, B: ?Sized> {
    /// `i32[num_ranges][2]` half-open flat host row ranges `[start, end)`.
    pub ranges: &'a B,
    /// `i32[R][N]` hot-slot contents. Updated.
    pub slot_host_rows: &'a mut B,
}

impl InvalidateDesc {
    /// Checks the descriptor and buffer sizes.
    pub fn check<B: BufferLen + ?Sized>(&self, a: &InvalidateArgs<'_, B>) -> Result<(), OpError> {
        nonzero(OP, "num_requests", self.num_requests.into())?;
        in_range(
            OP,
            "hot_slots",
            self.hot_slots.into(),
            1,
            MAX_HOT_SLOTS.into(),
        )?;
        let ranges = mul(OP, "ranges", self.num_ranges.into(), 2)?;
        need(OP, "ranges", a.ranges.byte_len(), ranges, I32_BYTES)?;
        let slots = mul(
            OP,
            "slot_host_rows",
            self.num_requests.into(),
            self.hot_slots.into(),
        )?;
        need(
            OP,
            "slot_host_rows",
            a.slot_host_rows.byte_len(),
            slots,
            I32_BYTES,
        )
    }
}

/// Reference invalidation over plain slices.
pub fn invalidate(desc: &InvalidateDesc, a: InvalidateArgs<'_, [i32]>) -> Result<(), OpError> {
    desc.check(&a)?;
    let n = desc.num_requests as usize * desc.hot_slots as usize;
    let ranges = &a.ranges[..desc.num_ranges as usize * 2];
    for d in &mut a.slot_host_rows[..n] {
        if ranges.chunks_exact(2).any(|r| r[0] <= *d && *d < r[1]) {
            *d = -1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_only_rows_inside_ranges() {
        let d = InvalidateDesc {
            num_requests: 2,
            hot_slots: 3,
            num_ranges: 2,
        };
        let mut slot_host_rows = [5, 10, -1, 64, 127, 128];
        invalidate(
            &d,
            InvalidateArgs {
                ranges: &[64, 128, 10, 10],
                slot_host_rows: &mut slot_host_rows,
            },
        )
        .unwrap();
        assert_eq!(slot_host_rows, [5, 10, -1, -1, -1, 128]);
    }

    #[test]
    fn rejects_short_range_buffer() {
        let d = InvalidateDesc {
            num_requests: 1,
            hot_slots: 1,
            num_ranges: 2,
        };
        let err = invalidate(
            &d,
            InvalidateArgs {
                ranges: &[0, 1, 2],
                slot_host_rows: &mut [0],
            },
        );
        assert!(matches!(
            err,
            Err(OpError::BufferTooSmall {
                buffer: "ranges",
                ..
            })
        ));
    }
}
