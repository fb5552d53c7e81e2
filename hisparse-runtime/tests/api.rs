//! The runtime's contract at its edges: engine-owned pools give the same results as owned ones,
//! calls out of sequence or beyond the configuration are typed errors, budgets are checked before
//! anything is allocated, and counters can be turned off.

use hisparse_backend_cpu::CpuDevice;
use hisparse_core::coordinator::{OffloadCommand, ScheduledRequest};
use hisparse_core::{Device, Error, ErrorKind};
use hisparse_runtime::{Indices, Pools, Runtime, RuntimeConfig, RuntimeError, TopK};

mod scenario;

use hisparse_core::config::HiSparseConfig;
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec};

/// Layer 0 leads layer 1; layer 2 leads itself.
fn follower_layout() -> KvCacheConfig {
    static LAYERS: [LayerSpec; 3] = [
        LayerSpec::sparse_leader(32, 16),
        LayerSpec::sparse_follower(32),
        LayerSpec::sparse_leader(32, 16),
    ];
    let model = ModelSpec {
        name: "followers",
        block_tokens: 8,
        top_k: 8,
        layers: &LAYERS,
    };
    let mut cfg = HiSparseConfig::new(8, 3 * 8 * 32 * 200);
    cfg.device_buffer_size = Some(16);
    let mut input = LayoutInput::new(&model, &cfg, 0, 128);
    input.num_gpu_blocks_override = Some(40);
    plan_layout(&input).unwrap()
}

use scenario::{SMALL, drive, layout, same};

#[test]
fn engine_owned_pools_give_the_same_results_as_owned_ones() {
    let kv = layout(&SMALL);
    let owned = drive(
        SMALL,
        Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap(),
    );
    let dev = CpuDevice::new();
    let pools = Pools {
        device: dev.alloc(kv.gpu_pool_bytes() as usize).unwrap(),
        host: dev.alloc_pinned(kv.host_pool_bytes() as usize).unwrap(),
    };
    let lent = drive(
        SMALL,
        Runtime::with_pools(dev, kv.clone(), RuntimeConfig::new(3, 3), pools, None).unwrap(),
    );
    assert!(owned.outputs.iter().flatten().any(|&r| r >= 0));
    // The pool is tight: pages were reclaimed and rows swapped in from host.
    let c = owned.counters;
    assert!(c.reclaimed_pages > 0 && c.hot_misses > 0, "{c:?}");
    same(&owned, &lent).unwrap();
}

fn kind<E: Error>(r: Result<impl Sized, RuntimeError<E>>) -> (ErrorKind, String) {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => (e.kind(), e.to_string()),
    }
}

#[test]
fn pools_smaller_than_the_layout_are_refused_with_the_size_needed() {
    let kv = layout(&SMALL);
    let dev = CpuDevice::new();
    let pools = Pools {
        device: dev.alloc(kv.gpu_pool_bytes() as usize - 1).unwrap(),
        host: dev.alloc_pinned(kv.host_pool_bytes() as usize).unwrap(),
    };
    let (k, msg) = kind(Runtime::with_pools(
        dev,
        kv.clone(),
        RuntimeConfig::new(3, 3),
        pools,
        None,
    ));
    assert_eq!(k, ErrorKind::InvalidArgument);
    assert!(msg.contains(&kv.gpu_pool_bytes().to_string()), "{msg}");
}

#[test]
fn a_layout_beyond_available_memory_fails_before_allocating() {
    // A GPU pool of ~2 TiB on the CPU backend, whose device memory is host RAM.
    let mut kv = layout(&SMALL);
    kv.num_gpu_blocks = u32::MAX / 2;
    kv.bytes_per_block = 1 << 10;
    let t = std::time::Instant::now();
    let (k, msg) = kind(Runtime::new(CpuDevice::new(), kv, RuntimeConfig::new(3, 3)));
    assert_eq!(k, ErrorKind::OutOfDeviceMemory, "{msg}");
    assert!(msg.contains("free"), "{msg}");
    assert!(
        t.elapsed().as_secs() < 2,
        "the check must come before any allocation"
    );
}

#[test]
fn calls_out_of_sequence_or_beyond_the_configuration_are_typed_errors() {
    let kv = follower_layout();
    let mut rt = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 2)).unwrap();
    let dev = CpuDevice::new();
    let topk = dev.alloc(4 * 8 * 4).unwrap();
    let mut rows = dev.alloc(4 * 8 * 4).unwrap();
    // One request, in state row 0, scheduled for one decode token.
    let cmd = OffloadCommand {
        step: 1,
        scheduled: vec![ScheduledRequest {
            id: 1,
            slot: 0,
            first_token: 0,
            num_tokens: 1,
            fully_resident: true,
        }],
        ..OffloadCommand::default()
    };
    let input = |n| TopK {
        positions: &topk,
        num_tokens: n,
        state_rows: None,
    };
    macro_rules! out {
        () => {
            Indices {
                rows: &mut rows,
                counts: None,
            }
        };
    }
    assert!(matches!(rt.end_step(&cmd), Err(RuntimeError::Sequence(_))));
    assert!(matches!(
        rt.resolve_index_group(0, &input(1), out!()),
        Err(RuntimeError::Sequence(_))
    ));
    assert!(matches!(rt.set_batch(&[0]), Err(RuntimeError::Sequence(_))));
    rt.begin_step(&cmd).unwrap();
    assert!(matches!(
        rt.begin_step(&cmd),
        Err(RuntimeError::Sequence(_))
    ));
    assert!(matches!(
        rt.set_batch(&[0, 1, 2]),
        Err(RuntimeError::TooManyTokens { tokens: 3, max: 2 })
    ));
    assert!(matches!(
        rt.set_batch(&[3]),
        Err(RuntimeError::StateRow { row: 3, rows: 3 })
    ));
    assert!(matches!(
        rt.resolve_index_group(0, &input(1), out!()),
        Err(RuntimeError::Sequence(_))
    ));
    // A state row no request scheduled in this step holds: refused, never resolved into rows
    // that read another request's (or nobody's) blocks.
    assert!(matches!(
        rt.set_batch(&[1]),
        Err(RuntimeError::NotScheduled { row: 1, step: 1 })
    ));
    rt.set_batch(&[0, -1]).unwrap();
    assert!(matches!(
        rt.resolve_index_group(9, &input(1), out!()),
        Err(RuntimeError::NoSuchGroup { value: 9, .. })
    ));
    assert!(matches!(
        rt.resolve_index_group(0, &input(3), out!()),
        Err(RuntimeError::TooManyTokens { .. })
    ));
    assert!(matches!(
        rt.apply_plan(0),
        Err(RuntimeError::NoSuchGroup { value: 0, .. })
    ));
    assert!(matches!(rt.apply_plan(1), Err(RuntimeError::Sequence(_))));
    rt.resolve_leader(0, &input(2), out!()).unwrap();
    rt.apply_plan(1).unwrap();
    let other = OffloadCommand {
        step: 2,
        ..OffloadCommand::default()
    };
    assert!(matches!(
        rt.end_step(&other),
        Err(RuntimeError::Sequence(_))
    ));
    rt.end_step(&cmd).unwrap();
    // A command naming a state row the runtime does not have.
    let mut bad = OffloadCommand {
        step: 2,
        ..OffloadCommand::default()
    };
    bad.started.push(7);
    assert!(matches!(
        rt.begin_step(&bad),
        Err(RuntimeError::StateRow { row: 7, rows: 3 })
    ));
    for (cfg, field) in [
        (RuntimeConfig::new(0, 1), "state_rows"),
        (RuntimeConfig::new(1, 0), "max_step_tokens"),
    ] {
        match Runtime::new(CpuDevice::new(), kv.clone(), cfg) {
            Err(RuntimeError::Config { field: f, .. }) => assert_eq!(f, field),
            _ => panic!("{field} 0 accepted"),
        }
    }
}

#[test]
fn counters_can_be_turned_off() {
    let kv = layout(&SMALL);
    let mut cfg = RuntimeConfig::new(3, 3);
    cfg.stats_every = 0;
    let off = drive(
        SMALL,
        Runtime::new(CpuDevice::new(), kv.clone(), cfg).unwrap(),
    );
    let on = drive(
        SMALL,
        Runtime::new(CpuDevice::new(), kv, RuntimeConfig::new(3, 3)).unwrap(),
    );
    // Same work, so the same outputs; only the decode counters (kept on the device and
    // brought to host by snapshots) differ.
    assert_eq!(off.outputs, on.outputs);
    let (off, on) = (off.counters, on.counters);
    assert!(
        on.sampled_steps > 0 && on.hot_hits + on.hot_misses > 0 && on.resolve_calls > 0,
        "{on:?}"
    );
    assert_eq!(
        (
            off.sampled_steps,
            off.hot_hits,
            off.hot_misses,
            off.resolve_calls,
            off.remap_calls
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(off.steps, on.steps);
}

#[test]
fn decode_counters_are_exact_whatever_the_snapshot_interval() {
    let kv = layout(&SMALL);
    let every = drive(
        SMALL,
        Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap(),
    );
    let mut cfg = RuntimeConfig::new(3, 3);
    cfg.stats_every = 7;
    let sparse = drive(SMALL, Runtime::new(CpuDevice::new(), kv, cfg).unwrap());
    let (a, b) = (every.counters, sparse.counters);
    assert!(a.sampled_steps > b.sampled_steps, "{a:?} {b:?}");
    let decode = |c: &hisparse_runtime::Counters| {
        (
            c.hot_hits,
            c.hot_misses,
            c.resident_reads,
            c.h2d_bytes,
            c.resolve_calls,
            c.remap_calls,
            c.prefill_remap_calls,
        )
    };
    assert_eq!(decode(&a), decode(&b));
    assert!(
        a.hot_misses > 0 && a.remap_calls + a.resolve_calls > 0,
        "{a:?}"
    );
}

#[test]
fn a_malformed_command_is_refused_whole_and_changes_nothing() {
    use hisparse_core::coordinator::TableUpdate;
    use hisparse_core::ops::BlockPair;
    let kv = layout(&SMALL);
    let mut rt = Runtime::new(CpuDevice::new(), kv.clone(), RuntimeConfig::new(3, 3)).unwrap();
    let good = TableUpdate {
        slot: 0,
        group: 2,
        page: 0,
        block: 5,
    };
    let mut cmds = Vec::new();
    // A valid update followed by one naming a page beyond the table.
    let mut c = OffloadCommand {
        step: 1,
        ..OffloadCommand::default()
    };
    c.residency = vec![
        good,
        TableUpdate {
            page: kv.max_pages_per_request,
            ..good
        },
    ];
    cmds.push(c.clone());
    c.residency = vec![good];
    c.gpu_cow = vec![BlockPair { src: 3, dst: 3 }];
    cmds.push(c.clone());
    c.gpu_cow.clear();
    c.new_host_blocks = vec![kv.host_num_blocks];
    cmds.push(c.clone());
    c.new_host_blocks.clear();
    c.residency = vec![TableUpdate { group: 999, ..good }];
    cmds.push(c);
    for cmd in &cmds {
        assert!(
            matches!(rt.begin_step(cmd), Err(RuntimeError::Command(_))),
            "{cmd:?} accepted"
        );
        assert_eq!(
            rt.resident_row(0, 0).unwrap()[0],
            0,
            "a refused command changed a table"
        );
        assert_eq!(rt.counters().table_writes, 0);
    }
    // The runtime is still usable: the valid part alone is accepted.
    let mut ok = cmds[0].clone();
    ok.residency.truncate(1);
    rt.begin_step(&ok).unwrap();
    assert_eq!(rt.resident_row(0, 0).unwrap()[0], 5);
    rt.end_step(&ok).unwrap();
}
