//! Multi-layer page backup (device → host) and restore (host → device), and the configurations
//! `hisparse bench` measures, measured the same way.

use hisparse_core::Device;
use hisparse_core::ops::{BlockPair, Direction, LayerPair, PageCopyDesc, PageLayout};

use hisparse_conformance::SplitMix64;

use crate::{BS, Bench, PAGE, ROW, Res, Row};

/// A page-copy configuration.
struct Pages {
    layers: u32,
    pages: u32,
    dev_blocks: u32,
    host_blocks: u32,
    /// Bytes added to a device block beyond its layers' pages.
    dev_pad: u64,
    /// Page sets cycled call after call (1: the same pages every call).
    sets: usize,
}

/// GB/s of one direction of `cfg` over stream calls, and the microseconds per call.
fn measure(b: &mut Bench, cfg: &Pages, dir: Direction, rng: &mut SplitMix64) -> Res<(f64, f64)> {
    let dstride = PAGE * u64::from(cfg.layers) + cfg.dev_pad;
    let layers: Vec<LayerPair> = (0..cfg.layers)
        .map(|l| LayerPair {
            host: PageLayout::contiguous(
                u64::from(l) * PAGE * u64::from(cfg.host_blocks),
                PAGE,
                cfg.host_blocks,
                BS,
                ROW,
            ),
            device: PageLayout {
                index_stride_rows: (dstride / u64::from(ROW)) as u32,
                ..PageLayout::contiguous(u64::from(l) * PAGE, dstride, cfg.dev_blocks, BS, ROW)
            },
        })
        .collect();
    let mut host = b
        .dev
        .alloc_pinned((PAGE * u64::from(cfg.layers * cfg.host_blocks)) as usize)?;
    let mut pool = b
        .dev
        .alloc((dstride * u64::from(cfg.dev_blocks)) as usize)?;
    let (devs, hosts) = (
        rng.permutation(cfg.dev_blocks),
        rng.permutation(cfg.host_blocks),
    );
    let p = cfg.pages as usize;
    let sets: Vec<Vec<BlockPair>> = (0..cfg.sets)
        .map(|s| {
            (0..p)
                .map(|i| {
                    let (d, h) = (
                        devs[(s * p + i) % devs.len()],
                        hosts[(s * p + i) % hosts.len()],
                    );
                    match dir {
                        Direction::DeviceToHost => BlockPair { src: d, dst: h },
                        Direction::HostToDevice => BlockPair { src: h, dst: d },
                    }
                })
                .collect()
        })
        .collect();
    let desc = PageCopyDesc {
        direction: dir,
        layers: &layers,
    };
    let iters = if b.quick { 3 } else { 10 };
    let n = sets.len();
    let ms = b.stream_ms(2, iters, &mut |d, s, i| {
        d.copy_pages(s, &desc, &sets[i % n], &mut host, &mut pool)
    })?;
    let bytes = f64::from(cfg.layers * cfg.pages) * PAGE as f64;
    Ok((bytes / ms / 1e6, ms * 1e3))
}

/// One measured direction of a configuration.
struct Measured {
    label: String,
    dir: Direction,
    gbs: f64,
    us: f64,
    bytes: f64,
}

fn push(b: &mut Bench, section: &'static str, m: Measured, judged: bool) {
    let (ceil, ceiling_name) = match m.dir {
        Direction::DeviceToHost => (b.d2h, "bulk D2H"),
        Direction::HostToDevice => (b.h2d, "bulk H2D"),
    };
    b.push(Row {
        section,
        name: m.label,
        path: "-".into(),
        value: m.gbs,
        unit: "GB/s",
        ceiling: ceil,
        ceiling_name,
        target: if judged { ">= 0.8x".into() } else { "-".into() },
        met: judged.then_some(m.gbs / ceil >= 0.8),
        note: format!(
            "{:.0} MB in one call (stream), {:.0} us",
            m.bytes / 1e6,
            m.us
        ),
        sm_mhz: 0.0,
    });
}

pub(crate) fn backup_section(b: &mut Bench) -> Res<()> {
    let mut rng = SplitMix64::new(0xbac0);
    let cfg = Pages {
        layers: 61,
        pages: 64,
        dev_blocks: 128,
        host_blocks: 128,
        dev_pad: 0,
        sets: 1,
    };
    let bytes = f64::from(cfg.layers * cfg.pages) * PAGE as f64;
    for (dir, what) in [
        (Direction::DeviceToHost, "backup"),
        (Direction::HostToDevice, "restore"),
    ] {
        let (gbs, us) = measure(b, &cfg, dir, &mut rng)?;
        let way = if dir == Direction::DeviceToHost {
            "D2H"
        } else {
            "H2D"
        };
        let label = format!("page {what} 61 layers x 64 pages ({way})");
        push(
            b,
            "backup",
            Measured {
                label,
                dir,
                gbs,
                us,
                bytes,
            },
            true,
        );
    }
    Ok(())
}

/// What `hisparse bench` measures, measured the same way (stream calls): the 2048-row gather
/// with a new source plan every call, and the backup and restore of 64 pages × 12 layers (one
/// DeepSeek V3.2 resident group, device blocks padded by 4 KiB) cycling through 16 page sets of
/// a 1024-block pool.
pub(crate) fn cli_section(b: &mut Bench) -> Res<()> {
    crate::gather::cli_gather(b)?;
    let mut rng = SplitMix64::new(4);
    let cfg = Pages {
        layers: 12,
        pages: 64,
        dev_blocks: 1024,
        host_blocks: 1024,
        dev_pad: 4096,
        sets: 16,
    };
    let bytes = f64::from(cfg.layers * cfg.pages) * PAGE as f64;
    for (dir, what) in [
        (Direction::DeviceToHost, "backup"),
        (Direction::HostToDevice, "restore"),
    ] {
        let (gbs, us) = measure(b, &cfg, dir, &mut rng)?;
        let label = format!("{what} 64 pages x 12 layers, 16 rotating sets (as hisparse bench)");
        push(
            b,
            "cli",
            Measured {
                label,
                dir,
                gbs,
                us,
                bytes,
            },
            false,
        );
    }
    Ok(())
}
