//! Decode-path counters kept on the device: the optional `stats` accumulator of
//! [`super::resolve`] ([`super::ResolveArgs::stats`]) and [`super::remap`]
//! ([`super::RemapArgs::stats`]).
//!
//! An engine that replays its per-layer decode calls in a graph (CUDA graphs) never sees those
//! calls on the host, so the metrics it exports (hot hits and misses, resolve calls, rows read)
//! must be counted where the calls run. A stats buffer is `u32[4 * n]`: `n` *slots* of
//! [`STATS_SLOT_WORDS`] words, in native byte order. A call given a stats buffer adds, with
//! wrapping `u32` arithmetic, into the four words of its descriptor's `stats_slot`:
//!
//! | word | resolve adds | remap adds |
//! |---|---|---|
//! | [`STATS_HITS`] | `Σ_t hit_counts[t]` | 0 |
//! | [`STATS_MISSES`] | `Σ_t miss_counts[t]` | 0 |
//! | [`STATS_VALID`] | `Σ_t valid_counts[t]` | the valid entries of every row (counted whether or not `write_counts` is set) |
//! | [`STATS_CALLS`] | 1 | 1 |
//!
//! Padding rows add 0; a call of 0 token rows still adds 1 to [`STATS_CALLS`]. The sums run over
//! the call's `num_tokens` rows only. Without a stats buffer (`None`) the call changes nothing
//! more and the descriptor's `stats_slot` is not read. The buffer must hold the slot
//! (`16 * (stats_slot + 1)` bytes), checked with every other buffer before anything is written.
//!
//! Several calls may share one buffer at different slots (one per layer, say) or the same slot;
//! the reader folds the words into its own 64-bit counters, taking differences modulo 2³².

use super::need;
use crate::error::{OpError, OpName};

/// Words per stats slot.
pub const STATS_SLOT_WORDS: u32 = 4;
/// Bytes per stats slot (four `u32` words).
pub const STATS_SLOT_BYTES: u64 = 4 * STATS_SLOT_WORDS as u64;
/// Word of a slot counting hot hits (`Σ hit_counts` of every resolve).
pub const STATS_HITS: usize = 0;
/// Word of a slot counting misses (`Σ miss_counts` of every resolve: rows swapped in).
pub const STATS_MISSES: usize = 1;
/// Word of a slot counting valid output entries (rows attention reads).
pub const STATS_VALID: usize = 2;
/// Word of a slot counting calls.
pub const STATS_CALLS: usize = 3;

/// Byte offset of slot `slot` in a stats buffer.
pub const fn slot_offset(slot: u32) -> u64 {
    slot as u64 * STATS_SLOT_BYTES
}

/// Checks an optional stats buffer of `actual` bytes against `slot`: it must hold the slot's
/// four words. `None` (no buffer) passes whatever the slot.
pub(crate) fn check_stats(op: OpName, actual: Option<u64>, slot: u32) -> Result<(), OpError> {
    match actual {
        Some(len) => need(op, "stats", len, u64::from(slot) + 1, STATS_SLOT_BYTES),
        None => Ok(()),
    }
}

/// What one call adds to its stats slot, besides the one call ([`CallStats::words`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CallStats {
    /// Added to [`STATS_HITS`].
    pub hits: u32,
    /// Added to [`STATS_MISSES`].
    pub misses: u32,
    /// Added to [`STATS_VALID`].
    pub valid: u32,
}

/// The wrapping `u32` sum of `counts` (each read as a `u32`, the bits a device adds).
fn wrapping_sum(counts: &[i32]) -> u32 {
    counts
        .iter()
        .fold(0u32, |acc, &c| acc.wrapping_add(c as u32))
}

impl CallStats {
    /// A resolve's: the sums of its per-row hit, miss and valid counts (the slices hold exactly
    /// the call's `num_tokens` rows).
    pub fn of_resolve(hit_counts: &[i32], miss_counts: &[i32], valid_counts: &[i32]) -> Self {
        CallStats {
            hits: wrapping_sum(hit_counts),
            misses: wrapping_sum(miss_counts),
            valid: wrapping_sum(valid_counts),
        }
    }

    /// A remap's: its valid entries only.
    pub const fn of_remap(valid: u32) -> Self {
        CallStats {
            hits: 0,
            misses: 0,
            valid,
        }
    }

    /// The four words the call adds, in slot order (the last is the call itself).
    pub const fn words(self) -> [u32; STATS_SLOT_WORDS as usize] {
        [self.hits, self.misses, self.valid, 1]
    }

    /// Adds the call into slot `slot` of `stats` with wrapping `u32` arithmetic. The reference
    /// holds the words as `i32` (its element type for device buffers; the bits are the same).
    /// `stats` must hold the slot (the operations check that before anything is written).
    pub fn add_to(self, stats: &mut [i32], slot: u32) {
        let at = slot as usize * STATS_SLOT_WORDS as usize;
        for (w, add) in stats[at..at + STATS_SLOT_WORDS as usize]
            .iter_mut()
            .zip(self.words())
        {
            *w = (*w as u32).wrapping_add(add) as i32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_adds_its_words_wrapping_into_its_slot_only() {
        let mut stats = [0i32; 8];
        stats[4] = u32::MAX as i32; // hits of slot 1, one below wrapping
        stats[7] = -2; // calls of slot 1: 0xffff_fffe
        CallStats::of_resolve(&[1, 2], &[3, 0], &[5, 6]).add_to(&mut stats, 1);
        assert_eq!(stats[..4], [0; 4]);
        assert_eq!(stats[4..], [2, 3, 11, -1]);
        CallStats::of_remap(7).add_to(&mut stats, 1);
        assert_eq!(stats[4..], [2, 3, 18, 0]);
    }

    #[test]
    fn sums_wrap_like_the_devices_u32_atomics() {
        let c = CallStats::of_resolve(&[i32::MAX, i32::MAX, 3], &[], &[-1, 1]);
        assert_eq!((c.hits, c.misses, c.valid), (1, 0, 0));
    }

    #[test]
    fn the_buffer_must_hold_the_slot() {
        assert!(check_stats(OpName::Resolve, None, u32::MAX).is_ok());
        assert!(check_stats(OpName::Resolve, Some(32), 1).is_ok());
        let e = check_stats(OpName::Remap, Some(31), 1).unwrap_err();
        assert!(matches!(
            e,
            OpError::BufferTooSmall {
                buffer: "stats",
                needed: 32,
                actual: 31,
                ..
            }
        ));
        // The largest slot needs 2^36 bytes: no overflow.
        let e = check_stats(OpName::Remap, Some(0), u32::MAX).unwrap_err();
        assert!(matches!(e, OpError::BufferTooSmall { needed, .. } if needed == 1 << 36));
        assert_eq!(slot_offset(3), 48);
    }
}
