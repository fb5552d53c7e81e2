//! The decode path captured into a CUDA graph as an engine captures it (`harness = false`): the
//! scenario of `hisparse_conformance::scenarios::capture` with the engine side through the
//! raw driver API — `cuStreamBeginCapture` in global mode on the engine's stream (what
//! `torch.cuda.graph` does), `cuStreamEndCapture`, `cuGraphInstantiate`, `cuGraphLaunch` — and the
//! stream lent to the backend inside the capture ([`CudaDevice::lend_stream`]).
//!
//! Without a GPU the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use cudarc::driver::sys::{self, CUresult};
use hisparse_backend_cuda::{CudaDevice, CudaStream};
use hisparse_conformance::check::Check;
use hisparse_core::{Device, Error as _};

use hisparse_conformance::scenarios::{Res, capture};

fn ok(call: &str, code: CUresult) -> Res<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {code:?}"))
    }
}

/// The engine's side through the raw driver API.
struct Driver;

/// An instantiated graph and the graph it came from.
struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl capture::Engine<CudaDevice> for Driver {
    type Stream = sys::CUstream;
    type Graph = Graph;

    fn prepare(&mut self, dev: &CudaDevice) -> Res<()> {
        dev.prepare().map_err(|e| e.to_string())
    }

    fn stream(&mut self) -> Res<sys::CUstream> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is an out-pointer; the device's primary context is current (opened
        // before).
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(raw)
    }

    fn begin_global(&mut self, s: sys::CUstream) -> Res<()> {
        // SAFETY: `s` is a live stream created by `stream`.
        ok("cuStreamBeginCapture(global)", unsafe {
            sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        })
    }

    fn end(&mut self, s: sys::CUstream) -> Res<Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: `s` is capturing; `graph` is an out-pointer.
        ok("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(s, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just captured; `exec` is an out-pointer.
        ok("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        })?;
        Ok(Graph { graph, exec })
    }

    fn replay(&mut self, g: &Graph, s: sys::CUstream) -> Res<()> {
        // SAFETY: `g.exec` and `s` are live objects of this context.
        ok("cuGraphLaunch", unsafe { sys::cuGraphLaunch(g.exec, s) })?;
        // SAFETY: as above.
        ok("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        })
    }

    fn lend(&mut self, dev: &CudaDevice, s: sys::CUstream) -> Res<CudaStream> {
        // SAFETY: `s` is a live stream of this device's primary context that outlives the
        // lent stream (destroyed in `release`, after the scenario dropped it).
        unsafe { dev.lend_stream(s) }.map_err(|e| format!("{e} [{}]", e.kind()))
    }

    fn arena_lists(&mut self, dev: &CudaDevice) -> usize {
        dev.list_arena_use().0
    }

    fn release(&mut self, g: Graph, s: sys::CUstream) -> Res<()> {
        // SAFETY: the graph and the stream were created above and are destroyed once, after
        // the context finished every replay.
        unsafe {
            ok("cuCtxSynchronize", sys::cuCtxSynchronize())?;
            ok("cuGraphExecDestroy", sys::cuGraphExecDestroy(g.exec))?;
            ok("cuGraphDestroy", sys::cuGraphDestroy(g.graph))?;
            ok("cuStreamDestroy", sys::cuStreamDestroy_v2(s))
        }
    }
}

fn main() {
    let check = Check::one("decode_path_in_a_global_mode_graph");
    let dev = check.device(CudaDevice::open(0));
    println!("device: {}", dev.device_name());
    let result = capture::run(&dev, &mut Driver).map(|()| {
        let (lists, bytes) = dev.list_arena_use();
        println!("list arena: {lists} lists, {bytes} bytes");
    });
    check.finish(result)
}
