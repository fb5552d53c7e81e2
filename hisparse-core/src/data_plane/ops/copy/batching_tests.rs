//! The copy-conflict rule against sequential copies.

use super::*;
use alloc::vec::Vec;

/// Applies one tile: each part read, then written.
fn apply(t: &CopyFootprint, buf: &mut [u8], src_buf: &[u8], same_buffer: bool) {
    for (s, d) in t.src.iter().zip(&t.dst) {
        let (s, d, n) = (s.start as usize, d.start as usize, s.len as usize);
        if same_buffer {
            buf.copy_within(s..s + n, d);
        } else {
            buf[d..d + n].copy_from_slice(&src_buf[s..s + n]);
        }
    }
}

/// Runs each batch in two of the orders a device may pick — every tile reading before any
/// writes, and the tiles one by one in reverse — and compares both with applying the tiles
/// one by one in order (the reference). Returns the number of batches.
fn check(len: usize, tiles: &[CopyFootprint], same_buffer: bool) -> usize {
    let batches = copy_batches(tiles, same_buffer);
    let covered: usize = batches.iter().map(|b| b.len()).sum();
    assert_eq!(covered, tiles.len(), "every tile in exactly one batch");
    assert!(batches.iter().all(|b| !b.is_empty()));
    let src_buf: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7)).collect();
    let start: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut want = start.clone();
    for t in tiles {
        apply(t, &mut want, &src_buf, same_buffer);
    }
    let (mut reads_first, mut reversed) = (start.clone(), start);
    for b in &batches {
        let batch = &tiles[b.clone()];
        let reads: Vec<Vec<u8>> = batch
            .iter()
            .flat_map(|t| t.src.iter())
            .map(|s| {
                let from = if same_buffer { &reads_first } else { &src_buf };
                from[s.start as usize..s.end() as usize].to_vec()
            })
            .collect();
        for (bytes, d) in reads.iter().zip(batch.iter().flat_map(|t| t.dst.iter())) {
            reads_first[d.start as usize..d.end() as usize].copy_from_slice(bytes);
        }
        for t in batch.iter().rev() {
            apply(t, &mut reversed, &src_buf, same_buffer);
        }
    }
    assert_eq!(
        reads_first, want,
        "reads first: batches {batches:?} of {tiles:?}"
    );
    assert_eq!(reversed, want, "reversed: batches {batches:?} of {tiles:?}");
    batches.len()
}

#[test]
fn independent_tiles_form_one_batch() {
    let tiles: Vec<CopyFootprint> = (0..8)
        .map(|i| CopyFootprint::contiguous(i * 16, 128 + i * 16, 16))
        .collect();
    assert_eq!(check(256, &tiles, true), 1);
    assert_eq!(check(256, &tiles, false), 1);
    assert!(copy_batches(&[], true).is_empty());
}

#[test]
fn a_repeated_destination_starts_a_new_batch() {
    let tiles = [
        CopyFootprint::contiguous(0, 64, 16),
        CopyFootprint::contiguous(16, 72, 16),
        CopyFootprint::contiguous(32, 200, 16),
    ];
    assert_eq!(copy_batches(&tiles, false), [0..1, 1..3]);
    assert_eq!(check(256, &tiles, false), 2);
}

#[test]
fn chains_in_one_buffer_run_in_order() {
    // Copy-on-write chain 1 -> 2 -> 3: the second copy reads what the first writes.
    let page = 16;
    let tiles = [
        CopyFootprint::contiguous(page, 2 * page, page),
        CopyFootprint::contiguous(2 * page, 3 * page, page),
        CopyFootprint::contiguous(5 * page, 6 * page, page),
    ];
    assert_eq!(copy_batches(&tiles, true), [0..1, 1..3]);
    assert_eq!(check(128, &tiles, true), 2);
    // Between two buffers the same offsets are independent.
    assert_eq!(check(128, &tiles, false), 1);
    // Writing what an earlier tile of the batch reads (an anti-dependence) splits too.
    let war = [
        CopyFootprint::contiguous(32, 0, 16),
        CopyFootprint::contiguous(64, 32, 16),
    ];
    assert_eq!(copy_batches(&war, true), [0..1, 1..2]);
    assert_eq!(check(128, &war, true), 2);
}

#[test]
fn split_parts_and_empty_ranges() {
    let t = |v: u64, s: u64, dv: u64, ds: u64| CopyFootprint {
        src: [ByteRange::new(v, 16), ByteRange::new(s, 16)],
        dst: [ByteRange::new(dv, 16), ByteRange::new(ds, 16)],
    };
    // The scale parts collide while the value parts do not.
    let tiles = [t(0, 100, 200, 300), t(16, 116, 216, 308)];
    assert_eq!(copy_batches(&tiles, false), [0..1, 1..2]);
    assert_eq!(check(400, &tiles, false), 2);
    // Empty parts never conflict.
    let empty = [
        CopyFootprint::contiguous(0, 64, 0),
        CopyFootprint::contiguous(0, 64, 0),
        CopyFootprint::contiguous(0, 64, 16),
    ];
    let batches = copy_batches(&empty, true);
    assert_eq!((batches.len(), batches[0].clone()), (1, 0..3));
}

#[test]
fn random_lists_match_sequential_order() {
    let mut x = 0x1234_5678_u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for round in 0..300 {
        let same = round % 2 == 0;
        let n = 1 + next(12) as usize;
        let mut tiles = Vec::new();
        for _ in 0..n {
            let len = 16 * (1 + next(3));
            let (s, d) = (16 * next(14), 16 * next(14));
            // Within one buffer, a tile's own source and destination are equal or disjoint.
            if same && s != d && s < d + len && d < s + len {
                continue;
            }
            tiles.push(CopyFootprint::contiguous(s, d, len));
        }
        check(16 * 18, &tiles, same);
    }
}
