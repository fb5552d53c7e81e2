//! `harness = false` test binaries outside the suite that need something a machine may lack (a
//! device, NVRTC): the prerequisite missing is a loud skip, or a failure when the matching
//! `HISPARSE_REQUIRE_*` variable is set (CI sets it where the prerequisite is installed). Output
//! as the suite's: `SKIPPED: …` or `FAILED: …` lines, then `N passed, M failed[, K skipped]`.

use std::fmt::Display;
use std::io::Write;

use hisparse_core::{Device, Error as _, ErrorKind};

use crate::{REQUIRE_DEVICE_ENV, backend_name_of};

/// Environment variable that turns "no NVRTC → skipped" into a failure in the NVRTC compile
/// checks (the CUDA backend's and the kernel lab's).
pub const REQUIRE_NVRTC_ENV: &str = "HISPARSE_REQUIRE_NVRTC";

/// Environment variable that turns "no C++ compiler → skipped" into a failure in the checks that
/// run the kernel source on the CPU (gpu-kernels' emulation test).
pub const REQUIRE_CXX_ENV: &str = "HISPARSE_REQUIRE_CXX";

/// Why the CPU emulation of the kernel source could not be built ([`build_emulation`]).
#[derive(Debug)]
pub enum EmulationBuildError {
    /// No C++20 compiler: `$CXX`, `c++`, `g++` and `clang++` were tried (a skip unless
    /// [`REQUIRE_CXX_ENV`] is set).
    NoCompiler,
    /// The compiler ran and failed, or the files could not be written: the message says which.
    Failed(String),
}

impl std::fmt::Display for EmulationBuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmulationBuildError::NoCompiler => {
                write!(f, "no C++ compiler found ($CXX, c++, g++, clang++)")
            }
            EmulationBuildError::Failed(m) => write!(f, "{m}"),
        }
    }
}

/// Compiles `source` (the CPU vendor prelude, kernel source, emulation driver and launch
/// wrappers, in that order) as C++20 into the shared library `dir/lib{name}.so` and returns its
/// path. Every access is alignment-checked (`-fsanitize=alignment`): a kernel access a GPU would
/// fault on aborts the emulation as it would fault there.
pub fn build_emulation(
    dir: &std::path::Path,
    name: &str,
    source: &str,
) -> Result<std::path::PathBuf, EmulationBuildError> {
    use std::process::Command;
    let cxx = std::env::var("CXX")
        .ok()
        .into_iter()
        .chain(["c++", "g++", "clang++"].map(String::from))
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .ok_or(EmulationBuildError::NoCompiler)?;
    let failed = |e: std::io::Error| EmulationBuildError::Failed(e.to_string());
    std::fs::create_dir_all(dir).map_err(failed)?;
    let cpp = dir.join(format!("{name}.cpp"));
    let so = dir.join(format!("lib{name}.so"));
    std::fs::write(&cpp, source).map_err(failed)?;
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            "-fno-strict-aliasing",
            "-fsanitize=alignment",
            "-fno-sanitize-recover=alignment",
            "-Wno-unknown-pragmas",
            "-o",
        ])
        .arg(&so)
        .arg(&cpp)
        .output()
        .map_err(|e| EmulationBuildError::Failed(format!("{cxx}: {e}")))?;
    if !out.status.success() {
        return Err(EmulationBuildError::Failed(format!(
            "{cxx} failed to compile {name} for the CPU:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(so)
}

/// Whether the environment variable `name` is set to a true value (`1`, `true`, `yes`).
pub fn flag_set(name: &str) -> bool {
    std::env::var(name)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// For a libtest test, which should not end the process: `Ok(None)` when `open` found no device
/// (`ErrorKind::NotFound`) and [`REQUIRE_DEVICE_ENV`] is unset, after a `SKIPPED` line on stderr
/// (written directly, past libtest's capture of a passing test's output); the device, or any
/// other error, as they came.
pub fn device_or_skip<D: Device>(open: Result<D, D::Error>) -> Result<Option<D>, D::Error> {
    match open {
        Ok(dev) => Ok(Some(dev)),
        Err(e) if e.kind() == ErrorKind::NotFound && !crate::device_required() => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: no {} device: {e}",
                backend_name_of::<D>()
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// One test binary's check: its name, and how many cases a skip reports.
#[derive(Clone, Debug)]
pub struct Check {
    name: String,
    cases: usize,
}

impl Check {
    /// A binary of the one case `name`. Answers libtest's `--list` (the name) and exits then.
    pub fn one(name: &str) -> Check {
        Check::of(name, &[name])
    }

    /// A binary whose check `name` runs `cases`. Answers libtest's `--list` (every case) and
    /// exits then.
    pub fn of(name: &str, cases: &[impl Display]) -> Check {
        if std::env::args().any(|a| a == "--list") {
            for case in cases {
                println!("{case}: test");
            }
            std::process::exit(0);
        }
        Check {
            name: name.to_owned(),
            cases: cases.len(),
        }
    }

    /// Ends the binary because a prerequisite is missing (`why`): every case skipped, or with
    /// `require_env` set a failure.
    pub fn missing(&self, require_env: &str, why: impl Display) -> ! {
        if flag_set(require_env) {
            println!("FAILED: {}: {require_env}=1 but {why}", self.name);
            println!("0 passed, 1 failed");
            std::process::exit(1);
        }
        println!("SKIPPED: {}: {why}", self.name);
        println!("0 passed, 0 failed, {} skipped", self.cases);
        std::process::exit(0)
    }

    /// The device `open` returned, or the end of the binary: a device that is not found
    /// (`ErrorKind::NotFound`) is [`missing`](Check::missing) under [`REQUIRE_DEVICE_ENV`], any
    /// other error a failure.
    pub fn device<D: Device>(&self, open: Result<D, D::Error>) -> D {
        let backend = backend_name_of::<D>();
        match open {
            Ok(dev) => dev,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.missing(REQUIRE_DEVICE_ENV, format_args!("no {backend} device: {e}"))
            }
            Err(e) => self.fail(format_args!(
                "cannot open a {backend} device: {e} [{}]",
                e.kind()
            )),
        }
    }

    /// Ends the binary with the check's result: `1 passed`, or `FAILED: <name>: <why>`.
    pub fn finish(&self, result: Result<(), impl Display>) -> ! {
        match result {
            Ok(()) => {
                println!("1 passed, 0 failed");
                std::process::exit(0)
            }
            Err(why) => self.fail(why),
        }
    }

    fn fail(&self, why: impl Display) -> ! {
        println!("FAILED: {}: {why}", self.name);
        println!("0 passed, 1 failed");
        std::process::exit(1)
    }
}
