//! Indexer keys kept as durable as the KV rows.
//!
//! The indexer group lives on the GPU only (one block per page, ordinary paging), but a page
//! whose host copy is durable must also have the keys the indexer scores: a request that takes
//! the page over from host (an imported request, a prefix hit) has rows for attention *and*
//! keys for the indexer. So, as DeepSeek V4's compressor does, every indexer row a step writes
//! is backed up device → host into an indexer host cache laid out like the host pool (the
//! page of host block `h` holds the keys of the page whose KV is in host block `h`;
//! `KvCacheConfig::indexer_layer_pair`), by the rules of the KV rows:
//!
//! * the backups ride in the step's transfer batch ([`OffloadCommand::indexer_backups`]):
//!   with eager mirroring the rows the step writes, beside the KV row mirrors; without it the
//!   whole page, beside its spill — so a page is clean, published and reclaimable only once its
//!   indexer rows are durable too;
//! * host copy-on-write copies the indexer host page with the KV page (the runtime applies
//!   `host_cow` to both);
//! * an imported request gets its indexer pages restored host → device before its first
//!   forward ([`OffloadCommand::indexer_restores`]): its transfer writes the keys into the
//!   indexer host cache, as it writes the KV rows into the host pool.
//!
//! [`OffloadCommand::indexer_backups`]: super::OffloadCommand::indexer_backups
//! [`OffloadCommand::indexer_restores`]: super::OffloadCommand::indexer_restores

use alloc::vec::Vec;

use crate::layout::KvCacheConfig;
use crate::ops::{BlockPair, RowSpan};

/// How tokens map to indexer rows: a token at position `p` writes indexer row
/// `p / tokens_per_row` when `(p + 1)` is a multiple of `tokens_per_row` (1 for an
/// uncompressed indexer, the compress ratio for DeepSeek V4's), `rows_per_page` rows per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct IndexerRows {
    tokens_per_row: u32,
    rows_per_page: u32,
}

impl IndexerRows {
    /// The indexer rows of `kv`, or `None` when it has no indexer layer (nothing to back up).
    pub(super) fn of(kv: &KvCacheConfig) -> Option<Self> {
        let l = kv
            .groups
            .get(KvCacheConfig::INDEXER_GROUP)?
            .layers
            .first()?;
        let rows_per_page = l.rows_per_block;
        let tokens_per_row = kv.block_tokens.checked_div(rows_per_page)?;
        (tokens_per_row > 0).then_some(IndexerRows {
            tokens_per_row,
            rows_per_page,
        })
    }

    /// Appends the backups of the indexer rows tokens `first..target` write (one span per page,
    /// rows `first / R .. target / R`), from the request's indexer blocks to its host blocks
    /// (both by page). Pages without a block on either side are skipped (the caller only plans
    /// pages it holds).
    pub(super) fn plan_tokens(
        &self,
        first: u32,
        target: u32,
        indexer: &[u32],
        host: &[u32],
        out: &mut Vec<RowSpan>,
    ) {
        // Row `c` is written by token `c * R + R - 1`: it lies in `first..target` exactly when
        // `first / R <= c < target / R`.
        let (mut row, end) = (first / self.tokens_per_row, target / self.tokens_per_row);
        while row < end {
            let page = row / self.rows_per_page;
            let page_end = ((page + 1) * self.rows_per_page).min(end);
            if let (Some(&device_block), Some(&host_block)) =
                (indexer.get(page as usize), host.get(page as usize))
            {
                out.push(RowSpan {
                    device_block,
                    host_block,
                    first_row: row % self.rows_per_page,
                    num_rows: page_end - row,
                });
            }
            row = page_end;
        }
    }

    /// Appends the backup of every indexer row of page `page` (a full page spilled whole).
    pub(super) fn plan_page(
        &self,
        page: u32,
        indexer: &[u32],
        host: &[u32],
        out: &mut Vec<RowSpan>,
    ) {
        let first = page * self.rows_per_page * self.tokens_per_row;
        let target = first + self.rows_per_page * self.tokens_per_row;
        self.plan_tokens(first, target, indexer, host, out);
    }
}

/// Appends the restores of pages `pages` of an imported request: host block → indexer block
/// (never into the null block 0).
pub(super) fn plan_restores(
    pages: core::ops::Range<u32>,
    indexer: &[u32],
    host: &[u32],
    out: &mut Vec<BlockPair>,
) {
    for p in pages {
        if let (Some(&dst), Some(&src)) = (indexer.get(p as usize), host.get(p as usize))
            && dst != 0
        {
            out.push(BlockPair { src, dst });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: IndexerRows = IndexerRows {
        tokens_per_row: 4,
        rows_per_page: 64,
    };

    #[test]
    fn a_compressed_indexer_backs_up_the_rows_its_tokens_write() {
        let (indexer, host) = ([7, 9], [3, 5]);
        let mut out = Vec::new();
        // Tokens 0..3 write no row; token 3 writes row 0.
        V4.plan_tokens(0, 3, &indexer, &host, &mut out);
        assert!(out.is_empty());
        V4.plan_tokens(3, 4, &indexer, &host, &mut out);
        assert_eq!(
            out,
            [RowSpan {
                device_block: 7,
                host_block: 3,
                first_row: 0,
                num_rows: 1
            }]
        );
        // Tokens 250..262 write rows 62, 63 (page 0: tokens 251, 255) and 64 (page 1: token
        // 259; row 65 is token 263's).
        out.clear();
        V4.plan_tokens(250, 262, &indexer, &host, &mut out);
        assert_eq!(
            out,
            [
                RowSpan {
                    device_block: 7,
                    host_block: 3,
                    first_row: 62,
                    num_rows: 2
                },
                RowSpan {
                    device_block: 9,
                    host_block: 5,
                    first_row: 0,
                    num_rows: 1
                }
            ]
        );
        out.clear();
        V4.plan_page(1, &indexer, &host, &mut out);
        assert_eq!(
            out,
            [RowSpan {
                device_block: 9,
                host_block: 5,
                first_row: 0,
                num_rows: 64
            }]
        );
    }

    #[test]
    fn restores_pair_each_host_page_with_its_indexer_block() {
        let mut out = Vec::new();
        plan_restores(0..3, &[7, 9], &[3, 5, 6], &mut out);
        assert_eq!(
            out,
            [BlockPair { src: 3, dst: 7 }, BlockPair { src: 5, dst: 9 }]
        );
    }
}
