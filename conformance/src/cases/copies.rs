//! Row and page copies (contract §5.3 and step 7 of §5.2): the miss-plan gather, multi-layer page
//! backup and restore, row spans, host copy-on-write, bulk copies, and a host pool larger than
//! one 128 MiB binding.

use hisparse_core::Device;
use hisparse_core::ops::copy::{
    bulk_copy, copy_host_pages as ref_host_pages, copy_pages as ref_pages, copy_rows as ref_rows,
    gather_rows as ref_gather,
};
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, LayerPair, PageCopyDesc, PageLayout, RowCopyDesc,
    RowSpan,
};

use super::unsupported_is_skip;
use crate::util::{Ctx, dev_bytes, dev_i32, ensure, pinned_bytes, read_bytes, read_pinned, same};
use crate::{Case, CaseError, CaseResult, SplitMix64};

/// Row geometry of a family of cases.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    pub(crate) row_bytes: u32,
    pub(crate) value_bytes: u32,
    pub(crate) block_size: u32,
    pub(crate) layers: u32,
    /// Extra rows per device block beyond the layers' rows (another group's part of a block).
    pub(crate) extra_rows: u32,
    /// Pages padded to a multiple of this many bytes (1 = none).
    pub(crate) page_alignment: u32,
}

pub(crate) const MLA: Rows = Rows {
    row_bytes: 656,
    value_bytes: 656,
    block_size: 64,
    layers: 1,
    extra_rows: 0,
    page_alignment: 1,
};

/// DeepSeek V4's fp8_ds_mla rows: 576 value + 8 scale bytes, 64 per page, pages padded to
/// 37,440 B; a device block holds a bucket of 4 layers and one more page (like the planned
/// layout's 5-page, 320-row blocks).
pub(crate) const V4: Rows = Rows {
    row_bytes: 584,
    value_bytes: 576,
    block_size: 64,
    layers: 4,
    extra_rows: 64,
    page_alignment: 576,
};

impl Rows {
    /// Bytes of one page, padding included.
    pub(crate) fn page_bytes(&self) -> u64 {
        (u64::from(self.block_size) * u64::from(self.row_bytes))
            .next_multiple_of(u64::from(self.page_alignment.max(1)))
    }

    /// Bytes of one device block: the layers' pages, then the extra rows, 16-byte aligned.
    pub(crate) fn block_bytes(&self) -> u64 {
        (u64::from(self.layers) * self.page_bytes()
            + u64::from(self.extra_rows) * u64::from(self.row_bytes))
        .next_multiple_of(16)
    }
}

fn geometries() -> Vec<(&'static str, Rows)> {
    vec![
        ("contiguous-656", MLA),
        ("contiguous-656-x4-layers", Rows { layers: 4, ..MLA }),
        (
            "split-640+16",
            Rows {
                value_bytes: 640,
                block_size: 16,
                ..MLA
            },
        ),
        (
            "split-640+16-x3-layers",
            Rows {
                value_bytes: 640,
                block_size: 16,
                layers: 3,
                ..MLA
            },
        ),
        (
            "split-16+16-wide-block",
            Rows {
                row_bytes: 32,
                value_bytes: 16,
                block_size: 8,
                layers: 2,
                extra_rows: 5,
                page_alignment: 1,
            },
        ),
        (
            "contiguous-16-wide-block",
            Rows {
                row_bytes: 16,
                value_bytes: 16,
                block_size: 4,
                layers: 1,
                extra_rows: 3,
                page_alignment: 1,
            },
        ),
        // DeepSeek V4: 584-B split rows (8-B scale parts) in padded pages.
        ("split-576+8-v4-x4-layers", V4),
        (
            "split-576+8-v4-1-layer",
            Rows {
                layers: 1,
                extra_rows: 0,
                ..V4
            },
        ),
        // Its indexer rows: 128 values + a 4-B scale, pages padded to 8,640 B.
        (
            "split-128+4-v4-indexer",
            Rows {
                row_bytes: 132,
                value_bytes: 128,
                block_size: 64,
                layers: 3,
                extra_rows: 7,
                page_alignment: 576,
            },
        ),
        // The smallest scale part with an odd row count: byte-exact word copies.
        (
            "split-16+4-odd-rows",
            Rows {
                row_bytes: 20,
                value_bytes: 16,
                block_size: 3,
                layers: 2,
                extra_rows: 1,
                page_alignment: 16,
            },
        ),
    ]
}

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (name, g) in geometries() {
        v.push(Case::seeded(format!("gather/{name}"), move |d: &D, s| {
            gather(d, s, g)
        }));
        for dir in [Direction::DeviceToHost, Direction::HostToDevice] {
            let dn = match dir {
                Direction::DeviceToHost => "backup",
                Direction::HostToDevice => "restore",
            };
            v.push(Case::seeded(
                format!("copy_pages/{dn}/{name}"),
                move |d: &D, s| pages(d, s, g, dir),
            ));
            v.push(Case::seeded(
                format!("copy_rows/{dn}/{name}"),
                move |d: &D, s| rows(d, s, g, dir),
            ));
        }
        v.push(Case::seeded(
            format!("copy_host_pages/copy-on-write/{name}"),
            move |d: &D, s| host_pages(d, s, g),
        ));
    }
    v.push(Case::seeded("bulk/device-host-device", bulk::<D>));
    v.push(Case::fixed("gather/fixed/known-bytes", known_gather::<D>));
    v.push(Case::fixed("empty/gather-and-copies", empty::<D>));
    v.push(Case::seeded(
        "large-host-pool/gather-beyond-128MiB",
        large_gather::<D>,
    ));
    v.push(Case::seeded(
        "large-host-pool/pages-and-rows-beyond-128MiB",
        large_pages::<D>,
    ));
}

/// Host and device layouts for `g`: host layer-major, device layers side by side in a block
/// (pages padded to `page_alignment`).
pub(crate) fn layouts(g: Rows, host_blocks: u32, device_blocks: u32) -> Vec<LayerPair> {
    let page = g.page_bytes();
    let n = u64::from(g.layers);
    let block_rows = g.layers * g.block_size + g.extra_rows;
    let block_bytes = g.block_bytes();
    (0..n)
        .map(|i| LayerPair {
            host: PageLayout {
                base: i * u64::from(host_blocks) * page,
                block_stride: page,
                num_blocks: host_blocks,
                block_size: g.block_size,
                row_bytes: g.row_bytes,
                value_bytes: g.value_bytes,
                index_stride_rows: g.block_size,
            },
            device: PageLayout {
                base: i * page,
                block_stride: block_bytes,
                num_blocks: device_blocks,
                block_size: g.block_size,
                row_bytes: g.row_bytes,
                value_bytes: g.value_bytes,
                index_stride_rows: block_rows,
            },
        })
        .collect()
}

pub(crate) fn pool_sizes(g: Rows, host_blocks: u32, device_blocks: u32) -> (usize, usize) {
    (
        (u64::from(g.layers) * u64::from(host_blocks) * g.page_bytes()) as usize,
        (g.block_bytes() * u64::from(device_blocks)) as usize,
    )
}

/// Random host and device pools, on the host and on the device.
struct Pools<D: Device> {
    host: Vec<u8>,
    device: Vec<u8>,
    d_host: D::HostBuffer,
    d_device: D::Buffer,
}

impl<D: Device> Pools<D> {
    fn new(
        dev: &D,
        rng: &mut SplitMix64,
        host_len: usize,
        dev_len: usize,
    ) -> Result<Self, CaseError> {
        // A little slack past each pool: it must stay untouched.
        let mut host = vec![0u8; host_len + 48];
        let mut device = vec![0u8; dev_len + 48];
        rng.fill(&mut host);
        rng.fill(&mut device);
        Ok(Pools {
            d_host: pinned_bytes(dev, &host)?,
            d_device: dev_bytes(dev, &device)?,
            host,
            device,
        })
    }

    fn compare(&self, dev: &D) -> CaseResult {
        same(
            "device pool",
            &read_bytes(dev, &self.d_device, self.device.len())?,
            &self.device,
        )?;
        same(
            "host pool",
            &read_pinned(dev, &self.d_host, self.host.len())?,
            &self.host,
        )
    }
}

fn gather<D: Device>(dev: &D, seed: u64, g: Rows) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (hb, db) = (rng.u32_in(4, 40), rng.u32_in(2, 24));
    let layers = layouts(g, hb, db);
    let (hl, dl) = pool_sizes(g, hb, db);
    let mut p = Pools::new(dev, &mut rng, hl, dl)?;
    let t = rng.u32_in(1, 5);
    let k = rng.u32_in(1, 80);
    let host_rows = (hb * g.block_size) as i32;
    let block_rows = g.layers * g.block_size + g.extra_rows;
    // Distinct valid destinations: a shuffled list of every (block, offset) of the pool.
    let mut dsts: Vec<i32> = (0..db)
        .flat_map(|b| (0..g.block_size).map(move |o| (b * block_rows + o) as i32))
        .collect();
    rng.shuffle(&mut dsts);
    let mut dsts = dsts.into_iter();
    let n = (t * k) as usize;
    let mut src = Vec::with_capacity(n);
    let mut dst = Vec::with_capacity(n);
    for _ in 0..n {
        src.push(match rng.below(100) {
            0..70 => rng.i32_in(0, host_rows),
            70..80 => -1,
            80..90 => rng.i32_in(host_rows, host_rows + 100),
            90..95 => rng.i32_in(i32::MIN, 0),
            _ => i32::MAX,
        });
        dst.push(match rng.below(100) {
            // Skipped destinations: negative, beyond the pool, in another layer's part.
            0..4 => rng.i32_in(i32::MIN, 0),
            4..8 => (db * block_rows) as i32 + rng.i32_in(0, 50),
            8..12 if block_rows > g.block_size => {
                (rng.u32_in(0, db) * block_rows + rng.u32_in(g.block_size, block_rows)) as i32
            }
            _ => dsts.next().unwrap_or(-1),
        });
    }
    let counts: Vec<i32> = (0..t)
        .map(|_| match rng.below(10) {
            0 => rng.i32_in(i32::MIN, 0),
            1 => k as i32 + rng.i32_in(1, 5),
            _ => rng.i32_in(0, k as i32 + 1),
        })
        .collect();
    let desc = GatherDesc {
        num_tokens: t,
        top_k: k,
        layers: &layers,
    };
    ref_gather(
        &desc,
        GatherArgs {
            plan_src: &src[..],
            plan_dst: &dst[..],
            plan_counts: &counts[..],
            host: &p.host[..],
            device: &mut p.device[..],
        },
    )
    .ctx("reference gather")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let (d_src, d_dst, d_counts) = (
        dev_i32(dev, &src)?,
        dev_i32(dev, &dst)?,
        dev_i32(dev, &counts)?,
    );
    let r = dev.gather_rows(
        &s,
        &desc,
        GatherArgs {
            plan_src: &d_src,
            plan_dst: &d_dst,
            plan_counts: &d_counts,
            host: &p.d_host,
            device: &mut p.d_device,
        },
    );
    unsupported_is_skip(r, "gather_rows")?;
    dev.synchronize(&s).ctx("synchronize")?;
    p.compare(dev)
}

/// `n` pairs with distinct destinations below `dst_blocks`, sources below `src_blocks`.
fn pairs(rng: &mut SplitMix64, n: usize, src_blocks: u32, dst_blocks: u32) -> Vec<BlockPair> {
    let mut dsts: Vec<u32> = (0..dst_blocks).collect();
    rng.shuffle(&mut dsts);
    dsts.into_iter()
        .take(n)
        .map(|dst| BlockPair {
            src: rng.u32_in(0, src_blocks),
            dst,
        })
        .collect()
}

fn pages<D: Device>(dev: &D, seed: u64, g: Rows, dir: Direction) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (hb, db) = (rng.u32_in(2, 30), rng.u32_in(2, 30));
    let layers = layouts(g, hb, db);
    let (hl, dl) = pool_sizes(g, hb, db);
    let mut p = Pools::new(dev, &mut rng, hl, dl)?;
    let (sb, dstb) = match dir {
        Direction::DeviceToHost => (db, hb),
        Direction::HostToDevice => (hb, db),
    };
    let n = rng.below(u64::from(dstb) + 1) as usize;
    let pairs = pairs(&mut rng, n, sb, dstb);
    let desc = PageCopyDesc {
        direction: dir,
        layers: &layers,
    };
    ref_pages(&desc, &pairs, &mut p.host, &mut p.device).ctx("reference copy_pages")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let r = dev.copy_pages(&s, &desc, &pairs, &mut p.d_host, &mut p.d_device);
    unsupported_is_skip(r, "copy_pages")?;
    dev.synchronize(&s).ctx("synchronize")?;
    p.compare(dev)
}

fn rows<D: Device>(dev: &D, seed: u64, g: Rows, dir: Direction) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (hb, db) = (rng.u32_in(2, 30), rng.u32_in(2, 30));
    let layers = layouts(g, hb, db);
    let (hl, dl) = pool_sizes(g, hb, db);
    let mut p = Pools::new(dev, &mut rng, hl, dl)?;
    // Spans with distinct destination blocks (so no two spans write the same row).
    let dst_blocks = match dir {
        Direction::DeviceToHost => hb,
        Direction::HostToDevice => db,
    };
    let mut dsts: Vec<u32> = (0..dst_blocks).collect();
    rng.shuffle(&mut dsts);
    let n = rng.below(u64::from(dst_blocks) + 1) as usize;
    let spans: Vec<RowSpan> = dsts
        .into_iter()
        .take(n)
        .map(|dst| {
            let first_row = rng.u32_in(0, g.block_size + 1);
            let num_rows = rng.u32_in(0, g.block_size - first_row + 1);
            let other = rng.u32_in(
                0,
                if dir == Direction::DeviceToHost {
                    db
                } else {
                    hb
                },
            );
            let (device_block, host_block) = match dir {
                Direction::DeviceToHost => (other, dst),
                Direction::HostToDevice => (dst, other),
            };
            RowSpan {
                device_block,
                host_block,
                first_row,
                num_rows,
            }
        })
        .collect();
    let desc = RowCopyDesc {
        direction: dir,
        layers: &layers,
    };
    ref_rows(&desc, &spans, &mut p.host, &mut p.device).ctx("reference copy_rows")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let r = dev.copy_rows(&s, &desc, &spans, &mut p.d_host, &mut p.d_device);
    unsupported_is_skip(r, "copy_rows")?;
    dev.synchronize(&s).ctx("synchronize")?;
    p.compare(dev)
}

fn host_pages<D: Device>(dev: &D, seed: u64, g: Rows) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let hb = rng.u32_in(4, 40);
    let layers: Vec<PageLayout> = layouts(g, hb, 1).into_iter().map(|l| l.host).collect();
    let (hl, _) = pool_sizes(g, hb, 1);
    let mut p = Pools::new(dev, &mut rng, hl, 16)?;
    // Destinations distinct and never a source: the copies are order-independent.
    let mut blocks: Vec<u32> = (0..hb).collect();
    rng.shuffle(&mut blocks);
    let (srcs, dsts) = blocks.split_at(hb as usize / 2);
    let n = rng.below(dsts.len() as u64 + 1) as usize;
    let pairs: Vec<BlockPair> = dsts[..n]
        .iter()
        .map(|&dst| BlockPair {
            src: rng.pick(srcs),
            dst,
        })
        .collect();
    ref_host_pages(&layers, &pairs, &mut p.host).ctx("reference copy_host_pages")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let r = dev.copy_host_pages(&s, &layers, &pairs, &mut p.d_host);
    unsupported_is_skip(r, "copy_host_pages")?;
    dev.synchronize(&s).ctx("synchronize")?;
    p.compare(dev)
}

fn bulk<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let len = 1 << 16;
    let mut p = Pools::new(dev, &mut rng, len, len)?;
    let mut other = vec![0u8; len];
    rng.fill(&mut other);
    let mut d_other = dev_bytes(dev, &other)?;
    let s = dev.create_stream().ctx("create_stream")?;
    for i in 0..12 {
        let bytes = match i {
            0 => 0,
            1 => len,
            _ => rng.below(len as u64 / 2) as usize,
        };
        let so = rng.below((len - bytes) as u64 + 1) as usize;
        let d_o = rng.below((len - bytes) as u64 + 1) as usize;
        match i % 3 {
            0 => {
                bulk_copy(&p.host, so, &mut p.device, d_o, bytes).ctx("reference")?;
                dev.copy_to_device(&s, &p.d_host, so, &mut p.d_device, d_o, bytes)
                    .ctx("copy_to_device")?;
            }
            1 => {
                bulk_copy(&p.device, so, &mut p.host, d_o, bytes).ctx("reference")?;
                dev.copy_to_host(&s, &p.d_device, so, &mut p.d_host, d_o, bytes)
                    .ctx("copy_to_host")?;
            }
            _ => {
                bulk_copy(&p.device, so, &mut other, d_o, bytes).ctx("reference")?;
                dev.copy_on_device(&s, &p.d_device, so, &mut d_other, d_o, bytes)
                    .ctx("copy_on_device")?;
            }
        }
    }
    // Events order a second stream after the first.
    let s2 = dev.create_stream().ctx("create_stream")?;
    let e = dev.record_event(&s).ctx("record_event")?;
    dev.wait_event(&s2, &e).ctx("wait_event")?;
    dev.copy_on_device(&s2, &p.d_device, 0, &mut d_other, 0, 64)
        .ctx("copy_on_device on a second stream")?;
    other[..64].copy_from_slice(&p.device[..64]);
    dev.synchronize(&s2).ctx("synchronize")?;
    dev.synchronize(&s).ctx("synchronize")?;
    p.compare(dev)?;
    same(
        "second device buffer",
        &read_bytes(dev, &d_other, len)?,
        &other,
    )
}

/// A hand-checked gather: known bytes land in known places, a -1 source zero-fills.
fn known_gather<D: Device>(dev: &D) -> CaseResult {
    let g = Rows {
        row_bytes: 32,
        value_bytes: 16,
        block_size: 2,
        layers: 1,
        extra_rows: 2,
        page_alignment: 1,
    };
    let layers = layouts(g, 3, 2);
    // Host: 3 blocks × 64 bytes; byte i = i + 1.
    let host: Vec<u8> = (0..192).map(|i| (i + 1) as u8).collect();
    let d_host = pinned_bytes(dev, &host)?;
    let mut d_dev = dev_bytes(dev, &[0xAA; 256])?;
    let s = dev.create_stream().ctx("create_stream")?;
    // Host row 3 = block 1, offset 1 → device row 1 (block 0 offset 1); source -1 → device row 4
    // (block 1 offset 0) zero-filled; destination 6 (offset 2: another layer's part) skipped;
    // the count 3 leaves the 4th entry unused.
    dev.gather_rows(
        &s,
        &GatherDesc {
            num_tokens: 1,
            top_k: 4,
            layers: &layers,
        },
        GatherArgs {
            plan_src: &dev_i32(dev, &[3, -1, 0, 0])?,
            plan_dst: &dev_i32(dev, &[1, 4, 6, 0])?,
            plan_counts: &dev_i32(dev, &[3])?,
            host: &d_host,
            device: &mut d_dev,
        },
    )
    .ctx("gather_rows")?;
    let got = read_bytes(dev, &d_dev, 256)?;
    // Split rows: block 1's page is host bytes 64..128; row 1's values at +16, scales at
    // +32+16. Device block 0 is bytes 0..128 (4 rows of 32 B), values of row 1 at 16, scales at
    // 2*16 + 16 = 48.
    same("values of device row 1", &got[16..32], &host[80..96])?;
    same("scales of device row 1", &got[48..64], &host[112..128])?;
    same("values of device row 4", &got[128..144], &[0; 16])?;
    same("scales of device row 4", &got[160..176], &[0; 16])?;
    same("device row 0 (unused entry)", &got[0..16], &[0xAA; 16])?;
    same("another layer's part", &got[64..128], &[0xAA; 64])
}

/// Empty batches: nothing is written, nothing fails.
fn empty<D: Device>(dev: &D) -> CaseResult {
    let mut rng = SplitMix64::new(1);
    let layers = layouts(MLA, 2, 2);
    let (hl, dl) = pool_sizes(MLA, 2, 2);
    let mut p = Pools::new(dev, &mut rng, hl, dl)?;
    let s = dev.create_stream().ctx("create_stream")?;
    let nothing = dev_i32(dev, &[])?;
    dev.gather_rows(
        &s,
        &GatherDesc {
            num_tokens: 0,
            top_k: 8,
            layers: &layers,
        },
        GatherArgs {
            plan_src: &nothing,
            plan_dst: &nothing,
            plan_counts: &nothing,
            host: &p.d_host,
            device: &mut p.d_device,
        },
    )
    .ctx("gather_rows with no tokens")?;
    // Counts of zero: nothing copied either.
    let zero = dev_i32(dev, &[0, 0])?;
    let plan = dev_i32(dev, &[0; 16])?;
    dev.gather_rows(
        &s,
        &GatherDesc {
            num_tokens: 2,
            top_k: 8,
            layers: &layers,
        },
        GatherArgs {
            plan_src: &plan,
            plan_dst: &plan,
            plan_counts: &zero,
            host: &p.d_host,
            device: &mut p.d_device,
        },
    )
    .ctx("gather_rows with zero counts")?;
    for direction in [Direction::DeviceToHost, Direction::HostToDevice] {
        let desc = PageCopyDesc {
            direction,
            layers: &layers,
        };
        dev.copy_pages(&s, &desc, &[], &mut p.d_host, &mut p.d_device)
            .ctx("copy_pages with no pairs")?;
        let desc = RowCopyDesc {
            direction,
            layers: &layers,
        };
        let span = RowSpan {
            device_block: 1,
            host_block: 1,
            first_row: 64,
            num_rows: 0,
        };
        dev.copy_rows(&s, &desc, &[span], &mut p.d_host, &mut p.d_device)
            .ctx("copy_rows with an empty span at the page end")?;
        dev.copy_rows(&s, &desc, &[], &mut p.d_host, &mut p.d_device)
            .ctx("copy_rows with no spans")?;
    }
    let host_layers: Vec<PageLayout> = layers.iter().map(|l| l.host).collect();
    dev.copy_host_pages(&s, &host_layers, &[], &mut p.d_host)
        .ctx("copy_host_pages with no pairs")?;
    dev.copy_to_device(&s, &p.d_host, 0, &mut p.d_device, 0, 0)
        .ctx("copy_to_device of 0 bytes")?;
    dev.synchronize(&s).ctx("synchronize")?;
    p.compare(dev)
}

/// Host pool of 136 MiB (above a 128 MiB binding); its layout in MLA rows.
fn large_layout() -> (Rows, u32, usize) {
    let page = 64 * 656;
    let host_blocks = ((136usize << 20) / page) as u32;
    (MLA, host_blocks, host_blocks as usize * page)
}

/// A recognisable 656-byte row for flat host row `g`.
fn row_pattern(seed: u64, g: i64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ (g as u64).wrapping_mul(0x9e37_79b9));
    let mut v = vec![0u8; 656];
    rng.fill(&mut v);
    v
}

fn large_gather<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (g, hb, host_len) = large_layout();
    let db = 4u32;
    let layers = layouts(g, hb, db);
    let mut host = dev.alloc_pinned(host_len).ctx("alloc_pinned 136 MiB")?;
    let host_rows = i64::from(hb) * 64;
    let first_beyond = ((128u64 << 20).div_ceil(656)) as i64;
    // Rows beyond 128 MiB (the last one included), and a few below it.
    let mut srcs: Vec<i64> = vec![host_rows - 1, first_beyond, first_beyond + 1];
    for _ in 0..20 {
        srcs.push(rng.range(first_beyond, host_rows));
    }
    for _ in 0..5 {
        srcs.push(rng.range(0, first_beyond));
    }
    srcs.sort_unstable();
    srcs.dedup();
    for &r in &srcs {
        dev.write_pinned(&mut host, r as usize * 656, &row_pattern(seed, r))
            .ctx("write_pinned a row")?;
    }
    let dev_len = db as usize * 64 * 656;
    let mut device = dev_bytes(dev, &vec![0xCD; dev_len])?;
    // Also a source beyond the pool: zero-fill.
    let mut src: Vec<i32> = srcs.iter().map(|&r| r as i32).collect();
    src.push(host_rows as i32);
    let dst: Vec<i32> = (0..src.len() as i32).map(|i| i * 3).collect();
    let s = dev.create_stream().ctx("create_stream")?;
    dev.gather_rows(
        &s,
        &GatherDesc {
            num_tokens: 1,
            top_k: src.len() as u32,
            layers: &layers,
        },
        GatherArgs {
            plan_src: &dev_i32(dev, &src)?,
            plan_dst: &dev_i32(dev, &dst)?,
            plan_counts: &dev_i32(dev, &[src.len() as i32])?,
            host: &host,
            device: &mut device,
        },
    )
    .ctx("gather_rows")?;
    dev.synchronize(&s).ctx("synchronize")?;
    let got = read_bytes(dev, &device, dev_len)?;
    for (i, &r) in srcs.iter().enumerate() {
        let at = dst[i] as usize * 656;
        same(
            &format!("hot row {} (host row {r}, byte {})", dst[i], r * 656),
            &got[at..at + 656],
            &row_pattern(seed, r),
        )?;
    }
    let at = dst[srcs.len()] as usize * 656;
    ensure!(
        got[at..at + 656].iter().all(|&b| b == 0),
        "a source beyond the 136 MiB pool was not zero-filled"
    );
    ensure!(
        got[656..2 * 656].iter().all(|&b| b == 0xCD),
        "an unplanned row was written"
    );
    Ok(())
}

fn large_pages<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (g, hb, host_len) = large_layout();
    let db = 3u32;
    let layers = layouts(g, hb, db);
    let page = 64 * 656;
    let mut host = dev.alloc_pinned(host_len).ctx("alloc_pinned 136 MiB")?;
    let mut dev_init = vec![0u8; db as usize * page];
    rng.fill(&mut dev_init);
    let mut device = dev_bytes(dev, &dev_init)?;
    let s = dev.create_stream().ctx("create_stream")?;
    // Back device block 1 up into the last host block (beyond 128 MiB), then restore it into
    // device block 2, and mirror rows 3..9 of device block 0 into the second-last host block.
    let last = hb - 1;
    let back = PageCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    dev.copy_pages(
        &s,
        &back,
        &[BlockPair { src: 1, dst: last }],
        &mut host,
        &mut device,
    )
    .ctx("copy_pages backup")?;
    let restore = PageCopyDesc {
        direction: Direction::HostToDevice,
        layers: &layers,
    };
    dev.copy_pages(
        &s,
        &restore,
        &[BlockPair { src: last, dst: 2 }],
        &mut host,
        &mut device,
    )
    .ctx("copy_pages restore")?;
    let mirror = RowCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layers,
    };
    let span = RowSpan {
        device_block: 0,
        host_block: last - 1,
        first_row: 3,
        num_rows: 6,
    };
    dev.copy_rows(&s, &mirror, &[span], &mut host, &mut device)
        .ctx("copy_rows mirror")?;
    dev.synchronize(&s).ctx("synchronize")?;
    let mut got = vec![0u8; page];
    dev.read_pinned(&host, last as usize * page, &mut got)
        .ctx("read_pinned the last block")?;
    same(
        "backed-up page beyond 128 MiB",
        &got,
        &dev_init[page..2 * page],
    )?;
    let restored = read_bytes(dev, &device, 3 * page)?;
    same(
        "restored page",
        &restored[2 * page..],
        &dev_init[page..2 * page],
    )?;
    let mut rows = vec![0u8; 6 * 656];
    dev.read_pinned(&host, (last as usize - 1) * page + 3 * 656, &mut rows)
        .ctx("read_pinned mirrored rows")?;
    same(
        "mirrored rows beyond 128 MiB",
        &rows,
        &dev_init[3 * 656..9 * 656],
    )
}
