//! The machine's NUMA topology as Linux exposes it in sysfs: which node a PCI device (a GPU) is
//! attached to, and which CPUs belong to a node.

use crate::ffi;

/// The NUMA node of the PCI device `bus_id` (`domain:bus:device.function` in hexadecimal, as
/// `cuDeviceGetPCIBusId` and `lspci -D` write it), from `/sys/bus/pci/devices/<id>/numa_node`.
/// `None` when the platform does not say (one node, a virtual machine without topology, `-1`).
pub fn node_of_pci_device(bus_id: &str) -> Option<u32> {
    let id = canonical_bus_id(bus_id)?;
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{id}/numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// `bus_id` as sysfs names devices: `dddd:bb:dd.f`, lower-case, the domain 4 digits.
fn canonical_bus_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        hex(domain)?,
        hex(bus)?,
        hex(device)?,
        hex(function)?
    ))
}

/// The CPUs of NUMA node `node` (`/sys/devices/system/node/node<n>/cpulist`), empty when unknown.
pub fn node_cpus(node: u32) -> Vec<usize> {
    std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist"))
        .ok()
        .and_then(|t| parse_cpu_list(&t))
        .unwrap_or_default()
}

/// A CPU list as the kernel writes it (`0-7,16-23`, `3`, empty).
fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The threads that set up (or release) a host pool, and where they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Workers {
    /// How many.
    pub(crate) threads: usize,
    /// The CPUs each binds itself to (empty: wherever the scheduler puts it).
    pub(crate) cpus: Vec<usize>,
}

impl Workers {
    /// Workers for pages placed on `node` (its CPUs this process may use, or every allowed CPU
    /// when it may use none of them) or anywhere; `threads` of them, or one per CPU.
    pub(crate) fn plan(node: Option<u32>, threads: Option<usize>) -> Workers {
        let allowed = ffi::allowed_cpus();
        let cpus = match node {
            Some(n) => {
                let local: Vec<usize> = node_cpus(n)
                    .into_iter()
                    .filter(|c| allowed.contains(c))
                    .collect();
                local
            }
            None => Vec::new(),
        };
        let available = if cpus.is_empty() {
            allowed.len()
        } else {
            cpus.len()
        };
        Workers {
            threads: threads.unwrap_or(available).max(1),
            cpus,
        }
    }

    /// One thread, on the caller's CPU.
    pub(crate) fn one() -> Workers {
        Workers {
            threads: 1,
            cpus: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_and_bus_ids_parse() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(
            canonical_bus_id("00000000:19:00.0").as_deref(),
            Some("0000:19:00.0")
        );
        assert_eq!(
            canonical_bus_id("0000:C1:00.1").as_deref(),
            Some("0000:c1:00.1")
        );
        assert_eq!(canonical_bus_id("garbage"), None);
        assert_eq!(node_of_pci_device("ffff:ff:1f.7"), None, "no such device");
    }

    #[test]
    fn workers_default_to_one_per_allowed_cpu() {
        let w = Workers::plan(None, None);
        assert!(w.threads >= 1);
        assert!(w.cpus.is_empty());
        assert_eq!(Workers::plan(None, Some(3)).threads, 3);
        assert_eq!(Workers::plan(None, Some(0)).threads, 1);
        // Node 0 exists on every Linux machine with sysfs; its CPUs are the ones allowed here.
        let local = Workers::plan(Some(0), None);
        assert!(local.cpus.iter().all(|c| ffi::allowed_cpus().contains(c)));
        assert!(local.threads >= 1);
    }
}
