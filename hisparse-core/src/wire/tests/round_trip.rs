//! Random and real commands and reports survive the bytes unchanged, in the documented layout.

use alloc::vec;
use alloc::vec::Vec;

use proptest::collection::vec as list_of;
use proptest::option::of as option_of;
use proptest::prelude::*;

use super::*;
use crate::coordinator::{
    Coordinator, CoordinatorConfig, PoolKind, RefusalReason, RefusedRequest, RequestId,
};
use crate::wire::frame::{self, WireValue as _};

fn u32s() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..130, 0u32..1 << 20, any::<u32>(), Just(u32::MAX)]
}

fn u64s() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..130, any::<u64>(), Just(u64::MAX)]
}

fn table_updates() -> impl Strategy<Value = Vec<TableUpdate>> {
    list_of(
        (u32s(), u32s(), u32s(), u32s()).prop_map(|(slot, group, page, block)| TableUpdate {
            slot,
            group,
            page,
            block,
        }),
        0..6,
    )
}

fn pairs() -> impl Strategy<Value = Vec<BlockPair>> {
    list_of(
        (u32s(), u32s()).prop_map(|(src, dst)| BlockPair { src, dst }),
        0..4,
    )
}

fn page_transfers() -> impl Strategy<Value = Vec<PageTransfer>> {
    list_of(
        (u32s(), u32s(), u32s()).prop_map(|(bucket, device_block, host_block)| PageTransfer {
            bucket,
            device_block,
            host_block,
        }),
        0..4,
    )
}

fn refusal_reasons() -> impl Strategy<Value = RefusalReason> {
    let pools = prop_oneof![Just(PoolKind::Gpu), Just(PoolKind::Host)];
    prop_oneof![
        (u32s(), u64s(), u64s()).prop_map(|(context_tokens, needed, capacity)| {
            RefusalReason::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
            }
        }),
        (pools, u64s(), u64s()).prop_map(|(pool, needed, capacity)| RefusalReason::NeverFits {
            pool,
            needed,
            capacity
        }),
        u64s().prop_map(|bytes| RefusalReason::OutOfMemory { bytes }),
        Just(RefusalReason::Internal),
    ]
}

fn commands() -> impl Strategy<Value = OffloadCommand> {
    let scheduled = list_of(
        (u64s(), u32s(), u32s(), u32s(), any::<bool>()).prop_map(
            |(id, slot, first_token, num_tokens, fully_resident)| ScheduledRequest {
                id,
                slot,
                first_token,
                num_tokens,
                fully_resident,
            },
        ),
        0..6,
    );
    let refused = list_of(
        (u64s(), refusal_reasons()).prop_map(|(id, reason)| RefusedRequest { id, reason }),
        0..4,
    );
    let hot_assign = list_of(
        (u32s(), u32s(), list_of(u32s(), 0..70)).prop_map(|(slot, group, blocks)| HotAssignment {
            slot,
            group,
            blocks,
        }),
        0..3,
    );
    let row_mirrors = list_of(
        (u32s(), u32s(), u32s(), u32s(), u32s()).prop_map(
            |(bucket, device_block, host_block, first_row, num_rows)| RowMirror {
                bucket,
                span: RowSpan {
                    device_block,
                    host_block,
                    first_row,
                    num_rows,
                },
            },
        ),
        0..6,
    );
    let indexer_backups = list_of(
        (u32s(), u32s(), u32s(), u32s()).prop_map(
            |(device_block, host_block, first_row, num_rows)| RowSpan {
                device_block,
                host_block,
                first_row,
                num_rows,
            },
        ),
        0..4,
    );
    (
        (
            u64s(),
            option_of(u64s()),
            scheduled,
            list_of(u64s(), 0..4),
            refused,
            list_of(u32s(), 0..4),
            any::<bool>(),
        ),
        (
            table_updates(),
            table_updates(),
            table_updates(),
            list_of(u32s(), 0..4),
        ),
        (
            pairs(),
            pairs(),
            page_transfers(),
            hot_assign,
            list_of(u32s(), 0..4),
            row_mirrors,
            page_transfers(),
        ),
        (pairs(), indexer_backups),
    )
        .prop_map(
            |(
                (step, transfer_id, scheduled, preempted, refused, started, fully_resident),
                (residency, host_blocks, block_tables, new_host_blocks),
                (host_cow, gpu_cow, restores, hot_assign, hot_release, row_mirrors, page_transfers),
                (indexer_restores, indexer_backups),
            )| OffloadCommand {
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
            },
        )
}

fn reports() -> impl Strategy<Value = WorkerReport> {
    (u32s(), list_of(u64s(), 0..8), list_of(u64s(), 0..8)).prop_map(
        |(worker, enqueued, completed)| WorkerReport {
            worker,
            enqueued,
            completed,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_commands_round_trip(cmd in commands(), fp_seed in any::<u32>()) {
        let fp = tiny_layout(40 + fp_seed % 64, true).fingerprint();
        let blob = cmd.to_bytes(fp);
        prop_assert_eq!(OffloadCommand::from_bytes(&blob, fp), Ok(cmd.clone()));
        // The header is the documented table: framing the payload by hand gives the same bytes.
        prop_assert_eq!(&frame(MessageKind::Command, WIRE_VERSION, fp.as_u64(), payload(&blob)), &blob);
        // encode_into appends: the message after other bytes is the same message.
        let mut buf = vec![0xAB; 5];
        cmd.encode_into(fp, &mut buf);
        prop_assert_eq!(&buf[5..], &blob[..]);
    }

    #[test]
    fn random_reports_round_trip(r in reports()) {
        let fp = tiny_layout(40, true).fingerprint();
        let blob = r.to_bytes(fp);
        prop_assert_eq!(WorkerReport::from_bytes(&blob, fp), Ok(r.clone()));
        prop_assert_eq!(&frame(MessageKind::WorkerReport, WIRE_VERSION, fp.as_u64(), payload(&blob)), &blob);
    }

    /// A payload edited anywhere and resealed (so the checksum passes) decodes to an error or to
    /// a command whose encoding is exactly those bytes: the decoder accepts only what the
    /// encoder writes, and never panics.
    #[test]
    fn edited_payloads_are_refused_or_canonical(
        cmd in commands(),
        edits in list_of((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let fp = tiny_layout(40, true).fingerprint();
        let mut blob = cmd.to_bytes(fp);
        let n = blob.len() - HEADER_BYTES - CHECKSUM_BYTES;
        for (at, byte) in edits {
            blob[HEADER_BYTES + at.index(n)] = byte;
        }
        reseal(&mut blob);
        if let Ok(decoded) = OffloadCommand::from_bytes(&blob, fp) {
            prop_assert_eq!(decoded.to_bytes(fp), blob);
        }
    }
}

/// Drives a coordinator as a tensor-parallel engine would — two workers, the second reporting
/// a step late; prompts sharing a prefix (hits, copy-on-write tails), a pool small enough to
/// reclaim, spill and hand out hot regions, an explicit preemption — and returns the layout,
/// every command built and every report made.
fn coordinator_run(eager: bool) -> (KvCacheConfig, Vec<OffloadCommand>, Vec<WorkerReport>) {
    let kv = tiny_layout(34, eager);
    let mut c = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_running: 4,
            max_batched_tokens: 24,
            max_spill_pages_per_step: 2,
            num_workers: 2,
            enable_prefix_caching: true,
            reclaim_min_blocks: 0,
        },
    )
    .unwrap();
    let prompt = |id: RequestId, len: u32| -> Vec<u32> {
        // Requests 1-6 share their first 8 tokens; odd ids share 12.
        (0..len)
            .map(|t| {
                if t < 8 || (t < 12 && id % 2 == 1) {
                    t
                } else {
                    1000 * id as u32 + t
                }
            })
            .collect()
    };
    let (mut commands, mut reports) = (Vec::new(), Vec::new());
    let mut lagging: Vec<u64> = Vec::new();
    let mut admitted = 0;
    // An imported request (its first 17 tokens written by another party): its start restores
    // their indexer pages.
    let imported: Vec<u32> = (0..20).map(|t| 50_000 + t).collect();
    c.reserve_import(100, &imported, 17).unwrap();
    c.complete_import(100).unwrap();
    for step in 0..200u32 {
        if admitted < 8 && step % 6 == 0 {
            admitted += 1;
            // The last two repeat the shared 8-token prefix exactly: a whole-prompt hit whose
            // last page becomes a copy-on-write tail.
            let len = if admitted > 6 {
                8
            } else {
                8 + 5 * admitted as u32
            };
            c.admit(admitted, &prompt(admitted, len)).unwrap();
        }
        if step == 9 {
            let id = c.running_ids().next().unwrap();
            c.preempt(id).unwrap();
        }
        let cmd = c.step().unwrap();
        let fresh: Vec<u64> = cmd.transfer_id.into_iter().collect();
        for r in [
            WorkerReport {
                worker: 0,
                enqueued: fresh.clone(),
                completed: fresh.clone(),
            },
            WorkerReport {
                worker: 1,
                enqueued: fresh.clone(),
                completed: core::mem::replace(&mut lagging, fresh),
            },
        ] {
            c.report(r.worker, &r.enqueued, &r.completed).unwrap();
            reports.push(r);
        }
        commands.push(cmd);
        let running: Vec<RequestId> = c.running_ids().collect();
        for id in running {
            if c.num_computed(id) == c.num_tokens(id) {
                if c.num_tokens(id) >= Some(40) {
                    c.finish(id).unwrap();
                } else {
                    c.append_tokens(id, &[7]).unwrap();
                }
            }
        }
        if admitted == 8 && c.num_running() == 0 && c.num_waiting() == 0 {
            break;
        }
    }
    c.check_invariants().unwrap();
    (kv, commands, reports)
}

/// Steps `c` once; its one worker completes the step's copies at once.
fn step_and_report(
    c: &mut Coordinator,
    commands: &mut Vec<OffloadCommand>,
    reports: &mut Vec<WorkerReport>,
) {
    let cmd = c.step().unwrap();
    let ids: Vec<u64> = cmd.transfer_id.into_iter().collect();
    let r = WorkerReport {
        worker: 0,
        enqueued: ids.clone(),
        completed: ids,
    };
    c.report(r.worker, &r.enqueued, &r.completed).unwrap();
    commands.push(cmd);
    reports.push(r);
}

/// A run in which a step refuses a request: request 1 decodes past the longest context a
/// prefill can hold in a 17-block pool and is preempted, so its restart (a prefill over its
/// whole context) can never fit; request 2 runs meanwhile.
fn refusal_run() -> (KvCacheConfig, Vec<OffloadCommand>, Vec<WorkerReport>) {
    let kv = tiny_layout(17, true);
    let mut c = Coordinator::new(
        kv.clone(),
        CoordinatorConfig {
            max_batched_tokens: 512,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap();
    let (mut commands, mut reports) = (Vec::new(), Vec::new());
    c.admit(1, &(0..8).collect::<Vec<u32>>()).unwrap();
    while c.num_tokens(1) != Some(40) {
        step_and_report(&mut c, &mut commands, &mut reports);
        if c.num_computed(1) == c.num_tokens(1) {
            c.append_tokens(1, &[7]).unwrap();
        }
    }
    c.preempt(1).unwrap();
    c.admit(2, &(100..104).collect::<Vec<u32>>()).unwrap();
    for _ in 0..20 {
        step_and_report(&mut c, &mut commands, &mut reports);
        if commands.last().is_some_and(|cmd| !cmd.refused.is_empty()) {
            break;
        }
        if c.num_computed(2) == c.num_tokens(2) {
            c.append_tokens(2, &[7]).unwrap();
        }
    }
    (kv, commands, reports)
}

#[test]
fn commands_and_reports_of_coordinator_runs_round_trip() {
    let mut seen = [false; 21];
    for (kv, commands, reports) in [coordinator_run(true), coordinator_run(false), refusal_run()] {
        let fp = kv.fingerprint();
        let mut buf = Vec::new();
        for cmd in &commands {
            buf.clear();
            cmd.encode_into(fp, &mut buf);
            assert_eq!(OffloadCommand::from_bytes(&buf, fp).as_ref(), Ok(cmd));
            let OffloadCommand {
                step: _,
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
            } = cmd;
            for (i, present) in [
                transfer_id.is_some(),
                transfer_id.is_none(),
                !scheduled.is_empty(),
                !preempted.is_empty(),
                !refused.is_empty(),
                !started.is_empty(),
                *fully_resident,
                !*fully_resident,
                residency.iter().any(|u| u.block == 0),
                !host_blocks.is_empty(),
                !block_tables.is_empty(),
                !new_host_blocks.is_empty(),
                !host_cow.is_empty(),
                !gpu_cow.is_empty(),
                !restores.is_empty(),
                !hot_assign.is_empty(),
                !hot_release.is_empty(),
                !row_mirrors.is_empty(),
                !page_transfers.is_empty(),
                !indexer_restores.is_empty(),
                !indexer_backups.is_empty(),
            ]
            .into_iter()
            .enumerate()
            {
                seen[i] |= present;
            }
        }
        for r in &reports {
            assert_eq!(
                WorkerReport::from_bytes(&r.to_bytes(fp), fp).as_ref(),
                Ok(r)
            );
        }
    }
    // The run exercised every part of a command (else this test proves less than it claims).
    assert_eq!(
        seen, [true; 21],
        "parts of a command the runs never produced"
    );
}

/// Each element writes exactly the bytes its `MIN_BYTES` says (a larger figure would refuse
/// valid lists as `CountTooLarge`; a smaller one would loosen the allocation bound).
#[test]
fn elements_write_their_declared_sizes() {
    fn written<T: frame::WireValue>(item: T) -> u64 {
        let mut out = Vec::new();
        let mut e = frame::Encoder::begin(
            &mut out,
            MessageKind::Command,
            tiny_layout(40, true).fingerprint(),
            0,
        );
        item.put(&mut e);
        (out.len() - HEADER_BYTES) as u64
    }
    let c = rich_command();
    assert_eq!(written(c.scheduled[0]), ScheduledRequest::MIN_BYTES);
    assert_eq!(written(c.residency[0]), TableUpdate::MIN_BYTES);
    assert_eq!(written(c.refused[3]), RefusedRequest::MIN_BYTES);
    assert_eq!(written(c.host_cow[0]), BlockPair::MIN_BYTES);
    assert_eq!(written(c.restores[0]), PageTransfer::MIN_BYTES);
    assert_eq!(written(c.row_mirrors[0]), RowMirror::MIN_BYTES);
    assert_eq!(written(c.indexer_backups[0]), RowSpan::MIN_BYTES);
    assert_eq!(written(c.hot_assign[1].clone()), HotAssignment::MIN_BYTES);
    assert_eq!(
        written(c.hot_assign[0].clone()),
        HotAssignment::MIN_BYTES + 4 * c.hot_assign[0].blocks.len() as u64
    );
    assert_eq!(written(7u32), u32::MIN_BYTES);
    assert_eq!(written(7u64), u64::MIN_BYTES);
}

/// The payload is the module docs' table, written out by hand here: fields in declaration
/// order, `u32` and `u64` little-endian, flags one byte, lists a `u64` count first.
#[test]
fn the_payload_is_the_documented_layout() {
    fn list<T>(out: &mut Vec<u8>, items: &[T], mut each: impl FnMut(&mut Vec<u8>, &T)) {
        out.extend((items.len() as u64).to_le_bytes());
        for item in items {
            each(out, item);
        }
    }
    fn u32s(out: &mut Vec<u8>, values: &[u32]) {
        for v in values {
            out.extend(v.to_le_bytes());
        }
    }
    let fp = tiny_layout(40, true).fingerprint();
    let c = rich_command();
    let mut p = Vec::new();
    p.extend(c.step.to_le_bytes());
    p.push(1);
    p.extend(c.transfer_id.unwrap().to_le_bytes());
    list(&mut p, &c.scheduled, |o, s| {
        o.extend(s.id.to_le_bytes());
        u32s(o, &[s.slot, s.first_token, s.num_tokens]);
        o.push(u8::from(s.fully_resident));
    });
    list(&mut p, &c.preempted, |o, v| o.extend(v.to_le_bytes()));
    list(&mut p, &c.refused, |o, r| {
        o.extend(r.id.to_le_bytes());
        match r.reason {
            RefusalReason::PrefillNeverFits {
                context_tokens,
                needed,
                capacity,
            } => {
                o.push(0);
                o.extend(context_tokens.to_le_bytes());
                o.extend(needed.to_le_bytes());
                o.extend(capacity.to_le_bytes());
            }
            RefusalReason::NeverFits {
                pool,
                needed,
                capacity,
            } => {
                o.push(1);
                o.push(u8::from(pool == PoolKind::Host));
                o.extend(needed.to_le_bytes());
                o.extend(capacity.to_le_bytes());
            }
            RefusalReason::OutOfMemory { bytes } => {
                o.push(2);
                o.extend(bytes.to_le_bytes());
            }
            RefusalReason::Internal => o.push(3),
        }
    });
    list(&mut p, &c.started, |o, v| o.extend(v.to_le_bytes()));
    p.push(u8::from(c.fully_resident));
    for updates in [&c.residency, &c.host_blocks, &c.block_tables] {
        list(&mut p, updates, |o, u| {
            u32s(o, &[u.slot, u.group, u.page, u.block])
        });
    }
    list(&mut p, &c.new_host_blocks, |o, v| o.extend(v.to_le_bytes()));
    for pairs in [&c.host_cow, &c.gpu_cow] {
        list(&mut p, pairs, |o, b| u32s(o, &[b.src, b.dst]));
    }
    list(&mut p, &c.restores, |o, t| {
        u32s(o, &[t.bucket, t.device_block, t.host_block])
    });
    list(&mut p, &c.hot_assign, |o, h| {
        u32s(o, &[h.slot, h.group]);
        list(o, &h.blocks, |o, v| o.extend(v.to_le_bytes()));
    });
    list(&mut p, &c.hot_release, |o, v| o.extend(v.to_le_bytes()));
    list(&mut p, &c.row_mirrors, |o, m| {
        let s = m.span;
        u32s(
            o,
            &[
                m.bucket,
                s.device_block,
                s.host_block,
                s.first_row,
                s.num_rows,
            ],
        )
    });
    list(&mut p, &c.page_transfers, |o, t| {
        u32s(o, &[t.bucket, t.device_block, t.host_block])
    });
    list(&mut p, &c.indexer_restores, |o, b| u32s(o, &[b.src, b.dst]));
    list(&mut p, &c.indexer_backups, |o, s| {
        u32s(o, &[s.device_block, s.host_block, s.first_row, s.num_rows])
    });
    assert_eq!(payload(&c.to_bytes(fp)), &p[..]);
    // The docs' figures: header, 17 empty lists, step, transfer flag, fully_resident and
    // checksum; a report of one batch.
    assert_eq!(OffloadCommand::default().to_bytes(fp).len(), 172);
    let one_batch = WorkerReport {
        worker: 0,
        enqueued: vec![1],
        completed: vec![1],
    };
    assert_eq!(one_batch.to_bytes(fp).len(), 62);

    let r = report();
    let mut p = r.worker.to_le_bytes().to_vec();
    list(&mut p, &r.enqueued, |o, v| o.extend(v.to_le_bytes()));
    list(&mut p, &r.completed, |o, v| o.extend(v.to_le_bytes()));
    assert_eq!(payload(&r.to_bytes(fp)), &p[..]);
}
