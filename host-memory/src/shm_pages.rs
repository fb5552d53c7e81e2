//! What pages the shared-memory file system gives a segment's files: the one place HiSparse reads
//! the `huge=` option of the mount holding `/dev/shm` and the `shmem_enabled` override.
//!
//! A file of a tmpfs mount gets 2 MiB pages only where the mount allows them (`huge=always`,
//! `within_size` or `advise`, the last for mappings advised `MADV_HUGEPAGE`, which a segment's
//! mapping is) or `shmem_enabled` forces them; `huge=never`, the usual default, gives 4 KiB pages
//! whatever the advice, and no unprivileged call changes that (`MADV_COLLAPSE` is refused too).
//! A 4 KiB segment is populated, pinned and freed a page at a time, several times slower than a
//! huge-page one (`docs/PERF.md`, Host pool), so the set-up report names the setting and its
//! remedy.

use core::fmt;

/// Where POSIX shared memory lives.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// What a shared-memory segment's pages are, as the host's settings decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmPages {
    /// 2 MiB pages: the mount's `huge=` option (named) allows them for an advised mapping.
    Huge(ShmHuge),
    /// 2 MiB pages: `shmem_enabled` is `force`.
    HugeForced,
    /// 4 KiB pages: the mount's `huge=` option (named) allows no huge pages.
    Base(ShmHuge),
    /// 4 KiB pages: `shmem_enabled` is `deny`.
    BaseDenied,
    /// The settings could not be read (no `/proc`): whatever the kernel gives.
    Unknown,
}

/// A tmpfs mount's `huge=` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmHuge {
    /// `huge=never`, or no `huge=` option.
    Never,
    /// `huge=always`.
    Always,
    /// `huge=within_size`.
    WithinSize,
    /// `huge=advise`.
    Advise,
}

impl ShmHuge {
    fn name(self) -> &'static str {
        match self {
            ShmHuge::Never => "never",
            ShmHuge::Always => "always",
            ShmHuge::WithinSize => "within_size",
            ShmHuge::Advise => "advise",
        }
    }
}

impl ShmPages {
    /// Whether the segment's files get 2 MiB pages.
    pub fn huge(self) -> bool {
        matches!(self, ShmPages::Huge(_) | ShmPages::HugeForced)
    }

    /// The host's settings, read now.
    pub(crate) fn of_host() -> ShmPages {
        let mounts = std::fs::read_to_string("/proc/mounts").ok();
        let sysfs =
            std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok();
        Self::from_settings(mounts.as_deref(), sysfs.as_deref())
    }

    /// The pages `/proc/mounts` (`mounts`) and `shmem_enabled` (`sysfs`) give a file of
    /// [`SHM_DIR`].
    fn from_settings(mounts: Option<&str>, sysfs: Option<&str>) -> ShmPages {
        match sysfs.and_then(selected) {
            Some("force") => return ShmPages::HugeForced,
            Some("deny") => return ShmPages::BaseDenied,
            _ => {}
        }
        let Some(option) = mounts.and_then(huge_option_of_shm) else {
            return ShmPages::Unknown;
        };
        match option {
            ShmHuge::Never => ShmPages::Base(option),
            _ => ShmPages::Huge(option),
        }
    }
}

impl fmt::Display for ShmPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmPages::Huge(h) => {
                write!(f, "shared-memory huge pages ({SHM_DIR} huge={})", h.name())
            }
            ShmPages::HugeForced => f.write_str("shared-memory huge pages (shmem_enabled force)"),
            ShmPages::Base(h) => write!(
                f,
                "4 KiB shared-memory pages ({SHM_DIR} huge={}: remount it with huge=advise for \
                 2 MiB pages)",
                h.name()
            ),
            ShmPages::BaseDenied => f.write_str("4 KiB shared-memory pages (shmem_enabled deny)"),
            ShmPages::Unknown => f.write_str("shared-memory pages of unknown size"),
        }
    }
}

/// Whether `addr` lies in a mapping of a file of [`SHM_DIR`] in this process (an engine's
/// `multiprocessing.shared_memory` array lent as a host pool, say): its pages are then the
/// shared-memory file system's, as [`ShmPages::of_host`] says.
pub(crate) fn maps_shared_memory_file(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| mapped_file(&maps, addr).map(is_in_shm_dir))
        .unwrap_or(false)
}

fn is_in_shm_dir(path: &str) -> bool {
    is_below(path, SHM_DIR)
}

/// Whether `path` names something inside directory `dir` (not `dir` itself, nor `dir` followed
/// by more letters).
fn is_below(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The path of the file mapped at `addr` in `/proc/self/maps` text, `None` where nothing, or
/// anonymous memory, is mapped there.
fn mapped_file(maps: &str, addr: usize) -> Option<&str> {
    maps.lines().find_map(|line| {
        let mut fields = line.splitn(6, ' ');
        let (start, end) = fields.next()?.split_once('-')?;
        let (start, end) = (
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        );
        if !(start..end).contains(&addr) {
            return None;
        }
        // perms, offset, device, inode, then the path (absent for anonymous memory).
        let path = fields.nth(4)?.trim_start();
        (!path.is_empty()).then_some(path)
    })
}

/// The bracketed choice of a sysfs selector (`always [never] deny` → `never`).
fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

/// The `huge=` option of the tmpfs mount that holds [`SHM_DIR`] in `/proc/mounts` text: the
/// longest mount point that is `/dev/shm` or one of its parents, the last listed winning (a later
/// mount hides an earlier one at the same point). `None` when that mount is not a tmpfs (no
/// `huge=` applies) or no line names one.
fn huge_option_of_shm(mounts: &str) -> Option<ShmHuge> {
    let mut best: Option<(usize, &str, &str)> = None; // (mount point length, type, options)
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_source), Some(point), Some(kind), Some(options)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let holds = point == "/" || SHM_DIR == point || is_below(SHM_DIR, point);
        if holds && best.is_none_or(|(len, _, _)| point.len() >= len) {
            best = Some((point.len(), kind, options));
        }
    }
    let (_, kind, options) = best?;
    if kind != "tmpfs" {
        return None;
    }
    let huge = options
        .split(',')
        .find_map(|o| o.strip_prefix("huge="))
        .unwrap_or("never");
    Some(match huge {
        "always" => ShmHuge::Always,
        "within_size" => ShmHuge::WithinSize,
        "advise" => ShmHuge::Advise,
        _ => ShmHuge::Never,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEVER: &str = "always within_size advise [never] deny force\n";

    fn pages(mounts: &str, sysfs: &str) -> ShmPages {
        ShmPages::from_settings(Some(mounts), Some(sysfs))
    }

    #[test]
    fn the_mount_option_of_dev_shm_decides() {
        let default =
            "proc /proc proc rw 0 0\ntmpfs /dev/shm tmpfs rw,relatime,size=131961976k 0 0\n";
        assert_eq!(pages(default, NEVER), ShmPages::Base(ShmHuge::Never));
        assert!(!pages(default, NEVER).huge());
        let advise = "tmpfs /dev/shm tmpfs rw,relatime,size=134217728k,huge=advise 0 0\n";
        assert_eq!(pages(advise, NEVER), ShmPages::Huge(ShmHuge::Advise));
        assert!(pages(advise, NEVER).huge());
        let within = "tmpfs /dev/shm tmpfs rw,huge=within_size 0 0\n";
        assert_eq!(pages(within, NEVER), ShmPages::Huge(ShmHuge::WithinSize));
    }

    #[test]
    fn the_last_and_longest_mount_holding_dev_shm_wins() {
        // /dev is a tmpfs allowing huge pages; /dev/shm, mounted over it, does not.
        let stacked = "tmpfs /dev tmpfs rw,huge=always 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n\
                       tmpfs /dev/shmem tmpfs rw,huge=always 0 0\n";
        assert_eq!(pages(stacked, NEVER), ShmPages::Base(ShmHuge::Never));
        // Remounted: the later line at the same point is the one in force.
        let remounted = "tmpfs /dev/shm tmpfs rw 0 0\ntmpfs /dev/shm tmpfs rw,huge=advise 0 0\n";
        assert_eq!(pages(remounted, NEVER), ShmPages::Huge(ShmHuge::Advise));
        // No mount of its own: the parent's.
        let parent = "/dev/root / ext4 rw 0 0\ntmpfs /dev tmpfs rw,huge=advise 0 0\n";
        assert_eq!(pages(parent, NEVER), ShmPages::Huge(ShmHuge::Advise));
        // On a disk file system: no huge= applies, nothing known.
        assert_eq!(pages("/dev/root / ext4 rw 0 0\n", NEVER), ShmPages::Unknown);
    }

    #[test]
    fn shmem_enabled_force_and_deny_override_the_mount() {
        let advise = "tmpfs /dev/shm tmpfs rw,huge=advise 0 0\n";
        assert_eq!(
            pages(advise, "always within_size advise never [deny] force"),
            ShmPages::BaseDenied
        );
        assert_eq!(
            pages(
                "tmpfs /dev/shm tmpfs rw 0 0",
                "always within_size advise never deny [force]"
            ),
            ShmPages::HugeForced
        );
        // Unreadable settings: unknown, and the report says so.
        assert_eq!(ShmPages::from_settings(None, None), ShmPages::Unknown);
        assert_eq!(
            ShmPages::from_settings(Some("garbage\n\n"), Some("no brackets")),
            ShmPages::Unknown
        );
    }

    #[test]
    fn a_mapping_of_a_dev_shm_file_is_found_by_its_address() {
        let maps = "\
7f0000000000-7f0000200000 rw-s 00000000 00:1a 1234                       /dev/shm/psm_3f2a\n\
7f0000200000-7f0000400000 rw-p 00000000 00:00 0 \n\
7f0000400000-7f0000600000 rw-s 00000000 00:1a 99                         /dev/shmem/x\n\
7f0000600000-7f0000800000 rw-s 00000000 00:05 77                         /memfd:pool (deleted)\n";
        assert_eq!(
            mapped_file(maps, 0x7f00_0000_1000),
            Some("/dev/shm/psm_3f2a")
        );
        assert!(is_in_shm_dir(mapped_file(maps, 0x7f00_001f_ffff).unwrap()));
        // Anonymous memory, another directory, a memfd, and nothing mapped.
        assert_eq!(mapped_file(maps, 0x7f00_0020_0000), None);
        assert!(!is_in_shm_dir(mapped_file(maps, 0x7f00_0040_0000).unwrap()));
        assert!(!is_in_shm_dir(mapped_file(maps, 0x7f00_0060_0000).unwrap()));
        assert_eq!(mapped_file(maps, 0x7f00_0080_0000), None);
        assert_eq!(mapped_file("garbage\n\n", 0x1000), None);
    }

    #[test]
    fn the_report_names_the_setting_and_the_remedy() {
        let base = ShmPages::Base(ShmHuge::Never).to_string();
        assert!(
            base.contains("4 KiB") && base.contains("huge=never"),
            "{base}"
        );
        assert!(base.contains("huge=advise"), "{base}");
        let huge = ShmPages::Huge(ShmHuge::Advise).to_string();
        assert!(
            huge.contains("huge pages") && huge.contains("huge=advise"),
            "{huge}"
        );
    }
}
