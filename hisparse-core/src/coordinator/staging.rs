//! Prefill over host-only context: a prefill chunk (tokens below the request's prefill end:
//! its prompt, or what a restart recomputes) attends to every earlier page of its context
//! through the resident table (the remap), so before it runs every such page must be on the
//! GPU. Pages that are not — prefix hits on host-only pages, pages reclaimed between chunks —
//! are *staged*: unpinned pages are pinned again (their bytes are intact), reclaimed ones get
//! new GPU blocks with host → device `restores` from their durable host blocks and `residency`
//! updates, all in the chunk's command, before its forward pass. Staged pages are clean: from
//! the next step on they are ordinary resident pages that lazy reclaim may unpin (no spill is
//! ever needed: the host copy is the durable one).
//!
//! Budget: the staged blocks count in the chunk's GPU need ([`Coordinator::schedule`] reclaims
//! for them, shrinks the chunk or waits like any other need), and for the rest of the step the
//! request's pages are passed over by every reclaim pass (so no later allocation of the step
//! can take a block the chunk reads). A chunk whose context could never be staged beside it,
//! even with the whole GPU pool free, is refused with [`CoordError::PrefillNeverFits`]
//! instead of waiting forever; admission refuses such prompts up front.

use crate::layout::KvCacheConfig;
use alloc::boxed::Box;

use super::request::{Req, empty_req};
use super::{CoordError, Coordinator, RequestId};
use crate::pool::BlockKey;

impl Coordinator {
    /// Runs `f` with `r` back in its place in `reqs` (passes that walk the running requests,
    /// such as [`Coordinator::process_reused`], then see it).
    pub(super) fn with_in_place(&mut self, r: &mut Box<Req>, f: impl FnOnce(&mut Self)) {
        let slot = r.slot as usize;
        let spare = self.spare.take().unwrap_or_else(|| Box::new(empty_req()));
        self.reqs[slot] = Some(core::mem::replace(r, spare));
        f(self);
        let back = self.reqs[slot]
            .take()
            .unwrap_or_else(|| Box::new(empty_req()));
        self.spare = Some(core::mem::replace(r, back));
    }

    /// Stages the context of `r`'s prefill chunk (see the module docs); the caller has checked
    /// that the free pool holds the blocks.
    pub(super) fn stage_prefill_context(&mut self, r: &mut Box<Req>) {
        if r.resident.unpinned() > 0 {
            // A block some allocation reused must not be pinned again: its page falls back
            // first (and is then restored like any reclaimed page).
            self.with_in_place(r, |c| c.process_reused());
        }
        let (restored, _) = self.resident.stage_context(
            &mut r.resident,
            &r.source.blocks,
            &mut self.gpu,
            &mut self.out,
            r.row,
        );
        self.staged_pages += u64::from(restored);
    }

    /// Refuses a prefill chunk of `r` that could never be staged beside its first token, even
    /// with the whole GPU pool free (waiting for memory would wait forever): the blocks it
    /// holds (its hot region aside: a restart gives it back), its context's staging and the
    /// first token's new page and columns.
    pub(super) fn check_prefill_fits(&self, r: &Req) -> Result<(), CoordError> {
        let nc = r.num_computed;
        let nb = u64::from(self.resident.num_buckets());
        let held = r.paged.blocks().filter(|&b| b != 0).count() as u64
            + self.resident.held_blocks(&r.resident).count() as u64;
        let new_pages = self.kv.pages_for(nc + 1).saturating_sub(r.pages);
        let needed = held
            + u64::from(self.resident.pages_to_stage(&r.resident)) * nb
            + u64::from(new_pages) * self.gpu_cost_per_page()
            + self.paged.regular_need(&r.paged, nc, nc + 1);
        let capacity = u64::from(self.kv.num_gpu_blocks) - 1;
        if needed > capacity {
            return Err(CoordError::PrefillNeverFits {
                id: r.id,
                context_tokens: nc,
                needed,
                capacity,
            });
        }
        Ok(())
    }

    /// Admission's form of [`Coordinator::check_prefill_fits`]: a prompt of `tokens` tokens
    /// whose prefill could never hold its context on the GPU. The rule is the layout's
    /// ([`KvCacheConfig::prefill_gpu_blocks`](crate::layout::KvCacheConfig::prefill_gpu_blocks)),
    /// so the capacity table and the layout's warnings say what admission does.
    pub(super) fn check_prompt_prefill_fits(
        &self,
        id: RequestId,
        tokens: u32,
    ) -> Result<(), CoordError> {
        if !self.kv.prefill_fits(tokens) {
            return Err(CoordError::PrefillNeverFits {
                id,
                context_tokens: tokens,
                needed: self.kv.prefill_gpu_blocks(tokens),
                capacity: u64::from(self.kv.num_gpu_blocks) - 1,
            });
        }
        Ok(())
    }

    /// Pages restored host → device to stage prefill context since the coordinator was made
    /// (a counter for reports).
    pub fn pages_staged(&self) -> u64 {
        self.staged_pages
    }

    /// The first token of `id`'s decode: tokens below it are prefill (their chunks read the
    /// whole earlier context on the GPU, staged when needed). `None` for an unknown request;
    /// meaningful once it has started.
    pub fn prefill_end(&self, id: RequestId) -> Option<u32> {
        self.req(id).map(|r| r.prefill_end)
    }

    /// Drops the GPU copies of the resident pages of `prompt`'s full pages from the GPU prefix
    /// cache where no request holds them (blocks of finished requests still in the free queue):
    /// a later request hitting those pages reads them from host (and a prefill chunk stages
    /// them). When the layout backs indexer rows up (`indexer.rs`), the pages' indexer blocks
    /// are dropped as well: the hit restores the keys from the indexer host cache. Host pages
    /// and the regular groups' cached blocks stay. The effect of memory pressure, made
    /// deterministic (tests, simulations). Returns the blocks dropped.
    pub fn drop_cached_gpu_copies(&mut self, prompt: &[u32]) -> u32 {
        let mut t = super::managers::SourceTable::default();
        self.source.hash_prompt(&mut t, prompt);
        let mut dropped = 0;
        let indexer = self.indexer_rows.is_some();
        for &hash in &t.hashes {
            let resident = (0..self.resident.num_buckets()).map(|bk| 2 + bk);
            let groups = indexer.then_some(KvCacheConfig::INDEXER_GROUP as u32);
            for group in resident.chain(groups) {
                let key = BlockKey { group, hash };
                if let Some(b) = self.gpu.lookup(key)
                    && self.gpu.is_free(b)
                    && self.gpu.uncache(b).is_ok()
                {
                    dropped += 1;
                }
            }
        }
        dropped
    }
}
