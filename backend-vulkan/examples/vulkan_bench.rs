//! Swap-in gather bench on the Vulkan backend: random 656-byte rows from the pinned host pool
//! into hot rows of the device pool (the resolver's miss plan executed by `gather_rows`),
//! timed with timestamp queries, next to its ceiling measured in the same run: the bulk
//! host→device copy (`vkCmdCopyBuffer`) of the same bytes and of 256 MiB.
//!
//! ```text
//! cargo run -p hisparse-backend-vulkan --release --example vulkan_bench -- \
//!     [--device SELECTOR] [--iters N] [--host-mib M] [--json PATH]
//! ```

use std::time::Duration;

use hisparse_backend_vulkan::{VulkanBuffer, VulkanDevice, VulkanError};
use hisparse_core::Device;
use hisparse_core::ops::{GatherArgs, GatherDesc, LayerPair, PageLayout};

const ROW_BYTES: u32 = 656;
const BLOCK: u32 = 64;

struct Opts {
    device: String,
    iters: usize,
    host_mib: u64,
    json: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        device: String::new(),
        iters: 50,
        host_mib: 1024,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--device" => o.device = val()?,
            "--iters" => o.iters = val()?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--host-mib" => o.host_mib = val()?.parse().map_err(|e| format!("--host-mib: {e}"))?,
            "--json" => o.json = Some(val()?),
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// SplitMix64, for reproducible random rows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn as_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

struct Figure {
    rows: u32,
    iters: usize,
    plans: usize,
    gather: Duration,
    bulk_same: Duration,
}

fn run(o: &Opts) -> Result<(), VulkanError> {
    let dev = VulkanDevice::open(&o.device)?;
    let stream = dev.create_stream()?;
    let host_blocks = ((o.host_mib << 20) / u64::from(BLOCK * ROW_BYTES)) as u32;
    let host_layout = PageLayout::contiguous(
        0,
        u64::from(BLOCK * ROW_BYTES),
        host_blocks,
        BLOCK,
        ROW_BYTES,
    );
    let max_rows = 32768u32;
    let dev_blocks = max_rows / BLOCK;
    let dev_layout = PageLayout::contiguous(
        0,
        u64::from(BLOCK * ROW_BYTES),
        dev_blocks,
        BLOCK,
        ROW_BYTES,
    );
    let host_bytes = host_layout.end(hisparse_core::error::OpName::GatherRows)? as usize;
    let dev_bytes = dev_layout.end(hisparse_core::error::OpName::GatherRows)? as usize;
    let mut host = dev.alloc_pinned(host_bytes)?;
    let mut pool = dev.alloc(dev_bytes)?;
    // Fill the host pool with a pattern (row r starts with r).
    let mut fill = vec![0u8; host_bytes];
    for (r, row) in fill.chunks_mut(ROW_BYTES as usize).enumerate() {
        row[..4].copy_from_slice(&(r as u32).to_ne_bytes());
        row[4] = r as u8 ^ 0x5a;
    }
    dev.write_pinned(&mut host, 0, &fill)?;
    drop(fill);
    let host_rows = host_blocks * BLOCK;
    let layers = [LayerPair {
        host: host_layout,
        device: dev_layout,
    }];
    println!(
        "device: {} | host pool {} MiB ({} rows of {ROW_BYTES} B, {}), window {} MiB",
        dev.device_name(),
        host_bytes >> 20,
        host_rows,
        if host.is_imported() {
            "imported host memory"
        } else {
            "host-visible memory"
        },
        dev.binding_window() >> 20
    );
    if host_rows < 4 * max_rows {
        return Err(VulkanError::InvalidArgument(format!(
            "--host-mib {} holds {host_rows} rows; the bench needs at least {}",
            o.host_mib,
            4 * max_rows
        )));
    }
    let mut rng = Rng(0x0656_2048);
    let mut figures = Vec::new();
    for rows in [2048u32, 32768] {
        let k = 2048u32;
        let t = rows / k;
        let bytes = rows as usize * ROW_BYTES as usize;
        // Enough different plans that the rows gathered in one timed run (≥ 512 MiB) exceed
        // every GPU cache: a repeated plan would be served from L2, not from host memory.
        let plans = (512usize << 20).div_ceil(bytes).clamp(2, 400);
        let mut set = Vec::with_capacity(plans);
        for _ in 0..plans {
            let mut src: Vec<i32> = Vec::with_capacity(rows as usize);
            let mut seen = std::collections::HashSet::new();
            while src.len() < rows as usize {
                let g = (rng.next() % u64::from(host_rows)) as i32;
                if seen.insert(g) {
                    src.push(g);
                }
            }
            let mut dst: Vec<i32> = (0..max_rows as i32).collect();
            for i in (1..dst.len()).rev() {
                dst.swap(i, (rng.next() % (i as u64 + 1)) as usize);
            }
            dst.truncate(rows as usize);
            let counts = vec![k as i32; t as usize];
            let mut plan_src = dev.alloc(rows as usize * 4)?;
            let mut plan_dst = dev.alloc(rows as usize * 4)?;
            let mut plan_counts = dev.alloc(t as usize * 4)?;
            dev.upload(&mut plan_src, 0, &as_bytes(&src))?;
            dev.upload(&mut plan_dst, 0, &as_bytes(&dst))?;
            dev.upload(&mut plan_counts, 0, &as_bytes(&counts))?;
            set.push((src, dst, plan_src, plan_dst, plan_counts));
        }
        let desc = GatherDesc {
            num_tokens: t,
            top_k: k,
            layers: &layers,
        };
        let gather = |d: &VulkanDevice, i: usize, pool: &mut VulkanBuffer| {
            let (_, _, plan_src, plan_dst, plan_counts) = &set[i % plans];
            d.gather_rows(
                &stream,
                &desc,
                GatherArgs {
                    plan_src,
                    plan_dst,
                    plan_counts,
                    host: &host,
                    device: pool,
                },
            )
        };
        // Check that every plan's rows land (first, middle, last entry).
        for (i, (src, dst, ..)) in set.iter().enumerate() {
            gather(&dev, i, &mut pool)?;
            for e in [0usize, rows as usize / 2, rows as usize - 1] {
                let mut got = [0u8; 4];
                dev.download(&pool, dst[e] as usize * ROW_BYTES as usize, &mut got)?;
                if u32::from_ne_bytes(got) != src[e] as u32 {
                    return Err(VulkanError::InvalidArgument(format!(
                        "plan {i}: gathered row {e} holds {} instead of host row {}",
                        u32::from_ne_bytes(got),
                        src[e]
                    )));
                }
            }
        }
        let iters = o.iters.max(plans);
        let g = dev.timed(|d| {
            for i in 0..iters {
                gather(d, i, &mut pool)?;
            }
            Ok(())
        })? / iters as u32;
        // The same bytes as one bulk copy, from a different place of the pool each time.
        let span = host_bytes - bytes;
        let b = dev.timed(|d| {
            for i in 0..iters {
                let at = (i * bytes * 7 + i * 4096) % span / 4096 * 4096;
                d.copy_to_device(&stream, &host, at, &mut pool, 0, bytes)?;
            }
            Ok(())
        })? / iters as u32;
        figures.push(Figure {
            rows,
            iters,
            plans,
            gather: g,
            bulk_same: b,
        });
    }
    let big = (256usize << 20).min(host_bytes);
    let mut big_dst = dev.alloc(big)?;
    dev.copy_to_device(&stream, &host, 0, &mut big_dst, 0, big)?;
    let bulk_iters = o.iters.clamp(1, 10);
    let bulk = dev.timed(|d| {
        for _ in 0..bulk_iters {
            d.copy_to_device(&stream, &host, 0, &mut big_dst, 0, big)?;
        }
        Ok(())
    })? / bulk_iters as u32;
    let ceiling = gbps(big as u64, bulk);
    println!(
        "bulk host->device copy of {} MiB: {:.1} GB/s ({:.1} us)",
        big >> 20,
        ceiling,
        bulk.as_secs_f64() * 1e6
    );
    let mut json_rows = Vec::new();
    for f in &figures {
        let bytes = u64::from(f.rows) * u64::from(ROW_BYTES);
        let g = gbps(bytes, f.gather);
        let s = gbps(bytes, f.bulk_same);
        println!(
            "gather {:>5} rows x {ROW_BYTES} B ({} plans, {} runs): {:8.1} us  {:6.1} GB/s | bulk copy of the same bytes \
             {:6.1} GB/s | {:.0}% of the {} MiB bulk ceiling",
            f.rows,
            f.plans,
            f.iters,
            f.gather.as_secs_f64() * 1e6,
            g,
            s,
            100.0 * g / ceiling,
            big >> 20
        );
        json_rows.push(format!(
            "{{\"rows\":{},\"row_bytes\":{ROW_BYTES},\"iters\":{},\"plans\":{},\"gather_us\":{:.3},\
             \"gather_gbps\":{:.3},\"bulk_same_bytes_gbps\":{:.3}}}",
            f.rows,
            f.iters,
            f.plans,
            f.gather.as_secs_f64() * 1e6,
            g,
            s
        ));
    }
    if let Some(path) = &o.json {
        let name = dev.device_name().replace('\\', "\\\\").replace('"', "\\\"");
        let json = format!(
            "{{\"backend\":\"vulkan\",\"device\":\"{name}\",\"min_iters\":{},\"host_pool_mib\":{},\
             \"imported_host_memory\":{},\"bulk_h2d_bytes\":{big},\"bulk_h2d_gbps\":{ceiling:.3},\
             \"gather\":[{}]}}\n",
            o.iters,
            host_bytes >> 20,
            host.is_imported(),
            json_rows.join(",")
        );
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("could not write {path}: {e}");
        }
    }
    Ok(())
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vulkan_bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!("vulkan_bench: {e}");
        std::process::exit(1);
    }
}
