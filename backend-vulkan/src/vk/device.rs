//! Instance and device creation, device selection and the validation messenger.

use super::*;

fn api_version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

fn c_name(bytes: &[std::ffi::c_char]) -> String {
    // The Vulkan spec guarantees NUL-terminated fixed arrays; fall back to the whole array.
    let bytes: Vec<u8> = bytes
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

struct Candidate {
    index: usize,
    pdev: vk::PhysicalDevice,
    name: String,
}

/// What device creation produced, for [`Context::finish`].
pub(super) struct Parts {
    pdev: vk::PhysicalDevice,
    device: ash::Device,
    name: String,
    has_import: bool,
    has_budget: bool,
    /// The compute family and how many of its queues were created.
    compute: (u32, u32),
    /// A dedicated transfer family (one queue created), if the device has one.
    transfer: Option<u32>,
}

/// The queue families the backend uses: the first compute-capable family (with
/// `dedicated_compute`, the first without graphics where there is one), and a family with
/// transfer but neither graphics nor compute (a DMA engine).
fn pick_families(
    families: &[vk::QueueFamilyProperties],
    dedicated_compute: bool,
) -> Option<(u32, u32, Option<u32>)> {
    let computes = |f: &vk::QueueFamilyProperties| {
        f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0
    };
    let dedicated = families
        .iter()
        .position(|f| computes(f) && !f.queue_flags.contains(vk::QueueFlags::GRAPHICS))
        .filter(|_| dedicated_compute);
    let compute = dedicated.or_else(|| families.iter().position(computes))?;
    let transfer = families.iter().position(|f| {
        f.queue_count > 0
            && f.queue_flags.contains(vk::QueueFlags::TRANSFER)
            && !f
                .queue_flags
                .intersects(vk::QueueFlags::COMPUTE | vk::QueueFlags::GRAPHICS)
    });
    Some((
        compute as u32,
        families[compute].queue_count.min(MAX_COMPUTE_LANES),
        transfer.map(|t| t as u32),
    ))
}

impl Context {
    /// Opens the device chosen by `selector` (see `VulkanDevice::open`); with `strict`, work
    /// after which the validation layer reported warnings or errors fails; with
    /// `dedicated_compute`, compute work goes to a family without graphics where there is one.
    pub fn open(selector: &str, strict: bool, dedicated_compute: bool) -> Result<Context> {
        Self::open_with(selector, strict, false, dedicated_compute)
    }

    /// [`Context::open`], enabling the Khronos validation layer explicitly with `layer`.
    pub fn open_with(
        selector: &str,
        strict: bool,
        layer: bool,
        dedicated_compute: bool,
    ) -> Result<Context> {
        let before = validation_message_count();
        let mut ctx = Self::open_inner(selector, layer, dedicated_compute)?;
        ctx.strict = strict;
        ctx.checked = AtomicUsize::new(before);
        ctx.check_validation()?;
        Ok(ctx)
    }

    /// In strict mode, an error when validation messages appeared since the last check.
    pub fn check_validation(&self) -> Result<()> {
        let now = validation_message_count();
        let before = self.checked.swap(now, Ordering::SeqCst);
        if self.strict && now > before {
            return Err(VulkanError::Validation {
                messages: now - before,
            });
        }
        Ok(())
    }

    pub(super) fn open_inner(
        selector: &str,
        layer: bool,
        dedicated_compute: bool,
    ) -> Result<Context> {
        // SAFETY: loading the system Vulkan loader runs its initialisers; this is the documented
        // way to use ash with run-time linking, and the library stays loaded inside `Entry`.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| VulkanError::LoaderNotFound(e.to_string()))?;
        // SAFETY: a global command with no handles; the entry is valid.
        let exts = unsafe { entry.enumerate_instance_extension_properties(None) }
            .map_err(VulkanError::vk("vkEnumerateInstanceExtensionProperties"))?;
        let validation = c"VK_LAYER_KHRONOS_validation";
        let layer_exts = if layer {
            // SAFETY: a global command with no handles; the layer name is NUL-terminated.
            unsafe { entry.enumerate_instance_extension_properties(Some(validation)) }
                .map_err(VulkanError::vk("vkEnumerateInstanceExtensionProperties"))?
        } else {
            Vec::new()
        };
        let has_debug = exts
            .iter()
            .chain(&layer_exts)
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::debug_utils::NAME));
        let layers = if layer {
            vec![validation.as_ptr()]
        } else {
            Vec::new()
        };
        let app_name = c"hisparse";
        let app = vk::ApplicationInfo::default()
            .application_name(app_name)
            .engine_name(app_name)
            .api_version(vk::API_VERSION_1_2);
        let mut ext_names = Vec::new();
        if has_debug {
            ext_names.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        let info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&ext_names);
        // SAFETY: `info` and everything it points to live until the call returns.
        let instance = unsafe { entry.create_instance(&info, None) }.map_err(|r| match r {
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => VulkanError::NoDevice(
                "the Vulkan loader found no driver (ICD) supporting Vulkan 1.2".into(),
            ),
            r => VulkanError::Vk {
                call: "vkCreateInstance",
                result: r,
            },
        })?;
        let debug = if has_debug {
            let du = ash::ext::debug_utils::Instance::new(&entry, &instance);
            let ci = vk::DebugUtilsMessengerCreateInfoEXT::default()
                .message_severity(
                    vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                        | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
                )
                .message_type(
                    vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                        | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                        | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
                )
                .pfn_user_callback(Some(debug_callback));
            // SAFETY: valid instance with VK_EXT_debug_utils enabled; the callback is a plain
            // function that stays valid for the program's life.
            match unsafe { du.create_debug_utils_messenger(&ci, None) } {
                Ok(m) => Some((du, m)),
                Err(_) => None,
            }
        } else {
            None
        };
        let destroy_instance =
            |debug: &Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>| {
                // SAFETY: the messenger and instance were created above and nothing else uses them.
                unsafe {
                    if let Some((du, m)) = debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
            };
        match Self::create_device(&entry, &instance, selector, dedicated_compute) {
            Ok(parts) => Self::finish(entry, instance, debug, parts),
            Err(e) => {
                destroy_instance(&debug);
                Err(e)
            }
        }
    }

    pub(super) fn suitability(
        instance: &ash::Instance,
        pdev: vk::PhysicalDevice,
        dedicated_compute: bool,
    ) -> core::result::Result<(u32, u32, Option<u32>), String> {
        // SAFETY: `pdev` was enumerated from `instance`.
        let props = unsafe { instance.get_physical_device_properties(pdev) };
        if props.api_version < vk::API_VERSION_1_2 {
            return Err(format!(
                "Vulkan {} (1.2 needed)",
                api_version_string(props.api_version)
            ));
        }
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f12);
        // SAFETY: as above; the chain is a valid Vulkan 1.2 feature query.
        unsafe { instance.get_physical_device_features2(pdev, &mut f2) };
        if f12.timeline_semaphore == vk::FALSE {
            return Err("no timelineSemaphore feature".into());
        }
        let l = props.limits;
        if l.max_compute_work_group_invocations < 256 || l.max_compute_work_group_size[0] < 256 {
            return Err("compute workgroups of 256 invocations unsupported".into());
        }
        let storage = l
            .max_per_stage_descriptor_storage_buffers
            .min(l.max_descriptor_set_storage_buffers);
        if storage < Shader::Resolve.bindings() {
            return Err(format!(
                "only {storage} storage buffers per stage (maxPerStageDescriptorStorageBuffers; {} \
                 needed)",
                Shader::Resolve.bindings()
            ));
        }
        if l.max_push_constants_size < 64 || l.max_compute_shared_memory_size < 8192 {
            return Err("push constants or shared memory too small".into());
        }
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pdev) };
        pick_families(&families, dedicated_compute).ok_or_else(|| "no compute queue".into())
    }

    pub(super) fn create_device(
        _entry: &ash::Entry,
        instance: &ash::Instance,
        selector: &str,
        dedicated_compute: bool,
    ) -> Result<Parts> {
        // SAFETY: valid instance.
        let pdevs = unsafe { instance.enumerate_physical_devices() }
            .map_err(VulkanError::vk("vkEnumeratePhysicalDevices"))?;
        if pdevs.is_empty() {
            return Err(VulkanError::NoDevice(
                "the Vulkan loader lists no physical device".into(),
            ));
        }
        let cands: Vec<Candidate> = pdevs
            .iter()
            .enumerate()
            .map(|(index, &pdev)| {
                // SAFETY: `pdev` was enumerated from `instance`.
                let props = unsafe { instance.get_physical_device_properties(pdev) };
                Candidate {
                    index,
                    pdev,
                    name: c_name(&props.device_name),
                }
            })
            .collect();
        let all: Vec<String> = cands
            .iter()
            .map(|c| format!("{}: {}", c.index, c.name))
            .collect();
        let sel = selector.trim();
        let matching: Vec<&Candidate> = if sel.is_empty() {
            cands.iter().collect()
        } else if let Ok(i) = sel.parse::<usize>() {
            cands.iter().filter(|c| c.index == i).collect()
        } else {
            let s = sel.to_lowercase();
            cands
                .iter()
                .filter(|c| c.name.to_lowercase().contains(&s))
                .collect()
        };
        if matching.is_empty() {
            return Err(VulkanError::NoDevice(format!(
                "no Vulkan device matches {sel:?} (devices: {})",
                all.join(", ")
            )));
        }
        let mut reasons = Vec::new();
        let mut chosen = None;
        for c in matching {
            match Self::suitability(instance, c.pdev, dedicated_compute) {
                Ok(families) => {
                    chosen = Some((c, families));
                    break;
                }
                Err(why) => reasons.push(format!("{}: {}: {why}", c.index, c.name)),
            }
        }
        let Some((cand, (cf, cn, tf))) = chosen else {
            return Err(VulkanError::Unsupported(reasons.join("; ")));
        };
        // SAFETY: `cand.pdev` was enumerated from `instance`.
        let dev_exts = unsafe { instance.enumerate_device_extension_properties(cand.pdev) }
            .map_err(VulkanError::vk("vkEnumerateDeviceExtensionProperties"))?;
        let has = |name: &std::ffi::CStr| {
            dev_exts
                .iter()
                .any(|e| e.extension_name_as_c_str() == Ok(name))
        };
        let has_import = has(ash::ext::external_memory_host::NAME);
        let has_budget = has(ash::ext::memory_budget::NAME);
        let mut ext_names = Vec::new();
        if has_import {
            ext_names.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        if has_budget {
            ext_names.push(ash::ext::memory_budget::NAME.as_ptr());
        }
        let prio = [1.0f32; MAX_COMPUTE_LANES as usize];
        let mut queues = vec![
            vk::DeviceQueueCreateInfo::default()
                .queue_family_index(cf)
                .queue_priorities(&prio[..cn as usize]),
        ];
        if let Some(tf) = tf {
            queues.push(
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(tf)
                    .queue_priorities(&prio[..1]),
            );
        }
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&ext_names)
            .push_next(&mut f12);
        // SAFETY: `info` and its chain live until the call returns; the features, extensions
        // and queue counts were checked above.
        let device = unsafe { instance.create_device(cand.pdev, &info, None) }
            .map_err(VulkanError::vk("vkCreateDevice"))?;
        Ok(Parts {
            pdev: cand.pdev,
            device,
            name: cand.name.clone(),
            has_import,
            has_budget,
            compute: (cf, cn),
            transfer: tf,
        })
    }

    pub(super) fn finish(
        entry: ash::Entry,
        instance: ash::Instance,
        debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
        parts: Parts,
    ) -> Result<Context> {
        let Parts {
            pdev,
            device,
            name,
            has_import,
            has_budget,
            compute: (cf, cn),
            transfer,
        } = parts;
        let mut host_props = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut driver)
            .push_next(&mut m3)
            .push_next(&mut subgroup);
        if has_import {
            props2 = props2.push_next(&mut host_props);
        }
        // SAFETY: valid physical device; the chained structs are supported (1.1 / 1.2 core, the
        // enabled extension).
        unsafe { instance.get_physical_device_properties2(pdev, &mut props2) };
        let props = props2.properties;
        // SAFETY: as above.
        let mem = unsafe { instance.get_physical_device_memory_properties(pdev) };
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pdev) };
        let ts_bits = families[cf as usize].timestamp_valid_bits;
        let mut lanes = Vec::new();
        for i in 0..cn {
            // SAFETY: the queue family and index were requested at device creation.
            let queue = unsafe { device.get_device_queue(cf, i) };
            lanes.push(Lane {
                queue,
                family_slot: 0,
                transfer: false,
            });
        }
        let mut family_list = vec![cf];
        let transfer_lane = transfer.map(|tf| {
            family_list.push(tf);
            // SAFETY: as above.
            let queue = unsafe { device.get_device_queue(tf, 0) };
            lanes.push(Lane {
                queue,
                family_slot: 1,
                transfer: true,
            });
            lanes.len() - 1
        });
        let max_range = u64::from(props.limits.max_storage_buffer_range);
        let window = 1u64 << (63 - max_range.min(1 << 31).leading_zeros());
        let ty = props.device_type;
        let wide = props.limits.max_compute_work_group_invocations >= 1024
            && props.limits.max_compute_work_group_size[0] >= 1024;
        let shared = props.limits.max_compute_shared_memory_size;
        let limits = Limits {
            max_storage_range: max_range,
            window,
            max_storage_per_stage: props
                .limits
                .max_per_stage_descriptor_storage_buffers
                .min(props.limits.max_descriptor_set_storage_buffers),
            storage_offset_alignment: props.limits.min_storage_buffer_offset_alignment.max(4),
            max_allocation: m3.max_memory_allocation_size,
            timestamp_period: (ts_bits > 0).then_some(f64::from(props.limits.timestamp_period)),
            import_alignment: has_import
                .then_some(host_props.min_imported_host_pointer_alignment.max(4096)),
            gpu: ty != vk::PhysicalDeviceType::CPU && ty != vk::PhysicalDeviceType::OTHER,
            unified: ty == vk::PhysicalDeviceType::CPU
                || ty == vk::PhysicalDeviceType::INTEGRATED_GPU,
            memory_budget: has_budget,
            subgroup_arithmetic: subgroup
                .supported_stages
                .contains(vk::ShaderStageFlags::COMPUTE)
                && subgroup.supported_operations.contains(
                    vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC,
                ),
            workgroup_resolver: wide && shared >= RESOLVE_WG_SHARED_BYTES,
            workgroup_resolver_large: wide && shared >= RESOLVE_WG_LARGE_SHARED_BYTES,
        };
        let driver_name = c_name(&driver.driver_name);
        let full_name = if driver_name.is_empty() {
            name
        } else {
            format!(
                "{name} ({driver_name}, Vulkan {})",
                api_version_string(props.api_version)
            )
        };
        let host_import =
            has_import.then(|| ash::ext::external_memory_host::Device::new(&instance, &device));
        let internal = match Self::new_timeline(&device) {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: nothing was created on the device yet.
                unsafe {
                    device.destroy_device(None);
                    if let Some((du, m)) = &debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                return Err(e);
            }
        };
        let query_pool = if limits.timestamp_period.is_some() {
            let qi = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(2);
            // SAFETY: valid device; the pool is destroyed in `Drop`.
            unsafe { device.create_query_pool(&qi, None) }.ok()
        } else {
            None
        };
        let limits = Limits {
            timestamp_period: query_pool.and(limits.timestamp_period),
            ..limits
        };
        let slots = family_list.len();
        // Host waits poll after the spin on GPUs only.
        let wait_poll = if limits.gpu {
            WAIT_POLL
        } else {
            std::time::Duration::ZERO
        };
        Ok(Context {
            _entry: entry,
            instance,
            pdev,
            debug,
            device,
            host_import,
            compute_lanes: cn as usize,
            transfer_lane,
            lanes,
            families: family_list,
            mem,
            name: full_name,
            limits,
            query_pool,
            state: Mutex::new(State {
                streams: vec![StreamState::new(internal, 0)],
                next_lane: 0,
                free: (0..slots).map(|_| Vec::new()).collect(),
                inflight: Vec::new(),
                garbage: Vec::new(),
                pipelines: (0..Shader::ALL.len()).map(|_| None).collect(),
                capture: false,
                profile: None,
            }),
            device_allocated: AtomicU64::new(0),
            strict: false,
            ignore_event_waits: false,
            checked: AtomicUsize::new(0),
            submissions: AtomicU64::new(0),
            wait_poll,
            compute_barriers: true,
        })
    }

    /// A new timeline semaphore at value 0.
    pub(super) fn new_timeline(device: &ash::Device) -> Result<vk::Semaphore> {
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid device with the timelineSemaphore feature enabled.
        unsafe { device.create_semaphore(&sem_info, None) }
            .map_err(VulkanError::vk("vkCreateSemaphore"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(flags: vk::QueueFlags, count: u32) -> vk::QueueFamilyProperties {
        vk::QueueFamilyProperties {
            queue_flags: flags,
            queue_count: count,
            ..Default::default()
        }
    }

    #[test]
    fn families_prefer_a_dedicated_transfer_queue() {
        use vk::QueueFlags as Q;
        // An NVIDIA-like device: universal family, DMA family, compute-only family.
        let nv = [
            family(Q::GRAPHICS | Q::COMPUTE | Q::TRANSFER, 16),
            family(Q::TRANSFER, 2),
            family(Q::COMPUTE | Q::TRANSFER, 8),
        ];
        assert_eq!(
            pick_families(&nv, false),
            Some((0, MAX_COMPUTE_LANES, Some(1)))
        );
        assert_eq!(
            pick_families(&nv, true),
            Some((2, MAX_COMPUTE_LANES, Some(1))),
            "the compute-only family when asked"
        );
        // lavapipe: one universal queue, no dedicated transfer family.
        let lvp = [family(Q::GRAPHICS | Q::COMPUTE | Q::TRANSFER, 1)];
        assert_eq!(pick_families(&lvp, false), Some((0, 1, None)));
        assert_eq!(
            pick_families(&lvp, true),
            Some((0, 1, None)),
            "no compute-only family: the universal one"
        );
        // A transfer family that also computes is not dedicated; no compute: unusable.
        assert_eq!(
            pick_families(&[family(Q::TRANSFER | Q::COMPUTE, 2)], false),
            Some((0, 2, None))
        );
        assert_eq!(pick_families(&[family(Q::GRAPHICS, 1)], true), None);
    }
}
