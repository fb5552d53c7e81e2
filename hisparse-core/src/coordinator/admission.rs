//! Admission: queueing requests, appending tokens, and starting a waiting request (prefix-cache
//! lookup, copy-on-write tail, accounting for every tier before allocating anything).

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::request::{DIRTY, HASH_SEED, NO_ROW, RECLAIMED, Req, Status, chain_hash};
use super::{
    Alloc, CoordError, Coordinator, HotAssignment, PageTransfer, PoolKind, RequestId, TableUpdate,
};
use crate::ops::BlockPair;
use crate::pool::BlockKey;

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
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                // Request storage grows past `max_running`; data-plane rows do not.
                self.reqs.push(None);
                self.reqs.len() as u32 - 1
            }
        };
        self.generation = self.generation.wrapping_add(1);
        let nr = self.regular_groups.len();
        self.reqs[slot as usize] = Some(Box::new(Req {
            id,
            generation: self.generation,
            status: Status::Waiting,
            slot,
            row: NO_ROW,
            tokens: prompt.to_vec(),
            num_computed: 0,
            pages: 0,
            host: Vec::new(),
            indexer: Vec::new(),
            regular: Vec::new(),
            resident: Vec::new(),
            state: Vec::new(),
            xfer: Vec::new(),
            hashes: Vec::new(),
            hot: Vec::new(),
            reclaim_cursor: 0,
            spill_cursor: 0,
            host_only: 0,
            pending_release: 0,
            ready_prefix: 0,
            hit_pages: 0,
            window_cursor: vec![0; nr],
            last_xfer: 0,
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
        r.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Appends one token to the request in state row `slot` (the hot path for engines that key
    /// by slot). Returns the request's id.
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
    /// hot region if it reads from host) and schedules its first chunk of at most `max_tokens`
    /// tokens. Admission accounts for every tier it needs before touching anything: host blocks
    /// for every page, GPU blocks for the chunk and re-pinned prefix blocks, and the hot region.
    pub fn start(&mut self, id: RequestId, max_tokens: u32) -> Result<Alloc, CoordError> {
        let slot = self.slot_of_id(id)?;
        if self.reqs[slot as usize].as_ref().map(|r| r.status) != Some(Status::Waiting) {
            return Err(CoordError::NotRunning { id });
        }
        if self.free_rows.is_empty() {
            return Err(CoordError::NoFreeSlot);
        }
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownRequest { id });
        };
        let res = self.start_inner(&mut r, max_tokens);
        let ok = matches!(res, Ok(Alloc::Scheduled));
        self.reqs[slot as usize] = Some(r);
        if ok {
            if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
                self.waiting.remove(pos);
            }
            self.running.push(slot);
        }
        res
    }

    pub(super) fn start_inner(
        &mut self,
        r: &mut Box<Req>,
        max_tokens: u32,
    ) -> Result<Alloc, CoordError> {
        let bt = self.kv.block_tokens;
        let len = r.tokens.len() as u32;
        let total_pages = self.kv.pages_for(len);
        // Prefix hashes of the full pages.
        r.hashes.clear();
        let mut h = HASH_SEED;
        for p in 0..len / bt {
            h = chain_hash(h, &r.tokens[(p * bt) as usize..((p + 1) * bt) as usize]);
            r.hashes.push(h);
        }
        // Longest prefix durable on host whose indexer/regular blocks are still on the GPU.
        let mut hit = 0u32;
        if self.cfg.enable_prefix_caching && !self.has_window {
            while (hit as usize) < r.hashes.len() {
                let hash = r.hashes[hit as usize];
                let src = BlockKey { group: 0, hash };
                let idx = BlockKey { group: 1, hash };
                if self.host.lookup(src).is_none() || self.gpu.lookup(idx).is_none() {
                    break;
                }
                if self
                    .regular_groups
                    .iter()
                    .any(|&(g, _)| self.gpu.lookup(BlockKey { group: g, hash }).is_none())
                {
                    break;
                }
                hit += 1;
            }
        }
        // The last token is always computed: a hit on every page makes the last page a
        // copy-on-write tail.
        let cow_tail = hit > 0 && hit * bt >= len;
        let shared = if cow_tail { hit - 1 } else { hit };
        let computed0 = if cow_tail { len - 1 } else { hit * bt };
        let chunk = (len - computed0).min(max_tokens.max(1));
        let target = computed0 + chunk;
        let target_pages = self.kv.pages_for(target);

        // Pin every hit block first: re-pinning takes a free cached block out of the free
        // queue, and no later allocation (reclaim's hot regions included) may evict it.
        let nb = self.num_buckets as usize;
        let nr = self.regular_groups.len();
        for p in 0..hit {
            let hash = r.hashes[p as usize];
            let hb = self.host.lookup(BlockKey { group: 0, hash }).unwrap_or(0);
            let ib = self.gpu.lookup(BlockKey { group: 1, hash }).unwrap_or(0);
            self.host.touch(hb)?;
            self.gpu.touch(ib)?;
            r.host.push(hb);
            r.indexer.push(ib);
            for gi in 0..nr {
                let g = self.regular_groups[gi].0;
                let b = self.gpu.lookup(BlockKey { group: g, hash }).unwrap_or(0);
                self.gpu.touch(b)?;
                r.regular.push(b);
            }
        }
        // Account for every tier before allocating anything.
        let host_need = u64::from(total_pages - shared);
        let new_gpu_pages = u64::from(target_pages - shared);
        let hot = if shared > 0 {
            u64::from(self.hot_cost())
        } else {
            0
        };
        let gpu_need = new_gpu_pages * self.gpu_cost_per_page() + hot;
        let mut short = None;
        if u64::from(self.host.num_free()) < host_need {
            short = Some(PoolKind::Host);
        } else if u64::from(self.gpu.num_free()) < gpu_need {
            let want = (gpu_need - u64::from(self.gpu.num_free()))
                .max(u64::from(self.cfg.reclaim_min_blocks));
            self.reclaim_resident_blocks(want.min(u64::from(u32::MAX)) as u32);
            if u64::from(self.gpu.num_free()) < gpu_need {
                short = Some(PoolKind::Gpu);
            }
        }
        if let Some(pool) = short {
            // Unpin (the blocks keep their hashes and go to the tail of the LRU queue).
            let _ = self.host.free_reverse(&r.host);
            let _ = self.gpu.free_reverse(&r.regular);
            let _ = self.gpu.free_reverse(&r.indexer);
            r.host.clear();
            r.indexer.clear();
            r.regular.clear();
            return Ok(if self.io_in_flight() {
                Alloc::Wait
            } else {
                Alloc::NoSpace(pool)
            });
        }

        // Commit.
        r.status = Status::Running;
        let row = self.free_rows.pop().unwrap_or(NO_ROW);
        self.row_owner[row as usize] = r.slot;
        r.row = row;
        self.out.started.push(row);
        let slot = row;
        let cap = self.kv.max_pages_per_request as usize;
        r.host.reserve(cap);
        r.state.reserve(cap);
        r.xfer.reserve(cap);
        r.indexer.reserve(cap);
        r.resident.reserve(cap * nb);
        r.regular.reserve(cap * nr);
        for _ in 0..hit {
            for _ in 0..nb {
                r.resident.push(0);
            }
            r.state.push(RECLAIMED);
            r.xfer.push(0);
        }
        if cow_tail {
            // The shared last page gets private copies: host → host, GPU → GPU, and resident
            // blocks restored from the private host copy.
            let p = (hit - 1) as usize;
            let old = r.host[p];
            let nbk = self.host.allocate().unwrap_or(0);
            self.out.host_cow.push(BlockPair { src: old, dst: nbk });
            self.out.new_host_blocks.push(nbk);
            // The copy-on-write source is released when the command is built, so no request
            // of this step can be handed it (its copy runs before the forward pass).
            self.after_build.push((PoolKind::Host, old));
            r.host[p] = nbk;
            for b in core::iter::once(&mut r.indexer[p]).chain(&mut r.regular[p * nr..(p + 1) * nr])
            {
                let nbk = self.gpu.allocate().unwrap_or(0);
                self.out.gpu_cow.push(BlockPair { src: *b, dst: nbk });
                self.after_build.push((PoolKind::Gpu, *b));
                *b = nbk;
            }
            for bk in 0..nb {
                let rb = self.gpu.allocate().unwrap_or(0);
                r.resident[p * nb + bk] = rb;
                self.out.restores.push(PageTransfer {
                    bucket: bk as u32,
                    device_block: rb,
                    host_block: nbk,
                });
            }
            // Rows 0..block_size-1 are restored; the last row is written by the forward.
            r.state[p] = DIRTY;
        }
        for p in 0..hit {
            let pu = p as usize;
            self.out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: p,
                block: r.host[pu],
            });
            self.out.block_tables.push(TableUpdate {
                slot,
                group: 1,
                page: p,
                block: r.indexer[pu],
            });
            for gi in 0..nr {
                self.out.block_tables.push(TableUpdate {
                    slot,
                    group: self.regular_groups[gi].0,
                    page: p,
                    block: r.regular[pu * nr + gi],
                });
            }
            for bk in 0..nb {
                self.out.residency.push(TableUpdate {
                    slot,
                    group: self.kv.resident_group(bk as u32) as u32,
                    page: p,
                    block: r.resident[pu * nb + bk],
                });
            }
        }
        r.pages = hit;
        r.hit_pages = shared;
        r.host_only = shared;
        r.reclaim_cursor = shared;
        r.spill_cursor = shared;
        r.ready_prefix = shared;
        r.num_computed = computed0;
        for c in r.window_cursor.iter_mut() {
            *c = 0;
        }
        // Host blocks for the rest of the prompt.
        for p in hit..total_pages {
            let b = self.host.allocate().unwrap_or(0);
            r.host.push(b);
            self.out.new_host_blocks.push(b);
            self.out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: p,
                block: b,
            });
        }
        if shared > 0 {
            self.give_hot_region(r);
        }
        let res = self.schedule_inner(r, chunk);
        if !matches!(res, Ok(Alloc::Scheduled)) {
            // Accounting said it fits; undo everything if it did not.
            self.release_blocks(r);
            r.status = Status::Waiting;
        }
        res
    }

    pub(super) fn give_hot_region(&mut self, r: &mut Req) {
        if !r.hot.is_empty() {
            return;
        }
        let cost = self.hot_cost();
        if self.gpu.num_free() < cost {
            // Callers account for the region first; never hand out a partial one.
            return;
        }
        r.hot.reserve(cost as usize);
        for _ in 0..cost {
            if let Some(b) = self.gpu.allocate() {
                r.hot.push(b);
            }
        }
        for b in 0..self.num_buckets {
            let s = (b * self.hot_per) as usize;
            self.out.hot_assign.push(HotAssignment {
                slot: r.row,
                group: self.kv.hot_group(b) as u32,
                blocks: r.hot[s..s + self.hot_per as usize].to_vec(),
            });
        }
    }
}
