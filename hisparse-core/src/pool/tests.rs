//! The pool's rules, on the heap and in arrays.

#[cfg(feature = "alloc")]
use super::storage::Slices;
use super::*;
#[cfg(feature = "alloc")]
use std::vec::Vec;

fn key(h: u64) -> BlockKey {
    BlockKey { group: 0, hash: h }
}

#[cfg(feature = "alloc")]
#[test]
fn lru_order_and_null() {
    let mut p = BlockPool::new(5).unwrap();
    assert_eq!(p.num_free(), 4);
    let a: Vec<u32> = (0..4).map(|_| p.allocate().unwrap()).collect();
    assert_eq!(a, [1, 2, 3, 4]);
    assert_eq!(p.allocate(), None);
    p.free_reverse(&[1, 0, 3]).unwrap();
    // Reverse: 3 then 1 at the tail.
    assert_eq!(p.allocate(), Some(3));
    assert_eq!(p.allocate(), Some(1));
    assert_eq!(p.free(0), Err(PoolError::NullBlock));
    assert_eq!(
        p.free(9),
        Err(PoolError::OutOfRange {
            block: 9,
            num_blocks: 5
        })
    );
    p.free(2).unwrap();
    assert_eq!(p.free(2), Err(PoolError::DoubleFree { block: 2 }));
    p.check_invariants().unwrap();
    let mut out = Vec::new();
    assert_eq!(
        p.allocate_n(2, &mut out),
        Err(PoolError::OutOfBlocks {
            requested: 2,
            free: 1
        })
    );
    assert!(out.is_empty());
    assert_eq!(BlockPool::new(0).unwrap_err(), PoolError::Empty);
    let mut one = BlockPool::new(1).unwrap();
    assert_eq!(one.allocate(), None);
    one.check_invariants().unwrap();
}

#[cfg(feature = "alloc")]
#[test]
fn refcounts_touch_and_prefix_cache() {
    let mut p = BlockPool::new(4).unwrap();
    let b = p.allocate().unwrap();
    assert!(p.cache(b, key(7)).unwrap());
    assert!(!p.cache(b, key(8)).unwrap());
    p.touch(b).unwrap();
    assert_eq!(p.ref_count(b), 2);
    p.free(b).unwrap();
    assert!(!p.is_free(b));
    p.free(b).unwrap();
    assert!(p.is_free(b));
    // Free but cached: still found; touch re-pins it.
    assert_eq!(p.lookup(key(7)), Some(b));
    p.touch(b).unwrap();
    assert_eq!(p.num_free(), 2);
    p.free(b).unwrap();
    // Reuse evicts: b is at the tail, so allocate the two others first.
    let x = p.allocate().unwrap();
    let y = p.allocate().unwrap();
    assert_ne!(x, b);
    assert_ne!(y, b);
    assert_eq!(p.allocate(), Some(b));
    assert_eq!(p.lookup(key(7)), None);
    assert_eq!(p.num_cached(), 0);
    assert_eq!(p.cache(3, key(1)).err(), None);
    p.check_invariants().unwrap();
}

#[cfg(feature = "alloc")]
#[test]
fn touch_refuses_a_reference_count_overflow() {
    let mut p = BlockPool::new(3).unwrap();
    let b = p.allocate().unwrap();
    // 2^32 - 2 touches would take minutes; set the count the way they would leave it.
    p.store.nodes_mut()[b as usize].refs = u32::MAX - 1;
    p.touch(b).unwrap();
    assert_eq!(p.ref_count(b), u32::MAX);
    assert_eq!(p.touch(b), Err(PoolError::TooManyReferences { block: b }));
    assert_eq!(p.ref_count(b), u32::MAX, "a refused touch changes nothing");
    p.check_invariants().unwrap();
    assert!(std::format!("{}", PoolError::TooManyReferences { block: b }).contains("free"));
}

#[cfg(feature = "alloc")]
#[test]
fn hash_table_survives_churn() {
    let n = 64u32;
    let mut p = BlockPool::new(n).unwrap();
    let mut held = Vec::new();
    let mut s = 1u64;
    for round in 0..2000u64 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if !s.is_multiple_of(3) {
            if let Some(b) = p.allocate() {
                // Few distinct hashes force collisions and probe chains.
                let _ = p.cache(b, key(s % 97)).unwrap();
                held.push(b);
            }
        } else if !held.is_empty() {
            let b = held.swap_remove((s as usize / 3) % held.len());
            p.free(b).unwrap();
        }
        if round % 50 == 0 {
            p.check_invariants().unwrap();
        }
    }
    p.check_invariants().unwrap();
}

#[cfg(feature = "alloc")]
#[test]
fn generation_changes_exactly_when_a_block_leaves_the_free_queue() {
    let mut p = BlockPool::new(4).unwrap();
    let b = p.allocate().unwrap();
    let g = p.generation(b);
    p.free(b).unwrap();
    // Freeing keeps it: a reader of the freed bytes sees the block untouched.
    assert_eq!(p.generation(b), g);
    // Re-pinning a free block changes it.
    p.touch(b).unwrap();
    assert_ne!(p.generation(b), g);
    // A second reference to a held block does not.
    let g = p.generation(b);
    p.touch(b).unwrap();
    assert_eq!(p.generation(b), g);
    p.free(b).unwrap();
    p.free(b).unwrap();
    assert_eq!(p.generation(b), g);
    // Handing it out again changes it, one at a time or in a batch.
    let mut out = Vec::new();
    p.allocate_n(3, &mut out).unwrap();
    assert!(out.contains(&b));
    assert_ne!(p.generation(b), g);
    let g = p.generation(b);
    p.free(b).unwrap();
    p.bump_generation(b).unwrap();
    assert_ne!(p.generation(b), g);
    assert!(p.is_free(b));
    assert_eq!(p.bump_generation(0), Err(PoolError::NullBlock));
    assert!(p.bump_generation(9).is_err());
    assert_eq!(p.generation(9), 0);
    p.check_invariants().unwrap();
}

/// A fixed pool of 16 blocks at most, as firmware would declare it.
type Fixed = FixedBlockPool<16, { key_slots(16) }>;

#[test]
fn fixed_pool_keeps_the_rules_without_an_allocator() {
    let mut p = Fixed::new(5).unwrap();
    assert_eq!((p.num_blocks(), p.num_free()), (5, 4));
    let mut a = [0u32; 4];
    p.allocate_into(&mut a).unwrap();
    assert_eq!(a, [1, 2, 3, 4]);
    assert_eq!(p.allocate(), None);
    let mut more = [7u32; 1];
    assert_eq!(
        p.allocate_into(&mut more),
        Err(PoolError::OutOfBlocks {
            requested: 1,
            free: 0
        })
    );
    assert_eq!(more, [7], "a refused allocation writes nothing");
    assert!(p.cache(3, key(9)).unwrap());
    p.free_reverse(&[1, 0, 3]).unwrap();
    // Reverse: 3 then 1 at the tail; 3 still found by its key until reused.
    assert_eq!(p.lookup(key(9)), Some(3));
    let g = p.generation(3);
    assert_eq!(p.allocate(), Some(3));
    assert_ne!(p.generation(3), g);
    assert_eq!(p.lookup(key(9)), None);
    assert_eq!(p.allocate(), Some(1));
    assert_eq!(p.free(0), Err(PoolError::NullBlock));
    assert_eq!(
        p.free(5),
        Err(PoolError::OutOfRange {
            block: 5,
            num_blocks: 5
        })
    );
    p.free(2).unwrap();
    assert_eq!(p.free(2), Err(PoolError::DoubleFree { block: 2 }));
    p.check_invariants().unwrap();
}

#[test]
fn fixed_pool_refuses_more_blocks_than_it_holds() {
    assert_eq!(Fixed::new(0).unwrap_err(), PoolError::Empty);
    assert_eq!(
        Fixed::new(17).unwrap_err(),
        PoolError::OverCapacity {
            num_blocks: 17,
            capacity: 16
        }
    );
    let e = std::format!("{}", Fixed::new(17).unwrap_err());
    assert!(
        e.contains("17") && e.contains("16") && e.contains("BLOCKS"),
        "{e}"
    );
    let mut full = Fixed::new(16).unwrap();
    assert_eq!(full.num_free(), 15);
    let mut all = [0u32; 15];
    full.allocate_into(&mut all).unwrap();
    for (b, key_hash) in all.iter().zip(0u64..) {
        assert!(full.cache(*b, key(key_hash)).unwrap());
    }
    assert_eq!(full.num_cached(), 15);
    full.check_invariants().unwrap();
}

/// The same calls on the heap pool and the fixed pool hand out the same blocks, keys and
/// generations: one set of rules over two storages.
#[cfg(feature = "alloc")]
#[test]
fn fixed_and_heap_pools_agree_call_for_call() {
    let n = 16u32;
    let mut heap = BlockPool::new(n).unwrap();
    let mut fixed = Fixed::new(n).unwrap();
    let mut held: Vec<u32> = Vec::new();
    let mut s = 7u64;
    for round in 0..3000u64 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        match s % 5 {
            0 | 1 => {
                let (a, b) = (heap.allocate(), fixed.allocate());
                assert_eq!(a, b, "round {round}");
                if let Some(b) = a {
                    let k = key(s % 23);
                    assert_eq!(heap.cache(b, k), fixed.cache(b, k));
                    held.push(b);
                }
            }
            2 if !held.is_empty() => {
                let b = held.swap_remove((s as usize / 5) % held.len());
                assert_eq!(heap.free(b), fixed.free(b));
            }
            3 => {
                let k = key(s % 23);
                let (a, b) = (heap.lookup(k), fixed.lookup(k));
                assert_eq!(a, b, "round {round}");
                if let Some(b) = a {
                    assert_eq!(heap.touch(b), fixed.touch(b));
                    held.push(b);
                }
            }
            _ => {
                let count = (s / 7 % 3) as usize;
                let mut out = Vec::new();
                let mut arr = [0u32; 2];
                let a = heap.allocate_n(count as u32, &mut out);
                assert_eq!(a, fixed.allocate_into(&mut arr[..count]));
                if a.is_ok() {
                    assert_eq!(out[..], arr[..count]);
                    held.extend_from_slice(&out);
                }
            }
        }
        for b in 0..n + 1 {
            assert_eq!(heap.ref_count(b), fixed.ref_count(b));
            assert_eq!(heap.generation(b), fixed.generation(b));
            assert_eq!(heap.key_of(b), fixed.key_of(b));
        }
        assert_eq!(heap.num_free(), fixed.num_free());
    }
    heap.check_invariants().unwrap();
    fixed.check_invariants().unwrap();
}
