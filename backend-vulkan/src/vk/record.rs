//! Pipelines and the command recorder the operations use.

use super::*;

impl Context {
    pub(super) fn pipeline(
        &self,
        st: &mut State,
        shader: Shader,
    ) -> Result<(vk::PipelineLayout, vk::Pipeline, vk::DescriptorSetLayout)> {
        if let Some(p) = &st.pipelines[shader.index()] {
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
        st.pipelines[shader.index()] = Some(Pipeline {
            set_layout,
            layout,
            pipeline,
        });
        Ok((layout, pipeline, set_layout))
    }
}

/// A command buffer being recorded.
pub struct Rec<'a> {
    pub(super) ctx: &'a Context,
    pub(super) st: &'a mut State,
    pub(super) sub: &'a mut Submission,
}

impl Rec<'_> {
    /// A full memory barrier: every earlier command (of this and earlier submissions) completes
    /// and its writes become visible before any later command starts.
    pub fn barrier(&mut self) {
        let b = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE);
        // SAFETY: recording command buffer.
        unsafe {
            self.ctx.device.cmd_pipeline_barrier(
                self.sub.cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[b],
                &[],
                &[],
            )
        };
    }

    /// Fills `size` bytes (a multiple of 4) of `buffer` from `offset` with zeros.
    pub fn zero(&mut self, buffer: vk::Buffer, offset: u64, size: u64) {
        if size == 0 {
            return;
        }
        self.barrier();
        // SAFETY: recording command buffer; the range lies in the buffer (caller).
        unsafe {
            self.ctx
                .device
                .cmd_fill_buffer(self.sub.cmd, buffer, offset, size, 0)
        };
    }

    /// Copies regions between buffers (after a barrier). The regions must not overlap each
    /// other's destinations, nor (for one buffer) each other's sources.
    pub fn copy(&mut self, src: vk::Buffer, dst: vk::Buffer, regions: &[vk::BufferCopy]) {
        if regions.is_empty() {
            return;
        }
        self.barrier();
        // SAFETY: recording command buffer; regions lie inside the buffers (checked by the ops)
        // and do not overlap (caller).
        unsafe {
            self.ctx
                .device
                .cmd_copy_buffer(self.sub.cmd, src, dst, regions)
        };
    }

    /// Takes the device's scratch buffer, grown to at least `bytes`.
    pub fn scratch(&mut self, bytes: u64) -> Result<vk::Buffer> {
        if let Some(s) = &self.st.scratch
            && s.size >= bytes
        {
            return Ok(s.buffer);
        }
        let b = self
            .ctx
            .create_buffer(bytes.max(1 << 16), MemKind::Device)?;
        let handle = b.buffer;
        if let Some(old) = self.st.scratch.replace(b) {
            self.sub.retired.push(old);
        }
        Ok(handle)
    }

    /// Copies `words` into this submission's parameter arena; returns their binding.
    pub fn params(&mut self, words: &[u32]) -> Result<Binding> {
        let bytes = (words.len() as u64 * 4).max(16);
        let need = self.sub.arena_used + bytes;
        if self.sub.arena.as_ref().is_none_or(|a| a.size < need) {
            let size = need.max(64 << 10).next_power_of_two();
            let fresh = self.ctx.create_buffer(size, MemKind::Arena)?;
            if let Some(old) = self.sub.arena.replace(fresh) {
                if self.sub.arena_used > 0 {
                    self.sub.retired.push(old);
                } else {
                    self.ctx.destroy_now(old);
                }
            }
            self.sub.arena_used = 0;
        }
        let Some(arena) = &self.sub.arena else {
            return Err(VulkanError::Unsupported("no parameter arena".into()));
        };
        let offset = self.sub.arena_used;
        // SAFETY: the arena is mapped host-coherent memory of `arena.size ≥ offset + bytes`
        // bytes that no submitted work reads (this submission is still being recorded).
        unsafe {
            std::ptr::copy_nonoverlapping(
                words.as_ptr().cast::<u8>(),
                arena.ptr.add(offset as usize),
                words.len() * 4,
            )
        };
        self.sub.arena_used = (offset + bytes).div_ceil(256) * 256;
        Ok(Binding {
            buffer: arena.buffer,
            offset,
            range: bytes,
        })
    }

    fn descriptor_set(&mut self, set_layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        loop {
            if self.sub.desc_pool_at == self.sub.desc_pools.len() {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(64 * 40)];
                let pi = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(64)
                    .pool_sizes(&sizes);
                // SAFETY: valid device and create info.
                let pool = unsafe { self.ctx.device.create_descriptor_pool(&pi, None) }
                    .map_err(VulkanError::vk("vkCreateDescriptorPool"))?;
                self.sub.desc_pools.push(pool);
            }
            let pool = self.sub.desc_pools[self.sub.desc_pool_at];
            let layouts = [set_layout];
            let ai = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts);
            // SAFETY: the pool belongs to this submission, which only this recorder uses.
            match unsafe { self.ctx.device.allocate_descriptor_sets(&ai) } {
                Ok(s) => return Ok(s[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {
                    self.sub.desc_pool_at += 1;
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

    /// Dispatches `shader` over `groups` workgroups (split over x and y) after a barrier.
    pub fn dispatch(
        &mut self,
        shader: Shader,
        bindings: &[Binding],
        push: &[u32],
        groups: u64,
    ) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        let (layout, pipeline, set_layout) = self.ctx.pipeline(self.st, shader)?;
        debug_assert_eq!(bindings.len() as u32, shader.bindings());
        debug_assert_eq!(push.len() as u32 * 4, shader.push_bytes());
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
        let push_bytes: Vec<u8> = push.iter().flat_map(|w| w.to_ne_bytes()).collect();
        self.barrier();
        // SAFETY: the set was allocated from this submission's pool and is not in use; the
        // command buffer is recording; bindings, push constants and group counts were checked
        // against the pipeline's layout and the device limits above.
        unsafe {
            self.ctx.device.update_descriptor_sets(&writes, &[]);
            let d = &self.ctx.device;
            d.cmd_bind_pipeline(self.sub.cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_bind_descriptor_sets(
                self.sub.cmd,
                vk::PipelineBindPoint::COMPUTE,
                layout,
                0,
                &[set],
                &[],
            );
            d.cmd_push_constants(
                self.sub.cmd,
                layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &push_bytes,
            );
            d.cmd_dispatch(self.sub.cmd, x as u32, y as u32, 1);
        }
        Ok(())
    }
}
