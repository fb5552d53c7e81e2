//! The two hashes of the wire format, written here so the core needs no dependency: CRC-32C
//! (the message checksum) and FNV-1a-64 (the layout fingerprint).

/// The reflected CRC-32C (Castagnoli) polynomial.
const CRC32C_POLY: u32 = 0x82F6_3B78;

/// Slice-by-16 tables: `CRC32C_TABLES[0]` is the classic byte table; `CRC32C_TABLES[k][b]` is
/// the CRC of byte `b` followed by `k` zero bytes, so sixteen input bytes fold in with sixteen
/// independent lookups (a short dependency chain per 16 bytes instead of one per byte).
static CRC32C_TABLES: [[u32; 256]; 16] = crc32c_tables();

const fn crc32c_tables() -> [[u32; 256]; 16] {
    let mut t = [[0u32; 256]; 16];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ CRC32C_POLY
            } else {
                c >> 1
            };
            bit += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut k = 1;
        while k < 16 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            k += 1;
        }
        i += 1;
    }
    t
}

/// CRC-32C (Castagnoli; reflected, initial value and final XOR `0xFFFF_FFFF`) of `bytes`: the
/// checksum of iSCSI, ext4 and SCTP. It detects every error of up to 3 bits and every burst of up
/// to 32 bits in messages of this size.
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    let t = &CRC32C_TABLES;
    // Byte `j` of a little-endian word `w`, as a table index.
    let at = |w: u32, j: u32| ((w >> (8 * j)) & 0xff) as usize;
    let mut crc = !0u32;
    let mut blocks = bytes.chunks_exact(16);
    for b in &mut blocks {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (w0, w1, w2, w3) = (word(0) ^ crc, word(4), word(8), word(12));
        crc = (t[15][at(w0, 0)] ^ t[14][at(w0, 1)] ^ t[13][at(w0, 2)] ^ t[12][at(w0, 3)])
            ^ (t[11][at(w1, 0)] ^ t[10][at(w1, 1)] ^ t[9][at(w1, 2)] ^ t[8][at(w1, 3)])
            ^ (t[7][at(w2, 0)] ^ t[6][at(w2, 1)] ^ t[5][at(w2, 2)] ^ t[4][at(w2, 3)])
            ^ (t[3][at(w3, 0)] ^ t[2][at(w3, 1)] ^ t[1][at(w3, 2)] ^ t[0][at(w3, 3)]);
    }
    for &b in blocks.remainder() {
        crc = (crc >> 8) ^ t[0][at(crc ^ u32::from(b), 0)];
    }
    !crc
}

/// FNV-1a, 64-bit: a stable byte hash (the same on every platform and every build).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv1a64(u64);

impl Fnv1a64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// The empty hash.
    pub(crate) const fn new() -> Self {
        Fnv1a64(Self::OFFSET_BASIS)
    }

    /// Feeds `bytes`.
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    /// Feeds `value` as 8 little-endian bytes.
    pub(crate) fn write_u64(&mut self, value: u64) {
        self.write(&value.to_le_bytes());
    }

    /// The hash of everything fed.
    pub(crate) const fn finish(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit-at-a-time definition the slice-by-16 loop must equal.
    fn crc32c_bytewise(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ CRC32C_POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc32c_matches_published_check_values() {
        // The standard check value of CRC-32C, and RFC 3720 (iSCSI) B.4's 32-byte vectors.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: alloc::vec::Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        assert_eq!(crc32c(&[]), 0);
    }

    #[test]
    fn slice_by_16_equals_the_bitwise_definition_at_every_length_and_offset() {
        let data: alloc::vec::Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..17 {
            for end in start..data.len() {
                assert_eq!(
                    crc32c(&data[start..end]),
                    crc32c_bytewise(&data[start..end])
                );
            }
        }
    }

    #[test]
    fn fnv1a64_matches_published_test_vectors() {
        let hash = |s: &[u8]| {
            let mut h = Fnv1a64::new();
            h.write(s);
            h.finish()
        };
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
