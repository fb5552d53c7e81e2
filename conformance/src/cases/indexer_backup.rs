//! Indexer backup (`hisparse_core::ops::indexer_backup`): indexer rows copied device → host by
//! the compressed slots of both caches — DeepSeek V4's split 132-B rows (128 values + a 4-B
//! scale) in 8,640-B pages, DeepSeek V3.2's contiguous 132-B rows (indexer rows have no 16-byte
//! rule), contiguous 20-B rows in padded pages, 128-B rows (whole 16-byte chunks), several
//! layers, slots that are `-1`, beyond a pool or in another layer's part of a block; rows that
//! are not 4-byte words refused before anything is written; and the whole chain from token
//! positions: compressed slot mapping of the device and the host block tables, then the backup.

use hisparse_core::Device;
use hisparse_core::ops::indexer_backup::indexer_backup as reference;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping;
use hisparse_core::ops::{IndexerBackupArgs, IndexerBackupDesc, SlotMappingArgs, SlotMappingDesc};

use super::copies::{Rows, layouts, pool_sizes};
use crate::util::{
    Ctx, dev_bytes, dev_i32, expect_invalid, pinned_bytes, read_bytes, read_pinned, same,
};
use crate::{Case, CaseResult, SplitMix64};

/// DeepSeek V4's indexer: 64 rows of 128 + 4 bytes per page, padded to 8,640 B.
const V4_INDEXER: Rows = Rows {
    row_bytes: 132,
    value_bytes: 128,
    block_size: 64,
    layers: 3,
    extra_rows: 64,
    page_alignment: 576,
};

/// DeepSeek V3.2's indexer: 64 contiguous rows of 132 bytes (128 fp8 values and a 4-B scale)
/// per 8,448-B page.
const V32_INDEXER: Rows = Rows {
    row_bytes: 132,
    value_bytes: 132,
    block_size: 64,
    layers: 3,
    extra_rows: 64,
    page_alignment: 16,
};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    v.push(Case::seeded("indexer_backup/v4-split-rows", |d: &D, s| {
        random(d, s, V4_INDEXER)
    }));
    v.push(Case::seeded(
        "indexer_backup/v32-contiguous-132-byte-rows",
        |d: &D, s| random(d, s, V32_INDEXER),
    ));
    v.push(Case::seeded(
        "indexer_backup/v32-rows-in-multi-mib-pools",
        |d: &D, s| random_in(d, s, V32_INDEXER, (520, 560), (30, 40)),
    ));
    v.push(Case::seeded(
        "indexer_backup/contiguous-20-byte-rows-padded-pages",
        |d: &D, s| {
            random(
                d,
                s,
                Rows {
                    row_bytes: 20,
                    value_bytes: 20,
                    block_size: 3,
                    layers: 2,
                    extra_rows: 2,
                    page_alignment: 16,
                },
            )
        },
    ));
    v.push(Case::seeded(
        "indexer_backup/contiguous-128-byte-rows",
        |d: &D, s| {
            random(
                d,
                s,
                Rows {
                    row_bytes: 128,
                    value_bytes: 128,
                    block_size: 16,
                    layers: 2,
                    extra_rows: 16,
                    page_alignment: 1,
                },
            )
        },
    ));
    v.push(Case::fixed(
        "indexer_backup/rows-not-in-4-byte-words-refused",
        refused::<D>,
    ));
    v.push(Case::seeded("indexer_backup/small-pages", |d: &D, s| {
        random(
            d,
            s,
            Rows {
                row_bytes: 20,
                value_bytes: 16,
                block_size: 3,
                layers: 2,
                extra_rows: 2,
                page_alignment: 16,
            },
        )
    }));
    v.push(Case::seeded(
        "indexer_backup/from-positions-through-slot-mapping",
        chain::<D>,
    ));
}

/// Runs one backup of `slots` on the reference and the device and compares both pools.
fn check<D: Device>(
    dev: &D,
    g: Rows,
    hb: u32,
    db: u32,
    rng: &mut SplitMix64,
    device_slots: &[i32],
    host_slots: &[i32],
) -> CaseResult {
    let layers = layouts(g, hb, db);
    let (hl, dl) = pool_sizes(g, hb, db);
    let mut device = vec![0u8; dl + 32];
    rng.fill(&mut device);
    let mut host = vec![0u8; hl + 32];
    rng.fill(&mut host);
    let (d_device, mut d_host) = (dev_bytes(dev, &device)?, pinned_bytes(dev, &host)?);
    let desc = IndexerBackupDesc {
        num_tokens: device_slots.len() as u32,
        layers: &layers,
    };
    reference(
        &desc,
        IndexerBackupArgs {
            device_slots,
            host_slots,
            device: &device[..],
            host: &mut host[..],
        },
    )
    .ctx("reference indexer_backup")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let (ds, hs) = (dev_i32(dev, device_slots)?, dev_i32(dev, host_slots)?);
    let r = dev.indexer_backup(
        &s,
        &desc,
        IndexerBackupArgs {
            device_slots: &ds,
            host_slots: &hs,
            device: &d_device,
            host: &mut d_host,
        },
    );
    r.ctx("indexer_backup")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("host cache", &read_pinned(dev, &d_host, host.len())?, &host)?;
    same(
        "device pool (read only)",
        &read_bytes(dev, &d_device, device.len())?,
        &device,
    )
}

fn random<D: Device>(dev: &D, seed: u64, g: Rows) -> CaseResult {
    random_in(dev, seed, g, (2, 12), (2, 10))
}

/// [`random`] with host and device block counts drawn from `host_blocks` and `device_blocks`
/// (pools of several MiB: a backend binding pools in windows takes several).
fn random_in<D: Device>(
    dev: &D,
    seed: u64,
    g: Rows,
    host_blocks: (u32, u32),
    device_blocks: (u32, u32),
) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (hb, db) = (
        rng.u32_in(host_blocks.0, host_blocks.1),
        rng.u32_in(device_blocks.0, device_blocks.1),
    );
    let block_rows = (g.layers * g.block_size + g.extra_rows) as i32;
    let host_rows = (hb * g.block_size) as i32;
    let t = rng.u32_in(0, 40) as usize;
    // Distinct valid host slots (the slot mapping gives each compressed row its own).
    let mut host_free: Vec<i32> = (0..host_rows).collect();
    rng.shuffle(&mut host_free);
    let mut host_free = host_free.into_iter();
    let device_slots: Vec<i32> = (0..t)
        .map(|_| match rng.below(100) {
            0..8 => -1,
            8..12 => rng.i32_in(i32::MIN, 0),
            12..16 => db as i32 * block_rows + rng.i32_in(0, 40),
            // Another layer's part of a block.
            16..20 if block_rows > g.block_size as i32 => {
                rng.i32_in(0, db as i32) * block_rows + rng.i32_in(g.block_size as i32, block_rows)
            }
            _ => rng.i32_in(0, db as i32) * block_rows + rng.i32_in(0, g.block_size as i32),
        })
        .collect();
    let mut host_slots: Vec<i32> = (0..t)
        .map(|_| match rng.below(100) {
            0..8 => -1,
            8..12 => host_rows + rng.i32_in(0, 40),
            _ => host_free.next().unwrap_or(-1),
        })
        .collect();
    let mut device_slots = device_slots;
    if t > 0 {
        // The host cache's last row (the end of its last window), from a device row that is
        // there; no other token names it (the other slots come from a shuffle of the rest, or
        // lie beyond the cache).
        host_slots.retain(|&h| h != host_rows - 1);
        host_slots.resize(t, -1);
        host_slots[t - 1] = host_rows - 1;
        device_slots[t - 1] = rng.i32_in(0, g.block_size as i32);
    }
    check(dev, g, hb, db, &mut rng, &device_slots, &host_slots)
}

/// The whole chain: token positions → compressed slots in the device and the host indexer
/// caches (ratio 4, 256-token blocks) → backup; on the device, compared with the reference.
fn chain<D: Device>(dev: &D, seed: u64) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let g = V4_INDEXER;
    let (hb, db) = (8u32, 6u32);
    let block_rows = g.layers * g.block_size + g.extra_rows;
    let requests = 2u32;
    let max_blocks = 3u32;
    // Distinct blocks per request in both caches (index stride = block_rows on the device, so
    // the device table holds rows, scaled below).
    let mut dblocks: Vec<i32> = (0..db as i32).collect();
    rng.shuffle(&mut dblocks);
    let mut hblocks: Vec<i32> = (1..hb as i32).collect();
    rng.shuffle(&mut hblocks);
    let dtable: Vec<i32> = (0..requests * max_blocks)
        .map(|i| dblocks[i as usize % dblocks.len()])
        .collect();
    let htable: Vec<i32> = (0..requests * max_blocks)
        .map(|i| hblocks[i as usize % hblocks.len()])
        .collect();
    let t = 24u32;
    let positions: Vec<i32> = (0..t).map(|_| rng.i32_in(-2, 3 * 256 + 8)).collect();
    let rows: Vec<i32> = (0..t).map(|_| rng.i32_in(0, requests as i32)).collect();
    let own: Vec<i32> = (0..t).map(|_| rng.i32_in(-1, 1000)).collect();
    let map = |table: &[i32], stride: u32| -> Result<Vec<i32>, crate::CaseError> {
        let desc = SlotMappingDesc {
            num_tokens: t,
            ratio: 4,
            block_size: 256,
            table_rows: requests,
            max_blocks,
        };
        // Slots in units of the cache's flat rows: the device pool's blocks are
        // `block_rows` rows apart.
        let mut out = vec![0; t as usize];
        compressed_slot_mapping(
            &desc,
            SlotMappingArgs {
                positions: &positions[..],
                slot_mapping: &own[..],
                table_row: &rows[..],
                block_table: table,
                out: &mut out[..],
            },
        )
        .ctx("reference slot mapping")?;
        Ok(out
            .into_iter()
            .map(|s| {
                if s < 0 {
                    -1
                } else {
                    (s / 64) * stride as i32 + s % 64
                }
            })
            .collect())
    };
    let device_slots = map(&dtable, block_rows)?;
    let host_slots = map(&htable, g.block_size)?;
    // Positions may repeat: keep the first token of each host slot (slots must be distinct).
    let mut seen = std::collections::HashSet::new();
    let host_slots: Vec<i32> = host_slots
        .into_iter()
        .map(|h| if h >= 0 && !seen.insert(h) { -1 } else { h })
        .collect();
    check(dev, g, hb, db, &mut rng, &device_slots, &host_slots)
}

/// A layer whose rows are not whole 4-byte words (130 bytes) is refused with an
/// invalid-argument error before anything is written.
fn refused<D: Device>(dev: &D) -> CaseResult {
    let g = Rows {
        row_bytes: 130,
        value_bytes: 130,
        ..V32_INDEXER
    };
    let (hb, db) = (2, 2);
    let layers = layouts(g, hb, db);
    let (hl, dl) = pool_sizes(g, hb, db);
    let host = vec![0x5Au8; hl];
    let d_device = dev_bytes(dev, &vec![7u8; dl])?;
    let mut d_host = pinned_bytes(dev, &host)?;
    let slots = dev_i32(dev, &[0, 1])?;
    let s = dev.create_stream().ctx("create_stream")?;
    let r = dev.indexer_backup(
        &s,
        &IndexerBackupDesc {
            num_tokens: 2,
            layers: &layers,
        },
        IndexerBackupArgs {
            device_slots: &slots,
            host_slots: &slots,
            device: &d_device,
            host: &mut d_host,
        },
    );
    expect_invalid("indexer_backup of 130-byte rows", r)?;
    dev.synchronize(&s).ctx("synchronize")?;
    same(
        "host cache after the refused call",
        &read_pinned(dev, &d_host, hl)?,
        &host,
    )
}
