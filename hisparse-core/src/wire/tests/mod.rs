//! The wire format: round trips of random and real commands and reports (`round_trip.rs`), and
//! every way a blob can be wrong — each an error, never a panic, never a wrong command
//! (`refusals.rs`). This file holds what both use.

mod refusals;
mod round_trip;

use alloc::vec;
use alloc::vec::Vec;

use super::checksum::crc32c;
use super::*;
use crate::config::HiSparseConfig;
use crate::coordinator::{
    HotAssignment, OffloadCommand, PageTransfer, PoolKind, RefusalReason, RefusedRequest,
    RowMirror, ScheduledRequest, TableUpdate, WorkerReport,
};
use crate::layout::{KvCacheConfig, LayoutInput, plan_layout};
use crate::model::{LayerSpec, ModelSpec};
use crate::ops::{BlockPair, RowSpan};

/// Two sparse leaders (16 B rows and indexer rows), 4-token blocks: small pools fill quickly.
const LAYERS: [LayerSpec; 2] = [
    LayerSpec::sparse_leader(16, 16),
    LayerSpec::sparse_leader(16, 16),
];
const TINY: ModelSpec<'static> = ModelSpec {
    name: "tiny",
    block_tokens: 4,
    top_k: 4,
    layers: &LAYERS,
};

fn tiny_layout(gpu_blocks: u32, eager: bool) -> KvCacheConfig {
    let mut cfg = HiSparseConfig::new(4, 64 * 128);
    cfg.device_buffer_size = Some(8);
    cfg.eager_host_mirror = eager;
    let mut input = LayoutInput::new(&TINY, &cfg, 0, 48);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    plan_layout(&input).unwrap()
}

/// A message framed by hand from the documented header table, with any version and
/// fingerprint and a valid checksum: how a test reaches the payload checks.
fn frame(kind: MessageKind, version: u16, fingerprint: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&kind.magic());
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&fingerprint.to_le_bytes());
    b.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    b.extend_from_slice(payload);
    let crc = crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The payload of a well-formed message.
fn payload(blob: &[u8]) -> &[u8] {
    &blob[HEADER_BYTES..blob.len() - CHECKSUM_BYTES]
}

/// Recomputes the checksum of `blob` in place (after a deliberate edit).
fn reseal(blob: &mut [u8]) {
    let n = blob.len() - CHECKSUM_BYTES;
    let crc = crc32c(&blob[..n]);
    blob[n..].copy_from_slice(&crc.to_le_bytes());
}

/// A command with every list filled, extreme values among them.
fn rich_command() -> OffloadCommand {
    OffloadCommand {
        step: 1 << 40,
        transfer_id: Some(77),
        scheduled: vec![
            ScheduledRequest {
                id: u64::MAX,
                slot: 3,
                first_token: 131071,
                num_tokens: 1,
                fully_resident: false,
            },
            ScheduledRequest {
                id: 0,
                slot: u32::MAX,
                first_token: 0,
                num_tokens: 512,
                fully_resident: true,
            },
        ],
        preempted: vec![9, 1 << 33],
        refused: vec![
            RefusedRequest {
                id: 12,
                reason: RefusalReason::PrefillNeverFits {
                    context_tokens: 40,
                    needed: 21,
                    capacity: 16,
                },
            },
            RefusedRequest {
                id: u64::MAX,
                reason: RefusalReason::NeverFits {
                    pool: PoolKind::Host,
                    needed: u64::MAX,
                    capacity: 0,
                },
            },
            RefusedRequest {
                id: 0,
                reason: RefusalReason::OutOfMemory { bytes: 1 << 50 },
            },
            RefusedRequest {
                id: 5,
                reason: RefusalReason::Internal,
            },
        ],
        started: vec![0, 200],
        fully_resident: false,
        residency: vec![TableUpdate {
            slot: 1,
            group: 2,
            page: 300,
            block: 0,
        }],
        host_blocks: vec![TableUpdate {
            slot: 1,
            group: 0,
            page: 2,
            block: 214_662,
        }],
        block_tables: vec![TableUpdate {
            slot: 5,
            group: 1,
            page: 0,
            block: 157_383,
        }],
        new_host_blocks: vec![7, 8, 9],
        host_cow: vec![BlockPair { src: 4, dst: 5 }],
        gpu_cow: vec![BlockPair {
            src: 70_000,
            dst: 1,
        }],
        restores: vec![PageTransfer {
            bucket: 5,
            device_block: 12,
            host_block: 13,
        }],
        hot_assign: vec![
            HotAssignment {
                slot: 1,
                group: 8,
                blocks: (100..164).collect(),
            },
            HotAssignment {
                slot: 2,
                group: 9,
                blocks: Vec::new(),
            },
        ],
        hot_release: vec![4],
        row_mirrors: vec![RowMirror {
            bucket: 0,
            span: RowSpan {
                device_block: 3,
                host_block: 4,
                first_row: 63,
                num_rows: 1,
            },
        }],
        page_transfers: vec![PageTransfer {
            bucket: 1,
            device_block: 2,
            host_block: 3,
        }],
        indexer_restores: vec![BlockPair { src: 5, dst: 6 }],
        indexer_backups: vec![RowSpan {
            device_block: 6,
            host_block: 5,
            first_row: 2,
            num_rows: 3,
        }],
    }
}

fn report() -> WorkerReport {
    WorkerReport {
        worker: 3,
        enqueued: vec![5, 6, 1 << 35],
        completed: vec![4],
    }
}
