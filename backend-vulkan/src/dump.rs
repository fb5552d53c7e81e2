//! A diagnostic: the resolver's inputs at chosen calls, written to files
//! ([`VulkanOptions::dump_resolve`](crate::VulkanOptions)), so a run's resolve can be timed again
//! in isolation (the kernel lab's `resolve_replay`) with exactly the state the run had.
//!
//! File format (little-endian): nine `u32` — `num_tokens`, `top_k`, `num_requests`,
//! `max_pages`, `block_size`, `hot_slots`, `attention_block_stride`, `host_num_blocks`,
//! `hot_table_width` — then the bytes of `req_id` (`i32[T]`), `topk` (`i32[T·K]`),
//! `resident_table` and `host_table` (`i32[R·M]` each), `slot_host_rows` (`i32[R·N]`), `lru` (`u16[R·N]`)
//! and `hot_table` (`i32[R·W]`), in that order.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use hisparse_core::Device;
use hisparse_core::ops::{ResolveArgs, ResolveDesc};

use crate::{ResolveDumpSpec, Result, VulkanBuffer, VulkanDevice, VulkanError};

/// Which resolve calls to dump, and where.
#[derive(Debug, Default)]
pub(crate) struct ResolveDump {
    calls: Vec<u64>,
    dir: PathBuf,
    seen: AtomicU64,
}

impl ResolveDump {
    /// The dump `spec` asks for.
    pub(crate) fn new(spec: &ResolveDumpSpec) -> ResolveDump {
        ResolveDump {
            calls: spec.calls.clone(),
            dir: spec.dir.clone(),
            seen: AtomicU64::new(0),
        }
    }

    /// Counts one resolve call; writes its inputs when it is one of the chosen calls.
    pub(crate) fn on_resolve(
        &self,
        dev: &VulkanDevice,
        stream: &crate::VulkanStream,
        desc: &ResolveDesc,
        args: &ResolveArgs<'_, VulkanBuffer>,
    ) -> Result<()> {
        let call = self.seen.fetch_add(1, Ordering::Relaxed);
        if !self.calls.contains(&call) {
            return Ok(());
        }
        dev.synchronize(stream)?;
        let mut out = Vec::new();
        for v in [
            desc.num_tokens,
            desc.top_k,
            desc.num_requests,
            desc.max_pages,
            desc.block_size,
            desc.hot_slots,
            desc.attention_block_stride,
            desc.host_num_blocks,
            desc.hot_table_width(),
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let (t, k) = (desc.num_tokens as usize, desc.top_k as usize);
        let (r, m) = (desc.num_requests as usize, desc.max_pages as usize);
        let (n, w) = (desc.hot_slots as usize, desc.hot_table_width() as usize);
        let parts: [(&VulkanBuffer, usize); 7] = [
            (args.req_id, 4 * t),
            (args.topk, 4 * t * k),
            (args.resident_table, 4 * r * m),
            (args.host_table, 4 * r * m),
            (&*args.slot_host_rows, 4 * r * n),
            (&*args.lru, 2 * r * n),
            (args.hot_table, 4 * r * w),
        ];
        for (buffer, bytes) in parts {
            let mut v = vec![0u8; bytes];
            dev.download(buffer, 0, &mut v)?;
            out.extend_from_slice(&v);
        }
        let path = self.dir.join(format!("resolve-{call}.bin"));
        std::fs::write(&path, out).map_err(|e| {
            VulkanError::InvalidArgument(format!("dump-resolve: writing {}: {e}", path.display()))
        })
    }
}
