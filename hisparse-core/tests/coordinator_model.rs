//! Model-based test of the coordinator: random sequences of admit / step (prefill chunks and
//! decode tokens) / worker reports (interleaved across several workers) / sample / finish /
//! preempt / forced reclaim on small pools, checking after every operation:
//!
//! * the coordinator's own invariant check (pool reference counts = references held: no leak,
//!   no double free; page states; ready prefix; prefix hashes only on durable pages);
//! * an independent shadow of the data plane, built only from the commands (each received as
//!   wire bytes, as a worker process receives it; reports travel as bytes too): the per-row
//!   resident, host and hot tables the workers would hold equal the coordinator's exported `i32`
//!   rows;
//! * a shadow of the host pool's contents: which rows of which host block have been written by
//!   which transfer. A resident entry may turn null (page reclaimed) only when every row of the
//!   page has reached host in transfers every worker completed, and never for the last two pages
//!   of a request; a prefix hit reads only host blocks whose rows are all durable;
//! * GPU blocks in resident and hot tables are never shared between requests (a prefix hit's
//!   adopted GPU copies of full pages aside), and no device → host copy writes a host block
//!   another running request uses;
//! * a shadow of the *bytes*: every row the forward pass writes is tagged with the token prefix
//!   it encodes, copies (row mirrors, spills, restores, copy-on-write) move tags, and every row
//!   a scheduled request's attention reads is checked before its forward pass: a resident entry
//!   must hold the right GPU row (an unpinned page that no allocation reused still reads its GPU
//!   bytes), a null entry the right host row of a durable transfer (a page whose block was
//!   reused reads host bytes); no copy-on-write source is written before the batch of the step
//!   that copied it is complete;
//! * a prefill chunk (tokens below the request's prefill end) reads no null entry: every page
//!   of its context is on the GPU, staged there from host when it was not, and a staged page
//!   holds the host bytes it was restored from (checked like every GPU read);
//! * [`no_write_overwrites_an_only_copy`]: no GPU block this step hands out or writes before or
//!   during its forward pass (residency updates, restores, GPU copy-on-write, hot regions,
//!   indexer and regular columns, the forward's own rows) held a page of a running request,
//!   other than the one it is now for, whose live rows are not durable on host. A command has
//!   no device → host copies before its forward pass (spills and mirrors run after it), so no
//!   in-flight transfer could save such a page: this is what makes `after_forward = false`
//!   spills unnecessary, proven on every generated step.
// These tests drive the planning side (layouts, the coordinator), which needs `alloc`.
#![cfg(feature = "alloc")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hisparse_core::coordinator::{Coordinator, OffloadCommand, RequestId, WorkerReport};
use hisparse_core::layout::ACTIVE_TAIL_PAGES;
use proptest::prelude::*;

mod common;
use common::{BT, MAX_LEN, Params, params, setup, tokens_for};

/// Coverage counters: the test fails if a behaviour it claims to check never happened.
static RECLAIMS: AtomicU64 = AtomicU64::new(0);
static HOST_READS: AtomicU64 = AtomicU64::new(0);
static COW: AtomicU64 = AtomicU64::new(0);
static PREEMPTS: AtomicU64 = AtomicU64::new(0);
static WAITS: AtomicU64 = AtomicU64::new(0);
static HOT_ASSIGN: AtomicU64 = AtomicU64::new(0);
static SPILLS: AtomicU64 = AtomicU64::new(0);
static WINDOW_FREES: AtomicU64 = AtomicU64::new(0);
static DURABLE_ADVANCES: AtomicU64 = AtomicU64::new(0);
static ROLLBACKS: AtomicU64 = AtomicU64::new(0);
static UNPINNED_GPU_READS: AtomicU64 = AtomicU64::new(0);
static CONTENT_READS: AtomicU64 = AtomicU64::new(0);
static ADOPTED_READS: AtomicU64 = AtomicU64::new(0);
static IMPORTS: AtomicU64 = AtomicU64::new(0);
static IMPORTED_STARTS: AtomicU64 = AtomicU64::new(0);
static STAGED_PAGES: AtomicU64 = AtomicU64::new(0);
static STAGED_READS: AtomicU64 = AtomicU64::new(0);
static BLOCKS_REUSED_FROM_LIVE_PAGES: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Op {
    Admit {
        len: u8,
        family: u8,
    },
    Step,
    Sample {
        finish_len: u8,
    },
    Report {
        worker: u8,
        enq: u8,
        comp: u8,
    },
    Finish {
        pick: u8,
    },
    Preempt {
        pick: u8,
    },
    Reclaim {
        blocks: u8,
    },
    /// Rejected speculative tokens given back (refusals of too-long rollbacks are expected).
    Rollback {
        pick: u8,
        n: u8,
    },
    /// A request whose first `len` tokens' KV a prefill node writes into the host pool (the
    /// test writes the rows, then completes the import); one sampled token follows.
    Import {
        len: u8,
        family: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1u8..=40, 0u8..3).prop_map(|(len, family)| Op::Admit { len, family }),
        6 => Just(Op::Step),
        3 => (8u8..=MAX_LEN as u8).prop_map(|finish_len| Op::Sample { finish_len }),
        5 => (0u8..3, 0u8..4, 0u8..4).prop_map(|(worker, enq, comp)| Op::Report { worker, enq, comp }),
        1 => any::<u8>().prop_map(|pick| Op::Finish { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Preempt { pick }),
        1 => (1u8..20).prop_map(|blocks| Op::Reclaim { blocks }),
        2 => (any::<u8>(), 1u8..4).prop_map(|(pick, n)| Op::Rollback { pick, n }),
        1 => (1u8..=40, 0u8..3).prop_map(|(len, family)| Op::Import { len, family }),
    ]
}

/// Shadow of what the workers hold, built from commands only.
struct Shadow {
    nb: usize,
    /// row → bucket → page → block.
    resident: Vec<Vec<Vec<u32>>>,
    /// row → page → host block.
    host: Vec<Vec<i64>>,
    /// row → bucket → hot blocks.
    hot: Vec<Vec<Vec<u32>>>,
    /// row → tokens computed (scheduled) as of the last command.
    computed: Vec<u32>,
    /// Issued transfer ids in order.
    issued: Vec<u64>,
    /// Per worker: ids enqueued / completed (counts into `issued`).
    enq: Vec<usize>,
    comp: Vec<usize>,
    /// host block → bucket → rows written (bitmask) and the last transfer that wrote it.
    rows: HashMap<u32, (Vec<u64>, u64)>,
    /// Request → its tokens (as the engine appended and rolled them back).
    tokens: HashMap<RequestId, Vec<u32>>,
    /// GPU block → row → tag of what the row holds (0 = never written).
    gpu_data: HashMap<u32, Vec<u64>>,
    /// Host block → bucket → row → tag.
    host_data: HashMap<u32, Vec<Vec<u64>>>,
    /// row → group → column → block (indexer and regular groups).
    tables: Vec<HashMap<u32, Vec<u32>>>,
    /// Copy-on-write sources not to be written before transfer `.2` is durable: (GPU pool?,
    /// block, transfer).
    cow_sources: Vec<(bool, u32, u64)>,
    /// Imported requests not started yet.
    imported: std::collections::HashSet<RequestId>,
}

/// Tag of the row token `t` of `tokens` writes: the KV of a token depends on every token up
/// to it.
fn tag(tokens: &[u32], t: u32) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in &tokens[..=t as usize] {
        h ^= u64::from(x) + 1;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h | 1
}

impl Shadow {
    fn new(p: &Params, nb: usize) -> Self {
        let rows = p.max_running as usize;
        Shadow {
            nb,
            resident: vec![vec![Vec::new(); nb]; rows],
            host: vec![Vec::new(); rows],
            hot: vec![vec![Vec::new(); nb]; rows],
            computed: vec![0; rows],
            issued: Vec::new(),
            enq: vec![0; p.workers as usize],
            comp: vec![0; p.workers as usize],
            rows: HashMap::new(),
            tokens: HashMap::new(),
            gpu_data: HashMap::new(),
            host_data: HashMap::new(),
            tables: vec![HashMap::new(); rows],
            cow_sources: Vec::new(),
            imported: std::collections::HashSet::new(),
        }
    }

    /// The prefill node's writes: the rows of the first `n` tokens of `tokens` into `blocks`
    /// (one per page), every bucket, durable from the start (transfer 0).
    fn import(&mut self, blocks: &[u32], tokens: &[u32], n: u32, bt: u32) {
        for (p, &h) in blocks.iter().enumerate() {
            let mut data = vec![vec![0u64; bt as usize]; self.nb];
            let mut mask = 0u64;
            for r in 0..bt {
                let t = p as u32 * bt + r;
                if t < n {
                    for d in &mut data {
                        d[r as usize] = tag(tokens, t);
                    }
                    mask |= 1 << r;
                }
            }
            self.host_data.insert(h, data);
            self.rows.insert(h, (vec![mask; self.nb], 0));
        }
    }

    /// Fails if `block` (of the GPU pool when `gpu`) is a copy-on-write source whose copy may
    /// not be complete yet.
    fn check_write(&self, gpu: bool, block: u32, what: &str) -> Result<(), TestCaseError> {
        let durable = self.durable();
        for &(g, b, x) in &self.cow_sources {
            prop_assert!(
                !(g == gpu && b == block && x > durable),
                "{} writes {} block {}, a copy-on-write source of transfer {} (durable: {})",
                what,
                if gpu { "GPU" } else { "host" },
                block,
                x,
                durable
            );
        }
        Ok(())
    }

    fn durable(&self) -> u64 {
        let n = self.comp.iter().copied().min().unwrap_or(0);
        if n == 0 { 0 } else { self.issued[n - 1] }
    }

    fn page_durable(&self, h: u32, full: u64) -> bool {
        match self.rows.get(&h) {
            Some((masks, last)) => masks.iter().all(|&m| m == full) && *last <= self.durable(),
            None => false,
        }
    }
}

/// A page of a running request that a GPU block holds before a command: (state row,
/// request, page, bucket).
type Holder = (usize, RequestId, usize, usize);

/// A resident page a block is written for: (state row, page, bucket).
type PageKey = (usize, usize, usize);

/// GPU block → the pages of running requests its resident entries name before `cmd` (rows the
/// command starts afresh excluded: what they held belonged to a request that is gone).
fn gpu_holders(sh: &Shadow, c: &Coordinator, cmd: &OffloadCommand) -> HashMap<u32, Vec<Holder>> {
    let mut holders: HashMap<u32, Vec<Holder>> = HashMap::new();
    for id in c.running_ids() {
        let Some(row) = c.slot_of(id) else { continue };
        if cmd.started.contains(&row) {
            continue;
        }
        let row = row as usize;
        for (b, pages) in sh.resident[row].iter().enumerate() {
            for (p, &blk) in pages.iter().enumerate() {
                if blk != 0 {
                    holders.entry(blk).or_default().push((row, id, p, b));
                }
            }
        }
    }
    holders
}

/// The invariant behind "no spills before the forward pass" (docs/residency.md): every GPU
/// block `cmd` writes before or during its forward pass — handed to a resident entry, restored
/// into, the destination of a GPU copy-on-write, part of a hot region assigned, an indexer or
/// regular column, or a resident row the forward writes — that held a page of a running
/// request (`holders`, taken before the command) other than the page it is written for, held
/// no row of that page that is not already durable on host: every token of the page below the
/// request's computed count has its row in the page's host block, from a transfer every
/// worker completed. The command carries no device → host copy before the forward, so a page
/// failing this would lose its only copy. Call with the shadow's tables updated by `cmd`
/// (before its copies and forward pass).
fn no_write_overwrites_an_only_copy(
    sh: &Shadow,
    c: &Coordinator,
    cmd: &OffloadCommand,
    holders: &HashMap<u32, Vec<Holder>>,
) -> Result<(), TestCaseError> {
    if holders.is_empty() {
        return Ok(());
    }
    let kv = c.layout();
    let bt = kv.block_tokens;
    let resident_base = 2u32;
    // (block, the page it is written for when it is a resident page, what writes it).
    let mut writes: Vec<(u32, Option<PageKey>, &str)> = Vec::new();
    let mut page_of_block: HashMap<u32, PageKey> = HashMap::new();
    for u in &cmd.residency {
        if u.block != 0 {
            let key = (
                u.slot as usize,
                u.page as usize,
                (u.group - resident_base) as usize,
            );
            page_of_block.insert(u.block, key);
            writes.push((u.block, Some(key), "a residency update"));
        }
    }
    for t in &cmd.restores {
        let key = page_of_block.get(&t.device_block).copied();
        writes.push((t.device_block, key, "a restore"));
    }
    for pair in &cmd.gpu_cow {
        writes.push((pair.dst, None, "a GPU copy-on-write"));
    }
    for a in &cmd.hot_assign {
        for &blk in &a.blocks {
            writes.push((blk, None, "a hot region"));
        }
    }
    for u in &cmd.block_tables {
        if u.block != 0 {
            writes.push((u.block, None, "an indexer or regular block"));
        }
    }
    for s in &cmd.scheduled {
        let row = s.slot as usize;
        let (p0, p1) = (
            s.first_token / bt,
            (s.first_token + s.num_tokens).div_ceil(bt),
        );
        for p in p0 as usize..p1 as usize {
            for b in 0..sh.nb {
                let blk = sh.resident[row][b].get(p).copied().unwrap_or(0);
                if blk != 0 {
                    writes.push((blk, Some((row, p, b)), "the forward pass"));
                }
            }
        }
        for (&g, cols) in &sh.tables[row] {
            let gt = kv.groups[g as usize].block_tokens.max(1);
            let (c0, c1) = (
                s.first_token / gt,
                (s.first_token + s.num_tokens).div_ceil(gt),
            );
            for &blk in cols.iter().take(c1 as usize).skip(c0 as usize) {
                if blk != 0 {
                    writes.push((blk, None, "the forward pass (indexer/regular)"));
                }
            }
        }
    }
    let durable = sh.durable();
    for (blk, key, what) in writes {
        let Some(hs) = holders.get(&blk) else {
            continue;
        };
        for &(row, id, p, b) in hs {
            if key == Some((row, p, b)) {
                continue;
            }
            BLOCKS_REUSED_FROM_LIVE_PAGES.fetch_add(1, Relaxed);
            let toks = sh.tokens.get(&id).map_or(&[][..], Vec::as_slice);
            let live = sh.computed[row].min(toks.len() as u32);
            let h = sh.host[row].get(p).copied().unwrap_or(-1);
            let (masks, last) = match u32::try_from(h).ok().and_then(|h| sh.rows.get(&h)) {
                Some((m, l)) => (m.get(b).copied().unwrap_or(0), *l),
                None => (0, u64::MAX),
            };
            let data = u32::try_from(h)
                .ok()
                .and_then(|h| sh.host_data.get(&h))
                .and_then(|d| d.get(b));
            for t in p as u32 * bt..((p as u32 + 1) * bt).min(live) {
                let r = (t % bt) as usize;
                let on_host = masks & (1 << r) != 0
                    && last <= durable
                    && data.is_some_and(|d| d[r] == tag(toks, t));
                prop_assert!(
                    on_host,
                    "{} writes GPU block {} while it holds the only copy of request {}'s page {} (bucket {}): token {}'s row is not durable on host (host block {}, last transfer {}, durable {})",
                    what,
                    blk,
                    id,
                    p,
                    b,
                    t,
                    h,
                    last,
                    durable
                );
            }
        }
    }
    Ok(())
}

/// Rows of a full page, as the bitmask of a host block's mirrored rows.
fn full_page(block_size: u32) -> u64 {
    if block_size == 64 {
        u64::MAX
    } else {
        (1u64 << block_size) - 1
    }
}

/// Resident block-table groups start here (a group below is an indexer or regular table).
const RESIDENT_BASE: u32 = 2;

fn apply(sh: &mut Shadow, c: &Coordinator, cmd: &OffloadCommand) -> Result<(), TestCaseError> {
    let holders = gpu_holders(sh, c, cmd);
    apply_tables(sh, c, cmd)?;
    // Nothing this command writes loses a page's only copy (its tables are applied, its
    // copies and forward pass not yet).
    no_write_overwrites_an_only_copy(sh, c, cmd, &holders)?;
    apply_restores(sh, c, cmd)?;
    check_reads(sh, c, cmd)?;
    apply_forward(sh, c, cmd)?;
    apply_after_forward(sh, c, cmd)
}

/// The command's table updates: its transfer id, started and released rows, host blocks and
/// block tables, host copy-on-write, residency (every reclaim checked: durable on host, outside
/// the active tail) and hot regions.
fn apply_tables(
    sh: &mut Shadow,
    c: &Coordinator,
    cmd: &OffloadCommand,
) -> Result<(), TestCaseError> {
    let kv = c.layout();
    let full = full_page(kv.block_size);
    let resident_base = RESIDENT_BASE;
    if let Some(id) = cmd.transfer_id {
        prop_assert_eq!(Some(&(id - 1)), sh.issued.last().or(Some(&0)));
        sh.issued.push(id);
    }
    let durable = sh.durable();
    sh.cow_sources.retain(|&(_, _, x)| x > durable);
    for &row in &cmd.started {
        let row = row as usize;
        sh.computed[row] = 0;
        sh.host[row].clear();
        sh.tables[row].clear();
        for b in 0..sh.nb {
            sh.resident[row][b].clear();
            sh.hot[row][b].clear();
        }
    }
    for &row in &cmd.hot_release {
        for b in &mut sh.hot[row as usize] {
            b.clear();
        }
    }
    for u in &cmd.host_blocks {
        let v = &mut sh.host[u.slot as usize];
        if v.len() <= u.page as usize {
            v.resize(u.page as usize + 1, -1);
        }
        v[u.page as usize] = i64::from(u.block);
    }
    for u in &cmd.block_tables {
        let v = sh.tables[u.slot as usize].entry(u.group).or_default();
        if v.len() <= u.page as usize {
            v.resize(u.page as usize + 1, 0);
        }
        v[u.page as usize] = u.block;
    }
    for &h in &cmd.new_host_blocks {
        sh.check_write(false, h, "a new host block")?;
        sh.rows.remove(&h);
        sh.host_data.remove(&h);
    }
    for pair in &cmd.host_cow {
        COW.fetch_add(1, Relaxed);
        sh.check_write(false, pair.dst, "host copy-on-write")?;
        let src = sh.rows.get(&pair.src).cloned();
        prop_assert!(
            src.is_some(),
            "copy-on-write from a host block never written"
        );
        sh.rows.insert(pair.dst, src.unwrap_or_default());
        let data = sh.host_data.get(&pair.src).cloned().unwrap_or_default();
        sh.host_data.insert(pair.dst, data);
    }
    for u in &cmd.residency {
        let bucket = (u.group - resident_base) as usize;
        prop_assert!(bucket < sh.nb);
        let v = &mut sh.resident[u.slot as usize][bucket];
        if v.len() <= u.page as usize {
            v.resize(u.page as usize + 1, 0);
        }
        let old = v[u.page as usize];
        v[u.page as usize] = u.block;
        if old != 0 && u.block == 0 {
            RECLAIMS.fetch_add(1, Relaxed);
            // A reclaim: the page must be durable on host and outside the active tail (the
            // page the next token writes and the one before it), as of the most tokens the
            // request has had computed when the reclaim can have happened: this step's.
            let computed = cmd
                .scheduled
                .iter()
                .find(|s| s.slot == u.slot)
                .map_or(sh.computed[u.slot as usize], |s| {
                    s.first_token + s.num_tokens
                });
            let next_page = computed / kv.block_tokens;
            prop_assert!(
                u.page + ACTIVE_TAIL_PAGES <= next_page,
                "page {} of row {} reclaimed in the active tail (next token writes page {})",
                u.page,
                u.slot,
                next_page
            );
            let h = sh.host[u.slot as usize][u.page as usize];
            prop_assert!(h > 0);
            prop_assert!(
                sh.page_durable(h as u32, full),
                "page {} of row {} reclaimed before its host copy is durable",
                u.page,
                u.slot
            );
        }
    }
    HOT_ASSIGN.fetch_add(cmd.hot_assign.len() as u64, Relaxed);
    PREEMPTS.fetch_add(cmd.preempted.len() as u64, Relaxed);
    SPILLS.fetch_add(cmd.page_transfers.len() as u64, Relaxed);
    WINDOW_FREES.fetch_add(
        cmd.block_tables.iter().filter(|u| u.block == 0).count() as u64,
        Relaxed,
    );
    for a in &cmd.hot_assign {
        let b = (a.group - resident_base) as usize - sh.nb;
        prop_assert_eq!(a.blocks.len(), kv.hot_blocks_per_request as usize);
        sh.hot[a.slot as usize][b] = a.blocks.clone();
    }
    Ok(())
}

/// Before the forward pass: restores (host → device pages) and GPU copy-on-write.
fn apply_restores(
    sh: &mut Shadow,
    c: &Coordinator,
    cmd: &OffloadCommand,
) -> Result<(), TestCaseError> {
    let kv = c.layout();
    let bs = kv.block_size as usize;
    for t in &cmd.restores {
        sh.check_write(true, t.device_block, "a restore")?;
        let rows = sh
            .host_data
            .get(&t.host_block)
            .map(|d| d[t.bucket as usize].clone())
            .unwrap_or_else(|| vec![0; bs]);
        sh.gpu_data.insert(t.device_block, rows);
    }
    for pair in &cmd.gpu_cow {
        sh.check_write(true, pair.dst, "GPU copy-on-write")?;
        let rows = sh
            .gpu_data
            .get(&pair.src)
            .cloned()
            .unwrap_or_else(|| vec![0; bs]);
        sh.gpu_data.insert(pair.dst, rows);
    }
    Ok(())
}

/// What this step reads before its tokens: prefix-hit pages durable on host, and every context
/// row, from the GPU block its resident entry names or from a durable host block.
fn check_reads(
    sh: &mut Shadow,
    c: &Coordinator,
    cmd: &OffloadCommand,
) -> Result<(), TestCaseError> {
    let kv = c.layout();
    let full = full_page(kv.block_size);
    // Prefix hits: null resident entries of pages never resident must be durable on host. A
    // prefill chunk has none: its context is on the GPU.
    for s in &cmd.scheduled {
        let row = s.slot as usize;
        let gpu_pages = (s.first_token + s.num_tokens).div_ceil(kv.block_tokens) as usize;
        let prefill = c.prefill_end(s.id).is_some_and(|e| s.first_token < e);
        for p in 0..gpu_pages {
            let null = sh.resident[row]
                .iter()
                .any(|v| v.get(p).copied().unwrap_or(0) == 0);
            prop_assert!(
                !(prefill && null),
                "request {} prefill chunk at token {} reads page {} from a null resident entry (-1)",
                s.id,
                s.first_token,
                p
            );
            if null {
                HOST_READS.fetch_add(1, Relaxed);
                let h = sh.host[row][p];
                prop_assert!(
                    sh.page_durable(h as u32, full),
                    "row {} page {} reads a host block that is not durable",
                    row,
                    p
                );
                prop_assert!(
                    sh.hot[row].iter().all(|v| !v.is_empty()),
                    "null entry without a hot region"
                );
            }
        }
    }
    // Pages staged by this command: restored into a block that a residency update of the same
    // command names for a page of a request scheduled with a prefill chunk.
    let restored: std::collections::HashSet<u32> =
        cmd.restores.iter().map(|t| t.device_block).collect();
    let staged_now: std::collections::HashSet<(u32, u32)> = cmd
        .residency
        .iter()
        .filter(|u| u.block != 0 && restored.contains(&u.block))
        .map(|u| (u.slot, u.page))
        .collect();
    // What attention reads before this step's tokens: every context row, from the GPU block
    // the resident entry names or, for a null entry, from the host block of a durable transfer.
    for s in &cmd.scheduled {
        let row = s.slot as usize;
        let toks = sh.tokens.get(&s.id).cloned().unwrap_or_default();
        prop_assert!(toks.len() as u32 >= s.first_token + s.num_tokens);
        for t in 0..s.first_token {
            let (p, r) = (
                (t / kv.block_tokens) as usize,
                (t % kv.block_tokens) as usize,
            );
            let want = tag(&toks, t);
            let unpinned = c.page_state(s.id, p as u32)
                == Some(hisparse_core::coordinator::PageState::Unpinned);
            let staged = staged_now.contains(&(row as u32, p as u32));
            for b in 0..sh.nb {
                let e = sh.resident[row][b].get(p).copied().unwrap_or(0);
                CONTENT_READS.fetch_add(1, Relaxed);
                if e != 0 {
                    if unpinned {
                        UNPINNED_GPU_READS.fetch_add(1, Relaxed);
                    }
                    if cmd.started.contains(&s.slot) {
                        ADOPTED_READS.fetch_add(1, Relaxed);
                    }
                    if staged {
                        STAGED_READS.fetch_add(1, Relaxed);
                    }
                    let got = sh.gpu_data.get(&e).map_or(0, |d| d[r]);
                    prop_assert_eq!(
                        got,
                        want,
                        "request {} token {} (page {}, bucket {}) reads GPU block {} holding the wrong row{}",
                        s.id,
                        t,
                        p,
                        b,
                        e,
                        if unpinned { " (unpinned page)" } else { "" }
                    );
                } else {
                    let h = sh.host[row][p] as u32;
                    let got = sh.host_data.get(&h).map_or(0, |d| d[b][r]);
                    prop_assert_eq!(
                        got,
                        want,
                        "request {} token {} (page {}, bucket {}) reads host block {} holding the wrong row",
                        s.id,
                        t,
                        p,
                        b,
                        h
                    );
                    let last = sh.rows.get(&h).map_or(u64::MAX, |e| e.1);
                    prop_assert!(
                        last <= sh.durable(),
                        "host row read before its transfer is durable"
                    );
                }
            }
        }
    }
    Ok(())
}

/// The forward pass: this step's tokens written into resident rows (tagged), indexer and
/// regular blocks (checked against copy-on-write sources only); the rows' computed tokens.
fn apply_forward(
    sh: &mut Shadow,
    c: &Coordinator,
    cmd: &OffloadCommand,
) -> Result<(), TestCaseError> {
    let kv = c.layout();
    let bs = kv.block_size as usize;
    // The forward pass writes this step's tokens: resident rows (tagged), indexer and regular
    // blocks (only checked against copy-on-write sources).
    for s in &cmd.scheduled {
        let row = s.slot as usize;
        let toks = sh.tokens.get(&s.id).cloned().unwrap_or_default();
        for t in s.first_token..s.first_token + s.num_tokens {
            let (p, r) = (
                (t / kv.block_tokens) as usize,
                (t % kv.block_tokens) as usize,
            );
            for b in 0..sh.nb {
                let e = sh.resident[row][b].get(p).copied().unwrap_or(0);
                prop_assert!(
                    e != 0,
                    "the forward writes token {} into a null resident entry",
                    t
                );
                sh.check_write(true, e, "the forward pass")?;
                sh.gpu_data.entry(e).or_insert_with(|| vec![0; bs])[r] = tag(&toks, t);
            }
            for (&g, cols) in &sh.tables[row] {
                let gt = kv.groups[g as usize].block_tokens.max(1);
                if let Some(&blk) = cols.get((t / gt) as usize)
                    && blk != 0
                {
                    sh.check_write(true, blk, "the forward pass (indexer/regular)")?;
                }
            }
        }
    }
    for s in &cmd.scheduled {
        sh.computed[s.slot as usize] = s.first_token + s.num_tokens;
        if cmd.started.contains(&s.slot) && sh.imported.remove(&s.id) {
            IMPORTED_STARTS.fetch_add(1, Relaxed);
            prop_assert!(
                s.first_token > 0,
                "an imported request recomputes its prompt"
            );
        }
    }
    Ok(())
}

/// After the forward pass: row mirrors and page spills to host, and the copy-on-write sources
/// this step's transfer releases.
fn apply_after_forward(
    sh: &mut Shadow,
    c: &Coordinator,
    cmd: &OffloadCommand,
) -> Result<(), TestCaseError> {
    let kv = c.layout();
    let full = full_page(kv.block_size);
    let bs = kv.block_size as usize;
    let id = cmd.transfer_id.unwrap_or(0);
    for m in &cmd.row_mirrors {
        prop_assert!(m.span.first_row + m.span.num_rows <= kv.block_size);
        sh.check_write(false, m.span.host_block, "a row mirror")?;
        let src = sh
            .gpu_data
            .get(&m.span.device_block)
            .cloned()
            .unwrap_or_else(|| vec![0; bs]);
        let nb = sh.nb;
        let dst = sh
            .host_data
            .entry(m.span.host_block)
            .or_insert_with(|| vec![vec![0; bs]; nb]);
        let (r0, r1) = (
            m.span.first_row as usize,
            (m.span.first_row + m.span.num_rows) as usize,
        );
        dst[m.bucket as usize][r0..r1].copy_from_slice(&src[r0..r1]);
        let e = sh
            .rows
            .entry(m.span.host_block)
            .or_insert((vec![0; sh.nb], 0));
        let mask = if m.span.num_rows == 64 {
            u64::MAX
        } else {
            ((1u64 << m.span.num_rows) - 1) << m.span.first_row
        };
        e.0[m.bucket as usize] |= mask;
        e.1 = id;
    }
    for t in &cmd.page_transfers {
        sh.check_write(false, t.host_block, "a page spill")?;
        let src = sh
            .gpu_data
            .get(&t.device_block)
            .cloned()
            .unwrap_or_else(|| vec![0; bs]);
        let nb = sh.nb;
        sh.host_data
            .entry(t.host_block)
            .or_insert_with(|| vec![vec![0; bs]; nb])[t.bucket as usize] = src;
        let e = sh.rows.entry(t.host_block).or_insert((vec![0; sh.nb], 0));
        e.0[t.bucket as usize] = full;
        e.1 = id;
    }
    if !(cmd.host_cow.is_empty() && cmd.gpu_cow.is_empty()) {
        prop_assert!(
            cmd.transfer_id.is_some(),
            "a step with copy-on-write has no transfer id to release its sources with"
        );
        for pair in &cmd.host_cow {
            sh.cow_sources.push((false, pair.src, id));
        }
        for pair in &cmd.gpu_cow {
            sh.cow_sources.push((true, pair.src, id));
        }
    }
    Ok(())
}

fn compare(sh: &Shadow, c: &Coordinator) -> Result<(), TestCaseError> {
    let kv = c.layout();
    let nb = kv.num_buckets as usize;
    let mp = c.max_pages() as usize;
    let mut row_buf = vec![0i32; mp];
    // GPU block → (request, whether it holds a full page: a prefix hit may adopt the GPU copy
    // of another request's full page, so full pages may share blocks).
    let mut owner: HashMap<u32, (RequestId, bool)> = HashMap::new();
    let mut claim = |blk: u32, id: RequestId, full: bool| -> Result<(), TestCaseError> {
        let prev = owner.insert(blk, (id, full));
        prop_assert!(
            prev.is_none_or(|(other, other_full)| other != id && full && other_full),
            "GPU block {} shared",
            blk
        );
        Ok(())
    };
    let mut host_owner: HashMap<u32, RequestId> = HashMap::new();
    let ids: Vec<RequestId> = c.running_ids().collect();
    for id in ids {
        let row = c.slot_of(id).expect("running has a row") as usize;
        let pages = c.num_computed(id).unwrap().div_ceil(kv.block_tokens) as usize;
        let full_pages = (c.num_computed(id).unwrap() / kv.block_tokens) as usize;
        for b in 0..nb {
            c.resident_row(id, b as u32, &mut row_buf).unwrap();
            for (p, &got) in row_buf.iter().enumerate().take(pages) {
                let want = sh.resident[row][b].get(p).copied().unwrap_or(u32::MAX);
                prop_assert_eq!(
                    got as u32,
                    want,
                    "resident row {} bucket {} page {}",
                    row,
                    b,
                    p
                );
                if want != 0 {
                    claim(want, id, p < full_pages)?;
                }
            }
            // A rollback leaves the pages it un-filled allocated for the tokens that follow.
            let held = pages.max(sh.resident[row][b].len()).min(mp);
            for (p, &got) in row_buf.iter().enumerate().take(held).skip(pages) {
                let want = sh.resident[row][b].get(p).copied().unwrap_or(0);
                prop_assert_eq!(
                    got as u32,
                    want,
                    "resident row {} bucket {} page {}",
                    row,
                    b,
                    p
                );
                if want != 0 {
                    claim(want, id, false)?;
                }
            }
            prop_assert!(row_buf[held..].iter().all(|&v| v == 0));
            let mut hot = vec![0i32; kv.hot_blocks_per_request as usize];
            c.hot_row(id, b as u32, &mut hot).unwrap();
            let sh_hot = &sh.hot[row][b];
            if sh_hot.is_empty() {
                prop_assert!(hot.iter().all(|&v| v == -1));
            } else {
                for (i, &blk) in sh_hot.iter().enumerate() {
                    prop_assert_eq!(hot[i] as u32, blk);
                    claim(blk, id, false)?;
                }
            }
        }
        c.host_row(id, &mut row_buf).unwrap();
        for (p, &h) in row_buf.iter().enumerate() {
            if h < 0 {
                break;
            }
            prop_assert_eq!(i64::from(h), sh.host[row][p], "host row {} page {}", row, p);
            host_owner.entry(h as u32).or_insert(id);
        }
    }
    Ok(())
}

/// Applies a step's command to the shadow and checks it against the coordinator: the workers'
/// view right after the step, and every copy targets a host block exactly one running request
/// uses.
fn check_step(sh: &mut Shadow, c: &Coordinator, cmd: &OffloadCommand) -> Result<(), TestCaseError> {
    // The shadow workers receive the command as bytes, as a worker process does.
    let fingerprint = c.layout().fingerprint();
    let received = OffloadCommand::from_bytes(&cmd.to_bytes(fingerprint), fingerprint)
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    prop_assert_eq!(&received, cmd);
    apply(sh, c, &received)?;
    // Right after a step the workers' view is complete (changes made later, e.g. a release when
    // a report arrives, travel in the next command).
    compare(sh, c)?;
    let mut users: HashMap<i64, u32> = HashMap::new();
    let mut buf = vec![0i32; c.max_pages() as usize];
    for id in c.running_ids() {
        let row = c.slot_of(id).unwrap() as usize;
        c.host_row(id, &mut buf).unwrap();
        let n = buf.iter().take_while(|&&h| h >= 0).count();
        for &h in &sh.host[row][..n] {
            *users.entry(h).or_default() += 1;
        }
    }
    for h in cmd
        .row_mirrors
        .iter()
        .map(|m| m.span.host_block)
        .chain(cmd.page_transfers.iter().map(|t| t.host_block))
    {
        prop_assert_eq!(
            users.get(&i64::from(h)).copied(),
            Some(1),
            "copy into host block {}",
            h
        );
    }
    Ok(())
}

fn run(p: Params, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut c = setup(&p);
    let mut sh = Shadow::new(&p, c.layout().num_buckets as usize);
    let mut next_id: RequestId = 1;
    let mut known: Vec<RequestId> = Vec::new();
    let mut steps = 0u32;
    for op in ops {
        match op {
            Op::Admit { len, family } => {
                let t = tokens_for(family, u32::from(len));
                c.admit(next_id, &t)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                sh.tokens.insert(next_id, t);
                known.push(next_id);
                next_id += 1;
            }
            Op::Import { len, family } => {
                let len = u32::from(len);
                let mut t = tokens_for(family, len);
                t.push(7);
                match c.reserve_import(next_id, &t, len) {
                    Ok(blocks) => {
                        IMPORTS.fetch_add(1, Relaxed);
                        prop_assert_eq!(c.import_blocks(next_id), Some(blocks.as_slice()));
                        prop_assert!(c.start(next_id, 8).is_err(), "started before its writes");
                        sh.import(&blocks, &t, len, c.layout().block_tokens);
                        c.complete_import(next_id)
                            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                        prop_assert!(c.complete_import(next_id).is_err());
                        sh.tokens.insert(next_id, t);
                        sh.imported.insert(next_id);
                        known.push(next_id);
                        next_id += 1;
                    }
                    Err(hisparse_core::coordinator::CoordError::Import { .. }) => {}
                    Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                }
            }
            Op::Step => {
                let staged = c.pages_staged();
                let sum = c
                    .schedule_step()
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                WAITS.fetch_add(u64::from(sum.waiting_on_reclaim), Relaxed);
                let cmd = c.build_offload_command();
                STAGED_PAGES.fetch_add(c.pages_staged() - staged, Relaxed);
                steps += 1;
                check_step(&mut sh, &c, &cmd)?;
            }
            Op::Sample { finish_len } => {
                let ids: Vec<RequestId> = c.running_ids().collect();
                for id in ids {
                    let (n, done) = (c.num_tokens(id).unwrap(), c.num_computed(id).unwrap());
                    if n == done {
                        if n >= u32::from(finish_len) || n >= MAX_LEN {
                            c.finish(id).unwrap();
                            known.retain(|&k| k != id);
                            sh.tokens.remove(&id);
                        } else {
                            // Speculative decoding appends up to `max_query_len` tokens.
                            let k = (1 + (n as usize + usize::from(finish_len)) % p.mql as usize)
                                .min((MAX_LEN - n) as usize);
                            // Sampled tokens differ by position, so a rollback's replacements
                            // write different rows.
                            let new: Vec<u32> = (0..k as u32).map(|i| 7 + (n + i) % 5).collect();
                            c.append_tokens(id, &new).unwrap();
                            sh.tokens.get_mut(&id).unwrap().extend_from_slice(&new);
                        }
                    }
                }
            }
            Op::Report { worker, enq, comp } => {
                let w = usize::from(worker) % p.workers as usize;
                let e0 = sh.enq[w];
                let e1 = (e0 + usize::from(enq)).min(sh.issued.len());
                let c0 = sh.comp[w];
                let c1 = (c0 + usize::from(comp)).min(e1);
                let before = c.durable_transfer();
                // The report travels as bytes, as from a worker process.
                let fingerprint = c.layout().fingerprint();
                let report = WorkerReport {
                    worker: w as u32,
                    enqueued: sh.issued[e0..e1].to_vec(),
                    completed: sh.issued[c0..c1].to_vec(),
                };
                let r = WorkerReport::from_bytes(&report.to_bytes(fingerprint), fingerprint)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(&r, &report);
                c.report(r.worker, &r.enqueued, &r.completed)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                sh.enq[w] = e1;
                sh.comp[w] = c1;
                if sh.durable() > before {
                    DURABLE_ADVANCES.fetch_add(1, Relaxed);
                }
                prop_assert_eq!(c.durable_transfer(), sh.durable());
                // Out-of-order reports are refused.
                if c1 < e1 {
                    let bad = sh.issued[c1..e1].last().copied().unwrap();
                    if e1 - c1 >= 2 {
                        prop_assert!(c.report(w as u32, &[], &[bad]).is_err());
                    }
                }
            }
            Op::Finish { pick } => {
                if !known.is_empty() {
                    let id = known.remove(usize::from(pick) % known.len());
                    c.finish(id).unwrap();
                    sh.tokens.remove(&id);
                    sh.imported.remove(&id);
                }
            }
            Op::Preempt { pick } => {
                let ids: Vec<RequestId> = c.running_ids().collect();
                if !ids.is_empty() {
                    c.preempt(ids[usize::from(pick) % ids.len()]).unwrap();
                    // Its rows are cleared by the next command's `hot_release`/updates; the shadow
                    // compares only running requests.
                }
            }
            Op::Reclaim { blocks } => {
                c.reclaim_resident_blocks(u32::from(blocks));
            }
            Op::Rollback { pick, n } => {
                let ids: Vec<RequestId> = c.running_ids().collect();
                if !ids.is_empty() {
                    let id = ids[usize::from(pick) % ids.len()];
                    let before = c.num_computed(id).unwrap();
                    match c.rollback(id, u32::from(n)) {
                        Ok(()) => {
                            let len = c.num_tokens(id).unwrap() as usize;
                            sh.tokens.get_mut(&id).unwrap().truncate(len);
                            let after = c.num_computed(id).unwrap();
                            prop_assert!(after + u32::from(n) >= before);
                            if after < before {
                                ROLLBACKS.fetch_add(1, Relaxed);
                            }
                            sh.computed[c.slot_of(id).unwrap() as usize] = after;
                        }
                        Err(hisparse_core::coordinator::CoordError::RollbackTooFar { .. }) => {}
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                }
            }
        }
        c.check_invariants()
            .map_err(|v| TestCaseError::fail(format!("{v} after {steps} steps")))?;
    }
    // Drain: report everything, finish everything; every pool must be empty again.
    for w in 0..p.workers as usize {
        let (e0, c0) = (sh.enq[w], sh.comp[w]);
        c.report(w as u32, &sh.issued[e0..], &sh.issued[c0..])
            .unwrap();
    }
    for id in known {
        c.finish(id).unwrap();
    }
    c.check_invariants()
        .map_err(|v| TestCaseError::fail(format!("{v}")))?;
    prop_assert_eq!(c.gpu_pool().num_held(), 0);
    prop_assert_eq!(c.host_pool().num_held(), 0);
    Ok(())
}

#[test]
fn coordinator_model() {
    // 10 000 sequences by default; PROPTEST_CASES lowers it (e.g. under Miri).
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    });
    let strategy = (params(), prop::collection::vec(op(), 1..60));
    if let Err(e) = runner.run(&strategy, |(p, ops)| run(p, ops)) {
        panic!("{e}");
    }
    let counts = [
        ("reclaims", RECLAIMS.load(Relaxed)),
        ("host reads", HOST_READS.load(Relaxed)),
        ("copy-on-write tails", COW.load(Relaxed)),
        ("preemptions", PREEMPTS.load(Relaxed)),
        ("waits on reclaim", WAITS.load(Relaxed)),
        ("hot assignments", HOT_ASSIGN.load(Relaxed)),
        ("page spills", SPILLS.load(Relaxed)),
        ("window/COW block frees", WINDOW_FREES.load(Relaxed)),
        ("durable advances", DURABLE_ADVANCES.load(Relaxed)),
        ("rollbacks of computed tokens", ROLLBACKS.load(Relaxed)),
        ("context rows read and checked", CONTENT_READS.load(Relaxed)),
        (
            "reads of unpinned pages' GPU bytes",
            UNPINNED_GPU_READS.load(Relaxed),
        ),
        (
            "prefix-hit rows read on the GPU",
            ADOPTED_READS.load(Relaxed),
        ),
        ("imports", IMPORTS.load(Relaxed)),
        ("imported requests started", IMPORTED_STARTS.load(Relaxed)),
        ("pages staged for prefill", STAGED_PAGES.load(Relaxed)),
        ("staged rows read on the GPU", STAGED_READS.load(Relaxed)),
        (
            "blocks of running requests' pages written for others",
            BLOCKS_REUSED_FROM_LIVE_PAGES.load(Relaxed),
        ),
    ];
    println!("coverage over {cases} sequences: {counts:?}");
    if cases >= 1000 {
        for (what, n) in counts {
            assert!(
                n > 0,
                "no {what} happened in {cases} sequences: the test lost its teeth"
            );
        }
    }
}

/// One request of a liveness workload: its prompt (`family` and length: equal families share
/// prefixes, equal family and length are the same prompt), the length at which the engine
/// finishes it, and the step it arrives at.
#[derive(Clone, Debug)]
struct Arrival {
    len: u32,
    family: u8,
    final_len: u32,
    at: u32,
    /// Its first `len - 1` tokens' KV is imported (written into the host blocks
    /// `reserve_import` names; retried each step while the host pool lacks them), the last
    /// one computed here.
    import: bool,
}

/// Liveness workloads: pools within a few blocks of the smallest the layout allows (one
/// `MAX_LEN` request's HiSparse needs), a host pool barely larger than one request, prompts
/// drawn from two families so that many repeat (prefix hits on a pool too small for them,
/// copy-on-write tails), some of them imported (their KV written into the host pool by the
/// test, as a prefill node would), hot buffers up to four times the default (a hot region can
/// cost more than a whole request's pages), arrivals spread over the first steps.
fn liveness_case() -> impl Strategy<Value = (Params, u32, Vec<Arrival>)> {
    let params = (
        (0u32..6, 14u32..24, any::<bool>(), 1u32..=3),
        (
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.2),
            1u32..=2,
        ),
        (
            1u32..=4,
            1u32..=40,
            1u32..=4,
            prop_oneof![Just(0u32), 1u32..24],
        ),
        prop_oneof![3 => Just(1u32), 1 => 2u32..=4],
    )
        .prop_map(
            |(
                (slack, host_blocks, eager, workers),
                (prefix, window, mql),
                (mr, mb, spill, reclaim_min),
                hot_scale,
            )| {
                (
                    Params {
                        gpu_blocks: 0,
                        host_blocks,
                        eager,
                        workers,
                        prefix,
                        window,
                        mql,
                        max_running: mr,
                        max_batched: mb,
                        spill,
                        reclaim_min,
                        // Hot buffers up to four times the default, with prefix caching on
                        // too: a prefix hit whose hot region cost more than the pages it
                        // spared once livelocked (a lone request started at its hit with the
                        // whole pool taken, was preempted for its next page and started the
                        // same way again).
                        hot_scale,
                    },
                    slack,
                )
            },
        );
    let arrival = (
        1u32..=MAX_LEN,
        0u8..2,
        0u32..=MAX_LEN,
        0u32..12,
        prop::bool::weighted(0.3),
    )
        .prop_map(|(len, family, extra, at, import)| Arrival {
            len,
            family,
            final_len: (len + extra % (MAX_LEN - len + 1)).max(len),
            at,
            import: import && len > 1,
        });
    (params, prop::collection::vec(arrival, 1..=6)).prop_map(|((p, slack), a)| (p, slack, a))
}

/// GPU blocks (null block included) of the smallest pool `p`'s layout allows.
fn min_gpu_blocks(p: &Params) -> u32 {
    let roomy = Params {
        gpu_blocks: 1 << 12,
        ..p.clone()
    };
    let kv = setup(&roomy).layout().clone();
    // Prefill reads its whole context on the GPU: one MAX_LEN request's pages at the least.
    1 + kv.gpu_blocks_per_request(MAX_LEN).all_on_gpu as u32
}

/// Most steps a liveness workload may take: every token computed one step at a time, twice
/// over (a preempted request recomputes), per request, plus the arrival window and the
/// workers' reporting lag. Requests share the pool, so they are counted one after another.
fn step_bound(p: &Params, arrivals: &[Arrival]) -> u32 {
    let tokens: u32 = arrivals.iter().map(|a| a.final_len).sum();
    12 + 4 * tokens + 4 * p.workers * arrivals.len() as u32
}

static LIVENESS_MAX_SHARE: AtomicU64 = AtomicU64::new(0);
static LIVENESS_RECOMPUTED: AtomicU64 = AtomicU64::new(0);
static LIVENESS_HITS: AtomicU64 = AtomicU64::new(0);
static LIVENESS_SHRUNK: AtomicU64 = AtomicU64::new(0);
static LIVENESS_IMPORTS: AtomicU64 = AtomicU64::new(0);

/// Drives a workload as an engine does: arrivals are admitted at their step; every step's
/// command goes through the shadow checks; worker `w` reports each batch `w` steps after it was
/// issued (tensor-parallel ranks running behind one another); a request whose tokens are all
/// computed gets sampled tokens (up to `max_query_len`, speculative decoding) until its final
/// length, then is finished. Every request must finish within [`step_bound`] steps, and every
/// block must come back.
fn run_liveness(p: Params, slack: u32, arrivals: Vec<Arrival>) -> Result<(), TestCaseError> {
    let p = Params {
        gpu_blocks: min_gpu_blocks(&p) + slack,
        ..p
    };
    let mut c = setup(&p);
    let mut sh = Shadow::new(&p, c.layout().num_buckets as usize);
    let bound = step_bound(&p, &arrivals);
    let mut open: HashMap<RequestId, u32> = HashMap::new();
    let mut backlog: Vec<Vec<(u64, u32)>> = vec![Vec::new(); p.workers as usize];
    let mut step = 0u32;
    // Imports whose host blocks were short when they arrived: retried every step.
    let mut to_import: Vec<usize> = Vec::new();
    while step < bound {
        for (i, a) in arrivals.iter().enumerate() {
            if a.at == step {
                if a.import {
                    to_import.push(i);
                    continue;
                }
                let id = i as RequestId + 1;
                let t = tokens_for(a.family, a.len);
                c.admit(id, &t)
                    .map_err(|e| TestCaseError::fail(format!("admit: {e}")))?;
                sh.tokens.insert(id, t);
                open.insert(id, a.final_len);
            }
        }
        let mut still = Vec::new();
        for i in to_import.drain(..) {
            let (a, id) = (&arrivals[i], i as RequestId + 1);
            let t = tokens_for(a.family, a.len);
            match c.reserve_import(id, &t, a.len - 1) {
                Ok(blocks) => {
                    LIVENESS_IMPORTS.fetch_add(1, Relaxed);
                    sh.import(&blocks, &t, a.len - 1, BT);
                    c.complete_import(id)
                        .map_err(|e| TestCaseError::fail(format!("complete_import: {e}")))?;
                    sh.tokens.insert(id, t);
                    sh.imported.insert(id);
                    open.insert(id, a.final_len);
                }
                Err(hisparse_core::coordinator::CoordError::Import { .. }) => still.push(i),
                Err(e) => return Err(TestCaseError::fail(format!("reserve_import: {e}"))),
            }
        }
        to_import = still;
        step += 1;
        c.schedule_step()
            .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
        let cmd = c.build_offload_command();
        for s in &cmd.scheduled {
            let row_started = cmd.started.contains(&s.slot);
            if row_started && s.first_token > 0 && !arrivals[s.id as usize - 1].import {
                LIVENESS_HITS.fetch_add(1, Relaxed);
            }
            if s.first_token == 0 {
                let a = &arrivals[s.id as usize - 1];
                let repeat = arrivals[..s.id as usize - 1]
                    .iter()
                    .any(|b| b.family == a.family && b.len >= a.len && a.len >= BT);
                if repeat && p.prefix {
                    LIVENESS_RECOMPUTED.fetch_add(1, Relaxed);
                }
                if s.num_tokens < a.len.min(p.max_batched) {
                    LIVENESS_SHRUNK.fetch_add(1, Relaxed);
                }
            }
        }
        check_step(&mut sh, &c, &cmd)?;
        for (w, queue) in backlog.iter_mut().enumerate() {
            if let Some(id) = cmd.transfer_id {
                queue.push((id, step));
            }
            let due = queue
                .iter()
                .take_while(|&&(_, at)| at + w as u32 <= step)
                .count();
            let ids: Vec<u64> = queue.drain(..due).map(|(id, _)| id).collect();
            let e0 = sh.enq[w];
            c.report(w as u32, &ids, &ids)
                .map_err(|e| TestCaseError::fail(format!("report: {e}")))?;
            sh.enq[w] = e0 + ids.len();
            sh.comp[w] = sh.enq[w];
        }
        prop_assert_eq!(c.durable_transfer(), sh.durable());
        let running: Vec<RequestId> = c.running_ids().collect();
        for id in running {
            let (n, done) = (c.num_tokens(id).unwrap(), c.num_computed(id).unwrap());
            if n != done {
                continue;
            }
            let want = open[&id];
            if n >= want {
                c.finish(id).unwrap();
                open.remove(&id);
                sh.tokens.remove(&id);
            } else {
                let k = (1 + (n + id as u32) % p.mql).min(want - n);
                c.append_tokens(id, &vec![7; k as usize]).unwrap();
                sh.tokens
                    .get_mut(&id)
                    .unwrap()
                    .extend(std::iter::repeat_n(7, k as usize));
            }
        }
        c.check_invariants()
            .map_err(|v| TestCaseError::fail(format!("{v} after {step} steps")))?;
        let all_arrived = arrivals.iter().all(|a| a.at < step) && to_import.is_empty();
        if all_arrived && open.is_empty() {
            break;
        }
    }
    prop_assert!(
        open.is_empty() && arrivals.iter().all(|a| a.at < step) && to_import.is_empty(),
        "requests {:?} unfinished after {} steps ({} waiting, {} running)",
        open.keys().collect::<Vec<_>>(),
        step,
        c.num_waiting(),
        c.num_running()
    );
    LIVENESS_MAX_SHARE.fetch_max(u64::from(step) * 1000 / u64::from(bound), Relaxed);
    for (w, queue) in backlog.iter_mut().enumerate() {
        let ids: Vec<u64> = queue.drain(..).map(|(id, _)| id).collect();
        c.report(w as u32, &ids, &ids).unwrap();
    }
    c.check_invariants()
        .map_err(|v| TestCaseError::fail(format!("{v}")))?;
    prop_assert_eq!(c.gpu_pool().num_held(), 0);
    prop_assert_eq!(c.host_pool().num_held(), 0);
    Ok(())
}

/// Liveness: with every worker reporting (some of them late), every admitted request whose
/// context fits the layout finishes within [`step_bound`] steps, on pools at most a few blocks
/// above the smallest the layout allows and with prompts that repeat.
#[test]
fn coordinator_liveness() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    });
    if let Err(e) = runner.run(&liveness_case(), |(p, slack, a)| run_liveness(p, slack, a)) {
        panic!("{e}");
    }
    let share = LIVENESS_MAX_SHARE.load(Relaxed);
    let counts = [
        ("first chunks shrunk", LIVENESS_SHRUNK.load(Relaxed)),
        ("prefix hits used", LIVENESS_HITS.load(Relaxed)),
        (
            "repeated prompts recomputed from the start",
            LIVENESS_RECOMPUTED.load(Relaxed),
        ),
        ("imported requests", LIVENESS_IMPORTS.load(Relaxed)),
    ];
    println!(
        "liveness over {cases} workloads: slowest used {}.{}% of its step bound; {counts:?}",
        share / 10,
        share % 10
    );
    if cases >= 1000 {
        for (what, n) in counts {
            assert!(
                n > 0,
                "no {what} in {cases} workloads: the test lost its teeth"
            );
        }
    }
}

/// A prefix hit with a hot buffer three times the default and prefix caching on (found by
/// `coordinator_liveness`): request 2's 42-token prompt hits request 1's page; when a hit took a
/// hot region for its host-only pages, the lone request started with the whole pool taken, was
/// preempted for its next page and started the same way again, forever. The hit now stages its
/// host-only pages for its first chunk instead.
#[test]
fn a_prefix_hit_with_a_large_hot_buffer_does_not_livelock() {
    let p = Params {
        gpu_blocks: 0,
        host_blocks: 21,
        eager: true,
        workers: 1,
        prefix: true,
        window: true,
        mql: 2,
        max_running: 2,
        max_batched: 4,
        spill: 1,
        reclaim_min: 0,
        hot_scale: 3,
    };
    let arrivals = vec![
        Arrival {
            len: 4,
            family: 0,
            final_len: 25,
            at: 3,
            import: false,
        },
        Arrival {
            len: 42,
            family: 0,
            final_len: 43,
            at: 3,
            import: false,
        },
    ];
    run_liveness(p, 1, arrivals).unwrap();
}

/// Found by `coordinator_model`: a rollback after a prefix hit on a preempted request's pages.
#[test]
fn rollback_after_a_prefix_hit_keeps_gpu_blocks_single_owned() {
    let p = Params {
        gpu_blocks: 76,
        host_blocks: 18,
        eager: false,
        workers: 1,
        prefix: true,
        window: false,
        mql: 2,
        max_running: 4,
        max_batched: 8,
        spill: 2,
        reclaim_min: 0,
        hot_scale: 1,
    };
    let ops = vec![
        Op::Admit { len: 4, family: 0 },
        Op::Step,
        Op::Preempt { pick: 0 },
        Op::Step,
        Op::Reclaim { blocks: 1 },
        Op::Report {
            worker: 0,
            enq: 2,
            comp: 2,
        },
        Op::Admit { len: 5, family: 0 },
        Op::Step,
        Op::Rollback { pick: 12, n: 1 },
        Op::Step,
    ];
    run(p, ops).unwrap();
}

/// Found by `coordinator_model`: a rollback after imports and a preemption, reclaim in the tail.
#[test]
fn rollback_after_imports_never_reclaims_the_active_tail() {
    let p = Params {
        gpu_blocks: 93,
        host_blocks: 34,
        eager: false,
        workers: 1,
        prefix: true,
        window: false,
        mql: 2,
        max_running: 4,
        max_batched: 4,
        spill: 1,
        reclaim_min: 0,
        hot_scale: 1,
    };
    let ops = vec![
        Op::Import { len: 8, family: 0 },
        Op::Admit { len: 24, family: 0 },
        Op::Step,
        Op::Step,
        Op::Step,
        Op::Step,
        Op::Sample { finish_len: 8 },
        Op::Import { len: 4, family: 0 },
        Op::Import { len: 36, family: 0 },
        Op::Report {
            worker: 0,
            enq: 1,
            comp: 1,
        },
        Op::Import { len: 32, family: 0 },
        Op::Step,
        Op::Report {
            worker: 0,
            enq: 3,
            comp: 3,
        },
        Op::Step,
        Op::Preempt { pick: 0 },
        Op::Report {
            worker: 0,
            enq: 1,
            comp: 1,
        },
        Op::Step,
        Op::Step,
        Op::Sample { finish_len: 26 },
        Op::Rollback { pick: 62, n: 2 },
        Op::Step,
    ];
    run(p, ops).unwrap();
}
