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

impl Context {
    /// Opens the device chosen by `selector` (see `VulkanDevice::open`); with `strict`, work
    /// after which the validation layer reported warnings or errors fails.
    pub fn open(selector: &str, strict: bool) -> Result<Context> {
        Self::open_with(selector, strict, false)
    }

    /// [`Context::open`], enabling the Khronos validation layer explicitly with `layer`.
    pub fn open_with(selector: &str, strict: bool, layer: bool) -> Result<Context> {
        let before = validation_message_count();
        let mut ctx = Self::open_inner(selector, layer)?;
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

    pub(super) fn open_inner(selector: &str, layer: bool) -> Result<Context> {
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
        match Self::create_device(&entry, &instance, selector) {
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
    ) -> core::result::Result<u32, String> {
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
        if l.max_per_stage_descriptor_storage_buffers < Shader::Resolve.bindings()
            || l.max_descriptor_set_storage_buffers < Shader::Resolve.bindings()
        {
            return Err(format!(
                "only {} storage buffers per stage ({} needed)",
                l.max_per_stage_descriptor_storage_buffers,
                Shader::Resolve.bindings()
            ));
        }
        if l.max_push_constants_size < 64 || l.max_compute_shared_memory_size < 8192 {
            return Err("push constants or shared memory too small".into());
        }
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pdev) };
        families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .map(|i| i as u32)
            .ok_or_else(|| "no compute queue".into())
    }

    #[allow(clippy::type_complexity)]
    pub(super) fn create_device(
        _entry: &ash::Entry,
        instance: &ash::Instance,
        selector: &str,
    ) -> Result<(vk::PhysicalDevice, ash::Device, u32, String, bool)> {
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
            match Self::suitability(instance, c.pdev) {
                Ok(qf) => {
                    chosen = Some((c, qf));
                    break;
                }
                Err(why) => reasons.push(format!("{}: {}: {why}", c.index, c.name)),
            }
        }
        let Some((cand, qf)) = chosen else {
            return Err(VulkanError::Unsupported(reasons.join("; ")));
        };
        // SAFETY: `cand.pdev` was enumerated from `instance`.
        let dev_exts = unsafe { instance.enumerate_device_extension_properties(cand.pdev) }
            .map_err(VulkanError::vk("vkEnumerateDeviceExtensionProperties"))?;
        let has_import = dev_exts
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(ash::ext::external_memory_host::NAME));
        let mut ext_names = Vec::new();
        if has_import {
            ext_names.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        let prio = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(qf)
            .queue_priorities(&prio)];
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&ext_names)
            .push_next(&mut f12);
        // SAFETY: `info` and its chain live until the call returns; the features and extensions
        // were checked above.
        let device = unsafe { instance.create_device(cand.pdev, &info, None) }
            .map_err(VulkanError::vk("vkCreateDevice"))?;
        Ok((cand.pdev, device, qf, cand.name.clone(), has_import))
    }

    pub(super) fn finish(
        entry: ash::Entry,
        instance: ash::Instance,
        debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
        (pdev, device, queue_family, name, has_import): (
            vk::PhysicalDevice,
            ash::Device,
            u32,
            String,
            bool,
        ),
    ) -> Result<Context> {
        let mut host_props = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut driver);
        if has_import {
            props2 = props2.push_next(&mut host_props);
        }
        // SAFETY: valid physical device; the chained structs are supported (1.2 core / enabled
        // extension).
        unsafe { instance.get_physical_device_properties2(pdev, &mut props2) };
        let props = props2.properties;
        // SAFETY: as above.
        let mem = unsafe { instance.get_physical_device_memory_properties(pdev) };
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pdev) };
        let ts_bits = families[queue_family as usize].timestamp_valid_bits;
        // SAFETY: the queue family and index were requested at device creation.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        let max_range = u64::from(props.limits.max_storage_buffer_range);
        let window = 1u64 << (63 - max_range.min(1 << 31).leading_zeros());
        let limits = Limits {
            max_storage_range: max_range,
            window,
            max_storage_per_stage: props
                .limits
                .max_per_stage_descriptor_storage_buffers
                .min(props.limits.max_descriptor_set_storage_buffers),
            timestamp_period: (ts_bits > 0).then_some(f64::from(props.limits.timestamp_period)),
            import_alignment: has_import
                .then_some(host_props.min_imported_host_pointer_alignment.max(4096)),
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
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid device with the timelineSemaphore feature enabled.
        let timeline = unsafe { device.create_semaphore(&sem_info, None) };
        let timeline = match timeline {
            Ok(t) => t,
            Err(r) => {
                // SAFETY: nothing was created on the device yet.
                unsafe {
                    device.destroy_device(None);
                    if let Some((du, m)) = &debug {
                        du.destroy_debug_utils_messenger(*m, None);
                    }
                    instance.destroy_instance(None);
                }
                return Err(VulkanError::Vk {
                    call: "vkCreateSemaphore",
                    result: r,
                });
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
        Ok(Context {
            _entry: entry,
            instance,
            debug,
            device,
            host_import,
            queue,
            queue_family,
            mem,
            name: full_name,
            limits,
            timeline,
            query_pool,
            state: Mutex::new(State {
                last: 0,
                batch: None,
                free: Vec::new(),
                inflight: VecDeque::new(),
                garbage: Vec::new(),
                pipelines: (0..Shader::ALL.len()).map(|_| None).collect(),
                scratch: None,
            }),
            strict: false,
            checked: AtomicUsize::new(0),
        })
    }
}
