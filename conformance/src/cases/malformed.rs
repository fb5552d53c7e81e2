//! Every malformed descriptor is rejected with a typed `InvalidArgument` error *before* any memory
//! is touched: each case starts from a valid call, breaks one thing, and checks both the error
//! kind and that every output and state buffer still holds its sentinel bytes.

use hisparse_core::Device;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, InvalidateArgs, InvalidateDesc, LayerPair,
    PageCopyDesc, PageLayout, RemapArgs, RemapDesc, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan,
    SlotMappingArgs, SlotMappingDesc,
};

use super::copies::{MLA, Rows, layouts, pool_sizes};
use super::resolve_io::SMALL;
use crate::util::{
    Ctx, SENTINEL, dev_bytes, dev_i32, dev_u16, expect_invalid, pinned_bytes, read_bytes, read_i32,
    read_pinned, read_u16, same,
};
use crate::{Case, CaseResult};

pub(crate) fn cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    remap_cases(v);
    resolve_cases(v);
    gather_cases(v);
    page_cases(v);
    invalidate_cases(v);
    slot_cases(v);
    bulk_cases(v);
}

// ---------------------------------------------------------------------------------------------
// remap

#[derive(Clone, Debug)]
struct RemapCall {
    desc: RemapDesc,
    /// Element counts of req_id, block_table, topk, out, counts, idx_mapping.
    lens: [usize; 6],
    counts: bool,
    mapping: bool,
}

fn remap_valid() -> RemapCall {
    RemapCall {
        desc: RemapDesc {
            num_tokens: 3,
            top_k: 8,
            table_rows: 2,
            max_blocks: 4,
            block_size: 16,
            block_stride_rows: 16,
            idx_mapping_len: Some(2),
            write_counts: true,
            compact: false,
            stats_slot: 0,
        },
        lens: [3, 8, 24, 24, 3, 2],
        counts: true,
        mapping: true,
    }
}

fn remap_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    type Break = fn(&mut RemapCall);
    let breaks: &[(&str, Break)] = &[
        ("top_k-zero", |c| c.desc.top_k = 0),
        ("table_rows-zero", |c| c.desc.table_rows = 0),
        ("max_blocks-zero", |c| c.desc.max_blocks = 0),
        ("block_size-zero", |c| c.desc.block_size = 0),
        ("stride-below-block-size", |c| c.desc.block_stride_rows = 15),
        ("idx_mapping_len-zero", |c| c.desc.idx_mapping_len = Some(0)),
        ("short-req_id", |c| c.lens[0] = 2),
        ("short-block_table", |c| c.lens[1] = 7),
        ("short-topk", |c| c.lens[2] = 23),
        ("short-out", |c| c.lens[3] = 23),
        ("short-counts", |c| c.lens[4] = 2),
        ("short-idx_mapping", |c| c.lens[5] = 1),
        ("counts-missing", |c| c.counts = false),
        ("counts-not-declared", |c| c.desc.write_counts = false),
        ("idx_mapping-missing", |c| c.mapping = false),
        ("idx_mapping-not-declared", |c| {
            c.desc.idx_mapping_len = None
        }),
        ("huge-batch", |c| {
            c.desc.num_tokens = u32::MAX;
            c.desc.top_k = u32::MAX;
        }),
    ];
    for &(name, b) in breaks {
        v.push(Case::fixed(
            format!("malformed/remap/{name}"),
            move |d: &D| {
                let mut c = remap_valid();
                b(&mut c);
                remap_call(d, &c)
            },
        ));
    }
    v.push(Case::fixed("malformed/remap/valid-baseline", |d: &D| {
        remap_call(d, &remap_valid())
    }));
}

/// Runs a remap call; a broken one must fail and leave `out` and `counts` untouched, the valid
/// baseline must succeed (so the fixture itself is known to be good).
fn remap_call<D: Device>(dev: &D, c: &RemapCall) -> CaseResult {
    let buf = |n: usize, fill: i32| dev_i32(dev, &vec![fill; n]);
    let req = buf(c.lens[0], 0)?;
    let table = buf(c.lens[1], 1)?;
    let topk = buf(c.lens[2], 5)?;
    let mut out = buf(c.lens[3], SENTINEL)?;
    let mut counts = buf(c.lens[4], SENTINEL)?;
    let mapping = buf(c.lens[5], 0)?;
    let s = dev.create_stream().ctx("create_stream")?;
    let r = dev.remap(
        &s,
        &c.desc,
        RemapArgs {
            req_id: &req,
            block_table: &table,
            topk: &topk,
            idx_mapping: c.mapping.then_some(&mapping),
            out: &mut out,
            counts: c.counts.then_some(&mut counts),
            stats: None,
        },
    );
    let valid = remap_valid();
    if c.desc == valid.desc && c.lens == valid.lens && c.counts && c.mapping {
        r.ctx("remap (valid baseline)")?;
        same("baseline out", &read_i32(dev, &out, 1)?, &[21])?;
        return Ok(());
    }
    expect_invalid("remap", r)?;
    same(
        "out",
        &read_i32(dev, &out, c.lens[3])?,
        &vec![SENTINEL; c.lens[3]],
    )?;
    same(
        "counts",
        &read_i32(dev, &counts, c.lens[4])?,
        &vec![SENTINEL; c.lens[4]],
    )
}

// ---------------------------------------------------------------------------------------------
// resolve

#[derive(Clone, Debug)]
struct ResolveCall {
    desc: ResolveDesc,
    /// Element counts of the 13 arguments, in `ResolveArgs` order.
    lens: [usize; 13],
}

fn resolve_valid() -> ResolveCall {
    let desc = ResolveDesc {
        num_tokens: 2,
        top_k: 4,
        num_requests: 2,
        max_pages: 3,
        hot_slots: 8,
        host_num_blocks: 8,
        ..SMALL
    };
    ResolveCall {
        desc,
        lens: [2, 8, 6, 6, 4, 16, 16, 8, 2, 2, 2, 8, 8],
    }
}

const RESOLVE_ARGS: [&str; 13] = [
    "req_id",
    "topk",
    "resident_table",
    "host_table",
    "hot_table",
    "slot_host_rows",
    "lru",
    "indices",
    "valid_counts",
    "hit_counts",
    "miss_counts",
    "miss_src",
    "miss_dst",
];

fn resolve_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    type Break = fn(&mut ResolveCall);
    let breaks: &[(&str, Break)] = &[
        ("top_k-zero", |c| c.desc.top_k = 0),
        ("num_requests-zero", |c| c.desc.num_requests = 0),
        ("max_pages-zero", |c| c.desc.max_pages = 0),
        ("block_size-zero", |c| c.desc.block_size = 0),
        ("host_num_blocks-zero", |c| c.desc.host_num_blocks = 0),
        ("hot_slots-below-top_k", |c| c.desc.hot_slots = 3),
        ("hot_slots-above-32768", |c| {
            c.desc.hot_slots = 32769;
            c.lens[5] = 2 * 32769;
            c.lens[6] = 2 * 32769;
            c.lens[4] = 2 * 32769usize.div_ceil(4);
        }),
        ("stride-below-block-size", |c| {
            c.desc.attention_block_stride = 3
        }),
        ("host-rows-beyond-i32", |c| {
            c.desc.host_num_blocks = u32::MAX / 2
        }),
    ];
    for &(name, b) in breaks {
        v.push(Case::fixed(
            format!("malformed/resolve/{name}"),
            move |d: &D| {
                let mut c = resolve_valid();
                b(&mut c);
                resolve_call(d, &c, false)
            },
        ));
    }
    for (i, arg) in RESOLVE_ARGS.iter().enumerate() {
        v.push(Case::fixed(
            format!("malformed/resolve/short-{arg}"),
            move |d: &D| {
                let mut c = resolve_valid();
                c.lens[i] -= 1;
                resolve_call(d, &c, false)
            },
        ));
    }
    v.push(Case::fixed("malformed/resolve/valid-baseline", |d: &D| {
        resolve_call(d, &resolve_valid(), true)
    }));
}

const LRU_SENTINEL: u16 = 0x5A5A;

fn resolve_call<D: Device>(dev: &D, c: &ResolveCall, valid: bool) -> CaseResult {
    let l = &c.lens;
    let buf = |n: usize, fill: i32| dev_i32(dev, &vec![fill; n]);
    let req = buf(l[0], 0)?;
    let topk = buf(l[1], 1)?;
    let resident = buf(l[2], 0)?;
    let host = buf(l[3], 1)?;
    let hot = buf(l[4], 2)?;
    let mut slot_host_rows = buf(l[5], SENTINEL)?;
    // LRU as u16: sentinel values are a (corrupt) non-permutation, which a valid call repairs.
    let mut lru = dev_u16(dev, &vec![LRU_SENTINEL; l[6]])?;
    let mut outs: Vec<D::Buffer> = l[7..]
        .iter()
        .map(|&n| buf(n, SENTINEL))
        .collect::<Result<_, _>>()?;
    let s = dev.create_stream().ctx("create_stream")?;
    let [
        indices,
        valid_counts,
        hit_counts,
        miss_counts,
        miss_src,
        miss_dst,
    ] = &mut outs[..]
    else {
        unreachable!("six outputs")
    };
    let r = dev.resolve(
        &s,
        &c.desc,
        ResolveArgs {
            req_id: &req,
            topk: &topk,
            resident_table: &resident,
            host_table: &host,
            hot_table: &hot,
            slot_host_rows: &mut slot_host_rows,
            lru: &mut lru,
            indices,
            valid_counts,
            hit_counts,
            miss_counts,
            miss_src,
            miss_dst,
            idx_mapping: None,
            stats: None,
        },
    );
    if valid {
        r.ctx("resolve (valid baseline)")?;
        // Token 1 of host block 1 → hot slot 0 of block 2 after the repair: row 8.
        return same("baseline indices", &read_i32(dev, &outs[0], 1)?, &[8]);
    }
    expect_invalid("resolve", r)?;
    same(
        "slot_host_rows",
        &read_i32(dev, &slot_host_rows, l[5])?,
        &vec![SENTINEL; l[5]],
    )?;
    same(
        "lru",
        &read_u16(dev, &lru, l[6])?,
        &vec![LRU_SENTINEL; l[6]],
    )?;
    for (i, (o, &n)) in outs.iter().zip(&l[7..]).enumerate() {
        same(
            RESOLVE_ARGS[7 + i],
            &read_i32(dev, o, n)?,
            &vec![SENTINEL; n],
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// gather

fn gather_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    type Break = fn(&mut Vec<LayerPair>, &mut GatherFix);
    let breaks: &[(&str, Break)] = &[
        ("top_k-zero", |_, f| f.top_k = 0),
        ("no-layers", |l, _| l.clear()),
        ("row_bytes-not-multiple-of-16", |l, _| {
            l[1].host.row_bytes = 24;
            l[1].device.row_bytes = 24;
        }),
        ("value_bytes-above-row_bytes", |l, _| {
            l[0].host.value_bytes = 672;
            l[0].device.value_bytes = 672;
        }),
        ("value_bytes-not-multiple-of-16", |l, _| {
            l[0].host.value_bytes = 648;
            l[0].device.value_bytes = 648;
        }),
        ("base-misaligned", |l, _| l[1].device.base += 8),
        ("block_stride-misaligned", |l, _| {
            l[0].host.block_stride += 4
        }),
        ("block_stride-below-page", |l, _| {
            l[0].host.block_stride = 656
        }),
        ("index_stride-below-block-size", |l, _| {
            l[0].device.index_stride_rows = 63
        }),
        ("num_blocks-zero", |l, _| l[0].device.num_blocks = 0),
        ("block_size-zero", |l, _| {
            l[0].host.block_size = 0;
            l[0].device.block_size = 0;
        }),
        ("host-layout-beyond-buffer", |l, _| {
            l[1].host.num_blocks += 1
        }),
        ("device-layout-beyond-buffer", |l, _| {
            l[1].device.base += 656 * 64
        }),
        ("block_size-mismatch", |l, _| l[0].device.block_size = 32),
        ("value_bytes-mismatch", |l, _| l[0].device.value_bytes = 640),
        ("short-plan_src", |_, f| f.src_len -= 1),
        ("short-plan_dst", |_, f| f.dst_len -= 1),
        ("short-plan_counts", |_, f| f.counts_len -= 1),
        ("huge-plan", |_, f| {
            f.num_tokens = u32::MAX;
            f.top_k = u32::MAX;
        }),
    ];
    for &(name, b) in breaks {
        v.push(Case::fixed(
            format!("malformed/gather/{name}"),
            move |d: &D| {
                let (mut l, mut f) = gather_valid();
                b(&mut l, &mut f);
                gather_call(d, &l, &f, false)
            },
        ));
    }
    v.push(Case::fixed("malformed/gather/valid-baseline", |d: &D| {
        let (l, f) = gather_valid();
        gather_call(d, &l, &f, true)
    }));
}

#[derive(Clone, Copy, Debug)]
struct GatherFix {
    num_tokens: u32,
    top_k: u32,
    src_len: usize,
    dst_len: usize,
    counts_len: usize,
}

const GATHER_ROWS: Rows = Rows { layers: 2, ..MLA };

fn gather_valid() -> (Vec<LayerPair>, GatherFix) {
    (
        layouts(GATHER_ROWS, 3, 2),
        GatherFix {
            num_tokens: 2,
            top_k: 4,
            src_len: 8,
            dst_len: 8,
            counts_len: 2,
        },
    )
}

fn gather_call<D: Device>(dev: &D, layers: &[LayerPair], f: &GatherFix, valid: bool) -> CaseResult {
    let (hl, dl) = pool_sizes(GATHER_ROWS, 3, 2);
    let host: Vec<u8> = (0..hl).map(|i| (i % 251) as u8 + 1).collect();
    let d_host = pinned_bytes(dev, &host)?;
    let mut device = dev_bytes(dev, &vec![0xEE; dl])?;
    let src = dev_i32(dev, &vec![1; f.src_len])?;
    let dst = dev_i32(dev, &vec![2; f.dst_len])?;
    let counts = dev_i32(dev, &vec![1; f.counts_len])?;
    let s = dev.create_stream().ctx("create_stream")?;
    let r = dev.gather_rows(
        &s,
        &GatherDesc {
            num_tokens: f.num_tokens,
            top_k: f.top_k,
            layers,
        },
        GatherArgs {
            plan_src: &src,
            plan_dst: &dst,
            plan_counts: &counts,
            host: &d_host,
            device: &mut device,
        },
    );
    let got = read_bytes(dev, &device, dl)?;
    if valid {
        r.ctx("gather_rows (valid baseline)")?;
        // Host row 1 of layer 0 landed in device row 2.
        return same("baseline row", &got[2 * 656..3 * 656], &host[656..2 * 656]);
    }
    expect_invalid("gather_rows", r)?;
    same("device pool", &got, &vec![0xEE; dl])?;
    same("host pool", &read_pinned(dev, &d_host, hl)?, &host)
}

// ---------------------------------------------------------------------------------------------
// copy_pages, copy_rows, copy_host_pages

fn page_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    let ok = BlockPair { src: 0, dst: 1 };
    let pair_cases: [(&str, Direction, Vec<BlockPair>); 4] = [
        (
            "copy_pages/backup-src-out-of-range",
            Direction::DeviceToHost,
            vec![ok, BlockPair { src: 2, dst: 0 }],
        ),
        (
            "copy_pages/backup-dst-out-of-range",
            Direction::DeviceToHost,
            vec![ok, BlockPair { src: 0, dst: 3 }],
        ),
        (
            "copy_pages/restore-src-out-of-range",
            Direction::HostToDevice,
            vec![ok, BlockPair { src: 3, dst: 0 }],
        ),
        (
            "copy_pages/restore-dst-out-of-range",
            Direction::HostToDevice,
            vec![
                ok,
                BlockPair {
                    src: 0,
                    dst: u32::MAX,
                },
            ],
        ),
    ];
    for (name, dir, pairs) in pair_cases {
        v.push(Case::fixed(format!("malformed/{name}"), move |d: &D| {
            pools_call(d, |d, s, host, dev| {
                let layers = layouts(GATHER_ROWS, 3, 2);
                let desc = PageCopyDesc {
                    direction: dir,
                    layers: &layers,
                };
                d.copy_pages(s, &desc, &pairs, host, dev)
            })
        }));
    }
    v.push(Case::fixed("malformed/copy_pages/no-layers", |d: &D| {
        pools_call(d, |d, s, host, dev| {
            let desc = PageCopyDesc {
                direction: Direction::DeviceToHost,
                layers: &[],
            };
            d.copy_pages(s, &desc, &[BlockPair { src: 0, dst: 0 }], host, dev)
        })
    }));
    v.push(Case::fixed(
        "malformed/copy_pages/layout-beyond-buffer",
        |d: &D| {
            pools_call(d, |d, s, host, dev| {
                let mut layers = layouts(GATHER_ROWS, 3, 2);
                layers[1].device.num_blocks = 3;
                let desc = PageCopyDesc {
                    direction: Direction::HostToDevice,
                    layers: &layers,
                };
                d.copy_pages(s, &desc, &[BlockPair { src: 0, dst: 0 }], host, dev)
            })
        },
    ));
    let span = RowSpan {
        device_block: 0,
        host_block: 1,
        first_row: 0,
        num_rows: 4,
    };
    let span_cases: [(&str, RowSpan); 4] = [
        (
            "span-past-page-end",
            RowSpan {
                first_row: 60,
                num_rows: 5,
                ..span
            },
        ),
        (
            "span-first_row-overflow",
            RowSpan {
                first_row: u32::MAX,
                num_rows: 2,
                ..span
            },
        ),
        (
            "span-device_block-out-of-range",
            RowSpan {
                device_block: 2,
                ..span
            },
        ),
        (
            "span-host_block-out-of-range",
            RowSpan {
                host_block: 3,
                ..span
            },
        ),
    ];
    for (name, bad) in span_cases {
        for dir in [Direction::DeviceToHost, Direction::HostToDevice] {
            let dn = if dir == Direction::DeviceToHost {
                "mirror"
            } else {
                "restore"
            };
            v.push(Case::fixed(
                format!("malformed/copy_rows/{dn}-{name}"),
                move |d: &D| {
                    pools_call(d, |d, s, host, dev| {
                        let layers = layouts(GATHER_ROWS, 3, 2);
                        let desc = RowCopyDesc {
                            direction: dir,
                            layers: &layers,
                        };
                        d.copy_rows(s, &desc, &[span, bad], host, dev)
                    })
                },
            ));
        }
    }
    let host_cases: [(&str, Vec<BlockPair>); 3] = [
        ("src-equals-dst", vec![ok, BlockPair { src: 2, dst: 2 }]),
        ("dst-out-of-range", vec![ok, BlockPair { src: 2, dst: 3 }]),
        ("src-out-of-range", vec![ok, BlockPair { src: 7, dst: 2 }]),
    ];
    for (name, pairs) in host_cases {
        v.push(Case::fixed(
            format!("malformed/copy_host_pages/{name}"),
            move |d: &D| {
                pools_call(d, |d, s, host, _| {
                    let layers: Vec<PageLayout> =
                        layouts(GATHER_ROWS, 3, 2).iter().map(|l| l.host).collect();
                    d.copy_host_pages(s, &layers, &pairs, host)
                })
            },
        ));
    }
    v.push(Case::fixed(
        "malformed/copy_host_pages/no-layers",
        |d: &D| {
            pools_call(d, |d, s, host, _| {
                d.copy_host_pages(s, &[], &[BlockPair { src: 0, dst: 1 }], host)
            })
        },
    ));
}

/// Runs `f` on a pair of patterned pools; it must fail and leave both untouched.
fn pools_call<D: Device>(
    dev: &D,
    f: impl FnOnce(&D, &D::Stream, &mut D::HostBuffer, &mut D::Buffer) -> Result<(), D::Error>,
) -> CaseResult {
    let (hl, dl) = pool_sizes(GATHER_ROWS, 3, 2);
    let host: Vec<u8> = (0..hl).map(|i| (i % 253) as u8).collect();
    let device: Vec<u8> = (0..dl).map(|i| (i % 241) as u8).collect();
    let mut d_host = pinned_bytes(dev, &host)?;
    let mut d_dev = dev_bytes(dev, &device)?;
    let s = dev.create_stream().ctx("create_stream")?;
    expect_invalid("copy", f(dev, &s, &mut d_host, &mut d_dev))?;
    same("host pool", &read_pinned(dev, &d_host, hl)?, &host)?;
    same("device pool", &read_bytes(dev, &d_dev, dl)?, &device)
}

// ---------------------------------------------------------------------------------------------
// invalidate

fn invalidate_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    let valid = InvalidateDesc {
        num_requests: 2,
        hot_slots: 4,
        num_ranges: 2,
    };
    let list: [(&str, InvalidateDesc, usize, usize); 5] = [
        (
            "num_requests-zero",
            InvalidateDesc {
                num_requests: 0,
                ..valid
            },
            4,
            8,
        ),
        (
            "hot_slots-zero",
            InvalidateDesc {
                hot_slots: 0,
                ..valid
            },
            4,
            8,
        ),
        (
            "hot_slots-above-32768",
            InvalidateDesc {
                hot_slots: 32769,
                ..valid
            },
            4,
            2 * 32769,
        ),
        ("short-ranges", valid, 3, 8),
        ("short-slot_host_rows", valid, 4, 7),
    ];
    for (name, desc, ranges, slot_host_rows) in list {
        v.push(Case::fixed(
            format!("malformed/invalidate/{name}"),
            move |d: &D| {
                let all: Vec<i32> = (0..ranges)
                    .map(|i| if i % 2 == 0 { i32::MIN } else { i32::MAX })
                    .collect();
                let r = dev_i32(d, &all)?;
                let mut g = dev_i32(d, &vec![7; slot_host_rows])?;
                let s = d.create_stream().ctx("create_stream")?;
                let res = d.invalidate(
                    &s,
                    &desc,
                    InvalidateArgs {
                        ranges: &r,
                        slot_host_rows: &mut g,
                    },
                );
                expect_invalid("invalidate", res)?;
                same(
                    "slot_host_rows",
                    &read_i32(d, &g, slot_host_rows)?,
                    &vec![7; slot_host_rows],
                )
            },
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// compressed slot mapping

fn slot_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    let valid = SlotMappingDesc {
        num_tokens: 4,
        ratio: 4,
        block_size: 64,
        table_rows: 2,
        max_blocks: 2,
    };
    let list: [(&str, SlotMappingDesc, usize, usize); 6] = [
        ("ratio-zero", SlotMappingDesc { ratio: 0, ..valid }, 4, 4),
        (
            "block_size-not-multiple-of-ratio",
            SlotMappingDesc { ratio: 3, ..valid },
            4,
            4,
        ),
        (
            "block_size-below-ratio",
            SlotMappingDesc {
                ratio: 128,
                ..valid
            },
            4,
            4,
        ),
        (
            "table_rows-zero",
            SlotMappingDesc {
                table_rows: 0,
                ..valid
            },
            4,
            4,
        ),
        ("short-out", valid, 3, 4),
        ("short-block_table", valid, 4, 3),
    ];
    for (name, desc, out_len, table_len) in list {
        v.push(Case::fixed(
            format!("malformed/slot_mapping/{name}"),
            move |d: &D| {
                let t = dev_i32(d, &[3, 7, 11, 15])?;
                let table = dev_i32(d, &vec![1; table_len])?;
                let mut out = dev_i32(d, &vec![SENTINEL; out_len])?;
                let s = d.create_stream().ctx("create_stream")?;
                let res = d.compressed_slot_mapping(
                    &s,
                    &desc,
                    SlotMappingArgs {
                        positions: &t,
                        slot_mapping: &t,
                        table_row: &dev_i32(d, &[0; 4])?,
                        block_table: &table,
                        out: &mut out,
                    },
                );
                expect_invalid("compressed_slot_mapping", res)?;
                same(
                    "out",
                    &read_i32(d, &out, out_len)?,
                    &vec![SENTINEL; out_len],
                )
            },
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// bulk copies

fn bulk_cases<D: Device + 'static>(v: &mut Vec<Case<D>>) {
    // (name, src_offset, dst_offset, bytes) on 64-byte buffers.
    let list: [(&str, usize, usize, usize); 4] = [
        ("src-range-past-end", 40, 0, 32),
        ("dst-range-past-end", 0, 33, 32),
        ("bytes-past-end", 0, 0, 65),
        ("offset-overflow", usize::MAX, 0, 2),
    ];
    for (name, so, d_o, bytes) in list {
        v.push(Case::fixed(
            format!("malformed/bulk/{name}"),
            move |d: &D| {
                let init: Vec<u8> = (0..64).collect();
                let mut host = pinned_bytes(d, &init)?;
                let mut a = dev_bytes(d, &init)?;
                let mut b = dev_bytes(d, &init)?;
                let s = d.create_stream().ctx("create_stream")?;
                expect_invalid(
                    "copy_to_device",
                    d.copy_to_device(&s, &host, so, &mut a, d_o, bytes),
                )?;
                expect_invalid(
                    "copy_to_host",
                    d.copy_to_host(&s, &a, so, &mut host, d_o, bytes),
                )?;
                expect_invalid(
                    "copy_on_device",
                    d.copy_on_device(&s, &a, so, &mut b, d_o, bytes),
                )?;
                same("host", &read_pinned(d, &host, 64)?, &init)?;
                same("device a", &read_bytes(d, &a, 64)?, &init)?;
                same("device b", &read_bytes(d, &b, 64)?, &init)
            },
        ));
    }
}
