//! Compressed slot mapping (contract §5.5) at block boundaries, for several ratios.

use hisparse_core::Device;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping as reference;
use hisparse_core::ops::{SlotMappingArgs, SlotMappingDesc};

use crate::util::{Ctx, SENTINEL, dev_i32, read_i32, same};
use crate::{Case, CaseResult, SplitMix64};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    for (ratio, block_size) in [
        (1u32, 64u32),
        (2, 64),
        (4, 256),
        (4, 64),
        (8, 512),
        (128, 256),
    ] {
        v.push(Case::seeded(
            format!("slot_mapping/ratio{ratio}/block{block_size}"),
            move |d: &D, s| random(d, s, ratio, block_size),
        ));
    }
    v.push(Case::fixed(
        "slot_mapping/fixed/known-boundaries",
        known::<D>,
    ));
    v.push(Case::fixed("slot_mapping/fixed/empty-batch", empty::<D>));
}

struct Inputs {
    desc: SlotMappingDesc,
    positions: Vec<i32>,
    slots: Vec<i32>,
    rows: Vec<i32>,
    table: Vec<i32>,
}

fn check<D: Device>(dev: &D, i: &Inputs) -> CaseResult {
    let t = i.desc.num_tokens as usize;
    let mut want = vec![SENTINEL; t + 3];
    reference(
        &i.desc,
        SlotMappingArgs {
            positions: &i.positions[..],
            slot_mapping: &i.slots[..],
            table_row: &i.rows[..],
            block_table: &i.table[..],
            out: &mut want[..],
        },
    )
    .ctx("reference compressed_slot_mapping")?;
    let s = dev.create_stream().ctx("create_stream")?;
    let mut out = dev_i32(dev, &vec![SENTINEL; t + 3])?;
    dev.compressed_slot_mapping(
        &s,
        &i.desc,
        SlotMappingArgs {
            positions: &dev_i32(dev, &i.positions)?,
            slot_mapping: &dev_i32(dev, &i.slots)?,
            table_row: &dev_i32(dev, &i.rows)?,
            block_table: &dev_i32(dev, &i.table)?,
            out: &mut out,
        },
    )
    .ctx("compressed_slot_mapping")?;
    dev.synchronize(&s).ctx("synchronize")?;
    same("out", &read_i32(dev, &out, t + 3)?, &want)
}

fn random<D: Device>(dev: &D, seed: u64, ratio: u32, block_size: u32) -> CaseResult {
    let mut rng = SplitMix64::new(seed);
    let (table_rows, max_blocks) = (rng.u32_in(1, 4), rng.u32_in(1, 6));
    let t = rng.u32_in(1, 300);
    let span = (max_blocks * block_size) as i32;
    let bs = block_size as i32;
    let positions: Vec<i32> = (0..t)
        .map(|_| match rng.below(10) {
            // Around a block boundary: the last compressed row of a block and the first of the next.
            0..4 => {
                rng.i32_in(1, max_blocks as i32 + 1) * bs
                    + rng.i32_in(-(ratio as i32) - 1, ratio as i32 + 1)
            }
            4 => rng.i32_in(span, span + 3 * bs),
            5 => rng.i32_in(i32::MIN, 0),
            6 => i32::MAX - rng.i32_in(0, 3),
            _ => rng.i32_in(0, span),
        })
        .collect();
    let slots: Vec<i32> = (0..t)
        .map(|_| {
            if rng.percent(10) {
                rng.pick(&[-1, -5, i32::MIN])
            } else {
                rng.i32_in(0, 1 << 20)
            }
        })
        .collect();
    let rows: Vec<i32> = (0..t)
        .map(|_| {
            if rng.percent(8) {
                rng.pick(&[-1, table_rows as i32, i32::MAX])
            } else {
                rng.i32_in(0, table_rows as i32)
            }
        })
        .collect();
    let table: Vec<i32> = (0..table_rows * max_blocks)
        .map(|_| match rng.below(12) {
            0 => -1,
            1 => i32::MAX / 2,
            _ => rng.i32_in(0, 5000),
        })
        .collect();
    check(
        dev,
        &Inputs {
            desc: SlotMappingDesc {
                num_tokens: t,
                ratio,
                block_size,
                table_rows,
                max_blocks,
            },
            positions,
            slots,
            rows,
            table,
        },
    )
}

/// Hand-computed values (V4 C4A: block 256 tokens, ratio 4, 64 compressed rows per block).
fn known<D: Device>(dev: &D) -> CaseResult {
    let desc = SlotMappingDesc {
        num_tokens: 7,
        ratio: 4,
        block_size: 256,
        table_rows: 2,
        max_blocks: 2,
    };
    let s = dev.create_stream().ctx("create_stream")?;
    let mut out = dev_i32(dev, &[SENTINEL; 7])?;
    dev.compressed_slot_mapping(
        &s,
        &desc,
        SlotMappingArgs {
            positions: &dev_i32(dev, &[3, 4, 255, 259, 511, 515, 255])?,
            slot_mapping: &dev_i32(dev, &[0, 1, 2, 3, -1, 5, 6])?,
            table_row: &dev_i32(dev, &[0, 0, 0, 0, 0, 0, 1])?,
            block_table: &dev_i32(dev, &[7, 9, 11, -1])?,
            out: &mut out,
        },
    )
    .ctx("compressed_slot_mapping")?;
    // p=3 -> c=0 -> 7*64; p=4 writes nothing; p=255 -> c=63 -> 7*64+63 (last row of the block);
    // p=259 -> c=64 -> 9*64 (first row of the next); p=511 has slot -1; p=515 -> block column
    // 2, beyond the table; row 1: p=255 -> 11*64+63.
    same(
        "out",
        &read_i32(dev, &out, 7)?,
        &[448, -1, 511, 576, -1, -1, 767],
    )
}

fn empty<D: Device>(dev: &D) -> CaseResult {
    check(
        dev,
        &Inputs {
            desc: SlotMappingDesc {
                num_tokens: 0,
                ratio: 4,
                block_size: 64,
                table_rows: 1,
                max_blocks: 1,
            },
            positions: vec![],
            slots: vec![],
            rows: vec![],
            table: vec![3],
        },
    )
}
