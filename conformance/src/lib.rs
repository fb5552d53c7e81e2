#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod cases;
pub mod check;
mod rng;
pub mod scenarios;
mod util;

use std::fmt;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};

use hisparse_core::{Device, Error, ErrorKind};

pub use cases::cases;
pub use rng::SplitMix64;

/// Environment variable that turns "no device → skipped" into a failure.
pub const REQUIRE_DEVICE_ENV: &str = "HISPARSE_REQUIRE_DEVICE";

/// Environment variable whose value (a `u64`, decimal or `0x` hex) is mixed into every random
/// case's seed, to explore other inputs. Unset, the seeds are fixed per case name.
pub const SEED_ENV: &str = "HISPARSE_CONFORMANCE_SEED";

/// Cases a backend is known to fail: `(backend, case name, reason)`. A listed case that fails is
/// reported as skipped with the reason; a listed case that passes is a failure (remove it from
/// the table). Keep this table empty: it exists so a regression can be parked visibly, never in
/// `if` statements scattered through the cases.
pub const KNOWN_FAILURES: &[(&str, &str, &str)] = &[];

/// The known-failure reason for `case` on `backend`, if the table lists it.
pub fn known_failure(backend: &str, case: &str) -> Option<&'static str> {
    KNOWN_FAILURES
        .iter()
        .find(|(b, c, _)| *b == backend && *c == case)
        .map(|(_, _, why)| *why)
}

/// Why a case did not pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// The backend's behaviour differs from the contract; the message says how.
    Fail(String),
    /// The case cannot run on this device (a capability it lacks); the message says why.
    Skip(String),
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseError::Fail(m) | CaseError::Skip(m) => f.write_str(m),
        }
    }
}

/// What one case returns.
pub type CaseResult = Result<(), CaseError>;

type Body<D> = Box<dyn Fn(&D, u64) -> CaseResult>;

/// One conformance case: a name, an optional seed for its random inputs and a body generic over
/// the device.
pub struct Case<D: Device> {
    name: String,
    seed: Option<u64>,
    body: Body<D>,
}

impl<D: Device> Case<D> {
    /// A case with fixed inputs.
    pub fn fixed(name: impl Into<String>, body: impl Fn(&D) -> CaseResult + 'static) -> Self {
        Case {
            name: name.into(),
            seed: None,
            body: Box::new(move |d, _| body(d)),
        }
    }

    /// A case with random inputs drawn from a seed. The seed is derived from the name (and
    /// [`SEED_ENV`] when set) and printed when the case fails.
    pub fn seeded(name: impl Into<String>, body: impl Fn(&D, u64) -> CaseResult + 'static) -> Self {
        let name = name.into();
        let seed = seed_for(&name);
        Case {
            name,
            seed: Some(seed),
            body: Box::new(body),
        }
    }

    /// The case's name (`family/variant`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The seed of a random case.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// Runs the case on `dev`, turning a panic into a failure.
    pub fn run(&self, dev: &D) -> CaseResult {
        let seed = self.seed.unwrap_or(0);
        match catch_unwind(AssertUnwindSafe(|| (self.body)(dev, seed))) {
            Ok(r) => r,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                Err(CaseError::Fail(format!("panicked: {msg}")))
            }
        }
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn seed_override() -> u64 {
    let Ok(v) = std::env::var(SEED_ENV) else {
        return 0;
    };
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    parsed.unwrap_or_else(|_| fnv1a(v))
}

fn seed_for(name: &str) -> u64 {
    fnv1a(name) ^ seed_override()
}

/// The tally of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed (a device that could not be opened counts as one failure).
    pub failed: usize,
    /// Cases skipped (no device, a missing capability, or a known failure).
    pub skipped: usize,
    /// `name: reason` of every failure.
    pub failures: Vec<String>,
}

impl Report {
    /// Whether nothing failed.
    pub fn success(&self) -> bool {
        self.failed == 0
    }

    /// The final line: `N passed, M failed` plus `, K skipped` when K > 0.
    pub fn summary(&self) -> String {
        let mut s = format!("{} passed, {} failed", self.passed, self.failed);
        if self.skipped > 0 {
            s.push_str(&format!(", {} skipped", self.skipped));
        }
        s
    }

    fn fail(&mut self, out: &mut dyn Write, name: &str, why: &str) {
        let _ = writeln!(out, "FAIL {name}: {why}");
        self.failed += 1;
        self.failures.push(format!("{name}: {why}"));
    }

    fn skip(&mut self, out: &mut dyn Write, name: &str, why: &str) {
        let _ = writeln!(out, "skip {name}: {why}");
        self.skipped += 1;
    }

    fn pass(&mut self, out: &mut dyn Write, name: &str) {
        let _ = writeln!(out, "ok   {name}");
        self.passed += 1;
    }
}

/// Whether `name` is selected by `filter`: a substring, or with a leading `^` a prefix (`^gather/`
/// selects the gather op's cases, not `resolve_and_gather/...`); `None` selects everything.
pub fn matches(name: &str, filter: Option<&str>) -> bool {
    filter.is_none_or(|f| match f.strip_prefix('^') {
        Some(prefix) => name.starts_with(prefix),
        None => name.contains(f),
    })
}

/// Runs every case selected by `filter` on `dev`, one line per case on `out`, then the summary
/// line. Consults [`KNOWN_FAILURES`] for `dev.backend()`.
pub fn run<D: Device + 'static>(dev: &D, filter: Option<&str>, out: &mut dyn Write) -> Report {
    run_selected(dev, &|n| matches(n, filter), out)
}

fn run_selected<D: Device + 'static>(
    dev: &D,
    select: &dyn Fn(&str) -> bool,
    out: &mut dyn Write,
) -> Report {
    let mut report = Report::default();
    let backend = dev.backend();
    for case in cases::<D>() {
        if !select(case.name()) {
            continue;
        }
        let name = case.name();
        let result = case.run(dev);
        let seeded = |why: &str| match case.seed() {
            Some(s) => format!("{why} [seed {s:#018x}]"),
            None => why.to_owned(),
        };
        match (result, known_failure(backend, name)) {
            (Ok(()), None) => report.pass(out, name),
            (Ok(()), Some(_)) => report.fail(
                out,
                name,
                "listed in KNOWN_FAILURES but passed; remove it from the table",
            ),
            (Err(CaseError::Skip(why)), _) => report.skip(out, name, &why),
            (Err(CaseError::Fail(why)), Some(known)) => report.skip(
                out,
                name,
                &format!("known failure ({known}): {}", seeded(&why)),
            ),
            (Err(CaseError::Fail(why)), None) => report.fail(out, name, &seeded(&why)),
        }
        let _ = out.flush();
    }
    let _ = writeln!(out, "{}", report.summary());
    report
}

/// Whether [`REQUIRE_DEVICE_ENV`] is set to a true value (`1`, `true`, `yes`).
pub fn device_required() -> bool {
    check::flag_set(REQUIRE_DEVICE_ENV)
}

/// A short backend name derived from the device type, for messages written before a device
/// exists: `hisparse_backend_cuda::CudaDevice` → `cuda`.
pub fn backend_name_of<D>() -> String {
    let full = std::any::type_name::<D>();
    let last = full.rsplit("::").next().unwrap_or(full);
    let short = last.strip_suffix("Device").unwrap_or(last);
    if short.is_empty() {
        last.to_ascii_lowercase()
    } else {
        short.to_ascii_lowercase()
    }
}

/// Runs the suite on a device that may have failed to open. This is what the CLI's
/// `hisparse conformance --backend <name>` and [`conformance_main!`] call.
///
/// * `Ok(dev)`: [`run`].
/// * `Err(e)` with kind [`ErrorKind::NotFound`] and [`REQUIRE_DEVICE_ENV`] unset: prints a loud
///   `SKIPPED: no <backend> device: <e>` line and reports every selected case as skipped.
/// * any other error, or `NotFound` with [`REQUIRE_DEVICE_ENV`]`=1`: one failure.
pub fn run_opened<D: Device + 'static>(
    result: Result<D, D::Error>,
    filter: Option<&str>,
    out: &mut dyn Write,
) -> Report {
    run_opened_named(&backend_name_of::<D>(), result, filter, out)
}

/// [`run_opened`] for a device type whose name does not say which backend it is (one chosen at
/// run time, such as the runtime's `AnyDevice`): `backend` names it in what is written when the
/// device did not open.
pub fn run_opened_named<D: Device + 'static>(
    backend: &str,
    result: Result<D, D::Error>,
    filter: Option<&str>,
    out: &mut dyn Write,
) -> Report {
    run_opened_as(
        backend,
        result,
        &|n| matches(n, filter),
        device_required(),
        out,
    )
}

fn run_opened_selected<D: Device + 'static>(
    result: Result<D, D::Error>,
    select: &dyn Fn(&str) -> bool,
    out: &mut dyn Write,
) -> Report {
    run_opened_with(result, select, device_required(), out)
}

fn run_opened_with<D: Device + 'static>(
    result: Result<D, D::Error>,
    select: &dyn Fn(&str) -> bool,
    require_device: bool,
    out: &mut dyn Write,
) -> Report {
    run_opened_as(&backend_name_of::<D>(), result, select, require_device, out)
}

fn run_opened_as<D: Device + 'static>(
    backend: &str,
    result: Result<D, D::Error>,
    select: &dyn Fn(&str) -> bool,
    require_device: bool,
    out: &mut dyn Write,
) -> Report {
    let e = match result {
        Ok(dev) => {
            let _ = writeln!(
                out,
                "conformance: backend {} on {}",
                dev.backend(),
                dev.device_name()
            );
            return run_selected(&dev, select, out);
        }
        Err(e) => e,
    };
    let mut report = Report::default();
    if e.kind() == ErrorKind::NotFound && !require_device {
        let _ = writeln!(out, "SKIPPED: no {backend} device: {e}");
        let why = format!("no {backend} device");
        for case in cases::<D>() {
            if select(case.name()) {
                report.skip(out, case.name(), &why);
            }
        }
    } else {
        let hint = if e.kind() == ErrorKind::NotFound {
            format!(" ({REQUIRE_DEVICE_ENV}=1 demands a device)")
        } else {
            String::new()
        };
        report.fail(
            out,
            &format!("open {backend} device"),
            &format!("{e} [{}]{hint}", e.kind()),
        );
    }
    let _ = writeln!(out, "{}", report.summary());
    report
}

/// Command-line options of a conformance test binary, parsed like libtest's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// The name filter (first free argument).
    pub filter: Option<String>,
    /// `--exact`: the filter must equal the case name.
    pub exact: bool,
    /// `--list`: print the case names and exit.
    pub list: bool,
    /// `--ignored`: only ignored cases (there are none).
    pub ignored: bool,
}

impl Args {
    /// Parses libtest-style arguments (without the program name). Flags starting with `-` are
    /// ignored, except `--exact`, `--list` and `--ignored`; libtest flags that take a value
    /// (`--skip X`, `--test-threads N`, …) consume it.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        const WITH_VALUE: &[&str] = &[
            "--skip",
            "--test-threads",
            "--format",
            "--color",
            "--logfile",
            "-Z",
            "--report-time",
            "--shuffle-seed",
        ];
        let mut a = Args::default();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--exact" => a.exact = true,
                "--list" => a.list = true,
                "--ignored" => a.ignored = true,
                f if WITH_VALUE.contains(&f) => {
                    it.next();
                }
                f if f.starts_with('-') => {}
                _ if a.filter.is_none() => a.filter = Some(arg),
                _ => {}
            }
        }
        a
    }
}

/// The body of [`conformance_main!`]: parses `std::env::args`, opens the device with `open`,
/// runs the suite on stdout and exits with status 1 on any failure.
pub fn main_with<D, F>(open: F) -> !
where
    D: Device + 'static,
    F: FnOnce() -> Result<D, D::Error>,
{
    let args = Args::parse(std::env::args().skip(1));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.list {
        if !args.ignored {
            for c in cases::<D>() {
                if matches(c.name(), args.filter.as_deref()) {
                    let _ = writeln!(out, "{}: test", c.name());
                }
            }
        }
        std::process::exit(0);
    }
    if args.ignored {
        let _ = writeln!(out, "0 passed, 0 failed");
        std::process::exit(0);
    }
    let filter = args.filter.as_deref();
    let select = |n: &str| match (filter, args.exact) {
        (None, _) => true,
        (Some(f), true) => n == f,
        (Some(_), false) => matches(n, filter),
    };
    let report = run_opened_selected(open(), &select, &mut out);
    let _ = out.flush();
    std::process::exit(if report.success() { 0 } else { 1 })
}

/// Defines `main` for a `harness = false` test target that runs the whole suite on one backend.
///
/// ```ignore
/// hisparse_conformance::conformance_main!(|| hisparse_backend_cuda::CudaDevice::open(0));
/// ```
///
/// The expression is anything callable as `FnOnce() -> Result<D, D::Error>`. A device that is not
/// found (`ErrorKind::NotFound`) is reported as skipped, unless `HISPARSE_REQUIRE_DEVICE=1`.
/// The first free command-line argument filters cases by substring, as with libtest.
#[macro_export]
macro_rules! conformance_main {
    ($open:expr) => {
        fn main() {
            $crate::main_with($open)
        }
    };
}

#[cfg(test)]
mod tests;
