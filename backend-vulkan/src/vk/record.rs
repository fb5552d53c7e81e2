//! Pipelines, and the command recorder the operations use, with the hazard tracking that places
//! pipeline barriers only where a command depends on an earlier one.

use super::*;

impl Context {
    pub(super) fn pipeline(
        &self,
        pipelines: &mut [Option<Pipeline>],
        shader: Shader,
    ) -> Result<(vk::PipelineLayout, vk::Pipeline, vk::DescriptorSetLayout)> {
        if let Some(p) = &pipelines[shader.index()] {
            return Ok((p.layout, p.pipeline, p.set_layout));
        }
        let n = shader.bindings();
        if n > self.limits.max_storage_per_stage {
            return Err(VulkanError::Unsupported(format!(
                "{} needs {n} storage buffers per stage; the device allows {}",
                shader.name(),
                self.limits.max_storage_per_stage
            )));
        }
        let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..n)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let li = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: valid device and create info.
        let set_layout = unsafe { self.device.create_descriptor_set_layout(&li, None) }
            .map_err(VulkanError::vk("vkCreateDescriptorSetLayout"))?;
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(shader.push_bytes())];
        let layouts = [set_layout];
        let pli = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&layouts)
            .push_constant_ranges(&ranges);
        // SAFETY: valid device and create info.
        let layout = match unsafe { self.device.create_pipeline_layout(&pli, None) } {
            Ok(l) => l,
            Err(r) => {
                // SAFETY: unused layout.
                unsafe { self.device.destroy_descriptor_set_layout(set_layout, None) };
                return Err(VulkanError::Vk {
                    call: "vkCreatePipelineLayout",
                    result: r,
                });
            }
        };
        let cleanup = || {
            // SAFETY: unused layouts owned here.
            unsafe {
                self.device.destroy_pipeline_layout(layout, None);
                self.device.destroy_descriptor_set_layout(set_layout, None);
            }
        };
        let words = match ash::util::read_spv(&mut std::io::Cursor::new(shader.spirv())) {
            Ok(w) => w,
            Err(e) => {
                cleanup();
                return Err(VulkanError::Unsupported(format!(
                    "embedded SPIR-V of {} unreadable: {e}",
                    shader.name()
                )));
            }
        };
        let mi = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: valid SPIR-V produced and validated at build time.
        let module = match unsafe { self.device.create_shader_module(&mi, None) } {
            Ok(m) => m,
            Err(r) => {
                cleanup();
                return Err(VulkanError::Vk {
                    call: "vkCreateShaderModule",
                    result: r,
                });
            }
        };
        let entry = CString::new("main").unwrap_or_default();
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(entry.as_c_str());
        let ci = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)];
        // SAFETY: valid module, layout and entry point name.
        let created = unsafe {
            self.device
                .create_compute_pipelines(vk::PipelineCache::null(), &ci, None)
        };
        // SAFETY: the module is no longer needed once the pipeline is created (or failed).
        unsafe { self.device.destroy_shader_module(module, None) };
        let pipeline = match created {
            Ok(p) => p[0],
            Err((_, r)) => {
                cleanup();
                return Err(VulkanError::Vk {
                    call: "vkCreateComputePipelines",
                    result: r,
                });
            }
        };
        pipelines[shader.index()] = Some(Pipeline {
            set_layout,
            layout,
            pipeline,
        });
        Ok((layout, pipeline, set_layout))
    }
}

/// A byte range of one buffer that a command reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The buffer.
    pub buffer: vk::Buffer,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl Span {
    /// The bytes a binding covers.
    pub fn of(b: &Binding) -> Span {
        Span {
            buffer: b.buffer,
            start: b.offset,
            end: b.offset + b.range,
        }
    }

    fn overlaps(&self, o: &Span) -> bool {
        self.buffer == o.buffer && self.start < o.end && o.start < self.end
    }
}

/// What the commands recorded since the last barrier read and wrote. A new command needs a
/// barrier first when it reads or writes bytes they wrote (read-after-write, write-after-write)
/// or writes bytes they read (write-after-read); otherwise it may run alongside them.
#[derive(Debug, Default)]
pub struct Hazards {
    reads: Vec<Span>,
    writes: Vec<Span>,
    /// A copy or fill was recorded since the last barrier (a barrier after it must cover the
    /// transfer stage).
    transfers: bool,
}

impl Hazards {
    /// Records a command's accesses; returns whether a barrier must precede it (the tracker then
    /// starts over from this command).
    pub fn access(&mut self, reads: &[Span], writes: &[Span]) -> bool {
        let conflict = reads
            .iter()
            .chain(writes)
            .any(|a| self.writes.iter().any(|w| w.overlaps(a)))
            || writes
                .iter()
                .any(|a| self.reads.iter().any(|r| r.overlaps(a)));
        if conflict {
            self.clear();
        }
        self.reads.extend_from_slice(reads);
        self.writes.extend_from_slice(writes);
        conflict
    }

    /// Forgets everything (after a full barrier).
    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
        self.transfers = false;
    }
}

/// A command buffer being recorded (a stream's open batch).
pub struct Rec<'a> {
    pub(super) ctx: &'a Context,
    pub(super) pipelines: &'a mut Vec<Option<Pipeline>>,
    pub(super) open: &'a mut Open,
    pub(super) scratch: &'a mut Option<RawBuffer>,
}

impl Rec<'_> {
    /// The command buffer.
    pub(super) fn cmd(&self) -> vk::CommandBuffer {
        self.open.sub.cmd
    }

    /// A full memory barrier: every earlier command (of this and earlier submissions to the
    /// queue) completes and its writes become visible before any later command starts.
    pub fn barrier(&mut self) {
        self.open.hazards.clear();
        let b = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE);
        // SAFETY: recording command buffer.
        unsafe {
            self.ctx.device.cmd_pipeline_barrier(
                self.cmd(),
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[b],
                &[],
                &[],
            )
        };
    }

    /// Places a barrier before a command with these accesses when it depends on earlier ones.
    /// `dispatch` says the command is a compute dispatch: when every command since the previous
    /// barrier was one too, the barrier covers only the compute-shader stage and shader
    /// accesses (the previous barrier already ordered everything before it, and execution
    /// dependencies chain through the compute stage), which lets the driver skip the
    /// all-stage drain and cache maintenance an `ALL_COMMANDS` barrier asks for.
    fn access(&mut self, reads: &[Span], writes: &[Span], dispatch: bool) {
        self.open.commands += 1;
        let only_dispatches_before = !self.open.hazards.transfers;
        if self.open.hazards.access(reads, writes) {
            // The tracker already restarted from this command; the barrier must not clear it.
            let (stage, src, dst) =
                if dispatch && only_dispatches_before && self.ctx.compute_barriers {
                    (
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::AccessFlags::SHADER_WRITE,
                        vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
                    )
                } else {
                    (
                        vk::PipelineStageFlags::ALL_COMMANDS,
                        vk::AccessFlags::MEMORY_WRITE,
                        vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE,
                    )
                };
            let b = vk::MemoryBarrier::default()
                .src_access_mask(src)
                .dst_access_mask(dst);
            // SAFETY: recording command buffer; the access masks belong to the stages.
            unsafe {
                self.ctx.device.cmd_pipeline_barrier(
                    self.cmd(),
                    stage,
                    stage,
                    vk::DependencyFlags::empty(),
                    &[b],
                    &[],
                    &[],
                )
            };
        }
        self.open.hazards.transfers |= !dispatch;
    }

    /// Names the recording call's first command for the profile.
    fn first(&mut self, name: &'static str) {
        if self.open.first.is_empty() {
            self.open.first = name;
        }
    }

    /// Fills `size` bytes (a multiple of 4) of `buffer` from `offset` with zeros.
    pub fn zero(&mut self, buffer: vk::Buffer, offset: u64, size: u64) {
        if size == 0 {
            return;
        }
        self.first("vkCmdFillBuffer");
        self.access(
            &[],
            &[Span {
                buffer,
                start: offset,
                end: offset + size,
            }],
            false,
        );
        // SAFETY: recording command buffer; the range lies in the buffer (caller).
        unsafe {
            self.ctx
                .device
                .cmd_fill_buffer(self.cmd(), buffer, offset, size, 0)
        };
    }

    /// Copies regions between buffers. The regions must not overlap each other's destinations,
    /// nor (for one buffer) each other's sources.
    pub fn copy(&mut self, src: vk::Buffer, dst: vk::Buffer, regions: &[vk::BufferCopy]) {
        if regions.is_empty() {
            return;
        }
        self.first("vkCmdCopyBuffer");
        let span = |buffer, f: fn(&vk::BufferCopy) -> u64| Span {
            buffer,
            start: regions.iter().map(f).min().unwrap_or(0),
            end: regions.iter().map(|r| f(r) + r.size).max().unwrap_or(0),
        };
        let reads = [span(src, |r| r.src_offset)];
        let writes = [span(dst, |r| r.dst_offset)];
        self.access(&reads, &writes, false);
        // SAFETY: recording command buffer; regions lie inside the buffers (checked by the ops)
        // and do not overlap (caller).
        unsafe {
            self.ctx
                .device
                .cmd_copy_buffer(self.cmd(), src, dst, regions)
        };
    }

    /// Writes timestamp query `query` of the context's pool once all earlier work completed.
    pub(super) fn timestamp(&mut self, pool: vk::QueryPool, query: u32, reset: bool) {
        self.barrier();
        // SAFETY: recording command buffer on compute lane 0 (whose family has timestamp
        // bits); the pool has 2 queries, reset before they are written.
        unsafe {
            if reset {
                self.ctx.device.cmd_reset_query_pool(self.cmd(), pool, 0, 2);
            }
            self.ctx.device.cmd_write_timestamp(
                self.cmd(),
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                pool,
                query,
            );
        }
    }

    /// The recording stream's scratch buffer, grown to at least `bytes`.
    pub fn scratch(&mut self, bytes: u64) -> Result<vk::Buffer> {
        if let Some(s) = &*self.scratch
            && s.size >= bytes
        {
            return Ok(s.buffer);
        }
        let b = self
            .ctx
            .create_buffer(bytes.max(1 << 16), MemKind::Device)?;
        let handle = b.buffer;
        if let Some(old) = self.scratch.replace(b) {
            // Earlier submissions of this stream used it; they complete before this one.
            self.open.sub.retired.push(old);
        }
        Ok(handle)
    }

    /// Copies `words` into this submission's parameter arena; returns their binding.
    pub fn params<T: Copy>(&mut self, words: &[T]) -> Result<Binding> {
        let len = std::mem::size_of_val(words) as u64;
        let bytes = len.max(16).div_ceil(16) * 16;
        let sub = &mut self.open.sub;
        let need = sub.arena_used + bytes;
        if sub.arena.as_ref().is_none_or(|a| a.size < need) {
            // At least twice the arena it replaces: the submission keeps its arena when it is
            // recycled, so a stream whose batches carry long tile lists (page copies, large
            // device copies) stops allocating after a few batches instead of allocating memory
            // for every call.
            let grown = sub.arena.as_ref().map_or(0, |a| 2 * a.size);
            let size = bytes.max(grown).max(64 << 10).next_power_of_two();
            let fresh = self.ctx.create_buffer(size, MemKind::Arena)?;
            if let Some(old) = sub.arena.replace(fresh) {
                if sub.arena_used > 0 {
                    sub.retired.push(old);
                } else {
                    self.ctx.destroy_now(old);
                }
            }
            sub.arena_used = 0;
        }
        let Some(arena) = &sub.arena else {
            return Err(VulkanError::Unsupported("no parameter arena".into()));
        };
        let offset = sub.arena_used;
        // SAFETY: the arena is mapped host-coherent memory of `arena.size ≥ offset + bytes`
        // bytes that no submitted work reads (this submission is still being recorded); `T` is
        // plain data (`Copy`) read as bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                words.as_ptr().cast::<u8>(),
                arena.ptr.add(offset as usize),
                len as usize,
            )
        };
        let align = self.ctx.limits.storage_offset_alignment.max(16);
        sub.arena_used = (offset + bytes).div_ceil(align) * align;
        Ok(Binding {
            buffer: arena.buffer,
            offset,
            range: bytes,
        })
    }

    fn descriptor_set(&mut self, set_layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let sub = &mut self.open.sub;
        loop {
            if sub.desc_pool_at == sub.desc_pools.len() {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(64 * 40)];
                let pi = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(64)
                    .pool_sizes(&sizes);
                // SAFETY: valid device and create info.
                let pool = unsafe { self.ctx.device.create_descriptor_pool(&pi, None) }
                    .map_err(VulkanError::vk("vkCreateDescriptorPool"))?;
                sub.desc_pools.push(pool);
            }
            let pool = sub.desc_pools[sub.desc_pool_at];
            let layouts = [set_layout];
            let ai = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts);
            // SAFETY: the pool belongs to this submission, which only this recorder uses.
            match unsafe { self.ctx.device.allocate_descriptor_sets(&ai) } {
                Ok(s) => return Ok(s[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {
                    sub.desc_pool_at += 1;
                }
                Err(r) => {
                    return Err(VulkanError::Vk {
                        call: "vkAllocateDescriptorSets",
                        result: r,
                    });
                }
            }
        }
    }

    /// Dispatches `shader` over `groups` workgroups (split over x and y), after a barrier when
    /// it depends on earlier commands of the batch (its accesses: every binding, read or
    /// written as the shader declares).
    pub fn dispatch(
        &mut self,
        shader: Shader,
        bindings: &[Binding],
        push: &[u32],
        groups: u64,
    ) -> Result<()> {
        self.dispatch_inner(shader, bindings, push, groups, None)
    }

    /// [`Rec::dispatch`] for a dispatch that touches only `access = (reads, writes)` of its
    /// bindings (the caller knows the bytes; every byte the shader may touch must be listed).
    pub fn dispatch_with_access(
        &mut self,
        shader: Shader,
        bindings: &[Binding],
        push: &[u32],
        groups: u64,
        access: (&[Span], &[Span]),
    ) -> Result<()> {
        self.dispatch_inner(shader, bindings, push, groups, Some(access))
    }

    fn dispatch_inner(
        &mut self,
        shader: Shader,
        bindings: &[Binding],
        push: &[u32],
        groups: u64,
        access: Option<(&[Span], &[Span])>,
    ) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        let (layout, pipeline, set_layout) = self.ctx.pipeline(self.pipelines, shader)?;
        if bindings.len() as u32 != shader.bindings()
            || push.len() as u32 * 4 != shader.push_bytes()
        {
            return Err(VulkanError::Unsupported(format!(
                "{}: {} bindings and {} push bytes given, {} and {} declared (a backend bug)",
                shader.name(),
                bindings.len(),
                push.len() * 4,
                shader.bindings(),
                shader.push_bytes()
            )));
        }
        for b in bindings {
            if b.range > self.ctx.limits.max_storage_range {
                return Err(VulkanError::Unsupported(format!(
                    "{}: a binding of {} bytes exceeds maxStorageBufferRange ({})",
                    shader.name(),
                    b.range,
                    self.ctx.limits.max_storage_range
                )));
            }
        }
        let x = groups.min(65535);
        let y = groups.div_ceil(x);
        if y > 65535 {
            return Err(VulkanError::Unsupported(format!(
                "{}: {groups} workgroups exceed one dispatch",
                shader.name()
            )));
        }
        let set = self.descriptor_set(set_layout)?;
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bindings
            .iter()
            .map(|b| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(b.buffer)
                    .offset(b.offset)
                    .range(b.range)]
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        match access {
            Some((reads, written)) => self.access(reads, written, true),
            None => {
                let mut reads = Vec::with_capacity(bindings.len());
                let mut written = Vec::new();
                for (i, b) in bindings.iter().enumerate() {
                    if shader.writes(i as u32) {
                        written.push(Span::of(b));
                    } else {
                        reads.push(Span::of(b));
                    }
                }
                self.access(&reads, &written, true);
            }
        }
        self.first(shader.name());
        let push_bytes: Vec<u8> = push.iter().flat_map(|w| w.to_ne_bytes()).collect();
        // SAFETY: the set was allocated from this submission's pool and is not in use; the
        // command buffer is recording; bindings, push constants and group counts were checked
        // against the pipeline's layout and the device limits above.
        unsafe {
            self.ctx.device.update_descriptor_sets(&writes, &[]);
            let d = &self.ctx.device;
            d.cmd_bind_pipeline(self.cmd(), vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_bind_descriptor_sets(
                self.cmd(),
                vk::PipelineBindPoint::COMPUTE,
                layout,
                0,
                &[set],
                &[],
            );
            d.cmd_push_constants(
                self.cmd(),
                layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &push_bytes,
            );
            d.cmd_dispatch(self.cmd(), x as u32, y as u32, 1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ash::vk::Handle;

    fn span(buffer: u64, start: u64, end: u64) -> Span {
        Span {
            buffer: vk::Buffer::from_raw(buffer),
            start,
            end,
        }
    }

    #[test]
    fn barriers_only_where_commands_depend_on_each_other() {
        let mut h = Hazards::default();
        // Two commands reading the same bytes and writing different buffers: no barrier.
        assert!(!h.access(&[span(1, 0, 64)], &[span(2, 0, 64)]));
        assert!(!h.access(&[span(1, 0, 64)], &[span(3, 0, 64)]));
        // Disjoint ranges of one written buffer: no barrier.
        assert!(!h.access(&[], &[span(2, 64, 128)]));
        // Read after write.
        assert!(h.access(&[span(2, 32, 40)], &[span(4, 0, 8)]));
        // The tracker restarted from that command: buffer 3's earlier write is forgotten.
        assert!(!h.access(&[span(3, 0, 64)], &[]));
        // Write after read (buffer 2 was read by the command after the barrier).
        assert!(h.access(&[], &[span(2, 39, 41)]));
        // Write after write.
        assert!(h.access(&[], &[span(2, 0, 64)]));
        // Touching ranges do not overlap.
        assert!(!h.access(&[span(2, 64, 70)], &[]));
    }
}
