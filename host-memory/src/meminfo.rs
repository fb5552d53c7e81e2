//! What the operating system says about the host's memory (`/proc/meminfo`, `/proc/self/status`):
//! the one place HiSparse reads these facts.

/// Bytes of RAM the operating system reports as available for new allocations.
///
/// On Linux this is `MemAvailable` from `/proc/meminfo` (falling back to `MemFree` on kernels too
/// old to report it). Where neither can be read, `None`: the caller then cannot apply the budget
/// check and the allocator itself is the only limit.
pub fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    field(&text, "MemAvailable:").or_else(|| field(&text, "MemFree:"))
}

/// Free bytes of the explicit huge-page pool of the default huge-page size
/// (`HugePages_Free × Hugepagesize`), and that size; `None` where there is no pool.
pub fn free_huge_pages() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let pages = field(&text, "HugePages_Free:")?;
    let size = field(&text, "Hugepagesize:")?;
    (pages > 0 && size > 0).then(|| (pages.saturating_mul(size), size))
}

/// Bytes this process has locked into RAM (`VmLck` of `/proc/self/status`), 0 where unknown.
pub(crate) fn locked_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| field(&t, "VmLck:"))
        .unwrap_or(0)
}

/// Whether the calling thread may lock any amount of memory (`CAP_IPC_LOCK` in its effective
/// capabilities, as root has it; capabilities are per thread).
pub(crate) fn may_lock_without_limit() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("CapEff:"))?;
            u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The value of `key` (e.g. `"MemAvailable:"`) in a `/proc/meminfo`-style text, in bytes (a
/// `kB` value scaled by 1024, checked; a bare number as it is; any other unit `None`).
pub(crate) fn field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut words = line[key.len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    let scale = match words.next() {
        Some("kB") | Some("KB") | Some("kb") => 1024,
        None => 1,
        Some(_) => return None,
    };
    value.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kilobytes_counts_and_refuses_the_rest() {
        let text = "MemTotal:       24683520 kB\nMemFree:        23238656 kB\n\
                    MemAvailable:   24323072 kB\nHugePages_Free:       3\n";
        assert_eq!(field(text, "MemAvailable:"), Some(24323072 * 1024));
        assert_eq!(field(text, "HugePages_Free:"), Some(3));
        assert_eq!(field(text, "Cached:"), None);
        assert_eq!(field("MemFree: 12 MB\n", "MemFree:"), None);
        assert_eq!(
            field("MemFree: 18014398509481984 kB\n", "MemFree:"),
            None,
            "an overflowing kB value is refused, not wrapped"
        );
    }

    #[test]
    fn this_machine_reports_something_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(available_ram().is_some_and(|b| b > 0));
        }
    }
}
