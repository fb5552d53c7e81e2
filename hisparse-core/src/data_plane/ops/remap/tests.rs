//! The reference remap in all its modes.

use super::*;

fn desc() -> RemapDesc {
    RemapDesc {
        num_tokens: 2,
        top_k: 4,
        table_rows: 2,
        max_blocks: 2,
        block_size: 4,
        block_stride_rows: 10,
        idx_mapping_len: None,
        write_counts: true,
        compact: false,
        stats_slot: 0,
    }
}

#[test]
fn maps_and_marks_invalid() {
    let d = desc();
    let table = [3, 5, 7, -1];
    let topk = [0, 5, -1, 8, 1, 4, 2, 3];
    let mut out = [0; 8];
    let mut counts = [0; 2];
    remap(
        &d,
        RemapArgs {
            req_id: &[0, 1],
            block_table: &table,
            topk: &topk,
            idx_mapping: None,
            out: &mut out,
            counts: Some(&mut counts),
            stats: None,
        },
    )
    .unwrap();
    // row 0: tok 0 -> 3*10+0, tok 5 -> 5*10+1, -1, tok 8 -> block 2 out of range
    // row 1: tok 1 -> 7*10+1, tok 4 -> block -1 -> -1, tok 2 -> 72, tok 3 -> 73
    assert_eq!(out, [30, 51, -1, -1, 71, -1, 72, 73]);
    assert_eq!(counts, [2, 3]);
}

#[test]
fn stats_count_valid_entries_with_or_without_counts() {
    let topk = [0, 5, -1, 8, 1, 4, 2, 3];
    let mut stats = [0, 0, 0, 0, 5, 6, -3, -1];
    /// A remap of `desc` adding to `stats`, with per-row counts when it writes them.
    fn call(d: &RemapDesc, topk: &[i32], stats: &mut [i32]) -> Result<(), OpError> {
        let t = d.num_tokens as usize;
        let mut counts = [0; 2];
        remap(
            d,
            RemapArgs {
                req_id: &[0, 1][..t],
                block_table: &[3, 5, 7, -1],
                topk,
                idx_mapping: None,
                out: &mut [0; 8][..4 * t],
                counts: d.write_counts.then_some(&mut counts[..t]),
                stats: Some(stats),
            },
        )
    }
    for write_counts in [false, true] {
        let d = RemapDesc {
            write_counts,
            stats_slot: 1,
            ..desc()
        };
        call(&d, &topk, &mut stats).unwrap();
    }
    // 5 valid entries per call, twice: the valid word wraps at the first call.
    assert_eq!(stats, [0, 0, 0, 0, 5, 6, 7, 1]);
    // An empty batch counts the call; a buffer without the slot is refused.
    let empty = RemapDesc {
        num_tokens: 0,
        stats_slot: 0,
        ..desc()
    };
    call(&empty, &[], &mut stats).unwrap();
    assert_eq!(stats[..4], [0, 0, 0, 1]);
    let e = call(
        &RemapDesc {
            stats_slot: 2,
            ..empty
        },
        &[],
        &mut stats,
    )
    .unwrap_err();
    assert!(matches!(
        e,
        OpError::BufferTooSmall {
            buffer: "stats",
            needed: 48,
            ..
        }
    ));
}

#[test]
fn compacts_and_maps_through_idx_mapping() {
    let d = RemapDesc {
        idx_mapping_len: Some(3),
        compact: true,
        ..desc()
    };
    let table = [3, 5, 7, 9];
    let topk = [-1, 5, -7, 0, 0, 1, 2, 3];
    let mut out = [0; 8];
    let mut counts = [0; 2];
    remap(
        &d,
        RemapArgs {
            req_id: &[2, 0],
            block_table: &table,
            topk: &topk,
            idx_mapping: Some(&[1, 0, -1]),
            out: &mut out,
            counts: Some(&mut counts),
            stats: None,
        },
    )
    .unwrap();
    // req 2 maps to -1 → padding; req 0 maps to row 1.
    assert_eq!(out, [-1, -1, -1, -1, 70, 71, 72, 73]);
    assert_eq!(counts, [0, 4]);
}

#[test]
fn rejects_short_buffers_and_bad_stride() {
    let d = desc();
    let mut out = [0; 7];
    let err = remap(
        &d,
        RemapArgs {
            req_id: &[0, 1],
            block_table: &[0; 4],
            topk: &[0; 8],
            idx_mapping: None,
            out: &mut out,
            counts: Some(&mut [0; 2]),
            stats: None,
        },
    )
    .unwrap_err();
    assert!(matches!(
        err,
        OpError::BufferTooSmall {
            buffer: "out",
            needed: 32,
            actual: 28,
            ..
        }
    ));
    let bad = RemapDesc {
        block_stride_rows: 3,
        ..desc()
    };
    assert!(matches!(
        bad.validate(),
        Err(OpError::OutOfRange {
            field: "block_stride_rows",
            ..
        })
    ));
}

#[test]
fn overflowing_physical_row_is_invalid() {
    let d = RemapDesc {
        block_stride_rows: 1 << 20,
        num_tokens: 1,
        table_rows: 1,
        ..desc()
    };
    let mut out = [0; 4];
    remap(
        &d,
        RemapArgs {
            req_id: &[0],
            block_table: &[1 << 12, 1],
            topk: &[0, 4, 5, 1],
            idx_mapping: None,
            out: &mut out,
            counts: Some(&mut [0]),
            stats: None,
        },
    )
    .unwrap();
    assert_eq!(out, [-1, 1 << 20, (1 << 20) + 1, -1]);
}

#[test]
fn dcp_split_deinterleaves() {
    // size 2, interleave 2: tokens 0,1 → rank 0 (local 0,1); 2,3 → rank 1 (0,1);
    // 4,5 → rank 0 (2,3).
    let r0 = DcpSplit {
        size: 2,
        rank: 0,
        interleave: 2,
    };
    let r1 = DcpSplit { rank: 1, ..r0 };
    let l0: std::vec::Vec<Option<u32>> = (0..8).map(|t| r0.local(t)).collect();
    let l1: std::vec::Vec<Option<u32>> = (0..8).map(|t| r1.local(t)).collect();
    assert_eq!(
        l0,
        [Some(0), Some(1), None, None, Some(2), Some(3), None, None]
    );
    assert_eq!(
        l1,
        [None, None, Some(0), Some(1), None, None, Some(2), Some(3)]
    );
    // Every token is stored by exactly one rank, at distinct local indices.
    for size in 1..5u32 {
        for interleave in 1..4u32 {
            let mut seen = std::vec![std::vec::Vec::new(); size as usize];
            for t in 0..100u32 {
                let owners: std::vec::Vec<u32> = (0..size)
                    .filter(|&rank| {
                        DcpSplit {
                            size,
                            rank,
                            interleave,
                        }
                        .local(t)
                        .is_some()
                    })
                    .collect();
                assert_eq!(owners.len(), 1);
                let rank = owners[0];
                seen[rank as usize].push(
                    DcpSplit {
                        size,
                        rank,
                        interleave,
                    }
                    .local(t)
                    .unwrap(),
                );
            }
            for s in seen {
                assert!(s.windows(2).all(|w| w[1] == w[0] + 1));
            }
        }
    }
}

#[test]
fn dcp_and_workspace_modes() {
    let d = RemapModesDesc {
        remap: RemapDesc {
            num_tokens: 3,
            compact: false,
            ..desc()
        },
        dcp: Some(DcpSplit {
            size: 2,
            rank: 1,
            interleave: 1,
        }),
        prefill_requests: Some(2),
    };
    // Table row 0: blocks 3, 5 (block size 4, stride 10).
    let table = [3, 5, 7, -1];
    let topk = [1, 2, 3, 7, 0, 5, -1, 2147483647, 0, 1, 2, 3];
    let mut out = [0; 12];
    let mut counts = [0; 3];
    remap_modes(
        &d,
        RemapModesArgs {
            remap: RemapArgs {
                req_id: &[0, 1, 0],
                block_table: &table,
                topk: &topk,
                idx_mapping: None,
                out: &mut out,
                counts: Some(&mut counts),
                stats: None,
            },
            // Row 0 decodes; row 1 is prefill request 0 (workspace from row 100); row 2
            // names prefill request 5, beyond the 2 given: padding.
            prefill_req_id: Some(&[-1, 0, 5]),
            workspace_starts: Some(&[100, 200]),
        },
    )
    .unwrap();
    // Rank 1 of 2 holds the odd tokens: 1 → local 0 → 30; 3 → local 1 → 31; 7 → local 3
    // → 33; 2 is rank 0's.
    assert_eq!(&out[..4], &[30, -1, 31, 33]);
    assert_eq!(&out[4..8], &[100, 105, -1, -1]);
    assert_eq!(&out[8..], &[-1; 4]);
    assert_eq!(counts, [3, 2, 0]);
    // Without modes it is the plain remap.
    let plain = RemapModesDesc::plain(RemapDesc {
        num_tokens: 2,
        ..desc()
    });
    let mut a = [0; 8];
    let mut b = [0; 8];
    let topk = [0, 5, -1, 8, 1, 4, 2, 3];
    let args = |out| RemapArgs {
        req_id: &[0, 1][..],
        block_table: &table[..],
        topk: &topk[..],
        idx_mapping: None,
        out,
        counts: None,
        stats: None,
    };
    let plain_desc = RemapDesc {
        write_counts: false,
        ..plain.remap
    };
    let plain = RemapModesDesc::plain(plain_desc);
    remap(&plain_desc, args(&mut a)).unwrap();
    remap_modes(
        &plain,
        RemapModesArgs {
            remap: args(&mut b),
            prefill_req_id: None,
            workspace_starts: None,
        },
    )
    .unwrap();
    assert_eq!(a, b);
    // Bad splits and missing buffers are refused.
    let bad = RemapModesDesc {
        dcp: Some(DcpSplit {
            size: 2,
            rank: 2,
            interleave: 1,
        }),
        prefill_requests: None,
        ..d
    };
    assert!(matches!(
        bad.validate(),
        Err(OpError::OutOfRange {
            field: "dcp.rank",
            ..
        })
    ));
    assert_eq!(bad.feature(), "dcp");
    let mut out = [0; 12];
    let e = remap_modes(
        &d,
        RemapModesArgs {
            remap: RemapArgs {
                req_id: &[0, 1, 0],
                block_table: &table,
                topk: &[0; 12],
                idx_mapping: None,
                out: &mut out,
                counts: Some(&mut [0; 3]),
                stats: None,
            },
            prefill_req_id: None,
            workspace_starts: Some(&[0, 0]),
        },
    );
    assert!(matches!(
        e,
        Err(OpError::BufferTooSmall {
            buffer: "prefill_req_id",
            ..
        })
    ));
}
