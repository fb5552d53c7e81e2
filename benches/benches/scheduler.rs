//! One scheduler step for 256 running decode requests at 32K context on the DeepSeek V3.2
//! preset (target ≤ 20 µs median): append each request's sampled token, schedule the step
//! (allocation, reclaim under pressure, row mirrors), build the offload command into a reused
//! buffer, and apply the worker's completion report.
//!
//! The GPU pool is sized like an H200 serving 256 such requests with HiSparse (about 1300
//! blocks per request against 3584 for all-on-GPU), so most pages are reclaimed during the
//! prefill and every new page in decode goes through reclaim.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::{LayoutInput, plan_layout};
use hisparse_core::presets::DEEPSEEK_V32;

const REQUESTS: u32 = 256;
const CONTEXT: u32 = 32768;

fn prepared() -> Coordinator {
    let model = DEEPSEEK_V32;
    let host_blocks = u64::from(REQUESTS) * 600 + 64;
    let cfg = HiSparseConfig::new(model.top_k, host_blocks * 2_561_024);
    let mut input = LayoutInput::new(&model, &cfg, 0, CONTEXT + 8192);
    input.num_gpu_blocks_override = Some(REQUESTS * 1300);
    let kv = plan_layout(&input).expect("layout");
    let mut c = Coordinator::new(
        kv,
        CoordinatorConfig {
            max_running: REQUESTS,
            max_batched_tokens: 1 << 20,
            ..CoordinatorConfig::default()
        },
    )
    .expect("coordinator");
    let prompt: Vec<u32> = (0..CONTEXT - 1).collect();
    for id in 0..u64::from(REQUESTS) {
        let mut p = prompt.clone();
        p[0] = id as u32; // distinct prompts: no prefix sharing
        c.admit(id, &p).expect("admit");
    }
    let mut cmd = OffloadCommand::default();
    while c.running_ids().count() < REQUESTS as usize
        || c.running_ids()
            .any(|id| c.num_computed(id) != c.num_tokens(id))
    {
        c.schedule_step().expect("step");
        c.build_offload_command_into(&mut cmd);
        if let Some(id) = cmd.transfer_id {
            c.report(0, &[id], &[id]).expect("report");
        }
    }
    c
}

fn step(c: &mut Coordinator, cmd: &mut OffloadCommand, token: u32) {
    for slot in 0..REQUESTS {
        let _ = c.append_token_by_slot(slot, token);
    }
    c.schedule_step().expect("step");
    c.build_offload_command_into(cmd);
    if let Some(id) = cmd.transfer_id {
        c.report(0, &[id], &[id]).expect("report");
    }
}

fn bench(cr: &mut Criterion) {
    let base = prepared();
    assert_eq!(base.num_running(), REQUESTS as usize);
    // Show the state the step runs in: most pages read from host, a hot region per request.
    let host_only: u32 = base
        .running_ids()
        .map(|id| base.host_only_pages(id).unwrap_or(0))
        .sum();
    let hot = base
        .running_ids()
        .filter(|&id| base.has_hot_region(id) == Some(true))
        .count();
    let mut probe = base.clone();
    let mut cmd = OffloadCommand::default();
    let mut reclaimed = 0usize;
    for i in 0..256 {
        step(&mut probe, &mut cmd, i);
        reclaimed += cmd.residency.iter().filter(|u| u.block == 0).count();
    }
    eprintln!(
        "setup: {} requests at {} tokens; {:.1}% of pages read from host; {} hot regions; GPU pool {} blocks, {} free; 256 steps reclaimed {} resident entries",
        REQUESTS,
        CONTEXT,
        100.0 * f64::from(host_only) / f64::from(REQUESTS * CONTEXT.div_ceil(64)),
        hot,
        base.gpu_pool().num_blocks(),
        base.gpu_pool().num_free(),
        reclaimed,
    );
    let mut g = cr.benchmark_group("scheduler");
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(6));
    g.bench_function("decode_step_256x32k_v32", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut c = base.clone();
            let mut cmd = OffloadCommand::default();
            let mut since = 0u32;
            for i in 0..iters {
                if since == 4096 {
                    // Keep the context near 32K: restart from the prepared state (untimed).
                    c = base.clone();
                    since = 0;
                }
                let t = Instant::now();
                step(&mut c, &mut cmd, i as u32);
                total += t.elapsed();
                since += 1;
            }
            assert_eq!(cmd.scheduled.len(), REQUESTS as usize);
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
