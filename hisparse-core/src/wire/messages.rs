//! The payloads of the two messages: [`OffloadCommand`] and [`WorkerReport`], every field in
//! declaration order (the table in the module docs).
//!
//! Every struct is destructured without `..`, on both sides: a field added to any of them does
//! not compile until the format carries it.

use alloc::vec::Vec;

use super::frame::{Decoder, Encoder, WireValue, list_bytes, open};
use super::{MessageKind, WireError};
use crate::coordinator::{
    HotAssignment, OffloadCommand, PageTransfer, PoolKind, RefusalReason, RefusedRequest,
    RowMirror, ScheduledRequest, TableUpdate, WorkerReport,
};
use crate::layout::LayoutFingerprint;
use crate::ops::{BlockPair, RowSpan};

impl WireValue for ScheduledRequest {
    const MIN_BYTES: u64 = 21;
    fn put(&self, e: &mut Encoder<'_>) {
        let ScheduledRequest {
            id,
            slot,
            first_token,
            num_tokens,
            fully_resident,
        } = *self;
        e.put_u64(id);
        e.put_u32s([slot, first_token, num_tokens]);
        e.put_flag(fully_resident);
    }
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
        let id = d.u64(field)?;
        let [slot, first_token, num_tokens] = d.u32s(field)?;
        Ok(ScheduledRequest {
            id,
            slot,
            first_token,
            num_tokens,
            fully_resident: d.flag(field)?,
        })
    }
}

impl WireValue for RefusedRequest {
    // The id and the tag of a reason without fields.
    const MIN_BYTES: u64 = 9;
    fn put(&self, e: &mut Encoder<'_>) {
        let RefusedRequest { id, reason } = *self;
        e.put_u64(id);
        // A tag byte, then the variant's fields.
        match reason {
            RefusalReason::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
            } => {
                e.put_u8(0);
                e.put_u32(context_tokens);
                e.put_u64(needed);
                e.put_u64(capacity);
            }
            RefusalReason::NeverFits {
                pool,
                needed,
                capacity,
            } => {
                e.put_u8(1);
                e.put_u8(match pool {
                    PoolKind::Gpu => 0,
                    PoolKind::Host => 1,
                });
                e.put_u64(needed);
                e.put_u64(capacity);
            }
            RefusalReason::OutOfMemory { bytes } => {
                e.put_u8(2);
                e.put_u64(bytes);
            }
            RefusalReason::Internal => e.put_u8(3),
        }
    }
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
        let id = d.u64(field)?;
        let reason = match d.u8(field)? {
            0 => RefusalReason::PrefillNeverFits {
                context_tokens: d.u32(field)?,
                needed: d.u64(field)?,
                capacity: d.u64(field)?,
            },
            1 => RefusalReason::NeverFits {
                pool: match d.u8(field)? {
                    0 => PoolKind::Gpu,
                    1 => PoolKind::Host,
                    _ => return Err(d.malformed(field, "a pool other than 0 (GPU) or 1 (host)")),
                },
                needed: d.u64(field)?,
                capacity: d.u64(field)?,
            },
            2 => RefusalReason::OutOfMemory {
                bytes: d.u64(field)?,
            },
            3 => RefusalReason::Internal,
            _ => {
                return Err(d.malformed(
                    field,
                    "a refusal reason this format version does not define",
                ));
            }
        };
        Ok(RefusedRequest { id, reason })
    }
}

/// [`WireValue`] for records of `u32` fields, written in field order (4 bytes each): the
/// encoding of every such record, stated once.
macro_rules! u32_records {
    ($($ty:ident { $($field:ident),+ $(,)? })+) => {$(
        impl WireValue for $ty {
            const MIN_BYTES: u64 = 4 * [$(stringify!($field)),+].len() as u64;
            fn put(&self, e: &mut Encoder<'_>) {
                let $ty { $($field),+ } = *self;
                e.put_u32s([$($field),+]);
            }
            fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
                let [$($field),+] = d.u32s(field)?;
                Ok($ty { $($field),+ })
            }
        }
    )+};
}

u32_records! {
    TableUpdate { slot, group, page, block }
    BlockPair { src, dst }
    PageTransfer { bucket, device_block, host_block }
    RowSpan { device_block, host_block, first_row, num_rows }
}

impl WireValue for HotAssignment {
    // Slot, group and an empty block list.
    const MIN_BYTES: u64 = 16;
    fn put(&self, e: &mut Encoder<'_>) {
        let HotAssignment {
            slot,
            group,
            blocks,
        } = self;
        e.put_u32s([*slot, *group]);
        e.put_list(blocks);
    }
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
        let [slot, group] = d.u32s(field)?;
        Ok(HotAssignment {
            slot,
            group,
            blocks: d.list(field)?,
        })
    }
}

impl WireValue for RowMirror {
    const MIN_BYTES: u64 = 20;
    fn put(&self, e: &mut Encoder<'_>) {
        let RowMirror {
            bucket,
            span:
                RowSpan {
                    device_block,
                    host_block,
                    first_row,
                    num_rows,
                },
        } = *self;
        e.put_u32s([bucket, device_block, host_block, first_row, num_rows]);
    }
    fn take(d: &mut Decoder<'_>, field: &'static str) -> Result<Self, WireError> {
        let [bucket, device_block, host_block, first_row, num_rows] = d.u32s(field)?;
        Ok(RowMirror {
            bucket,
            span: RowSpan {
                device_block,
                host_block,
                first_row,
                num_rows,
            },
        })
    }
}

impl OffloadCommand {
    /// The command as one wire message for the layout `fingerprint` (see [`crate::wire`]).
    pub fn to_bytes(&self, fingerprint: LayoutFingerprint) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(fingerprint, &mut out);
        out
    }

    /// Appends the command's wire message to `out` (clear it first to reuse its memory for one
    /// message per step).
    pub fn encode_into(&self, fingerprint: LayoutFingerprint, out: &mut Vec<u8>) {
        let OffloadCommand {
            step,
            transfer_id,
            scheduled,
            preempted,
            refused,
            started,
            fully_resident,
            residency,
            host_blocks,
            block_tables,
            new_host_blocks,
            host_cow,
            gpu_cow,
            restores,
            hot_assign,
            hot_release,
            row_mirrors,
            page_transfers,
            indexer_restores,
            indexer_backups,
        } = self;
        let reserve = [
            list_bytes(scheduled),
            list_bytes(preempted),
            list_bytes(refused),
            list_bytes(started),
            list_bytes(residency),
            list_bytes(host_blocks),
            list_bytes(block_tables),
            list_bytes(new_host_blocks),
            list_bytes(host_cow),
            list_bytes(gpu_cow),
            list_bytes(restores),
            list_bytes(hot_assign),
            list_bytes(hot_release),
            list_bytes(row_mirrors),
            list_bytes(page_transfers),
            list_bytes(indexer_restores),
            list_bytes(indexer_backups),
        ]
        .into_iter()
        // Plus step, transfer id and fully_resident.
        .fold(8 + 9 + 1, usize::saturating_add);
        let mut e = Encoder::begin(out, MessageKind::Command, fingerprint, reserve);
        e.put_u64(*step);
        e.put_flag(transfer_id.is_some());
        if let Some(id) = *transfer_id {
            e.put_u64(id);
        }
        e.put_list(scheduled);
        e.put_list(preempted);
        e.put_list(refused);
        e.put_list(started);
        e.put_flag(*fully_resident);
        e.put_list(residency);
        e.put_list(host_blocks);
        e.put_list(block_tables);
        e.put_list(new_host_blocks);
        e.put_list(host_cow);
        e.put_list(gpu_cow);
        e.put_list(restores);
        e.put_list(hot_assign);
        e.put_list(hot_release);
        e.put_list(row_mirrors);
        e.put_list(page_transfers);
        e.put_list(indexer_restores);
        e.put_list(indexer_backups);
        e.finish();
    }

    /// Decodes one command message (all of `bytes`) planned for the layout `fingerprint`.
    ///
    /// Everything is checked before the command is built: the magic, the format version, the
    /// length, the checksum, the layout, every list count against the bytes left and every
    /// field's encoding. What the format cannot know — whether a block or slot lies inside the
    /// layout — the runtime checks when it executes the command.
    pub fn from_bytes(bytes: &[u8], fingerprint: LayoutFingerprint) -> Result<Self, WireError> {
        let mut d = open(bytes, MessageKind::Command, fingerprint)?;
        let step = d.u64("step")?;
        let transfer_id = if d.flag("transfer_id")? {
            Some(d.u64("transfer_id")?)
        } else {
            None
        };
        let cmd = OffloadCommand {
            step,
            transfer_id,
            scheduled: d.list("scheduled")?,
            preempted: d.list("preempted")?,
            refused: d.list("refused")?,
            started: d.list("started")?,
            fully_resident: d.flag("fully_resident")?,
            residency: d.list("residency")?,
            host_blocks: d.list("host_blocks")?,
            block_tables: d.list("block_tables")?,
            new_host_blocks: d.list("new_host_blocks")?,
            host_cow: d.list("host_cow")?,
            gpu_cow: d.list("gpu_cow")?,
            restores: d.list("restores")?,
            hot_assign: d.list("hot_assign")?,
            hot_release: d.list("hot_release")?,
            row_mirrors: d.list("row_mirrors")?,
            page_transfers: d.list("page_transfers")?,
            indexer_restores: d.list("indexer_restores")?,
            indexer_backups: d.list("indexer_backups")?,
        };
        d.finish()?;
        Ok(cmd)
    }
}

impl WorkerReport {
    /// The report as one wire message for the layout `fingerprint` (see [`crate::wire`]).
    pub fn to_bytes(&self, fingerprint: LayoutFingerprint) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(fingerprint, &mut out);
        out
    }

    /// Appends the report's wire message to `out`.
    pub fn encode_into(&self, fingerprint: LayoutFingerprint, out: &mut Vec<u8>) {
        let WorkerReport {
            worker,
            enqueued,
            completed,
        } = self;
        let reserve = list_bytes(enqueued)
            .saturating_add(list_bytes(completed))
            .saturating_add(4);
        let mut e = Encoder::begin(out, MessageKind::WorkerReport, fingerprint, reserve);
        e.put_u32(*worker);
        e.put_list(enqueued);
        e.put_list(completed);
        e.finish();
    }

    /// Decodes one worker-report message (all of `bytes`) from a worker of the layout
    /// `fingerprint`, checked as [`OffloadCommand::from_bytes`] checks a command. Whether its
    /// transfer ids are in order is [`crate::coordinator::Coordinator::report`]'s to check.
    pub fn from_bytes(bytes: &[u8], fingerprint: LayoutFingerprint) -> Result<Self, WireError> {
        let mut d = open(bytes, MessageKind::WorkerReport, fingerprint)?;
        let report = WorkerReport {
            worker: d.u32("worker")?,
            enqueued: d.list("enqueued")?,
            completed: d.list("completed")?,
        };
        d.finish()?;
        Ok(report)
    }
}
