//! Instruction-count driver of the scheduler-step bench (`benches/scheduler.rs`): the bench's
//! prefill, 64 warm-up steps, then [`measured`] — 512 decode steps — as one function, so a
//! profiler can collect exactly those steps:
//!
//! ```text
//! cargo build --release -p hisparse-benches --example scheduler_step
//! valgrind --tool=callgrind --toggle-collect='*measured*' target/release/examples/scheduler_step
//! ```
//!
//! Instructions per step are callgrind's collected total divided by 512 (deterministic, unlike
//! wall-clock time on a shared machine).

#[path = "../benches/scheduler_setup/mod.rs"]
mod scheduler_setup;

use hisparse_core::coordinator::{Coordinator, OffloadCommand};
use scheduler_setup::{prepared, step};

/// Steps in the measured loop.
const MEASURED_STEPS: u32 = 512;

/// The measured steps (not inlined: the profiler's collection toggles on this function).
#[inline(never)]
fn measured(c: &mut Coordinator, cmd: &mut OffloadCommand) {
    for i in 0..MEASURED_STEPS {
        step(c, cmd, i);
    }
}

fn main() {
    let mut c = prepared();
    let mut cmd = OffloadCommand::default();
    for i in 0..64u32 {
        step(&mut c, &mut cmd, i);
    }
    let started = std::time::Instant::now();
    measured(&mut c, &mut cmd);
    eprintln!(
        "{MEASURED_STEPS} steps: {:.1} us per step (wall clock)",
        started.elapsed().as_secs_f64() * 1e6 / f64::from(MEASURED_STEPS)
    );
}
