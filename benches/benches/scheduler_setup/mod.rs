//! The state and the step of the scheduler-step bench, shared by `benches/scheduler.rs` and the
//! instruction-count driver `examples/scheduler_step.rs` so both measure the same work.

use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::{LayoutInput, plan_layout};
use hisparse_core::presets::DEEPSEEK_V32;

/// Running decode requests.
pub const REQUESTS: u32 = 256;
/// Context of each request once prefilled, in tokens.
pub const CONTEXT: u32 = 32768;

/// A coordinator with [`REQUESTS`] requests prefilled to [`CONTEXT`] tokens.
///
/// The GPU pool is sized like an H200 serving 256 such requests with HiSparse (about 1300
/// blocks per request against 3584 for all-on-GPU), so most pages are reclaimed during the
/// prefill and every new page in decode goes through reclaim.
pub fn prepared() -> Coordinator {
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

/// One decode step: every request's sampled `token` appended, the step scheduled, the offload
/// command built into `cmd` (reused) and its completion reported.
pub fn step(c: &mut Coordinator, cmd: &mut OffloadCommand, token: u32) {
    for slot in 0..REQUESTS {
        let _ = c.append_token_by_slot(slot, token);
    }
    c.schedule_step().expect("step");
    c.build_offload_command_into(cmd);
    if let Some(id) = cmd.transfer_id {
        c.report(0, &[id], &[id]).expect("report");
    }
}
