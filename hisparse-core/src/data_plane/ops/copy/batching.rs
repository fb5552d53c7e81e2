//! When copies may run in parallel: the copy-conflict rule shared by the GPU backends
//! ([`copy_batches`]).

/// A byte range `[start, start + len)` of one buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// Bytes (0: the range is empty and conflicts with nothing).
    pub len: u64,
}

impl ByteRange {
    /// `[start, start + len)`.
    pub const fn new(start: u64, len: u64) -> Self {
        ByteRange { start, len }
    }

    /// One past the last byte (saturating).
    pub const fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

/// What one tile of a copy reads and writes: a page, a row span, a buffer region. Up to two
/// parts each (a split row's value part and scale part); empty parts are ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CopyFootprint {
    /// Bytes the tile reads.
    pub src: [ByteRange; 2],
    /// Bytes the tile writes (the same number of bytes as it reads, part for part).
    pub dst: [ByteRange; 2],
}

impl CopyFootprint {
    /// A contiguous copy of `len` bytes from `src` to `dst`.
    pub const fn contiguous(src: u64, dst: u64, len: u64) -> Self {
        let none = ByteRange::new(0, 0);
        CopyFootprint {
            src: [ByteRange::new(src, len), none],
            dst: [ByteRange::new(dst, len), none],
        }
    }
}

/// Disjoint, merged half-open byte intervals.
#[cfg(feature = "alloc")]
#[derive(Debug, Default)]
struct Intervals(alloc::collections::BTreeMap<u64, u64>);

#[cfg(feature = "alloc")]
impl Intervals {
    fn overlaps(&self, r: &ByteRange) -> bool {
        r.len > 0
            && self
                .0
                .range(..r.end())
                .next_back()
                .is_some_and(|(_, &e)| e > r.start)
    }

    fn insert(&mut self, r: &ByteRange) {
        if r.len == 0 {
            return;
        }
        let (mut start, mut end) = (r.start, r.end());
        while let Some((&s, &e)) = self.0.range(..=end).next_back() {
            if e < start {
                break;
            }
            start = start.min(s);
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }
}

/// The copy-conflict rule: splits copy tiles, listed in the order the reference applies them,
/// into consecutive batches that may each run as *one* parallel launch (tiles of a batch in any
/// order, or at once) and still give the reference's sequential result, when the batches run one
/// after another (stream order).
///
/// A tile joins the current batch unless it writes bytes a tile of the batch writes, or — when
/// source and destination are the same buffer (`same_buffer`) — it writes bytes a tile of the
/// batch reads, or reads bytes one writes. A tile whose own source and destination overlap
/// without being equal has no parallel execution at all; the caller splits it first (memmove
/// order), as no backend's copy tiles can (pages and rows of one layout are equal or disjoint).
///
/// Returns the batches as index ranges into `tiles`, in order; one range covering every tile is
/// the common case (no conflicts), none for an empty list. Time `O(n log n)` for `n` ranges.
#[cfg(feature = "alloc")]
pub fn copy_batches(
    tiles: &[CopyFootprint],
    same_buffer: bool,
) -> alloc::vec::Vec<core::ops::Range<usize>> {
    let mut batches = alloc::vec::Vec::new();
    let (mut srcs, mut dsts) = (Intervals::default(), Intervals::default());
    let mut first = 0;
    for (i, t) in tiles.iter().enumerate() {
        let conflict = t.dst.iter().any(|d| dsts.overlaps(d))
            || (same_buffer
                && (t.dst.iter().any(|d| srcs.overlaps(d))
                    || t.src.iter().any(|s| dsts.overlaps(s))));
        if conflict {
            batches.push(first..i);
            first = i;
            srcs = Intervals::default();
            dsts = Intervals::default();
        }
        for r in &t.src {
            srcs.insert(r);
        }
        for r in &t.dst {
            dsts.insert(r);
        }
    }
    if first < tiles.len() {
        batches.push(first..tiles.len());
    }
    batches
}

#[cfg(all(test, feature = "alloc"))]
#[path = "batching_tests.rs"]
mod tests;
