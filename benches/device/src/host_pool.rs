//! Host-pool set-up and release, on any [`Device`]: how fast a pool of a given size becomes
//! usable and goes away again, for each way a pool comes to be, beside the same run's `memset`
//! bandwidth over the same amount of memory.
//!
//! Paths:
//!
//! * **runtime** — the backend allocates the pool ([`Device::alloc_pinned`], what
//!   `Runtime::new` does). Set-up: the call. Release: the drop returns, then the release
//!   finishes on its own thread ([`hisparse_host_memory::wait_for_releases`]).
//! * **lent** — an engine's ordinary array (zero, untouched: what `numpy.zeros` gives) lent to
//!   the backend and registered by it ([`HostPoolPaths::lend`]). Set-up: mapping the array and
//!   the lend. Release: the buffer's drop (the unregistration) and then the engine freeing its
//!   array, both handed to [`release::in_background`] as a Rust engine does (Python's release
//!   does the same): the drop figure is the hand-over, the release figure until both finished.
//! * **shared** — a shared segment created for the node's ranks and used as this backend's
//!   pool ([`HostPoolPaths::share`]). Set-up: creating the segment and the backend's use of it.
//!   Release: as for the runtime path.
//!
//! Ceilings, measured on one buffer of the same size right before the paths: the first touch of
//! its pages by every thread in parallel (page faults and the kernel's zeroing — the most any
//! set-up can do), then `memset` of the now resident memory by one thread (the plain `memset`
//! the targets are judged against) and by every thread. One sample of each: a figure of a pool
//! of tens of GiB lasts seconds.

use std::time::Instant;

use hisparse_core::Device;
use hisparse_host_memory::{AnonymousMapping, SharedSegment, release, wait_for_releases};

/// How long a release may take before the benchmark gives up waiting for it.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The backend's entries beyond [`Device::alloc_pinned`] that make a host pool, for the paths
/// that need them (a path whose entry is `None` is reported as not available).
pub struct HostPoolPaths<'a, D: Device> {
    /// The backend's lending of an engine's host memory (`lend_host_memory`,
    /// `CpuBuffer::from_raw_parts`) applied to the whole of `array`. The benchmark drops the
    /// returned buffer before it drops the array, and touches the array meanwhile only through
    /// the buffer.
    #[allow(clippy::type_complexity)]
    pub lend: Option<&'a dyn Fn(&mut AnonymousMapping) -> Result<D::HostBuffer, D::Error>>,
    /// The backend's use of a shared segment as its host pool (`host_pool_from_shared`).
    #[allow(clippy::type_complexity)]
    pub share: Option<&'a dyn Fn(SharedSegment) -> Result<D::HostBuffer, D::Error>>,
    /// How a pool was set up (threads, NUMA node, pages, registrations), for the report.
    #[allow(clippy::type_complexity)]
    pub describe: Option<&'a dyn Fn(&D::HostBuffer) -> Option<String>>,
}

impl<D: Device> Default for HostPoolPaths<'_, D> {
    fn default() -> Self {
        HostPoolPaths {
            lend: None,
            share: None,
            describe: None,
        }
    }
}

/// Name of the ceiling: every thread's first touch of fresh pages.
pub const FIRST_TOUCH: &str = "first touch, all threads";
/// Name of the ceiling: one thread's `memset` of resident memory (the targets' ceiling).
pub const MEMSET: &str = "memset, one thread";
/// Name of the ceiling: every thread's `memset` of resident memory.
pub const MEMSET_ALL: &str = "memset, all threads";

/// One ceiling of one size.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolCeiling {
    /// [`FIRST_TOUCH`], [`MEMSET`] or [`MEMSET_ALL`].
    pub name: &'static str,
    /// Seconds it took.
    pub seconds: f64,
}

/// One path at one size.
#[derive(Clone, Debug, PartialEq)]
pub struct PathFigure {
    /// `"runtime"`, `"lent"` or `"shared"`.
    pub path: &'static str,
    /// What happened.
    pub outcome: PathOutcome,
}

/// A path's result.
#[derive(Clone, Debug, PartialEq)]
pub enum PathOutcome {
    /// Measured.
    Measured {
        /// Seconds from nothing to a usable pool.
        setup_s: f64,
        /// Seconds until the drop returned (what the engine's thread waits).
        drop_s: f64,
        /// Seconds until the memory was unpinned and unmapped (for the lent path: until the
        /// engine freed its array).
        released_s: f64,
        /// How the backend set the pool up, where it says.
        setup: Option<String>,
    },
    /// The backend refused the pool (a limit of this host, typically); the message says which.
    Refused(String),
    /// The backend has no entry for this path.
    NotAvailable,
}

/// Everything measured for one size.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeReport {
    /// Bytes of each pool.
    pub bytes: u64,
    /// The ceilings of this size.
    pub ceilings: Vec<PoolCeiling>,
    /// The paths.
    pub paths: Vec<PathFigure>,
}

impl SizeReport {
    /// The ceiling `name`, in bytes per second.
    pub fn ceiling_bytes_per_s(&self, name: &str) -> Option<f64> {
        self.ceilings
            .iter()
            .find(|c| c.name == name)
            .map(|c| self.bytes as f64 / c.seconds)
    }
}

/// A whole host-pool run.
#[derive(Clone, Debug, PartialEq)]
pub struct HostPoolReport {
    /// Backend name.
    pub backend: &'static str,
    /// Device name.
    pub device: String,
    /// Threads the ceilings used ("all threads").
    pub threads: usize,
    /// One entry per size, in the order asked.
    pub sizes: Vec<SizeReport>,
}

/// The ceilings for `bytes`: one buffer, touched by every thread, then `memset` by one thread
/// and by every thread. The buffer is freed before this returns.
fn ceilings(bytes: usize, threads: usize) -> std::io::Result<Vec<PoolCeiling>> {
    let mut buf = AnonymousMapping::new(bytes)?;
    let all = |fill: u8, buf: &mut AnonymousMapping| {
        let chunk = bytes.div_ceil(threads).next_multiple_of(4096);
        let slice = bytes_of(buf);
        std::thread::scope(|s| {
            for part in slice.chunks_mut(chunk.max(1)) {
                s.spawn(move || part.fill(fill));
            }
        });
    };
    let t = Instant::now();
    all(1, &mut buf);
    let first = t.elapsed().as_secs_f64();
    let t = Instant::now();
    bytes_of(&mut buf).fill(2);
    std::hint::black_box(bytes_of(&mut buf).last());
    let one = t.elapsed().as_secs_f64();
    let t = Instant::now();
    all(3, &mut buf);
    let every = t.elapsed().as_secs_f64();
    Ok(vec![
        PoolCeiling {
            name: FIRST_TOUCH,
            seconds: first,
        },
        PoolCeiling {
            name: MEMSET,
            seconds: one,
        },
        PoolCeiling {
            name: MEMSET_ALL,
            seconds: every,
        },
    ])
}

/// The mapping's bytes (the benchmark owns it and lends it to nobody while it fills it).
fn bytes_of(m: &mut AnonymousMapping) -> &mut [u8] {
    // SAFETY: the mapping is `len` bytes of zero-initialised, readable and writable memory that
    // `m` owns and that lives as long as the borrow of `m`; nothing else references it.
    unsafe { std::slice::from_raw_parts_mut(m.addr().as_ptr(), m.len()) }
}

/// Measures the set-up and the release of one pool made by `make`; with `release_waits`, the
/// release is timed until it finished on its own thread.
fn measure<D: Device, E: std::fmt::Display>(
    paths: &HostPoolPaths<'_, D>,
    make: impl FnOnce() -> Result<D::HostBuffer, E>,
    release_waits: bool,
) -> PathOutcome {
    let t = Instant::now();
    let pool = match make() {
        Ok(p) => p,
        Err(e) => return PathOutcome::Refused(e.to_string()),
    };
    let setup_s = t.elapsed().as_secs_f64();
    let setup = paths.describe.and_then(|d| d(&pool));
    let t = Instant::now();
    drop(pool);
    let drop_s = t.elapsed().as_secs_f64();
    if release_waits {
        wait_for_releases(RELEASE_WAIT);
    }
    PathOutcome::Measured {
        setup_s,
        drop_s,
        released_s: t.elapsed().as_secs_f64(),
        setup,
    }
}

/// Runs every path at every size in `sizes`, one after another (each pool released before the
/// next is made), with the ceilings of each size.
pub fn run<D: Device>(
    dev: &D,
    sizes: &[u64],
    paths: &HostPoolPaths<'_, D>,
) -> Result<HostPoolReport, String>
where
    // The lent path's release runs on a release thread.
    D::HostBuffer: Send + 'static,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let len = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes do not fit here"))?;
        wait_for_releases(RELEASE_WAIT);
        // The ceiling's buffer is as large as the pools: a size this host cannot hold is
        // refused for every path here, before anything is mapped.
        let available = hisparse_host_memory::available_ram().unwrap_or(u64::MAX);
        if let Err(e) = hisparse_core::ops::check_pinned_budget(bytes, available) {
            out.push(SizeReport {
                bytes,
                ceilings: Vec::new(),
                paths: ["runtime", "lent", "shared"]
                    .into_iter()
                    .map(|path| PathFigure {
                        path,
                        outcome: PathOutcome::Refused(e.to_string()),
                    })
                    .collect(),
            });
            continue;
        }
        let ceilings = ceilings(len, threads)
            .map_err(|e| format!("mapping {bytes} bytes for the memset ceiling: {e}"))?;
        let mut figures = vec![PathFigure {
            path: "runtime",
            outcome: measure(paths, || dev.alloc_pinned(len), true),
        }];
        let lent = match paths.lend {
            None => PathOutcome::NotAvailable,
            Some(lend) => {
                let t = Instant::now();
                match AnonymousMapping::new(len) {
                    Err(e) => PathOutcome::Refused(format!("mapping the engine's array: {e}")),
                    Ok(mut array) => {
                        let mapped = t.elapsed().as_secs_f64();
                        let t = Instant::now();
                        match lend(&mut array) {
                            Err(e) => PathOutcome::Refused(e.to_string()),
                            Ok(pool) => {
                                let setup_s = t.elapsed().as_secs_f64() + mapped;
                                let setup = paths.describe.and_then(|d| d(&pool));
                                // As docs/host-pool.md tells a Rust engine: the lent pool's
                                // unregistration and then the array's freeing, in that order,
                                // on a release thread, so the engine's thread only hands
                                // them over.
                                let t = Instant::now();
                                let release = release::in_background(move || {
                                    drop(pool);
                                    drop(array);
                                });
                                let drop_s = t.elapsed().as_secs_f64();
                                release.wait_timeout(RELEASE_WAIT);
                                PathOutcome::Measured {
                                    setup_s,
                                    drop_s,
                                    released_s: t.elapsed().as_secs_f64(),
                                    setup,
                                }
                            }
                        }
                    }
                }
            }
        };
        figures.push(PathFigure {
            path: "lent",
            outcome: lent,
        });
        let shared = match paths.share {
            None => PathOutcome::NotAvailable,
            Some(share) => measure(
                paths,
                || {
                    let name = SharedSegment::unique_name("hisparse-bench-pool");
                    let segment = SharedSegment::create(&name, len).map_err(|e| e.to_string())?;
                    share(segment).map_err(|e| e.to_string())
                },
                true,
            ),
        };
        figures.push(PathFigure {
            path: "shared",
            outcome: shared,
        });
        out.push(SizeReport {
            bytes,
            ceilings,
            paths: figures,
        });
    }
    Ok(HostPoolReport {
        backend: dev.backend(),
        device: dev.device_name().to_string(),
        threads,
        sizes: out,
    })
}
