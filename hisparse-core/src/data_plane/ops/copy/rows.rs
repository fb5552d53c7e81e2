//! Row spans inside pages between the pools: row mirrors and partial restores
//! ([`copy_rows`]).

use super::pages::check_pair;
use super::{BlockPair, Direction, LayerPair, check_layers, copy_row};
use crate::error::{OpError, OpName};
use crate::ops::BufferLen;

/// A run of rows at the same offsets of a device page and a host page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RowSpan {
    /// Device block id.
    pub device_block: u32,
    /// Host block id.
    pub host_block: u32,
    /// First row of the span within the page.
    pub first_row: u32,
    /// Rows in the span (0 is a no-op).
    pub num_rows: u32,
}

/// Shape of a [`copy_rows`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowCopyDesc<'a> {
    /// Direction of every span.
    pub direction: Direction,
    /// Layers copied for each span.
    pub layers: &'a [LayerPair],
}

impl RowCopyDesc<'_> {
    /// Checks layouts, buffer sizes and every span.
    pub fn check(&self, spans: &[RowSpan], host_len: u64, device_len: u64) -> Result<(), OpError> {
        const OP: OpName = OpName::CopyRows;
        check_layers(OP, self.layers, host_len, device_len)?;
        for l in self.layers {
            for (index, s) in spans.iter().enumerate() {
                let pair = BlockPair {
                    src: s.device_block,
                    dst: s.host_block,
                };
                check_pair(
                    OP,
                    "spans",
                    index,
                    l.device.num_blocks,
                    l.host.num_blocks,
                    pair,
                )?;
                let end = u64::from(s.first_row) + u64::from(s.num_rows);
                if end > u64::from(l.host.block_size) {
                    return Err(OpError::ElementOutOfRange {
                        op: OP,
                        list: "spans",
                        index,
                        field: "first_row + num_rows",
                        value: end,
                        limit: u64::from(l.host.block_size) + 1,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Reference row-span copy in `desc.direction` (contiguous or split rows).
pub fn copy_rows(
    desc: &RowCopyDesc<'_>,
    spans: &[RowSpan],
    host: &mut [u8],
    device: &mut [u8],
) -> Result<(), OpError> {
    desc.check(spans, host.byte_len(), device.byte_len())?;
    for l in desc.layers {
        for s in spans {
            for r in s.first_row..s.first_row + s.num_rows {
                let (hpos, dpos) = ((s.host_block, r), (s.device_block, r));
                match desc.direction {
                    Direction::DeviceToHost => {
                        copy_row(&l.device, Some(dpos), device, &l.host, hpos, host)
                    }
                    Direction::HostToDevice => {
                        copy_row(&l.host, Some(hpos), host, &l.device, dpos, device)
                    }
                }
            }
        }
    }
    Ok(())
}
