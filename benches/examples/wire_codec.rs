//! Instruction-count driver of the wire bench (`benches/wire.rs`): the scheduler bench's
//! prefill and 64 decode steps, then the last step's command (256 scheduled requests, 1,536 row
//! mirrors) encoded [`MESSAGES`] times in [`measured_encode`] and decoded as often in
//! [`measured_decode`], so a profiler can collect either:
//!
//! ```text
//! cargo build --release -p hisparse-benches --example wire_codec
//! valgrind --tool=callgrind --toggle-collect='*measured_encode*' target/release/examples/wire_codec
//! valgrind --tool=callgrind --toggle-collect='*measured_decode*' target/release/examples/wire_codec
//! ```
//!
//! Instructions per message are callgrind's collected total divided by [`MESSAGES`]
//! (deterministic, unlike wall-clock time on a shared machine).

#[path = "../benches/scheduler_setup/mod.rs"]
mod scheduler_setup;

use std::hint::black_box;

use hisparse_core::coordinator::OffloadCommand;
use hisparse_core::layout::LayoutFingerprint;
use scheduler_setup::{prepared, step};

/// Messages encoded, then decoded.
const MESSAGES: u32 = 256;

/// Encodes `cmd` [`MESSAGES`] times into a reused buffer (not inlined: the profiler's
/// collection toggles on this function).
#[inline(never)]
fn measured_encode(cmd: &OffloadCommand, fingerprint: LayoutFingerprint, buf: &mut Vec<u8>) {
    for _ in 0..MESSAGES {
        buf.clear();
        black_box(cmd).encode_into(fingerprint, buf);
        black_box(&buf);
    }
}

/// Decodes `bytes` [`MESSAGES`] times.
#[inline(never)]
fn measured_decode(bytes: &[u8], fingerprint: LayoutFingerprint) {
    for _ in 0..MESSAGES {
        black_box(OffloadCommand::from_bytes(black_box(bytes), fingerprint).expect("decode"));
    }
}

fn main() {
    let mut c = prepared();
    let fingerprint = c.layout().fingerprint();
    let mut cmd = OffloadCommand::default();
    for i in 0..64u32 {
        step(&mut c, &mut cmd, i);
    }
    let mut buf = Vec::new();
    let started = std::time::Instant::now();
    measured_encode(&cmd, fingerprint, &mut buf);
    let encoded = started.elapsed();
    let started = std::time::Instant::now();
    measured_decode(&buf, fingerprint);
    let decoded = started.elapsed();
    eprintln!(
        "{} bytes ({} scheduled, {} row mirrors): {:.1} us to encode, {:.1} us to decode (wall clock)",
        buf.len(),
        cmd.scheduled.len(),
        cmd.row_mirrors.len(),
        encoded.as_secs_f64() * 1e6 / f64::from(MESSAGES),
        decoded.as_secs_f64() * 1e6 / f64::from(MESSAGES),
    );
}
