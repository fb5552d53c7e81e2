//! Planners of the indexer backup and of page and row copies, split into launches that honour
//! the core's copy-conflict rule.

use core::ops::Range;

use hisparse_core::ops::copy::{ByteRange, CopyFootprint, copy_batches};
use hisparse_core::ops::{
    BlockPair, Direction, IndexerBackupDesc, PageLayout, RowCopyDesc, RowSpan,
};

use super::{
    Launch, PartKind, Plan, PlanError, Target, check_layers, check_layout, check_pool, geometry,
    limit, stride_grid,
};
use crate::args::Args;
use crate::{
    COPY_THREADS, DIRECTION_DEVICE_TO_HOST, DIRECTION_HOST_TO_DEVICE, INDEXER_GROUP,
    INDEXER_THREADS, Kernel, LayerPairAbi, PageJob, Pair, Span,
};

/// Device addresses of an indexer backup's buffers (`host`: the device address of the mapped
/// indexer host cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per buffer of `IndexerBackupArgs`
pub struct IndexerBackupAddrs {
    pub device_slots: u64,
    pub host_slots: u64,
    pub device: u64,
    pub host: u64,
}

/// `hs_indexer_backup`: one launch for every layer and token, groups of
/// [`crate::INDEXER_GROUP`] threads per row, grid-stride; the layer table is a constant list
/// (the same indexer layers on every call). The descriptor is checked by the core first
/// (`IndexerBackupDesc::check`: rows of 4-byte words, pages on 16-byte boundaries).
pub fn indexer_backup(
    t: &Target,
    d: &IndexerBackupDesc<'_>,
    a: &IndexerBackupAddrs,
) -> Result<Plan, PlanError> {
    if d.num_tokens == 0 || d.layers.is_empty() {
        return Ok(Plan::empty());
    }
    limit(
        "indexer_backup layers",
        d.layers.len() as u64,
        u32::MAX.into(),
    )?;
    check_pool("indexer_backup device pool address", a.device)?;
    check_pool("indexer_backup host cache address", a.host)?;
    let layer_abi: Vec<LayerPairAbi> = d.layers.iter().map(LayerPairAbi::from).collect();
    let mut plan = Plan::empty();
    let lp = plan.stage(
        bytemuck::cast_slice(&layer_abi).to_vec(),
        PartKind::Constant,
    );
    let rows = d.layers.len() as u64 * u64::from(d.num_tokens);
    let per_block = u64::from(INDEXER_THREADS / INDEXER_GROUP);
    let mut args = Args::default();
    args.ptr(a.device_slots)
        .ptr(a.host_slots)
        .u32(d.num_tokens)
        .staged(lp, 0)
        .u32(d.layers.len() as u32)
        .ptr(a.device)
        .ptr(a.host);
    plan.launches.push(Launch {
        kernel: Kernel::IndexerBackup,
        grid: [stride_grid(t, rows, per_block), 1, 1],
        block: INDEXER_THREADS,
        shared: 0,
        args,
    });
    Ok(plan)
}

// Page and row copies

/// Splits the tiles of a `layers × items` copy (tile `l * items + i`, the reference's order)
/// at the batch boundaries of the copy-conflict rule, into launch rectangles
/// `(layer range, item range)` in stream order: one rectangle when nothing conflicts.
pub(super) fn rectangles(
    batches: &[Range<usize>],
    items: usize,
) -> Vec<(Range<usize>, Range<usize>)> {
    let mut out = Vec::new();
    for b in batches {
        let (mut at, end) = (b.start, b.end);
        while at < end {
            let (l, i) = (at / items, at % items);
            if i == 0 && end - at >= items {
                // Whole layers.
                let layers = (end - at) / items;
                out.push((l..l + layers, 0..items));
                at += layers * items;
            } else {
                let stop = (end - at).min(items - i);
                out.push((l..l + 1, i..i + stop));
                at += stop;
            }
        }
    }
    out
}

/// Whole-page copies: `jobs[l] = (source layout, destination layout)` of layer `l`, each pair
/// copied for every layer, in the reference's order (layer by layer); `src`, `dst` the buffers'
/// device addresses, `same_buffer` when they are one buffer (host copy-on-write). Launches
/// `hs_copy_pages` over layers × pairs, split where the copy-conflict rule says.
pub fn copy_pages(
    t: &Target,
    jobs: &[(PageLayout, PageLayout)],
    pairs: &[BlockPair],
    src: u64,
    dst: u64,
    same_buffer: bool,
) -> Result<Plan, PlanError> {
    if jobs.is_empty() || pairs.is_empty() {
        return Ok(Plan::empty());
    }
    limit("copy_pages layers", jobs.len() as u64, u32::MAX.into())?;
    limit("copy_pages pairs", pairs.len() as u64, u32::MAX.into())?;
    for (s, d) in jobs {
        check_layout(s)?;
        check_layout(d)?;
        geometry(
            s.page_bytes() == d.page_bytes(),
            "copy_pages destination page bytes",
            d.page_bytes(),
            "the source's page bytes",
        )?;
    }
    check_pool("copy_pages source address", src)?;
    check_pool("copy_pages destination address", dst)?;
    let mut tiles = Vec::with_capacity(jobs.len() * pairs.len());
    for (s, d) in jobs {
        for p in pairs {
            tiles.push(CopyFootprint::contiguous(
                s.page_offset(p.src),
                d.page_offset(p.dst),
                s.page_bytes(),
            ));
        }
    }
    let job_abi: Vec<PageJob> = jobs
        .iter()
        .map(|(s, d)| PageJob {
            src_base: s.base,
            src_stride: s.block_stride,
            dst_base: d.base,
            dst_stride: d.block_stride,
            page_bytes: s.page_bytes(),
        })
        .collect();
    let pair_abi: Vec<Pair> = pairs
        .iter()
        .map(|p| Pair {
            src: p.src,
            dst: p.dst,
        })
        .collect();
    let mut plan = Plan::empty();
    let jp = plan.stage(bytemuck::cast_slice(&job_abi).to_vec(), PartKind::Constant);
    let pp = plan.stage(bytemuck::cast_slice(&pair_abi).to_vec(), PartKind::PerCall);
    for (layers, items) in rectangles(&copy_batches(&tiles, same_buffer), pairs.len()) {
        let (nl, np) = (layers.len() as u32, items.len() as u32);
        let mut args = Args::default();
        args.staged(jp, (layers.start * size_of::<PageJob>()) as u64)
            .u32(nl)
            .staged(pp, (items.start * size_of::<Pair>()) as u64)
            .u32(np)
            .ptr(src)
            .ptr(dst);
        plan.launches.push(Launch {
            kernel: Kernel::CopyPages,
            grid: [stride_grid(t, u64::from(nl) * u64::from(np), 1), 1, 1],
            block: COPY_THREADS,
            shared: 0,
            args,
        });
    }
    Ok(plan)
}

/// Row-span copies of `desc` (`host` the device address of the mapped host pool, `device` of the
/// device pool): `hs_copy_rows` over layers × non-empty spans, split where the copy-conflict rule
/// says (repeated destination rows).
pub fn copy_rows(
    t: &Target,
    desc: &RowCopyDesc<'_>,
    spans: &[RowSpan],
    host: u64,
    device: u64,
) -> Result<Plan, PlanError> {
    let spans: Vec<RowSpan> = spans.iter().copied().filter(|s| s.num_rows > 0).collect();
    if spans.is_empty() || desc.layers.is_empty() {
        return Ok(Plan::empty());
    }
    limit(
        "copy_rows layers",
        desc.layers.len() as u64,
        u32::MAX.into(),
    )?;
    limit("copy_rows spans", spans.len() as u64, u32::MAX.into())?;
    check_layers(desc.layers)?;
    for l in desc.layers {
        geometry(
            (l.host.row_bytes, l.host.value_bytes) == (l.device.row_bytes, l.device.value_bytes),
            "copy_rows device row_bytes",
            l.device.row_bytes.into(),
            "the host layout's row geometry (row_bytes and value_bytes)",
        )?;
    }
    check_pool("copy_rows host pool address", host)?;
    check_pool("copy_rows device pool address", device)?;
    let mut tiles = Vec::with_capacity(desc.layers.len() * spans.len());
    for l in desc.layers {
        let (sl, dl) = match desc.direction {
            Direction::DeviceToHost => (&l.device, &l.host),
            Direction::HostToDevice => (&l.host, &l.device),
        };
        for s in &spans {
            let (sb, db) = match desc.direction {
                Direction::DeviceToHost => (s.device_block, s.host_block),
                Direction::HostToDevice => (s.host_block, s.device_block),
            };
            let n = u64::from(s.num_rows);
            let part = |layout: &PageLayout, block: u32| {
                let [(v, vl), (c, cl)] = layout.row_parts(block, s.first_row);
                [ByteRange::new(v, vl * n), ByteRange::new(c, cl * n)]
            };
            tiles.push(CopyFootprint {
                src: part(sl, sb),
                dst: part(dl, db),
            });
        }
    }
    let layer_abi: Vec<LayerPairAbi> = desc.layers.iter().map(LayerPairAbi::from).collect();
    let span_abi: Vec<Span> = spans
        .iter()
        .map(|s| Span {
            device_block: s.device_block,
            host_block: s.host_block,
            first_row: s.first_row,
            num_rows: s.num_rows,
        })
        .collect();
    let direction = match desc.direction {
        Direction::DeviceToHost => DIRECTION_DEVICE_TO_HOST,
        Direction::HostToDevice => DIRECTION_HOST_TO_DEVICE,
    };
    let mut plan = Plan::empty();
    let lp = plan.stage(
        bytemuck::cast_slice(&layer_abi).to_vec(),
        PartKind::Constant,
    );
    let sp = plan.stage(bytemuck::cast_slice(&span_abi).to_vec(), PartKind::PerCall);
    // Different buffers: only destinations can conflict.
    for (layers, items) in rectangles(&copy_batches(&tiles, false), spans.len()) {
        let (nl, ns) = (layers.len() as u32, items.len() as u32);
        let mut args = Args::default();
        args.staged(lp, (layers.start * size_of::<LayerPairAbi>()) as u64)
            .u32(nl)
            .staged(sp, (items.start * size_of::<Span>()) as u64)
            .u32(ns)
            .u32(direction)
            .ptr(host)
            .ptr(device);
        plan.launches.push(Launch {
            kernel: Kernel::CopyRows,
            grid: [stride_grid(t, u64::from(nl) * u64::from(ns), 1), 1, 1],
            block: COPY_THREADS,
            shared: 0,
            args,
        });
    }
    Ok(plan)
}
