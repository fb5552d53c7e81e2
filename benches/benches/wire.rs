//! The wire format on the scheduler bench's command: a DeepSeek V3.2 decode step of 256
//! requests at 32K context under memory pressure (row mirrors, reclaimed pages). Measures
//! encoding it into a reused buffer, decoding it, and fingerprinting the layout (done once
//! per layout), and prints the message size over 256 consecutive steps.

mod scheduler_setup;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hisparse_core::coordinator::OffloadCommand;
use scheduler_setup::{REQUESTS, prepared, step};

fn bench(cr: &mut Criterion) {
    let mut coord = prepared();
    let fingerprint = coord.layout().fingerprint();
    let mut cmd = OffloadCommand::default();
    let mut sizes = Vec::new();
    let mut buf = Vec::new();
    for i in 0..256 {
        step(&mut coord, &mut cmd, i);
        buf.clear();
        cmd.encode_into(fingerprint, &mut buf);
        sizes.push(buf.len());
    }
    assert_eq!(cmd.scheduled.len(), REQUESTS as usize);
    sizes.sort_unstable();
    eprintln!(
        "message bytes per decode step of {REQUESTS} requests over 256 steps: min {}, median {}, max {} ({} row mirrors, {} residency updates, {} host-table updates in the last step)",
        sizes[0],
        sizes[sizes.len() / 2],
        sizes[sizes.len() - 1],
        cmd.row_mirrors.len(),
        cmd.residency.len(),
        cmd.host_blocks.len(),
    );
    buf.clear();
    cmd.encode_into(fingerprint, &mut buf);
    assert_eq!(
        OffloadCommand::from_bytes(&buf, fingerprint).as_ref(),
        Ok(&cmd)
    );

    let mut g = cr.benchmark_group("wire");
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("encode_step_256x32k_v32", |b| {
        let mut out = Vec::new();
        b.iter(|| {
            out.clear();
            black_box(&cmd).encode_into(fingerprint, &mut out);
            black_box(&out);
        })
    });
    g.bench_function("decode_step_256x32k_v32", |b| {
        b.iter(|| OffloadCommand::from_bytes(black_box(&buf), fingerprint).expect("decode"))
    });
    g.bench_function("fingerprint_v32", |b| {
        b.iter(|| black_box(coord.layout()).fingerprint())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
