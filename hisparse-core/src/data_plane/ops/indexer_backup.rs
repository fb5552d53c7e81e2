//! Indexer backup (DeepSeek V4): the indexer rows a step writes, copied device → host into the
//! indexer's host cache, by the compressed slot mapping of both caches.
//!
//! DeepSeek V4 backs its (compressed, ratio-4) indexer cache up to host as well as the KV. Per
//! token row `t`, `device_slots[t]` and `host_slots[t]` are the token's compressed slots in the
//! device indexer cache and in its host cache — what [`super::slot_mapping`] gives for the
//! device and the host block tables (`-1` for a token that writes no compressed row). For
//! every layer, the row at flat device row `device_slots[t]` is copied to flat host row
//! `host_slots[t]` (value and scale parts of split rows alike); a slot that is `-1`, beyond its
//! pool, or in another layer's part of a block skips the token. Host slots must be distinct
//! (the slot mapping gives each compressed row its own); when they are not, which row lands is
//! unspecified. Everything lives in device buffers, so the call needs no host synchronisation.
//!
//! Indexer rows have no 16-byte rule ([`RowUnit::Words`]): every row part need only be a
//! multiple of 4 bytes — DeepSeek V3.2's contiguous 132-byte rows (128 fp8 values and a 4-byte
//! scale) as well as DeepSeek V4's split 128 + 4 — while pages sit on 16-byte boundaries like
//! every page ([`super::PageLayout::check_placement`]). Backends move rows whose parts are all
//! multiples of 16 in 16-byte chunks and the others in 4-byte words.

use super::copy::{LayerPair, RowUnit, check_layer_rows, copy_row};
use super::{BufferLen, I32_BYTES, need};
use crate::error::{OpError, OpName};

const OP: OpName = OpName::IndexerBackup;

/// Shape of an indexer backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexerBackupDesc<'a> {
    /// Token rows `T` (0 is an empty batch).
    pub num_tokens: u32,
    /// The indexer layers: device layout (GPU pool) and host layout (indexer host cache) each
    /// (`KvCacheConfig::indexer_layer_pair`).
    pub layers: &'a [LayerPair],
}

/// Buffers of an indexer backup. `B` holds the slots, `D` is the device pool, `H` the host
/// cache.
#[derive(Debug)]
pub struct IndexerBackupArgs<'a, B: ?Sized, H: ?Sized, D: ?Sized = B> {
    /// `i32[T]` compressed slot of each token in the device indexer cache.
    pub device_slots: &'a B,
    /// `i32[T]` compressed slot of each token in the indexer host cache.
    pub host_slots: &'a B,
    /// The device pool (read).
    pub device: &'a D,
    /// The indexer host cache (written).
    pub host: &'a mut H,
}

impl IndexerBackupDesc<'_> {
    /// Checks the layers against both buffers and the slot buffers' sizes.
    pub fn check<B: BufferLen + ?Sized, H: BufferLen + ?Sized, D: BufferLen + ?Sized>(
        &self,
        a: &IndexerBackupArgs<'_, B, H, D>,
    ) -> Result<(), OpError> {
        let t = u64::from(self.num_tokens);
        need(OP, "device_slots", a.device_slots.byte_len(), t, I32_BYTES)?;
        need(OP, "host_slots", a.host_slots.byte_len(), t, I32_BYTES)?;
        check_layer_rows(
            OP,
            self.layers,
            a.host.byte_len(),
            a.device.byte_len(),
            RowUnit::Words,
        )
    }
}

/// Reference indexer backup over plain slices. Checks shapes first; writes nothing on error.
pub fn indexer_backup(
    desc: &IndexerBackupDesc<'_>,
    a: IndexerBackupArgs<'_, [i32], [u8], [u8]>,
) -> Result<(), OpError> {
    desc.check(&a)?;
    for l in desc.layers {
        for t in 0..desc.num_tokens as usize {
            let (Some(src), Some(dst)) = (
                l.device.locate(a.device_slots[t].into()),
                l.host.locate(a.host_slots[t].into()),
            ) else {
                continue;
            };
            copy_row(&l.device, Some(src), a.device, &l.host, dst, a.host);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::PageLayout;

    /// Split 132-B indexer rows (128 values + 4 scale bytes), 2 rows per page, pages padded to
    /// 576 B; device blocks of 1152 B with the indexer at offset 576.
    fn layer() -> LayerPair {
        let rows = |base, block_stride, num_blocks| PageLayout {
            base,
            block_stride,
            num_blocks,
            block_size: 2,
            row_bytes: 132,
            value_bytes: 128,
            index_stride_rows: 2,
        };
        LayerPair {
            host: rows(0, 576, 4),
            device: rows(576, 1152, 3),
        }
    }

    /// DeepSeek V3.2's indexer rows are contiguous 132-byte rows (128 fp8 values and a 4-byte
    /// scale): not a multiple of 16, and copied like any other (a KV copy would refuse them).
    #[test]
    fn indexer_backup_copies_contiguous_132_byte_rows() {
        // 3 rows per page (396 bytes, padded to 400); device blocks of 800 bytes with the
        // indexer at offset 400.
        let rows = |base, block_stride, num_blocks| PageLayout {
            base,
            block_stride,
            num_blocks,
            block_size: 3,
            row_bytes: 132,
            value_bytes: 132,
            index_stride_rows: 3,
        };
        let l = LayerPair {
            host: rows(0, 400, 4),
            device: rows(400, 800, 3),
        };
        let device: std::vec::Vec<u8> = (0..3 * 800).map(|i| (i % 253) as u8 + 1).collect();
        let mut host = std::vec![0u8; 4 * 400];
        indexer_backup(
            &IndexerBackupDesc {
                num_tokens: 3,
                layers: &[l],
            },
            IndexerBackupArgs {
                device_slots: &[4, 8, -1],
                host_slots: &[11, 0, 2],
                device: &device,
                host: &mut host,
            },
        )
        .unwrap();
        // Device row 4 (block 1, row 1) → host row 11 (block 3, row 2); device row 8 (block 2,
        // row 2) → host row 0.
        assert_eq!(host[1200 + 264..1200 + 396], device[1200 + 132..1200 + 264]);
        assert_eq!(host[..132], device[2000 + 264..2000 + 396]);
        assert_eq!(host.iter().filter(|&&b| b != 0).count(), 2 * 132);
        // The same layout is a misaligned KV layout: the 16-byte rule is the KV copies' only.
        assert!(matches!(
            l.host.check(OP, "host", host.len() as u64),
            Err(OpError::Misaligned {
                field: "layout.value_bytes",
                ..
            })
        ));
        // Rows that are not 4-byte words are refused, naming the field.
        let odd = |p: PageLayout| PageLayout {
            row_bytes: 130,
            value_bytes: 130,
            ..p
        };
        let e = indexer_backup(
            &IndexerBackupDesc {
                num_tokens: 1,
                layers: &[LayerPair {
                    host: odd(l.host),
                    device: odd(l.device),
                }],
            },
            IndexerBackupArgs {
                device_slots: &[0],
                host_slots: &[0],
                device: &device,
                host: &mut host,
            },
        );
        assert!(matches!(
            e,
            Err(OpError::Misaligned {
                field: "layout.value_bytes",
                alignment: 4,
                ..
            })
        ));
    }

    #[test]
    fn copies_split_rows_by_slot_and_skips_the_rest() {
        let l = layer();
        let mut device = std::vec![0u8; 3 * 1152];
        for (i, b) in device.iter_mut().enumerate() {
            *b = (i % 251) as u8 + 1;
        }
        let mut host = std::vec![0u8; 4 * 576];
        // Token 0: device row 3 (block 1, row 1) → host row 4 (block 2, row 0); token 1: no
        // compressed row; token 2: host slot beyond the cache; token 3: device row 0 → host 7.
        indexer_backup(
            &IndexerBackupDesc {
                num_tokens: 4,
                layers: &[l],
            },
            IndexerBackupArgs {
                device_slots: &[3, -1, 1, 0],
                host_slots: &[4, 5, 8, 7],
                device: &device,
                host: &mut host,
            },
        )
        .unwrap();
        let [(dv, _), (ds, _)] = l.device.row_parts(1, 1);
        let [(hv, _), (hs, _)] = l.host.row_parts(2, 0);
        assert_eq!(
            host[hv as usize..hv as usize + 128],
            device[dv as usize..dv as usize + 128]
        );
        assert_eq!(
            host[hs as usize..hs as usize + 4],
            device[ds as usize..ds as usize + 4]
        );
        let [(dv, _), _] = l.device.row_parts(0, 0);
        let [(hv, _), _] = l.host.row_parts(3, 1);
        assert_eq!(
            host[hv as usize..hv as usize + 128],
            device[dv as usize..dv as usize + 128]
        );
        // Host row 5 (token 1) untouched; 2 rows written in all.
        let written = host.iter().filter(|&&b| b != 0).count();
        assert_eq!(written, 2 * 132);
        // Short slot buffers are refused before anything is written.
        let e = indexer_backup(
            &IndexerBackupDesc {
                num_tokens: 5,
                layers: &[l],
            },
            IndexerBackupArgs {
                device_slots: &[0; 4],
                host_slots: &[0; 5],
                device: &device,
                host: &mut host,
            },
        );
        assert!(matches!(
            e,
            Err(OpError::BufferTooSmall {
                buffer: "device_slots",
                ..
            })
        ));
    }
}
