//! Host time of a decode-path call before its driver call: the core's checks of a
//! `resolve_and_gather` (both halves), the planner's launch (shape, workspace, arguments packed
//! against the ABI table) and the argument pointers a backend hands the driver — everything the
//! CUDA and ROCm backends do on the host for one call besides `cuLaunchKernel`/
//! `hipModuleLaunchKernel` (and `cuCtxSetCurrent`). Prints the median of 25 rounds of 20,000
//! calls, in microseconds per call, for 1, 16, 64 and 256 requests of top-k 2048 over 4096 hot
//! slots on an H200's limits.
//!
//! `cargo run --release -p hisparse-gpu-kernels --example host_cost`

use std::hint::black_box;
use std::time::Instant;

use hisparse_core::ops::swap_in::check;
use hisparse_core::ops::{LayerPair, PageLayout, ResolveDesc, ResolveSizes};
use hisparse_gpu_kernels::plan::{self, ResolveAddrs, Target};

const H200: Target = Target {
    multiprocessors: 132,
    shared_per_block: 227 * 1024,
    shared_per_multiprocessor: 228 * 1024,
    resolve_blocks_per_multiprocessor: 1,
};

fn main() {
    let page = 64 * 656u64;
    let layers = [LayerPair {
        host: PageLayout::contiguous(0, page, 1 << 16, 64, 656),
        device: PageLayout::contiguous(0, page, 1 << 14, 64, 656),
    }];
    for requests in [1u32, 16, 64, 256] {
        let d = ResolveDesc {
            num_tokens: requests,
            top_k: 2048,
            num_requests: requests,
            max_pages: 2048,
            block_size: 64,
            hot_slots: 4096,
            attention_block_stride: 64,
            host_num_blocks: 1 << 16,
            num_state_rows: None,
            stats_slot: 3,
        };
        let (t, tk) = (u64::from(requests) * 4, u64::from(requests) * 2048 * 4);
        let sizes = ResolveSizes {
            req_id: t,
            topk: tk,
            resident_table: u64::from(requests) * 2048 * 4,
            host_table: u64::from(requests) * 2048 * 4,
            hot_table: u64::from(requests) * 64 * 4,
            slot_host_rows: u64::from(requests) * 4096 * 4,
            lru: u64::from(requests) * 4096 * 2,
            indices: tk,
            valid_counts: t,
            hit_counts: t,
            miss_counts: t,
            miss_src: tk,
            miss_dst: tk,
            idx_mapping: None,
            stats: Some(1024),
        };
        let addrs = ResolveAddrs {
            req_id: 1 << 20,
            stats: Some(2 << 20),
            ..ResolveAddrs::default()
        };
        let pool = (1u64 << 16) * page;
        let one = || {
            check(&d, &sizes, &layers, pool, pool).expect("valid call");
            let mut p = if plan::swap_in_fused(&d, &layers, plan::GatherWalk::Auto) {
                plan::resolve_gather(&H200, &d, &addrs, &layers, 4 << 20, 8 << 20, false)
            } else {
                plan::resolve(&H200, &d, &addrs, false)
            }
            .expect("planned");
            for l in &mut p.launches {
                l.args.resolve(&[], 16 << 20, 32 << 20).expect("placed");
                black_box(l.args.pointers().expect("pointers"));
            }
            black_box(p);
        };
        let mut rounds: Vec<f64> = (0..25)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..20_000 {
                    one();
                }
                start.elapsed().as_secs_f64() * 1e6 / 20_000.0
            })
            .collect();
        rounds.sort_by(f64::total_cmp);
        println!(
            "{requests:>4} requests: {:.3} us per call on the host before the driver (median of 25 rounds)",
            rounds[rounds.len() / 2]
        );
    }
}
