//! What an engine that keeps its own scheduler and streams drives: commands run once each and in
//! order, calls on a lent stream, the batch padded for a graph's shape, and the device slot
//! mapping of compressed and regular groups.

use hisparse_backend_cpu::{CpuDevice, CpuStream};
use hisparse_core::Device;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::{GroupKind, LayoutInput, plan_layout};
use hisparse_core::model::ModelSpec;
use hisparse_core::presets;
use hisparse_runtime::{
    Indices, LayerCall, Runtime, RuntimeConfig, RuntimeError, StreamId, Swap, TopK,
};

mod scenario;

use scenario::{SMALL, layout};

fn step(n: u64) -> OffloadCommand {
    OffloadCommand {
        step: n,
        ..OffloadCommand::default()
    }
}

#[test]
fn commands_run_once_each_in_order() {
    let kv = layout(&SMALL);
    let mut rt = Runtime::new(CpuDevice::new(), kv, RuntimeConfig::new(3, 3)).unwrap();
    // The first command may have any number (a worker that joins late).
    rt.begin_step(&step(5)).unwrap();
    rt.end_step(&step(5)).unwrap();
    for (cmd, last, got) in [(5, 5, 5), (4, 5, 4), (7, 5, 7)] {
        match rt.begin_step(&step(cmd)) {
            Err(e @ RuntimeError::StepOrder { .. }) => {
                let RuntimeError::StepOrder { last: l, got: g } = e else {
                    unreachable!()
                };
                assert_eq!((l, g), (last, got));
                let msg = e.to_string();
                let want = match cmd {
                    5 => "already ran",
                    4 => "older than step 5",
                    _ => "steps 6..=6 never ran",
                };
                assert!(msg.contains(want), "{msg}");
            }
            other => panic!("command {cmd} after step 5: {other:?}"),
        }
    }
    // Nothing was applied by the refused commands: the next one in order runs.
    rt.begin_step(&step(6)).unwrap();
    rt.end_step(&step(6)).unwrap();
}

#[test]
fn calls_on_a_lent_stream_and_unknown_stream_ids() {
    let kv = layout(&SMALL);
    let mut rt = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap();
    let lent = rt.adopt_stream(CpuStream).unwrap();
    let bogus = {
        // An id of another runtime: this one has only one lent stream.
        let mut other =
            Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap();
        other.adopt_stream(CpuStream).unwrap();
        other.adopt_stream(CpuStream).unwrap()
    };
    let mut coord = scenario::coordinator(&SMALL, &kv);
    coord.admit(1, &(0..40).collect::<Vec<u32>>()).unwrap();
    let cmd = coord.step().unwrap();
    assert!(matches!(
        rt.begin_step_on(&cmd, Some(bogus)),
        Err(RuntimeError::NoSuchStream { id: 1 })
    ));
    rt.begin_step_on(&cmd, Some(lent)).unwrap();
    scenario::forward(&mut rt, &kv, &cmd);
    rt.set_batch_on(&[cmd.scheduled[0].slot as i32], None, Some(lent))
        .unwrap();
    let dev = CpuDevice::new();
    let k = kv.config.top_k as usize;
    let mut topk = dev.alloc(k * 4).unwrap();
    dev.upload_i32(&mut topk, 0, &(0..k as i32).collect::<Vec<_>>())
        .unwrap();
    let mut rows = dev.alloc(k * 4).unwrap();
    for on in [Some(lent), None] {
        rt.decode(LayerCall {
            group: 0,
            swap: Swap::IndexGroup,
            topk: TopK {
                positions: &topk,
                num_tokens: 1,
                state_rows: None,
            },
            out: Indices {
                rows: &mut rows,
                counts: None,
            },
            on,
        })
        .unwrap();
    }
    let mut got = vec![0i32; k];
    dev.download_i32(&rows, 0, &mut got).unwrap();
    assert!(got.iter().all(|&r| r >= 0), "{got:?}");
    rt.end_step_on(&cmd, Some(lent)).unwrap();
    assert_eq!(StreamId::index(lent), 0);
}

#[test]
fn the_batch_is_padded_for_a_graphs_shape() {
    let kv = layout(&SMALL);
    let mut rt = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap();
    let mut coord = scenario::coordinator(&SMALL, &kv);
    for id in 1..=2 {
        coord.admit(id, &(0..20).collect::<Vec<u32>>()).unwrap();
    }
    let cmd = coord.step().unwrap();
    rt.begin_step(&cmd).unwrap();
    let slots: Vec<i32> = cmd.scheduled.iter().map(|s| s.slot as i32).collect();
    assert_eq!(slots.len(), 2);
    let batch = |rt: &Runtime<CpuDevice>| {
        let mut b = vec![0i32; 3];
        rt.device()
            .download_i32(rt.batch_buffer(), 0, &mut b)
            .unwrap();
        b
    };
    rt.set_batch_on(&slots, Some(3), None).unwrap();
    assert_eq!(batch(&rt), vec![slots[0], slots[1], -1]);
    // Fewer rows than the graph's: padding; more: refused, naming the shapes.
    match rt.set_batch_on(&slots, Some(1), None) {
        Err(e @ RuntimeError::GraphShape { .. }) => {
            assert!(e.to_string().contains("padded to 1"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        rt.set_batch_on(&slots, Some(4), None),
        Err(RuntimeError::TooManyTokens { tokens: 4, max: 3 })
    ));
    // A smaller batch leaves no stale state row behind it.
    rt.set_batch_on(&slots[1..], None, None).unwrap();
    assert_eq!(batch(&rt), vec![slots[1], -1, -1]);
    assert!(rt.captured_token_rows().is_empty());
    rt.end_step(&cmd).unwrap();
}

/// DeepSeek V4's first layers: C4A layers (compressed 4:1, split rows) through HiSparse, the
/// sliding-window and compressor-state caches regular, each group with its own block size.
#[test]
fn slot_mapping_of_compressed_and_regular_groups() {
    let model = presets::DEEPSEEK_V4;
    let model = ModelSpec {
        layers: &model.layers[..8],
        ..model
    };
    let cfg = HiSparseConfig::new(model.top_k, 256 << 20);
    let mut input = LayoutInput::new(&model, &cfg, 0, 4096);
    input.num_gpu_blocks_override = Some(400);
    let kv = plan_layout(&input).unwrap();
    let mut coord = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: 2,
            max_batched_tokens: 1024,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap();
    let mut rcfg = RuntimeConfig::new(2, 2);
    rcfg.max_batched_tokens = 1024;
    let mut rt = Runtime::new(CpuDevice::new(), kv.clone(), rcfg).unwrap();
    coord.admit(1, &(0..700).collect::<Vec<u32>>()).unwrap();
    coord.admit(2, &(0..300).collect::<Vec<u32>>()).unwrap();
    let groups = rt.slot_mapping_groups();
    assert!(
        groups
            .iter()
            .any(|&g| kv.groups[g].kind == GroupKind::Indexer)
    );
    assert!(
        groups
            .iter()
            .any(|&g| kv.groups[g].kind == GroupKind::Regular)
    );
    let cap = 1024;
    let mut saw_regular = false;
    for _ in 0..4 {
        let cmd = coord.step().unwrap();
        rt.begin_step(&cmd).unwrap();
        let mut slots = vec![0i32; groups.len() * cap];
        rt.device()
            .download_i32(rt.slot_mapping(), 0, &mut slots)
            .unwrap();
        let mut t = 0;
        for s in &cmd.scheduled {
            for pos in s.first_token..s.first_token + s.num_tokens {
                for (w, &g) in groups.iter().enumerate() {
                    let got = slots[w * cap + t];
                    let view = kv.layer_view(g, 0).unwrap();
                    let mut table = vec![0i32; kv.table_width(g) as usize];
                    coord.block_table_row(s.id, g, &mut table).unwrap();
                    let want = view.token_row(&table, pos).map_or(-1, |r| r as i32);
                    assert_eq!(got, want, "request {} position {pos} group {g}", s.id);
                    let compressed = view.tokens_per_row > 1;
                    let windowed = kv.groups[g].sliding_window.is_some();
                    if compressed && (pos + 1) % view.tokens_per_row != 0 {
                        assert_eq!(got, -1, "a compressed group between its rows");
                    } else if !windowed {
                        assert!(got >= 0, "request {} position {pos} group {g}", s.id);
                        saw_regular |= kv.groups[g].kind == GroupKind::Regular;
                    }
                }
                t += 1;
            }
        }
        assert_eq!(rt.step_tokens() as usize, t);
        rt.end_step(&cmd).unwrap();
        rt.poll_and_report(&mut coord).unwrap();
    }
    assert!(saw_regular);
}
