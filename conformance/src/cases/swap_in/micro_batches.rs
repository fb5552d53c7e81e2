//! The step's swap-in issued as two micro-batches, the way an engine hides the misses' transfer
//! behind other work: the step's requests are split in two (every row of a request in the same
//! part, padding rows in either), and each part is one `Device::resolve_and_gather` call on
//! its own stream, with its own inputs and outputs, the two calls **not ordered** against each
//! other. Requests never share state, so each part must write exactly the reference's outputs
//! for its rows (the reference's rows picked out, in the part's order), and together they must
//! leave the reference's hot state and device pool; a call adds one call to its stats slot, so
//! the stats words are the reference's with one more call per step that had stats.

use hisparse_core::Device;
use hisparse_core::ops::stats::{STATS_CALLS, STATS_SLOT_WORDS};

use super::World;
use crate::CaseResult;
use crate::cases::resolve_io::{DevOutputs, DevState, HostState, Outputs};
use crate::util::{Ctx, dev_bytes, dev_i32, read_bytes, same};

/// The micro-batch path's own tables, hot state and device pool.
pub(super) struct MicroBatches<D: Device> {
    state: DevState<D>,
    pool: D::Buffer,
    /// Calls beyond the reference's, per stats slot (the second part of each step with stats).
    extra_calls: Vec<u32>,
}

/// Which part token row `t`, of state row `id`, goes to: a request's rows all to the part of
/// its parity, a padding row by its own index's.
fn part_of(t: usize, id: i32, requests: u32) -> usize {
    match u32::try_from(id) {
        Ok(r) if r < requests => (r % 2) as usize,
        _ => t % 2,
    }
}

impl<D: Device> MicroBatches<D> {
    pub(super) fn new(dev: &D, w: &World) -> Result<Self, crate::CaseError> {
        Ok(MicroBatches {
            state: DevState::upload(dev, &w.h)?,
            pool: dev_bytes(dev, &w.device_pool)?,
            extra_calls: Vec::new(),
        })
    }

    /// Runs one step as two unordered micro-batch calls and compares what they left with the
    /// reference's single call: `want` (its outputs) and `w` (the hot state and device pool
    /// after it).
    pub(super) fn step(
        &mut self,
        dev: &D,
        host_pool: &D::HostBuffer,
        w: &World,
        (req_id, topk, slot): (&[i32], &[i32], Option<u32>),
        want: &Outputs,
    ) -> CaseResult {
        const LABEL: &str = "two micro-batches on two streams: ";
        let k = w.desc.top_k as usize;
        let parts: [Vec<usize>; 2] = [0, 1].map(|p| {
            (0..req_id.len())
                .filter(|&t| part_of(t, req_id[t], w.desc.num_requests) == p)
                .collect()
        });
        // A step without stats: the buffer is parked (and compared below, unchanged).
        let parked = if slot.is_none() {
            self.state.stats.take()
        } else {
            None
        };
        let streams = [
            dev.create_stream().ctx("create_stream")?,
            dev.create_stream().ctx("create_stream")?,
        ];
        // Every part's inputs and outputs live until both streams are synchronised.
        let mut calls = Vec::new();
        for (rows, stream) in parts.iter().zip(&streams) {
            let ids: Vec<i32> = rows.iter().map(|&t| req_id[t]).collect();
            let top: Vec<i32> = rows
                .iter()
                .flat_map(|&t| topk[t * k..][..k].iter().copied())
                .collect();
            let d_req = dev_i32(dev, &ids)?;
            let d_topk = dev_i32(dev, &top)?;
            let mut out = DevOutputs::upload(dev, &Outputs::sentinels(rows.len(), k))?;
            let desc = w.call_desc(rows.len(), slot);
            dev.resolve_and_gather(
                stream,
                &desc,
                self.state.args(&d_req, &d_topk, &mut out),
                &w.layers,
                host_pool,
                &mut self.pool,
            )
            .ctx("resolve_and_gather of a micro-batch")?;
            calls.push((d_req, d_topk, out));
        }
        for stream in &streams {
            dev.synchronize(stream).ctx("synchronize")?;
        }
        if parked.is_some() {
            self.state.stats = parked;
        }
        if let Some(s) = slot {
            let s = s as usize;
            if self.extra_calls.len() <= s {
                self.extra_calls.resize(s + 1, 0);
            }
            self.extra_calls[s] += 1;
        }
        for (p, (rows, (_, _, out))) in parts.iter().zip(&calls).enumerate() {
            out.read(dev, rows.len(), k)?.expect(
                &format!("{LABEL}part {p} ({} token rows): ", rows.len()),
                &want.rows(rows, k),
            )?;
        }
        let mut expected: HostState = w.h.clone();
        if let Some(words) = expected.stats.as_mut() {
            for (s, &n) in self.extra_calls.iter().enumerate() {
                let at = s * STATS_SLOT_WORDS as usize + STATS_CALLS;
                words[at] = (words[at] as u32).wrapping_add(n) as i32;
            }
        }
        self.state.expect_hot_state(dev, LABEL, &expected)?;
        let pool_len = w.device_pool.len();
        same(
            &format!("{LABEL}device pool"),
            &read_bytes(dev, &self.pool, pool_len)?,
            &w.device_pool,
        )
    }
}
