//! The resolver's miss plan executed: host rows gathered into device rows, for one or more
//! layers ([`gather_rows`]).

use super::{LayerPair, PageLayout, check_layers};
use crate::error::{OpError, OpName};
use crate::ops::{BufferLen, I32_BYTES, in_range, mul, need, nonzero};

/// Shape of a [`gather_rows`] call: a resolver miss plan of `T × K` entries applied to `layers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherDesc<'a> {
    /// Token rows `T` of the plan.
    pub num_tokens: u32,
    /// Plan entries per token row `K`.
    pub top_k: u32,
    /// Layers to gather (a leader and its followers share one plan).
    pub layers: &'a [LayerPair],
}

/// Buffers of a gather call.
#[derive(Debug)]
pub struct GatherArgs<'a, B: ?Sized, H: ?Sized, D: ?Sized = B> {
    /// `i32[T][K]` flat host rows (`-1` = zero-fill).
    pub plan_src: &'a B,
    /// `i32[T][K]` flat device rows.
    pub plan_dst: &'a B,
    /// `i32[T]` valid plan entries per token row (clamped to `0..=K`).
    pub plan_counts: &'a B,
    /// The host pool.
    pub host: &'a H,
    /// The device pool.
    pub device: &'a mut D,
}

impl GatherDesc<'_> {
    /// Checks the descriptor and buffer sizes.
    pub fn check<B: BufferLen + ?Sized, H: BufferLen + ?Sized, D: BufferLen + ?Sized>(
        &self,
        args: &GatherArgs<'_, B, H, D>,
    ) -> Result<(), OpError> {
        self.check_lens(
            args.plan_src.byte_len(),
            args.plan_dst.byte_len(),
            args.plan_counts.byte_len(),
            args.host.byte_len(),
            args.device.byte_len(),
        )
    }

    /// [`GatherDesc::check`] over the buffers' byte lengths: `plan_src`, `plan_dst`,
    /// `plan_counts`, the host pool and the device pool, in that order (for callers that check
    /// a gather before its plan buffers can be borrowed, as `swap_in::check` does).
    pub fn check_lens(
        &self,
        plan_src: u64,
        plan_dst: u64,
        plan_counts: u64,
        host: u64,
        device: u64,
    ) -> Result<(), OpError> {
        const OP: OpName = OpName::GatherRows;
        nonzero(OP, "top_k", self.top_k.into())?;
        // Plan counts are `i32`: a row cannot hold more entries than they count.
        in_range(OP, "top_k", self.top_k.into(), 1, i32::MAX as u64)?;
        let tk = mul(OP, "plan", self.num_tokens.into(), self.top_k.into())?;
        need(OP, "plan_src", plan_src, tk, I32_BYTES)?;
        need(OP, "plan_dst", plan_dst, tk, I32_BYTES)?;
        need(
            OP,
            "plan_counts",
            plan_counts,
            self.num_tokens.into(),
            I32_BYTES,
        )?;
        check_layers(OP, self.layers, host, device)
    }
}

pub(crate) fn copy_row(
    src_layout: &PageLayout,
    src_pos: Option<(u32, u32)>,
    src: &[u8],
    dst_layout: &PageLayout,
    (db, doff): (u32, u32),
    dst: &mut [u8],
) {
    let dparts = dst_layout.row_parts(db, doff);
    match src_pos {
        Some((sb, soff)) => {
            let sparts = src_layout.row_parts(sb, soff);
            for ((s, len), (d, _)) in sparts.into_iter().zip(dparts) {
                let (s, d, len) = (s as usize, d as usize, len as usize);
                dst[d..d + len].copy_from_slice(&src[s..s + len]);
            }
        }
        None => {
            for (d, len) in dparts {
                dst[d as usize..(d + len) as usize].fill(0);
            }
        }
    }
}

/// Reference gather: executes a miss plan for every layer. See the module docs for the rules.
pub fn gather_rows(
    desc: &GatherDesc<'_>,
    args: GatherArgs<'_, [i32], [u8], [u8]>,
) -> Result<(), OpError> {
    desc.check(&args)?;
    let k = desc.top_k as usize;
    for layer in desc.layers {
        for t in 0..desc.num_tokens as usize {
            let n = args.plan_counts[t].clamp(0, desc.top_k as i32) as usize;
            for j in 0..n {
                let Some(dst) = layer.device.locate(args.plan_dst[t * k + j].into()) else {
                    continue;
                };
                let src = layer.host.locate(args.plan_src[t * k + j].into());
                copy_row(&layer.host, src, args.host, &layer.device, dst, args.device);
            }
        }
    }
    Ok(())
}
