//! Admission: queueing requests, appending tokens, and starting a waiting request (prefix-cache
//! lookup, copy-on-write tail, accounting for every tier before allocating anything).

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::error::out_of_memory;
use super::managers::{HotRegion, PagedManager, ResidentTable, SourceTable};
use super::request::{Import, NO_ROW, Req, Status};
use super::{Alloc, CoordError, Coordinator, PoolKind, RequestId};

impl Coordinator {
    /// Queues a request with its prompt. It starts in a later [`Coordinator::step`] (or
    /// [`Coordinator::start`]).
    pub fn admit(&mut self, id: RequestId, prompt: &[u32]) -> Result<(), CoordError> {
        if self.ids.contains_key(&id) {
            return Err(CoordError::DuplicateRequest { id });
        }
        if prompt.is_empty() {
            return Err(CoordError::EmptyPrompt { id });
        }
        if prompt.len() as u64 > u64::from(self.kv.max_model_len) {
            return Err(CoordError::TooLong {
                id,
                tokens: prompt.len() as u64,
                max_model_len: self.kv.max_model_len,
            });
        }
        self.check_fits(id, prompt.len() as u32)?;
        self.check_prompt_prefill_fits(id, prompt.len() as u32)?;
        // Everything that can fail is allocated before anything changes.
        let mut tokens = Vec::new();
        tokens
            .try_reserve_exact(prompt.len())
            .map_err(|_| out_of_memory::<u32>("the prompt", prompt.len()))?;
        tokens.extend_from_slice(prompt);
        if self.free_slots.is_empty() {
            // Request storage grows past `max_running` (waiting requests); data-plane rows do not.
            self.reqs
                .try_reserve(1)
                .map_err(|_| out_of_memory::<Option<Box<Req>>>("request records", 1))?;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.reqs.push(None);
                self.reqs.len() as u32 - 1
            }
        };
        self.generation = self.generation.wrapping_add(1);
        self.reqs[slot as usize] = Some(Box::new(Req {
            id,
            generation: self.generation,
            status: Status::Waiting,
            slot,
            row: NO_ROW,
            tokens,
            num_computed: 0,
            rollback_floor: 0,
            gpu_published: 0,
            pages: 0,
            hit_pages: 0,
            last_xfer: 0,
            prefill_end: 0,
            prefill_step: 0,
            scheduled_step: 0,
            import: Import::None,
            source: SourceTable::default(),
            paged: self.paged.new_table(),
            resident: ResidentTable::default(),
            hot: HotRegion::default(),
        }));
        self.ids.insert(id, slot);
        self.waiting.push_back(slot);
        Ok(())
    }

    pub(super) fn check_fits(&self, id: RequestId, tokens: u32) -> Result<(), CoordError> {
        let pages = u64::from(self.kv.pages_for(tokens));
        let host_cap = u64::from(self.kv.host_num_blocks) - 1;
        if pages > host_cap {
            return Err(CoordError::NeverFits {
                id,
                pool: PoolKind::Host,
                needed: pages,
                capacity: host_cap,
            });
        }
        let gpu_cap = u64::from(self.kv.num_gpu_blocks) - 1;
        let need = self.kv.gpu_blocks_per_request(tokens).min_needed();
        if need > gpu_cap {
            return Err(CoordError::NeverFits {
                id,
                pool: PoolKind::Gpu,
                needed: need,
                capacity: gpu_cap,
            });
        }
        Ok(())
    }

    /// Appends tokens (sampled or speculative) to a request; they are computed by later steps.
    pub fn append_tokens(&mut self, id: RequestId, tokens: &[u32]) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        let max = self.kv.max_model_len;
        let r = self.reqs[slot as usize]
            .as_mut()
            .ok_or(CoordError::UnknownRequest { id })?;
        let total = r.tokens.len() as u64 + tokens.len() as u64;
        if total > u64::from(max) {
            return Err(CoordError::TooLong {
                id,
                tokens: total,
                max_model_len: max,
            });
        }
        r.tokens
            .try_reserve(tokens.len())
            .map_err(|_| out_of_memory::<u32>("appended tokens", tokens.len()))?;
        r.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Appends one token to the request in state row `slot` (the hot path for engines that key
    /// by slot). Returns the request's id.
    #[inline]
    pub fn append_token_by_slot(&mut self, slot: u32, token: u32) -> Result<RequestId, CoordError> {
        let max = self.kv.max_model_len;
        let idx = self.row_owner.get(slot as usize).copied().unwrap_or(NO_ROW);
        let r = self
            .reqs
            .get_mut(idx as usize)
            .and_then(Option::as_mut)
            .ok_or(CoordError::UnknownSlot { slot })?;
        if r.tokens.len() as u64 >= u64::from(max) {
            return Err(CoordError::TooLong {
                id: r.id,
                tokens: r.tokens.len() as u64 + 1,
                max_model_len: max,
            });
        }
        r.tokens.push(token);
        Ok(r.id)
    }

    /// Starts the waiting request `id` (prefix-cache lookup, host blocks for the whole prompt,
    /// hit pages without a GPU copy staged on the GPU for the first chunk, a prefill chunk) and
    /// schedules its first chunk of at most `max_tokens`
    /// tokens — fewer when the free GPU pool holds less, so a prompt larger than the free pool
    /// still starts. Admission accounts for every tier it needs before touching anything: host
    /// blocks for every page, GPU blocks for the chunk, re-pinned prefix blocks and staged hit
    /// pages. A prefix hit whose pinned blocks, staged pages and first page could never fit
    /// the GPU pool, even alone, is not used: the prefix is recomputed instead.
    pub fn start(&mut self, id: RequestId, max_tokens: u32) -> Result<Alloc, CoordError> {
        let slot = self.startable(id)?.slot;
        if self.free_rows.is_empty() {
            // A fresh data-plane row is recorded at commit; make room for it first.
            self.row_owner
                .try_reserve(1)
                .map_err(|_| out_of_memory::<u32>("data-plane rows", 1))?;
        }
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownRequest { id });
        };
        let res = match r.import {
            Import::Ready(imported) => self.start_imported(&mut r, imported, max_tokens),
            _ => self.start_inner(&mut r, max_tokens),
        };
        let ok = matches!(res, Ok(Alloc::Scheduled));
        self.reqs[slot as usize] = Some(r);
        self.process_reused();
        if ok {
            if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
                self.waiting.remove(pos);
            }
            self.running.push(slot);
        }
        res
    }

    /// Waiting request `id`, if [`Coordinator::start`] may start it: not refused or running,
    /// not an import whose writes are incomplete, and a data-plane row free.
    pub(super) fn startable(&self, id: RequestId) -> Result<&Req, CoordError> {
        let r = self.req(id).ok_or(CoordError::UnknownRequest { id })?;
        if r.status != Status::Waiting {
            return Err(r.status_error());
        }
        if matches!(r.import, Import::Reserved(_)) {
            return Err(CoordError::Import {
                id,
                what: "its KV is still being written; complete_import first",
            });
        }
        if self.free_rows.is_empty() && self.row_owner.len() >= self.cfg.max_running as usize {
            return Err(CoordError::NoFreeSlot);
        }
        Ok(r)
    }

    /// The first token a start recomputes after a prefix hit of `hit` pages of a `len`-token
    /// prompt: the token after the hit, or — when the hit covers the whole prompt — its last
    /// token (the last token is always computed; its page becomes a copy-on-write tail).
    #[inline]
    fn resume_token(&self, hit: u32, len: u32) -> u32 {
        let end = u64::from(hit) * u64::from(self.kv.block_tokens);
        if end >= u64::from(len) {
            len - 1
        } else {
            end as u32
        }
    }

    /// Longest prefix of `r`'s full pages durable on host whose GPU blocks are still cached:
    /// every page's indexer and full-attention blocks, and in each sliding-window group the
    /// blocks the window of the first recomputed token needs. Indexer blocks need not be
    /// cached when the layout backs indexer rows up (`indexer.rs`): a durable host page has
    /// its keys in the indexer host cache, and the start restores them.
    fn prefix_hit(&self, hashes: &[u64], len: u32) -> u32 {
        let mut hit = 0u32;
        if !self.source.caching() {
            return 0;
        }
        while (hit as usize) < hashes.len() {
            let hash = hashes[hit as usize];
            let indexer_on_host = self.indexer_rows.is_some();
            if !self.source.is_cached(&self.host, hash)
                || !self.paged.is_cached(&self.gpu, hash, indexer_on_host)
            {
                break;
            }
            hit += 1;
        }
        if self.paged.has_window() {
            // Not monotone in the hit length: a window's blocks may be cached at one boundary
            // and evicted at an earlier one. Take the longest hit whose window is there.
            while hit > 0
                && !self
                    .paged
                    .windows_cached(&self.gpu, hashes, hit, self.resume_token(hit, len))
            {
                hit -= 1;
            }
        }
        hit
    }

    /// GPU blocks a start with a prefix hit of `hit` pages (of a `len`-token prompt) holds at
    /// the least: the pinned indexer and regular blocks of the hit, every shared hit page on
    /// the GPU (adopted GPU copies, or staged from host: the first chunk is a prefill chunk,
    /// which reads its whole context there — see `staging.rs`), one new page (the first
    /// chunk, or the copy-on-write tail) with a new block in every regular group. No hot
    /// region: nothing reads from host once the context is staged.
    fn hit_start_footprint(&self, hit: u32, len: u32) -> u64 {
        let cow_tail = u64::from(hit) * u64::from(self.kv.block_tokens) >= u64::from(len);
        let shared = if cow_tail { hit - 1 } else { hit };
        self.paged.hit_pins(hit, self.resume_token(hit, len))
            + u64::from(shared) * u64::from(self.resident.num_buckets())
            + self.gpu_cost_per_page()
            + self.paged.num_groups()
    }

    /// Which of the first `shared` hit pages still have a valid GPU copy of every bucket (its
    /// resident blocks keep their prefix keys until the pool hands them out): `(page, blocks)`
    /// into `out`, blocks flattened, `num_buckets` per page.
    fn adoptable_pages(
        &self,
        hashes: &[u64],
        shared: u32,
        out: &mut Vec<(u32, u32)>,
        blocks: &mut Vec<u32>,
    ) {
        out.clear();
        blocks.clear();
        if !self.source.caching() {
            return;
        }
        let mut page = Vec::new();
        for p in 0..shared {
            if self
                .resident
                .cached_page(&self.gpu, hashes[p as usize], &mut page)
            {
                out.push((p, blocks.len() as u32));
                blocks.extend_from_slice(&page);
            }
        }
    }

    /// Makes `r` running in a data-plane row (a free one, or a fresh one `start` made room for)
    /// and records the row's start; returns the row.
    pub(super) fn take_row(&mut self, r: &mut Req) -> u32 {
        r.status = Status::Running;
        let row = match self.free_rows.pop() {
            Some(row) => row,
            None => {
                self.row_owner.push(NO_ROW);
                self.row_owner.len() as u32 - 1
            }
        };
        self.row_owner[row as usize] = r.slot;
        r.row = row;
        self.out.started.push(row);
        row
    }

    /// What a start of a waiting request with prompt (and recomputed) tokens `tokens`, whose
    /// full pages have prefix hashes `hashes`, does with a budget of `max_tokens`: decided
    /// before anything is pinned, by [`Coordinator::start`] and the admission queries alike.
    pub(super) fn plan_start(&self, tokens: &[u32], hashes: &[u64], max_tokens: u32) -> StartPlan {
        let bt = self.kv.block_tokens;
        let len = tokens.len() as u32;
        let mut hit = self.prefix_hit(hashes, len);
        // The last token is always computed: a hit on every page makes the last page a
        // copy-on-write tail.
        let shared_of = |hit: u32| {
            if hit > 0 && hit * bt >= len {
                hit - 1
            } else {
                hit
            }
        };
        // Hit pages whose GPU copies are still cached are read there (no hot rows for them).
        let (mut adopt, mut adopt_blocks) = (Vec::new(), Vec::new());
        self.adoptable_pages(hashes, shared_of(hit), &mut adopt, &mut adopt_blocks);
        let pool = u64::from(self.gpu.num_blocks() - 1);
        // A hit that could never start, even with the whole pool free, would wait forever:
        // recompute the prefix instead.
        if hit > 0 && self.hit_start_footprint(hit, len) > pool {
            hit = 0;
            adopt.clear();
            adopt_blocks.clear();
        }
        let cow_tail = hit > 0 && hit * bt >= len;
        let shared = shared_of(hit);
        let computed0 = if cow_tail { len - 1 } else { hit * bt };
        let indexer_restores = hashes[..hit as usize]
            .iter()
            .filter(|&&hash| !PagedManager::indexer_cached(&self.gpu, hash))
            .count() as u32;
        StartPlan {
            indexer_restores,
            hit,
            shared,
            cow_tail,
            computed0,
            chunk: (len - computed0).min(max_tokens.max(1)),
            total_pages: self.kv.pages_for(len),
            adopt,
            adopt_blocks,
        }
    }

    /// GPU blocks a start planned as `plan` allocates for a first chunk of `chunk` tokens, once
    /// its hit blocks are pinned: the chunk's new pages and regular columns, the hit pages
    /// without a GPU copy (staged by the first chunk, a prefill chunk), the hit pages' indexer
    /// blocks restored from host and, with a copy-on-write tail, the column of its last token
    /// in every regular group.
    pub(super) fn start_gpu_need(&self, plan: &StartPlan, chunk: u32) -> u64 {
        let bt = self.kv.block_tokens;
        let nb = u64::from(self.resident.num_buckets());
        let staged = u64::from(plan.shared - plan.adopt.len() as u32) * nb;
        let cow_regular = if plan.cow_tail {
            self.paged.num_groups()
        } else {
            0
        };
        let c0 = plan.computed0;
        u64::from((c0 + chunk).div_ceil(bt) - plan.shared) * self.gpu_cost_per_page()
            + staged
            + u64::from(plan.indexer_restores)
            + cow_regular
            + self.paged.hit_regular_need(plan.hit, c0, c0, c0 + chunk)
    }

    pub(super) fn start_inner(
        &mut self,
        r: &mut Box<Req>,
        max_tokens: u32,
    ) -> Result<Alloc, CoordError> {
        // Prefix hashes of the full pages.
        self.source.hash_prompt(&mut r.source, &r.tokens);
        let plan = self.plan_start(&r.tokens, &r.source.hashes, max_tokens);
        let len = r.tokens.len() as u32;
        let StartPlan {
            hit,
            shared,
            cow_tail,
            computed0,
            mut chunk,
            total_pages,
            ref adopt,
            ref adopt_blocks,
            indexer_restores: _,
        } = plan;

        // Pin every hit block first: re-pinning takes a free cached block out of the free
        // queue, and no later allocation (reclaim's hot regions included) may evict it.
        let mut pinned = Ok(());
        for p in 0..hit {
            let hash = r.source.hashes[p as usize];
            pinned = self.source.pin_hit(&mut r.source, &mut self.host, hash);
            if pinned.is_err() {
                break;
            }
        }
        if hit > 0 && pinned.is_ok() {
            pinned = self.paged.pin_hit(
                &mut r.paged,
                &mut self.gpu,
                &r.source.hashes,
                hit,
                computed0,
            );
        }
        let mut adopted_pinned = 0;
        if pinned.is_ok() {
            for &b in adopt_blocks {
                pinned = self.gpu.touch(b);
                if pinned.is_err() {
                    break;
                }
                adopted_pinned += 1;
            }
        }
        let unpin_adopted = |this: &mut Self, n: usize| {
            for &b in adopt_blocks[..n].iter().rev() {
                let _ = this.gpu.free(b);
            }
        };
        if let Err(e) = pinned {
            unpin_adopted(self, adopted_pinned);
            self.source.unpin(&mut r.source, &mut self.host);
            self.paged.unpin(&mut r.paged, &mut self.gpu);
            return Err(e.into());
        }
        // Account for every tier before allocating anything.
        let mut short = None;
        let mut awaits = false;
        if u64::from(self.host.num_free()) < plan.host_need() {
            short = Some(PoolKind::Host);
        } else if u64::from(self.gpu.num_free()) < self.start_gpu_need(&plan, chunk) {
            let want = self.reclaim_want(self.start_gpu_need(&plan, chunk), self.gpu.num_free());
            awaits = self.reclaim(want).1;
            let free = u64::from(self.gpu.num_free());
            if free < self.start_gpu_need(&plan, chunk) {
                // Shrink the first chunk to what the free pool holds (at least one token).
                match largest_fit(chunk, |c| self.start_gpu_need(&plan, c) <= free) {
                    Some(c) => chunk = c,
                    None => short = Some(PoolKind::Gpu),
                }
            }
        }
        // The request's tables, for the whole prompt and as much decode again
        // ([`Coordinator::table_pages`]).
        if short.is_none() {
            let pages = self.table_pages(total_pages);
            let reserved = self
                .source
                .try_reserve(&mut r.source, pages)
                .and_then(|()| self.resident.try_reserve(&mut r.resident, pages))
                .and_then(|()| self.paged.try_reserve(&mut r.paged, pages));
            if let Err(e) = reserved {
                unpin_adopted(self, adopted_pinned);
                self.source.unpin(&mut r.source, &mut self.host);
                self.paged.unpin(&mut r.paged, &mut self.gpu);
                return Err(e);
            }
        }
        if let Some(pool) = short {
            // Unpin (the blocks keep their hashes and go to the tail of the LRU queue).
            unpin_adopted(self, adopted_pinned);
            self.source.unpin(&mut r.source, &mut self.host);
            self.paged.unpin(&mut r.paged, &mut self.gpu);
            return Ok(self.short_of(pool, awaits));
        }

        // Commit.
        let slot = self.take_row(r);
        let nb = self.resident.num_buckets() as usize;
        let mut next_adopted = adopt.iter().peekable();
        for p in 0..hit {
            match next_adopted.next_if(|&&(q, _)| q == p) {
                Some(&(_, at)) => {
                    let at = at as usize;
                    self.resident
                        .push_adopted_page(&mut r.resident, &adopt_blocks[at..at + nb]);
                }
                None => self.resident.push_hit_page(&mut r.resident),
            }
        }
        // Hit pages whose indexer blocks were not cached: their keys come back from host.
        self.paged.restore_uncached_indexer(
            &mut r.paged,
            &mut self.gpu,
            &r.source.blocks,
            &mut self.out,
        );
        if cow_tail {
            // The shared last page gets private copies: host → host, GPU → GPU, and resident
            // blocks restored from the private host copy. The copy-on-write sources are
            // released when the command is built, so no request of this step can be handed
            // them (their copies run before the forward pass).
            let p = (hit - 1) as usize;
            let nbk = self.source.copy_on_write(
                &mut r.source,
                p,
                &mut self.host,
                &mut self.out,
                &mut self.after_build,
            );
            self.paged.copy_on_write(
                &mut r.paged,
                computed0,
                &mut self.gpu,
                &mut self.out,
                &mut self.after_build,
            );
            self.resident
                .restore(&mut r.resident, p, nbk, &mut self.gpu, &mut self.out);
        }
        self.source.hit_tables(&r.source, slot, hit, &mut self.out);
        self.paged.hit_tables(&r.paged, slot, &mut self.out);
        self.resident
            .hit_tables(&r.resident, slot, hit, &mut self.out);
        r.pages = hit;
        r.hit_pages = shared;
        // Adopted pages are clean resident pages like any other: reclaim may unpin them.
        r.resident
            .set_cursors(adopt.first().map_or(shared, |&(p, _)| p), shared);
        r.source.ready_prefix = shared;
        r.num_computed = computed0;
        r.prefill_end = len;
        // Host blocks for the rest of the prompt.
        self.source.grow(
            &mut r.source,
            &mut self.host,
            &mut self.out,
            slot,
            total_pages,
        );
        // The hit pages read from host are staged by the chunk's scheduling.
        let res = self.schedule_inner(r, chunk, false).map(|(alloc, _)| alloc);
        if !matches!(res, Ok(Alloc::Scheduled)) {
            // Accounting said it fits; undo everything if it did not.
            self.release_blocks(r);
            r.status = Status::Waiting;
        }
        res
    }
}

impl Coordinator {
    /// Pages a starting request's tables are reserved for: its `prompt_pages` and as many
    /// again (capped at `max_model_len`'s pages, plus one), so decode grows them without
    /// reallocating (and copying) on the scheduling path for as long as the prompt was long —
    /// the doubling a growing `Vec` would do anyway, done once, where nothing is copied.
    pub(super) fn table_pages(&self, prompt_pages: u32) -> usize {
        let cap = self.kv.max_pages_per_request as usize + 1;
        let want = (prompt_pages as usize).saturating_mul(2).saturating_add(1);
        want.min(cap).max(prompt_pages as usize + 1)
    }
}

/// What a start of a waiting request does ([`Coordinator::plan_start`]).
#[derive(Clone, Debug)]
pub(super) struct StartPlan {
    /// Prefix-hit pages (their host and GPU indexer/regular blocks are pinned).
    pub(super) hit: u32,
    /// Hit pages it shares (all but a copy-on-write tail).
    pub(super) shared: u32,
    /// Whether the hit covers the whole prompt: its last page is copied.
    pub(super) cow_tail: bool,
    /// Tokens computed when it starts (the first recomputed one is the next).
    pub(super) computed0: u32,
    /// Its first chunk, before the free pool shrinks it.
    pub(super) chunk: u32,
    /// Pages of its tokens.
    pub(super) total_pages: u32,
    /// Shared hit pages whose GPU copies it adopts: `(page, index in adopt_blocks)`.
    pub(super) adopt: Vec<(u32, u32)>,
    /// Their blocks, `num_buckets` per page.
    pub(super) adopt_blocks: Vec<u32>,
    /// Hit pages whose indexer blocks are no longer cached: new blocks, restored from the
    /// indexer host cache.
    pub(super) indexer_restores: u32,
}

impl StartPlan {
    /// Host blocks it allocates: one per page it does not share.
    pub(super) fn host_need(&self) -> u64 {
        u64::from(self.total_pages - self.shared)
    }
}

/// The largest `c` in `1..=max` for which `fits(c)` holds, when `fits` is monotone (true up to
/// some point, false after); `None` when not even `fits(1)` holds.
pub(super) fn largest_fit(max: u32, fits: impl Fn(u32) -> bool) -> Option<u32> {
    if max == 0 || !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1u32, max);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}
