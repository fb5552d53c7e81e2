//! How a host pool is set up: where its pages go, their size, how many threads touch and pin
//! them, and how the driver's pinning is split.

/// Where a host pool's pages are placed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// On the NUMA node of the device the pool serves (the node of the GPU's PCI root, as
    /// `/sys/bus/pci/devices/<id>/numa_node` says), touched by threads bound to that node's
    /// CPUs; anywhere when the platform reports no node for the device.
    #[default]
    NearDevice,
    /// Wherever the threads that touch them run: spread over every CPU this process may use.
    Anywhere,
    /// On NUMA node `n`, touched by threads bound to its CPUs.
    Node(u32),
}

/// The page size of a host pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HugePages {
    /// Transparent huge pages: the range is 2 MiB aligned and advised `MADV_HUGEPAGE` before its
    /// first touch; the kernel backs what it can with huge pages (all of it when THP is
    /// `always` or `madvise`, none when `never`).
    #[default]
    Transparent,
    /// Explicit huge pages (the `hugetlbfs` pool, `vm.nr_hugepages`) when enough are free,
    /// transparent huge pages otherwise.
    ExplicitIfFree,
    /// Explicit huge pages only: a pool larger than the free huge pages is refused.
    Explicit,
    /// Base pages only.
    Off,
}

/// How a driver that pins host memory (CUDA, ROCm) registers a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Registration {
    /// In chunks, each registered by the thread that touched it, when the device reaches
    /// registered memory at its host address (so the chunks form one device range); as
    /// [`Registration::Whole`] otherwise.
    #[default]
    Chunks,
    /// One registration of the whole pool, after it was touched in parallel.
    Whole,
}

/// How a host pool is set up. The default places it near the device, on transparent huge pages,
/// with one thread per CPU of that node, registered in chunks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostPoolConfig {
    /// Where its pages go.
    pub placement: Placement,
    /// Their size.
    pub huge_pages: HugePages,
    /// Threads that touch and pin it (`None`: one per CPU of the placement node, or per CPU this
    /// process may use).
    pub threads: Option<usize>,
    /// How a pinning driver registers it.
    pub registration: Registration,
    /// Bytes each thread touches (and registers) at a time (`None`: sized so every thread gets
    /// several chunks, from 64 MiB to 1 GiB; rounded up to a multiple of 2 MiB when given).
    pub chunk_bytes: Option<usize>,
}

impl HostPoolConfig {
    /// The NUMA node pages go to, for a device on `device_node` (`None`: the platform does not
    /// say).
    pub fn node(&self, device_node: Option<u32>) -> Option<u32> {
        match self.placement {
            Placement::NearDevice => device_node,
            Placement::Anywhere => None,
            Placement::Node(n) => Some(n),
        }
    }
}

/// 2 MiB: the transparent huge page size of x86-64 and most aarch64 kernels, the alignment of
/// every pool and the smallest chunk.
pub const HUGE_PAGE: usize = 2 << 20;

/// Largest chunk a thread touches or registers at once (by default).
const MAX_CHUNK: usize = 1 << 30;

/// Smallest chunk by default: a driver registration per chunk should stay rare enough that a
/// bulk copy seldom spans two.
const MIN_CHUNK: usize = 64 << 20;

/// Pools smaller than this are set up on the calling thread, and released there.
pub const PARALLEL_FROM: usize = 64 << 20;

/// The chunk size for `len` bytes over `threads` threads: about four chunks per thread, from
/// 64 MiB to 1 GiB, a multiple of [`HUGE_PAGE`]; `requested`, rounded up to a multiple of
/// [`HUGE_PAGE`], when given.
pub(crate) fn chunk_bytes(len: usize, threads: usize, requested: Option<usize>) -> usize {
    match requested {
        Some(r) => r.max(1).next_multiple_of(HUGE_PAGE),
        None => (len / (threads.max(1) * 4))
            .clamp(MIN_CHUNK, MAX_CHUNK)
            .next_multiple_of(HUGE_PAGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_huge_page_multiples_within_bounds() {
        assert_eq!(chunk_bytes(64 << 30, 16, None), 1 << 30);
        assert_eq!(chunk_bytes(16 << 30, 16, None), 256 << 20);
        assert_eq!(chunk_bytes(1 << 30, 16, None), 64 << 20);
        assert_eq!(chunk_bytes(4096, 16, None), 64 << 20);
        assert_eq!(chunk_bytes(64 << 30, 0, None), 1 << 30);
        assert_eq!(chunk_bytes(64 << 30, 16, Some(3 << 20)), 4 << 20);
        assert_eq!(chunk_bytes(64 << 30, 16, Some(4 << 30)), 4 << 30);
        assert_eq!(chunk_bytes(64 << 30, 16, Some(0)), HUGE_PAGE);
    }

    #[test]
    fn placement_picks_the_node() {
        let mut c = HostPoolConfig::default();
        assert_eq!(c.node(Some(1)), Some(1));
        assert_eq!(c.node(None), None);
        c.placement = Placement::Anywhere;
        assert_eq!(c.node(Some(1)), None);
        c.placement = Placement::Node(3);
        assert_eq!(c.node(None), Some(3));
    }
}
