//! Row and page copies between the pinned host pool and the device pool (contract §5.3 and step 7 of
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
//!
//! # Files
//!
//! `layout.rs` (page geometry), `gather.rs`, `pages.rs`, `rows.rs`, `bulk.rs` (one family of
//! copies each) and `batching.rs` (the copy-conflict rule); every item is re-exported here.

/// The copies move 16-byte chunks: every page they address starts on a multiple of this many
/// bytes (a layout's `base` and `block_stride`), and contiguous rows and split value parts are
/// whole chunks. The layout planner pads the pages it places to it.
pub const COPY_ALIGNMENT: u32 = 16;

mod batching;
mod bulk;
mod gather;
mod layout;
mod pages;
mod rows;

#[cfg(feature = "alloc")]
pub use batching::copy_batches;
pub use batching::{ByteRange, CopyFootprint};
pub use bulk::{
    bulk_copy, check_bulk, check_bulk_copy, check_copy_within, check_read, check_write, copy_within,
};
pub(crate) use gather::copy_row;
pub use gather::{GatherArgs, GatherDesc, gather_rows};
pub use layout::{LayerPair, PageLayout, RowUnit};
pub(crate) use layout::{check_layer_rows, check_layers};
pub use pages::{
    BlockPair, Direction, PageCopyDesc, check_host_page_copy, copy_host_pages, copy_pages,
};
pub use rows::{RowCopyDesc, RowSpan, copy_rows};

#[cfg(test)]
mod tests;
