//! The per-layer decode path: top-k positions in, attention row indices out.
//!
//! Per index group and step the runtime either remaps the top-k through the resident tables
//! (every request of the call fully resident: every scheduled request
//! ([`OffloadCommand::fully_resident`]), or every request of the batch given to
//! [`Runtime::set_batch`]) or resolves it against the group's hot state and gathers the misses
//! from the pinned host pool into the hot rows, in one [`Device::resolve_and_gather`] call (a
//! backend may overlap the two): over the leader and its followers
//! ([`Runtime::resolve_index_group`]), or over the leader alone ([`Runtime::resolve_leader`]),
//! each follower then applying the same plan with [`Runtime::apply_plan`]. Everything is
//! enqueued on the compute stream from device buffers only: no host synchronisation, so the
//! calls can be captured in a CUDA graph (on the engine's stream, passed to
//! [`Runtime::with_pools`]) and the graph replayed in later steps, as long as the batch keeps its
//! size and the steps take the same path (remap or resolve, decided when the calls are made).
//! Replayed calls are not seen by the runtime's host side, so [`crate::Counters`] do not count
//! them.
//!
//! [`OffloadCommand::fully_resident`]: hisparse_core::coordinator::OffloadCommand::fully_resident

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::{
    GatherArgs, GatherDesc, RemapArgs, RemapDesc, ResolveArgs, TableWrite, TableWriteDesc,
};

use crate::error::RuntimeError;
use crate::runtime::{GroupCall, OpenStep, Runtime};

/// One per-layer call's top-k input.
#[derive(Debug)]
pub struct TopK<'a, B> {
    /// `i32[num_tokens][top_k]` token positions (`-1` = none).
    pub positions: &'a B,
    /// Token rows.
    pub num_tokens: u32,
    /// `i32[num_tokens]` state row of each token row (`-1` = padding), or `None` for the batch
    /// set by [`Runtime::set_batch`].
    pub state_rows: Option<&'a B>,
}

/// Where a per-layer call writes its outputs.
#[derive(Debug)]
pub struct Indices<'a, B> {
    /// `i32[num_tokens][top_k]` physical rows in the flat attention view of the device pool
    /// (`block * attention_block_stride + offset`), `-1` for entries with no row.
    pub rows: &'a mut B,
    /// `i32[num_tokens]` valid entries per token row, when wanted.
    pub counts: Option<&'a mut B>,
}

/// Which layers of an index group a call swaps in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layers {
    /// The leader and every follower, in one gather.
    All,
    /// The leader only; followers call [`Runtime::apply_plan`] later.
    Leader,
}

/// What [`Runtime::layer_call`] found for one per-layer call.
struct LayerCall<'a, B> {
    /// The open step.
    open: OpenStep,
    /// The call's own state rows ([`TopK::state_rows`]), or `None` for the batch
    /// [`Runtime::set_batch`] gave (`Runtime::batch`, which the caller borrows itself).
    given: Option<&'a B>,
    /// Whether every state row the call reads is fully resident: the step's
    /// [`OffloadCommand::fully_resident`] for given rows, the batch's own residency otherwise.
    ///
    /// [`OffloadCommand::fully_resident`]: hisparse_core::coordinator::OffloadCommand::fully_resident
    fully_resident: bool,
}

/// The remap of `num_tokens` token rows through the resident tables of `kv`'s layout, over
/// `table_rows` state rows.
fn resident_remap(
    kv: &KvCacheConfig,
    table_rows: u32,
    num_tokens: u32,
    write_counts: bool,
) -> RemapDesc {
    RemapDesc {
        num_tokens,
        top_k: kv.config.top_k,
        table_rows,
        max_blocks: kv.max_pages_per_request,
        block_size: kv.block_size,
        block_stride_rows: kv.attention_block_stride,
        idx_mapping_len: None,
        write_counts,
        compact: false,
    }
}

impl<D: Device> Runtime<D> {
    /// Sets the current step's batch: `state_rows[t]` is the state row of token row `t` (`-1` =
    /// padding). Per-layer calls whose [`TopK::state_rows`] is `None` use it. Written on the
    /// compute stream (stream-ordered, no host synchronisation).
    pub fn set_batch(&mut self, state_rows: &[i32]) -> Result<(), RuntimeError<D::Error>> {
        if self.open.is_none() {
            return Err(RuntimeError::Sequence("set_batch outside a step"));
        }
        let n = state_rows.len() as u32;
        if n > self.cfg.max_step_tokens {
            return Err(RuntimeError::TooManyTokens {
                tokens: n,
                max: self.cfg.max_step_tokens,
            });
        }
        for &r in state_rows {
            if r >= self.cfg.state_rows as i32 {
                return Err(RuntimeError::StateRow {
                    row: r as u32,
                    rows: self.cfg.state_rows,
                });
            }
        }
        let writes: Vec<TableWrite> = state_rows
            .iter()
            .enumerate()
            .map(|(i, &value)| TableWrite {
                index: i as u32,
                value,
            })
            .collect();
        self.dev
            .write_table(
                &self.compute,
                &TableWriteDesc {
                    table_len: self.cfg.max_step_tokens,
                },
                &writes,
                &mut self.batch,
            )
            .map_err(RuntimeError::device("writing the batch"))?;
        self.batch_len = Some(n);
        let open = self.open.expect("checked above");
        self.batch_fully_resident = open.fully_resident
            || state_rows
                .iter()
                .all(|&r| r < 0 || self.row_fully_resident[r as usize]);
        Ok(())
    }

    /// Resolves index group `group`'s top-k for this step and swaps in every layer of the group
    /// (leader and followers, one gather). The usual call when the engine resolves once per
    /// index group before the group's attention layers.
    pub fn resolve_index_group(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.resolve(group, topk, out, Layers::All)
    }

    /// Resolves index group `group`'s top-k and swaps in the leader layer only (the original
    /// system's `resolve_topk` + `swap_in`); each follower layer then calls
    /// [`Runtime::apply_plan`] when its attention is due. The followers read the same `rows`.
    pub fn resolve_leader(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.resolve(group, topk, out, Layers::Leader)
    }

    /// A prefill chunk's read of index group `group`: remaps the top-k positions of its token
    /// rows through the resident tables whatever the step's residency — the coordinator has
    /// staged every page of a prefill chunk's context on the GPU, so no entry of its context is
    /// null and nothing is swapped in (the hot state is not touched). `topk.state_rows` names
    /// each token row's state row (`None`: the batch given to [`Runtime::set_batch`]); outputs
    /// as for [`Runtime::resolve_index_group`], counts only when asked for.
    pub fn remap_prefill(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let call = self.layer_call(group, topk)?;
        let req_id = call.given.unwrap_or(&self.batch);
        let b = self.groups[group].bucket as usize;
        let Indices { rows, counts } = out;
        let desc = resident_remap(
            &self.kv,
            self.cfg.state_rows,
            topk.num_tokens,
            counts.is_some(),
        );
        self.dev
            .remap(
                &self.compute,
                &desc,
                RemapArgs {
                    req_id,
                    block_table: &self.tables.resident[b].buf,
                    topk: topk.positions,
                    idx_mapping: None,
                    out: rows,
                    counts,
                },
            )
            .map_err(RuntimeError::device("remapping prefill top-k rows"))?;
        self.counters.prefill_remap_calls += 1;
        Ok(())
    }

    /// Swaps in follower layer `layer` with its leader's plan of this step (the original
    /// system's `apply_plan`). A no-op on fully-resident steps (the remap needs no swap-in).
    pub fn apply_plan(&mut self, layer: u32) -> Result<(), RuntimeError<D::Error>> {
        if self.open.is_none() {
            return Err(RuntimeError::Sequence("apply_plan outside a step"));
        }
        let (g, li) = self
            .groups
            .iter()
            .enumerate()
            .find_map(|(g, gs)| {
                gs.layers
                    .iter()
                    .position(|&l| l == layer)
                    .filter(|&i| i > 0)
                    .map(|i| (g, i))
            })
            .ok_or(RuntimeError::NoSuchGroup {
                what: "follower layer",
                value: layer,
            })?;
        let gs = &self.groups[g];
        let call = gs.call.ok_or(RuntimeError::Sequence(
            "apply_plan before its leader's resolve_leader in this step",
        ))?;
        if !call.resolved {
            return Ok(());
        }
        let (src, dst) = gs.plan.as_ref().ok_or(RuntimeError::Sequence(
            "apply_plan for a group without followers",
        ))?;
        let desc = GatherDesc {
            num_tokens: call.tokens,
            top_k: self.kv.config.top_k,
            layers: &gs.pairs[li..li + 1],
        };
        self.dev
            .gather_rows(
                &self.compute,
                &desc,
                GatherArgs {
                    plan_src: src,
                    plan_dst: dst,
                    plan_counts: &gs.misses,
                    host: &self.pools.host,
                    device: &mut self.pools.device,
                },
            )
            .map_err(RuntimeError::device(
                "applying a leader's plan to a follower",
            ))?;
        self.counters.follower_gathers += 1;
        Ok(())
    }

    /// The checks every per-layer call starts with — a step is open, `group` exists, the token
    /// rows fit the configuration, and the state rows are given or a batch of at least as many
    /// rows was set — and what they found. The batch itself is not borrowed here, so the caller
    /// can borrow it beside an index group's state.
    fn layer_call<'a>(
        &self,
        group: usize,
        topk: &TopK<'a, D::Buffer>,
    ) -> Result<LayerCall<'a, D::Buffer>, RuntimeError<D::Error>> {
        let open = self
            .open
            .ok_or(RuntimeError::Sequence("a per-layer call outside a step"))?;
        if group >= self.groups.len() {
            return Err(RuntimeError::NoSuchGroup {
                what: "index group",
                value: group as u32,
            });
        }
        let t = topk.num_tokens;
        if t > self.cfg.max_step_tokens {
            return Err(RuntimeError::TooManyTokens {
                tokens: t,
                max: self.cfg.max_step_tokens,
            });
        }
        let fully_resident = match (topk.state_rows, self.batch_len) {
            (Some(_), _) => open.fully_resident,
            (None, Some(n)) if n >= t => self.batch_fully_resident,
            (None, Some(_)) => {
                return Err(RuntimeError::Sequence(
                    "a per-layer call with more token rows than the batch set_batch gave",
                ));
            }
            (None, None) => {
                return Err(RuntimeError::Sequence(
                    "a per-layer call without state rows before set_batch",
                ));
            }
        };
        Ok(LayerCall {
            open,
            given: topk.state_rows,
            fully_resident,
        })
    }

    fn resolve(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
        layers: Layers,
    ) -> Result<(), RuntimeError<D::Error>> {
        let call = self.layer_call(group, topk)?;
        let (open, fully_resident) = (call.open, call.fully_resident);
        let req_id = call.given.unwrap_or(&self.batch);
        let t = topk.num_tokens;
        let kv = &self.kv;
        let crate::runtime::GroupState {
            dgi,
            lru,
            pairs,
            bucket,
            plan,
            hits,
            misses,
            valid: own_valid,
            call,
            ..
        } = &mut self.groups[group];
        let b = *bucket as usize;
        let Indices { rows, counts } = out;
        // The counts go to the engine's buffer when it asks for them, else to the group's own;
        // on sampled steps the counters read the group's own, so the engine's are copied over.
        let mut own_valid = Some(own_valid);
        let valid: &mut D::Buffer = match counts {
            Some(c) => c,
            None => own_valid.take().expect("not taken yet"),
        };
        let copy_counts = |dev: &D, valid: &D::Buffer, own: Option<&mut D::Buffer>| match own {
            Some(own) if open.sampled => dev
                .copy_on_device(&self.compute, valid, 0, own, 0, t as usize * 4)
                .map_err(RuntimeError::device("copying valid counts")),
            _ => Ok(()),
        };
        if fully_resident {
            let desc = resident_remap(kv, self.cfg.state_rows, t, true);
            self.dev
                .remap(
                    &self.compute,
                    &desc,
                    RemapArgs {
                        req_id,
                        block_table: &self.tables.resident[b].buf,
                        topk: topk.positions,
                        idx_mapping: None,
                        out: rows,
                        counts: Some(&mut *valid),
                    },
                )
                .map_err(RuntimeError::device("remapping top-k rows"))?;
            copy_counts(&self.dev, valid, own_valid)?;
            *call = Some(GroupCall {
                tokens: t,
                resolved: false,
            });
            self.counters.remap_calls += 1;
            return Ok(());
        }
        let desc = kv.resolve_desc(t, self.cfg.state_rows);
        let (plan_src, plan_dst) = match plan.as_mut() {
            Some((s, d)) => (s, d),
            None => (&mut self.plan_src, &mut self.plan_dst),
        };
        let pairs = match layers {
            Layers::All => &pairs[..],
            Layers::Leader => &pairs[..1],
        };
        // One call: a backend that fuses the two starts copying a request's misses while others
        // still resolve. The plan stays in `plan_src`/`plan_dst`/`misses` for `apply_plan`.
        self.dev
            .resolve_and_gather(
                &self.compute,
                &desc,
                ResolveArgs {
                    req_id,
                    topk: topk.positions,
                    resident_table: &self.tables.resident[b].buf,
                    host_table: &self.tables.host.buf,
                    hot_table: &self.tables.hot[b].buf,
                    dgi,
                    lru,
                    indices: rows,
                    valid_counts: &mut *valid,
                    hit_counts: &mut *hits,
                    miss_counts: &mut *misses,
                    miss_src: &mut *plan_src,
                    miss_dst: &mut *plan_dst,
                    idx_mapping: None,
                },
                pairs,
                &self.pools.host,
                &mut self.pools.device,
            )
            .map_err(RuntimeError::device(
                "resolving top-k rows and gathering their misses",
            ))?;
        copy_counts(&self.dev, valid, own_valid)?;
        *call = Some(GroupCall {
            tokens: t,
            resolved: true,
        });
        self.counters.resolve_calls += 1;
        Ok(())
    }
}
