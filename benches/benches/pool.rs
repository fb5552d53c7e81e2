//! Block pool throughput: single-block allocate + free pairs, and batched allocate / free of
//! 1024 blocks (contract §4; targets ≥ 50 M pairs/s and ≥ 200 M blocks/s on the 2-core development
//! machine), for a pool that fits the L2 cache (65 536 blocks, 1 MiB of block state) and one the
//! size of a DeepSeek V3.2 GPU pool on an H200 (262 144 blocks, 4 MiB). The LRU queue hands out
//! the least recently freed block, so these loops stream through every block of the pool.
//!
//! Beside them, the CPU-bound baseline: a plain `Vec` stack doing the same pushes and pops
//! (the cheapest possible free list, with no LRU order, reference counts or prefix cache).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hisparse_core::pool::BlockPool;

const BATCH: u32 = 1024;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    for size in [1u32 << 16, 1 << 18] {
        g.throughput(Throughput::Elements(1));
        let mut pool = BlockPool::new(size).expect("pool");
        g.bench_function(BenchmarkId::new("alloc_free_pair", size), |b| {
            b.iter(|| {
                let blk = pool.allocate().expect("free block");
                pool.free(black_box(blk)).expect("held");
            })
        });
        let mut stack: Vec<u32> = (1..size).collect();
        g.bench_function(BenchmarkId::new("baseline_vec_stack_pair", size), |b| {
            b.iter(|| {
                let blk = stack.pop().expect("free");
                stack.push(black_box(blk));
            })
        });
        g.throughput(Throughput::Elements(u64::from(BATCH)));
        let mut out = Vec::with_capacity(BATCH as usize);
        g.bench_function(
            BenchmarkId::new("batched_1024_alloc_then_free", size),
            |b| {
                b.iter(|| {
                    out.clear();
                    pool.allocate_n(BATCH, &mut out).expect("free blocks");
                    pool.free_reverse(black_box(&out)).expect("held");
                })
            },
        );
        g.bench_function(
            BenchmarkId::new("baseline_vec_stack_batched_1024", size),
            |b| {
                b.iter(|| {
                    out.clear();
                    let at = stack.len() - BATCH as usize;
                    out.extend(stack.drain(at..));
                    stack.extend(black_box(&out).iter().rev());
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
