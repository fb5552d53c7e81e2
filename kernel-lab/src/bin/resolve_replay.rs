//! Times resolves on states a run wrote out with the Vulkan option `dump-resolve`
//! (`VulkanOptions::dump_resolve`; the file format is in the backend's `dump` module): for each
//! file, the dumped `slot_host_rows` and LRU are uploaded again before every call, so each call does the
//! dumped call's work, on a GPU kept busy by nothing else. Device time from timestamps (median of
//! the calls), and the first call's hit, miss and valid counts per token row (the same for every
//! call).
//!
//! ```text
//! cargo run -p hisparse-kernel-lab --release --bin resolve_replay -- \
//!     [--calls N] [--json PATH] FILE...
//! ```

use hisparse_backend_vulkan::{VulkanBuffer, VulkanDevice, VulkanError};
use hisparse_core::Device;
use hisparse_core::ops::{ResolveArgs, ResolveDesc};

type Result<T> = core::result::Result<T, VulkanError>;

/// One dumped resolve: its descriptor and the bytes of each input.
struct Dumped {
    desc: ResolveDesc,
    /// req_id, topk, resident_table, host_table, slot_host_rows, lru, hot_table.
    parts: Vec<Vec<u8>>,
}

fn read(path: &str) -> core::result::Result<Dumped, String> {
    let b = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if b.len() < 36 {
        return Err(format!("{path}: shorter than the 36-byte header"));
    }
    let h: Vec<u32> = b[..36]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let desc = ResolveDesc {
        num_tokens: h[0],
        top_k: h[1],
        num_requests: h[2],
        max_pages: h[3],
        block_size: h[4],
        hot_slots: h[5],
        attention_block_stride: h[6],
        host_num_blocks: h[7],
        num_state_rows: None,
        stats_slot: 0,
    };
    let (t, k, r, m, n, w) = (
        h[0] as usize,
        h[1] as usize,
        h[2] as usize,
        h[3] as usize,
        h[5] as usize,
        h[8] as usize,
    );
    let sizes = [
        4 * t,
        4 * t * k,
        4 * r * m,
        4 * r * m,
        4 * r * n,
        2 * r * n,
        4 * r * w,
    ];
    if b.len() != 36 + sizes.iter().sum::<usize>() {
        return Err(format!(
            "{path}: {} bytes, the header describes {}",
            b.len(),
            36 + sizes.iter().sum::<usize>()
        ));
    }
    let mut at = 36;
    let parts = sizes
        .iter()
        .map(|&s| {
            at += s;
            b[at - s..at].to_vec()
        })
        .collect();
    Ok(Dumped { desc, parts })
}

fn upload(dev: &VulkanDevice, bytes: &[u8]) -> Result<VulkanBuffer> {
    let mut b = dev.alloc(bytes.len().max(4))?;
    dev.upload(&mut b, 0, bytes)?;
    Ok(b)
}

fn download_i32(dev: &VulkanDevice, b: &VulkanBuffer, n: usize) -> Result<Vec<i32>> {
    let mut v = vec![0i32; n];
    dev.download_i32(b, 0, &mut v)?;
    Ok(v)
}

fn main() {
    let mut calls = 50usize;
    let mut json = None;
    let mut files = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--calls" => match it.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0 => calls = v,
                _ => {
                    eprintln!("--calls needs a positive number");
                    std::process::exit(2);
                }
            },
            "--json" => json = it.next(),
            _ => files.push(a),
        }
    }
    if files.is_empty() {
        eprintln!("usage: resolve_replay [--calls N] [--json PATH] FILE...");
        std::process::exit(2);
    }
    let dev = match VulkanDevice::open("") {
        Ok(d) => d,
        Err(e @ (VulkanError::LoaderNotFound(_) | VulkanError::NoDevice(_))) => {
            // No device here: skipped, loudly; a failure where a device is required.
            let required = std::env::var("HISPARSE_REQUIRE_DEVICE").as_deref() == Ok("1");
            eprintln!(
                "resolve_replay: SKIPPED, no Vulkan device ({e}){}",
                if required {
                    "; HISPARSE_REQUIRE_DEVICE=1 makes this a failure"
                } else {
                    ""
                }
            );
            std::process::exit(i32::from(required));
        }
        Err(e) => {
            eprintln!("resolve_replay: opening the device: {e}");
            std::process::exit(1);
        }
    };
    let mut rows = Vec::new();
    for f in &files {
        match replay(&dev, f, calls) {
            Ok(line) => rows.push(line),
            Err(e) => {
                eprintln!("resolve_replay: {e}");
                std::process::exit(1);
            }
        }
    }
    if let Some(p) = json
        && let Err(e) = std::fs::write(&p, format!("[{}]\n", rows.join(",")))
    {
        eprintln!("resolve_replay: writing {p}: {e}");
        std::process::exit(1);
    }
}

/// Times `calls` resolves of one dumped state; prints them and returns a JSON object.
fn replay(dev: &VulkanDevice, path: &str, calls: usize) -> core::result::Result<String, String> {
    let d = read(path)?;
    let run = || -> Result<String> {
        let p = &d.parts;
        let (req, topk, res, host, hot) = (
            upload(dev, &p[0])?,
            upload(dev, &p[1])?,
            upload(dev, &p[2])?,
            upload(dev, &p[3])?,
            upload(dev, &p[6])?,
        );
        let (mut slot_host_rows, mut lru) = (upload(dev, &p[4])?, upload(dev, &p[5])?);
        let (t, k) = (d.desc.num_tokens as usize, d.desc.top_k as usize);
        let mut outs = [4 * t * k, 4 * t, 4 * t, 4 * t, 4 * t * k, 4 * t * k]
            .iter()
            .map(|&b| dev.alloc(b))
            .collect::<Result<Vec<_>>>()?;
        let stream = dev.create_stream()?;
        let mut times = Vec::with_capacity(calls);
        let mut counts = String::new();
        for i in 0..calls {
            dev.upload(&mut slot_host_rows, 0, &p[4])?;
            dev.upload(&mut lru, 0, &p[5])?;
            let [indices, valid, hits, misses, src, dst] = &mut outs[..] else {
                unreachable!("six outputs")
            };
            let ns = dev.timed(|dv| {
                dv.resolve(
                    &stream,
                    &d.desc,
                    ResolveArgs {
                        req_id: &req,
                        topk: &topk,
                        resident_table: &res,
                        host_table: &host,
                        hot_table: &hot,
                        slot_host_rows: &mut slot_host_rows,
                        lru: &mut lru,
                        indices,
                        valid_counts: valid,
                        hit_counts: hits,
                        miss_counts: misses,
                        miss_src: src,
                        miss_dst: dst,
                        idx_mapping: None,
                        stats: None,
                    },
                )
            })?;
            times.push(ns.as_secs_f64() * 1e6);
            if i == 0 {
                let (h, m, v) = (
                    download_i32(dev, hits, t)?,
                    download_i32(dev, misses, t)?,
                    download_i32(dev, valid, t)?,
                );
                counts = format!("hits {h:?} misses {m:?} valid {v:?}");
            }
        }
        dev.synchronize(&stream)?;
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let occupied: usize = p[4]
            .chunks_exact(4)
            .filter(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) >= 0)
            .count();
        println!(
            "{path}: {t} token rows, top-k {k}, {} state rows x {} hot slots ({occupied} occupied), \
             {:?} resolver: device median {median:.1} us (min {:.1}, max {:.1}, {calls} calls); {counts}",
            d.desc.num_requests,
            d.desc.hot_slots,
            dev.resolve_kernel(),
            sorted[0],
            sorted[sorted.len() - 1]
        );
        Ok(format!(
            "{{\"file\":{path:?},\"token_rows\":{t},\"hot_slots\":{},\"occupied\":{occupied},\
             \"kernel\":\"{:?}\",\"device_us_median\":{median:.2},\"device_us_min\":{:.2},\
             \"calls\":{calls}}}",
            d.desc.hot_slots,
            dev.resolve_kernel(),
            sorted[0]
        ))
    };
    run().map_err(|e| format!("{path}: {e}"))
}
