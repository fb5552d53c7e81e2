//! Buffers and their memory: device-local, mapped host-visible, and imported host allocations;
//! the device memory budget.

use super::*;

impl Context {
    pub(super) fn memory_type(&self, bits: u32, want: &[vk::MemoryPropertyFlags]) -> Option<u32> {
        for &flags in want {
            for i in 0..self.mem.memory_type_count {
                let t = self.mem.memory_types[i as usize];
                if bits & (1 << i) != 0 && t.property_flags.contains(flags) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Buffer create info shared by every kind: storage and transfer usage, shared by the lane
    /// families when there are several (no ownership transfers needed).
    fn buffer_info(&self, size: u64) -> vk::BufferCreateInfo<'_> {
        let info = vk::BufferCreateInfo::default().size(size).usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST,
        );
        if self.families.len() > 1 {
            info.sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(&self.families)
        } else {
            info.sharing_mode(vk::SharingMode::EXCLUSIVE)
        }
    }

    /// Refuses an allocation larger than one Vulkan allocation may be, naming the limit.
    fn check_allocation_size(&self, size: u64, kind: MemKind) -> Result<()> {
        let max = self.limits.max_allocation;
        if max > 0 && size > max {
            return Err(VulkanError::Unsupported(format!(
                "a {kind:?} buffer of {size} bytes exceeds this device's largest single \
                 allocation (maxMemoryAllocationSize = {max} bytes); use a smaller pool (for \
                 `hisparse simulate`: a smaller --gpu-mem or --host-mem, or fewer --requests)"
            )));
        }
        Ok(())
    }

    /// Device-local heaps: `(free bytes now, total bytes)`. With `VK_EXT_memory_budget` the free
    /// bytes are the driver's budget minus its usage; without it, the heap sizes minus what this
    /// context allocated.
    pub fn device_memory(&self) -> (u64, u64) {
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props = vk::PhysicalDeviceMemoryProperties2::default();
        if self.limits.memory_budget {
            props = props.push_next(&mut budget);
        }
        // SAFETY: valid physical device of this instance; the budget struct is chained only
        // when the extension is enabled.
        unsafe {
            self.instance
                .get_physical_device_memory_properties2(self.pdev, &mut props)
        };
        let mem = props.memory_properties;
        let (mut free, mut total) = (0u64, 0u64);
        for h in 0..mem.memory_heap_count as usize {
            let heap = mem.memory_heaps[h];
            if !heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL) {
                continue;
            }
            total += heap.size;
            free += if self.limits.memory_budget {
                budget.heap_budget[h].saturating_sub(budget.heap_usage[h])
            } else {
                heap.size
            };
        }
        if !self.limits.memory_budget {
            free = free.saturating_sub(self.device_allocated.load(Ordering::SeqCst));
        }
        (free, total)
    }

    /// Creates a buffer of at least `len` bytes (rounded up to 16, at least 16) in `kind` memory.
    /// Host-accessible kinds are zeroed; device memory is zeroed by the caller on a queue.
    /// Device allocations are checked against the free device memory first (and, on devices
    /// whose memory is host memory, against the available RAM).
    pub fn create_buffer(&self, len: u64, kind: MemKind) -> Result<RawBuffer> {
        let size = len.max(16).div_ceil(16) * 16;
        self.check_allocation_size(size, kind)?;
        if kind == MemKind::Device && size >= 1 << 20 {
            let (free, _) = self.device_memory();
            let free = if self.limits.unified {
                free.min(hisparse_host_memory::available_ram().unwrap_or(u64::MAX))
            } else {
                free
            };
            if size > free {
                return Err(VulkanError::OutOfDeviceMemory { bytes: size, free });
            }
        }
        if kind == MemKind::Pinned
            && let Some(align) = self.limits.import_alignment
            && let Some(b) = self.import_host(size, align)?
        {
            return Ok(b);
        }
        let info = self.buffer_info(size);
        // SAFETY: valid device and create info.
        let buffer = unsafe { self.device.create_buffer(&info, None) }
            .map_err(VulkanError::vk("vkCreateBuffer"))?;
        // SAFETY: `buffer` was just created on this device.
        let req = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        use vk::MemoryPropertyFlags as F;
        let want: &[F] = match kind {
            MemKind::Device => &[F::DEVICE_LOCAL, F::empty()],
            MemKind::Pinned | MemKind::Staging => &[
                F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
                F::HOST_VISIBLE | F::HOST_COHERENT,
            ],
            MemKind::Arena => &[
                F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT,
                F::HOST_VISIBLE | F::HOST_COHERENT,
            ],
        };
        let destroy = |e: VulkanError| {
            // SAFETY: the buffer is unused and owned here.
            unsafe { self.device.destroy_buffer(buffer, None) };
            e
        };
        let Some(type_index) = self.memory_type(req.memory_type_bits, want) else {
            return Err(destroy(VulkanError::Unsupported(format!(
                "no memory type for {kind:?} buffers"
            ))));
        };
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(type_index);
        // SAFETY: valid allocate info for this device.
        let memory = unsafe { self.device.allocate_memory(&alloc, None) }.map_err(|r| {
            destroy(VulkanError::Vk {
                call: "vkAllocateMemory",
                result: r,
            })
        })?;
        let free = |e: VulkanError| {
            // SAFETY: memory and buffer are unused and owned here.
            unsafe {
                self.device.destroy_buffer(buffer, None);
                self.device.free_memory(memory, None);
            }
            e
        };
        // SAFETY: the memory type matches the buffer's requirements and the memory is unbound.
        unsafe { self.device.bind_buffer_memory(buffer, memory, 0) }.map_err(|r| {
            free(VulkanError::Vk {
                call: "vkBindBufferMemory",
                result: r,
            })
        })?;
        let mut ptr = std::ptr::null_mut();
        if kind != MemKind::Device {
            // SAFETY: host-visible memory, mapped once for the buffer's life.
            let p = unsafe {
                self.device
                    .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .map_err(|r| {
                free(VulkanError::Vk {
                    call: "vkMapMemory",
                    result: r,
                })
            })?;
            ptr = p.cast::<u8>();
            // SAFETY: the mapping covers at least `size` bytes (the allocation holds the buffer).
            unsafe { std::ptr::write_bytes(ptr, 0, size as usize) };
        }
        let device_bytes = if kind == MemKind::Device { req.size } else { 0 };
        self.device_allocated
            .fetch_add(device_bytes, Ordering::SeqCst);
        Ok(RawBuffer {
            buffer,
            memory,
            size,
            ptr,
            host: None,
            imported: false,
            device_bytes,
        })
    }

    /// Imports a fresh zeroed page-aligned host allocation; `Ok(None)` when the driver refuses
    /// (the caller falls back to host-visible memory).
    pub(super) fn import_host(&self, size: u64, align: u64) -> Result<Option<RawBuffer>> {
        let Some(ext) = &self.host_import else {
            return Ok(None);
        };
        let bytes = size.div_ceil(align) * align;
        let Ok(layout) = Layout::from_size_align(bytes as usize, align as usize) else {
            return Err(VulkanError::HostAllocation {
                bytes: bytes as usize,
            });
        };
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(VulkanError::HostAllocation {
                bytes: bytes as usize,
            });
        }
        let host = HostAlloc { ptr, layout };
        let dealloc = |h: &HostAlloc| {
            // SAFETY: allocated above with this layout and not imported (or already released).
            unsafe { std::alloc::dealloc(h.ptr, h.layout) };
        };
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut hp = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: `ptr` is a live allocation aligned to the import alignment; the function
        // pointer was loaded for this device with the extension enabled.
        let r = unsafe {
            (ext.fp().get_memory_host_pointer_properties_ext)(
                self.device.handle(),
                handle,
                ptr.cast_const().cast(),
                &mut hp,
            )
        };
        if r != vk::Result::SUCCESS {
            dealloc(&host);
            return Ok(None);
        }
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let info = self.buffer_info(bytes).push_next(&mut ext_info);
        // SAFETY: valid device and create info.
        let buffer = match unsafe { self.device.create_buffer(&info, None) } {
            Ok(b) => b,
            Err(_) => {
                dealloc(&host);
                return Ok(None);
            }
        };
        // SAFETY: `buffer` was just created on this device.
        let req = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        use vk::MemoryPropertyFlags as F;
        let Some(type_index) = self.memory_type(
            req.memory_type_bits & hp.memory_type_bits,
            &[F::HOST_VISIBLE | F::HOST_COHERENT, F::HOST_COHERENT],
        ) else {
            // SAFETY: unused buffer owned here.
            unsafe { self.device.destroy_buffer(buffer, None) };
            dealloc(&host);
            return Ok(None);
        };
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(handle)
            .host_pointer(ptr.cast());
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(bytes)
            .memory_type_index(type_index)
            .push_next(&mut import);
        // SAFETY: the host range [ptr, ptr + bytes) stays allocated until the memory is freed
        // (`destroy_buffer` frees the Vulkan memory before deallocating).
        let memory = match unsafe { self.device.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(_) => {
                // SAFETY: unused buffer owned here.
                unsafe { self.device.destroy_buffer(buffer, None) };
                dealloc(&host);
                return Ok(None);
            }
        };
        // SAFETY: compatible memory type, unbound memory of the full buffer size.
        if unsafe { self.device.bind_buffer_memory(buffer, memory, 0) }.is_err() {
            // SAFETY: unused objects owned here; memory freed before the host range.
            unsafe {
                self.device.destroy_buffer(buffer, None);
                self.device.free_memory(memory, None);
            }
            dealloc(&host);
            return Ok(None);
        }
        Ok(Some(RawBuffer {
            buffer,
            memory,
            size: bytes,
            ptr,
            host: Some(host),
            imported: true,
            device_bytes: 0,
        }))
    }

    /// Destroys a buffer no submitted work uses any more.
    pub(super) fn destroy_now(&self, b: RawBuffer) {
        self.device_allocated
            .fetch_sub(b.device_bytes, Ordering::SeqCst);
        // SAFETY: the caller guarantees no pending work references the buffer; the memory is
        // freed before the imported host range is released.
        unsafe {
            self.device.destroy_buffer(b.buffer, None);
            self.device.free_memory(b.memory, None);
            if let Some(h) = &b.host {
                std::alloc::dealloc(h.ptr, h.layout);
            }
        }
    }
}

/// Reads `dst.len()` bytes at `offset` of a host-accessible buffer.
pub fn read_host(b: &RawBuffer, offset: usize, dst: &mut [u8]) {
    assert!(
        !b.ptr.is_null() && offset + dst.len() <= b.size as usize,
        "host read out of bounds"
    );
    // SAFETY: `ptr` addresses `size` bytes of live host-accessible memory (checked above); the
    // caller waited for all device work, so nothing writes concurrently.
    unsafe { std::ptr::copy_nonoverlapping(b.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
}

/// Writes `src` at `offset` of a host-accessible buffer.
pub fn write_host(b: &mut RawBuffer, offset: usize, src: &[u8]) {
    assert!(
        !b.ptr.is_null() && offset + src.len() <= b.size as usize,
        "host write out of bounds"
    );
    // SAFETY: as in `read_host`; `&mut` excludes other host accesses.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr.add(offset), src.len()) };
}
