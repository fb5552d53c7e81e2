//! How a [`VulkanDevice`](crate::VulkanDevice) is configured: [`VulkanOptions`], given at
//! [`VulkanDevice::open_with`](crate::VulkanDevice::open_with). The defaults are what production
//! runs; every other value exists for comparisons, for diagnostics, or for tests that make a
//! device take the path another device would. All choices give identical results. The library
//! never reads the environment: a tool that wants these settings from its command line or
//! environment parses them with [`VulkanOptions::set`].

use std::path::PathBuf;

use crate::{CopyEngine, GatherKernel, ResolveKernel, Result, VulkanError};

/// Which queues streams are spread over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Queues {
    /// Up to four compute queues and the dedicated transfer queue, where the device has them.
    #[default]
    All,
    /// One compute queue for every stream's compute work, plus the dedicated transfer queue for
    /// copy-only batches.
    OneCompute,
    /// One compute queue for everything.
    Single,
}

/// Which queue family runs compute work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ComputeFamily {
    /// The first family with compute (on NVIDIA the universal graphics family).
    #[default]
    First,
    /// A family with compute but no graphics, where the device has one.
    Dedicated,
}

/// How host waits (`synchronize`, downloads, event waits) wait on GPUs. CPU devices always
/// block without spinning: their work runs on the cores a polling thread would take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostWait {
    /// Spin for 200 µs, then poll the timelines while yielding the thread for up to 50 ms
    /// before blocking in `vkWaitSemaphores`, as CUDA's default synchronisation spins: a thread
    /// blocked there can wake hundreds of microseconds after the GPU finished.
    #[default]
    Poll,
    /// Block right after the spin.
    Block,
}

/// What the barrier between two dependent compute dispatches covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Barriers {
    /// The compute-shader stage and shader accesses, where only dispatches ran since the
    /// previous barrier.
    #[default]
    Compute,
    /// Every stage and memory access.
    All,
}

/// How the resolver's workgroup scans combine values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResolveScans {
    /// Subgroup arithmetic where the device has it, else workgroup memory.
    #[default]
    Auto,
    /// Workgroup memory and barriers only, as on devices without subgroup arithmetic.
    WorkgroupMemory,
}

/// A diagnostic: write the resolver's inputs at chosen calls to files, so a run's resolve can be
/// timed again in isolation with exactly the state the run had (the kernel lab's
/// `resolve_replay`). Each dump synchronises the stream first, so a dumped run's timings are not
/// figures. The file format is described in the `dump` module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolveDumpSpec {
    /// The device's resolve calls to dump, counted from 0.
    pub calls: Vec<u64>,
    /// Where: `DIR/resolve-<call>.bin`.
    pub dir: PathBuf,
}

/// The configuration of a [`VulkanDevice`](crate::VulkanDevice), given at open. `Default` is
/// what [`VulkanDevice::open`](crate::VulkanDevice::open) uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VulkanOptions {
    /// Any validation warning or error (reported through `VK_EXT_debug_utils`, e.g. with
    /// `VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation`) makes the call during which it appeared
    /// fail with [`VulkanError::Validation`]. Tests use it.
    pub strict_validation: bool,
    /// Which queues streams are spread over.
    pub queues: Queues,
    /// Which queue family runs compute work.
    pub compute_family: ComputeFamily,
    /// How host waits wait on GPUs.
    pub host_wait: HostWait,
    /// What barriers between dependent compute dispatches cover.
    pub barriers: Barriers,
    /// How the resolver's workgroup scans combine values.
    pub resolve_scans: ResolveScans,
    /// Which engine runs the copies (changeable later with `set_copy_engine`).
    pub copy_engine: CopyEngine,
    /// Which shader runs `gather_rows` (changeable later with `set_gather_kernel`).
    pub gather_kernel: GatherKernel,
    /// Which kernel runs `resolve` (changeable later with `set_resolve_kernel`).
    pub resolve_kernel: ResolveKernel,
    /// Profile the whole run per operation (host and device time), printed to stderr when the
    /// device is dropped and available from `profile_report`.
    pub profile: bool,
    /// Resolve calls whose inputs are written to files (a diagnostic).
    pub dump_resolve: Option<ResolveDumpSpec>,
}

/// The names [`VulkanOptions::set`] takes, each with the values it accepts.
pub const OPTION_NAMES: [(&str, &str); 11] = [
    ("strict-validation", "0 or 1"),
    ("queues", "all, one-compute or single"),
    ("compute-family", "first or dedicated"),
    ("wait", "poll or block"),
    ("barriers", "compute or all"),
    ("resolve-scans", "auto or workgroup-memory"),
    ("copy-engine", "auto, dma or shader"),
    ("gather", "auto, per-entry or pipelined"),
    ("resolve", "auto, workgroup, global or portable"),
    ("profile", "0 or 1"),
    ("dump-resolve", "CALLS:DIR, e.g. 200,2000:/tmp/dumps"),
];

impl VulkanOptions {
    /// Sets the option `name` (one of [`OPTION_NAMES`]) from its textual `value`, for tools
    /// that take options on their command line or from their environment. An unknown name or
    /// value is an `InvalidArgument` error listing what is accepted.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let value = value.trim();
        let name = name.trim();
        let bad = || {
            let accepted = OPTION_NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v);
            VulkanError::InvalidArgument(match accepted {
                Some(v) => format!("Vulkan option {name}={value}: use {v}"),
                None => format!(
                    "unknown Vulkan option {name:?}: use one of {}",
                    OPTION_NAMES.map(|(n, _)| n).join(", ")
                ),
            })
        };
        let flag = || match value {
            "0" | "false" | "no" => Ok(false),
            "1" | "true" | "yes" => Ok(true),
            _ => Err(bad()),
        };
        match name {
            // Accepted twins (CONTRIBUTING.md, "One rule, one place"): parsers of named options,
            // each option's value names mapped to its own enum.
            "strict-validation" => self.strict_validation = flag()?,
            "profile" => self.profile = flag()?,
            "queues" => {
                self.queues = match value {
                    "all" => Queues::All,
                    "one-compute" => Queues::OneCompute,
                    "single" => Queues::Single,
                    _ => return Err(bad()),
                }
            }
            "compute-family" => {
                self.compute_family = match value {
                    "first" => ComputeFamily::First,
                    "dedicated" => ComputeFamily::Dedicated,
                    _ => return Err(bad()),
                }
            }
            "wait" => {
                self.host_wait = match value {
                    "poll" => HostWait::Poll,
                    "block" => HostWait::Block,
                    _ => return Err(bad()),
                }
            }
            "barriers" => {
                self.barriers = match value {
                    "compute" => Barriers::Compute,
                    "all" => Barriers::All,
                    _ => return Err(bad()),
                }
            }
            "resolve-scans" => {
                self.resolve_scans = match value {
                    "auto" => ResolveScans::Auto,
                    "workgroup-memory" => ResolveScans::WorkgroupMemory,
                    _ => return Err(bad()),
                }
            }
            "copy-engine" => {
                self.copy_engine = match value {
                    "auto" => CopyEngine::Auto,
                    "dma" => CopyEngine::Dma,
                    "shader" => CopyEngine::Shader,
                    _ => return Err(bad()),
                }
            }
            "gather" => {
                self.gather_kernel = match value {
                    "auto" => GatherKernel::Auto,
                    "per-entry" => GatherKernel::PerEntry,
                    "pipelined" => GatherKernel::Pipelined,
                    _ => return Err(bad()),
                }
            }
            "resolve" => {
                self.resolve_kernel = match value {
                    "auto" => ResolveKernel::Auto,
                    "workgroup" => ResolveKernel::Workgroup,
                    "global" => ResolveKernel::Global,
                    "portable" => ResolveKernel::Portable,
                    _ => return Err(bad()),
                }
            }
            "dump-resolve" => {
                let (calls, dir) = value.split_once(':').ok_or_else(bad)?;
                let calls = calls
                    .split(',')
                    .map(|c| c.trim().parse::<u64>().map_err(|_| bad()))
                    .collect::<Result<Vec<_>>>()?;
                if dir.is_empty() {
                    return Err(bad());
                }
                self.dump_resolve = Some(ResolveDumpSpec {
                    calls,
                    dir: PathBuf::from(dir),
                });
            }
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// Applies a comma-separated list of `name=value` settings (see [`VulkanOptions::set`]),
    /// e.g. `barriers=all,queues=single`; an empty list changes nothing. A piece without `=`
    /// continues the previous value (the calls of `dump-resolve=200,2000:/tmp/dumps`).
    pub fn set_all(&mut self, list: &str) -> Result<()> {
        let mut items: Vec<String> = Vec::new();
        for piece in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match items.last_mut() {
                Some(last) if !piece.contains('=') => {
                    last.push(',');
                    last.push_str(piece);
                }
                _ => items.push(piece.to_owned()),
            }
        }
        for item in &items {
            let (name, value) = item.split_once('=').ok_or_else(|| {
                VulkanError::InvalidArgument(format!("Vulkan option {item:?}: use name=value"))
            })?;
            self.set(name, value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_option_parses_each_documented_value() {
        for (name, values) in OPTION_NAMES {
            let first = if name == "dump-resolve" {
                "1:/tmp"
            } else {
                values.split([',', ' ']).next().expect("a value")
            };
            let mut o = VulkanOptions::default();
            o.set(name, first)
                .unwrap_or_else(|e| panic!("{name}={first}: {e}"));
        }
        let mut o = VulkanOptions::default();
        o.set_all("barriers=all, queues=single,dump-resolve=3,5:/tmp/x")
            .unwrap();
        assert_eq!(o.barriers, Barriers::All);
        assert_eq!(o.queues, Queues::Single);
        assert_eq!(
            o.dump_resolve,
            Some(ResolveDumpSpec {
                calls: vec![3, 5],
                dir: "/tmp/x".into()
            })
        );
        assert!(o.set("barriers", "some").is_err());
        assert!(o.set("no-such", "1").is_err());
        assert!(o.set_all("barriers").is_err());
    }
}
