//! The data-plane ops an engine drives around the decode path rather than through a step's
//! command: the resident remap with its modes ([`Runtime::remap_modes`]: decode context
//! parallelism, prefill rows into a gathered workspace) and the compressed slot mapping of the
//! indexer caches ([`Runtime::compressed_slot_mapping`]).

use hisparse_core::Device;
use hisparse_core::ops::{DcpSplit, SlotMappingArgs, SlotMappingDesc};

use crate::decode::{Indices, TopK};
use crate::error::RuntimeError;
use crate::runtime::Runtime;
use crate::streams::{StreamId, pick};

/// The modes of a [`Runtime::remap_modes`] call (`hisparse_core::ops::remap`'s module docs
/// define them); with neither it is the plain resident remap.
#[derive(Debug)]
pub struct RemapModes<'a, B> {
    /// Decode context parallelism: this rank stores the tokens of its runs of `interleave`
    /// tokens; tokens another rank stores map to `-1`, its own through the resident tables by
    /// their local index.
    pub dcp: Option<DcpSplit>,
    /// Prefill rows whose context the engine gathered into a contiguous workspace.
    pub workspace: Option<PrefillWorkspace<'a, B>>,
}

/// Prefill rows that read a gathered workspace instead of the resident tables.
#[derive(Debug)]
pub struct PrefillWorkspace<'a, B> {
    /// Prefill requests `P` (entries of `starts`, ≥ 1).
    pub requests: u32,
    /// `i32[num_tokens]`: the prefill request of each token row, `-1` for a decode row (which
    /// remaps through the resident tables).
    pub request_of_row: &'a B,
    /// `i32[P]`: the workspace row of token 0 of each prefill request; entry `tok` of its rows
    /// maps to `starts[p] + tok`.
    pub starts: &'a B,
}

/// Which indexer cache a [`Runtime::compressed_slot_mapping`] maps into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexerCacheSide {
    /// The indexer blocks in the device pool, through the indexer block table
    /// ([`Runtime::indexer_table`]).
    Device,
    /// The indexer host cache ([`Runtime::indexer_host_cache`]), through the host table
    /// ([`Runtime::host_table`]): the page of host block `h` there.
    Host,
}

/// The tokens of a [`Runtime::compressed_slot_mapping`] call.
#[derive(Debug)]
pub struct CompressedSlots<'a, B> {
    /// Tokens `T`.
    pub num_tokens: u32,
    /// `i32[T]` token positions.
    pub positions: &'a B,
    /// `i32[T]` each token's own slot (only its sign is read: negative = padding, no row).
    pub slot_mapping: &'a B,
    /// `i32[T]` state row of each token.
    pub state_rows: &'a B,
    /// `i32[T]` output: the token's indexer row in the chosen cache, as
    /// [`hisparse_core::ops::indexer_backup`] addresses it (`block * rows_per_page + row`),
    /// `-1` for a token that writes no indexer row.
    pub out: &'a mut B,
}

impl<D: Device> Runtime<D> {
    /// The resident remap of index group `group` with `modes`, on the compute stream inside an
    /// open step: top-k token positions → physical rows in the flat attention view, through
    /// the resident tables (the fully-resident path), with a decode-context-parallel split
    /// and/or prefill rows read from a gathered workspace. State rows and outputs as for
    /// [`Runtime::remap_prefill`]; the hot state is not touched. [`Runtime::remap_modes_on`]
    /// names another stream.
    pub fn remap_modes(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        modes: RemapModes<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.remap_modes_on(group, topk, modes, out, None)
    }

    /// [`Runtime::remap_modes`] on stream `on` (`None`: the compute stream).
    pub fn remap_modes_on(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        modes: RemapModes<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.remap_resident(group, topk, Some(modes), out, on)
    }

    /// The compressed slot mapping of the indexer caches
    /// ([`hisparse_core::ops::slot_mapping`]): for each token, the indexer row it writes in
    /// the device pool's indexer blocks or in the indexer host cache, through the request's
    /// indexer block table or host table (its state row's), with the layout's indexer
    /// geometry (a token at position `p` writes row `p / R` when `(p + 1) % R == 0`, `R` the
    /// indexer's tokens per row). These are the slots [`hisparse_core::Device::indexer_backup`]
    /// takes, so an engine that writes its own indexer keys addresses them with it. On the
    /// compute stream ([`Runtime::compressed_slot_mapping_on`] names another); refused for a
    /// layout without an indexer layer.
    pub fn compressed_slot_mapping(
        &mut self,
        side: IndexerCacheSide,
        slots: CompressedSlots<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.compressed_slot_mapping_on(side, slots, None)
    }

    /// [`Runtime::compressed_slot_mapping`] on stream `on` (`None`: the compute stream).
    pub fn compressed_slot_mapping_on(
        &mut self,
        side: IndexerCacheSide,
        slots: CompressedSlots<'_, D::Buffer>,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let rows_per_page = self.indexer.as_ref().map(|ix| ix.rows_per_page()).ok_or(
            RuntimeError::Config {
                field: "layout",
                reason: "the layout has no indexer layer, so there is no compressed indexer cache to map into".into(),
            },
        )?;
        let desc = SlotMappingDesc {
            num_tokens: slots.num_tokens,
            ratio: self.kv.block_tokens / rows_per_page.max(1),
            block_size: self.kv.block_tokens,
            table_rows: self.cfg.state_rows,
            max_blocks: self.kv.max_pages_per_request,
        };
        let block_table = match side {
            IndexerCacheSide::Device => &self.tables.indexer.buf,
            IndexerCacheSide::Host => &self.tables.host.buf,
        };
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        self.dev
            .compressed_slot_mapping(
                stream,
                &desc,
                SlotMappingArgs {
                    positions: slots.positions,
                    slot_mapping: slots.slot_mapping,
                    table_row: slots.state_rows,
                    block_table,
                    out: slots.out,
                },
            )
            .map_err(RuntimeError::device("mapping compressed indexer slots"))
    }
}
