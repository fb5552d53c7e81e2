//! Kernel launches: decoding the parameters with the ABI table of `hisparse-gpu-kernels`, checking
//! the launch shape each kernel documents, and running each kernel as the core's reference
//! operation, except the copy kernels (gather, page and row copies), which are emulated access by
//! access as the kernel source chunks them (module `copy`): their alignment faults and the bytes
//! they copy are the kernels', not the reference's.
//!
//! A kernel reads and writes only through pointers it was given: every range is checked against
//! the live allocations, and a range outside them is a fault (sticky `hipErrorIllegalAddress`).

use std::ffi::c_void;

use hisparse_core::ops::indexer_backup::indexer_backup;
use hisparse_core::ops::invalidate::invalidate;
use hisparse_core::ops::remap::{remap, remap_modes};
use hisparse_core::ops::resolve::resolve;
use hisparse_core::ops::slot_mapping::compressed_slot_mapping;
use hisparse_core::ops::table::{reset_hot_state, write_table};
use hisparse_core::ops::{
    DcpSplit, HotResetDesc, IndexerBackupArgs, IndexerBackupDesc, InvalidateArgs, InvalidateDesc,
    LayerPair, PageLayout, RemapArgs, RemapDesc, RemapModesArgs, RemapModesDesc, ResolveDesc,
    ResolveSlices, STATS_SLOT_WORDS, SlotMappingArgs, SlotMappingDesc, TableWrite, TableWriteDesc,
};
use hisparse_gpu_kernels::{self as gk, Kernel, KernelAbi, Param};

use crate::state::State;
use crate::status::*;

/// A decoded launch, queued until its stream runs.
#[derive(Clone, Debug)]
pub struct Launch {
    kernel: Kernel,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// Raw bytes of each parameter, in ABI order.
    args: Vec<Vec<u8>>,
}

/// Every kernel name of the ABI table.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    Kernel::ALL.iter().map(|k| k.name())
}

/// Index in [`Kernel::ALL`] of the kernel called `name`.
pub fn kernel_index(name: &str) -> Option<usize> {
    Kernel::ALL.iter().position(|k| k.name() == name)
}

/// Name of the launched kernel.
pub fn kernel_name(l: &Launch) -> &'static str {
    l.kernel.name()
}

/// Copies each parameter value out of the caller's `params` array.
///
/// # Safety
/// `params` holds one valid pointer per parameter of kernel `index`, each pointing at a value of
/// the size the ABI table declares.
pub unsafe fn decode(
    st: &State,
    index: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    params: *mut *mut c_void,
) -> Result<Launch, u32> {
    let kernel = Kernel::ALL[index];
    let abi = kernel.abi();
    let mut args = Vec::with_capacity(abi.params.len());
    for (i, p) in abi.params.iter().enumerate() {
        // SAFETY: per the caller's contract, `params` has an entry per parameter.
        let value = unsafe { *params.add(i) };
        if value.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let mut bytes = vec![0u8; p.ty.size()];
        // SAFETY: per the caller's contract, `value` points at `p.ty.size()` readable bytes;
        // `bytes` is a distinct buffer of that size.
        unsafe {
            std::ptr::copy_nonoverlapping(value.cast::<u8>(), bytes.as_mut_ptr(), bytes.len())
        };
        // A non-null pointer argument must point into a live allocation at launch time.
        if p.ty == Param::Ptr {
            let addr = u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
            if addr != 0 && st.room(addr).is_none() {
                return Err(HIP_ERROR_INVALID_VALUE);
            }
        }
        args.push(bytes);
    }
    // The block the kernel is written for; kernels with a variable block take any multiple of
    // 64 threads (whole wavefronts) up to it.
    let block_ok = block == [abi.block_threads, 1, 1]
        || (abi.variable_block
            && block[0] <= abi.block_threads
            && block[0] > 0
            && block[0].is_multiple_of(64)
            && block[1..] == [1, 1]);
    if !block_ok {
        return Err(HIP_ERROR_INVALID_CONFIGURATION);
    }
    Ok(Launch {
        kernel,
        grid,
        block,
        shared,
        args,
    })
}

/// Typed access to a launch's parameters by name.
pub(crate) struct Params<'a> {
    pub(crate) abi: KernelAbi,
    pub(crate) args: &'a [Vec<u8>],
}

impl Params<'_> {
    pub(crate) fn raw(&self, name: &str) -> &[u8] {
        let i = self
            .abi
            .params
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("double: {} has no parameter {name}", self.abi.name));
        &self.args[i]
    }
    pub(crate) fn u32(&self, name: &str) -> u32 {
        u32::from_ne_bytes(self.raw(name)[..4].try_into().expect("4 bytes"))
    }
    fn u64(&self, name: &str) -> u64 {
        u64::from_ne_bytes(self.raw(name)[..8].try_into().expect("8 bytes"))
    }
    pub(crate) fn ptr(&self, name: &str) -> usize {
        self.u64(name) as usize
    }
}

pub(crate) fn range(st: &State, what: &str, addr: usize, bytes: usize) -> Result<(), String> {
    if bytes == 0 {
        return Ok(());
    }
    if addr == 0 {
        return Err(format!(
            "`{what}` is null but {bytes} bytes are read or written"
        ));
    }
    st.find(addr, bytes).map(|_| ()).ok_or_else(|| {
        format!("`{what}`: {bytes} bytes at {addr:#x} are not inside one allocation")
    })
}

pub(crate) fn read_i32(st: &State, what: &str, addr: usize, n: usize) -> Result<Vec<i32>, String> {
    range(st, what, addr, n * 4)?;
    Ok(crate::mem::read(st, addr, n * 4)
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

fn write_i32(st: &State, addr: usize, v: &[i32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    crate::mem::write(st, addr, &bytes);
}

fn read_u16(st: &State, what: &str, addr: usize, n: usize) -> Result<Vec<u16>, String> {
    range(st, what, addr, n * 2)?;
    Ok(crate::mem::read(st, addr, n * 2)
        .chunks_exact(2)
        .map(|c| u16::from_ne_bytes(c.try_into().expect("2 bytes")))
        .collect())
}

fn write_u16(st: &State, addr: usize, v: &[u16]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    crate::mem::write(st, addr, &bytes);
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The four words of the call's stats slot (the `stats` parameter addresses them), or `None`
/// for a null pointer (no stats).
fn read_stats(st: &State, p: &Params<'_>) -> Result<Option<Vec<i32>>, String> {
    match p.ptr("stats") {
        0 => Ok(None),
        at => read_i32(st, "stats", at, STATS_SLOT_WORDS as usize).map(Some),
    }
}

/// Writes back the stats words [`read_stats`] read (and the reference added to).
fn write_stats(st: &State, p: &Params<'_>, words: Option<Vec<i32>>) {
    if let Some(w) = words {
        write_i32(st, p.ptr("stats"), &w);
    }
}

fn need_grid(l: &Launch, min: [u64; 3]) -> Result<(), String> {
    for (d, (&g, &m)) in l.grid.iter().zip(&min).enumerate() {
        if u64::from(g) < m {
            return Err(format!(
                "grid {:?} is too small: dimension {d} must be at least {m} (work would be skipped)",
                l.grid
            ));
        }
    }
    Ok(())
}

/// Runs one launch against the double's memory.
pub fn run(st: &mut State, l: &Launch) -> Result<(), String> {
    let p = Params {
        abi: l.kernel.abi(),
        args: &l.args,
    };
    debug_assert!(l.block[0] <= p.abi.block_threads);
    match l.kernel {
        // The wide remap computes the plain remap (its flags carry no counts or compaction).
        Kernel::Remap | Kernel::RemapWide => run_remap(st, l, &p),
        Kernel::RemapModes => run_remap_modes(st, l, &p),
        Kernel::Resolve => run_resolve(st, l, &p),
        Kernel::GatherRows => run_gather(st, l, &p),
        Kernel::CopyPages => crate::copy::copy_pages(st, &p),
        Kernel::CopyRows => crate::copy::copy_rows(st, &p),
        Kernel::Invalidate => run_invalidate(st, &p),
        Kernel::CompressedSlotMapping => run_slot_mapping(st, l, &p),
        Kernel::IndexerBackup => run_indexer_backup(st, l, &p),
        Kernel::WriteTable => run_write_table(st, &p),
        Kernel::ResetHotState => run_reset_hot_state(st, &p),
        Kernel::ResolveGather => {
            // The resolve, then the gather of its miss plan (the kernel's documented result).
            run_resolve(st, l, &p)?;
            run_gather_of(st, l, &p, ("miss_src", "miss_dst", "miss_counts"))
        }
    }
}

/// A remap launch's descriptor and buffers, read from the double's memory: what `hs_remap` and
/// `hs_remap_modes` share (the modes kernel takes the same parameters, and more).
struct RemapIo {
    desc: RemapDesc,
    req: Vec<i32>,
    table: Vec<i32>,
    topk: Vec<i32>,
    map: Option<Vec<i32>>,
    out: Vec<i32>,
    counts: Option<Vec<i32>>,
    stats: Option<Vec<i32>>,
}

impl RemapIo {
    fn read(st: &State, l: &Launch, p: &Params<'_>) -> Result<Self, String> {
        let flags = p.u32("flags");
        let desc = RemapDesc {
            num_tokens: p.u32("num_tokens"),
            top_k: p.u32("top_k"),
            table_rows: p.u32("table_rows"),
            max_blocks: p.u32("max_blocks"),
            block_size: p.u32("block_size"),
            block_stride_rows: p.u32("block_stride_rows"),
            idx_mapping_len: (flags & gk::REMAP_HAS_MAP != 0).then(|| p.u32("idx_mapping_len")),
            write_counts: flags & gk::REMAP_COUNTS != 0,
            compact: flags & gk::REMAP_COMPACT != 0,
            // The kernel gets the slot's own words.
            stats_slot: 0,
        };
        // Blocks take token rows grid-stride: any grid covers every row.
        need_grid(l, [1, 1, 1])?;
        let t = desc.num_tokens as usize;
        let tk = t * desc.top_k as usize;
        let rows = desc.table_rows as usize * desc.max_blocks as usize;
        // Read in parameter order, so the first bad buffer is the one a fault names.
        Ok(RemapIo {
            req: read_i32(st, "req_id", p.ptr("req_id"), t)?,
            table: read_i32(st, "block_table", p.ptr("block_table"), rows)?,
            topk: read_i32(st, "topk", p.ptr("topk"), tk)?,
            map: match desc.idx_mapping_len {
                Some(n) => Some(read_i32(
                    st,
                    "idx_mapping",
                    p.ptr("idx_mapping"),
                    n as usize,
                )?),
                None => None,
            },
            out: read_i32(st, "out", p.ptr("out"), tk)?,
            counts: match desc.write_counts {
                true => Some(read_i32(st, "counts", p.ptr("counts"), t)?),
                false => None,
            },
            stats: read_stats(st, p)?,
            desc,
        })
    }

    /// The reference's arguments over these buffers.
    fn args(&mut self) -> RemapArgs<'_, [i32]> {
        RemapArgs {
            req_id: &self.req[..],
            block_table: &self.table[..],
            topk: &self.topk[..],
            idx_mapping: self.map.as_deref(),
            out: &mut self.out[..],
            counts: self.counts.as_deref_mut(),
            stats: self.stats.as_deref_mut(),
        }
    }

    /// Writes back what the reference wrote.
    fn write(self, st: &State, p: &Params<'_>) {
        write_i32(st, p.ptr("out"), &self.out);
        if let Some(c) = self.counts {
            write_i32(st, p.ptr("counts"), &c);
        }
        write_stats(st, p, self.stats);
    }
}

fn run_remap(st: &mut State, l: &Launch, p: &Params<'_>) -> Result<(), String> {
    let mut io = RemapIo::read(st, l, p)?;
    let desc = io.desc;
    remap(&desc, io.args()).map_err(|e| e.to_string())?;
    io.write(st, p);
    Ok(())
}

/// `hs_remap_modes`: the reference remap with modes (the host checked the descriptor; one it
/// would refuse is a fault here).
fn run_remap_modes(st: &mut State, l: &Launch, p: &Params<'_>) -> Result<(), String> {
    let mut io = RemapIo::read(st, l, p)?;
    let dcp_size = p.u32("dcp_size");
    let prefill = p.u32("prefill_requests");
    let desc = RemapModesDesc {
        remap: io.desc,
        dcp: (dcp_size != 0).then(|| DcpSplit {
            size: dcp_size,
            rank: p.u32("dcp_rank"),
            interleave: p.u32("dcp_interleave"),
        }),
        prefill_requests: (prefill != 0).then_some(prefill),
    };
    let t = io.desc.num_tokens as usize;
    let (ids, starts) = if prefill != 0 {
        (
            Some(read_i32(st, "prefill_req_id", p.ptr("prefill_req_id"), t)?),
            Some(read_i32(
                st,
                "workspace_starts",
                p.ptr("workspace_starts"),
                prefill as usize,
            )?),
        )
    } else {
        (None, None)
    };
    remap_modes(
        &desc,
        RemapModesArgs {
            remap: io.args(),
            prefill_req_id: ids.as_deref(),
            workspace_starts: starts.as_deref(),
        },
    )
    .map_err(|e| e.to_string())?;
    io.write(st, p);
    Ok(())
}

fn run_resolve(st: &mut State, l: &Launch, p: &Params<'_>) -> Result<(), String> {
    let desc = ResolveDesc {
        num_tokens: p.u32("num_tokens"),
        top_k: p.u32("top_k"),
        num_requests: p.u32("num_requests"),
        max_pages: p.u32("max_pages"),
        block_size: p.u32("block_size"),
        hot_slots: p.u32("hot_slots"),
        attention_block_stride: p.u32("attention_block_stride"),
        host_num_blocks: p.u32("host_num_blocks"),
        // Batch-row order exactly when the kernel gets an idx_mapping.
        num_state_rows: (p.ptr("idx_mapping") != 0).then(|| p.u32("num_state_rows")),
        // The kernel gets the slot's own words.
        stats_slot: 0,
    };
    desc.validate().map_err(|e| e.to_string())?;
    need_grid(l, [desc.num_tokens.into(), 1, 1])?;
    // Bit 31 selects global-state mode (LRU copy, partition and bitmap in the workspace); the
    // low 31 bits are the shared table capacity.
    let table_arg = p.u32("smem_table_entries");
    let global = table_arg & gk::RESOLVE_GLOBAL_STATE != 0;
    let smem_table = table_arg & !gk::RESOLVE_GLOBAL_STATE;
    if smem_table != 0 && !smem_table.is_power_of_two() {
        return Err(format!(
            "smem_table_entries {smem_table} is not a power of two"
        ));
    }
    let needed = if global {
        gk::resolve_global_shared_bytes(smem_table)
    } else {
        gk::resolve_shared_bytes(desc.hot_slots, smem_table)
    };
    if u64::from(l.shared) < needed {
        return Err(format!(
            "{} bytes of dynamic shared memory, the kernel uses {needed}",
            l.shared
        ));
    }
    let (t, k) = (desc.num_tokens as usize, desc.top_k as usize);
    let (r, n) = (desc.num_requests as usize, desc.hot_slots as usize);
    let req = read_i32(st, "req_id", p.ptr("req_id"), t)?;
    let map = match desc.num_state_rows {
        Some(_) => Some(read_i32(st, "idx_mapping", p.ptr("idx_mapping"), r)?),
        None => None,
    };
    let state_rows = desc.state_table_rows() as usize;

    // The wanted-row tables of requests too big for shared memory come from the workspace,
    // bump-allocated through the counter, which must be zero when the kernel starts.
    let mut from_workspace = 0u64;
    for first in 0..t {
        let q = req[first];
        if desc.request_rows(q, map.as_deref()).is_none() || req[..first].contains(&q) {
            continue;
        }
        let rows = req[first..].iter().filter(|&&x| x == q).count() as u64;
        if global {
            // Every resolving block takes its state from the workspace.
            from_workspace += gk::resolve_state_entries(desc.hot_slots);
        }
        let cap = gk::resolve_table_entries(rows * desc.top_k as u64);
        if cap > u64::from(smem_table) {
            // At least the table's `cap` entries (how much more a block takes is the kernel's
            // business; the host sizes the workspace with `resolve_workspace_entries`).
            from_workspace += cap;
        }
    }
    if from_workspace > 0 {
        let counter = p.ptr("workspace_counter");
        let words = read_i32(st, "workspace_counter", counter, 3)?;
        if words[0] != 0 || words[1] != 0 {
            return Err(format!(
                "the workspace counters are {:?} at launch; the host zeroes them when it \
                 allocates the workspace and every launch leaves them zero",
                &words[..2]
            ));
        }
        let entries = u64::from(p.u32("workspace_entries"));
        if from_workspace > entries {
            return Err(format!(
                "the launch needs {from_workspace} workspace entries, {entries} were given"
            ));
        }
        // The whole declared workspace must be device memory the kernel may use.
        range(st, "workspace", p.ptr("workspace"), entries as usize * 16)?;
        // As the kernel leaves them: allocator and finished blocks back to zero, the most
        // entries one launch took in the third word.
        let most = (words[gk::WORKSPACE_HIGH_WATER_WORD] as u32).max(from_workspace as u32);
        write_i32(st, counter, &[0, 0, most as i32]);
    }

    let w = desc.hot_table_width() as usize;
    let topk = read_i32(st, "topk", p.ptr("topk"), t * k)?;
    let resident = read_i32(
        st,
        "resident_table",
        p.ptr("resident_table"),
        state_rows * desc.max_pages as usize,
    )?;
    let host = read_i32(
        st,
        "host_table",
        p.ptr("host_table"),
        r * desc.max_pages as usize,
    )?;
    let hot = read_i32(st, "hot_table", p.ptr("hot_table"), r * w)?;
    let mut slot_host_rows = read_i32(
        st,
        "slot_host_rows",
        p.ptr("slot_host_rows"),
        state_rows * n,
    )?;
    let mut lru = read_u16(st, "lru", p.ptr("lru"), state_rows * n)?;
    // The six outputs `[indices, valid, hits, misses, src, dst]` (whether each holds top_k
    // entries per token row, or one), read, resolved in place and written back.
    const OUTPUTS: [(&str, bool); 6] = [
        ("indices", true),
        ("valid_counts", false),
        ("hit_counts", false),
        ("miss_counts", false),
        ("miss_src", true),
        ("miss_dst", true),
    ];
    let mut outs: Vec<Vec<i32>> = Vec::new();
    for (name, per_entry) in OUTPUTS {
        let len = if per_entry { t * k } else { t };
        outs.push(read_i32(st, name, p.ptr(name), len)?);
    }
    let [indices, valid, hits, misses, src, dst] = &mut outs[..] else {
        unreachable!("six outputs")
    };
    let mut stats = read_stats(st, p)?;
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
            indices,
            valid_counts: valid,
            hit_counts: hits,
            miss_counts: misses,
            miss_src: src,
            miss_dst: dst,
            idx_mapping: map.as_deref(),
            stats: stats.as_deref_mut(),
        },
    )
    .map_err(|e| e.to_string())?;
    write_stats(st, p, stats);
    write_i32(st, p.ptr("slot_host_rows"), &slot_host_rows);
    write_u16(st, p.ptr("lru"), &lru);
    for ((name, _), v) in OUTPUTS.iter().zip(&outs) {
        write_i32(st, p.ptr(name), v);
    }
    Ok(())
}

fn run_gather(st: &mut State, l: &Launch, p: &Params<'_>) -> Result<(), String> {
    run_gather_of(st, l, p, ("plan_src", "plan_dst", "plan_counts"))
}

/// The gather of `hs_gather_rows`, or the one `hs_resolve_gather` does after its resolve, with
/// the plan in the parameters named `plan` (sources, destinations, counts): emulated access by
/// access (module `copy`).
fn run_gather_of(
    st: &mut State,
    l: &Launch,
    p: &Params<'_>,
    plan: (&str, &str, &str),
) -> Result<(), String> {
    if l.kernel == Kernel::GatherRows {
        // Blocks walk the work items grid-stride (any grid x); grid z covers the layers.
        let count = u32_at(p.raw("layers"), 0);
        need_grid(l, [1, 1, count.into()])?;
    }
    crate::copy::gather(st, p, plan)
}

pub(crate) fn overlap_error(what: &str) -> String {
    format!(
        "{what} overlap within one launch: blocks run in any order on a GPU, so the result is \
         undefined (the host must split such copies)"
    )
}

/// Whether two non-empty ranges `(start, len)` of `v` overlap.
pub(crate) fn overlaps_within(v: &[(usize, usize)]) -> bool {
    let mut v: Vec<(usize, usize)> = v.iter().copied().filter(|r| r.1 > 0).collect();
    v.sort_unstable();
    let mut end = 0usize;
    for (i, (s, l)) in v.into_iter().enumerate() {
        if i > 0 && s < end {
            return true;
        }
        end = end.max(s + l);
    }
    false
}

/// Whether a non-empty range of `a` overlaps one of `b`.
pub(crate) fn overlaps_between(a: &[(usize, usize)], b: &[(usize, usize)]) -> bool {
    let mut all: Vec<(usize, usize, bool)> = a
        .iter()
        .map(|&(s, l)| (s, l, false))
        .chain(b.iter().map(|&(s, l)| (s, l, true)))
        .filter(|r| r.1 > 0)
        .collect();
    all.sort_unstable();
    let (mut end_a, mut end_b) = (0usize, 0usize);
    for (s, l, in_b) in all {
        let (mine, other) = if in_b {
            (&mut end_b, end_a)
        } else {
            (&mut end_a, end_b)
        };
        if s < other {
            return true;
        }
        *mine = (*mine).max(s + l);
    }
    false
}

fn run_invalidate(st: &mut State, p: &Params<'_>) -> Result<(), String> {
    let nr = p.u32("num_ranges");
    let total = usize::try_from(p.u64("total")).map_err(|_| "total overflows".to_string())?;
    let ranges = read_i32(st, "ranges", p.ptr("ranges"), nr as usize * 2)?;
    let mut slot_host_rows = read_i32(st, "slot_host_rows", p.ptr("slot_host_rows"), total)?;
    // The reference takes at most MAX_HOT_SLOTS slots per request: apply it chunk by chunk.
    for chunk in slot_host_rows.chunks_mut(hisparse_core::ops::MAX_HOT_SLOTS as usize) {
        invalidate(
            &InvalidateDesc {
                num_requests: 1,
                hot_slots: chunk.len() as u32,
                num_ranges: nr,
            },
            InvalidateArgs {
                ranges: &ranges[..],
                slot_host_rows: chunk,
            },
        )
        .map_err(|e| e.to_string())?;
    }
    write_i32(st, p.ptr("slot_host_rows"), &slot_host_rows);
    Ok(())
}

/// One layout of a launch's layer table (`struct hs_layout`, 40 bytes) as the core's.
fn layout_at(b: &[u8]) -> PageLayout {
    let u64_at = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    PageLayout {
        base: u64_at(0),
        block_stride: u64_at(8),
        num_blocks: u32_at(b, 16),
        block_size: u32_at(b, 20),
        row_bytes: u32_at(b, 24),
        value_bytes: u32_at(b, 28),
        index_stride_rows: u32_at(b, 32),
    }
}

/// `hs_indexer_backup`: the reference backup over the layer table the launch names and the
/// pools' bytes its layers reach (each pool must hold them in one allocation).
fn run_indexer_backup(st: &mut State, l: &Launch, p: &Params<'_>) -> Result<(), String> {
    need_grid(l, [1, 1, 1])?;
    let t = p.u32("num_tokens") as usize;
    let nl = p.u32("num_layers") as usize;
    let pair = std::mem::size_of::<gk::LayerPairAbi>();
    range(st, "layers", p.ptr("layers"), nl * pair)?;
    let table = crate::mem::read(st, p.ptr("layers"), nl * pair);
    let layers: Vec<LayerPair> = table
        .chunks_exact(pair)
        .map(|b| LayerPair {
            host: layout_at(&b[..pair / 2]),
            device: layout_at(&b[pair / 2..]),
        })
        .collect();
    let op = hisparse_core::OpName::IndexerBackup;
    let extent = |f: fn(&LayerPair) -> PageLayout| -> Result<usize, String> {
        layers.iter().try_fold(0usize, |m, l| {
            f(l).end(op)
                .map(|e| m.max(e as usize))
                .map_err(|e| e.to_string())
        })
    };
    let (dev_len, host_len) = (extent(|l| l.device)?, extent(|l| l.host)?);
    range(st, "device pool", p.ptr("device"), dev_len)?;
    range(st, "host cache", p.ptr("host"), host_len)?;
    let device_slots = read_i32(st, "device_slots", p.ptr("device_slots"), t)?;
    let host_slots = read_i32(st, "host_slots", p.ptr("host_slots"), t)?;
    let device = crate::mem::read(st, p.ptr("device"), dev_len);
    let mut host = crate::mem::read(st, p.ptr("host"), host_len);
    indexer_backup(
        &IndexerBackupDesc {
            num_tokens: t as u32,
            layers: &layers,
        },
        IndexerBackupArgs {
            device_slots: &device_slots[..],
            host_slots: &host_slots[..],
            device: &device[..],
            host: &mut host[..],
        },
    )
    .map_err(|e| e.to_string())?;
    crate::mem::write(st, p.ptr("host"), &host);
    Ok(())
}

fn run_slot_mapping(st: &mut State, l: &Launch, p: &Params<'_>) -> Result<(), String> {
    let desc = SlotMappingDesc {
        num_tokens: p.u32("num_tokens"),
        ratio: p.u32("ratio"),
        block_size: p.u32("block_size"),
        table_rows: p.u32("table_rows"),
        max_blocks: p.u32("max_blocks"),
    };
    need_grid(l, [desc.num_tokens.div_ceil(gk::SLOT_THREADS).into(), 1, 1])?;
    let t = desc.num_tokens as usize;
    let positions = read_i32(st, "positions", p.ptr("positions"), t)?;
    let slots = read_i32(st, "slot_mapping", p.ptr("slot_mapping"), t)?;
    let rows = read_i32(st, "table_row", p.ptr("table_row"), t)?;
    let table = read_i32(
        st,
        "block_table",
        p.ptr("block_table"),
        desc.table_rows as usize * desc.max_blocks as usize,
    )?;
    let mut out = read_i32(st, "out", p.ptr("out"), t)?;
    compressed_slot_mapping(
        &desc,
        SlotMappingArgs {
            positions: &positions[..],
            slot_mapping: &slots[..],
            table_row: &rows[..],
            block_table: &table[..],
            out: &mut out[..],
        },
    )
    .map_err(|e| e.to_string())?;
    write_i32(st, p.ptr("out"), &out);
    Ok(())
}

/// `hs_write_table`: the reference write. The list must be what the host promises (strictly
/// increasing indices below `table_len`); the reference refuses anything else, which the double
/// reports as a fault.
fn run_write_table(st: &mut State, p: &Params<'_>) -> Result<(), String> {
    let n = p.u32("num_writes") as usize;
    let table_len = p.u32("table_len");
    let raw = read_i32(st, "writes", p.ptr("writes"), 2 * n)?;
    let writes: Vec<TableWrite> = raw
        .chunks_exact(2)
        .map(|w| TableWrite {
            index: w[0] as u32,
            value: w[1],
        })
        .collect();
    let mut table = read_i32(st, "table", p.ptr("table"), table_len as usize)?;
    write_table(&TableWriteDesc { table_len }, &writes, &mut table).map_err(|e| e.to_string())?;
    write_i32(st, p.ptr("table"), &table);
    Ok(())
}

/// `hs_reset_hot_state`: the reference reset of the listed state rows.
fn run_reset_hot_state(st: &mut State, p: &Params<'_>) -> Result<(), String> {
    let desc = HotResetDesc {
        num_requests: p.u32("num_requests"),
        hot_slots: p.u32("hot_slots"),
    };
    let n = p.u32("num_rows") as usize;
    let rows: Vec<u32> = read_i32(st, "rows", p.ptr("rows"), n)?
        .into_iter()
        .map(|r| r as u32)
        .collect();
    let slots = desc.num_requests as usize * desc.hot_slots as usize;
    let mut slot_host_rows = read_i32(st, "slot_host_rows", p.ptr("slot_host_rows"), slots)?;
    let mut lru = read_u16(st, "lru", p.ptr("lru"), slots)?;
    reset_hot_state(&desc, &rows, &mut slot_host_rows, &mut lru).map_err(|e| e.to_string())?;
    write_i32(st, p.ptr("slot_host_rows"), &slot_host_rows);
    write_u16(st, p.ptr("lru"), &lru);
    Ok(())
}
