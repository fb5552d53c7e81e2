//! Whole-page copies: device → host backups and host → device restores ([`copy_pages`]), and
//! host → host copy-on-write ([`copy_host_pages`]).

use super::{LayerPair, PageLayout, check_layers};
use crate::error::{OpError, OpName};
use crate::ops::{BufferLen, nonzero};

/// A page or row copy direction between the pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Direction {
    /// Device pool → host pool (backup, row mirror).
    DeviceToHost,
    /// Host pool → device pool (restore).
    HostToDevice,
}

/// A source block and a destination block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockPair {
    /// Source block id (in the source pool of the copy's direction).
    pub src: u32,
    /// Destination block id.
    pub dst: u32,
}

/// Shape of a [`copy_pages`] call: whole pages of every listed layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopyDesc<'a> {
    /// Direction of every pair.
    pub direction: Direction,
    /// Layers copied for each pair (multi-layer backup in one call).
    pub layers: &'a [LayerPair],
}

fn src_dst(direction: Direction, l: &LayerPair) -> (&PageLayout, &PageLayout) {
    match direction {
        Direction::DeviceToHost => (&l.device, &l.host),
        Direction::HostToDevice => (&l.host, &l.device),
    }
}

pub(super) fn check_pair(
    op: OpName,
    list: &'static str,
    index: usize,
    src_blocks: u32,
    dst_blocks: u32,
    pair: BlockPair,
) -> Result<(), OpError> {
    for (field, value, limit) in [("src", pair.src, src_blocks), ("dst", pair.dst, dst_blocks)] {
        if value >= limit {
            return Err(OpError::ElementOutOfRange {
                op,
                list,
                index,
                field,
                value: value.into(),
                limit: limit.into(),
            });
        }
    }
    Ok(())
}

impl PageCopyDesc<'_> {
    /// Checks layouts, buffer sizes and every pair.
    pub fn check(
        &self,
        pairs: &[BlockPair],
        host_len: u64,
        device_len: u64,
    ) -> Result<(), OpError> {
        const OP: OpName = OpName::CopyPages;
        check_layers(OP, self.layers, host_len, device_len)?;
        for l in self.layers {
            let (s, d) = src_dst(self.direction, l);
            for (i, p) in pairs.iter().enumerate() {
                check_pair(OP, "pairs", i, s.num_blocks, d.num_blocks, *p)?;
            }
        }
        Ok(())
    }
}

/// Reference whole-page copy in `desc.direction`.
pub fn copy_pages(
    desc: &PageCopyDesc<'_>,
    pairs: &[BlockPair],
    host: &mut [u8],
    device: &mut [u8],
) -> Result<(), OpError> {
    desc.check(pairs, host.byte_len(), device.byte_len())?;
    for l in desc.layers {
        let len = l.host.page_bytes() as usize;
        for p in pairs {
            match desc.direction {
                Direction::DeviceToHost => {
                    let (s, d) = (
                        l.device.page_offset(p.src) as usize,
                        l.host.page_offset(p.dst) as usize,
                    );
                    host[d..d + len].copy_from_slice(&device[s..s + len]);
                }
                Direction::HostToDevice => {
                    let (s, d) = (
                        l.host.page_offset(p.src) as usize,
                        l.device.page_offset(p.dst) as usize,
                    );
                    device[d..d + len].copy_from_slice(&host[s..s + len]);
                }
            }
        }
    }
    Ok(())
}

/// Checks a host → host page copy: layouts against the host buffer and every pair.
pub fn check_host_page_copy(
    layers: &[PageLayout],
    pairs: &[BlockPair],
    host_len: u64,
) -> Result<(), OpError> {
    const OP: OpName = OpName::CopyPages;
    nonzero(OP, "layers", layers.len() as u64)?;
    for l in layers {
        l.check(OP, "host", host_len)?;
        for (i, p) in pairs.iter().enumerate() {
            check_pair(OP, "pairs", i, l.num_blocks, l.num_blocks, *p)?;
            if p.src == p.dst {
                return Err(OpError::ElementOutOfRange {
                    op: OP,
                    list: "pairs",
                    index: i,
                    field: "dst (equal to src)",
                    value: p.dst.into(),
                    limit: p.src.into(),
                });
            }
        }
    }
    Ok(())
}

/// Reference host → host page copy (copy-on-write). `src == dst` is rejected.
pub fn copy_host_pages(
    layers: &[PageLayout],
    pairs: &[BlockPair],
    host: &mut [u8],
) -> Result<(), OpError> {
    check_host_page_copy(layers, pairs, host.byte_len())?;
    for l in layers {
        let len = l.page_bytes() as usize;
        for p in pairs {
            let (s, d) = (l.page_offset(p.src) as usize, l.page_offset(p.dst) as usize);
            host.copy_within(s..s + len, d);
        }
    }
    Ok(())
}
