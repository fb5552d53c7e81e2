//! One scenario of every kind of data-plane work, generic over the backend and over where its
//! buffers and stream come from, for the tests of engine-owned memory and streams (the CUDA
//! backend's `tests/lent.rs`, the ROCm backend's `tests/hip_double.rs`): the backend's own
//! resources ([`Owned`]) and the engine's (a [`Lender`] the test writes) must give the same bytes.
//!
//! [`scenario`] runs remap (valid counts and compaction), resolve (a speculative request with
//! two rows), the gather of its misses, page copies both ways, a row copy, a copy inside the pool,
//! bulk copies, a table write and a hot-state reset, with the top-k uploaded by the "engine" on the
//! stream itself, and returns every buffer's bytes. Run once on buffers the backend owns and once
//! on lent ones, the two results must be identical byte for byte ([`compare`]).

use hisparse_core::Device;
use hisparse_core::ops::remap::remap;
use hisparse_core::ops::{
    BlockPair, Direction, GatherArgs, GatherDesc, HotResetDesc, LayerPair, PageCopyDesc,
    PageLayout, RemapArgs, ResolveArgs, ResolveDesc, RowCopyDesc, RowSpan, TableWrite,
    TableWriteDesc,
};

use super::{Res, device_err};
use crate::SplitMix64;
use crate::cases::resolve_io::remap_of;

/// Where a scenario's buffers and stream come from.
pub trait Lender<D: Device> {
    /// A zeroed device buffer of `len` bytes.
    fn buffer(&mut self, dev: &D, len: usize) -> Res<D::Buffer>;
    /// A zeroed pinned host buffer of `len` bytes; `second` asks for the scenario's second one
    /// (a lender may take it from a different kind of memory).
    fn host(&mut self, dev: &D, len: usize, second: bool) -> Res<D::HostBuffer>;
    /// The stream everything is enqueued on.
    fn stream(&mut self, dev: &D) -> Res<D::Stream>;
    /// Enqueues a copy of `bytes` from `src` to `dst` on `stream`, as the engine would do it
    /// itself (the default: through the backend).
    fn engine_copy(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        src: &D::HostBuffer,
        dst: &mut D::Buffer,
        bytes: usize,
    ) -> Res<()> {
        dev.copy_to_device(stream, src, 0, dst, 0, bytes)
            .map_err(device_err)
    }
}

/// Buffers and a stream the backend allocates and owns.
pub struct Owned;

impl<D: Device> Lender<D> for Owned {
    fn buffer(&mut self, dev: &D, len: usize) -> Res<D::Buffer> {
        dev.alloc(len).map_err(device_err)
    }
    fn host(&mut self, dev: &D, len: usize, _second: bool) -> Res<D::HostBuffer> {
        dev.alloc_pinned(len).map_err(device_err)
    }
    fn stream(&mut self, dev: &D) -> Res<D::Stream> {
        dev.create_stream().map_err(device_err)
    }
}

/// Rows per page.
pub const BS: u32 = 16;
/// Bytes per row.
pub const ROW: u32 = 64;
/// Blocks of the host pool.
pub const HOST_BLOCKS: u32 = 64;
/// Blocks of the device pool.
pub const DEV_BLOCKS: u32 = 32;
const PAGE: u64 = (BS * ROW) as u64;
/// Bytes of each host buffer.
pub const HOST_LEN: usize = (PAGE * HOST_BLOCKS as u64) as usize;
/// Bytes of the device pool.
pub const DEV_LEN: usize = (PAGE * DEV_BLOCKS as u64) as usize;
const T: u32 = 3;
const K: u32 = 32;
const R: u32 = 2;
const PAGES: u32 = 16;
const N: u32 = 64;

/// Runs the scenario on `dev` with `lender`'s buffers and stream, synchronises, and returns every
/// buffer's bytes (named), after checking the remap against the reference and that the resolve
/// had misses (so the gather moved rows).
pub fn scenario<D: Device>(dev: &D, lender: &mut impl Lender<D>) -> Res<Vec<(String, Vec<u8>)>> {
    let mut rng = SplitMix64::new(0x77a9);
    let tk = (T * K) as usize;
    let hot_w = N.div_ceil(BS);
    // Buffers by index.
    const REQ: usize = 0;
    const TOPK: usize = 1;
    const HOST_TABLE: usize = 2;
    const RESIDENT: usize = 3;
    const HOT: usize = 4;
    const DGI: usize = 5;
    const LRU: usize = 6;
    const MSRC: usize = 11;
    const MDST: usize = 12;
    const MISSES: usize = 10;
    const POOL: usize = 13;
    const REMAP_OUT: usize = 14;
    const BULK: usize = 16;
    let lens = [
        T as usize * 4,           // REQ
        tk * 4,                   // TOPK
        (R * PAGES) as usize * 4, // HOST_TABLE
        (R * PAGES) as usize * 4, // RESIDENT
        (R * hot_w) as usize * 4, // HOT
        (R * N) as usize * 4,     // DGI
        (R * N) as usize * 2,     // LRU
        tk * 4,                   // indices
        T as usize * 4,           // valid counts
        T as usize * 4,           // hit counts
        T as usize * 4,           // MISSES
        tk * 4,                   // MSRC
        tk * 4,                   // MDST
        DEV_LEN,                  // POOL
        tk * 4,                   // REMAP_OUT
        T as usize * 4,           // remap counts
        HOST_LEN,                 // BULK
    ];
    let mut b = Vec::new();
    for &len in &lens {
        b.push(lender.buffer(dev, len)?);
    }
    let mut host = lender.host(dev, HOST_LEN, false)?;
    let mut staging = lender.host(dev, HOST_LEN, true)?;
    let s = lender.stream(dev)?;

    // Inputs: request 0 has two rows (speculative decoding), request 1 one.
    let req = [0, 1, 0];
    // Positions from -1 (no entry) to a few past the pages the tables map.
    let topk: Vec<i32> = (0..tk)
        .map(|_| rng.i32_in(-1, (PAGES * BS) as i32 + 5))
        .collect();
    let host_table: Vec<i32> = (0..(R * PAGES) as i32).collect();
    let resident: Vec<i32> = (0..R * PAGES)
        .map(|i| if i % 5 == 0 { 1 + (i % 7) as i32 } else { 0 })
        .collect();
    let hot: Vec<i32> = (0..(R * hot_w) as i32).map(|i| 20 + i).collect();
    let lru: Vec<u16> = (0..R).flat_map(|_| 0..N as u16).collect();
    let mut host_bytes = vec![0u8; HOST_LEN];
    rng.fill(&mut host_bytes);
    let mut pool_bytes = vec![0u8; DEV_LEN];
    rng.fill(&mut pool_bytes);
    for (i, v) in [
        (REQ, &req[..]),
        (HOST_TABLE, &host_table[..]),
        (RESIDENT, &resident[..]),
        (HOT, &hot[..]),
        (DGI, &vec![-1; (R * N) as usize][..]),
    ] {
        dev.upload_i32(&mut b[i], 0, v).map_err(device_err)?;
    }
    dev.upload_u16(&mut b[LRU], 0, &lru).map_err(device_err)?;
    dev.upload(&mut b[POOL], 0, &pool_bytes)
        .map_err(device_err)?;
    dev.write_pinned(&mut host, 0, &host_bytes)
        .map_err(device_err)?;
    // The top-k arrives by an asynchronous copy the engine enqueues on the stream; the backend's
    // work after it must see it (one stream, one order).
    let topk_bytes: Vec<u8> = topk.iter().flat_map(|x| x.to_ne_bytes()).collect();
    dev.write_pinned(&mut staging, 0, &topk_bytes)
        .map_err(device_err)?;
    lender.engine_copy(dev, &s, &staging, &mut b[TOPK], topk_bytes.len())?;

    let resolve_desc = ResolveDesc {
        num_tokens: T,
        top_k: K,
        num_requests: R,
        max_pages: PAGES,
        block_size: BS,
        hot_slots: N,
        attention_block_stride: BS,
        host_num_blocks: HOST_BLOCKS,
        num_state_rows: None,
        stats_slot: 0,
    };
    // The remap reads the same batch through the host table (counts written, compacted).
    let remap_desc = remap_of(&resolve_desc, true, true, 0);
    {
        let (inputs, outs) = b.split_at_mut(REMAP_OUT);
        let [out, counts, ..] = outs else {
            unreachable!("remap outputs")
        };
        dev.remap(
            &s,
            &remap_desc,
            RemapArgs {
                req_id: &inputs[REQ],
                block_table: &inputs[HOST_TABLE],
                topk: &inputs[TOPK],
                idx_mapping: None,
                out,
                counts: Some(counts),
                stats: None,
            },
        )
        .map_err(device_err)?;
    }
    {
        let (inputs, outs) = b.split_at_mut(DGI);
        let [
            slot_host_rows,
            lru,
            ind,
            valid,
            hits,
            misses,
            msrc,
            mdst,
            ..,
        ] = outs
        else {
            unreachable!("resolve outputs")
        };
        dev.resolve(
            &s,
            &resolve_desc,
            ResolveArgs {
                req_id: &inputs[REQ],
                topk: &inputs[TOPK],
                resident_table: &inputs[RESIDENT],
                host_table: &inputs[HOST_TABLE],
                hot_table: &inputs[HOT],
                slot_host_rows,
                lru,
                indices: ind,
                valid_counts: valid,
                hit_counts: hits,
                miss_counts: misses,
                miss_src: msrc,
                miss_dst: mdst,
                idx_mapping: None,
                stats: None,
            },
        )
        .map_err(device_err)?;
    }
    let layer = [LayerPair {
        host: PageLayout::contiguous(0, PAGE, HOST_BLOCKS, BS, ROW),
        device: PageLayout::contiguous(0, PAGE, DEV_BLOCKS, BS, ROW),
    }];
    {
        let (plan, pool) = b.split_at_mut(POOL);
        dev.gather_rows(
            &s,
            &GatherDesc {
                num_tokens: T,
                top_k: K,
                layers: &layer,
            },
            GatherArgs {
                plan_src: &plan[MSRC],
                plan_dst: &plan[MDST],
                plan_counts: &plan[MISSES],
                host: &host,
                device: &mut pool[0],
            },
        )
        .map_err(device_err)?;
    }
    let out_desc = PageCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layer,
    };
    let in_desc = PageCopyDesc {
        direction: Direction::HostToDevice,
        layers: &layer,
    };
    let pairs_out = [BlockPair { src: 1, dst: 40 }, BlockPair { src: 2, dst: 41 }];
    dev.copy_pages(&s, &out_desc, &pairs_out, &mut host, &mut b[POOL])
        .map_err(device_err)?;
    let pairs_in = [BlockPair { src: 5, dst: 10 }];
    dev.copy_pages(&s, &in_desc, &pairs_in, &mut host, &mut b[POOL])
        .map_err(device_err)?;
    let span = RowSpan {
        device_block: 7,
        host_block: 50,
        first_row: 3,
        num_rows: 9,
    };
    let rows_desc = RowCopyDesc {
        direction: Direction::DeviceToHost,
        layers: &layer,
    };
    dev.copy_rows(&s, &rows_desc, &[span], &mut host, &mut b[POOL])
        .map_err(device_err)?;
    let page = PAGE as usize;
    dev.copy_within_device(&s, &mut b[POOL], 3 * page, 12 * page, page)
        .map_err(device_err)?;
    {
        let (lo, hi) = b.split_at_mut(BULK);
        dev.copy_to_device(&s, &host, 0, &mut hi[0], 0, HOST_LEN)
            .map_err(device_err)?;
        dev.copy_on_device(&s, &lo[POOL], 0, &mut hi[0], 512, DEV_LEN)
            .map_err(device_err)?;
        dev.copy_to_host(&s, &lo[POOL], 0, &mut staging, 0, DEV_LEN)
            .map_err(device_err)?;
    }
    let writes = [
        TableWrite { index: 0, value: 9 },
        TableWrite {
            index: 7,
            value: -1,
        },
        TableWrite {
            index: 31,
            value: 3,
        },
    ];
    let table_desc = TableWriteDesc {
        table_len: R * PAGES,
    };
    dev.write_table(&s, &table_desc, &writes, &mut b[RESIDENT])
        .map_err(device_err)?;
    {
        let (slot_host_rows, lru) = b[DGI..].split_at_mut(1);
        let reset = HotResetDesc {
            num_requests: R,
            hot_slots: N,
        };
        dev.reset_hot_state(&s, &reset, &[1], &mut slot_host_rows[0], &mut lru[0])
            .map_err(device_err)?;
    }
    dev.synchronize(&s).map_err(device_err)?;

    // Sanity against the reference where it is cheap: the remap; and the gather moved rows.
    let mut want = vec![0i32; tk];
    let mut want_counts = vec![0i32; T as usize];
    remap(
        &remap_desc,
        RemapArgs {
            req_id: &req[..],
            block_table: &host_table[..],
            topk: &topk[..],
            idx_mapping: None,
            out: &mut want[..],
            counts: Some(&mut want_counts[..]),
            stats: None,
        },
    )
    .map_err(device_err)?;
    let mut got = vec![0i32; tk];
    dev.download_i32(&b[REMAP_OUT], 0, &mut got)
        .map_err(device_err)?;
    if got != want {
        return Err("remap differs from the reference".into());
    }
    let mut misses = vec![0i32; T as usize];
    dev.download_i32(&b[MISSES], 0, &mut misses)
        .map_err(device_err)?;
    if misses.iter().sum::<i32>() == 0 {
        return Err("the scenario's resolve had no misses: the gather moved nothing".into());
    }

    let mut out = Vec::new();
    for (i, buf) in b.iter().enumerate() {
        let mut v = vec![0u8; lens[i]];
        dev.download(buf, 0, &mut v).map_err(device_err)?;
        out.push((format!("device buffer {i}"), v));
    }
    for (name, h) in [("host pool", &host), ("staging", &staging)] {
        let mut v = vec![0u8; HOST_LEN];
        dev.read_pinned(h, 0, &mut v).map_err(device_err)?;
        out.push((name.to_owned(), v));
    }
    Ok(out)
}

/// Fails unless the two runs produced the same bytes everywhere.
pub fn compare(owned: &[(String, Vec<u8>)], lent: &[(String, Vec<u8>)]) -> Res<()> {
    if owned.len() != lent.len() {
        return Err(format!(
            "{} outputs owned, {} lent",
            owned.len(),
            lent.len()
        ));
    }
    for ((name, a), (_, b)) in owned.iter().zip(lent) {
        if a != b {
            let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
            return Err(format!(
                "{name} differs between owned and lent resources (first at byte {at})"
            ));
        }
    }
    Ok(())
}
