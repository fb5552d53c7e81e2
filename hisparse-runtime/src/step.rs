//! The before-forward and after-forward halves of a step, and completion polling.

use hisparse_core::Device;
use hisparse_core::coordinator::{CoordError, Coordinator, OffloadCommand};
use hisparse_core::ops::{
    BlockPair, Direction, HotResetDesc, InvalidateArgs, InvalidateDesc, PageCopyDesc, RowCopyDesc,
    RowSpan, TableWrite, TableWriteDesc,
};

use crate::error::RuntimeError;
use crate::runtime::{OpenStep, Runtime};
use crate::slots::SlotMapping;
use crate::streams::{StreamId, pick};

/// What [`Runtime::poll`] returns: the core's worker report (kept here so the runtime's users
/// name it as before).
pub use hisparse_core::coordinator::WorkerReport;

impl<D: Device> Runtime<D> {
    /// Before the forward pass: applies `cmd` on the compute stream, in the command's documented
    /// order — incremental table updates, the step's slot mapping ([`Runtime::slot_mapping`]),
    /// hot-state resets (state rows started, hot regions given out), invalidation of hot entries
    /// caching rows of newly assigned host blocks, host copy-on-write (host pool and indexer
    /// host cache), restores (indexer restores included), GPU copy-on-write. Nothing here synchronises with the host. [`Runtime::begin_step_on`] runs it
    /// on a lent stream.
    ///
    /// Commands run once each, in order: a command already run, an older one, or one after a
    /// skipped step is refused ([`RuntimeError::StepOrder`]) before anything is applied (the
    /// first command a runtime sees may have any step number).
    ///
    /// With a host pool shared across processes (see [`crate::RuntimeConfig::writes_host`]),
    /// the writer's host copy-on-write must be complete before the other ranks enqueue this
    /// step's restores, which read the copied pages: when `cmd.host_cow` is not empty, the engine
    /// synchronises the writer's compute stream after its `begin_step` and only then calls the
    /// others' (one barrier, in steps with copy-on-write only).
    pub fn begin_step(&mut self, cmd: &OffloadCommand) -> Result<(), RuntimeError<D::Error>> {
        self.begin_step_on(cmd, None)
    }

    /// [`Runtime::begin_step`] on stream `on` (`None`: the compute stream), e.g. the engine's
    /// current stream; the step's per-layer calls and [`Runtime::end_step_on`] then belong on the
    /// same stream. Refused on a stream being captured into a graph ([`RuntimeError::Capture`]):
    /// a step's command is applied before the graph's replay, outside it.
    pub fn begin_step_on(
        &mut self,
        cmd: &OffloadCommand,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        if let Some(open) = self.open {
            return Err(RuntimeError::Sequence(if open.step == cmd.step {
                "begin_step called twice for one step"
            } else {
                "begin_step before the previous step's end_step"
            }));
        }
        if let Some(last) = self.last_step
            && cmd.step != last + 1
        {
            return Err(RuntimeError::StepOrder {
                last,
                got: cmd.step,
            });
        }
        self.refuse_capture(on, "begin_step")?;
        self.check_command(cmd)?;
        let span = tracing::debug_span!("hisparse.begin_step", step = cmd.step);
        let _enter = span.enter();
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        // 1. Tables, then the slot mapping (read from the updated tables).
        self.tables.apply_command(cmd);
        let written = self.tables.flush(&self.dev, stream)?;
        self.counters.table_writes += written as u64;
        self.slots.write(&self.dev, stream, &self.tables, cmd)?;
        // 2. Hot-state resets: started rows in every group, new hot regions in their bucket's.
        let resets = self.reset_hot_states(cmd, on)?;
        // 3. Invalidation of hot entries caching rows of recycled host blocks.
        self.invalidate_host_blocks(&cmd.new_host_blocks, on)?;
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        // 4. Host copy-on-write (by the rank that writes the host pool), restores, GPU
        //    copy-on-write.
        if self.cfg.writes_host && !cmd.host_cow.is_empty() {
            self.dev
                .copy_host_pages(
                    stream,
                    &self.host_layers,
                    &cmd.host_cow,
                    &mut self.pools.host,
                )
                .map_err(RuntimeError::device("host copy-on-write"))?;
        }
        if let Some(ix) = &mut self.indexer {
            // Every rank keeps its own indexer host cache: each copies its indexer pages.
            ix.host_cow(&self.dev, stream, &cmd.host_cow)?;
            ix.restore(
                &self.dev,
                stream,
                &cmd.indexer_restores,
                &mut self.pools.device,
            )?;
            self.counters.indexer_h2d_bytes += cmd.indexer_restores.len() as u64 * ix.page_bytes();
            self.counters.indexer_pages_restored += cmd.indexer_restores.len() as u64;
        }
        let mut pairs: Vec<BlockPair> = Vec::new();
        for b in 0..self.kv.num_buckets {
            pairs.clear();
            pairs.extend(
                cmd.restores
                    .iter()
                    .filter(|r| r.bucket == b)
                    .map(|r| BlockPair {
                        src: r.host_block,
                        dst: r.device_block,
                    }),
            );
            if pairs.is_empty() {
                continue;
            }
            let layers = &self.bucket_pairs[b as usize];
            self.counters.h2d_bytes += pairs.len() as u64 * page_bytes(layers);
            self.dev
                .copy_pages(
                    stream,
                    &PageCopyDesc {
                        direction: Direction::HostToDevice,
                        layers,
                    },
                    &pairs,
                    &mut self.pools.host,
                    &mut self.pools.device,
                )
                .map_err(RuntimeError::device("restoring pages"))?;
        }
        let bpb = self.kv.bytes_per_block as usize;
        for p in &cmd.gpu_cow {
            self.dev
                .copy_within_device(
                    stream,
                    &mut self.pools.device,
                    p.src as usize * bpb,
                    p.dst as usize * bpb,
                    bpb,
                )
                .map_err(RuntimeError::device("GPU copy-on-write"))?;
        }
        let c = &mut self.counters;
        c.steps += 1;
        c.host_cow_pages += cmd.host_cow.len() as u64;
        c.restored_pages += cmd.restores.len() as u64;
        c.gpu_cow_blocks += cmd.gpu_cow.len() as u64;
        let reclaimed = cmd.residency.iter().filter(|u| u.block == 0).count() as u64;
        c.reclaimed_pages += reclaimed / u64::from(self.kv.num_buckets.max(1));
        for g in &mut self.groups {
            g.call = None;
        }
        let sampled = self.cfg.stats_every > 0
            && (c.steps - 1).is_multiple_of(u64::from(self.cfg.stats_every));
        self.last_step = Some(cmd.step);
        self.step_begun = None;
        self.last_resolve_on = None;
        self.resolve_order.clear();
        self.open = Some(OpenStep {
            step: cmd.step,
            stream: on,
            fully_resident: cmd.fully_resident,
            sampled,
        });
        self.batch_len = None;
        self.row_fully_resident.fill(false);
        self.row_scheduled.fill(false);
        for s in &cmd.scheduled {
            self.row_scheduled[s.slot as usize] = true;
            self.row_fully_resident[s.slot as usize] = s.fully_resident;
        }
        tracing::debug!(
            scheduled = cmd.scheduled.len(),
            fully_resident = cmd.fully_resident,
            table_writes = written,
            hot_resets = resets,
            new_host_blocks = cmd.new_host_blocks.len(),
            host_cow = cmd.host_cow.len(),
            restores = cmd.restores.len(),
            gpu_cow = cmd.gpu_cow.len(),
            "before-forward work enqueued"
        );
        Ok(())
    }

    /// Checks everything `cmd` names against the layout and the configuration before any of it
    /// is applied, so a malformed command is refused whole (nothing enqueued, the tables as they
    /// were) rather than half-executed.
    fn check_command(&self, cmd: &OffloadCommand) -> Result<(), RuntimeError<D::Error>> {
        let tokens = SlotMapping::<D>::step_tokens(cmd);
        if tokens > u64::from(self.cfg.max_batched_tokens) {
            return Err(RuntimeError::Config {
                field: "max_batched_tokens",
                reason: format!(
                    "the command of step {} schedules {tokens} tokens but the runtime's slot mapping holds {}; build the runtime with max_batched_tokens at least the coordinator's",
                    cmd.step, self.cfg.max_batched_tokens
                ),
            });
        }
        for s in &cmd.scheduled {
            if s.slot >= self.cfg.state_rows {
                return Err(RuntimeError::StateRow {
                    row: s.slot,
                    rows: self.cfg.state_rows,
                });
            }
        }
        self.tables.validate(cmd)?;
        let kv = &self.kv;
        let bad = |what: String| Err(RuntimeError::Command(what));
        let (gpu, host) = (kv.num_gpu_blocks, kv.host_num_blocks);
        if let Some(&h) = cmd.new_host_blocks.iter().find(|&&h| h >= host) {
            return bad(format!("new host block {h} of a {host}-block host pool"));
        }
        for (what, pairs, src_limit, dst_limit) in [
            ("host copy-on-write", &cmd.host_cow, host, host),
            ("GPU copy-on-write", &cmd.gpu_cow, gpu, gpu),
        ] {
            if let Some(p) = pairs
                .iter()
                .find(|p| p.src >= src_limit || p.dst >= dst_limit || p.src == p.dst)
            {
                return bad(format!("{what} of block {} to block {}", p.src, p.dst));
            }
        }
        let transfers = cmd.restores.iter().chain(&cmd.page_transfers);
        for t in transfers {
            if t.bucket >= kv.num_buckets || t.device_block >= gpu || t.host_block >= host {
                return bad(format!(
                    "a page copy between GPU block {} and host block {} of bucket {}",
                    t.device_block, t.host_block, t.bucket
                ));
            }
        }
        let indexer_rows = self.indexer.as_ref().map_or(0, |ix| ix.rows_per_page());
        if let Some(p) = cmd
            .indexer_restores
            .iter()
            .find(|p| indexer_rows == 0 || p.src >= host || p.dst >= gpu)
        {
            return bad(format!(
                "an indexer restore of host block {} to GPU block {} (the layout has {} indexer rows per page)",
                p.src, p.dst, indexer_rows
            ));
        }
        if let Some(s) = cmd.indexer_backups.iter().find(|s| {
            s.device_block >= gpu
                || s.host_block >= host
                || u64::from(s.first_row) + u64::from(s.num_rows) > u64::from(indexer_rows)
        }) {
            return bad(format!(
                "an indexer backup of rows {}..{} between GPU block {} and host block {} (the layout has {} indexer rows per page)",
                s.first_row,
                u64::from(s.first_row) + u64::from(s.num_rows),
                s.device_block,
                s.host_block,
                indexer_rows
            ));
        }
        for m in &cmd.row_mirrors {
            let s = m.span;
            let end = u64::from(s.first_row) + u64::from(s.num_rows);
            if m.bucket >= kv.num_buckets
                || s.device_block >= gpu
                || s.host_block >= host
                || end > u64::from(kv.block_size)
            {
                return bad(format!(
                    "a row mirror of rows {}..{end} between GPU block {} and host block {} of bucket {}",
                    s.first_row, s.device_block, s.host_block, m.bucket
                ));
            }
        }
        Ok(())
    }

    /// Resets the hot state of started rows (every group) and of rows given a hot region (the
    /// groups of that region's bucket); returns the number of (row, group) resets.
    fn reset_hot_states(
        &mut self,
        cmd: &OffloadCommand,
        on: Option<StreamId>,
    ) -> Result<u64, RuntimeError<D::Error>> {
        let nb = self.kv.num_buckets as usize;
        for rows in &mut self.scratch_rows {
            rows.clear();
        }
        for (g, gs) in self.groups.iter().enumerate() {
            let rows = &mut self.scratch_rows[g];
            rows.extend_from_slice(&cmd.started);
            rows.extend(cmd.hot_assign.iter().filter_map(|a| {
                (a.group as usize)
                    .checked_sub(2 + nb)
                    .and_then(|b| (b == gs.bucket as usize).then_some(a.slot))
            }));
        }
        let desc = HotResetDesc {
            num_requests: self.cfg.state_rows,
            hot_slots: self.kv.device_buffer_size,
        };
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        let mut resets = 0;
        for (gs, rows) in self.groups.iter_mut().zip(&mut self.scratch_rows) {
            if rows.is_empty() {
                continue;
            }
            rows.sort_unstable();
            rows.dedup();
            resets += rows.len() as u64;
            self.dev
                .reset_hot_state(stream, &desc, rows, &mut gs.slot_host_rows, &mut gs.lru)
                .map_err(RuntimeError::device("resetting hot state"))?;
        }
        self.counters.hot_resets += resets;
        Ok(resets)
    }

    /// Drops hot entries caching any row of `host_blocks`, in every index group. Consecutive
    /// block ids become one range.
    fn invalidate_host_blocks(
        &mut self,
        host_blocks: &[u32],
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        if host_blocks.is_empty() {
            return Ok(());
        }
        let mut blocks = host_blocks.to_vec();
        blocks.sort_unstable();
        blocks.dedup();
        let bs = i64::from(self.kv.block_size);
        let ranges = &mut self.scratch_i32;
        ranges.clear();
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            let start = i64::from(blocks[i]) * bs;
            let end = (i64::from(blocks[j - 1]) + 1) * bs;
            ranges.push(start.min(i64::from(i32::MAX)) as i32);
            ranges.push(end.min(i64::from(i32::MAX)) as i32);
            i = j;
        }
        let num_ranges = ranges.len() / 2;
        if num_ranges > self.ranges_capacity {
            let cap = num_ranges.next_power_of_two();
            self.ranges = self
                .dev
                .alloc(cap * 8)
                .map_err(RuntimeError::device("growing the invalidation ranges"))?;
            self.ranges_capacity = cap;
        }
        let writes: Vec<TableWrite> = ranges
            .iter()
            .enumerate()
            .map(|(i, &value)| TableWrite {
                index: i as u32,
                value,
            })
            .collect();
        let stream = pick(&self.compute, &self.lent_streams, on)?;
        self.dev
            .write_table(
                stream,
                &TableWriteDesc {
                    table_len: (self.ranges_capacity * 2) as u32,
                },
                &writes,
                &mut self.ranges,
            )
            .map_err(RuntimeError::device("staging invalidation ranges"))?;
        let desc = InvalidateDesc {
            num_requests: self.cfg.state_rows,
            hot_slots: self.kv.device_buffer_size,
            num_ranges: num_ranges as u32,
        };
        for gs in &mut self.groups {
            self.dev
                .invalidate(
                    stream,
                    &desc,
                    InvalidateArgs {
                        ranges: &self.ranges,
                        slot_host_rows: &mut gs.slot_host_rows,
                    },
                )
                .map_err(RuntimeError::device("invalidating hot entries"))?;
        }
        Ok(())
    }

    /// After the forward pass: the copy stream waits for the compute stream's work (the forward
    /// pass's KV writes), then runs `cmd`'s row mirrors, page spills and indexer backups as
    /// transfer batch
    /// `cmd.transfer_id`, and records an event that [`Runtime::poll`] watches. Every
    /// [`crate::RuntimeConfig::stats_every`]-th step the device's decode counters are copied to
    /// host on the step's stream (one small copy). Nothing here blocks the host. [`Runtime::end_step_on`] names the stream the forward pass ran on.
    pub fn end_step(&mut self, cmd: &OffloadCommand) -> Result<(), RuntimeError<D::Error>> {
        self.end_step_on(cmd, None)
    }

    /// [`Runtime::end_step`] after the forward pass enqueued on stream `on` (`None`: the compute
    /// stream): the copies wait for everything enqueued on `on` so far. Refused on a stream being
    /// captured into a graph ([`RuntimeError::Capture`]).
    pub fn end_step_on(
        &mut self,
        cmd: &OffloadCommand,
        on: Option<StreamId>,
    ) -> Result<(), RuntimeError<D::Error>> {
        let open = self
            .open
            .ok_or(RuntimeError::Sequence("end_step without a begin_step"))?;
        if open.step != cmd.step {
            return Err(RuntimeError::Sequence(
                "end_step with a different command than begin_step",
            ));
        }
        self.refuse_capture(on, "end_step")?;
        // Per-layer resolves that ran on another stream finish before the step's end (and so
        // before the next step's table updates on this stream).
        self.join_resolves(on)?;
        let span = tracing::debug_span!("hisparse.end_step", step = cmd.step);
        let _enter = span.enter();
        if open.sampled {
            let stream = pick(&self.compute, &self.lent_streams, on)?;
            self.stats.snapshot(&self.dev, stream, &mut self.counters)?;
        }
        if let Some(id) = cmd.transfer_id {
            // The indexer backup's slots, staged where tables are written, before the end of
            // the forward is recorded.
            let mut indexer_rows = 0;
            if let Some(ix) = &mut self.indexer {
                let stream = pick(&self.compute, &self.lent_streams, on)?;
                indexer_rows = ix.stage(&self.dev, stream, &cmd.indexer_backups)?;
            }
            let forward = self
                .dev
                .record_event(pick(&self.compute, &self.lent_streams, on)?)
                .map_err(RuntimeError::device(
                    "recording the end of the forward pass",
                ))?;
            self.dev
                .wait_event(&self.copy, &forward)
                .map_err(RuntimeError::device(
                    "ordering copies after the forward pass",
                ))?;
            let mut spans: Vec<RowSpan> = Vec::new();
            let mut pairs: Vec<BlockPair> = Vec::new();
            // A rank that does not write the host pool has no copies: its batch completes with
            // its forward pass.
            let buckets = if self.cfg.writes_host {
                self.kv.num_buckets
            } else {
                0
            };
            for b in 0..buckets {
                let layers = &self.bucket_pairs[b as usize];
                spans.clear();
                spans.extend(
                    cmd.row_mirrors
                        .iter()
                        .filter(|m| m.bucket == b)
                        .map(|m| m.span),
                );
                if !spans.is_empty() {
                    let rows: u64 = spans.iter().map(|s| u64::from(s.num_rows)).sum();
                    self.counters.d2h_bytes +=
                        rows * u64::from(self.kv.row_bytes) * layers.len() as u64;
                    self.counters.mirror_spans += spans.len() as u64;
                    self.dev
                        .copy_rows(
                            &self.copy,
                            &RowCopyDesc {
                                direction: Direction::DeviceToHost,
                                layers,
                            },
                            &spans,
                            &mut self.pools.host,
                            &mut self.pools.device,
                        )
                        .map_err(RuntimeError::device("mirroring rows to host"))?;
                }
                pairs.clear();
                pairs.extend(
                    cmd.page_transfers
                        .iter()
                        .filter(|p| p.bucket == b)
                        .map(|p| BlockPair {
                            src: p.device_block,
                            dst: p.host_block,
                        }),
                );
                if !pairs.is_empty() {
                    self.counters.d2h_bytes += pairs.len() as u64 * page_bytes(layers);
                    self.counters.spilled_pages += pairs.len() as u64;
                    self.dev
                        .copy_pages(
                            &self.copy,
                            &PageCopyDesc {
                                direction: Direction::DeviceToHost,
                                layers,
                            },
                            &pairs,
                            &mut self.pools.host,
                            &mut self.pools.device,
                        )
                        .map_err(RuntimeError::device("spilling pages to host"))?;
                }
            }
            // The indexer rows of the step, in the same batch: a page is durable only with its
            // keys. Every rank backs up into its own indexer host cache.
            if let Some(ix) = &mut self.indexer {
                ix.backup(&self.dev, &self.copy, id, &self.pools.device)?;
                self.counters.indexer_rows_backed_up += indexer_rows;
                self.counters.indexer_d2h_bytes += indexer_rows * ix.row_bytes();
            }
            let done = self
                .dev
                .record_event(&self.copy)
                .map_err(RuntimeError::device("recording a transfer batch"))?;
            self.in_flight.push_back((id, done));
            self.unreported.push(id);
            self.counters.transfers_enqueued += 1;
            tracing::debug!(
                transfer = id,
                mirror_spans = cmd.row_mirrors.len(),
                spills = cmd.page_transfers.len(),
                "after-forward copies enqueued"
            );
        }
        self.open = None;
        Ok(())
    }

    /// Polls, without blocking, the transfer batches and counters in flight: returns the batches
    /// enqueued and completed since the last call, for [`Coordinator::report`], and folds
    /// finished counters into [`Runtime::counters`].
    pub fn poll(&mut self) -> Result<WorkerReport, RuntimeError<D::Error>> {
        let mut report = WorkerReport {
            worker: self.cfg.worker,
            enqueued: std::mem::take(&mut self.unreported),
            completed: Vec::new(),
        };
        while let Some((id, ev)) = self.in_flight.front() {
            let done = self
                .dev
                .query_event(ev)
                .map_err(RuntimeError::device("polling a transfer batch"))?;
            if !done {
                break;
            }
            report.completed.push(*id);
            if let Some(ix) = &mut self.indexer {
                ix.completed(*id);
            }
            self.in_flight.pop_front();
        }
        self.counters.transfers_completed += report.completed.len() as u64;
        self.stats.fold_ready(&self.dev, &mut self.counters)?;
        if !report.completed.is_empty() {
            tracing::debug!(completed = ?report.completed, "transfer batches complete");
        }
        Ok(report)
    }

    /// [`Runtime::poll`], then hands the result to `coord` as this runtime's worker report.
    pub fn poll_and_report(
        &mut self,
        coord: &mut Coordinator,
    ) -> Result<WorkerReport, ReportError<D::Error>> {
        let r = self.poll().map_err(ReportError::Runtime)?;
        if !r.is_empty() {
            coord
                .report(r.worker, &r.enqueued, &r.completed)
                .map_err(ReportError::Coordinator)?;
        }
        Ok(r)
    }

    /// Blocks until every transfer batch and counter copy in flight, and everything enqueued on
    /// the compute stream and the lent streams, has completed, then polls (shutdown, tests). Not
    /// for the decode path.
    pub fn drain(&mut self) -> Result<WorkerReport, RuntimeError<D::Error>> {
        self.dev
            .synchronize(&self.compute)
            .map_err(RuntimeError::device("synchronising the compute stream"))?;
        self.dev
            .synchronize(&self.copy)
            .map_err(RuntimeError::device("synchronising the copy stream"))?;
        for s in &self.lent_streams {
            self.dev
                .synchronize(s)
                .map_err(RuntimeError::device("synchronising a lent stream"))?;
        }
        if self.cfg.stats_every > 0 {
            // The steps since the last snapshot: counted exactly.
            self.stats
                .snapshot(&self.dev, &self.compute, &mut self.counters)?;
            self.dev
                .synchronize(&self.compute)
                .map_err(RuntimeError::device("synchronising the compute stream"))?;
        }
        self.poll()
    }
}

/// Why [`Runtime::poll_and_report`] failed.
#[derive(Debug)]
pub enum ReportError<E> {
    /// Polling failed.
    Runtime(RuntimeError<E>),
    /// The coordinator refused the report.
    Coordinator(CoordError),
}

impl<E: core::fmt::Display> core::fmt::Display for ReportError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReportError::Runtime(e) => e.fmt(f),
            ReportError::Coordinator(e) => write!(f, "coordinator: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ReportError<E> {}

/// Summed page bytes of `layers` (one page of each).
fn page_bytes(layers: &[hisparse_core::ops::LayerPair]) -> u64 {
    layers.iter().map(|l| l.host.page_bytes()).sum()
}
