//! Compressed slot mapping (contract §5.5), for compress-ratio-`R` layers (DeepSeek V4 C4A: `R = 4`).
//!
//! A token at position `p` writes a compressed row only when `(p + 1) % R == 0` and its own slot
//! (`slot_mapping[t]`) is not negative. Its compressed index is `c = p / R`; with
//! `Bc = block_size / R` compressed rows per block, its slot is
//! `block_table[row][c / Bc] * Bc + c % Bc`. Every other token — negative position, negative slot,
//! block-table row out of range, `c / Bc ≥ max_blocks`, negative block, or a slot that does not fit
//! an `i32` — gets `-1`.

use super::{BufferLen, I32_BYTES, aligned, in_range, mul, need, nonzero, physical_row};
use crate::error::{OpError, OpName};

const OP: OpName = OpName::CompressedSlotMapping;

/// Shape of one compressed-slot-mapping call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotMappingDesc {
    /// Tokens `T`.
    pub num_tokens: u32,
    /// Compress ratio `R` (≥ 1).
    pub ratio: u32,
    /// Uncompressed tokens per block (a multiple of `ratio`).
    pub block_size: u32,
    /// Rows of the block table.
    pub table_rows: u32,
    /// Columns of the block table.
    pub max_blocks: u32,
}

/// Buffers of a compressed-slot-mapping call.
#[derive(Debug)]
pub struct SlotMappingArgs<'a, B: ?Sized> {
    /// `i32[T]` token positions.
    pub positions: &'a B,
    /// `i32[T]` the tokens' own (uncompressed) slots; negative = padding.
    pub slot_mapping: &'a B,
    /// `i32[T]` block-table row of each token.
    pub table_row: &'a B,
    /// `i32[table_rows][max_blocks]` compressed-group block ids.
    pub block_table: &'a B,
    /// `i32[T]` output compressed slots.
    pub out: &'a mut B,
}

impl SlotMappingDesc {
    /// Compressed rows per block, `block_size / ratio`; 0 when `ratio` is 0 (which
    /// [`SlotMappingDesc::check`] refuses).
    pub const fn compressed_block_size(&self) -> u32 {
        match self.block_size.checked_div(self.ratio) {
            Some(rows) => rows,
            None => 0,
        }
    }

    /// Checks the descriptor and buffer sizes.
    pub fn check<B: BufferLen + ?Sized>(&self, a: &SlotMappingArgs<'_, B>) -> Result<(), OpError> {
        nonzero(OP, "ratio", self.ratio.into())?;
        nonzero(OP, "table_rows", self.table_rows.into())?;
        nonzero(OP, "max_blocks", self.max_blocks.into())?;
        in_range(
            OP,
            "block_size",
            self.block_size.into(),
            self.ratio.into(),
            i32::MAX as u64,
        )?;
        aligned(OP, "block_size", self.block_size.into(), self.ratio.into())?;
        let t = u64::from(self.num_tokens);
        for (name, len) in [
            ("positions", a.positions.byte_len()),
            ("slot_mapping", a.slot_mapping.byte_len()),
            ("table_row", a.table_row.byte_len()),
            ("out", a.out.byte_len()),
        ] {
            need(OP, name, len, t, I32_BYTES)?;
        }
        let table = mul(
            OP,
            "block_table",
            self.table_rows.into(),
            self.max_blocks.into(),
        )?;
        need(
            OP,
            "block_table",
            a.block_table.byte_len(),
            table,
            I32_BYTES,
        )
    }

    /// The compressed slot of one token (see the module docs); `-1` as well for a descriptor
    /// [`SlotMappingDesc::check`] refuses (zero ratio, fewer rows per block than the ratio) and
    /// an entry beyond `block_table`.
    #[inline]
    pub fn map(&self, block_table: &[i32], position: i32, slot: i32, row: i32) -> i32 {
        let ratio = self.ratio as i64;
        if ratio == 0 || self.compressed_block_size() == 0 {
            return -1;
        }
        if slot < 0 || position < 0 || (position as i64 + 1) % ratio != 0 {
            return -1;
        }
        let Ok(row) = usize::try_from(row) else {
            return -1;
        };
        if row >= self.table_rows as usize {
            return -1;
        }
        let bc = self.compressed_block_size() as i64;
        let c = position as i64 / ratio;
        let col = c / bc;
        if col >= i64::from(self.max_blocks) {
            return -1;
        }
        let Some(&block) = block_table.get(row * self.max_blocks as usize + col as usize) else {
            return -1;
        };
        physical_row(block, bc as u32, (c % bc) as u32)
    }
}

/// Reference compressed slot mapping over plain slices.
pub fn compressed_slot_mapping(
    desc: &SlotMappingDesc,
    a: SlotMappingArgs<'_, [i32]>,
) -> Result<(), OpError> {
    desc.check(&a)?;
    for t in 0..desc.num_tokens as usize {
        a.out[t] = desc.map(
            a.block_table,
            a.positions[t],
            a.slot_mapping[t],
            a.table_row[t],
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_ratio_th_token_at_block_boundaries() {
        // block 256 tokens, ratio 4 -> 64 compressed rows per block.
        let d = SlotMappingDesc {
            num_tokens: 6,
            ratio: 4,
            block_size: 256,
            table_rows: 1,
            max_blocks: 2,
        };
        let positions = [3, 4, 255, 259, 511, 515];
        let slots = [0, 1, 2, 3, -1, 5];
        let mut out = [0; 6];
        compressed_slot_mapping(
            &d,
            SlotMappingArgs {
                positions: &positions,
                slot_mapping: &slots,
                table_row: &[0; 6],
                block_table: &[7, 9],
                out: &mut out,
            },
        )
        .unwrap();
        // p=3 -> c=0 -> 7*64; p=4 not a boundary; p=255 -> c=63 -> 7*64+63; p=259 -> c=64 -> 9*64;
        // p=511 has slot -1; p=515 -> c=128 -> block col 2 out of range.
        assert_eq!(out, [448, -1, 511, 576, -1, -1]);
    }

    #[test]
    fn rejects_block_size_not_multiple_of_ratio() {
        let d = SlotMappingDesc {
            num_tokens: 0,
            ratio: 3,
            block_size: 64,
            table_rows: 1,
            max_blocks: 1,
        };
        let mut out = [0i32; 0];
        let a = SlotMappingArgs {
            positions: &[][..],
            slot_mapping: &[],
            table_row: &[],
            block_table: &[0],
            out: &mut out[..],
        };
        assert!(matches!(
            d.check(&a),
            Err(OpError::Misaligned {
                field: "block_size",
                ..
            })
        ));
    }
}
