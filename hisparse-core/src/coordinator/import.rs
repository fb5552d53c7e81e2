//! Imported requests: a request whose KV another party (a prefill node, through a transfer
//! engine) writes straight into this coordinator's host pool.
//!
//! The decode side drives it in three calls:
//!
//! 1. [`Coordinator::reserve_import`] names the host blocks: one per page of the tokens whose
//!    KV is imported, in page order. The request holds them and nothing else; it is not queued.
//! 2. The transfer engine writes every page's sparse rows (every layer of the source group, as
//!    a device → host page copy would) into those blocks, then the engine calls
//!    [`Coordinator::complete_import`]: the pages are durable, the request is queued.
//! 3. A later step starts it like any waiting request: the full pages are read from host (the
//!    request gets a hot region) — or, when a hot region could never fit the GPU pool beside
//!    them (a short prompt on a pool sized for its pages), restored to the GPU, clean, with no
//!    hot region —, the partial last page, if any, is restored to the GPU (the next token is
//!    written there), the indexer and regular groups get GPU blocks for the
//!    imported context — which the engine fills before the first forward pass that reads them:
//!    they are GPU-only groups the transfer engine also carries — and the tokens after the
//!    imported ones are scheduled. Full pages are published in the host prefix cache at once
//!    (they are durable).
//!
//! [`Coordinator::finish`] aborts an import at any point; before the writes are complete, call
//! it only once the transfer engine has stopped writing the blocks (they return to the pool).

use alloc::vec::Vec;

use super::admission::largest_fit;
use super::error::out_of_memory;
use super::request::{Import, Req, Status};
use super::{Alloc, CoordError, Coordinator, PoolKind, RequestId};

impl Coordinator {
    /// Admits request `id` whose KV for its first `imported` tokens (of `tokens`: the prompt
    /// and the tokens sampled so far) another party writes into the host pool, and returns the
    /// host block of every page of those tokens, in page order. At least one token must be
    /// left to compute (the first sampled one, usually): `0 < imported < tokens.len()`.
    /// Refuses, with nothing changed, what [`Coordinator::admit`] refuses, and a host pool
    /// without the blocks free now, those of its pages and of the page its next token writes
    /// ([`CoordError::Import`]: retry once requests finish).
    pub fn reserve_import(
        &mut self,
        id: RequestId,
        tokens: &[u32],
        imported: u32,
    ) -> Result<Vec<u32>, CoordError> {
        if self.ids.contains_key(&id) {
            return Err(CoordError::DuplicateRequest { id });
        }
        if imported == 0 || imported as usize >= tokens.len() {
            return Err(CoordError::Import {
                id,
                what: "import the KV of between 1 and all but the last of its tokens (the next forward pass computes at least one)",
            });
        }
        let pages = self.kv.pages_for(imported);
        // Room for the page of its next token too (not taken): queued imports hold host blocks
        // no preemption frees, so the newest of them can always start once nothing runs.
        if self.kv.pages_for(imported + 1) > self.host.num_free() {
            return Err(CoordError::Import {
                id,
                what: "the host pool lacks free blocks for its pages and its next token's now; retry once requests finish",
            });
        }
        let mut blocks = Vec::new();
        blocks
            .try_reserve_exact(pages as usize)
            .map_err(|_| out_of_memory::<u32>("imported host blocks", pages as usize))?;
        self.admit(id, tokens)?;
        let slot = self.slot_of_id(id)?;
        // Not queued until the writes are complete.
        if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
            self.waiting.remove(pos);
        }
        let Some(r) = self.reqs[slot as usize].as_mut() else {
            return Err(CoordError::UnknownRequest { id });
        };
        if let Err(e) = self.source.try_reserve(&mut r.source, pages as usize + 1) {
            self.ids.remove(&id);
            self.reqs[slot as usize] = None;
            self.free_slots.push(slot);
            return Err(e);
        }
        for _ in 0..pages {
            let b = self.host.allocate().unwrap_or(0);
            r.source.blocks.push(b);
            blocks.push(b);
        }
        r.import = Import::Reserved(imported);
        Ok(blocks)
    }

    /// The host blocks [`Coordinator::reserve_import`] named for request `id`, while its import
    /// is not complete.
    pub fn import_blocks(&self, id: RequestId) -> Option<&[u32]> {
        self.req(id)
            .filter(|r| matches!(r.import, Import::Reserved(_)))
            .map(|r| r.source.blocks.as_slice())
    }

    /// Every page [`Coordinator::reserve_import`] named for `id` is written: the request is
    /// queued (behind the waiting requests), its imported pages durable on host.
    pub fn complete_import(&mut self, id: RequestId) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        let Some(r) = self.reqs[slot as usize].as_mut() else {
            return Err(CoordError::UnknownRequest { id });
        };
        let Import::Reserved(n) = r.import else {
            return Err(CoordError::Import {
                id,
                what: "no import of it is waiting for its writes; reserve_import first, complete it once",
            });
        };
        r.import = Import::Ready(n);
        self.waiting.push_back(slot);
        Ok(())
    }

    /// What a start of imported request `r` (the KV of its first `imported` tokens durable in
    /// its host blocks) does with a budget of `max_tokens`: decided before anything changes, by
    /// [`Coordinator::start`] and the admission queries alike.
    pub(super) fn plan_import_start(&self, r: &Req, imported: u32, max_tokens: u32) -> ImportPlan {
        let bt = self.kv.block_tokens;
        let len = r.tokens.len() as u32;
        let full = imported / bt;
        let partial_restore = u32::from(!imported.is_multiple_of(bt));
        let mut plan = ImportPlan {
            imported,
            chunk: (len - imported).min(max_tokens.max(1)),
            restored: partial_restore,
            hot: 0,
        };
        // Full pages are read from host through a hot region — unless that could never fit
        // the GPU pool, even with the whole pool free (a hot region larger than the pages it
        // spares: short prompts): then every imported page is restored to the GPU instead and
        // the request starts fully resident, as `check_fits` (the cheaper of the two) admitted
        // it. Waiting for the hot region would wait forever.
        if full > 0 {
            plan.hot = u64::from(self.hot.cost());
            let pool = u64::from(self.gpu.num_blocks() - 1);
            if self.import_gpu_need(&plan, r, 1) > pool {
                plan.restored = self.kv.pages_for(imported);
                plan.hot = 0;
            }
        }
        plan
    }

    /// GPU blocks a start planned as `plan` takes for a first chunk of `chunk` tokens: the
    /// imported context's indexer blocks and regular columns, the restored pages (the partial
    /// one, or every page), then the chunk's new pages and columns, and the hot region when
    /// full pages are read from host.
    pub(super) fn import_gpu_need(&self, plan: &ImportPlan, r: &Req, chunk: u32) -> u64 {
        let nb = u64::from(self.resident.num_buckets());
        let pages = self.kv.pages_for(plan.imported);
        let target = plan.imported + chunk;
        u64::from(pages) * self.paged.blocks_per_page()
            + u64::from(plan.restored) * nb
            + u64::from(self.kv.pages_for(target) - pages) * self.gpu_cost_per_page()
            + self.paged.regular_need(&r.paged, plan.imported, target)
            + plan.hot
    }

    /// Host blocks a start planned as `plan` allocates for a first chunk of `chunk` tokens: the
    /// pages the chunk starts (the imported ones are held).
    pub(super) fn import_host_need(&self, plan: &ImportPlan, chunk: u32) -> u32 {
        self.kv.pages_for(plan.imported + chunk) - self.kv.pages_for(plan.imported)
    }

    /// Starts an imported request whose writes are complete (see the module docs) and schedules
    /// up to `max_tokens` of the tokens after the imported ones. Accounts for every GPU block
    /// first; answers like [`Coordinator::start`] when they are short.
    pub(super) fn start_imported(
        &mut self,
        r: &mut alloc::boxed::Box<Req>,
        imported: u32,
        max_tokens: u32,
    ) -> Result<Alloc, CoordError> {
        let bt = self.kv.block_tokens;
        let pages = self.kv.pages_for(imported);
        let full = imported / bt;
        let partial = !imported.is_multiple_of(bt);
        let plan = self.plan_import_start(r, imported, max_tokens);
        let restore_all = full > 0 && plan.hot == 0;
        let mut chunk = plan.chunk;
        let mut short = None;
        let mut awaits = false;
        let host_free = self.host.num_free();
        if self.import_host_need(&plan, chunk) > host_free {
            match largest_fit(chunk, |c| self.import_host_need(&plan, c) <= host_free) {
                Some(c) => chunk = c,
                None => short = Some(PoolKind::Host),
            }
        }
        if short.is_none() && u64::from(self.gpu.num_free()) < self.import_gpu_need(&plan, r, chunk)
        {
            let want =
                self.reclaim_want(self.import_gpu_need(&plan, r, chunk), self.gpu.num_free());
            awaits = self.reclaim(want).1;
            let free = u64::from(self.gpu.num_free());
            if free < self.import_gpu_need(&plan, r, chunk) {
                match largest_fit(chunk, |c| self.import_gpu_need(&plan, r, c) <= free) {
                    Some(c) => chunk = c,
                    None => short = Some(PoolKind::Gpu),
                }
            }
        }
        if short.is_none() {
            let table = self.table_pages(pages);
            let reserved = self
                .resident
                .try_reserve(&mut r.resident, table)
                .and_then(|()| self.paged.try_reserve(&mut r.paged, table));
            reserved?;
        }
        if let Some(pool) = short {
            return Ok(self.short_of(pool, awaits));
        }
        // Commit.
        let row = self.take_row(r);
        let slot = row;
        r.import = Import::None;
        // The tokens after the imported ones (the first sampled one) are decode: they read the
        // imported pages through the hot region, not staged.
        r.prefill_end = imported;
        for p in 0..pages {
            self.paged
                .allocate_page(&mut r.paged, &mut self.gpu, &mut self.out, slot, p);
        }
        if self.paged.has_regular() {
            self.paged.allocate_columns(
                &mut r.paged,
                &mut self.gpu,
                &mut self.out,
                slot,
                imported,
                imported,
            );
        }
        // Its keys: the transfer wrote them into the indexer host cache with the KV rows.
        if self.indexer_rows.is_some() {
            super::indexer::plan_restores(
                0..pages,
                &r.paged.indexer,
                &r.source.blocks,
                &mut self.out.indexer_restores,
            );
        }
        for _ in 0..pages {
            self.resident.push_hit_page(&mut r.resident);
        }
        if restore_all {
            // Full pages come back clean (their host copies are durable and published).
            for p in 0..full as usize {
                let hb = r.source.blocks[p];
                self.resident
                    .restore_clean(&mut r.resident, p, hb, &mut self.gpu, &mut self.out);
            }
        }
        if partial {
            let hb = r.source.blocks[full as usize];
            self.resident.restore(
                &mut r.resident,
                full as usize,
                hb,
                &mut self.gpu,
                &mut self.out,
            );
        }
        self.resident
            .hit_tables(&r.resident, slot, pages, &mut self.out);
        self.source
            .hit_tables(&r.source, slot, pages, &mut self.out);
        self.source
            .hash_prompt(&mut r.source, &r.tokens[..imported as usize]);
        for p in 0..full as usize {
            self.source
                .publish(&mut self.host, r.source.blocks[p], r.source.hashes[p]);
        }
        r.pages = pages;
        r.hit_pages = full;
        // Restored full pages are clean resident pages like any other: reclaim may unpin them.
        r.resident
            .set_cursors(if restore_all { 0 } else { full }, full);
        r.source.ready_prefix = full;
        r.num_computed = imported;
        if r.resident.host_only() > 0 {
            self.hot
                .give(&mut r.hot, &mut self.gpu, &mut self.out, r.row);
        }
        let res = self.schedule_inner(r, chunk, false).map(|(alloc, _)| alloc);
        if !matches!(res, Ok(Alloc::Scheduled)) {
            // Accounting said it fits; undo everything if it did not (the request then starts
            // over as an ordinary one: its tokens are recomputed).
            self.release_blocks(r);
            r.status = Status::Waiting;
        }
        res
    }
}

/// What a start of an imported request does ([`Coordinator::plan_import_start`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct ImportPlan {
    /// Tokens whose KV is imported.
    pub(super) imported: u32,
    /// Its first chunk, before the free pools shrink it.
    pub(super) chunk: u32,
    /// Imported pages restored to the GPU: the partial last one, or every one when a hot region
    /// could never fit beside them.
    pub(super) restored: u32,
    /// GPU blocks of the hot region it takes (0 when none: no full page read from host).
    pub(super) hot: u64,
}
