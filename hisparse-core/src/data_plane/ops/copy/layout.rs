//! Where a layer's pages sit in a pool and how rows sit inside a page: [`PageLayout`], the
//! pair of layouts one layer has in the two pools ([`LayerPair`]) and the checks of a list of
//! them.

use super::COPY_ALIGNMENT;
use crate::error::{OpError, OpName};
use crate::ops::{aligned, mul, nonzero};

/// Where one layer's pages sit in a pool buffer, and how rows sit inside a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PageLayout {
    /// Byte offset of block 0's page of this layer in the buffer.
    pub base: u64,
    /// Bytes between the pages of consecutive blocks (≥ the page size).
    pub block_stride: u64,
    /// Blocks in the pool.
    pub num_blocks: u32,
    /// Rows per page.
    pub block_size: u32,
    /// Bytes per row: a multiple of 16 for contiguous rows; for split rows the value part is a
    /// multiple of 16 and the scale part a multiple of 4.
    pub row_bytes: u32,
    /// Value bytes per row: `row_bytes` for contiguous rows, less for split pages (a multiple of
    /// 16). In a split page row `r`'s values sit at `page + r * value_bytes` and its scales at
    /// `page + block_size * value_bytes + r * (row_bytes - value_bytes)`. A page may be padded
    /// (`block_stride` beyond the page): only the rows' bytes are ever copied.
    pub value_bytes: u32,
    /// Divisor that turns a flat row index into `(block, offset)` (≥ `block_size`).
    pub index_stride_rows: u32,
}

impl PageLayout {
    /// A contiguous-row layout with `index_stride_rows = block_size`, as used by the host pool.
    pub const fn contiguous(
        base: u64,
        block_stride: u64,
        num_blocks: u32,
        block_size: u32,
        row_bytes: u32,
    ) -> Self {
        PageLayout {
            base,
            block_stride,
            num_blocks,
            block_size,
            row_bytes,
            value_bytes: row_bytes,
            index_stride_rows: block_size,
        }
    }

    /// Bytes of one page of this layer.
    pub const fn page_bytes(&self) -> u64 {
        self.block_size as u64 * self.row_bytes as u64
    }

    /// Whether rows are split into a value part and a scale part.
    pub const fn is_split(&self) -> bool {
        self.value_bytes != self.row_bytes
    }

    /// Byte offset of `block`'s page, for a layout [`PageLayout::check`] accepted and a block
    /// of it: no bounds check, and never a panic — beyond the address space the answer
    /// saturates at `u64::MAX`. [`PageLayout::checked_page_offset`] says what is wrong instead.
    pub const fn page_offset(&self, block: u32) -> u64 {
        self.base
            .saturating_add((block as u64).saturating_mul(self.block_stride))
    }

    /// The byte ranges `(offset, len)` of row `offset` of `block`: the value part, then the scale
    /// part (length 0 for contiguous rows). For a layout [`PageLayout::check`] accepted and a
    /// row of it: no bounds check, and never a panic — on other layouts the answer saturates
    /// (a scale part of negative size is empty). [`PageLayout::checked_row_parts`] says what is
    /// wrong instead.
    pub const fn row_parts(&self, block: u32, offset: u32) -> [(u64, u64); 2] {
        let page = self.page_offset(block);
        let (vb, sb) = (
            self.value_bytes as u64,
            self.row_bytes.saturating_sub(self.value_bytes) as u64,
        );
        [
            (page.saturating_add(offset as u64 * vb), vb),
            (
                page.saturating_add(self.block_size as u64 * vb)
                    .saturating_add(offset as u64 * sb),
                sb,
            ),
        ]
    }

    /// [`PageLayout::page_offset`], or the error (for operation `op`) naming what is wrong: a
    /// block beyond the pool, or a page beyond the address space.
    pub fn checked_page_offset(&self, op: OpName, block: u32) -> Result<u64, OpError> {
        if block >= self.num_blocks {
            return Err(OpError::OutOfRange {
                op,
                field: "block",
                value: block.into(),
                min: 0,
                max: u64::from(self.num_blocks).saturating_sub(1),
            });
        }
        u64::from(block)
            .checked_mul(self.block_stride)
            .and_then(|o| o.checked_add(self.base))
            .ok_or(OpError::Overflow {
                op,
                field: "layout",
            })
    }

    /// [`PageLayout::row_parts`], or the error (for operation `op`) naming what is wrong: value
    /// bytes above the row's, a block beyond the pool, an offset beyond the page, or a row
    /// beyond the address space.
    pub fn checked_row_parts(
        &self,
        op: OpName,
        block: u32,
        offset: u32,
    ) -> Result<[(u64, u64); 2], OpError> {
        if self.value_bytes > self.row_bytes {
            return Err(OpError::OutOfRange {
                op,
                field: "layout.value_bytes",
                value: self.value_bytes.into(),
                min: 0,
                max: self.row_bytes.into(),
            });
        }
        if offset >= self.block_size {
            return Err(OpError::OutOfRange {
                op,
                field: "offset",
                value: offset.into(),
                min: 0,
                max: u64::from(self.block_size).saturating_sub(1),
            });
        }
        let page = self.checked_page_offset(op, block)?;
        // Every part lies inside the page: once it ends within the address space, the plain
        // form's arithmetic cannot saturate.
        page.checked_add(self.page_bytes())
            .ok_or(OpError::Overflow {
                op,
                field: "layout",
            })?;
        Ok(self.row_parts(block, offset))
    }

    /// `(block, offset)` of flat row `row`, or `None` when it lies outside the pool or in the part
    /// of a block that belongs to other layers (or the layout has no rows per index stride).
    pub const fn locate(&self, row: i64) -> Option<(u32, u32)> {
        if row < 0 || self.index_stride_rows == 0 {
            return None;
        }
        let block = row / self.index_stride_rows as i64;
        let offset = (row % self.index_stride_rows as i64) as u32;
        if block >= self.num_blocks as i64 || offset >= self.block_size {
            return None;
        }
        Some((block as u32, offset))
    }

    /// One past the last byte this layout touches; a layout of 0 blocks is an
    /// [`OpError::Zero`].
    pub fn end(&self, op: OpName) -> Result<u64, OpError> {
        nonzero(op, "layout.num_blocks", self.num_blocks.into())?;
        let last = mul(
            op,
            "layout.block_stride",
            u64::from(self.num_blocks) - 1,
            self.block_stride,
        )?;
        self.base
            .checked_add(last)
            .and_then(|v| v.checked_add(self.page_bytes()))
            .ok_or(OpError::Overflow {
                op,
                field: "layout",
            })
    }

    /// Checks the layout on its own and against a buffer of `buffer_len` bytes:
    /// [`PageLayout::check_shape`], and the last page inside the buffer.
    pub fn check(&self, op: OpName, buffer: &'static str, buffer_len: u64) -> Result<(), OpError> {
        self.check_rows(op, buffer, buffer_len, RowUnit::Chunks)
    }

    /// [`PageLayout::check`] for rows moved in `unit`s ([`PageLayout::check_shape_in`]).
    pub fn check_rows(
        &self,
        op: OpName,
        buffer: &'static str,
        buffer_len: u64,
        unit: RowUnit,
    ) -> Result<(), OpError> {
        self.check_shape_in(op, unit)?;
        let end = self.end(op)?;
        if end > buffer_len {
            return Err(OpError::BufferTooSmall {
                op,
                buffer,
                needed: end,
                actual: buffer_len,
            });
        }
        Ok(())
    }

    /// Checks the layout on its own, whatever buffer it is for: sizes non-zero, rows of whole
    /// copy units (contiguous rows and split value parts 16-byte chunks, split scale parts
    /// 4-byte words: DeepSeek V4's 576 + 8, and its indexer's 128 + 4), and
    /// [`PageLayout::check_placement`]. What every copy of the data plane requires of a layout
    /// (and [`crate::layout::KvCacheConfig::validate`] of the layouts it describes).
    pub fn check_shape(&self, op: OpName) -> Result<(), OpError> {
        self.check_shape_in(op, RowUnit::Chunks)
    }

    /// [`PageLayout::check_shape`] for rows moved in `unit`s: with [`RowUnit::Words`] (indexer
    /// rows) contiguous rows and value parts need only be multiples of 4 bytes; the pages sit
    /// as [`PageLayout::check_placement`] says either way.
    pub fn check_shape_in(&self, op: OpName, unit: RowUnit) -> Result<(), OpError> {
        nonzero(op, "layout.num_blocks", self.num_blocks.into())?;
        nonzero(op, "layout.block_size", self.block_size.into())?;
        nonzero(op, "layout.row_bytes", self.row_bytes.into())?;
        nonzero(op, "layout.value_bytes", self.value_bytes.into())?;
        let chunk = unit.bytes();
        aligned(op, "layout.value_bytes", self.value_bytes.into(), chunk)?;
        if self.is_split() {
            aligned(
                op,
                "layout.scale bytes (row_bytes - value_bytes)",
                u64::from(self.row_bytes.saturating_sub(self.value_bytes)),
                4,
            )?;
        } else {
            aligned(op, "layout.row_bytes", self.row_bytes.into(), chunk)?;
        }
        if self.value_bytes > self.row_bytes {
            return Err(OpError::OutOfRange {
                op,
                field: "layout.value_bytes",
                value: self.value_bytes.into(),
                min: 16,
                max: self.row_bytes.into(),
            });
        }
        self.check_placement(op)
    }

    /// Checks where the pages sit, whatever their rows: `base` and `block_stride` multiples of
    /// [`COPY_ALIGNMENT`] (every page starts on a copy unit), pages that do not overlap
    /// (`block_stride` at least a page), and `index_stride_rows` at least `block_size`.
    pub fn check_placement(&self, op: OpName) -> Result<(), OpError> {
        let chunk = u64::from(COPY_ALIGNMENT);
        aligned(op, "layout.base", self.base, chunk)?;
        aligned(op, "layout.block_stride", self.block_stride, chunk)?;
        if self.index_stride_rows < self.block_size {
            return Err(OpError::OutOfRange {
                op,
                field: "layout.index_stride_rows",
                value: self.index_stride_rows.into(),
                min: self.block_size.into(),
                max: u32::MAX.into(),
            });
        }
        if self.num_blocks > 1 && self.block_stride < self.page_bytes() {
            return Err(OpError::OutOfRange {
                op,
                field: "layout.block_stride",
                value: self.block_stride,
                min: self.page_bytes(),
                max: u64::MAX,
            });
        }
        Ok(())
    }

    fn same_rows(&self, other: &PageLayout, op: OpName) -> Result<(), OpError> {
        for (field, a, b) in [
            ("device.block_size", other.block_size, self.block_size),
            ("device.row_bytes", other.row_bytes, self.row_bytes),
            ("device.value_bytes", other.value_bytes, self.value_bytes),
        ] {
            if a != b {
                return Err(OpError::Mismatch {
                    op,
                    field,
                    value: a.into(),
                    expected_field: "host layout",
                    expected: b.into(),
                });
            }
        }
        Ok(())
    }
}

/// The units a copy moves a layout's rows in, which sets the alignment its check demands of
/// rows (pages are placed on [`COPY_ALIGNMENT`] either way: [`PageLayout::check_placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowUnit {
    /// 16-byte chunks (KV rows): contiguous rows and value parts multiples of 16 bytes, a split
    /// row's scale part a multiple of 4.
    Chunks,
    /// 4-byte words (indexer rows, which have no 16-byte rule: DeepSeek V3.2's contiguous
    /// 132-byte rows): every row part a multiple of 4 bytes.
    Words,
}

impl RowUnit {
    /// The alignment, in bytes, of contiguous rows and value parts.
    pub const fn bytes(self) -> u64 {
        match self {
            RowUnit::Chunks => COPY_ALIGNMENT as u64,
            RowUnit::Words => 4,
        }
    }
}

/// One layer's place in the host pool and in the device pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LayerPair {
    /// Layout in the pinned host pool.
    pub host: PageLayout,
    /// Layout in the device pool.
    pub device: PageLayout,
}

pub(crate) fn check_layers(
    op: OpName,
    layers: &[LayerPair],
    host_len: u64,
    device_len: u64,
) -> Result<(), OpError> {
    check_layer_rows(op, layers, host_len, device_len, RowUnit::Chunks)
}

/// [`check_layers`] for rows moved in `unit`s.
pub(crate) fn check_layer_rows(
    op: OpName,
    layers: &[LayerPair],
    host_len: u64,
    device_len: u64,
    unit: RowUnit,
) -> Result<(), OpError> {
    nonzero(op, "layers", layers.len() as u64)?;
    for l in layers {
        l.host.check_rows(op, "host", host_len, unit)?;
        l.device.check_rows(op, "device", device_len, unit)?;
        l.host.same_rows(&l.device, op)?;
    }
    Ok(())
}
