//! Instantiated CUDA graphs.

use std::sync::Arc;

use cudarc::driver::sys;

use super::Context;

/// An instantiated CUDA graph.
#[derive(Debug)]
pub(crate) struct Graph {
    pub(super) graph: sys::CUgraph,
    pub(super) exec: sys::CUgraphExec,
    pub(super) ctx: Arc<Context>,
}

// SAFETY: graph handles may be used from any thread (driver API is thread-safe).
unsafe impl Send for Graph {}
// SAFETY: as above; the handles are never mutated.
unsafe impl Sync for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.ctx.synchronize();
        // SAFETY: both were created in `Stream::end_capture` and are destroyed once, after
        // every replay completed.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}
