//! Host regions: set-up (zeroed, aligned, exact size, every chunk pinned once), failure clean-up,
//! lent memory kept, release off the caller's thread, and the budget refusals — the
//! locked-memory one in a child process whose limit is lowered (and whose `CAP_IPC_LOCK` is
//! dropped, since tests may run as root).

use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hisparse_core::ops::PinnedBudgetError;

use crate::config::{HUGE_PAGE, PARALLEL_FROM};
use crate::{
    HostMemoryError, HostPoolConfig, HostRegion, HugePages, Mlock, NoPin, NotOneDeviceRange, Pages,
    Pinner, Registration, SetupError, SharedSegment, copy_pieces, ffi, is_mapped,
    wait_for_releases,
};

/// Tests that look at whether an address is mapped run one at a time: another test's mapping
/// could take a released range's addresses meanwhile.
static MAPPINGS: Mutex<()> = Mutex::new(());

fn mappings() -> MutexGuard<'static, ()> {
    MAPPINGS.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a [`Recorder`] saw.
#[derive(Default, Debug)]
struct Record {
    pins: Vec<(usize, usize)>,
    unpins: Vec<(usize, usize)>,
    quiesced: usize,
    /// Unpins seen before the quiesce.
    early_unpins: usize,
}

/// A pinner that records its calls, may fail its n-th pin, and may hold its quiesce until the
/// test lets it go.
struct Recorder {
    record: Arc<Mutex<Record>>,
    chunked: bool,
    fail_at: Option<usize>,
    gate: Option<Mutex<Receiver<()>>>,
}

impl Recorder {
    fn new(chunked: bool) -> (Self, Arc<Mutex<Record>>) {
        let record = Arc::new(Mutex::new(Record::default()));
        (
            Recorder {
                record: record.clone(),
                chunked,
                fail_at: None,
                gate: None,
            },
            record,
        )
    }
}

impl Pinner for Recorder {
    type Error = String;
    fn counts_against_memlock(&self) -> bool {
        false
    }
    fn pins_in_chunks(&self) -> bool {
        self.chunked
    }
    fn pin(&self, addr: *mut u8, len: usize) -> Result<(), String> {
        let mut r = self.record.lock().unwrap();
        if self.fail_at == Some(r.pins.len()) {
            return Err(format!("refused pin {}", r.pins.len()));
        }
        r.pins.push((addr as usize, len));
        Ok(())
    }
    fn unpin(&self, addr: *mut u8, len: usize) {
        let mut r = self.record.lock().unwrap();
        if r.quiesced == 0 {
            r.early_unpins += 1;
        }
        r.unpins.push((addr as usize, len));
    }
    fn quiesce(&self) {
        if let Some(gate) = &self.gate {
            gate.lock().unwrap().recv().unwrap();
        }
        self.record.lock().unwrap().quiesced += 1;
    }
}

/// The pool's bytes (the test owns the region and nothing else touches it).
fn bytes(r: &HostRegion<impl Pinner>) -> &[u8] {
    // SAFETY: the region's memory is mapped, initialised (zeroed by the kernel or written by the
    // test) and lives as long as the borrow of `r`; no device uses it in these tests.
    unsafe { std::slice::from_raw_parts(r.addr().as_ptr(), r.len()) }
}

fn sorted(mut v: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    v.sort_unstable();
    v
}

/// Whether `ranges` (address, length) tile `[start, start + len)` exactly, in order.
fn tiles(ranges: &[(usize, usize)], start: usize, len: usize) -> bool {
    let mut at = start;
    for &(a, l) in ranges {
        if a != at || l == 0 {
            return false;
        }
        at += l;
    }
    at == start + len
}

#[test]
fn a_pool_is_zeroed_aligned_of_the_exact_size_and_pinned_chunk_by_chunk() {
    let _m = mappings();
    let cfg = HostPoolConfig {
        threads: Some(3),
        chunk_bytes: Some(4 << 20),
        ..HostPoolConfig::default()
    };
    for len in [1, 4095, 4096, HUGE_PAGE + 1, PARALLEL_FROM + (5 << 20) + 3] {
        let (pinner, record) = Recorder::new(true);
        let region = HostRegion::allocate(len, &cfg, None, pinner).unwrap();
        let addr = region.addr().as_ptr() as usize;
        assert_eq!(region.len(), len);
        let align = if len >= HUGE_PAGE { HUGE_PAGE } else { 4096 };
        assert_eq!(addr % align, 0, "{len} bytes at {addr:#x}");
        assert!(
            bytes(&region).iter().all(|&b| b == 0),
            "{len} bytes not zeroed"
        );
        assert!(is_mapped(addr, len));
        let pins = sorted(record.lock().unwrap().pins.clone());
        assert!(tiles(&pins, addr, len), "{len}: pins {pins:x?}");
        assert_eq!(region.setup().pinnings, pins.len());
        let ranges: Vec<Range<usize>> = region.pinned_ranges().to_vec();
        assert_eq!(ranges.len(), pins.len());
        if len >= PARALLEL_FROM {
            assert_eq!(
                region.setup().threads,
                3,
                "a large pool is set up in parallel"
            );
            assert!(pins.len() > 3, "{} chunks for 3 threads", pins.len());
            assert_eq!(region.setup().pages, Pages::TransparentHuge);
        } else {
            assert_eq!(region.setup().threads, 1, "a small pool is set up here");
        }
        let done = region.release();
        done.wait();
        let r = record.lock().unwrap();
        assert_eq!(sorted(r.unpins.clone()), pins, "every pin undone once");
        assert_eq!((r.quiesced, r.early_unpins), (1, 0), "quiesced first");
        assert!(
            !is_mapped(addr, len),
            "{len} bytes still mapped after the release"
        );
    }
}

#[test]
fn whole_registration_pins_once_after_touching_in_parallel() {
    let _m = mappings();
    let len = PARALLEL_FROM + HUGE_PAGE;
    for (chunked, registration) in [(false, Registration::Chunks), (true, Registration::Whole)] {
        let cfg = HostPoolConfig {
            threads: Some(4),
            registration,
            chunk_bytes: Some(8 << 20),
            ..HostPoolConfig::default()
        };
        let (pinner, record) = Recorder::new(chunked);
        let region = HostRegion::allocate(len, &cfg, None, pinner).unwrap();
        let addr = region.addr().as_ptr() as usize;
        assert_eq!(record.lock().unwrap().pins, vec![(addr, len)]);
        assert_eq!(region.setup().pinnings, 1);
        assert!(bytes(&region).iter().all(|&b| b == 0));
        region.release().wait();
        assert_eq!(record.lock().unwrap().unpins, vec![(addr, len)]);
    }
}

#[test]
fn driver_copies_are_cut_at_every_chunk_boundary() {
    let cfg = HostPoolConfig {
        chunk_bytes: Some(HUGE_PAGE),
        ..HostPoolConfig::default()
    };
    let len = 3 * HUGE_PAGE + 5;
    let region = HostRegion::allocate(len, &cfg, None, Recorder::new(true).0).unwrap();
    let pieces = |r: Range<usize>| copy_pieces(Some(&region), r).collect::<Vec<_>>();
    let h = HUGE_PAGE;
    assert_eq!(
        pieces(0..len),
        vec![0..h, h..2 * h, 2 * h..3 * h, 3 * h..len]
    );
    assert_eq!(pieces(h - 1..h + 1), vec![h - 1..h, h..h + 1]);
    assert_eq!(pieces(h..2 * h), vec![h..2 * h]);
    assert_eq!(pieces(3 * h + 1..len), vec![3 * h + 1..len]);
    assert_eq!(pieces(7..7), Vec::<Range<usize>>::new());
    // Pinned whole: one piece.
    let whole = HostPoolConfig {
        registration: Registration::Whole,
        ..cfg
    };
    let one = HostRegion::allocate(len, &whole, None, Recorder::new(true).0).unwrap();
    assert_eq!(
        copy_pieces(Some(&one), 5..len).collect::<Vec<_>>(),
        vec![5..len]
    );
    assert!(copy_pieces(Some(&one), 9..9).next().is_none());
    // Memory its owner pinned: one piece, none when empty.
    let owners = copy_pieces(None::<&HostRegion<NoPin>>, 3..len).collect::<Vec<_>>();
    assert_eq!(owners, vec![3..len]);
    assert!(
        copy_pieces(None::<&HostRegion<NoPin>>, 4..4)
            .next()
            .is_none()
    );
}

#[test]
fn the_device_range_must_continue_over_every_chunk() {
    let cfg = HostPoolConfig {
        chunk_bytes: Some(HUGE_PAGE),
        ..HostPoolConfig::default()
    };
    let region =
        HostRegion::allocate(3 * HUGE_PAGE + 5, &cfg, None, Recorder::new(true).0).unwrap();
    assert_eq!(region.pinned_ranges().len(), 4);
    let host = region.addr().as_ptr() as u64;
    let linear = region.device_base(|p| Ok::<u64, NotOneDeviceRange>(p as u64 + (1 << 40)));
    assert_eq!(linear, Ok(host + (1 << 40)));
    // A translation that jumps at the third chunk.
    let broken = region.device_base(|p| {
        let off = p as u64 - host;
        Ok::<u64, NotOneDeviceRange>(off + if off >= 2 * HUGE_PAGE as u64 { 4096 } else { 0 })
    });
    let e = broken.unwrap_err();
    assert_eq!(
        (e.offset, e.expected, e.found),
        (
            2 * HUGE_PAGE,
            2 * HUGE_PAGE as u64,
            2 * HUGE_PAGE as u64 + 4096
        )
    );
    assert!(e.to_string().contains("Registration::Whole"), "{e}");
}

#[test]
fn a_refused_pin_undoes_every_pin_and_the_mapping() {
    let _m = mappings();
    let len = PARALLEL_FROM + (7 << 20);
    let cfg = HostPoolConfig {
        threads: Some(2),
        chunk_bytes: Some(4 << 20),
        ..HostPoolConfig::default()
    };
    let (mut pinner, record) = Recorder::new(true);
    pinner.fail_at = Some(5);
    let e = HostRegion::allocate(len, &cfg, None, pinner).unwrap_err();
    assert!(
        matches!(&e, SetupError::Pin(m) if m == "refused pin 5"),
        "{e:?}"
    );
    let r = record.lock().unwrap();
    assert!(r.pins.len() >= 5);
    assert_eq!(sorted(r.unpins.clone()), sorted(r.pins.clone()));
    let start = r.pins.iter().map(|p| p.0).min().unwrap();
    assert!(
        !is_mapped(start, 4096),
        "the mapping survived a failed set-up"
    );
}

#[test]
fn a_dropped_pool_is_released_off_the_dropping_thread() {
    let _m = mappings();
    let len = PARALLEL_FROM + HUGE_PAGE;
    let (mut pinner, record) = Recorder::new(true);
    let (open, gate): (Sender<()>, _) = channel();
    pinner.gate = Some(Mutex::new(gate));
    let region = HostRegion::allocate(len, &HostPoolConfig::default(), None, pinner).unwrap();
    let addr = region.addr().as_ptr() as usize;
    // The release waits for the gate: a drop that released on this thread would never return.
    drop(region);
    assert!(is_mapped(addr, len), "released before the pinner quiesced");
    assert_eq!(record.lock().unwrap().unpins.len(), 0);
    assert!(crate::releases_in_flight() >= 1);
    open.send(()).unwrap();
    assert!(wait_for_releases(Duration::from_secs(60)));
    assert!(
        !is_mapped(addr, len),
        "the memory is still mapped after the release"
    );
    let r = record.lock().unwrap();
    assert_eq!(sorted(r.unpins.clone()), sorted(r.pins.clone()));
}

/// A lent array that maps a file of `/dev/shm` (what Python's `multiprocessing.shared_memory`
/// gives) reports the shared-memory file system's pages, as a segment does; other lent memory
/// reports the lender's.
#[test]
fn lent_shared_memory_reports_the_shared_memory_pages() {
    let _m = mappings();
    let len = 4 << 20;
    let name = SharedSegment::unique_name("hisparse-host-memory-lent");
    let segment = SharedSegment::create(&name, len).unwrap();
    // SAFETY: the segment outlives the region (dropped below first) and nothing else uses it.
    let region = unsafe {
        HostRegion::lend(
            segment.addr(),
            len,
            &HostPoolConfig::default(),
            None,
            Recorder::new(true).0,
        )
    }
    .unwrap();
    assert_eq!(region.setup().pages, Pages::Shared(segment.pages()));
    assert!(region.setup().to_string().contains("shared-memory"));
    drop(region);
    drop(segment);
}

#[test]
fn lent_memory_keeps_its_contents_and_stays_mapped() {
    let _m = mappings();
    let len = PARALLEL_FROM + (3 << 20);
    // The lender's memory: an ordinary allocation with data in it.
    let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    // SAFETY: a non-zero size with a valid alignment.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    let p = std::ptr::NonNull::new(raw).unwrap();
    for at in (0..len).step_by(4096 * 7) {
        // SAFETY: inside the allocation.
        unsafe { raw.add(at).write((at / 4096) as u8 | 1) };
    }
    let (pinner, record) = Recorder::new(true);
    let cfg = HostPoolConfig {
        threads: Some(3),
        chunk_bytes: Some(4 << 20),
        ..HostPoolConfig::default()
    };
    // SAFETY: the allocation outlives the region (dropped below first) and nothing else uses
    // it meanwhile.
    let region = unsafe { HostRegion::lend(p, len, &cfg, None, pinner) }.unwrap();
    assert!(region.is_lent());
    assert_eq!(region.setup().pages, Pages::AsGiven);
    assert!(tiles(
        &sorted(record.lock().unwrap().pins.clone()),
        raw as usize,
        len
    ));
    drop(region);
    // Lent memory is unpinned before the drop returns: the lender may free it now.
    let r = record.lock().unwrap();
    assert_eq!(sorted(r.unpins.clone()), sorted(r.pins.clone()));
    drop(r);
    assert!(is_mapped(raw as usize, len));
    for at in (0..len).step_by(4096) {
        // SAFETY: inside the allocation, still the test's.
        let v = unsafe { raw.add(at).read() };
        let want = if at % (4096 * 7) == 0 {
            (at / 4096) as u8 | 1
        } else {
            0
        };
        assert_eq!(v, want, "byte {at} changed");
    }
    // SAFETY: allocated above with this layout, freed once.
    unsafe { std::alloc::dealloc(raw, layout) };

    // SAFETY: refused before the (dangling but aligned) address is touched.
    let misaligned = unsafe {
        HostRegion::lend(
            std::ptr::NonNull::new(0x1010 as *mut u8).unwrap(),
            4096,
            &cfg,
            None,
            NoPin,
        )
    };
    assert!(matches!(
        misaligned,
        Err(SetupError::Host(HostMemoryError::Lent(_)))
    ));
}

/// Bytes of `[addr, addr + len)` backed by transparent huge pages (`AnonHugePages` of every
/// mapping of /proc/self/smaps that lies inside the range).
fn anon_huge_bytes(addr: usize, len: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = lo >= addr && hi <= addr + len;
        } else if inside && let Some(kb) = line.strip_prefix("AnonHugePages:") {
            total += kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
                << 10;
        }
    }
    total
}

/// A test whose prerequisite (transparent huge pages the kernel hands out) is missing: says so
/// loudly and returns, or fails when `HISPARSE_REQUIRE_THP=1` demands the check.
fn skipped(why: String) {
    let required = std::env::var("HISPARSE_REQUIRE_THP").is_ok_and(|v| v == "1");
    assert!(!required, "HISPARSE_REQUIRE_THP=1 but {why}");
    eprintln!("SKIPPED (nothing verified): {why}");
}

#[test]
fn lent_memory_not_in_ram_yet_is_advised_onto_huge_pages() {
    let _m = mappings();
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.is_empty() || thp.contains("[never]") {
        return skipped(format!("transparent huge pages are off here ({thp:?})"));
    }
    let len = 16 << 20;
    // The lender's memory: a fresh anonymous mapping, never touched, 2 MiB aligned inside.
    let map = ffi::map_anonymous(len + HUGE_PAGE, false).unwrap();
    let pad = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
    let lent = std::ptr::NonNull::new(map.as_ptr().wrapping_add(pad)).unwrap();
    // A control of the same size the test advises itself: whether the kernel hands out huge
    // pages at all right now (memory may be too fragmented).
    let control = ffi::map_anonymous(len + HUGE_PAGE, false).unwrap();
    let cpad = (HUGE_PAGE - control.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
    let c = control.as_ptr().wrapping_add(cpad);
    ffi::advise(c, len, libc::MADV_HUGEPAGE).unwrap();
    for at in (0..len).step_by(4096) {
        // SAFETY: inside the control mapping, which only this test uses.
        unsafe { c.add(at).write(1) };
    }
    let cfg = HostPoolConfig {
        threads: Some(2),
        ..HostPoolConfig::default()
    };
    // SAFETY: the mapping outlives the region (dropped below first) and nothing else uses it.
    let region = unsafe { HostRegion::lend(lent, len, &cfg, None, NoPin) }.unwrap();
    let lent_huge = anon_huge_bytes(lent.as_ptr() as usize, len);
    let control_huge = anon_huge_bytes(c as usize, len);
    drop(region);
    // SAFETY: both mappings were made above, each unmapped once, the region gone.
    unsafe {
        ffi::unmap(map.as_ptr(), len + HUGE_PAGE);
        ffi::unmap(control.as_ptr(), len + HUGE_PAGE);
    }
    if control_huge == 0 {
        return skipped("the kernel gave no huge page to an advised mapping either".into());
    }
    assert!(
        lent_huge > 0,
        "the lent range got no huge page (an advised control got {control_huge} bytes of them)"
    );
}

#[test]
fn explicit_huge_pages_beyond_the_free_ones_are_refused() {
    let cfg = HostPoolConfig {
        huge_pages: HugePages::Explicit,
        ..HostPoolConfig::default()
    };
    let free = crate::free_huge_pages().map_or(0, |(f, _)| f);
    let len = (free as usize).saturating_add(HUGE_PAGE);
    let e = HostRegion::allocate(len, &cfg, None, NoPin).unwrap_err();
    let e = HostMemoryError::from(e);
    assert!(matches!(e, HostMemoryError::HugePagesShort { .. }), "{e}");
    assert!(e.to_string().contains("vm.nr_hugepages"), "{e}");
}

/// `VmPeak` of this process: the largest its address space has been.
fn vm_peak() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    crate::meminfo::field(&text, "VmPeak:").unwrap()
}

#[test]
fn a_pool_beyond_the_available_ram_is_refused_before_anything_is_reserved() {
    let available = crate::available_ram().expect("Linux reports MemAvailable");
    let len = usize::try_from(available / 100 * 96).unwrap();
    let peak = vm_peak();
    let e = HostMemoryError::from(
        HostRegion::allocate(len, &HostPoolConfig::default(), None, NoPin).unwrap_err(),
    );
    assert!(
        matches!(
            e,
            HostMemoryError::Budget(PinnedBudgetError::ExceedsAvailable { .. })
        ),
        "{e}"
    );
    let msg = e.to_string();
    for needle in [
        "MemAvailable",
        "--host-mem",
        "host_mem=",
        "host_budget_bytes",
    ] {
        assert!(msg.contains(needle), "{msg}");
    }
    assert!(
        vm_peak() < peak + available / 2,
        "the address space grew by the pool's size before the refusal"
    );
}

/// Set in the child process of the locked-memory test.
const CHILD: &str = "HISPARSE_HOST_MEMORY_TEST_CHILD";

#[test]
fn a_pool_beyond_the_locked_memory_limit_is_refused_in_a_child_process() {
    const TEST: &str = "tests::a_pool_beyond_the_locked_memory_limit_is_refused_in_a_child_process";
    if std::env::var_os(CHILD).is_some() {
        locked_memory_child();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(
        text.contains("child: refused"),
        "the child did not run:\n{text}"
    );
}

/// In the child: the limit lowered to 1 MiB (and `CAP_IPC_LOCK` dropped) — an 8 MiB locked pool
/// is refused before anything is reserved, naming the limit; a 512 KiB one is locked; an
/// unlocked pool of 8 MiB is not bounded by the limit.
fn locked_memory_child() {
    ffi::drop_lock_capability().expect("drop CAP_IPC_LOCK");
    ffi::set_memlock_limit(1 << 20).expect("lower RLIMIT_MEMLOCK");
    let limit = crate::locked_memory_limit().expect("the limit applies now");
    assert_eq!(limit.limit, 1 << 20);
    let cfg = HostPoolConfig::default();
    let peak = vm_peak();
    let e = HostMemoryError::from(match HostRegion::allocate(8 << 20, &cfg, None, Mlock) {
        Ok(_) => panic!("an 8 MiB locked pool passed a 1 MiB limit"),
        Err(SetupError::Pin(e)) => panic!("refused only by mlock: {e}"),
        Err(SetupError::Host(e)) => SetupError::<std::convert::Infallible>::Host(e),
    });
    assert!(
        matches!(
            e,
            HostMemoryError::Budget(PinnedBudgetError::ExceedsLockedLimit { .. })
        ),
        "{e}"
    );
    let msg = e.to_string();
    for needle in [
        "RLIMIT_MEMLOCK",
        "ulimit -l",
        "--host-mem",
        "host_mem=",
        "host_budget_bytes",
    ] {
        assert!(msg.contains(needle), "{msg}");
    }
    assert!(
        vm_peak() < peak + (4 << 20),
        "memory reserved before the refusal"
    );
    let small = HostRegion::allocate(512 << 10, &cfg, None, Mlock).expect("within the limit");
    assert_eq!(small.setup().pinnings, 1);
    drop(small);
    let unlocked = HostRegion::allocate(8 << 20, &cfg, None, NoPin).expect("not locked");
    drop(unlocked);
    println!("child: refused with: {msg}");
}
