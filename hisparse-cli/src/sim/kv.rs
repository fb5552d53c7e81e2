//! Synthetic KV rows: deterministic bytes from (request, layer, position).
//!
//! The simulation writes these rows into the device pool during prefill and decode, the offload
//! commands mirror and back them up to the host pool, and every row attention would read is
//! compared byte for byte against the bytes this module regenerates. A row is a sequence of 64-bit
//! words, each a cheap hash of the row seed and the word index, so a row read from the wrong
//! request, layer, position, page or half of a split page differs in practically every word.

/// The seed of one row. `request` is the simulation's unique request id (never reused).
#[inline]
pub fn row_seed(request: u64, layer: u32, pos: u32) -> u64 {
    mix(request
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(layer).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        .wrapping_add(u64::from(pos).wrapping_mul(0x1656_67B1_9E37_79F9)))
}

/// The seed of the row a *rejected* speculative token writes at the place of the row with seed
/// `seed`: different bytes, so a row read after its rollback and before the token that replaces
/// it is computed would not match.
#[inline]
pub fn rejected_seed(seed: u64) -> u64 {
    mix(seed ^ 0xD6E8_FEB8_6659_FD93)
}

#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Word `i` of the row with seed `seed`.
#[inline]
fn word(seed: u64, i: usize) -> u64 {
    let x = seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (x >> 32)
}

/// Writes the bytes `[first_byte, first_byte + out.len())` of the row with seed `seed`.
/// `first_byte` and `out.len()` must be multiples of 8 (rows and split parts are multiples of 16).
pub fn fill(seed: u64, first_byte: usize, out: &mut [u8]) {
    debug_assert!(first_byte.is_multiple_of(8) && out.len().is_multiple_of(8));
    let w0 = first_byte / 8;
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(seed, w0 + i).to_le_bytes());
    }
}

/// Whether `bytes` equal bytes `[first_byte, first_byte + bytes.len())` of the row with seed
/// `seed`.
pub fn matches(seed: u64, first_byte: usize, bytes: &[u8]) -> bool {
    if !first_byte.is_multiple_of(8) || !bytes.len().is_multiple_of(8) {
        return false;
    }
    let w0 = first_byte / 8;
    let mut diff = 0u64;
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        diff |= u64::from_le_bytes(b) ^ word(seed, w0 + i);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_and_distinct() {
        let mut a = [0u8; 656];
        let mut b = [0u8; 656];
        fill(row_seed(1, 2, 3), 0, &mut a);
        fill(row_seed(1, 2, 3), 0, &mut b);
        assert_eq!(a, b);
        assert!(matches(row_seed(1, 2, 3), 0, &a));
        for other in [row_seed(2, 2, 3), row_seed(1, 3, 3), row_seed(1, 2, 4)] {
            fill(other, 0, &mut b);
            assert_ne!(a, b);
            assert!(!matches(other, 0, &a));
        }
    }

    #[test]
    fn parts_match_their_offsets_only() {
        let seed = row_seed(7, 0, 100);
        let mut row = [0u8; 656];
        fill(seed, 0, &mut row);
        let mut tail = [0u8; 144];
        fill(seed, 512, &mut tail);
        assert_eq!(tail[..], row[512..]);
        assert!(matches(seed, 512, &row[512..]));
        assert!(!matches(seed, 0, &row[512..]));
        let mut flipped = row;
        flipped[300] ^= 1;
        assert!(!matches(seed, 0, &flipped));
        assert!(!matches(seed, 0, &[0u8; 656]));
    }
}
