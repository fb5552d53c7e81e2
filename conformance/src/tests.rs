//! Tests of the runner itself, with a device type that can never be opened.

use std::collections::HashSet;
use std::fmt;

use hisparse_core::ops::{
    BlockPair, BufferLen, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, PageCopyDesc,
    PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan,
    SlotMappingArgs, SlotMappingDesc,
};
use hisparse_core::{Device, Error, ErrorKind, OpError};

use super::*;

/// The error a missing (or broken) ghost device reports.
#[derive(Debug)]
struct GhostError(ErrorKind);

impl fmt::Display for GhostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ghost driver: {}", self.0)
    }
}

impl Error for GhostError {
    fn kind(&self) -> ErrorKind {
        self.0
    }
}

impl From<OpError> for GhostError {
    fn from(_: OpError) -> Self {
        GhostError(ErrorKind::InvalidArgument)
    }
}

struct GhostBuf;

impl BufferLen for GhostBuf {
    fn byte_len(&self) -> u64 {
        0
    }
}

/// A device that never opens, so none of its operations is ever called.
struct GhostDevice;

type R<T = ()> = Result<T, GhostError>;

fn never<T>() -> R<T> {
    unreachable!("a ghost device is never opened")
}

impl Device for GhostDevice {
    type Error = GhostError;
    type Buffer = GhostBuf;
    type HostBuffer = GhostBuf;
    type Stream = ();
    type Event = ();

    fn backend(&self) -> &'static str {
        "ghost"
    }
    fn device_name(&self) -> &str {
        "ghost"
    }
    fn alloc(&self, _: usize) -> R<GhostBuf> {
        never()
    }
    fn alloc_pinned(&self, _: usize) -> R<GhostBuf> {
        never()
    }
    fn pinned_address(&self, _: &GhostBuf) -> usize {
        0
    }
    fn upload(&self, _: &mut GhostBuf, _: usize, _: &[u8]) -> R {
        never()
    }
    fn download(&self, _: &GhostBuf, _: usize, _: &mut [u8]) -> R {
        never()
    }
    fn write_pinned(&self, _: &mut GhostBuf, _: usize, _: &[u8]) -> R {
        never()
    }
    fn read_pinned(&self, _: &GhostBuf, _: usize, _: &mut [u8]) -> R {
        never()
    }
    fn create_stream(&self) -> R {
        never()
    }
    fn record_event(&self, _: &()) -> R {
        never()
    }
    fn wait_event(&self, _: &(), _: &()) -> R {
        never()
    }
    fn synchronize(&self, _: &()) -> R {
        never()
    }
    fn query_event(&self, _: &()) -> R<bool> {
        never()
    }
    fn copy_to_device(
        &self,
        _: &(),
        _: &GhostBuf,
        _: usize,
        _: &mut GhostBuf,
        _: usize,
        _: usize,
    ) -> R {
        never()
    }
    fn copy_to_host(
        &self,
        _: &(),
        _: &GhostBuf,
        _: usize,
        _: &mut GhostBuf,
        _: usize,
        _: usize,
    ) -> R {
        never()
    }
    fn copy_on_device(
        &self,
        _: &(),
        _: &GhostBuf,
        _: usize,
        _: &mut GhostBuf,
        _: usize,
        _: usize,
    ) -> R {
        never()
    }
    fn remap(&self, _: &(), _: &RemapDesc, _: RemapArgs<'_, GhostBuf>) -> R {
        never()
    }
    fn resolve(&self, _: &(), _: &ResolveDesc, _: ResolveArgs<'_, GhostBuf>) -> R {
        never()
    }
    fn gather_rows(&self, _: &(), _: &GatherDesc<'_>, _: GatherArgs<'_, GhostBuf, GhostBuf>) -> R {
        never()
    }
    fn copy_pages(
        &self,
        _: &(),
        _: &PageCopyDesc<'_>,
        _: &[BlockPair],
        _: &mut GhostBuf,
        _: &mut GhostBuf,
    ) -> R {
        never()
    }
    fn copy_rows(
        &self,
        _: &(),
        _: &RowCopyDesc<'_>,
        _: &[RowSpan],
        _: &mut GhostBuf,
        _: &mut GhostBuf,
    ) -> R {
        never()
    }
    fn copy_host_pages(&self, _: &(), _: &[PageLayout], _: &[BlockPair], _: &mut GhostBuf) -> R {
        never()
    }
    fn invalidate(&self, _: &(), _: &InvalidateDesc, _: InvalidateArgs<'_, GhostBuf>) -> R {
        never()
    }
    fn compressed_slot_mapping(
        &self,
        _: &(),
        _: &SlotMappingDesc,
        _: SlotMappingArgs<'_, GhostBuf>,
    ) -> R {
        never()
    }
}

fn text(out: Vec<u8>) -> String {
    String::from_utf8(out).unwrap()
}

#[test]
fn the_suite_has_at_least_100_uniquely_named_cases() {
    let cases = cases::<GhostDevice>();
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    let mut names = HashSet::new();
    for c in &cases {
        assert!(
            names.insert(c.name().to_owned()),
            "duplicate case {}",
            c.name()
        );
        assert!(!c.name().contains(char::is_whitespace), "{}", c.name());
    }
}

#[test]
fn a_missing_device_skips_every_case_loudly() {
    let mut out = Vec::new();
    let all = |_: &str| true;
    let r =
        run_opened_with::<GhostDevice>(Err(GhostError(ErrorKind::NotFound)), &all, false, &mut out);
    let text = text(out);
    let n = cases::<GhostDevice>().len();
    assert_eq!((r.passed, r.failed, r.skipped), (0, 0, n));
    assert!(r.success());
    assert!(
        text.starts_with("SKIPPED: no ghost device: ghost driver: not found\n"),
        "{text}"
    );
    assert!(text.contains("skip remap/fixed/bounds: no ghost device\n"));
    assert_eq!(
        text.lines().last().unwrap(),
        format!("0 passed, 0 failed, {n} skipped")
    );
}

#[test]
fn a_required_device_that_is_missing_fails() {
    let mut out = Vec::new();
    let r = run_opened_with::<GhostDevice>(
        Err(GhostError(ErrorKind::NotFound)),
        &|_| true,
        true,
        &mut out,
    );
    assert!(!r.success());
    let text = text(out);
    assert!(
        text.starts_with("FAIL open ghost device: ghost driver: not found"),
        "{text}"
    );
    assert!(text.contains("HISPARSE_REQUIRE_DEVICE=1"));
    assert_eq!(text.lines().last().unwrap(), "0 passed, 1 failed");
}

#[test]
fn any_other_open_error_fails_even_without_the_requirement() {
    let mut out = Vec::new();
    let r = run_opened_with::<GhostDevice>(
        Err(GhostError(ErrorKind::DeviceLost)),
        &|_| true,
        false,
        &mut out,
    );
    assert_eq!(r.failed, 1);
    assert!(text(out).contains("[device lost]"));
}

#[test]
fn the_filter_selects_by_substring() {
    let mut out = Vec::new();
    let r = run_opened_with::<GhostDevice>(
        Err(GhostError(ErrorKind::NotFound)),
        &|n| matches(n, Some("remap/fixed")),
        false,
        &mut out,
    );
    assert_eq!(r.skipped, 4);
}

#[test]
fn arguments_parse_like_libtest() {
    let a = |v: &[&str]| Args::parse(v.iter().map(|s| s.to_string()));
    assert_eq!(a(&[]).filter, None);
    assert_eq!(
        a(&["--nocapture", "resolve"]).filter.as_deref(),
        Some("resolve")
    );
    assert_eq!(
        a(&["--test-threads", "1", "remap"]).filter.as_deref(),
        Some("remap")
    );
    assert_eq!(a(&["--skip", "x", "-q"]).filter, None);
    let e = a(&["--exact", "remap/fixed/bounds", "--nocapture"]);
    assert!(e.exact);
    assert_eq!(e.filter.as_deref(), Some("remap/fixed/bounds"));
    let l = a(&["--list", "--format", "terse"]);
    assert!(l.list && l.filter.is_none());
}

#[test]
fn summary_line_format() {
    let mut r = Report {
        passed: 3,
        ..Report::default()
    };
    assert_eq!(r.summary(), "3 passed, 0 failed");
    r.failed = 1;
    r.skipped = 2;
    assert_eq!(r.summary(), "3 passed, 1 failed, 2 skipped");
    assert!(!r.success());
}

#[test]
fn backend_names_come_from_the_type() {
    assert_eq!(backend_name_of::<GhostDevice>(), "ghost");
    assert_eq!(backend_name_of::<GhostBuf>(), "ghostbuf");
}

#[test]
fn known_failures_table_is_empty_and_consulted() {
    assert!(KNOWN_FAILURES.is_empty());
    assert_eq!(known_failure("cpu", "remap/fixed/bounds"), None);
}

#[test]
fn seeds_are_stable_per_name() {
    let a = Case::<GhostDevice>::seeded("x/y", |_, _| Ok(()));
    let b = Case::<GhostDevice>::seeded("x/y", |_, _| Ok(()));
    let c = Case::<GhostDevice>::seeded("x/z", |_, _| Ok(()));
    assert_eq!(a.seed(), b.seed());
    assert_ne!(a.seed(), c.seed());
    assert_eq!(Case::<GhostDevice>::fixed("f", |_| Ok(())).seed(), None);
}

#[test]
fn a_panicking_case_is_a_failure() {
    let c = Case::<GhostDevice>::fixed("p", |_| panic!("boom"));
    assert_eq!(
        c.run(&GhostDevice),
        Err(CaseError::Fail("panicked: boom".into()))
    );
}

/// A filter selects by substring, or with a leading `^` by prefix (the sanitizer runs select the
/// gather op's own cases this way, without the resolve-and-gather scenarios).
#[test]
fn a_caret_filter_selects_by_prefix() {
    assert!(matches("gather/fixed/bounds", Some("^gather/")));
    assert!(!matches(
        "resolve_and_gather/decode-64x2048/0",
        Some("^gather/")
    ));
    assert!(matches(
        "resolve_and_gather/decode-64x2048/0",
        Some("gather/")
    ));
    assert!(matches("anything", None));
}
