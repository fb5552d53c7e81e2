//! Row and page copies between the pinned host pool and the device pool (SPEC §5.3 and step 7 of
//! §5.2).
//!
//! Both pools are described per layer by a [`PageLayout`]: where block 0's page of the layer sits,
//! how far apart consecutive blocks are, and how rows sit inside a page — contiguous, or *split*
//! (all value bytes of the page's rows first, then all their scale bytes). A row is addressed as
//! `(block, offset)`; a flat row index `r` names `(r / index_stride_rows, r % index_stride_rows)`
//! (the host pool uses `index_stride_rows = block_size`; the device pool uses the attention
//! block stride, so flat device rows are exactly the indices attention reads).
//!
//! Operations:
//! * [`gather_rows`]: execute a resolver miss plan (host row → device row) for one or more layers.
//!   A source of `-1` or beyond the host pool zero-fills the destination row. A destination that is
//!   negative, beyond the pool, or in another layer's part of a block (`offset ≥ block_size`) is
//!   skipped. Plan destinations must be distinct (the resolver guarantees it); when they are not,
//!   which source lands is unspecified.
//! * [`copy_pages`]: whole pages, device → host (backup, several layers in one call) or host →
//!   device (restore). Pairs are validated up front; destinations must be distinct.
//! * [`copy_rows`]: row spans inside pages (row mirrors, partial restores).
//! * [`copy_host_pages`]: host → host page copies (copy-on-write of a shared tail page).
//!
//! `copy_batches` (with `alloc`) is the one copy-conflict rule of the GPU backends: which consecutive tiles of a
//! copy list may run as one parallel launch and still give the reference's sequential result.

use super::{BufferLen, I32_BYTES, aligned, in_range, mul, need, nonzero};
use crate::error::{OpError, OpName};

/// The copies move 16-byte chunks: every page they address starts on a multiple of this many
/// bytes (a layout's `base` and `block_stride`), and contiguous rows and split value parts are
/// whole chunks. The layout planner pads the pages it places to it.
pub const COPY_ALIGNMENT: u32 = 16;

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

/// Shape of a [`gather_rows`] call: a resolver miss plan of `T × K` entries applied to `layers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherDesc<'a> {
    /// Token rows `T` of the plan.
    pub num_tokens: u32,
    /// Plan entries per token row `K`.
    pub top_k: u32,
    /// Layers to gather (a leader and its followers share one plan).
    pub layers: &'a [LayerPair],
}

/// Buffers of a gather call.
#[derive(Debug)]
pub struct GatherArgs<'a, B: ?Sized, H: ?Sized, D: ?Sized = B> {
    /// `i32[T][K]` flat host rows (`-1` = zero-fill).
    pub plan_src: &'a B,
    /// `i32[T][K]` flat device rows.
    pub plan_dst: &'a B,
    /// `i32[T]` valid plan entries per token row (clamped to `0..=K`).
    pub plan_counts: &'a B,
    /// The host pool.
    pub host: &'a H,
    /// The device pool.
    pub device: &'a mut D,
}

impl GatherDesc<'_> {
    /// Checks the descriptor and buffer sizes.
    pub fn check<B: BufferLen + ?Sized, H: BufferLen + ?Sized, D: BufferLen + ?Sized>(
        &self,
        args: &GatherArgs<'_, B, H, D>,
    ) -> Result<(), OpError> {
        self.check_lens(
            args.plan_src.byte_len(),
            args.plan_dst.byte_len(),
            args.plan_counts.byte_len(),
            args.host.byte_len(),
            args.device.byte_len(),
        )
    }

    /// [`GatherDesc::check`] over the buffers' byte lengths: `plan_src`, `plan_dst`,
    /// `plan_counts`, the host pool and the device pool, in that order (for callers that check
    /// a gather before its plan buffers can be borrowed, as `swap_in::check` does).
    pub fn check_lens(
        &self,
        plan_src: u64,
        plan_dst: u64,
        plan_counts: u64,
        host: u64,
        device: u64,
    ) -> Result<(), OpError> {
        const OP: OpName = OpName::GatherRows;
        nonzero(OP, "top_k", self.top_k.into())?;
        // Plan counts are `i32`: a row cannot hold more entries than they count.
        in_range(OP, "top_k", self.top_k.into(), 1, i32::MAX as u64)?;
        let tk = mul(OP, "plan", self.num_tokens.into(), self.top_k.into())?;
        need(OP, "plan_src", plan_src, tk, I32_BYTES)?;
        need(OP, "plan_dst", plan_dst, tk, I32_BYTES)?;
        need(
            OP,
            "plan_counts",
            plan_counts,
            self.num_tokens.into(),
            I32_BYTES,
        )?;
        check_layers(OP, self.layers, host, device)
    }
}

pub(crate) fn copy_row(
    src_layout: &PageLayout,
    src_pos: Option<(u32, u32)>,
    src: &[u8],
    dst_layout: &PageLayout,
    (db, doff): (u32, u32),
    dst: &mut [u8],
) {
    let dparts = dst_layout.row_parts(db, doff);
    match src_pos {
        Some((sb, soff)) => {
            let sparts = src_layout.row_parts(sb, soff);
            for ((s, len), (d, _)) in sparts.into_iter().zip(dparts) {
                let (s, d, len) = (s as usize, d as usize, len as usize);
                dst[d..d + len].copy_from_slice(&src[s..s + len]);
            }
        }
        None => {
            for (d, len) in dparts {
                dst[d as usize..(d + len) as usize].fill(0);
            }
        }
    }
}

/// Reference gather: executes a miss plan for every layer. See the module docs for the rules.
pub fn gather_rows(
    desc: &GatherDesc<'_>,
    args: GatherArgs<'_, [i32], [u8], [u8]>,
) -> Result<(), OpError> {
    desc.check(&args)?;
    let k = desc.top_k as usize;
    for layer in desc.layers {
        for t in 0..desc.num_tokens as usize {
            let n = args.plan_counts[t].clamp(0, desc.top_k as i32) as usize;
            for j in 0..n {
                let Some(dst) = layer.device.locate(args.plan_dst[t * k + j].into()) else {
                    continue;
                };
                let src = layer.host.locate(args.plan_src[t * k + j].into());
                copy_row(&layer.host, src, args.host, &layer.device, dst, args.device);
            }
        }
    }
    Ok(())
}

/// A page or row copy direction between the pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Direction {
    /// Device pool → host pool (backup, row mirror).
    DeviceToHost,
    /// Host pool → device pool (restore).
    HostToDevice,
}

/// A source block and a destination block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockPair {
    /// Source block id (in the source pool of the copy's direction).
    pub src: u32,
    /// Destination block id.
    pub dst: u32,
}

/// Shape of a [`copy_pages`] call: whole pages of every listed layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopyDesc<'a> {
    /// Direction of every pair.
    pub direction: Direction,
    /// Layers copied for each pair (multi-layer backup in one call).
    pub layers: &'a [LayerPair],
}

fn src_dst(direction: Direction, l: &LayerPair) -> (&PageLayout, &PageLayout) {
    match direction {
        Direction::DeviceToHost => (&l.device, &l.host),
        Direction::HostToDevice => (&l.host, &l.device),
    }
}

fn check_pair(
    op: OpName,
    list: &'static str,
    index: usize,
    src_blocks: u32,
    dst_blocks: u32,
    pair: BlockPair,
) -> Result<(), OpError> {
    for (field, value, limit) in [("src", pair.src, src_blocks), ("dst", pair.dst, dst_blocks)] {
        if value >= limit {
            return Err(OpError::ElementOutOfRange {
                op,
                list,
                index,
                field,
                value: value.into(),
                limit: limit.into(),
            });
        }
    }
    Ok(())
}

impl PageCopyDesc<'_> {
    /// Checks layouts, buffer sizes and every pair.
    pub fn check(
        &self,
        pairs: &[BlockPair],
        host_len: u64,
        device_len: u64,
    ) -> Result<(), OpError> {
        const OP: OpName = OpName::CopyPages;
        check_layers(OP, self.layers, host_len, device_len)?;
        for l in self.layers {
            let (s, d) = src_dst(self.direction, l);
            for (i, p) in pairs.iter().enumerate() {
                check_pair(OP, "pairs", i, s.num_blocks, d.num_blocks, *p)?;
            }
        }
        Ok(())
    }
}

/// Reference whole-page copy in `desc.direction`.
pub fn copy_pages(
    desc: &PageCopyDesc<'_>,
    pairs: &[BlockPair],
    host: &mut [u8],
    device: &mut [u8],
) -> Result<(), OpError> {
    desc.check(pairs, host.byte_len(), device.byte_len())?;
    for l in desc.layers {
        let len = l.host.page_bytes() as usize;
        for p in pairs {
            match desc.direction {
                Direction::DeviceToHost => {
                    let (s, d) = (
                        l.device.page_offset(p.src) as usize,
                        l.host.page_offset(p.dst) as usize,
                    );
                    host[d..d + len].copy_from_slice(&device[s..s + len]);
                }
                Direction::HostToDevice => {
                    let (s, d) = (
                        l.host.page_offset(p.src) as usize,
                        l.device.page_offset(p.dst) as usize,
                    );
                    device[d..d + len].copy_from_slice(&host[s..s + len]);
                }
            }
        }
    }
    Ok(())
}

/// A run of rows at the same offsets of a device page and a host page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RowSpan {
    /// Device block id.
    pub device_block: u32,
    /// Host block id.
    pub host_block: u32,
    /// First row of the span within the page.
    pub first_row: u32,
    /// Rows in the span (0 is a no-op).
    pub num_rows: u32,
}

/// Shape of a [`copy_rows`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowCopyDesc<'a> {
    /// Direction of every span.
    pub direction: Direction,
    /// Layers copied for each span.
    pub layers: &'a [LayerPair],
}

impl RowCopyDesc<'_> {
    /// Checks layouts, buffer sizes and every span.
    pub fn check(&self, spans: &[RowSpan], host_len: u64, device_len: u64) -> Result<(), OpError> {
        const OP: OpName = OpName::CopyRows;
        check_layers(OP, self.layers, host_len, device_len)?;
        for l in self.layers {
            for (index, s) in spans.iter().enumerate() {
                let pair = BlockPair {
                    src: s.device_block,
                    dst: s.host_block,
                };
                check_pair(
                    OP,
                    "spans",
                    index,
                    l.device.num_blocks,
                    l.host.num_blocks,
                    pair,
                )?;
                let end = u64::from(s.first_row) + u64::from(s.num_rows);
                if end > u64::from(l.host.block_size) {
                    return Err(OpError::ElementOutOfRange {
                        op: OP,
                        list: "spans",
                        index,
                        field: "first_row + num_rows",
                        value: end,
                        limit: u64::from(l.host.block_size) + 1,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Reference row-span copy in `desc.direction` (contiguous or split rows).
pub fn copy_rows(
    desc: &RowCopyDesc<'_>,
    spans: &[RowSpan],
    host: &mut [u8],
    device: &mut [u8],
) -> Result<(), OpError> {
    desc.check(spans, host.byte_len(), device.byte_len())?;
    for l in desc.layers {
        for s in spans {
            for r in s.first_row..s.first_row + s.num_rows {
                let (hpos, dpos) = ((s.host_block, r), (s.device_block, r));
                match desc.direction {
                    Direction::DeviceToHost => {
                        copy_row(&l.device, Some(dpos), device, &l.host, hpos, host)
                    }
                    Direction::HostToDevice => {
                        copy_row(&l.host, Some(hpos), host, &l.device, dpos, device)
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks a host → host page copy: layouts against the host buffer and every pair.
pub fn check_host_page_copy(
    layers: &[PageLayout],
    pairs: &[BlockPair],
    host_len: u64,
) -> Result<(), OpError> {
    const OP: OpName = OpName::CopyPages;
    nonzero(OP, "layers", layers.len() as u64)?;
    for l in layers {
        l.check(OP, "host", host_len)?;
        for (i, p) in pairs.iter().enumerate() {
            check_pair(OP, "pairs", i, l.num_blocks, l.num_blocks, *p)?;
            if p.src == p.dst {
                return Err(OpError::ElementOutOfRange {
                    op: OP,
                    list: "pairs",
                    index: i,
                    field: "dst (equal to src)",
                    value: p.dst.into(),
                    limit: p.src.into(),
                });
            }
        }
    }
    Ok(())
}

/// Reference host → host page copy (copy-on-write). `src == dst` is rejected.
pub fn copy_host_pages(
    layers: &[PageLayout],
    pairs: &[BlockPair],
    host: &mut [u8],
) -> Result<(), OpError> {
    check_host_page_copy(layers, pairs, host.byte_len())?;
    for l in layers {
        let len = l.page_bytes() as usize;
        for p in pairs {
            let (s, d) = (l.page_offset(p.src) as usize, l.page_offset(p.dst) as usize);
            host.copy_within(s..s + len, d);
        }
    }
    Ok(())
}

/// Checks a contiguous copy of `bytes` from `src[src_offset..]` to `dst[dst_offset..]`
/// (bulk host↔device and device↔device copies, also the bandwidth ceilings of the benches).
pub fn check_bulk_copy(
    src_len: u64,
    src_offset: u64,
    dst_len: u64,
    dst_offset: u64,
    bytes: u64,
) -> Result<(), OpError> {
    const OP: OpName = OpName::BulkCopy;
    for (buffer, len, offset) in [("src", src_len, src_offset), ("dst", dst_len, dst_offset)] {
        let needed = offset.checked_add(bytes).ok_or(OpError::Overflow {
            op: OP,
            field: buffer,
        })?;
        if needed > len {
            return Err(OpError::BufferTooSmall {
                op: OP,
                buffer,
                needed,
                actual: len,
            });
        }
    }
    Ok(())
}

/// [`check_bulk_copy`] for two buffers, with offsets and size as `usize`.
pub fn check_bulk<S: BufferLen + ?Sized, D: BufferLen + ?Sized>(
    src: &S,
    src_offset: usize,
    dst: &D,
    dst_offset: usize,
    bytes: usize,
) -> Result<(), OpError> {
    check_bulk_copy(
        src.byte_len(),
        src_offset as u64,
        dst.byte_len(),
        dst_offset as u64,
        bytes as u64,
    )
}

/// Checks writing all of `src` into `dst` at byte `offset` (uploads, pinned writes).
pub fn check_write<D: BufferLen + ?Sized>(
    dst: &D,
    offset: usize,
    src: &[u8],
) -> Result<(), OpError> {
    check_bulk(src, 0, dst, offset, src.len())
}

/// Checks reading `dst.len()` bytes of `src` from byte `offset` (downloads, pinned reads).
pub fn check_read<S: BufferLen + ?Sized>(
    src: &S,
    offset: usize,
    dst: &[u8],
) -> Result<(), OpError> {
    check_bulk(src, offset, dst, 0, dst.len())
}

/// Checks a copy of `bytes` from `src_offset` to `dst_offset` inside one buffer of `len` bytes:
/// both ranges inside the buffer and disjoint (an overlapping copy has no single right answer
/// once a backend splits it across threads).
pub fn check_copy_within(
    len: u64,
    src_offset: u64,
    dst_offset: u64,
    bytes: u64,
) -> Result<(), OpError> {
    const OP: OpName = OpName::CopyWithin;
    for (buffer, offset) in [("src", src_offset), ("dst", dst_offset)] {
        let needed = offset.checked_add(bytes).ok_or(OpError::Overflow {
            op: OP,
            field: buffer,
        })?;
        if needed > len {
            return Err(OpError::BufferTooSmall {
                op: OP,
                buffer,
                needed,
                actual: len,
            });
        }
    }
    if bytes > 0 && src_offset < dst_offset + bytes && dst_offset < src_offset + bytes {
        return Err(OpError::Overlap {
            op: OP,
            src: src_offset,
            dst: dst_offset,
            bytes,
        });
    }
    Ok(())
}

/// Reference copy inside one byte slice ([`check_copy_within`] first).
pub fn copy_within(
    buf: &mut [u8],
    src_offset: usize,
    dst_offset: usize,
    bytes: usize,
) -> Result<(), OpError> {
    check_copy_within(
        buf.len() as u64,
        src_offset as u64,
        dst_offset as u64,
        bytes as u64,
    )?;
    buf.copy_within(src_offset..src_offset + bytes, dst_offset);
    Ok(())
}

/// Reference bulk copy between two byte slices.
pub fn bulk_copy(
    src: &[u8],
    src_offset: usize,
    dst: &mut [u8],
    dst_offset: usize,
    bytes: usize,
) -> Result<(), OpError> {
    check_bulk(src, src_offset, dst, dst_offset, bytes)?;
    dst[dst_offset..dst_offset + bytes].copy_from_slice(&src[src_offset..src_offset + bytes]);
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// When copies may run in parallel: the copy-conflict rule shared by the GPU backends
// ------------------------------------------------------------------------------------------------

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
mod batch_tests {
    use super::*;
    use alloc::vec::Vec;

    /// Applies one tile: each part read, then written.
    fn apply(t: &CopyFootprint, buf: &mut [u8], src_buf: &[u8], same_buffer: bool) {
        for (s, d) in t.src.iter().zip(&t.dst) {
            let (s, d, n) = (s.start as usize, d.start as usize, s.len as usize);
            if same_buffer {
                buf.copy_within(s..s + n, d);
            } else {
                buf[d..d + n].copy_from_slice(&src_buf[s..s + n]);
            }
        }
    }

    /// Runs each batch in two of the orders a device may pick — every tile reading before any
    /// writes, and the tiles one by one in reverse — and compares both with applying the tiles
    /// one by one in order (the reference). Returns the number of batches.
    fn check(len: usize, tiles: &[CopyFootprint], same_buffer: bool) -> usize {
        let batches = copy_batches(tiles, same_buffer);
        let covered: usize = batches.iter().map(|b| b.len()).sum();
        assert_eq!(covered, tiles.len(), "every tile in exactly one batch");
        assert!(batches.iter().all(|b| !b.is_empty()));
        let src_buf: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7)).collect();
        let start: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut want = start.clone();
        for t in tiles {
            apply(t, &mut want, &src_buf, same_buffer);
        }
        let (mut reads_first, mut reversed) = (start.clone(), start);
        for b in &batches {
            let batch = &tiles[b.clone()];
            let reads: Vec<Vec<u8>> = batch
                .iter()
                .flat_map(|t| t.src.iter())
                .map(|s| {
                    let from = if same_buffer { &reads_first } else { &src_buf };
                    from[s.start as usize..s.end() as usize].to_vec()
                })
                .collect();
            for (bytes, d) in reads.iter().zip(batch.iter().flat_map(|t| t.dst.iter())) {
                reads_first[d.start as usize..d.end() as usize].copy_from_slice(bytes);
            }
            for t in batch.iter().rev() {
                apply(t, &mut reversed, &src_buf, same_buffer);
            }
        }
        assert_eq!(
            reads_first, want,
            "reads first: batches {batches:?} of {tiles:?}"
        );
        assert_eq!(reversed, want, "reversed: batches {batches:?} of {tiles:?}");
        batches.len()
    }

    #[test]
    fn independent_tiles_form_one_batch() {
        let tiles: Vec<CopyFootprint> = (0..8)
            .map(|i| CopyFootprint::contiguous(i * 16, 128 + i * 16, 16))
            .collect();
        assert_eq!(check(256, &tiles, true), 1);
        assert_eq!(check(256, &tiles, false), 1);
        assert!(copy_batches(&[], true).is_empty());
    }

    #[test]
    fn a_repeated_destination_starts_a_new_batch() {
        let tiles = [
            CopyFootprint::contiguous(0, 64, 16),
            CopyFootprint::contiguous(16, 72, 16),
            CopyFootprint::contiguous(32, 200, 16),
        ];
        assert_eq!(copy_batches(&tiles, false), [0..1, 1..3]);
        assert_eq!(check(256, &tiles, false), 2);
    }

    #[test]
    fn chains_in_one_buffer_run_in_order() {
        // Copy-on-write chain 1 -> 2 -> 3: the second copy reads what the first writes.
        let page = 16;
        let tiles = [
            CopyFootprint::contiguous(page, 2 * page, page),
            CopyFootprint::contiguous(2 * page, 3 * page, page),
            CopyFootprint::contiguous(5 * page, 6 * page, page),
        ];
        assert_eq!(copy_batches(&tiles, true), [0..1, 1..3]);
        assert_eq!(check(128, &tiles, true), 2);
        // Between two buffers the same offsets are independent.
        assert_eq!(check(128, &tiles, false), 1);
        // Writing what an earlier tile of the batch reads (an anti-dependence) splits too.
        let war = [
            CopyFootprint::contiguous(32, 0, 16),
            CopyFootprint::contiguous(64, 32, 16),
        ];
        assert_eq!(copy_batches(&war, true), [0..1, 1..2]);
        assert_eq!(check(128, &war, true), 2);
    }

    #[test]
    fn split_parts_and_empty_ranges() {
        let t = |v: u64, s: u64, dv: u64, ds: u64| CopyFootprint {
            src: [ByteRange::new(v, 16), ByteRange::new(s, 16)],
            dst: [ByteRange::new(dv, 16), ByteRange::new(ds, 16)],
        };
        // The scale parts collide while the value parts do not.
        let tiles = [t(0, 100, 200, 300), t(16, 116, 216, 308)];
        assert_eq!(copy_batches(&tiles, false), [0..1, 1..2]);
        assert_eq!(check(400, &tiles, false), 2);
        // Empty parts never conflict.
        let empty = [
            CopyFootprint::contiguous(0, 64, 0),
            CopyFootprint::contiguous(0, 64, 0),
            CopyFootprint::contiguous(0, 64, 16),
        ];
        let batches = copy_batches(&empty, true);
        assert_eq!((batches.len(), batches[0].clone()), (1, 0..3));
    }

    #[test]
    fn random_lists_match_sequential_order() {
        let mut x = 0x1234_5678_u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..300 {
            let same = round % 2 == 0;
            let n = 1 + next(12) as usize;
            let mut tiles = Vec::new();
            for _ in 0..n {
                let len = 16 * (1 + next(3));
                let (s, d) = (16 * next(14), 16 * next(14));
                // Within one buffer, a tile's own source and destination are equal or disjoint.
                if same && s != d && s < d + len && d < s + len {
                    continue;
                }
                tiles.push(CopyFootprint::contiguous(s, d, len));
            }
            check(16 * 18, &tiles, same);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_layer() -> LayerPair {
        // 2 rows per page, 32-byte rows: 16 value + 16 scale bytes; device blocks hold 2 layers.
        let host = PageLayout {
            base: 0,
            block_stride: 64,
            num_blocks: 3,
            block_size: 2,
            row_bytes: 32,
            value_bytes: 16,
            index_stride_rows: 2,
        };
        let device = PageLayout {
            block_stride: 128,
            index_stride_rows: 4,
            num_blocks: 2,
            ..host
        };
        LayerPair { host, device }
    }

    fn pattern(len: usize) -> alloc_free::Buf {
        let mut b = alloc_free::Buf([0; 256]);
        for (i, x) in b.0[..len].iter_mut().enumerate() {
            *x = (i as u8).wrapping_add(1);
        }
        b
    }

    mod alloc_free {
        pub struct Buf(pub [u8; 256]);
    }

    /// `row_parts` and `page_offset` are public: on a layout `check` refuses (scale part of
    /// negative size, a base or stride at the end of the address space) they answer without
    /// overflowing or panicking, and their checked forms say which field is wrong.
    #[test]
    fn page_layout_helpers_never_panic_on_invalid_layouts() {
        let bad = [
            PageLayout {
                value_bytes: 32,
                row_bytes: 16,
                ..PageLayout::contiguous(0, 64, 4, 4, 16)
            },
            PageLayout::contiguous(u64::MAX - 8, u64::MAX, u32::MAX, u32::MAX, u32::MAX),
            PageLayout::contiguous(0, u64::MAX / 2, 4, 4, 16),
        ];
        for l in bad {
            for (block, offset) in [(0, 0), (3, 3), (u32::MAX, u32::MAX)] {
                let _ = l.page_offset(block);
                let _ = l.row_parts(block, offset);
                let _ = l.checked_page_offset(OpName::CopyRows, block);
                let _ = l.checked_row_parts(OpName::CopyRows, block, offset);
                if block >= l.num_blocks {
                    assert!(l.checked_page_offset(OpName::CopyRows, block).is_err());
                }
            }
        }
        let e = bad[1]
            .checked_row_parts(OpName::CopyRows, 0, 0)
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpError::Overflow {
                    field: "layout",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = bad[0]
            .checked_row_parts(OpName::CopyRows, 0, 0)
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpError::OutOfRange {
                    field: "layout.value_bytes",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = bad[2]
            .checked_page_offset(OpName::CopyPages, 3)
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpError::Overflow {
                    field: "layout",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = bad[2]
            .checked_row_parts(OpName::CopyRows, 1, 4)
            .unwrap_err();
        assert!(
            matches!(
                e,
                OpError::OutOfRange {
                    field: "offset",
                    ..
                }
            ),
            "{e:?}"
        );
        // On a valid layout the checked forms agree with the plain ones.
        let l = split_layer().host;
        assert_eq!(
            l.checked_row_parts(OpName::CopyRows, 1, 1),
            Ok(l.row_parts(1, 1))
        );
        assert_eq!(
            l.checked_page_offset(OpName::CopyRows, 1),
            Ok(l.page_offset(1))
        );
    }

    #[test]
    fn split_rows_are_addressed_by_part() {
        let l = split_layer();
        assert_eq!(l.host.row_parts(1, 1), [(64 + 16, 16), (64 + 32 + 16, 16)]);
        assert_eq!(l.device.locate(5), Some((1, 1)));
        assert_eq!(
            l.device.locate(6),
            None,
            "offset 2 belongs to another layer"
        );
        assert_eq!(l.device.locate(8), None, "block 2 is beyond the pool");
        assert_eq!(l.host.locate(-1), None);
    }

    #[test]
    fn gather_copies_parts_zero_fills_and_skips() {
        let l = split_layer();
        let host = pattern(192);
        let mut dev = [0xAAu8; 256];
        let layers = [l];
        let desc = GatherDesc {
            num_tokens: 1,
            top_k: 4,
            layers: &layers,
        };
        // host row 3 = block 1 offset 1 -> device row 1 (block 0 offset 1);
        // src -1 -> zero-fill device row 4 (block 1 offset 0); dst 6 is skipped; count 3 ignores the 4th.
        gather_rows(
            &desc,
            GatherArgs {
                plan_src: &[3, -1, 0, 0],
                plan_dst: &[1, 4, 6, 0],
                plan_counts: &[3],
                host: &host.0[..192],
                device: &mut dev[..],
            },
        )
        .unwrap();
        assert_eq!(dev[16..32], host.0[80..96]);
        assert_eq!(dev[48..64], host.0[112..128]);
        assert!(dev[128..144].iter().all(|&b| b == 0));
        assert!(dev[160..176].iter().all(|&b| b == 0));
        assert!(
            dev[0..16].iter().all(|&b| b == 0xAA),
            "4th entry is beyond the count"
        );
    }

    #[test]
    fn page_copies_round_trip_and_reject_bad_pairs() {
        let l = split_layer();
        let layers = [l];
        let mut host = [0u8; 192];
        let mut dev = pattern(256).0;
        let back = PageCopyDesc {
            direction: Direction::DeviceToHost,
            layers: &layers,
        };
        copy_pages(&back, &[BlockPair { src: 1, dst: 2 }], &mut host, &mut dev).unwrap();
        assert_eq!(host[128..192], dev[128..192]);
        let err = copy_pages(&back, &[BlockPair { src: 2, dst: 0 }], &mut host, &mut dev);
        assert!(matches!(
            err,
            Err(OpError::ElementOutOfRange {
                field: "src",
                value: 2,
                ..
            })
        ));
        let mut dev2 = [0u8; 256];
        let restore = PageCopyDesc {
            direction: Direction::HostToDevice,
            layers: &layers,
        };
        copy_pages(
            &restore,
            &[BlockPair { src: 2, dst: 0 }],
            &mut host,
            &mut dev2,
        )
        .unwrap();
        assert_eq!(dev2[0..64], dev[128..192]);
    }

    #[test]
    fn row_spans_and_host_copy_on_write() {
        let l = split_layer();
        let layers = [l];
        let mut host = [0u8; 192];
        let mut dev = pattern(256).0;
        let desc = RowCopyDesc {
            direction: Direction::DeviceToHost,
            layers: &layers,
        };
        let span = RowSpan {
            device_block: 0,
            host_block: 1,
            first_row: 1,
            num_rows: 1,
        };
        copy_rows(&desc, &[span], &mut host, &mut dev).unwrap();
        assert_eq!(host[80..96], dev[16..32]);
        assert_eq!(host[112..128], dev[48..64]);
        assert!(host[64..80].iter().all(|&b| b == 0));
        let bad = RowSpan {
            num_rows: 2,
            ..span
        };
        assert!(copy_rows(&desc, &[bad], &mut host, &mut dev).is_err());
        copy_host_pages(&[l.host], &[BlockPair { src: 1, dst: 2 }], &mut host).unwrap();
        let copy = host;
        assert_eq!(host[128..192], copy[64..128]);
        assert!(copy_host_pages(&[l.host], &[BlockPair { src: 1, dst: 1 }], &mut host).is_err());
    }

    #[test]
    fn layouts_reject_misalignment_and_short_buffers() {
        let l = split_layer();
        // A split row's scale part is a multiple of 4 bytes (DeepSeek V4: 8), its value part
        // of 16; a contiguous row a multiple of 16.
        for (row_bytes, value_bytes, ok) in [(24, 16, true), (22, 16, false), (40, 24, false)] {
            let l = PageLayout {
                row_bytes,
                value_bytes,
                ..l.host
            };
            let r = l.check(OpName::CopyPages, "host", 1 << 20);
            assert_eq!(r.is_ok(), ok, "{row_bytes}/{value_bytes}: {r:?}");
            if !ok {
                assert!(matches!(r, Err(OpError::Misaligned { .. })), "{r:?}");
            }
        }
        let contiguous = PageLayout {
            row_bytes: 24,
            value_bytes: 24,
            ..l.host
        };
        assert!(matches!(
            contiguous.check(OpName::CopyPages, "host", 1 << 20),
            Err(OpError::Misaligned { .. })
        ));
        assert!(matches!(
            l.host.check(OpName::CopyPages, "host", 191),
            Err(OpError::BufferTooSmall { needed: 192, .. })
        ));
    }
}
