//! Command buffers, submission on the timeline, batches with timestamps, deferred destruction.

use super::*;

impl Context {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent handles; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last timeline value submitted.
    pub fn last_submitted(&self) -> u64 {
        self.lock().last
    }

    /// Whether the work up to timeline value `value` has completed (non-blocking).
    pub fn reached(&self, value: u64) -> bool {
        self.completed() >= value
    }

    pub(super) fn completed(&self) -> u64 {
        // SAFETY: valid timeline semaphore of this device.
        unsafe { self.device.get_semaphore_counter_value(self.timeline) }.unwrap_or(0)
    }

    /// Recycles finished submissions and destroys garbage whose work has completed.
    pub(super) fn reclaim(&self, st: &mut State) {
        let done = self.completed();
        while st.inflight.front().is_some_and(|s| s.value <= done) {
            let Some(mut s) = st.inflight.pop_front() else {
                break;
            };
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
            st.free.push(s);
        }
        let mut i = 0;
        while i < st.garbage.len() {
            if st.garbage[i].0 <= done {
                let (_, b) = st.garbage.swap_remove(i);
                self.destroy_now(b);
            } else {
                i += 1;
            }
        }
    }

    pub(super) fn new_submission(&self) -> Result<Submission> {
        let pi = vk::CommandPoolCreateInfo::default().queue_family_index(self.queue_family);
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
            desc_pools: Vec::new(),
            desc_pool_at: 0,
            arena: None,
            arena_used: 0,
            retired: Vec::new(),
            value: 0,
        })
    }

    pub(super) fn begin(&self, st: &mut State) -> Result<Submission> {
        self.reclaim(st);
        let sub = match st.free.pop() {
            Some(s) => s,
            None => self.new_submission()?,
        };
        let bi = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the command buffer's pool was reset (or is new); nothing else records into it.
        if let Err(r) = unsafe { self.device.begin_command_buffer(sub.cmd, &bi) } {
            st.free.push(sub);
            return Err(VulkanError::Vk {
                call: "vkBeginCommandBuffer",
                result: r,
            });
        }
        Ok(sub)
    }

    pub(super) fn submit(&self, st: &mut State, mut sub: Submission) -> Result<()> {
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
            self.abandon(st, sub);
            return Err(VulkanError::Vk {
                call: "vkEndCommandBuffer",
                result: r,
            });
        }
        let value = st.last + 1;
        let values = [value];
        let sems = [self.timeline];
        let cmds = [sub.cmd];
        let mut ti = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let si = vk::SubmitInfo::default()
            .command_buffers(&cmds)
            .signal_semaphores(&sems)
            .push_next(&mut ti);
        // SAFETY: the queue is externally synchronised by `state`'s lock (held by the caller);
        // the command buffer is executable and every resource it uses stays alive until the
        // timeline reaches `value` (buffers are retired against the timeline).
        let r = unsafe {
            self.device
                .queue_submit(self.queue, &[si], vk::Fence::null())
        };
        if let Err(r) = r {
            self.abandon(st, sub);
            return Err(VulkanError::Vk {
                call: "vkQueueSubmit",
                result: r,
            });
        }
        st.last = value;
        sub.value = value;
        st.inflight.push_back(sub);
        Ok(())
    }

    /// Drops a submission that could not be submitted (waits for the device so its resources
    /// are idle before reuse).
    pub(super) fn abandon(&self, st: &mut State, mut sub: Submission) {
        // SAFETY: valid device; waiting makes every pool idle.
        unsafe {
            let _ = self.device.device_wait_idle();
            let _ = self
                .device
                .reset_command_pool(sub.pool, vk::CommandPoolResetFlags::empty());
        }
        for b in sub.retired.drain(..) {
            self.destroy_now(b);
        }
        sub.value = 0;
        sub.arena_used = 0;
        sub.desc_pool_at = 0;
        st.free.push(sub);
    }

    /// Records work with `f`: into the open batch, or into a fresh command buffer submitted when
    /// `f` returns (also when it fails after recording, so the queue stays consistent).
    pub fn record<R>(&self, f: impl FnOnce(&mut Rec<'_>) -> Result<R>) -> Result<R> {
        let mut st = self.lock();
        if let Some(mut sub) = st.batch.take() {
            let r = {
                let mut rec = Rec {
                    ctx: self,
                    st: &mut st,
                    sub: &mut sub,
                };
                f(&mut rec)
            };
            st.batch = Some(sub);
            return r;
        }
        let mut sub = self.begin(&mut st)?;
        let r = {
            let mut rec = Rec {
                ctx: self,
                st: &mut st,
                sub: &mut sub,
            };
            f(&mut rec)
        };
        let s = self.submit(&mut st, sub);
        drop(st);
        let v = r?;
        s?;
        self.check_validation()?;
        Ok(v)
    }

    /// Submits the open batch, if any, and blocks until every submitted command has completed.
    pub fn wait_idle(&self) -> Result<()> {
        let mut st = self.lock();
        if let Some(sub) = st.batch.take() {
            self.submit(&mut st, sub)?;
        }
        let last = st.last;
        drop(st);
        let sems = [self.timeline];
        let values = [last];
        let wi = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        // SAFETY: valid timeline semaphore; waiting needs no external synchronisation.
        unsafe { self.device.wait_semaphores(&wi, u64::MAX) }
            .map_err(VulkanError::vk("vkWaitSemaphores"))?;
        let mut st = self.lock();
        self.reclaim(&mut st);
        drop(st);
        self.check_validation()
    }

    /// Opens a batch: later `record` calls append to one command buffer until `end_batch`.
    /// With `timestamp`, the batch starts by writing timestamp query 0.
    pub fn begin_batch(&self, timestamp: bool) -> Result<()> {
        self.wait_idle()?;
        let mut st = self.lock();
        let mut sub = self.begin(&mut st)?;
        if timestamp && let Some(pool) = self.query_pool {
            let mut rec = Rec {
                ctx: self,
                st: &mut st,
                sub: &mut sub,
            };
            rec.barrier();
            // SAFETY: recording command buffer; the pool has 2 queries.
            unsafe {
                self.device.cmd_reset_query_pool(sub.cmd, pool, 0, 2);
                self.device.cmd_write_timestamp(
                    sub.cmd,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    pool,
                    0,
                );
            }
        }
        st.batch = Some(sub);
        Ok(())
    }

    /// Ends the batch (writing timestamp 1 when asked), submits it and waits; returns the
    /// nanoseconds between the two timestamps when both were written.
    pub fn end_batch(&self, timestamp: bool) -> Result<Option<f64>> {
        if timestamp && let Some(pool) = self.query_pool {
            self.record(|rec| {
                rec.barrier();
                // SAFETY: recording command buffer; query 1 of the pool was reset at the
                // batch's start.
                unsafe {
                    rec.ctx.device.cmd_write_timestamp(
                        rec.sub.cmd,
                        vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                        pool,
                        1,
                    )
                };
                Ok(())
            })?;
        }
        self.wait_idle()?;
        let (Some(pool), Some(period), true) =
            (self.query_pool, self.limits.timestamp_period, timestamp)
        else {
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
}
