//! The reference copies on small pools.

use super::*;
use crate::error::{OpError, OpName};

fn split_layer() -> LayerPair {
    // 2 rows per page, 32-byte rows: 16 value + 16 scale bytes; device blocks hold 2 layers.
    let host = PageLayout {
        base: 0,
        block_stride: 64,
        num_blocks: 3,
        block_size: 2,
        row_bytes: 32,
        value_bytes: 16,
        index_stride_rows: 2,
    };
    let device = PageLayout {
        block_stride: 128,
        index_stride_rows: 4,
        num_blocks: 2,
        ..host
    };
    LayerPair { host, device }
}

fn pattern(len: usize) -> alloc_free::Buf {
    let mut b = alloc_free::Buf([0; 256]);
    for (i, x) in b.0[..len].iter_mut().enumerate() {
        *x = (i as u8).wrapping_add(1);
    }
    b
}

mod alloc_free {
    pub struct Buf(pub [u8; 256]);
}

/// `row_parts` and `page_offset` are public: on a layout `check` refuses (scale part of
/// negative size, a base or stride at the end of the address space) they answer without
/// overflowing or panicking, and their checked forms say which field is wrong.
#[test]
fn page_layout_helpers_never_panic_on_invalid_layouts() {
    let bad = [
        PageLayout {
            value_bytes: 32,
            row_bytes: 16,
            ..PageLayout::contiguous(0, 64, 4, 4, 16)
        },
        PageLayout::contiguous(u64::MAX - 8, u64::MAX, u32::MAX, u32::MAX, u32::MAX),
        PageLayout::contiguous(0, u64::MAX / 2, 4, 4, 16),
    ];
    for l in bad {
        for (block, offset) in [(0, 0), (3, 3), (u32::MAX, u32::MAX)] {
            let _ = l.page_offset(block);
            let _ = l.row_parts(block, offset);
            let _ = l.checked_page_offset(OpName::CopyRows, block);
            let _ = l.checked_row_parts(OpName::CopyRows, block, offset);
            if block >= l.num_blocks {
                assert!(l.checked_page_offset(OpName::CopyRows, block).is_err());
            }
        }
    }
    let e = bad[1]
        .checked_row_parts(OpName::CopyRows, 0, 0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::Overflow {
                field: "layout",
                ..
            }
        ),
        "{e:?}"
    );
    let e = bad[0]
        .checked_row_parts(OpName::CopyRows, 0, 0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::OutOfRange {
                field: "layout.value_bytes",
                ..
            }
        ),
        "{e:?}"
    );
    let e = bad[2]
        .checked_page_offset(OpName::CopyPages, 3)
        .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::Overflow {
                field: "layout",
                ..
            }
        ),
        "{e:?}"
    );
    let e = bad[2]
        .checked_row_parts(OpName::CopyRows, 1, 4)
        .unwrap_err();
    assert!(
        matches!(
            e,
            OpError::OutOfRange {
                field: "offset",
                ..
            }
        ),
        "{e:?}"
    );
    // On a valid layout the checked forms agree with the plain ones.
    let l = split_layer().host;
    assert_eq!(
        l.checked_row_parts(OpName::CopyRows, 1, 1),
        Ok(l.row_parts(1, 1))
    );
    assert_eq!(
        l.checked_page_offset(OpName::CopyRows, 1),
        Ok(l.page_offset(1))
    );
}

#[test]
fn split_rows_are_addressed_by_part() {
    let l = split_layer();
    assert_eq!(l.host.row_parts(1, 1), [(64 + 16, 16), (64 + 32 + 16, 16)]);
    assert_eq!(l.device.locate(5), Some((1, 1)));
    assert_eq!(
        l.device.locate(6),
        None,
        "offset 2 belongs to another layer"
    );
    assert_eq!(l.device.locate(8), None, "block 2 is beyond the pool");
    assert_eq!(l.host.locate(-1), None);
}

#[test]
fn gather_copies_parts_zero_fills_and_skips() {
    let l = split_layer();
    let host = pattern(192);
    let mut dev = [0xAAu8; 256];
    let layers = [l];
    let desc = GatherDesc {
        num_tokens: 1,
        top_k: 4,
        layers: &layers,
    };
    // host row 3 = block 1 offset 1 -> device row 1 (block 0 offset 1);
    // src -1 -> zero-fill device row 4 (block 1 offset 0); dst 6 is skipped; count 3 ignores the 4th.
    gather_rows(
        &desc,
        GatherArgs {
            plan_src: &[3, -1, 0, 0],
            plan_dst: &[1, 4, 6, 0],
            plan_counts: &[3],
            host: &host.0[..192],
            device: &mut dev[..],
        },
    )
    .unwrap();
    assert_eq!(dev[16..32], host.0[80..96]);
    assert_eq!(dev[48..64], host.0[112..128]);
    assert!(dev[128..144].iter().all(|&b| b == 0));
    assert!(dev[160..176].iter().all(|&b| b == 0));
    assert!(
        dev[0..16].iter().all(|&b| b == 0xAA),
        "4th entry is beyond the count"
    );
}

#[test]
fn page_copies_round_trip_and_reject_bad_pairs() {
    let l = split_layer();
    let layers = [l];
    let mut host = [0u8; 192];
    let mut dev = pattern(256).0;
    let back = PageCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    copy_pages(&back, &[BlockPair { src: 1, dst: 2 }], &mut host, &mut dev).unwrap();
    assert_eq!(host[128..192], dev[128..192]);
    let err = copy_pages(&back, &[BlockPair { src: 2, dst: 0 }], &mut host, &mut dev);
    assert!(matches!(
        err,
        Err(OpError::ElementOutOfRange {
            field: "src",
            value: 2,
            ..
        })
    ));
    let mut dev2 = [0u8; 256];
    let restore = PageCopyDesc {
        direction: Direction::HostToDevice,
        layers: &layers,
    };
    copy_pages(
        &restore,
        &[BlockPair { src: 2, dst: 0 }],
        &mut host,
        &mut dev2,
    )
    .unwrap();
    assert_eq!(dev2[0..64], dev[128..192]);
}

#[test]
fn row_spans_and_host_copy_on_write() {
    let l = split_layer();
    let layers = [l];
    let mut host = [0u8; 192];
    let mut dev = pattern(256).0;
    let desc = RowCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    let span = RowSpan {
        device_block: 0,
        host_block: 1,
        first_row: 1,
        num_rows: 1,
    };
    copy_rows(&desc, &[span], &mut host, &mut dev).unwrap();
    assert_eq!(host[80..96], dev[16..32]);
    assert_eq!(host[112..128], dev[48..64]);
    assert!(host[64..80].iter().all(|&b| b == 0));
    let bad = RowSpan {
        num_rows: 2,
        ..span
    };
    assert!(copy_rows(&desc, &[bad], &mut host, &mut dev).is_err());
    copy_host_pages(&[l.host], &[BlockPair { src: 1, dst: 2 }], &mut host).unwrap();
    let copy = host;
    assert_eq!(host[128..192], copy[64..128]);
    assert!(copy_host_pages(&[l.host], &[BlockPair { src: 1, dst: 1 }], &mut host).is_err());
}

#[test]
fn layouts_reject_misalignment_and_short_buffers() {
    let l = split_layer();
    // A split row's scale part is a multiple of 4 bytes (DeepSeek V4: 8), its value part
    // of 16; a contiguous row a multiple of 16.
    for (row_bytes, value_bytes, ok) in [(24, 16, true), (22, 16, false), (40, 24, false)] {
        let l = PageLayout {
            row_bytes,
            value_bytes,
            ..l.host
        };
        let r = l.check(OpName::CopyPages, "host", 1 << 20);
        assert_eq!(r.is_ok(), ok, "{row_bytes}/{value_bytes}: {r:?}");
        if !ok {
            assert!(matches!(r, Err(OpError::Misaligned { .. })), "{r:?}");
        }
    }
    let contiguous = PageLayout {
        row_bytes: 24,
        value_bytes: 24,
        ..l.host
    };
    assert!(matches!(
        contiguous.check(OpName::CopyPages, "host", 1 << 20),
        Err(OpError::Misaligned { .. })
    ));
    assert!(matches!(
        l.host.check(OpName::CopyPages, "host", 191),
        Err(OpError::BufferTooSmall { needed: 192, .. })
    ));
}
