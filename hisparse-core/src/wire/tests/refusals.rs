//! Every way a blob can be wrong is a typed error: never a panic, never a wrong command.

use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;

use super::*;
use crate::coordinator::{PoolKind, RefusalReason, RefusedRequest};
use crate::error::{Error as _, ErrorKind};

fn blobs() -> Vec<(MessageKind, Vec<u8>, LayoutFingerprint)> {
    let fp = tiny_layout(40, true).fingerprint();
    vec![
        (MessageKind::Command, rich_command().to_bytes(fp), fp),
        (
            MessageKind::Command,
            OffloadCommand::default().to_bytes(fp),
            fp,
        ),
        (MessageKind::WorkerReport, report().to_bytes(fp), fp),
        (
            MessageKind::WorkerReport,
            WorkerReport::default().to_bytes(fp),
            fp,
        ),
    ]
}

fn decode(kind: MessageKind, bytes: &[u8], fp: LayoutFingerprint) -> Result<(), WireError> {
    match kind {
        MessageKind::Command => OffloadCommand::from_bytes(bytes, fp).map(drop),
        MessageKind::WorkerReport => WorkerReport::from_bytes(bytes, fp).map(drop),
    }
}

#[test]
fn every_truncation_is_a_truncated_error() {
    for (kind, blob, fp) in blobs() {
        assert!(decode(kind, &blob, fp).is_ok());
        for len in 0..blob.len() {
            match decode(kind, &blob[..len], fp) {
                Err(WireError::Truncated {
                    kind: k,
                    needed,
                    actual,
                }) => {
                    assert_eq!((k, actual), (kind, len as u64));
                    assert!(needed > actual);
                    assert!(needed <= blob.len() as u64);
                }
                other => panic!("{kind} cut to {len} of {} bytes: {other:?}", blob.len()),
            }
        }
    }
}

#[test]
fn the_empty_slice_is_a_truncated_error_that_says_so() {
    for kind in MessageKind::ALL {
        let fp = tiny_layout(40, true).fingerprint();
        let err = decode(kind, &[], fp).unwrap_err();
        assert_eq!(
            err,
            WireError::Truncated {
                kind,
                needed: (HEADER_BYTES + CHECKSUM_BYTES) as u64,
                actual: 0
            }
        );
        assert!(err.to_string().contains("empty"), "{err}");
    }
}

#[test]
fn every_single_bit_flip_is_an_error() {
    for (kind, blob, fp) in blobs() {
        for bit in 0..blob.len() * 8 {
            let mut b = blob.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            let err = decode(kind, &b, fp).expect_err("a flipped bit decoded");
            // Header fields checked before the checksum say what they found; everything else
            // is the checksum's.
            let expected_checksum = match bit / 8 {
                0..4 => matches!(err, WireError::Foreign { .. }),
                4..6 => matches!(err, WireError::UnsupportedVersion { .. }),
                14..22 => matches!(
                    err,
                    WireError::Truncated { .. } | WireError::TrailingBytes { .. }
                ),
                _ => matches!(err, WireError::ChecksumMismatch { .. }),
            };
            assert!(expected_checksum, "bit {bit} of a {kind}: {err:?}");
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for (kind, mut blob, fp) in blobs() {
        let len = blob.len() as u64;
        blob.push(0);
        assert_eq!(
            decode(kind, &blob, fp),
            Err(WireError::TrailingBytes {
                kind,
                expected: len,
                actual: len + 1
            })
        );
    }
}

#[test]
fn a_message_for_another_layout_is_refused_naming_the_rule() {
    let (a, b) = (tiny_layout(40, true), tiny_layout(41, true));
    let blob = rich_command().to_bytes(a.fingerprint());
    let err = OffloadCommand::from_bytes(&blob, b.fingerprint()).unwrap_err();
    assert_eq!(
        err,
        WireError::LayoutMismatch {
            kind: MessageKind::Command,
            found: a.fingerprint().as_u64(),
            expected: b.fingerprint().as_u64(),
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("planned for a different layout")
            && msg.contains("the scheduler and the workers must use the same layout"),
        "{msg}"
    );
    let err = WorkerReport::from_bytes(&report().to_bytes(a.fingerprint()), b.fingerprint());
    assert!(matches!(err, Err(WireError::LayoutMismatch { .. })));
}

#[test]
fn another_version_is_refused_saying_which_is_which() {
    let fp = tiny_layout(40, true).fingerprint();
    let body = payload(&rich_command().to_bytes(fp)).to_vec();
    for (version, word) in [
        (WIRE_VERSION + 1, "newer"),
        (0, "older"),
        (u16::MAX, "newer"),
    ] {
        let blob = frame(MessageKind::Command, version, fp.as_u64(), &body);
        let err = OffloadCommand::from_bytes(&blob, fp).unwrap_err();
        assert_eq!(
            err,
            WireError::UnsupportedVersion {
                kind: MessageKind::Command,
                found: version
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&alloc::format!("version {version}"))
                && msg.contains(&alloc::format!("reads version {WIRE_VERSION}"))
                && msg.contains(word),
            "{msg}"
        );
    }
}

#[test]
fn a_message_of_the_other_kind_or_no_kind_is_refused() {
    let fp = tiny_layout(40, true).fingerprint();
    let err = OffloadCommand::from_bytes(&report().to_bytes(fp), fp).unwrap_err();
    assert_eq!(
        err,
        WireError::WrongKind {
            kind: MessageKind::Command,
            found: MessageKind::WorkerReport
        }
    );
    assert!(
        err.to_string().contains("WorkerReport::from_bytes"),
        "{err}"
    );
    let err = WorkerReport::from_bytes(&rich_command().to_bytes(fp), fp).unwrap_err();
    assert_eq!(
        err,
        WireError::WrongKind {
            kind: MessageKind::WorkerReport,
            found: MessageKind::Command
        }
    );
    let json = br#"{"step": 1, "transfer_id": null, "scheduled": []}"#;
    let err = OffloadCommand::from_bytes(json, fp).unwrap_err();
    assert_eq!(
        err,
        WireError::Foreign {
            kind: MessageKind::Command,
            found: *b"{\"st"
        }
    );
    assert!(err.to_string().contains("not a hisparse message"), "{err}");
}

#[test]
fn a_count_of_2_pow_40_with_a_few_bytes_behind_it_allocates_nothing() {
    let fp = tiny_layout(40, true).fingerprint();
    // step 1, no transfer id, then `scheduled` claiming 2^40 entries and 6 bytes of them.
    let mut body = Vec::new();
    body.extend(1u64.to_le_bytes());
    body.push(0);
    body.extend((1u64 << 40).to_le_bytes());
    body.extend([1, 2, 3, 4, 0, 9]);
    let blob = frame(MessageKind::Command, WIRE_VERSION, fp.as_u64(), &body);
    let err = OffloadCommand::from_bytes(&blob, fp).unwrap_err();
    assert_eq!(
        err,
        WireError::CountTooLarge {
            kind: MessageKind::Command,
            field: "scheduled",
            count: 1 << 40,
            bytes_left: 6
        }
    );
    // The same inside a nested list (a hot region's blocks), and in a report.
    let mut cmd = OffloadCommand::default();
    cmd.hot_assign.push(HotAssignment {
        slot: 1,
        group: 2,
        blocks: vec![3],
    });
    let mut body = payload(&cmd.to_bytes(fp)).to_vec();
    // The hot region's block count sits before its one block (4 bytes) and the 5 empty lists
    // after it (`hot_release`, `row_mirrors`, `page_transfers`, `indexer_restores`,
    // `indexer_backups`, 8 bytes each).
    let at = body.len() - 4 - 5 * 8 - 8;
    assert_eq!(body[at..at + 8], 1u64.to_le_bytes());
    body[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let blob = frame(MessageKind::Command, WIRE_VERSION, fp.as_u64(), &body);
    assert!(matches!(
        OffloadCommand::from_bytes(&blob, fp),
        Err(WireError::CountTooLarge {
            field: "hot_assign",
            count: u64::MAX,
            bytes_left: 44,
            ..
        })
    ));
    let mut body = 0u32.to_le_bytes().to_vec();
    body.extend((1u64 << 40).to_le_bytes());
    let blob = frame(MessageKind::WorkerReport, WIRE_VERSION, fp.as_u64(), &body);
    assert!(matches!(
        WorkerReport::from_bytes(&blob, fp),
        Err(WireError::CountTooLarge {
            field: "enqueued",
            ..
        })
    ));
}

#[test]
fn a_length_field_near_2_pow_64_is_a_truncated_error() {
    let fp = tiny_layout(40, true).fingerprint();
    let mut blob = OffloadCommand::default().to_bytes(fp);
    blob[14..22].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        OffloadCommand::from_bytes(&blob, fp),
        Err(WireError::Truncated {
            needed: u64::MAX,
            ..
        })
    ));
}

#[test]
fn fields_not_in_the_encoders_form_are_malformed() {
    let fp = tiny_layout(40, true).fingerprint();
    let empty = payload(&OffloadCommand::default().to_bytes(fp)).to_vec();
    // The default command: step 0 (8 bytes), no transfer id (1), `scheduled`, `preempted`,
    // `refused`, `started` empty (8 each), fully_resident (1 at byte 41), 13 more empty lists.
    assert_eq!(empty.len(), 8 + 1 + 4 * 8 + 1 + 13 * 8);
    let one_request = {
        let mut cmd = OffloadCommand::default();
        cmd.scheduled.push(ScheduledRequest {
            id: 1,
            slot: 2,
            first_token: 3,
            num_tokens: 4,
            fully_resident: true,
        });
        payload(&cmd.to_bytes(fp)).to_vec()
    };
    // Its request's flag is the 21st byte of the first entry, after the 17-byte preamble.
    assert_eq!(one_request[17 + 20], 1);
    let one_refusal = {
        let mut cmd = OffloadCommand::default();
        cmd.refused.push(RefusedRequest {
            id: 1,
            reason: RefusalReason::NeverFits {
                pool: PoolKind::Gpu,
                needed: 2,
                capacity: 3,
            },
        });
        payload(&cmd.to_bytes(fp)).to_vec()
    };
    // Its reason's tag (1) and pool (0) follow the id, after 33 bytes of preamble and lists.
    assert_eq!(one_refusal[33 + 8..33 + 10], [1, 0]);
    let cases: [(Vec<u8>, &str, &str); 8] = [
        // transfer_id's presence flag 2.
        (
            [&empty[..8], &[2][..], &empty[9..]].concat(),
            "transfer_id",
            "0 or 1",
        ),
        // fully_resident 7.
        (
            [&empty[..41], &[7][..], &empty[42..]].concat(),
            "fully_resident",
            "0 or 1",
        ),
        // A request's fully_resident 0xff.
        (
            [&one_request[..37], &[0xff][..], &one_request[38..]].concat(),
            "scheduled",
            "0 or 1",
        ),
        // A refusal reason tag the format does not define.
        (
            [&one_refusal[..41], &[9][..], &one_refusal[42..]].concat(),
            "refused",
            "does not define",
        ),
        // A pool other than the GPU's or the host's.
        (
            [&one_refusal[..42], &[2][..], &one_refusal[43..]].concat(),
            "refused",
            "a pool other than",
        ),
        // A byte after the last field.
        ([&empty[..], &[0][..]].concat(), "payload", "left after"),
        // The payload ends inside a field: half of indexer_backups' count.
        (
            empty[..empty.len() - 4].to_vec(),
            "indexer_backups",
            "ends inside",
        ),
        // The payload ends inside the first field.
        (vec![0; 5], "step", "ends inside"),
    ];
    for (body, field, problem) in cases {
        let blob = frame(MessageKind::Command, WIRE_VERSION, fp.as_u64(), &body);
        match OffloadCommand::from_bytes(&blob, fp) {
            Err(
                e @ WireError::Malformed {
                    kind: MessageKind::Command,
                    field: f,
                    problem: p,
                },
            ) => {
                assert_eq!(f, field, "{e}");
                assert!(p.contains(problem), "{e}");
            }
            other => panic!("{field}/{problem}: {other:?}"),
        }
    }
}

/// Random byte strings (a fixed seed): raw, and behind a valid header with a resealed
/// checksum so they reach the payload decoder. Nothing panics; nothing decodes but canonical
/// bytes.
#[test]
fn random_bytes_never_panic() {
    let fp = tiny_layout(40, true).fingerprint();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut decoded = 0u32;
    for i in 0..20_000 {
        let len = (next() % 96) as usize;
        // Mostly zeros, so counts are often plausible and payloads sometimes valid.
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let r = next();
                if r % 8 == 0 { (r >> 8) as u8 } else { 0 }
            })
            .collect();
        for kind in MessageKind::ALL {
            assert!(decode(kind, &bytes, fp).is_err(), "raw bytes #{i} decoded");
            let blob = frame(kind, WIRE_VERSION, fp.as_u64(), &bytes);
            match kind {
                MessageKind::Command => {
                    if let Ok(cmd) = OffloadCommand::from_bytes(&blob, fp) {
                        assert_eq!(cmd.to_bytes(fp), blob);
                        decoded += 1;
                    }
                }
                MessageKind::WorkerReport => {
                    if let Ok(r) = WorkerReport::from_bytes(&blob, fp) {
                        assert_eq!(r.to_bytes(fp), blob);
                        decoded += 1;
                    }
                }
            }
        }
    }
    // Some random payloads are valid messages: the loop reached past the parser's first checks.
    assert!(decoded > 0);
}

#[test]
fn every_error_is_an_invalid_argument_with_a_message() {
    let fp = tiny_layout(40, true).fingerprint();
    let blob = rich_command().to_bytes(fp);
    let mut corrupted = blob.clone();
    corrupted[30] ^= 4;
    for bytes in [&blob[..10], &corrupted[..], b"not hisparse at all"] {
        let err = OffloadCommand::from_bytes(bytes, fp).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().starts_with("command: "), "{err}");
    }
    let err = OffloadCommand::from_bytes(&corrupted, fp).unwrap_err();
    assert!(err.to_string().contains("corrupted"), "{err}");
}
