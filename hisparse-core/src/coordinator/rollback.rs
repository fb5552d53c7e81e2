//! Speculative decoding: [`Coordinator::rollback`] gives back the draft tokens a step computed
//! and the verifier rejected.
//!
//! A speculative step computes `1 + s` tokens of a request (`max_query_len = 1 + s`): its last
//! sampled token and `s` drafts. When the forward pass accepts `a` of the drafts, the engine
//! rolls back the other `s - a` and appends the token it sampled. What a rollback undoes:
//!
//! * the tokens (and any uncomputed ones after them) leave the request; `num_computed` drops;
//! * pages the rejected tokens had filled are no longer full: they return to `dirty` (a copy in
//!   flight for them still completes, but no longer makes them clean: the rows it wrote are
//!   rewritten and mirrored again when the tokens that replace them are computed), their prefix
//!   hashes are withdrawn from the GPU (indexer, regular and resident groups) and host prefix caches, and the durable prefix shrinks
//!   to the pages still full;
//! * nothing else moves: the pages, host blocks and regular blocks stay allocated for the
//!   tokens that replace the rejected ones, and the sliding windows were kept wide enough for
//!   it ([`crate::layout::KvCacheConfig::window_tokens`]).
//!
//! Rejected rows are never read from host: a page holding one is at the request's tail, which
//! is never reclaimed, so no hot slot can cache its rows. A rollback that would reach into an
//! unpinned or reclaimed page, give back more than `max_query_len - 1` computed tokens, or give back the
//! first token of the request's last step is refused ([`CoordError::RollbackTooFar`]), with
//! nothing changed; so is a rollback of computed tokens of a request the open step scheduled,
//! before its command is built ([`CoordError::RollbackInOpenStep`]: the command would still
//! compute them) — roll back after the step's forward pass, before scheduling the next.

use super::request::Status;
use super::{CoordError, Coordinator, RequestId};
use crate::pool::BlockPool;

impl Coordinator {
    /// Removes the last `num_tokens` tokens of running request `id` (rejected speculative
    /// tokens, and any appended but not yet computed): see the module docs. At most
    /// `max_query_len - 1` of them may be computed ones, all computed in the request's last
    /// step after its first token. Call it between steps (after the command of the step that
    /// computed the drafts is built, before the next is scheduled):
    /// [`CoordError::RollbackInOpenStep`] otherwise.
    pub fn rollback(&mut self, id: RequestId, num_tokens: u32) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownRequest { id });
        };
        let res = self.rollback_inner(&mut r, num_tokens);
        self.reqs[slot as usize] = Some(r);
        res
    }

    fn rollback_inner(
        &mut self,
        r: &mut super::request::Req,
        num_tokens: u32,
    ) -> Result<(), CoordError> {
        let id = r.id;
        if r.status != Status::Running {
            return Err(r.status_error());
        }
        let len = r.tokens.len() as u32;
        let uncomputed = len - r.num_computed;
        let computed_back = num_tokens.saturating_sub(uncomputed);
        // The open step's command, not built yet, computes its tokens: giving them back now
        // would leave it computing tokens the request no longer has.
        let open = self.step_no + 1;
        if computed_back > 0 && r.scheduled_step == open {
            return Err(CoordError::RollbackInOpenStep { id, step: open });
        }
        let floor = r.rollback_floor.min(r.num_computed);
        let mut allowed = r.num_computed - floor;
        // Never into a page that is reclaimed or marked for release (outside prefix hits).
        let bt = self.kv.block_tokens;
        let limit_of = |c: u32| self.resident.reclaim_limit(r.pages, c);
        while allowed > 0 {
            let c = r.num_computed - allowed;
            // Prefix-hit pages that were never resident may sit in the active tail (they read
            // from host from the start), but a hit page staged on the GPU and then unpinned
            // would fall back to host inside the tail: a rollback stops before it.
            let blocked = (limit_of(c)..r.pages).any(|p| {
                self.resident.is_leaving(&r.resident, p)
                    || (p >= r.hit_pages && self.resident.is_released(&r.resident, p))
            });
            if !blocked {
                break;
            }
            allowed -= 1;
        }
        if num_tokens >= len || computed_back > allowed {
            return Err(CoordError::RollbackTooFar {
                id,
                requested: computed_back.max(num_tokens.saturating_sub(len - 1)),
                allowed,
            });
        }
        let new_len = len - num_tokens;
        r.tokens.truncate(new_len as usize);
        // The prompt's pages were hashed at start: a page whose tokens left is no longer full
        // of them, and its hash must not be published for what replaces them.
        r.source.hashes.truncate((new_len / bt) as usize);
        if computed_back == 0 {
            return Ok(());
        }
        let old_sealed = r.num_computed / bt;
        r.num_computed -= computed_back;
        let sealed = r.num_computed / bt;
        for p in sealed..old_sealed {
            self.resident.unseal(&mut r.resident, p);
        }
        // Prefix hashes of pages no longer full.
        if sealed < old_sealed {
            self.paged
                .unpublish(&r.paged, &mut self.gpu, sealed.max(r.hit_pages)..old_sealed);
            self.resident
                .unpublish(&r.resident, &mut self.gpu, sealed..old_sealed);
            unpublish_host(
                &mut self.host,
                &r.source.blocks,
                sealed,
                r.source.ready_prefix,
            );
            r.source.ready_prefix = r.source.ready_prefix.min(sealed);
            r.source.hashes.truncate(sealed as usize);
            r.resident.lower_spill_cursor(sealed);
        }
        Ok(())
    }
}

/// Withdraws the host prefix hashes of pages `from..ready` (published while durable).
fn unpublish_host(host: &mut BlockPool, blocks: &[u32], from: u32, ready: u32) {
    for p in from..ready {
        if let Some(&b) = blocks.get(p as usize) {
            let _ = host.uncache(b);
        }
    }
}
