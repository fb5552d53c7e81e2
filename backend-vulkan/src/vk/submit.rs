//! Streams, batches and their submission on timeline semaphores; events; capture with timestamps;
//! deferred destruction. The execution model is described in the module docs of `vk`.

use super::*;

impl StreamState {
    pub(super) fn new(sem: vk::Semaphore, lane: usize) -> Self {
        StreamState {
            sem,
            submitted: 0,
            lane,
            open: None,
            waits: Vec::new(),
            internal_seen: 0,
            scratch: None,
            live: true,
            last_submit: None,
        }
    }

    /// The value that marks everything recorded on the stream so far complete.
    fn frontier(&self) -> u64 {
        self.submitted + u64::from(self.open.as_ref().is_some_and(|o| o.commands > 0))
    }
}

/// Completed timeline values, read once per semaphore per pass.
struct Counters<'c> {
    ctx: &'c Context,
    seen: Vec<(vk::Semaphore, u64)>,
}

impl Counters<'_> {
    fn reached(&mut self, (sem, value): (vk::Semaphore, u64)) -> bool {
        if let Some(&(_, v)) = self.seen.iter().find(|(s, _)| *s == sem) {
            return v >= value;
        }
        let v = self.ctx.counter(sem);
        self.seen.push((sem, v));
        v >= value
    }
}

impl Context {
    /// The value a timeline semaphore has reached (0 when the query fails: "not yet").
    pub(super) fn counter(&self, sem: vk::Semaphore) -> u64 {
        // SAFETY: valid timeline semaphore of this device.
        unsafe { self.device.get_semaphore_counter_value(sem) }.unwrap_or(0)
    }

    /// Recycles finished submissions and destroys garbage whose work has completed.
    pub(super) fn reclaim(&self, st: &mut State) {
        let mut done = Counters {
            ctx: self,
            seen: Vec::new(),
        };
        let mut i = 0;
        while i < st.inflight.len() {
            if !done.reached(st.inflight[i].signal) {
                i += 1;
                continue;
            }
            let mut s = st.inflight.swap_remove(i);
            if let Some(p) = st.profile.as_mut() {
                self.profile_done(p, &s);
            }
            for b in s.retired.drain(..) {
                self.destroy_now(b);
            }
            // SAFETY: the submission's work has completed, so its pools are idle.
            unsafe {
                let _ = self
                    .device
                    .reset_command_pool(s.pool, vk::CommandPoolResetFlags::empty());
                for &p in &s.desc_pools {
                    let _ = self
                        .device
                        .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty());
                }
            }
            s.desc_pool_at = 0;
            s.arena_used = 0;
            st.free[s.family_slot].push(s);
        }
        let mut i = 0;
        while i < st.garbage.len() {
            if st.garbage[i].0.iter().all(|&t| done.reached(t)) {
                let (_, b) = st.garbage.swap_remove(i);
                self.destroy_now(b);
            } else {
                i += 1;
            }
        }
    }

    fn new_submission(&self, family_slot: usize) -> Result<Submission> {
        let pi =
            vk::CommandPoolCreateInfo::default().queue_family_index(self.families[family_slot]);
        // SAFETY: valid device and queue family.
        let pool = unsafe { self.device.create_command_pool(&pi, None) }
            .map_err(VulkanError::vk("vkCreateCommandPool"))?;
        let ai = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: `pool` was just created.
        let cmd = match unsafe { self.device.allocate_command_buffers(&ai) } {
            Ok(c) => c[0],
            Err(r) => {
                // SAFETY: unused pool.
                unsafe { self.device.destroy_command_pool(pool, None) };
                return Err(VulkanError::Vk {
                    call: "vkAllocateCommandBuffers",
                    result: r,
                });
            }
        };
        Ok(Submission {
            pool,
            cmd,
            family_slot,
            desc_pools: Vec::new(),
            desc_pool_at: 0,
            arena: None,
            arena_used: 0,
            retired: Vec::new(),
            signal: (vk::Semaphore::null(), 0),
            queries: vk::QueryPool::null(),
            queries_used: 0,
            query_ops: Vec::new(),
        })
    }

    /// Opens a batch for stream `i` on `lane`.
    fn open_batch(&self, st: &mut State, i: usize, lane: usize) -> Result<()> {
        self.reclaim(st);
        let slot = self.lanes[lane].family_slot;
        let mut sub = match st.free[slot].pop() {
            Some(s) => s,
            None => self.new_submission(slot)?,
        };
        let bi = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the command buffer's pool was reset (or is new); nothing else records into it.
        if let Err(r) = unsafe { self.device.begin_command_buffer(sub.cmd, &bi) } {
            st.free[slot].push(sub);
            return Err(VulkanError::Vk {
                call: "vkBeginCommandBuffer",
                result: r,
            });
        }
        if st.profile.is_some()
            && let Err(e) = self.profile_open(&mut sub, lane)
        {
            self.abandon(st, sub, false);
            return Err(e);
        }
        st.streams[i].open = Some(Open {
            sub,
            lane,
            commands: 0,
            hazards: record::Hazards::default(),
            first: "",
        });
        Ok(())
    }

    /// Returns a submission that was never submitted to the free list (waiting for the device
    /// first when it may have been submitted partly, so its pools are idle).
    fn abandon(&self, st: &mut State, mut sub: Submission, submitted: bool) {
        // SAFETY: valid device and pools owned by `sub`; when the submission may have reached
        // the device, waiting for idle first makes the pools idle.
        unsafe {
            if submitted {
                let _ = self.device.device_wait_idle();
            }
            let _ = self
                .device
                .reset_command_pool(sub.pool, vk::CommandPoolResetFlags::empty());
            for &p in &sub.desc_pools {
                let _ = self
                    .device
                    .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty());
            }
        }
        for b in sub.retired.drain(..) {
            self.destroy_now(b);
        }
        sub.arena_used = 0;
        sub.desc_pool_at = 0;
        sub.queries_used = 0;
        sub.query_ops.clear();
        st.free[sub.family_slot].push(sub);
    }

    /// Submits stream `i`'s open batch (after stream 0's, which it waits for): it waits for the
    /// stream's previous submission, stream 0's latest one and the events the stream waits for,
    /// and signals the stream's next value.
    fn submit_stream(&self, st: &mut State, i: usize) -> Result<()> {
        if i != 0 && st.streams[0].open.as_ref().is_some_and(|o| o.commands > 0) {
            self.submit_stream(st, 0)?;
        }
        let Some(open) = st.streams[i].open.take() else {
            return Ok(());
        };
        let Open {
            mut sub,
            lane,
            commands,
            ..
        } = open;
        if commands == 0 {
            self.abandon(st, sub, false);
            return Ok(());
        }
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ | vk::AccessFlags::HOST_WRITE);
        // SAFETY: `sub.cmd` is in the recording state; the barrier makes device writes visible
        // to the host once the timeline value is reached.
        let ended = unsafe {
            self.device.cmd_pipeline_barrier(
                sub.cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
            self.device.end_command_buffer(sub.cmd)
        };
        if let Err(r) = ended {
            self.abandon(st, sub, false);
            return Err(VulkanError::Vk {
                call: "vkEndCommandBuffer",
                result: r,
            });
        }
        let (sem0, v0) = (st.streams[0].sem, st.streams[0].submitted);
        let s = &mut st.streams[i];
        let mut waits: Vec<(vk::Semaphore, u64)> = std::mem::take(&mut s.waits);
        if s.submitted > 0 {
            waits.push((s.sem, s.submitted));
        }
        if i != 0 && v0 > s.internal_seen {
            waits.push((sem0, v0));
        }
        let value = s.submitted + 1;
        let wait_sems: Vec<vk::Semaphore> = waits.iter().map(|w| w.0).collect();
        let wait_values: Vec<u64> = waits.iter().map(|w| w.1).collect();
        let stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; waits.len()];
        let signal_sems = [s.sem];
        let signal_values = [value];
        let cmds = [sub.cmd];
        let mut ti = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let si = vk::SubmitInfo::default()
            .wait_semaphores(&wait_sems)
            .wait_dst_stage_mask(&stages)
            .command_buffers(&cmds)
            .signal_semaphores(&signal_sems)
            .push_next(&mut ti);
        // SAFETY: queues are externally synchronised by `state`'s lock (held by the caller);
        // the command buffer is executable; every waited value was submitted before (waits are
        // added only after their signalling stream was flushed), and every resource the work
        // uses stays alive until the signalled value is reached (buffers are retired against
        // the timelines).
        let r = unsafe {
            self.device
                .queue_submit(self.lanes[lane].queue, &[si], vk::Fence::null())
        };
        if let Err(r) = r {
            self.abandon(st, sub, true);
            return Err(VulkanError::Vk {
                call: "vkQueueSubmit",
                result: r,
            });
        }
        let s = &mut st.streams[i];
        if i != 0 {
            s.internal_seen = s.internal_seen.max(v0);
        }
        s.submitted = value;
        s.last_submit = Some(std::time::Instant::now());
        self.submissions.fetch_add(1, Ordering::Relaxed);
        sub.signal = (s.sem, value);
        if let Some(p) = st.profile.as_mut() {
            p.submitted();
        }
        st.inflight.push(sub);
        Ok(())
    }

    /// Creates a stream (a new timeline, or a dropped stream's slot whose timeline goes on);
    /// returns its id.
    pub fn create_stream(&self) -> Result<usize> {
        let mut st = self.lock();
        let lane = st.next_lane % self.compute_lanes.max(1);
        st.next_lane += 1;
        if let Some(i) = (1..st.streams.len()).find(|&i| !st.streams[i].live) {
            let s = &mut st.streams[i];
            s.live = true;
            s.lane = lane;
            return Ok(i);
        }
        let sem = Self::new_timeline(&self.device)?;
        st.streams.push(StreamState::new(sem, lane));
        Ok(st.streams.len() - 1)
    }

    /// Releases stream `i`: its open batch is submitted, its slot (timeline and scratch) is
    /// reused by a later stream.
    pub fn drop_stream(&self, i: usize) {
        let mut st = self.lock();
        let _ = self.submit_stream(&mut st, i);
        let s = &mut st.streams[i];
        s.waits.clear();
        s.live = false;
    }

    /// Records work of operation `op` (the `Device` method, for the profile) with `f` into
    /// stream `stream`'s open batch (stream 0's while capturing), opening one on a lane that can
    /// run `engine` work, and submits the batch when the device has finished the stream's
    /// previous submission and the batch is worth a submission, or the batch is full (see the
    /// module docs of `vk`).
    pub fn record<R>(
        &self,
        stream: usize,
        engine: Engine,
        op: &'static str,
        f: impl FnOnce(&mut Rec<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut st = self.lock();
        let started = st.profile.is_some().then(std::time::Instant::now);
        let carrier = if st.capture { 0 } else { stream };
        let on_transfer = st.streams[carrier]
            .open
            .as_ref()
            .is_some_and(|o| self.lanes[o.lane].transfer);
        if on_transfer && engine == Engine::Compute {
            self.submit_stream(&mut st, carrier)?;
        }
        if st.streams[carrier].open.is_none() {
            let lane = match (engine, self.transfer_lane) {
                (Engine::Copy, Some(t)) if carrier != 0 => t,
                _ => st.streams[carrier].lane,
            };
            self.open_batch(&mut st, carrier, lane)?;
        }
        let mut recorded = (0u32, "");
        let r = {
            let State {
                pipelines, streams, ..
            } = &mut *st;
            let StreamState { open, scratch, .. } = &mut streams[carrier];
            match open.as_mut() {
                Some(open) => {
                    let before = open.commands;
                    open.first = "";
                    let r = f(&mut Rec {
                        ctx: self,
                        pipelines,
                        open,
                        scratch,
                    });
                    recorded = (open.commands - before, open.first);
                    r
                }
                None => Err(VulkanError::Unsupported(
                    "no open batch (a backend bug)".into(),
                )),
            }
        };
        let profiled = started.is_some() && !st.capture && recorded.0 > 0;
        if profiled && let Some(o) = st.streams[carrier].open.as_mut() {
            self.profile_mark(&mut o.sub, (op, recorded.1));
        }
        let mut flushed = Ok(());
        if !st.capture {
            let s = &st.streams[carrier];
            let worth = |commands: u32| {
                commands >= IDLE_BATCH_COMMANDS
                    || s.last_submit.is_none_or(|t| t.elapsed() >= IDLE_GAP)
            };
            if let Some(o) = &s.open
                && o.commands > 0
                && (o.commands >= FLUSH_COMMANDS
                    || o.sub.queries_used + 1 >= profile::PROFILE_QUERIES
                    || (worth(o.commands) && self.counter(s.sem) >= s.submitted))
            {
                flushed = self.submit_stream(&mut st, carrier);
            }
        }
        if profiled && let (Some(t), Some(p)) = (started, st.profile.as_mut()) {
            p.recorded(op, recorded.1, recorded.0, t.elapsed().as_nanos() as u64);
        }
        drop(st);
        let v = r?;
        flushed?;
        self.check_validation()?;
        Ok(v)
    }

    /// Blocks until the timeline values `targets` are reached, then recycles what finished.
    fn wait_values(&self, targets: &[(vk::Semaphore, u64)]) -> Result<()> {
        let targets: Vec<_> = targets.iter().filter(|t| t.1 > 0).copied().collect();
        let started = std::time::Instant::now();
        let reached = || targets.iter().all(|&(sem, v)| self.counter(sem) >= v);
        if self.limits.gpu && !reached() {
            // A blocking wait wakes the thread long after the GPU finished short work; poll for
            // a while first, as CUDA's synchronisation spins (not on CPU devices, whose work
            // runs on the cores a spinning thread would take).
            while started.elapsed() < WAIT_SPIN && !reached() {
                std::hint::spin_loop();
            }
            // Then poll while yielding the core: a thread blocked in vkWaitSemaphores wakes up
            // late (hundreds of microseconds on NVIDIA's driver), which each synchronisation of
            // a benchmark sample or simulated step paid.
            while started.elapsed() < self.wait_poll && !reached() {
                std::thread::yield_now();
            }
        }
        if !targets.is_empty() && !reached() {
            let sems: Vec<vk::Semaphore> = targets.iter().map(|t| t.0).collect();
            let values: Vec<u64> = targets.iter().map(|t| t.1).collect();
            let wi = vk::SemaphoreWaitInfo::default()
                .semaphores(&sems)
                .values(&values);
            // SAFETY: valid timeline semaphores; waiting needs no external synchronisation and
            // every value waited for was submitted.
            unsafe { self.device.wait_semaphores(&wi, u64::MAX) }
                .map_err(VulkanError::vk("vkWaitSemaphores"))?;
        }
        let mut st = self.lock();
        if let Some(p) = st.profile.as_mut() {
            p.waited(started.elapsed().as_nanos() as u64);
        }
        self.reclaim(&mut st);
        drop(st);
        self.check_validation()
    }

    /// Submits stream `i`'s open batch and blocks until all its work has completed (while
    /// capturing, the capture's work too).
    pub fn synchronize(&self, i: usize) -> Result<()> {
        let mut st = self.lock();
        let mut ids = vec![i];
        if st.capture && i != 0 {
            ids.push(0);
        }
        let mut targets = Vec::new();
        for j in ids {
            self.submit_stream(&mut st, j)?;
            targets.push((st.streams[j].sem, st.streams[j].submitted));
        }
        drop(st);
        self.wait_values(&targets)
    }

    /// Submits every open batch and blocks until all work of every stream has completed.
    pub fn wait_all(&self) -> Result<()> {
        let mut st = self.lock();
        for i in 0..st.streams.len() {
            self.submit_stream(&mut st, i)?;
        }
        let targets: Vec<_> = st.streams.iter().map(|s| (s.sem, s.submitted)).collect();
        drop(st);
        self.wait_values(&targets)
    }

    /// An event at the current end of stream `i`: the timeline value that marks everything
    /// recorded on it so far complete (stream 0's while capturing). Whoever waits for or polls
    /// the event submits the stream's open batch (`flush_for`).
    pub fn record_event(&self, i: usize) -> (vk::Semaphore, u64) {
        let st = self.lock();
        let s = &st.streams[if st.capture { 0 } else { i }];
        (s.sem, s.frontier())
    }

    /// Submits, if needed, the stream whose timeline `sem` is so that `value` will be signalled.
    fn flush_for(&self, st: &mut State, (sem, value): (vk::Semaphore, u64)) -> Result<()> {
        if let Some(j) = st.streams.iter().position(|s| s.sem == sem)
            && st.streams[j].submitted < value
        {
            self.submit_stream(st, j)?;
        }
        Ok(())
    }

    /// Makes work recorded on stream `i` from now on wait for `event` (without blocking the
    /// host). The event's stream is submitted first if needed, and stream `i`'s work recorded
    /// before this call is submitted without the wait.
    pub fn wait_event(&self, i: usize, event: (vk::Semaphore, u64)) -> Result<()> {
        if self.ignore_event_waits {
            return Ok(());
        }
        let mut st = self.lock();
        if st.capture {
            // One command buffer: a full barrier orders everything recorded after it.
            let State {
                pipelines, streams, ..
            } = &mut *st;
            let StreamState { open, scratch, .. } = &mut streams[0];
            if let Some(open) = open.as_mut() {
                Rec {
                    ctx: self,
                    pipelines,
                    open,
                    scratch,
                }
                .barrier();
            }
            return Ok(());
        }
        self.flush_for(&mut st, event)?;
        if st.streams[i].sem == event.0 || self.counter(event.0) >= event.1 {
            // Same stream (already in order), or already complete.
            return Ok(());
        }
        self.submit_stream(&mut st, i)?;
        st.streams[i].waits.push(event);
        Ok(())
    }

    /// Whether `event` has completed, without blocking; submits its stream when the event's
    /// work was not submitted yet, so that it will complete.
    pub fn query_event(&self, event: (vk::Semaphore, u64)) -> Result<bool> {
        if self.counter(event.0) >= event.1 {
            return Ok(true);
        }
        let mut st = self.lock();
        self.flush_for(&mut st, event)?;
        drop(st);
        self.check_validation()?;
        Ok(self.counter(event.0) >= event.1)
    }

    /// Blocks until `event` has completed.
    pub fn wait_event_host(&self, event: (vk::Semaphore, u64)) -> Result<()> {
        let mut st = self.lock();
        self.flush_for(&mut st, event)?;
        drop(st);
        self.wait_values(&[event])
    }

    /// Releases a buffer once all work submitted or being recorded so far, on every stream, has
    /// completed.
    pub fn retire(&self, b: RawBuffer) {
        let mut st = self.lock();
        let mut done = Counters {
            ctx: self,
            seen: Vec::new(),
        };
        let pending: Vec<(vk::Semaphore, u64)> = st
            .streams
            .iter()
            .map(|s| (s.sem, s.frontier()))
            .filter(|&t| t.1 > 0 && !done.reached(t))
            .collect();
        if pending.is_empty() {
            drop(st);
            self.destroy_now(b);
        } else {
            st.garbage.push((pending, b));
        }
    }

    /// Starts a capture: after all earlier work completed, every stream records into one chain
    /// of command buffers on compute lane 0, starting with timestamp query 0.
    pub fn begin_capture(&self) -> Result<()> {
        self.wait_all()?;
        let mut st = self.lock();
        st.capture = true;
        if let Some(pool) = self.query_pool {
            self.with_capture_rec(&mut st, |rec| rec.timestamp(pool, 0, true))?;
        }
        Ok(())
    }

    /// Ends the capture (writing timestamp 1), submits it and waits; returns the nanoseconds
    /// between the two timestamps when both were written.
    pub fn end_capture(&self) -> Result<Option<f64>> {
        let mut st = self.lock();
        if !st.capture {
            return Err(VulkanError::Unsupported(
                "end_capture without begin_capture (a backend bug)".into(),
            ));
        }
        let ended = match self.query_pool {
            Some(pool) => self.with_capture_rec(&mut st, |rec| rec.timestamp(pool, 1, false)),
            None => Ok(()),
        };
        st.capture = false;
        let submitted = ended.and_then(|()| self.submit_stream(&mut st, 0));
        let target = (st.streams[0].sem, st.streams[0].submitted);
        drop(st);
        submitted?;
        self.wait_values(&[target])?;
        let (Some(pool), Some(period)) = (self.query_pool, self.limits.timestamp_period) else {
            return Ok(None);
        };
        let mut ticks = [0u64; 2];
        // SAFETY: both queries were written by completed work (waited above).
        unsafe {
            self.device.get_query_pool_results(
                pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(VulkanError::vk("vkGetQueryPoolResults"))?;
        Ok(Some(ticks[1].wrapping_sub(ticks[0]) as f64 * period))
    }

    /// Runs `f` on stream 0's open batch (opened on compute lane 0 if needed).
    fn with_capture_rec(&self, st: &mut State, f: impl FnOnce(&mut Rec<'_>)) -> Result<()> {
        if st.streams[0].open.is_none() {
            self.open_batch(st, 0, 0)?;
        }
        let State {
            pipelines, streams, ..
        } = st;
        let StreamState { open, scratch, .. } = &mut streams[0];
        if let Some(open) = open.as_mut() {
            let mut rec = Rec {
                ctx: self,
                pipelines,
                open,
                scratch,
            };
            rec.open.commands += 1;
            f(&mut rec);
        }
        Ok(())
    }
}
