//! The per-layer decode path: top-k positions in, attention row indices out.
//!
//! Per index group and step the runtime either remaps the top-k through the resident tables
//! (every request of the call fully resident: every scheduled request
//! ([`OffloadCommand::fully_resident`]), or every request of the batch given to
//! [`Runtime::set_batch`]) or resolves it against the group's hot state and gathers the misses
//! from the pinned host pool into the hot rows, in one [`Device::resolve_and_gather`] call (a
//! backend may overlap the two): over the leader and its followers
//! ([`Runtime::resolve_index_group`]), or over the leader alone ([`Runtime::resolve_leader`]),
//! each follower then applying the same plan with [`Runtime::apply_plan`]. [`Runtime::decode`]
//! is the one entry all of these go through ([`LayerCall`]).
//!
//! Everything is enqueued from device buffers only, on the call's stream (the compute stream, or
//! a stream the engine lent with [`Runtime::adopt_stream`]): no host synchronisation.
//!
//! # CUDA graphs
//!
//! A per-layer call on a stream that is being captured ([`hisparse_core::Device::is_capturing`],
//! e.g. inside PyTorch's `with torch.cuda.graph(g):`) is recorded into the graph and runs at every
//! replay. Such a call always takes the resolve path — correct whatever the step's residency
//! at replay (a fully-resident request resolves every entry to its resident row and leaves its
//! hot state alone) — and the runtime records its token-row count. Before each replay the
//! engine runs, outside the capture, [`Runtime::begin_step_on`] and [`Runtime::set_batch_on`]
//! (which writes the runtime's batch table in place, padded with `-1` to the graph's token rows)
//! on the stream it replays on; after it, [`Runtime::end_step_on`]. The top-k and output
//! tensors a graph reads and writes are the engine's and must keep their addresses; the
//! runtime's own buffers (batch table, hot states, tables, slot mapping, pools) keep theirs.
//!
//! [`OffloadCommand::fully_resident`]: hisparse_core::coordinator::OffloadCommand::fully_resident

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::{
    GatherArgs, GatherDesc, RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, ResolveArgs,
    TableWrite, TableWriteDesc,
};

use crate::error::RuntimeError;
use crate::modes::RemapModes;
use crate::runtime::{GroupCall, Runtime};
use crate::stats::StatsSlot;
use crate::streams::{StreamId, pick};

/// One per-layer call's top-k input.
#[derive(Debug)]
pub struct TopK<'a, B> {
    /// `i32[num_tokens][top_k]` token positions (`-1` = none).
    pub positions: &'a B,
    /// Token rows.
    pub num_tokens: u32,
    /// `i32[num_tokens]` state row of each token row (`-1` = padding), or `None` for the batch
    /// set by [`Runtime::set_batch`]. The rows are read on the device, so unlike `set_batch`'s
    /// they are not checked on the host: a row below 0 or at or beyond the runtime's state rows
    /// is padding (outputs `-1`), and every other row must name a request scheduled in the open
    /// step (another's hot state would be read and updated). A call's own state rows make it a
    /// micro-batch: calls over disjoint requests write what one call over all of them would, so
    /// one micro-batch's swap-in can cross the bus while other work runs (the rules: the
    /// contract's section 7, *Micro-batches*).
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

/// Which layers of an index group a resolve swaps in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Swap {
    /// The leader and every follower, in one gather ([`Runtime::resolve_index_group`]).
    #[default]
    IndexGroup,
    /// The leader only; each follower calls [`Runtime::apply_plan`] when its attention is due
    /// ([`Runtime::resolve_leader`]).
    Leader,
}

/// One per-layer decode call ([`Runtime::decode`]).
#[derive(Debug)]
pub struct LayerCall<'a, B> {
    /// The index group.
    pub group: usize,
    /// Which of its layers the resolve swaps in.
    pub swap: Swap,
    /// The indexer's top-k.
    pub topk: TopK<'a, B>,
    /// Where the attention rows (and counts) go.
    pub out: Indices<'a, B>,
    /// The stream to enqueue on (`None`: the compute stream).
    pub on: Option<StreamId>,
}

/// What [`Runtime::layer_call`] found for one per-layer call.
struct Checked<'a, B> {
    /// Whether the call's stream is being captured into a graph.
    capturing: bool,
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
    stats_slot: u32,
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
        stats_slot,
    }
}

impl<D: Device> Runtime<D> {
    /// Sets the current step's batch on the compute stream: `state_rows[t]` is the state row of
    /// token row `t` (`-1` = padding). See [`Runtime::set_batch_on`].
    pub fn set_batch(&mut self, state_rows: &[i32]) -> Result<(), RuntimeError<D::Error>> {
        self.set_batch_on(state_rows, None, None)
    }

    /// Sets the current step's batch: `state_rows[t]` is the state row of token row `t` (`-1` =
    /// padding); every other row names a request scheduled in the open step
    /// ([`RuntimeError::NotScheduled`] otherwise). Per-layer calls whose [`TopK::state_rows`] is
    /// `None` read it from the runtime's batch table ([`Runtime::batch_buffer`]), written in
    /// place on stream `on`, stream-ordered, without host synchronisation; entries beyond the
    /// batch are `-1`.
    ///
    /// Before replaying a graph that captured per-layer calls of `T` token rows, pass
    /// `pad_to = Some(T)`: the runtime checks that some capture had `T` rows and that the batch
    /// fits ([`RuntimeError::GraphShape`]), so a replay never drops a request. This is
    /// before-replay work: refused on a stream being captured.
    pub fn set_batch_on(
        &mut self,
        state_rows: &[i32],
        pad_to: Option<u32>,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let open = self
            .open
            .ok_or(RuntimeError::Sequence("set_batch outside a step"))?;
        let n = u32::try_from(state_rows.len()).unwrap_or(u32::MAX);
        let rows = pad_to.unwrap_or(n);
        let max = self.cfg.max_step_tokens;
        if n > max || rows > max {
            return Err(RuntimeError::TooManyTokens {
                tokens: n.max(rows),
                max,
            });
        }
        if let Some(p) = pad_to
            && (p < n || !(self.captured_tokens.is_empty() || self.captured_tokens.contains(&p)))
        {
            return Err(RuntimeError::GraphShape {
                rows: n,
                pad_to: p,
                captured: self.captured_tokens.clone(),
            });
        }
        for &r in state_rows {
            if r < 0 {
                continue;
            }
            if r as u32 >= self.cfg.state_rows {
                return Err(RuntimeError::StateRow {
                    row: r as u32,
                    rows: self.cfg.state_rows,
                });
            }
            if !self.row_scheduled[r as usize] {
                return Err(RuntimeError::NotScheduled {
                    row: r as u32,
                    step: open.step,
                });
            }
        }
        self.refuse_capture(on, "set_batch")?;
        let stale = self.batch_written.max(n);
        let writes: Vec<TableWrite> = (0..stale)
            .map(|i| TableWrite {
                index: i,
                value: state_rows.get(i as usize).copied().unwrap_or(-1),
            })
            .collect();
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        self.dev
            .write_table(
                stream,
                &TableWriteDesc { table_len: max },
                &writes,
                &mut self.batch,
            )
            .map_err(RuntimeError::device("writing the batch"))?;
        self.batch_written = n;
        self.batch_len = Some(rows);
        self.batch_fully_resident = open.fully_resident
            || state_rows
                .iter()
                .all(|&r| r < 0 || self.row_fully_resident[r as usize]);
        Ok(())
    }

    /// Runs one per-layer decode call: resolves index group `call.group`'s top-k for this step
    /// and swaps in `call.swap`'s layers (or, when every request of the call is fully resident
    /// and the stream is not being captured, remaps it through the resident tables). The entry
    /// [`Runtime::resolve_index_group`] and [`Runtime::resolve_leader`] go through.
    pub fn decode(&mut self, call: LayerCall<'_, D::Buffer>) -> Result<(), RuntimeError<D::Error>> {
        let LayerCall {
            group,
            swap,
            topk,
            out,
            on,
        } = call;
        self.resolve(group, &topk, out, swap, on)
    }

    /// Resolves index group `group`'s top-k for this step and swaps in every layer of the group
    /// (leader and followers, one gather), on the compute stream. The usual call when the engine
    /// resolves once per index group before the group's attention layers.
    pub fn resolve_index_group(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.resolve(group, topk, out, Swap::IndexGroup, None)
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
        self.resolve(group, topk, out, Swap::Leader, None)
    }

    /// A prefill chunk's read of index group `group`: remaps the top-k positions of its token
    /// rows through the resident tables whatever the step's residency — the coordinator has
    /// staged every page of a prefill chunk's context on the GPU, so no entry of its context is
    /// null and nothing is swapped in (the hot state is not touched). `topk.state_rows` names
    /// each token row's state row (`None`: the batch given to [`Runtime::set_batch`]); outputs
    /// as for [`Runtime::resolve_index_group`], counts only when asked for. On the compute
    /// stream; [`Runtime::remap_prefill_on`] names another.
    pub fn remap_prefill(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.remap_prefill_on(group, topk, out, None)
    }

    /// [`Runtime::remap_prefill`] on stream `on` (`None`: the compute stream).
    pub fn remap_prefill_on(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        self.remap_resident(group, topk, None, out, on)
    }

    /// The remap of index group `group`'s top-k through its bucket's resident tables: plain
    /// (a prefill read, counted in the prefill stats slot) or with `modes`
    /// ([`Runtime::remap_modes`], which the runtime's counters leave out).
    pub(crate) fn remap_resident(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        modes: Option<RemapModes<'_, D::Buffer>>,
        out: Indices<'_, D::Buffer>,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let call = self.layer_call(group, topk, on)?;
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        let req_id = call.given.unwrap_or(&self.batch);
        let b = self.groups[group].bucket as usize;
        let Indices { rows, counts } = out;
        let desc = resident_remap(
            &self.kv,
            self.cfg.state_rows,
            topk.num_tokens,
            counts.is_some(),
            self.stats.slot(StatsSlot::Prefill),
        );
        let remap = |stats| RemapArgs {
            req_id,
            block_table: &self.tables.resident[b].buf,
            topk: topk.positions,
            idx_mapping: None,
            out: rows,
            counts,
            stats,
        };
        match modes {
            None => self
                .dev
                .remap(stream, &desc, remap(Some(&mut self.stats.buf)))
                .map_err(RuntimeError::device("remapping prefill top-k rows")),
            Some(m) => self
                .dev
                .remap_modes(
                    stream,
                    &RemapModesDesc {
                        remap: desc,
                        dcp: m.dcp,
                        prefill_requests: m.workspace.as_ref().map(|w| w.requests),
                    },
                    RemapModesArgs {
                        remap: remap(None),
                        prefill_req_id: m.workspace.as_ref().map(|w| w.request_of_row),
                        workspace_starts: m.workspace.as_ref().map(|w| w.starts),
                    },
                )
                .map_err(RuntimeError::device("remapping top-k rows with modes")),
        }
    }

    /// Swaps in follower layer `layer` with its leader's plan of this step (the original
    /// system's `apply_plan`), on the compute stream. A no-op on fully-resident steps (the remap
    /// needs no swap-in). See [`Runtime::apply_plan_on`].
    pub fn apply_plan(&mut self, layer: u32) -> Result<(), RuntimeError<D::Error>> {
        self.apply_plan_on(layer, None)
    }

    /// [`Runtime::apply_plan`] on stream `on` (`None`: the compute stream): the stream of its
    /// leader's call, or, outside a graph, another one, which the runtime orders after it.
    pub fn apply_plan_on(
        &mut self,
        layer: u32,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
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
        if gs.plan.is_none() {
            return Err(RuntimeError::Sequence(
                "apply_plan for a group without followers",
            ));
        }
        if !self.capturing(on)? {
            // It reads the plan the step's last resolve left: after it, and before the next.
            self.order_resolves(on)?;
        }
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        let gs = &self.groups[g];
        let (src, dst) = gs.plan.as_ref().expect("checked above");
        let desc = GatherDesc {
            num_tokens: call.tokens,
            top_k: self.kv.config.top_k,
            layers: &gs.pairs[li..li + 1],
        };
        self.dev
            .gather_rows(
                stream,
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
    /// rows was set — and what they found; orders the call's stream after the step's
    /// before-forward work when they differ, and records a capture's shape. The batch itself is
    /// not borrowed here, so the caller can borrow it beside an index group's state.
    fn layer_call<'a>(
        &mut self,
        group: usize,
        topk: &TopK<'a, D::Buffer>,
        on: Option<StreamId>,
    ) -> Result<Checked<'a, D::Buffer>, RuntimeError<D::Error>> {
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
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        let capturing = self.capturing(on)?;
        if capturing {
            if let Err(i) = self.captured_tokens.binary_search(&t) {
                self.captured_tokens.insert(i, t);
            }
        } else if on != open.stream {
            // Another stream than begin_step's: it waits for the step's before-forward work.
            if self.step_begun.is_none() {
                let begun = pick(&self.compute, &self.lent_streams, open.stream)?;
                self.step_begun = Some(
                    self.dev
                        .record_event(begun)
                        .map_err(RuntimeError::device("recording the step's table updates"))?,
                );
            }
            let event = self.step_begun.as_ref().expect("recorded above");
            self.dev
                .wait_event(stream, event)
                .map_err(RuntimeError::device(
                    "ordering a call after the step's updates",
                ))?;
        }
        Ok(Checked {
            capturing,
            given: topk.state_rows,
            fully_resident,
        })
    }

    /// Orders a per-layer resolve about to run on stream `on` (outside a capture) after the
    /// open step's last one, when that ran on another stream: they share the runtime's
    /// miss-plan scratch and each group's counters, so on two unordered streams they would
    /// race. An event, no host synchronisation; nothing when they share a stream. (Captured
    /// calls are ordered by the engine: a capture only ends once every stream it forked has
    /// joined.)
    fn order_resolves(&mut self, on: Option<StreamId>) -> Result<(), RuntimeError<D::Error>> {
        self.join_resolves(on)?;
        self.last_resolve_on = Some(on);
        Ok(())
    }

    /// Makes stream `on` wait for the open step's last resolve run outside a capture, when that
    /// ran on another stream ([`Runtime::end_step_on`] joins them so, as the next call does).
    pub(crate) fn join_resolves(
        &mut self,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let Some(last) = self.last_resolve_on else {
            return Ok(());
        };
        if last == on {
            return Ok(());
        }
        let event = self
            .dev
            .record_event(pick(&self.compute, &self.lent_streams, last)?)
            .map_err(RuntimeError::device("recording the end of a resolve"))?;
        self.dev
            .wait_event(pick(&self.compute, &self.lent_streams, on)?, &event)
            .map_err(RuntimeError::device(
                "ordering a resolve after one on another stream",
            ))?;
        self.resolve_order.push(event);
        Ok(())
    }

    fn resolve(
        &mut self,
        group: usize,
        topk: &TopK<'_, D::Buffer>,
        out: Indices<'_, D::Buffer>,
        swap: Swap,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let call = self.layer_call(group, topk, on)?;
        if !call.capturing {
            self.order_resolves(on)?;
        }
        let fully_resident = call.fully_resident && !call.capturing;
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        let req_id = call.given.unwrap_or(&self.batch);
        let t = topk.num_tokens;
        let kv = &self.kv;
        let crate::runtime::GroupState {
            slot_host_rows,
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
        // The counts go to the engine's buffer when it asks for them, else to the group's own.
        let valid: &mut D::Buffer = counts.unwrap_or(own_valid);
        if fully_resident {
            let slot = self.stats.slot(StatsSlot::Remap(group));
            let desc = resident_remap(kv, self.cfg.state_rows, t, true, slot);
            self.dev
                .remap(
                    stream,
                    &desc,
                    RemapArgs {
                        req_id,
                        block_table: &self.tables.resident[b].buf,
                        topk: topk.positions,
                        idx_mapping: None,
                        out: rows,
                        counts: Some(valid),
                        stats: Some(&mut self.stats.buf),
                    },
                )
                .map_err(RuntimeError::device("remapping top-k rows"))?;
            *call = Some(GroupCall {
                tokens: t,
                resolved: false,
            });
            return Ok(());
        }
        let mut desc = kv.resolve_desc(t, self.cfg.state_rows);
        desc.stats_slot = self.stats.slot(StatsSlot::Resolve(group));
        let (plan_src, plan_dst) = match plan.as_mut() {
            Some((s, d)) => (s, d),
            None => (&mut self.plan_src, &mut self.plan_dst),
        };
        let pairs = match swap {
            Swap::IndexGroup => &pairs[..],
            Swap::Leader => &pairs[..1],
        };
        // One call: a backend that fuses the two starts copying a request's misses while others
        // still resolve. The plan stays in `plan_src`/`plan_dst`/`misses` for `apply_plan`.
        self.dev
            .resolve_and_gather(
                stream,
                &desc,
                ResolveArgs {
                    req_id,
                    topk: topk.positions,
                    resident_table: &self.tables.resident[b].buf,
                    host_table: &self.tables.host.buf,
                    hot_table: &self.tables.hot[b].buf,
                    slot_host_rows,
                    lru,
                    indices: rows,
                    valid_counts: valid,
                    hit_counts: &mut *hits,
                    miss_counts: &mut *misses,
                    miss_src: &mut *plan_src,
                    miss_dst: &mut *plan_dst,
                    idx_mapping: None,
                    stats: Some(&mut self.stats.buf),
                },
                pairs,
                &self.pools.host,
                &mut self.pools.device,
            )
            .map_err(RuntimeError::device(
                "resolving top-k rows and gathering their misses",
            ))?;
        *call = Some(GroupCall {
            tokens: t,
            resolved: true,
        });
        Ok(())
    }
}
