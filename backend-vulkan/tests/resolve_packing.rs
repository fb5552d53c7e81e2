//! Resolve with an odd number of hot slots and several requests per call: the `u16` LRU rows of
//! neighbouring requests then share 32-bit words, which the shader updates with atomics. Checked
//! bit-exactly against the core reference over several steps, with shuffled and padding rows, a
//! corrupt LRU, duplicates, resident pages, host blocks beyond the pool and cached rows beyond it.
//! Every resolver runs it: the one-dispatch kernel (workgroup mode with the device's hash table,
//! with the 32 KiB one, with plain scans, and global mode) and the portable two-pass kernel.

use hisparse_backend_vulkan::{
    ResolveKernel, TestShape, VulkanBuffer, VulkanDevice, VulkanOptions,
};
use hisparse_conformance::SplitMix64;
use hisparse_conformance::check::device_or_skip;
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::{ResolveArgs, ResolveDesc, ResolveSlices};
use hisparse_core::{Device, Error, ErrorKind};

fn bytes_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn bytes_u16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_ne_bytes([c[0], c[1]]))
        .collect()
}

fn upload(dev: &VulkanDevice, data: &[u8]) -> VulkanBuffer {
    let mut b = dev.alloc(data.len()).expect("alloc");
    dev.upload(&mut b, 0, data).expect("upload");
    b
}

fn download(dev: &VulkanDevice, b: &VulkanBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    dev.download(b, 0, &mut v).expect("download");
    v
}

#[test]
fn odd_hot_slots_with_neighbouring_requests_match_the_reference() {
    let plain = TestShape {
        no_subgroups: true,
        ..TestShape::default()
    };
    let small = TestShape {
        workgroup_memory: Some(32 << 10),
        ..TestShape::default()
    };
    let runs = [
        ("workgroup", TestShape::default(), ResolveKernel::Workgroup),
        ("workgroup, 32 KiB", small, ResolveKernel::Workgroup),
        ("workgroup, plain scans", plain, ResolveKernel::Workgroup),
        ("global mode", TestShape::default(), ResolveKernel::Global),
        ("portable", TestShape::default(), ResolveKernel::Portable),
    ];
    for (what, shape, kernel) in runs {
        let opened = VulkanDevice::open_shaped("", &VulkanOptions::default(), shape);
        let Some(dev) = device_or_skip(opened).expect("open") else {
            return;
        };
        match dev.set_resolve_kernel(kernel) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                eprintln!("SKIPPED ({what}): {e}");
                continue;
            }
            Err(e) => panic!("{what}: {e}"),
        }
        eprintln!("resolver: {what}");
        check(&dev, what);
    }
}

fn check(dev: &VulkanDevice, what: &str) {
    let stream = dev.create_stream().expect("stream");
    for (seed, hot_slots) in [(1u64, 67u32), (2, 33), (3, 17)] {
        let mut rng = SplitMix64::new(seed);
        let (k, r, m, bs) = (16u32, 5u32, 8u32, 4u32);
        let rows_per_req = 2u32;
        let t = r * rows_per_req + 2;
        let desc = ResolveDesc {
            num_tokens: t,
            top_k: k,
            num_requests: r,
            max_pages: m,
            block_size: bs,
            hot_slots,
            attention_block_stride: 5,
            host_num_blocks: 10,
            num_state_rows: None,
            stats_slot: 0,
        };
        let n = (r * hot_slots) as usize;
        let width = desc.hot_table_width() as usize;
        let resident: Vec<i32> = (0..r * m)
            .map(|_| {
                if rng.below(4) == 0 {
                    1 + rng.below(30) as i32
                } else {
                    0
                }
            })
            .collect();
        let host: Vec<i32> = (0..r * m).map(|_| rng.below(13) as i32).collect();
        let hot: Vec<i32> = (0..r as usize * width).map(|i| 40 + i as i32).collect();
        let mut slot_host_rows = vec![-1i32; n];
        let mut lru: Vec<u16> = (0..r).flat_map(|_| 0..hot_slots as u16).collect();
        // Request 3 starts corrupt: a duplicate slot and garbage contents.
        let base = 3 * hot_slots as usize;
        lru[base + 1] = lru[base];
        for d in &mut slot_host_rows[base..base + hot_slots as usize] {
            *d = rng.below(50) as i32;
        }
        // Request 1 has a valid LRU but its slot_host_rows names rows, some beyond the pool (40..50),
        // and some twice: only in-pool rows may hit, the first in LRU order.
        let base = hot_slots as usize;
        for d in &mut slot_host_rows[base..base + hot_slots as usize] {
            *d = rng.below(50) as i32;
        }
        let b_res = upload(dev, &bytes_i32(&resident));
        let b_host = upload(dev, &bytes_i32(&host));
        let b_hot = upload(dev, &bytes_i32(&hot));
        let mut b_slot_host_rows = upload(dev, &bytes_i32(&slot_host_rows));
        let mut b_lru = upload(dev, &bytes_u16(&lru));
        let tk = (t * k) as usize;
        let mut outs: Vec<VulkanBuffer> = [tk, t as usize, t as usize, t as usize, tk, tk]
            .iter()
            .map(|&e| dev.alloc(e * 4).expect("alloc"))
            .collect();
        for step in 0..6 {
            let mut req: Vec<i32> = (0..r as i32)
                .flat_map(|q| std::iter::repeat_n(q, rows_per_req as usize))
                .chain([-1, r as i32 + 3])
                .collect();
            rng.shuffle(&mut req);
            let topk: Vec<i32> = (0..tk)
                .map(|i| match rng.below(10) {
                    0 => -1,
                    1 => (m * bs) as i32 + 3,
                    2 if i > 0 => i as i32 % 7,
                    _ => rng.below(u64::from(m * bs)) as i32,
                })
                .collect();
            let (mut idx, mut valid, mut hits, mut misses, mut src, mut dst) = (
                vec![0; tk],
                vec![0; t as usize],
                vec![0; t as usize],
                vec![0; t as usize],
                vec![0; tk],
                vec![0; tk],
            );
            resolve(
                &desc,
                ResolveSlices {
                    req_id: &req,
                    topk: &topk,
                    resident_table: &resident,
                    host_table: &host,
                    hot_table: &hot,
                    slot_host_rows: &mut slot_host_rows,
                    lru: &mut lru,
                    indices: &mut idx,
                    valid_counts: &mut valid,
                    hit_counts: &mut hits,
                    miss_counts: &mut misses,
                    miss_src: &mut src,
                    miss_dst: &mut dst,
                    idx_mapping: None,
                    stats: None,
                },
            )
            .expect("reference");
            let b_req = upload(dev, &bytes_i32(&req));
            let b_topk = upload(dev, &bytes_i32(&topk));
            let [o_idx, o_valid, o_hits, o_misses, o_src, o_dst] = &mut outs[..] else {
                unreachable!()
            };
            dev.resolve(
                &stream,
                &desc,
                ResolveArgs {
                    req_id: &b_req,
                    topk: &b_topk,
                    resident_table: &b_res,
                    host_table: &b_host,
                    hot_table: &b_hot,
                    slot_host_rows: &mut b_slot_host_rows,
                    lru: &mut b_lru,
                    indices: o_idx,
                    valid_counts: o_valid,
                    hit_counts: o_hits,
                    miss_counts: o_misses,
                    miss_src: o_src,
                    miss_dst: o_dst,
                    idx_mapping: None,
                    stats: None,
                },
            )
            .expect("resolve");
            let ctx = format!("{what}: hot_slots {hot_slots}, step {step}");
            assert_eq!(i32s(&download(dev, &outs[0])), idx, "indices, {ctx}");
            assert_eq!(i32s(&download(dev, &outs[1])), valid, "valid, {ctx}");
            assert_eq!(i32s(&download(dev, &outs[2])), hits, "hits, {ctx}");
            assert_eq!(i32s(&download(dev, &outs[3])), misses, "misses, {ctx}");
            assert_eq!(i32s(&download(dev, &outs[4])), src, "miss_src, {ctx}");
            assert_eq!(i32s(&download(dev, &outs[5])), dst, "miss_dst, {ctx}");
            assert_eq!(
                i32s(&download(dev, &b_slot_host_rows)),
                slot_host_rows,
                "slot_host_rows, {ctx}"
            );
            assert_eq!(u16s(&download(dev, &b_lru)), lru, "lru, {ctx}");
        }
    }
}
