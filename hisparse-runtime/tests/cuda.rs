//! The runtime on a real NVIDIA GPU (`--features cuda`):
//!
//! * the engine allocates the device pool, the host pool and the stream itself through the driver
//!   API, as PyTorch would (`cuMemAlloc`, page-aligned host memory the backend registers,
//!   `cuStreamCreate`), hands them to [`Runtime::with_pools`], and the whole scenario's row
//!   indices, pools and counters equal those of a runtime that owns everything;
//! * one decode step's decode path — every index group's resolve and swap-in gather for 64
//!   requests — is captured in one CUDA graph on the engine's stream and replayed in that and
//!   later steps; every row index and both pools equal those of a runtime calling eagerly.
//!
//! `harness = false`, so what it prints is seen: without a GPU each test prints `SKIPPED` and
//! passes, unless `HISPARSE_REQUIRE_DEVICE=1`, which makes a missing device a failure.

mod scenario;

use std::alloc::Layout;

use cudarc::driver::sys::{self, CUresult};
use hisparse_backend_cuda::CudaDevice;
use hisparse_core::{Device, Error as _, ErrorKind};
use hisparse_runtime::{Indices, Pools, Runtime, TopK};
use scenario::{Outcome, Run, Shape, drive, finish, layout, same, tight};

fn open(test: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if std::env::var("HISPARSE_REQUIRE_DEVICE").is_ok_and(|v| v.trim() == "1") {
                panic!("{test}: HISPARSE_REQUIRE_DEVICE=1 but no CUDA device: {e}");
            }
            eprintln!("SKIPPED {test}: no CUDA device ({e})");
            None
        }
        Err(e) => panic!("{test}: opening CUDA device 0 failed: {e}"),
    }
}

fn ok(call: &str, code: CUresult) {
    assert_eq!(code, CUresult::CUDA_SUCCESS, "{call}");
}

/// Four 656-byte layers, 16 requests of 1K tokens (pool: [`scenario::tight`]).
const LENT: Shape = Shape {
    layers: 4,
    row_bytes: 656,
    block: 64,
    top_k: 256,
    hot: 512,
    requests: 16,
    prompt: 1024,
    decode: 24,
    gpu_blocks: 0,
    together: false,
};

/// The engine's own hold on device 0's primary context (the CUDA runtime, and so PyTorch, keeps
/// one): its memory and streams stay valid after the backend's device, which holds another,
/// is dropped.
struct PrimaryContext {
    device: sys::CUdevice,
}

impl PrimaryContext {
    fn retain() -> PrimaryContext {
        let (mut device, mut ctx) = (0, std::ptr::null_mut());
        // SAFETY: out-pointers; ordinal 0 exists (the backend opened it).
        ok("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, 0) });
        // SAFETY: as above.
        ok("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        });
        // SAFETY: `ctx` was just retained.
        ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) });
        PrimaryContext { device }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases the retain of `retain`, after everything allocated in it was freed.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// Memory and a stream the engine allocated through the driver; freed by the engine.
struct Engine {
    device: sys::CUdeviceptr,
    host: *mut u8,
    host_layout: Layout,
    stream: sys::CUstream,
}

impl Engine {
    fn new(device_bytes: usize, host_bytes: usize) -> Engine {
        let mut device = 0;
        // SAFETY: out-pointer; the device's primary context is current (CudaDevice::open bound
        // it on this thread, as PyTorch's runtime calls do).
        ok("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut device, device_bytes)
        });
        // SAFETY: `device` addresses `device_bytes` bytes just allocated.
        ok("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(device, 0, device_bytes)
        });
        // Plain, unpinned, page-aligned host memory: the backend registers it.
        let host_layout = Layout::from_size_align(host_bytes, 4096).unwrap();
        // SAFETY: a non-zero size.
        let host = unsafe { std::alloc::alloc_zeroed(host_layout) };
        assert!(!host.is_null());
        let mut stream = std::ptr::null_mut();
        // SAFETY: out-pointer; flags are a valid CUstream_flags value.
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        });
        Engine {
            device,
            host,
            host_layout,
            stream,
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: the runtime and the buffers and stream lent to it are gone (dropped before the
        // engine); these are the engine's own allocations.
        unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamDestroy_v2(self.stream);
            sys::cuMemFree_v2(self.device);
            std::alloc::dealloc(self.host, self.host_layout);
        }
    }
}

fn engine_allocated_pools_and_stream_give_the_owning_path_s_results() -> bool {
    let name = "engine_allocated_pools_and_stream_give_the_owning_path_s_results";
    let Some(dev) = open(name) else {
        return false;
    };
    let shape = tight(LENT);
    let kv = layout(&shape);
    let cfg = scenario::runtime_config(LENT.requests);
    let owned = drive(shape, Runtime::new(dev, kv.clone(), cfg).unwrap());
    eprintln!("  the owning runtime finished");
    let c = owned.counters;
    assert!(c.reclaimed_pages > 0 && c.hot_misses > 0, "{c:?}");

    let dev = CudaDevice::open(0).unwrap();
    let context = PrimaryContext::retain();
    let engine = Engine::new(kv.gpu_pool_bytes() as usize, kv.host_pool_bytes() as usize);
    // SAFETY: the engine's allocations outlive the runtime (dropped at the end of `drive`),
    // are at least the layout's sizes, page-aligned, on device 0's primary context.
    let (pools, stream) = unsafe {
        (
            Pools {
                device: dev
                    .lend_device_memory(engine.device, kv.gpu_pool_bytes() as usize)
                    .unwrap(),
                host: dev
                    .lend_host_memory(engine.host, kv.host_pool_bytes() as usize)
                    .unwrap(),
            },
            dev.lend_stream(engine.stream).unwrap(),
        )
    };
    eprintln!("  engine pools and stream lent");
    let lent = drive(
        shape,
        Runtime::with_pools(dev, kv, cfg, pools, Some(stream)).unwrap(),
    );
    same(&owned, &lent).unwrap();
    drop(engine);
    drop(context);
    true
}

/// The graph test's shape: 64 decode requests of 8K tokens over 8 layers of DeepSeek V3.2
/// geometry, top-k 2048 (pool: [`scenario::tight`]).
const GRAPH: Shape = Shape {
    layers: 8,
    row_bytes: 656,
    block: 64,
    top_k: 2048,
    hot: 2048,
    requests: 64,
    prompt: 8192,
    decode: 8,
    gpu_blocks: 0,
    together: true,
};

/// Per index group: the engine's top-k input and row output (stable addresses a graph bakes in).
struct GroupIo {
    topk: hisparse_backend_cuda::CudaBuffer,
    rows: hisparse_backend_cuda::CudaBuffer,
}

fn group_io(dev: &CudaDevice, groups: usize) -> Vec<GroupIo> {
    let n = GRAPH.requests as usize * GRAPH.top_k as usize * 4;
    (0..groups)
        .map(|_| GroupIo {
            topk: dev.alloc(n).unwrap(),
            rows: dev.alloc(n).unwrap(),
        })
        .collect()
}

/// One step of `run` on `rt`: the per-group calls eager, or through `graph` (captured on the
/// engine's raw stream `capture_on` at the first decode step of 64 requests after `warm` such
/// steps, replayed while the batch keeps 64 requests). Returns whether the graph ran.
#[allow(clippy::too_many_arguments)]
fn step(
    run: &mut Run<CudaDevice>,
    rt: &mut Runtime<CudaDevice>,
    io: &mut [GroupIo],
    capture_on: Option<sys::CUstream>,
    graph: &mut Option<sys::CUgraphExec>,
    decode_steps: &mut u32,
) -> bool {
    let (cmd, batch) = run.begin(rt);
    let t = batch.len() as u32;
    let groups = run.kv.index_groups.len();
    for (g, gio) in io.iter_mut().enumerate() {
        let sel = run.topk_of(&cmd, g);
        rt.device().upload_i32(&mut gio.topk, 0, &sel).unwrap();
    }
    let decode = t == GRAPH.requests && cmd.scheduled.iter().all(|s| s.num_tokens == 1);
    if decode {
        *decode_steps += 1;
    }
    let mut replayed = false;
    let resolve_all = |rt: &mut Runtime<CudaDevice>, io: &mut [GroupIo]| {
        for (g, gio) in io.iter_mut().enumerate() {
            let input = TopK {
                positions: &gio.topk,
                num_tokens: t,
                state_rows: None,
            };
            let out = Indices {
                rows: &mut gio.rows,
                counts: None,
            };
            rt.resolve_index_group(g, &input, out).unwrap();
        }
    };
    match capture_on {
        Some(raw) if decode && (*decode_steps >= 3 || graph.is_some()) => {
            if graph.is_none() {
                let mut g: sys::CUgraph = std::ptr::null_mut();
                // SAFETY: `raw` is the runtime's compute stream (the engine's), idle on the
                // host side; thread-local capture refuses any host synchronisation inside.
                ok("cuStreamBeginCapture", unsafe {
                    sys::cuStreamBeginCapture_v2(
                        raw,
                        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                    )
                });
                resolve_all(rt, io);
                // SAFETY: ends the capture begun above.
                ok("cuStreamEndCapture", unsafe {
                    sys::cuStreamEndCapture(raw, &mut g)
                });
                let mut exec: sys::CUgraphExec = std::ptr::null_mut();
                // SAFETY: `g` is the captured graph.
                ok("cuGraphInstantiate", unsafe {
                    sys::cuGraphInstantiateWithFlags(&mut exec, g, 0)
                });
                // SAFETY: the executable graph holds what it needs of `g`.
                unsafe { sys::cuGraphDestroy(g) };
                *graph = Some(exec);
            }
            // SAFETY: a live executable graph on its own stream.
            ok("cuGraphLaunch", unsafe {
                sys::cuGraphLaunch(graph.expect("captured above"), raw)
            });
            replayed = true;
        }
        _ => resolve_all(rt, io),
    }
    rt.device().synchronize(rt.compute_stream()).unwrap();
    for gio in io.iter() {
        let mut out = vec![0; (t * GRAPH.top_k) as usize];
        rt.device().download_i32(&gio.rows, 0, &mut out).unwrap();
        run.outputs.push(out);
    }
    assert_eq!(groups, io.len());
    run.end(rt, &cmd);
    replayed
}

fn a_decode_step_captured_in_one_cuda_graph_replays_identically() -> bool {
    let name = "a_decode_step_captured_in_one_cuda_graph_replays_identically";
    let Some(dev) = open(name) else {
        return false;
    };
    let shape = tight(GRAPH);
    let kv = layout(&shape);
    let cfg = scenario::runtime_config(GRAPH.requests);
    let groups = kv.index_groups.len();

    // Eager.
    let mut io = group_io(&dev, groups);
    let mut rt = Runtime::new(dev, kv.clone(), cfg).unwrap();
    let mut run = Run::new(shape, rt.device());
    let (mut none, mut steps) = (None, 0);
    while !run.done() {
        step(&mut run, &mut rt, &mut io, None, &mut none, &mut steps);
    }
    let eager: Outcome = finish(run, rt);
    eprintln!("  the eager runtime finished");
    let c = eager.counters;
    assert!(c.hot_misses > 0 && c.resolve_calls > 0, "{c:?}");

    // Graph: the runtime enqueues on the engine's stream, which the test captures.
    let dev = CudaDevice::open(0).unwrap();
    let context = PrimaryContext::retain();
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: out-pointer; valid flags; the primary context is current.
    ok("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    });
    // SAFETY: `raw` outlives the runtime (destroyed at the end of the test).
    let stream = unsafe { dev.lend_stream(raw) }.unwrap();
    let mut io = group_io(&dev, groups);
    let pools = Pools {
        device: dev.alloc(kv.gpu_pool_bytes() as usize).unwrap(),
        host: dev.alloc_pinned(kv.host_pool_bytes() as usize).unwrap(),
    };
    let mut rt = Runtime::with_pools(dev, kv, cfg, pools, Some(stream)).unwrap();
    let mut run = Run::new(shape, rt.device());
    let (mut graph, mut steps, mut replays) = (None, 0, 0);
    while !run.done() {
        if step(
            &mut run,
            &mut rt,
            &mut io,
            Some(raw),
            &mut graph,
            &mut steps,
        ) {
            replays += 1;
        }
    }
    let replayed = finish(run, rt);
    assert!(
        replays >= 3,
        "the graph replayed {replays} times; expected several decode steps"
    );
    eprintln!(
        "{name}: one graph of {groups} resolves + gathers replayed in {replays} decode steps"
    );
    // The decode counters are counted on the device, so replayed calls count: equal to the eager
    // run's, but for the path (a captured call always resolves; an eager one remaps when every
    // request is fully resident).
    let (mut a, b) = (eager, replayed);
    let decode = |c: &hisparse_runtime::Counters| {
        (
            c.hot_hits,
            c.hot_misses,
            c.resident_reads,
            c.h2d_bytes,
            c.remap_calls + c.resolve_calls,
        )
    };
    assert_eq!(decode(&a.counters), decode(&b.counters));
    a.counters = b.counters;
    same(&a, &b).unwrap();
    // SAFETY: the graph and the stream are ours; nothing runs on them any more.
    unsafe {
        if let Some(g) = graph {
            sys::cuGraphExecDestroy(g);
        }
        sys::cuStreamDestroy_v2(raw);
    }
    drop(context);
    true
}

/// A test: its name, and its body (which returns whether it ran rather than skipped).
type Test = (&'static str, fn() -> bool);

fn main() {
    let tests: [Test; 2] = [
        (
            "engine_allocated_pools_and_stream_give_the_owning_path_s_results",
            engine_allocated_pools_and_stream_give_the_owning_path_s_results,
        ),
        (
            "a_decode_step_captured_in_one_cuda_graph_replays_identically",
            a_decode_step_captured_in_one_cuda_graph_replays_identically,
        ),
    ];
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let t = std::time::Instant::now();
        eprintln!("run  {name}");
        if test() {
            println!("ok   {name} ({:.1} s)", t.elapsed().as_secs_f64());
        }
    }
}
