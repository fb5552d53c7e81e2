//! How much RAM may be pinned: the "available" figure of the operating system.

/// Bytes of RAM the operating system reports as available for new allocations.
///
/// On Linux this is `MemAvailable` from `/proc/meminfo` (falling back to `MemFree` on kernels too
/// old to report it). Where neither can be read, `None`: the caller then cannot apply the budget
/// check and the allocator itself is the only limit.
pub fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemAvailable:").or_else(|| parse_meminfo(&text, "MemFree:"))
}

/// The value of `key` (e.g. `"MemAvailable:"`) in a `/proc/meminfo` text, in bytes.
fn parse_meminfo(text: &str, key: &str) -> Option<u64> {
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
    fn parses_kilobytes_and_falls_back() {
        let text = "MemTotal:       24683520 kB\nMemFree:        23238656 kB\n\
                    MemAvailable:   24323072 kB\n";
        assert_eq!(parse_meminfo(text, "MemAvailable:"), Some(24323072 * 1024));
        assert_eq!(parse_meminfo(text, "Cached:"), None);
        assert_eq!(parse_meminfo("MemFree: 12 MB\n", "MemFree:"), None);
    }

    #[test]
    fn this_machine_reports_something_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(available_ram().is_some_and(|b| b > 0));
        }
    }
}
