//! Unit tests of the coordinator on a tiny two-layer model.

use super::*;
use crate::config::HiSparseConfig;
use crate::layout::{KvCacheConfig, LayoutInput, plan_layout};
use crate::model::{LayerSpec, ModelSpec};
use crate::ops::{BlockPair, RowSpan};
use alloc::format;
use alloc::string::ToString;
use alloc::vec;

/// Two sparse leaders (16 B rows, 16 B indexer rows), 4-token blocks: one bucket of both
/// layers, so a page costs 2 GPU blocks (indexer + resident) and a hot region 2 blocks.
const LAYERS: [LayerSpec; 2] = [
    LayerSpec::sparse_leader(16, 16),
    LayerSpec::sparse_leader(16, 16),
];
const MODEL: ModelSpec<'static> = ModelSpec {
    name: "tiny",
    block_tokens: 4,
    top_k: 4,
    layers: &LAYERS,
};

fn coord(gpu_blocks: u32, eager: bool, workers: u32) -> Coordinator {
    coord_len(gpu_blocks, eager, workers, 48)
}

fn coord_len(gpu_blocks: u32, eager: bool, workers: u32, max_len: u32) -> Coordinator {
    // 64 host blocks: 128 B of pool (2 layers x 4 tokens x 16 B) and 128 B of indexer host
    // cache each.
    let mut cfg = HiSparseConfig::new(4, 64 * 256);
    cfg.device_buffer_size = Some(8);
    cfg.eager_host_mirror = eager;
    let mut input = LayoutInput::new(&MODEL, &cfg, 0, max_len);
    input.num_gpu_blocks_override = Some(gpu_blocks);
    let kv = plan_layout(&input).unwrap();
    assert_eq!(
        (
            kv.num_buckets,
            kv.hot_blocks_per_request,
            kv.host_num_blocks
        ),
        (1, 2, 64)
    );
    Coordinator::new(
        kv,
        CoordinatorConfig {
            max_running: 4,
            max_batched_tokens: 64,
            max_spill_pages_per_step: 2,
            num_workers: workers,
            enable_prefix_caching: true,
            reclaim_min_blocks: 0,
        },
    )
    .unwrap()
}

fn toks(n: u32) -> Vec<u32> {
    (0..n).collect()
}

fn row(c: &Coordinator, id: RequestId) -> Vec<i32> {
    let mut v = vec![0; c.max_pages() as usize];
    c.resident_row(id, 0, &mut v).unwrap();
    v
}

#[test]
fn prefill_mirrors_then_reclaim_converts_oldest_first() {
    let mut c = coord(40, true, 1);
    c.admit(1, &toks(40)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.started, [0]);
    assert_eq!(cmd.scheduled.len(), 1);
    assert_eq!(cmd.scheduled[0].num_tokens, 40);
    assert!(cmd.fully_resident);
    // Page p: indexer block 1 + 2p, resident block 2 + 2p; host blocks 1..=10.
    assert_eq!(&row(&c, 1)[..10], &[2, 4, 6, 8, 10, 12, 14, 16, 18, 20]);
    // One coalesced mirror span per page.
    assert_eq!(cmd.row_mirrors.len(), 10);
    assert_eq!(
        cmd.row_mirrors[3].span,
        RowSpan {
            device_block: 8,
            host_block: 4,
            first_row: 0,
            num_rows: 4
        }
    );
    assert_eq!(cmd.transfer_id, Some(1));
    assert_eq!(c.page_state(1, 0), Some(PageState::Pending));
    assert_eq!(c.ready_prefix_pages(1), Some(0));
    // Nothing is clean yet: reclaim marks pending pages and frees nothing now.
    c.report(0, &[1], &[]).unwrap();
    assert_eq!(c.ready_prefix_pages(1), Some(0));
    c.report(0, &[], &[1]).unwrap();
    assert_eq!(c.ready_prefix_pages(1), Some(10));
    assert_eq!(c.page_state(1, 9), Some(PageState::Clean));
    // 9 candidates (every full page but the last: the next token writes page 10, and the
    // active tail is that page and page 9) > 2 hot blocks: convert, unpinning all 9 clean
    // pages (9 blocks back in the free queue) and paying 2 for the hot region.
    assert_eq!(c.reclaim_resident_blocks(3), 7);
    // Lazy reclaim: the unpinned pages keep their entries, their bytes are still valid.
    assert_eq!(&row(&c, 1)[..10], &[2, 4, 6, 8, 10, 12, 14, 16, 18, 20]);
    assert_eq!(c.page_state(1, 8), Some(PageState::Unpinned));
    assert_eq!(c.page_state(1, 9), Some(PageState::Clean));
    assert_eq!(c.host_only_pages(1), Some(0));
    // Blocks 21..=39 were free; the hot region takes the head of the LRU queue.
    let mut hot = [0i32; 2];
    c.hot_row(1, 0, &mut hot).unwrap();
    assert_eq!(hot, [21, 22]);
    let cmd = c.build_offload_command();
    assert!(cmd.residency.is_empty());
    assert_eq!(cmd.hot_assign.len(), 1);
    assert_eq!(cmd.hot_assign[0].blocks, [21, 22]);
    assert_eq!(cmd.hot_assign[0].group, 3);
    c.check_invariants().unwrap();
    // Decode: the new page comes from the head of the queue (23, 24), the unpinned blocks are
    // at its tail: the next token still reads every page on the GPU.
    c.append_tokens(1, &[9]).unwrap();
    let cmd = c.step().unwrap();
    assert!(cmd.fully_resident);
    assert_eq!(cmd.scheduled[0].first_token, 40);
    assert_eq!(&row(&c, 1)[..11], &[2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 24]);
    c.finish(1).unwrap();
    c.check_invariants().unwrap();
}

/// Lazy reclaim: an unpinned page reads its GPU copy until the pool hands one of its blocks
/// to someone else; from that command on it reads from host, once.
#[test]
fn unpinned_pages_fall_back_when_their_blocks_are_reused() {
    // 22 usable blocks: request 1 takes 20 (10 pages), leaving 2.
    let mut c = coord(23, true, 1);
    c.admit(1, &toks(40)).unwrap();
    c.step().unwrap();
    c.report(0, &[1], &[1]).unwrap();
    // Convert: 2 blocks for the hot region, the 9 clean pages unpinned.
    assert_eq!(c.reclaim_resident_blocks(1), 7);
    assert_eq!(c.gpu_pool().num_free(), 9);
    let cmd = c.build_offload_command();
    assert!(cmd.residency.is_empty());
    // A 12-token request takes 3 pages (6 blocks): the 6 oldest unpinned blocks (pages 0..=5
    // of request 1, unpinned in page order) are handed out, so those pages fall back to host
    // in the same command that gives the blocks to request 2, before its forward writes them.
    let other: Vec<u32> = (100..112).collect();
    c.admit(2, &other).unwrap();
    let cmd = c.step().unwrap();
    let nulls: Vec<u32> = cmd
        .residency
        .iter()
        .filter(|u| u.block == 0)
        .map(|u| u.page)
        .collect();
    assert_eq!(nulls, [0, 1, 2, 3, 4, 5]);
    assert_eq!(c.host_only_pages(1), Some(6));
    assert_eq!(c.page_state(1, 5), Some(PageState::Reclaimed));
    assert_eq!(c.page_state(1, 6), Some(PageState::Unpinned));
    assert_eq!(&row(&c, 1)[..10], &[0, 0, 0, 0, 0, 0, 14, 16, 18, 20]);
    let given: Vec<u32> = cmd
        .residency
        .iter()
        .filter(|u| u.slot == c.slot_of(2).unwrap())
        .map(|u| u.block)
        .collect();
    assert_eq!(given, [4, 8, 12]);
    c.check_invariants().unwrap();
    // Finishing request 1 drops the marks of its still-unpinned blocks.
    c.finish(1).unwrap();
    c.check_invariants().unwrap();
    c.finish(2).unwrap();
    c.check_invariants().unwrap();
    // Request 2's blocks wait for its copies.
    let id = cmd.transfer_id.unwrap();
    c.report(0, &[id], &[id]).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.gpu_pool().num_held(), 0);
}

#[test]
fn wait_while_reclaim_in_flight_then_admit() {
    // 22 usable blocks: request 1 takes 20, leaving 2.
    let mut c = coord(23, true, 1);
    c.admit(1, &toks(40)).unwrap();
    c.step().unwrap(); // 20 blocks, transfer 1 in flight
    let other: Vec<u32> = (100..112).collect(); // no prefix in common
    c.admit(2, &other).unwrap(); // needs 6 blocks, 2 free
    let sum = c.schedule_step().unwrap();
    // Request 1's 9 old pages are marked release-after-transfer (it gets its hot region
    // now, which takes the 2 free blocks), so request 2 waits instead of preempting anyone.
    assert_eq!(sum.waiting_on_reclaim, 1);
    assert_eq!(sum.preempted, 0);
    assert_eq!(c.page_state(1, 0), Some(PageState::PendingRelease));
    assert_eq!(c.has_hot_region(1), Some(true));
    let cmd = c.build_offload_command();
    assert_eq!(cmd.transfer_id, None);
    assert!(cmd.residency.is_empty());
    c.check_invariants().unwrap();
    c.report(0, &[1], &[1]).unwrap();
    assert_eq!(c.page_state(1, 0), Some(PageState::Unpinned));
    // 22 usable - 20 (request 1) - 2 (its hot region) + 9 unpinned.
    assert_eq!(c.gpu_pool().num_free(), 9);
    let cmd = c.step().unwrap();
    // Request 2's 6 blocks are the oldest unpinned ones: those 6 pages fall back in the
    // command that starts request 2.
    assert_eq!(cmd.residency.iter().filter(|u| u.block == 0).count(), 6);
    assert_eq!(cmd.scheduled.len(), 1);
    assert_eq!(cmd.scheduled[0].id, 2);
    assert_eq!(cmd.scheduled[0].num_tokens, 12);
    c.check_invariants().unwrap();
}

/// A first chunk larger than the free pool shrinks to the pages it holds (here one), instead
/// of waiting for the whole chunk.
#[test]
fn first_chunk_shrinks_to_the_free_pool_while_reclaim_is_in_flight() {
    // 24 usable blocks: request 1 takes 20, leaving 4.
    let mut c = coord(25, true, 1);
    c.admit(1, &toks(40)).unwrap();
    c.step().unwrap();
    let other: Vec<u32> = (100..112).collect();
    c.admit(2, &other).unwrap(); // 3 pages = 6 blocks
    let sum = c.schedule_step().unwrap();
    // Request 1 converts (its hot region takes 2 blocks, its pages go release-after-transfer);
    // the 2 blocks left hold one page of request 2: a 4-token chunk.
    assert_eq!(
        (sum.started, sum.waiting_on_reclaim, sum.preempted),
        (1, 0, 0)
    );
    assert_eq!(c.page_state(1, 0), Some(PageState::PendingRelease));
    let cmd = c.build_offload_command();
    assert_eq!(cmd.scheduled.len(), 1);
    assert_eq!((cmd.scheduled[0].id, cmd.scheduled[0].num_tokens), (2, 4));
    assert_eq!(c.gpu_pool().num_free(), 0);
    c.check_invariants().unwrap();
    c.report(0, &[1, 2], &[1, 2]).unwrap();
    // The rest of the prompt follows once the releases land.
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 1);
    assert_eq!(
        (cmd.scheduled[0].first_token, cmd.scheduled[0].num_tokens),
        (4, 8)
    );
    c.check_invariants().unwrap();
}

#[test]
fn no_space_preempts_the_newest() {
    // 8 usable blocks: two 2-page requests fill them; growth needs a page.
    let mut c = coord_len(9, true, 1, 12);
    c.admit(1, &toks(8)).unwrap();
    c.admit(2, &toks(8)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 2);
    c.report(0, &[1], &[1]).unwrap();
    c.append_tokens(1, &[1]).unwrap();
    c.append_tokens(2, &[1]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.preempted, [2]);
    assert_eq!(cmd.scheduled.len(), 1);
    assert_eq!(cmd.scheduled[0].id, 1);
    assert_eq!(c.slot_of(2), None);
    assert_eq!(c.num_waiting(), 1);
    c.check_invariants().unwrap();
    // Request 2 restarts later and recomputes its 9 tokens.
    c.finish(1).unwrap();
    c.report(0, &[2], &[2]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled[0].id, 2);
    c.check_invariants().unwrap();
}

#[test]
fn several_workers_and_fifo_reports() {
    let mut c = coord(40, true, 2);
    c.admit(1, &toks(8)).unwrap();
    assert_eq!(c.step().unwrap().transfer_id, Some(1));
    c.append_tokens(1, &[5]).unwrap();
    assert_eq!(c.step().unwrap().transfer_id, Some(2));
    assert_eq!(
        c.report(2, &[1], &[]),
        Err(CoordError::UnknownWorker {
            worker: 2,
            num_workers: 2
        })
    );
    assert_eq!(
        c.report(0, &[2], &[]),
        Err(CoordError::OutOfOrderReport {
            worker: 0,
            what: "enqueued",
            id: 2,
            expected: 1
        })
    );
    assert_eq!(
        c.report(0, &[1], &[2]),
        Err(CoordError::OutOfOrderReport {
            worker: 0,
            what: "completed",
            id: 2,
            expected: 1
        })
    );
    assert!(c.report(0, &[3], &[]).is_err()); // never issued
    c.report(0, &[1, 2], &[1, 2]).unwrap();
    assert_eq!(c.durable_transfer(), 0);
    assert_eq!(c.ready_prefix_pages(1), Some(0));
    c.report(1, &[1], &[1]).unwrap();
    assert_eq!(c.durable_transfer(), 1);
    assert_eq!(c.ready_prefix_pages(1), Some(2));
    c.report(1, &[2], &[2]).unwrap();
    assert_eq!(c.durable_transfer(), 2);
    c.check_invariants().unwrap();
}

#[test]
fn prefix_hits_and_copy_on_write_tail() {
    let mut c = coord(40, true, 1);
    c.admit(1, &toks(8)).unwrap();
    c.step().unwrap();
    let mut host_a = vec![0; c.max_pages() as usize];
    c.host_row(1, &mut host_a).unwrap();
    // Not durable yet: no hit.
    c.admit(2, &toks(12)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled[0].first_token, 0);
    let mut host_b = vec![0; c.max_pages() as usize];
    c.host_row(2, &mut host_b).unwrap();
    // Request 2 finishes while its copies are in flight: its pages are published once durable
    // (detached publication), before request 1's reach its durable prefix, so they carry the
    // prefix keys.
    c.finish(2).unwrap();
    c.report(0, &[1, 2], &[1, 2]).unwrap();
    // Request 1's pages are durable now: their GPU copies are published with them.
    let gpu_a = row(&c, 1);
    c.finish(1).unwrap();
    let host_a = host_b;
    // Same 8-token prompt: both pages hit, the last one becomes a copy-on-write tail and
    // only the last token is computed. Page 0's GPU copy (request 1's, freed but not reused)
    // is adopted: the request reads every page on the GPU and needs no hot region.
    c.admit(3, &toks(8)).unwrap();
    let cmd = c.step().unwrap();
    let s = cmd.scheduled[0];
    assert_eq!(
        (s.first_token, s.num_tokens, s.fully_resident),
        (7, 1, true)
    );
    assert_eq!(cmd.host_cow.len(), 1);
    assert_eq!(cmd.host_cow[0].src, host_a[1] as u32);
    assert_eq!(cmd.gpu_cow.len(), 1);
    assert_eq!(cmd.restores.len(), 1);
    assert!(cmd.hot_assign.is_empty());
    // The sources stay allocated until the step's batch (it has one for them) is complete.
    let cow_batch = cmd.transfer_id.unwrap();
    assert!(!c.host_pool().is_free(cmd.host_cow[0].src));
    assert!(!c.gpu_pool().is_free(cmd.gpu_cow[0].src));
    let mut host_c = vec![0; c.max_pages() as usize];
    c.host_row(3, &mut host_c).unwrap();
    assert_eq!(host_c[0], host_a[0]);
    assert_eq!(host_c[1], cmd.host_cow[0].dst as i32);
    let r = row(&c, 3);
    assert_eq!(r[0], gpu_a[0]);
    assert_eq!(r[1], cmd.restores[0].device_block as i32);
    assert_eq!(c.ready_prefix_pages(3), Some(1));
    assert_eq!(c.page_state(3, 0), Some(PageState::Clean));
    assert_eq!(c.page_state(3, 1), Some(PageState::Pending));
    // The tail's last row is mirrored into the private host copy.
    assert_eq!(cmd.row_mirrors.len(), 1);
    assert_eq!(cmd.row_mirrors[0].span.first_row, 3);
    assert_eq!(cmd.row_mirrors[0].span.host_block, host_c[1] as u32);
    c.check_invariants().unwrap();
    // A longer prompt with the same 8-token prefix hits both pages without copy-on-write.
    c.admit(4, &toks(10)).unwrap();
    let cmd = c.step().unwrap();
    let s = cmd.scheduled[0];
    assert_eq!((s.first_token, s.num_tokens), (8, 2));
    assert!(cmd.host_cow.is_empty());
    // Both hit pages still have request 1's GPU copies (page 0 shared with request 3): the
    // request reads them on the GPU.
    assert_eq!(c.host_only_pages(4), Some(0));
    assert_eq!(&row(&c, 4)[..2], &gpu_a[..2]);
    assert!(cmd.scheduled[0].fully_resident);
    c.check_invariants().unwrap();
    // Once the copy-on-write step's batch is complete, its sources are free again.
    c.report(0, &[cow_batch], &[cow_batch]).unwrap();
    c.check_invariants().unwrap();
}

#[test]
fn spills_under_a_budget_without_eager_mirroring() {
    let mut c = coord(40, false, 1);
    c.admit(1, &toks(40)).unwrap();
    let cmd = c.step().unwrap();
    assert!(cmd.row_mirrors.is_empty());
    assert_eq!(cmd.page_transfers.len(), 2);
    assert_eq!(
        cmd.page_transfers[0],
        PageTransfer {
            bucket: 0,
            device_block: 2,
            host_block: 1
        }
    );
    assert_eq!(c.page_state(1, 2), Some(PageState::Dirty));
    let cmd = c.step().unwrap();
    assert_eq!(cmd.page_transfers.len(), 2);
    assert_eq!(cmd.page_transfers[0].host_block, 3);
    c.report(0, &[1, 2], &[1, 2]).unwrap();
    assert_eq!(c.ready_prefix_pages(1), Some(4));
    // Reclaim forces the spill of dirty full pages with release-after-transfer.
    c.reclaim_resident_blocks(8);
    assert_eq!(c.page_state(1, 0), Some(PageState::Unpinned));
    assert_eq!(c.page_state(1, 4), Some(PageState::PendingRelease));
    assert_eq!(c.page_state(1, 8), Some(PageState::PendingRelease));
    // 5 forced spills (pages 4..=8) plus what is left of this step's budget for the sealed
    // pages: page 9.
    let cmd = c.build_offload_command();
    assert_eq!(cmd.page_transfers.len(), 6);
    assert_eq!(c.page_state(1, 9), Some(PageState::Pending));
    c.check_invariants().unwrap();
}

/// The indexer block and host block of each of `id`'s first `pages` pages.
fn indexer_and_host(c: &Coordinator, id: RequestId, pages: usize) -> Vec<(u32, u32)> {
    let (mut ix, mut host) = (
        vec![0; c.max_pages() as usize],
        vec![0; c.max_pages() as usize],
    );
    c.block_table_row(id, KvCacheConfig::INDEXER_GROUP, &mut ix)
        .unwrap();
    c.host_row(id, &mut host).unwrap();
    (0..pages).map(|p| (ix[p] as u32, host[p] as u32)).collect()
}

#[test]
fn indexer_rows_are_backed_up_with_the_kv_and_restored_for_a_hit_from_host() {
    let mut c = coord(40, true, 1);
    c.admit(1, &toks(8)).unwrap();
    let cmd = c.step().unwrap();
    // One row per token, 4 per page: the rows the prompt wrote, page by page, from the
    // request's indexer blocks to its host blocks, in the batch of its row mirrors.
    let blocks = indexer_and_host(&c, 1, 2);
    let span = |(device_block, host_block): (u32, u32)| RowSpan {
        device_block,
        host_block,
        first_row: 0,
        num_rows: 4,
    };
    assert_eq!(cmd.indexer_backups, [span(blocks[0]), span(blocks[1])]);
    assert!(cmd.transfer_id.is_some() && !cmd.row_mirrors.is_empty());
    // Until the batch is durable nothing is published: a hit needs the keys on host.
    c.report(0, &[1], &[1]).unwrap();
    c.finish(1).unwrap();
    // Memory pressure took the pages' GPU copies, indexer blocks included.
    assert!(c.drop_cached_gpu_copies(&toks(8)) >= 4);
    c.admit(2, &toks(12)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled[0].first_token, 8, "both pages hit from host");
    // The hit pages' keys come back from host into the new request's indexer blocks.
    let now = indexer_and_host(&c, 2, 2);
    assert_eq!(now[0].1, blocks[0].1);
    assert_eq!(now[1].1, blocks[1].1);
    assert_eq!(
        cmd.indexer_restores,
        [
            BlockPair {
                src: blocks[0].1,
                dst: now[0].0
            },
            BlockPair {
                src: blocks[1].1,
                dst: now[1].0
            }
        ]
    );
    // Its own tokens' rows are backed up as they are written.
    assert_eq!(cmd.indexer_backups.len(), 1);
    assert_eq!(cmd.indexer_backups[0].first_row, 0);
    c.check_invariants().unwrap();
    // Without eager mirroring a page's keys go with its spill, the whole page.
    let mut c = coord(40, false, 1);
    c.admit(1, &toks(8)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.page_transfers.len(), 2);
    let blocks = indexer_and_host(&c, 1, 2);
    assert_eq!(cmd.indexer_backups, [span(blocks[0]), span(blocks[1])]);
}

#[test]
fn deepseek_v4_compressed_rows_and_sliding_window() {
    use crate::presets::DEEPSEEK_V4;
    let cfg = HiSparseConfig::new(DEEPSEEK_V4.top_k, 64 << 30);
    let mut input = LayoutInput::new(&DEEPSEEK_V4, &cfg, 0, 65536);
    input.num_gpu_blocks_override = Some(4000);
    let kv = plan_layout(&input).unwrap();
    let swa = kv.regular_groups().start as u32;
    assert_eq!(kv.groups[swa as usize].sliding_window, Some(128));
    let mut c = Coordinator::new(
        kv,
        CoordinatorConfig {
            max_batched_tokens: 4096,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap();
    c.admit(1, &toks(1000)).unwrap();
    let cmd = c.step().unwrap();
    // 1000 tokens = 250 compressed rows = pages of 64 rows: 64, 64, 64 and 58 rows; one span
    // per page per bucket (6 buckets).
    assert_eq!(cmd.row_mirrors.len(), 4 * 6);
    let spans: Vec<(u32, u32)> = cmd
        .row_mirrors
        .iter()
        .filter(|m| m.bucket == 0)
        .map(|m| (m.span.first_row, m.span.num_rows))
        .collect();
    assert_eq!(spans, [(0, 64), (0, 64), (0, 64), (0, 58)]);
    // Pages 0..=2 (tokens 0..768) are sealed; page 3 is still being written.
    assert_eq!(c.page_state(1, 2), Some(PageState::Pending));
    assert_eq!(c.page_state(1, 3), Some(PageState::Dirty));
    // The first sliding-window group (window 128 tokens, 64-token blocks) keeps only the
    // blocks covering tokens 872..1000: columns 13..16; columns 0..=12 are given back.
    assert_eq!(kv_block_tokens(&c, swa), 64);
    let freed: Vec<u32> = cmd
        .block_tables
        .iter()
        .filter(|u| u.group == swa && u.block == 0)
        .map(|u| u.page)
        .collect();
    assert_eq!(freed, (0..13).collect::<Vec<u32>>());
    let mut t = vec![0; c.layout().table_width(swa as usize) as usize];
    assert_eq!(t.len(), 1024);
    c.block_table_row(1, swa as usize, &mut t).unwrap();
    assert!(t[..13].iter().all(|&b| b == 0));
    assert!(t[13..16].iter().all(|&b| b > 0));
    assert!(t[16..].iter().all(|&b| b == 0));
    // A compressor state (window 8, 4-token blocks) keeps columns 248..250.
    let state = c
        .layout()
        .groups
        .iter()
        .position(|g| g.block_tokens == 4 && g.sliding_window == Some(8))
        .unwrap();
    let mut t = vec![0; c.layout().table_width(state) as usize];
    c.block_table_row(1, state, &mut t).unwrap();
    let held: Vec<usize> = (0..t.len()).filter(|&i| t[i] > 0).collect();
    assert_eq!(held, [248, 249]);
    c.check_invariants().unwrap();
}

fn kv_block_tokens(c: &Coordinator, group: u32) -> u32 {
    c.layout().groups[group as usize].block_tokens
}

/// Prefix caching with sliding-window groups (DeepSeek V4): a later request with the same
/// prompt reuses the durable host pages, every indexer and full-attention block of the prefix,
/// and only the window's last blocks in each sliding-window group.
#[test]
fn prefix_hits_with_sliding_window_groups() {
    use crate::presets::DEEPSEEK_V4;
    let cfg = HiSparseConfig::new(DEEPSEEK_V4.top_k, 64 << 30);
    let mut input = LayoutInput::new(&DEEPSEEK_V4, &cfg, 0, 65536);
    input.num_gpu_blocks_override = Some(4000);
    let kv = plan_layout(&input).unwrap();
    let mut c = Coordinator::new(kv, CoordinatorConfig::default()).unwrap();
    let prompt = toks(2000);
    c.admit(1, &prompt).unwrap();
    let mut steps = 0;
    while c.num_computed(1) != Some(2000) {
        let cmd = c.step().unwrap();
        if let Some(id) = cmd.transfer_id {
            c.report(0, &[id], &[id]).unwrap();
        }
        steps += 1;
        assert!(steps < 20);
    }
    // 2000 tokens: 7 full pages of 256 tokens, durable.
    assert_eq!(c.ready_prefix_pages(1), Some(7));
    let held_before = c.gpu_pool().num_held();
    let mut longer = prompt.clone();
    longer.extend(5000..5100);
    c.admit(2, &longer).unwrap();
    let cmd = c.step().unwrap();
    let s = cmd.scheduled.iter().find(|s| s.id == 2).unwrap();
    // The hit covers the 7 full pages: 1792 tokens are not recomputed.
    assert_eq!(s.first_token, 7 * 256);
    c.check_invariants().unwrap();
    // Request 2 pinned request 1's indexer and C128A blocks of the 7 pages, and only the
    // window blocks of the sliding-window groups: its own new blocks are the page it computes
    // and the windows' new columns, far fewer than a recomputed prefix would take.
    let swa = c.layout().regular_groups().start;
    let mut t = vec![0; c.layout().table_width(swa) as usize];
    c.block_table_row(2, swa, &mut t).unwrap();
    let held: Vec<usize> = (0..t.len()).filter(|&i| t[i] > 0).collect();
    // Resume at token 1792: the window (128 tokens) starts in column 26 (pinned: 26, 27); the
    // step computes tokens 1792..2100 (columns 28..=32), then slides to the window of token
    // 2100 (column 30 on).
    assert_eq!(held, [30, 31, 32]);
    let mut t1 = vec![0; c.layout().table_width(swa) as usize];
    c.block_table_row(1, swa, &mut t1).unwrap();
    let mut idx = vec![0; c.max_pages() as usize];
    let mut idx1 = vec![0; c.max_pages() as usize];
    c.block_table_row(2, 1, &mut idx).unwrap();
    c.block_table_row(1, 1, &mut idx1).unwrap();
    assert_eq!(
        idx[..7],
        idx1[..7],
        "indexer blocks of the prefix are shared"
    );
    assert!(c.gpu_pool().num_held() > held_before);
    c.finish(1).unwrap();
    c.finish(2).unwrap();
    c.check_invariants().unwrap();
    // Frees wait for the copies in flight.
    let id = cmd.transfer_id.unwrap();
    c.report(0, &[id], &[id]).unwrap();
    assert_eq!(c.gpu_pool().num_held(), 0);
}

/// Speculative decoding: a step computes the sampled token and its drafts together; the
/// rejected drafts are rolled back, pages they filled become dirty again and lose their
/// prefix hashes, and the window groups still hold what the next step reads.
/// Speculative decoding with two drafts (`max_query_len` 3) and a sliding-window group of
/// its own block size.
fn speculative_coord() -> Coordinator {
    // 64 host blocks: 128 B of pool (2 layers x 4 tokens x 16 B) and 128 B of indexer host
    // cache each.
    let mut cfg = HiSparseConfig::new(4, 64 * 256);
    cfg.device_buffer_size = Some(12);
    cfg.max_query_len = 3;
    let mut layers = [
        LAYERS[0],
        LAYERS[1],
        LayerSpec::Regular(crate::model::RegularLayer::windowed(16, 4)),
    ];
    if let LayerSpec::Regular(r) = &mut layers[2] {
        r.block_tokens = Some(2);
    }
    let model = ModelSpec {
        layers: &layers,
        ..MODEL
    };
    let mut input = LayoutInput::new(&model, &cfg, 0, 48);
    input.num_gpu_blocks_override = Some(200);
    let kv = plan_layout(&input).unwrap();
    Coordinator::new(
        kv,
        CoordinatorConfig {
            max_running: 4,
            max_batched_tokens: 64,
            ..CoordinatorConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn rollback_of_rejected_drafts() {
    let mut c = speculative_coord();
    c.admit(1, &toks(6)).unwrap();
    let cmd = c.step().unwrap();
    c.report(0, &[1], &[cmd.transfer_id.unwrap()]).unwrap();
    assert_eq!(c.num_computed(1), Some(6));
    // Sampled token 6 plus drafts 7 and 8: one step of three tokens, filling page 1.
    c.append_tokens(1, &[60, 70, 80]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled[0].num_tokens, 3);
    assert_eq!(c.page_state(1, 1), Some(PageState::Pending));
    // Too far: at most max_query_len - 1 = 2 computed tokens, never the step's first.
    assert!(matches!(
        c.rollback(1, 3),
        Err(CoordError::RollbackTooFar { allowed: 2, .. })
    ));
    // Both drafts rejected: page 1 holds 3 tokens again and is dirty.
    c.rollback(1, 2).unwrap();
    assert_eq!((c.num_tokens(1), c.num_computed(1)), (Some(7), Some(7)));
    assert_eq!(c.page_state(1, 1), Some(PageState::Dirty));
    c.check_invariants().unwrap();
    // The stale copy completes: the page stays dirty.
    c.report(0, &[2], &[2]).unwrap();
    assert_eq!(c.page_state(1, 1), Some(PageState::Dirty));
    c.append_tokens(1, &[71, 81, 91]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(
        (cmd.scheduled[0].first_token, cmd.scheduled[0].num_tokens),
        (7, 3)
    );
    // Token 7 refills page 1; its row is mirrored again under the new transfer.
    assert_eq!(c.page_state(1, 1), Some(PageState::Pending));
    assert!(cmd.row_mirrors.iter().any(|m| m.span.first_row == 3));
    c.check_invariants().unwrap();
    c.report(0, &[3], &[3]).unwrap();
    assert_eq!(c.page_state(1, 1), Some(PageState::Clean));
    // Appended but uncomputed tokens roll back freely.
    c.append_tokens(1, &[1, 2]).unwrap();
    c.rollback(1, 2).unwrap();
    assert_eq!(c.num_tokens(1), Some(10));
    c.finish(1).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.gpu_pool().num_held(), 0);
}

/// A rollback between scheduling a step and building its command would leave the command
/// computing the tokens given back (and the next step overlapping them): refused, with nothing
/// changed, for a request the open step scheduled; other requests, tokens not computed yet, and
/// the same rollback once the command is built, go through.
#[test]
fn a_rollback_inside_an_open_step_is_refused() {
    let mut c = speculative_coord();
    c.admit(1, &toks(6)).unwrap();
    c.admit(2, &toks(5)).unwrap();
    let cmd = c.step().unwrap();
    c.report(0, &[1], &[cmd.transfer_id.unwrap()]).unwrap();
    c.append_tokens(1, &[60, 70, 80]).unwrap();
    c.append_tokens(2, &[61, 71, 81]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 2);
    // The engine's own scheduler: request 1's next tokens, not request 2's.
    c.append_tokens(1, &[90, 91, 92]).unwrap();
    assert_eq!(c.schedule(1, 3), Ok(Alloc::Scheduled));
    let open = cmd.step + 1;
    let before = format!("{c:?}");
    assert_eq!(
        c.rollback(1, 2),
        Err(CoordError::RollbackInOpenStep { id: 1, step: open })
    );
    assert_eq!(
        format!("{c:?}"),
        before,
        "a refused rollback changed something"
    );
    assert!(
        CoordError::RollbackInOpenStep { id: 1, step: open }
            .to_string()
            .contains("build_offload_command")
    );
    // Request 2 is not in the open step: its rejected drafts go back.
    c.rollback(2, 2).unwrap();
    assert_eq!(c.num_computed(2), Some(6));
    let cmd = c.build_offload_command();
    assert_eq!(cmd.step, open);
    let s = cmd.scheduled.iter().find(|s| s.id == 1).unwrap();
    assert_eq!((s.first_token, s.num_tokens), (9, 3));
    // The command is built: the rollback is the ordinary one, after its forward pass.
    c.rollback(1, 2).unwrap();
    assert_eq!(c.num_computed(1), Some(10));
    c.check_invariants().unwrap();
}

#[test]
fn typed_errors() {
    let mut c = coord(40, true, 1);
    assert_eq!(c.admit(1, &[]), Err(CoordError::EmptyPrompt { id: 1 }));
    assert_eq!(
        c.admit(1, &toks(49)),
        Err(CoordError::TooLong {
            id: 1,
            tokens: 49,
            max_model_len: 48
        })
    );
    c.admit(1, &toks(4)).unwrap();
    assert_eq!(
        c.admit(1, &toks(4)),
        Err(CoordError::DuplicateRequest { id: 1 })
    );
    assert_eq!(c.schedule(1, 1), Err(CoordError::NotRunning { id: 1 }));
    assert_eq!(c.finish(9), Err(CoordError::UnknownRequest { id: 9 }));
    c.step().unwrap();
    assert_eq!(
        c.schedule(1, 1),
        Err(CoordError::NotEnoughTokens {
            id: 1,
            requested: 1,
            available: 0
        })
    );
    // The layout guarantees one max_model_len request fits; a hand-edited one that does not is
    // refused up front (a request could otherwise never finish).
    let mut kv = c.layout().clone();
    kv.num_gpu_blocks = 10;
    assert!(matches!(
        Coordinator::new(kv, CoordinatorConfig::default()),
        Err(CoordError::InvalidLayout(
            crate::layout::LayoutError::GpuPoolTooSmall {
                blocks: 10,
                needed: 17,
                ..
            }
        ))
    ));
    assert!(matches!(
        Coordinator::new(
            c.layout().clone(),
            CoordinatorConfig {
                num_workers: 0,
                ..CoordinatorConfig::default()
            }
        ),
        Err(CoordError::ZeroConfig {
            field: "num_workers"
        })
    ));
    assert!(std::format!("{}", CoordError::NoFreeSlot).contains("max_running"));
    let mut kv = c.layout().clone();
    kv.num_buckets = 3;
    assert!(matches!(
        Coordinator::new(kv, CoordinatorConfig::default()),
        Err(CoordError::InvalidLayout(_))
    ));
    let mut kv = c.layout().clone();
    kv.block_tokens = 0;
    assert!(Coordinator::new(kv, CoordinatorConfig::default()).is_err());
    assert_eq!(
        c.append_token_by_slot(3, 1),
        Err(CoordError::UnknownSlot { slot: 3 })
    );
    let mut row = [0i32; 4];
    assert!(c.hot_row(1, u32::MAX, &mut row).is_ok());
    assert_eq!(row, [-1; 4]);
}

/// Caller-given sizes never abort: bounds are typed errors, and bookkeeping grows with what is
/// used (a `max_running` of `i32::MAX` allocates nothing up front).
#[test]
fn huge_settings_are_typed_errors_not_aborts() {
    let kv = coord(40, true, 1).layout().clone();
    let with = |cfg: CoordinatorConfig| Coordinator::new(kv.clone(), cfg);
    let base = CoordinatorConfig::default();
    assert_eq!(
        with(CoordinatorConfig {
            max_running: u32::MAX,
            ..base
        })
        .err(),
        Some(CoordError::ConfigTooLarge {
            field: "max_running",
            value: u64::from(u32::MAX),
            max: i32::MAX as u64
        })
    );
    assert_eq!(
        with(CoordinatorConfig {
            num_workers: u32::MAX,
            ..base
        })
        .err(),
        Some(CoordError::ConfigTooLarge {
            field: "num_workers",
            value: u64::from(u32::MAX),
            max: u64::from(MAX_WORKERS)
        })
    );
    let e = with(CoordinatorConfig {
        num_workers: u32::MAX,
        ..base
    })
    .unwrap_err();
    assert!(std::format!("{e}").contains("`num_workers`"), "{e}");
    let mut c = with(CoordinatorConfig {
        max_running: i32::MAX as u32,
        num_workers: MAX_WORKERS,
        ..base
    })
    .unwrap();
    for id in 0..3 {
        c.admit(id, &toks(9)).unwrap();
    }
    let cmd = c.step().unwrap();
    assert_eq!(cmd.started, [0, 1, 2]);
    for w in 0..MAX_WORKERS {
        c.report(w, &[1], &[1]).unwrap();
    }
    assert_eq!(c.durable_transfer(), 1);
    c.finish(1).unwrap();
    c.check_invariants().unwrap();
    // Rows are reused last-in first-out before a fresh one is issued.
    c.admit(7, &toks(3)).unwrap();
    c.admit(8, &toks(3)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.started, [1, 3]);
    c.check_invariants().unwrap();
}

/// A layout for requests of up to `u32::MAX` tokens starts a short request with tables sized
/// for its prompt, not for `max_model_len` (a million pages here).
#[test]
fn max_model_len_of_u32_max_starts_small_requests() {
    // Ratio-64 rows keep the host rows of a u32::MAX-token request within i32.
    const WIDE: [LayerSpec; 1] = [LayerSpec::Sparse(crate::model::SparseLayer {
        row_bytes: 16,
        value_bytes: 16,
        compress_ratio: 64,
        indexer_row_bytes: Some(16),
        indexer_value_bytes: None,
        page_alignment: 1,
    })];
    let model = ModelSpec {
        name: "wide-blocks",
        block_tokens: 4096,
        top_k: 4,
        layers: &WIDE,
    };
    // About 1.1 M host blocks of 1 KiB of pool and 1 KiB of indexer host cache each.
    let cfg = HiSparseConfig::new(4, (1 << 20) * 1100 * 2);
    let mut input = LayoutInput::new(&model, &cfg, 0, u32::MAX);
    input.num_gpu_blocks_override = Some(1_048_600);
    let kv = plan_layout(&input).unwrap();
    assert_eq!(kv.max_pages_per_request, 1 << 20);
    let mut c = Coordinator::new(kv, CoordinatorConfig::default()).unwrap();
    c.admit(1, &toks(100)).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled[0].num_tokens, 100);
    c.check_invariants().unwrap();
}

/// Failed calls leave the coordinator consistent: every error is raised before anything
/// changes.
#[test]
fn errors_leave_no_trace() {
    let mut c = coord(40, true, 1);
    c.admit(1, &toks(10)).unwrap();
    c.step().unwrap();
    let before = std::format!("{:?}", c);
    assert!(c.admit(1, &toks(3)).is_err());
    assert!(c.admit(2, &[]).is_err());
    assert!(c.admit(3, &toks(49)).is_err());
    assert!(c.append_tokens(1, &toks(39)).is_err());
    assert!(c.append_tokens(9, &toks(1)).is_err());
    assert!(c.schedule(1, 1).is_err());
    assert!(c.start(1, 4).is_err());
    assert!(c.report(0, &[2], &[]).is_err());
    assert!(c.report(0, &[1], &[2]).is_err());
    assert!(c.report(5, &[1], &[1]).is_err());
    assert!(c.preempt(9).is_err());
    assert!(c.finish(9).is_err());
    assert!(c.append_token_by_slot(9, 1).is_err());
    assert_eq!(std::format!("{:?}", c), before);
    c.check_invariants().unwrap();
}

/// An imported request: host blocks named first, written by someone else, then the request
/// starts with its full pages read from host and its partial page restored to the GPU.
#[test]
fn imported_request_starts_with_its_pages_durable_on_host() {
    let mut c = coord(40, true, 1);
    // 10 tokens imported (pages 0, 1 full, page 2 with 2 rows) and one sampled token after.
    let mut t = toks(10);
    t.push(99);
    assert!(matches!(
        c.reserve_import(7, &t, 11),
        Err(CoordError::Import { id: 7, .. })
    ));
    let blocks = c.reserve_import(7, &t, 10).unwrap();
    assert_eq!(blocks.len(), 3);
    assert_eq!(c.import_blocks(7), Some(blocks.as_slice()));
    assert!(c.start(7, 8).is_err(), "its KV is still being written");
    // Not queued before the writes complete: a step starts nothing.
    let cmd = c.step().unwrap();
    assert!(cmd.scheduled.is_empty());
    c.check_invariants().unwrap();
    c.complete_import(7).unwrap();
    assert!(c.complete_import(7).is_err());
    assert_eq!(c.import_blocks(7), None);
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 1);
    let s = cmd.scheduled[0];
    assert_eq!((s.id, s.first_token, s.num_tokens), (7, 10, 1));
    assert!(!s.fully_resident);
    // The partial page comes back from its host block; the full ones are read from host.
    assert_eq!(cmd.restores.len(), 1);
    assert_eq!(cmd.restores[0].host_block, blocks[2]);
    assert_eq!(c.host_only_pages(7), Some(2));
    assert_eq!(c.ready_prefix_pages(7), Some(2));
    assert_eq!(cmd.hot_assign.len(), 1);
    let mut host = vec![0; c.max_pages() as usize];
    c.host_row(7, &mut host).unwrap();
    assert_eq!(
        &host[..3],
        &[blocks[0] as i32, blocks[1] as i32, blocks[2] as i32]
    );
    // Indexer blocks for the imported context (the engine fills them), one per page.
    assert_eq!(cmd.block_tables.iter().filter(|u| u.group == 1).count(), 3);
    assert_eq!(row(&c, 7)[..3], [0, 0, cmd.restores[0].device_block as i32]);
    c.check_invariants().unwrap();
    c.finish(7).unwrap();
    if let Some(id) = cmd.transfer_id {
        c.report(0, &[id], &[id]).unwrap();
    }
    c.check_invariants().unwrap();
    assert_eq!(c.gpu_pool().num_held(), 0);
    assert_eq!(c.host_pool().num_held(), 0);
    // An import aborted before its writes complete gives its host blocks back.
    c.reserve_import(8, &t, 10).unwrap();
    c.finish(8).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.host_pool().num_held(), 0);
}

/// An imported request whose hot region could never fit the GPU pool beside its pages (a short
/// prompt, a pool sized for its pages all on the GPU, as admission allows) restores every
/// imported page to the GPU instead of waiting forever for a hot region.
#[test]
fn imported_request_restores_its_pages_when_a_hot_region_never_fits() {
    // Hot buffer of 32 rows: a hot region costs 8 blocks; a 12-token request all on the GPU
    // costs 6 (3 pages of an indexer and a resident block). 9 usable blocks: enough for the
    // pages, never for 3 indexer blocks + the partial page + the hot region (12).
    // 64 host blocks: 128 B of pool (2 layers x 4 tokens x 16 B) and 128 B of indexer host
    // cache each.
    let mut cfg = HiSparseConfig::new(4, 64 * 256);
    cfg.device_buffer_size = Some(32);
    let mut input = LayoutInput::new(&MODEL, &cfg, 0, 12);
    input.num_gpu_blocks_override = Some(10);
    let kv = plan_layout(&input).unwrap();
    assert_eq!((kv.num_buckets, kv.hot_blocks_per_request), (1, 8));
    let mut c = Coordinator::new(
        kv,
        CoordinatorConfig {
            max_running: 4,
            max_batched_tokens: 64,
            max_spill_pages_per_step: 2,
            num_workers: 1,
            enable_prefix_caching: true,
            reclaim_min_blocks: 0,
        },
    )
    .unwrap();
    let mut t = toks(10);
    t.push(99);
    let blocks = c.reserve_import(7, &t, 10).unwrap();
    c.complete_import(7).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 1, "the imported request never started");
    let s = cmd.scheduled[0];
    assert_eq!((s.id, s.first_token, s.num_tokens), (7, 10, 1));
    assert!(s.fully_resident);
    assert!(cmd.hot_assign.is_empty());
    // Every page comes back from its host block, in page order; nothing is read from host.
    let restored: Vec<u32> = cmd.restores.iter().map(|r| r.host_block).collect();
    assert_eq!(restored, blocks);
    assert_eq!(c.host_only_pages(7), Some(0));
    assert_eq!(c.ready_prefix_pages(7), Some(2));
    assert_eq!(c.page_state(7, 0), Some(PageState::Clean));
    assert_eq!(c.page_state(7, 1), Some(PageState::Clean));
    assert_eq!(c.page_state(7, 2), Some(PageState::Dirty));
    let devs: Vec<i32> = cmd.restores.iter().map(|r| r.device_block as i32).collect();
    assert_eq!(row(&c, 7)[..3], devs[..]);
    c.check_invariants().unwrap();
    // It decodes to the end of its context and gives everything back.
    let mut last = cmd.transfer_id;
    c.append_tokens(7, &[5]).unwrap();
    let cmd = c.step().unwrap();
    assert_eq!(cmd.scheduled.len(), 1);
    assert!(cmd.scheduled[0].fully_resident);
    last = cmd.transfer_id.or(last);
    c.check_invariants().unwrap();
    c.finish(7).unwrap();
    if let Some(id) = last {
        let ids: Vec<u64> = (1..=id).collect();
        c.report(0, &ids, &ids).unwrap();
    }
    c.check_invariants().unwrap();
    assert_eq!(c.gpu_pool().num_held(), 0);
    assert_eq!(c.host_pool().num_held(), 0);
}

/// Admission refuses exactly the prompts the layout's capacity table says cannot be prefilled
/// (one rule: `KvCacheConfig::prefill_gpu_blocks`): on a DeepSeek V3.2 layout whose host pool
/// holds 128K but whose GPU pool holds only its HiSparse decode, and on a DeepSeek V4 layout
/// (regular and sliding-window groups).
#[test]
fn admission_refuses_the_prompts_the_layout_says_never_prefill() {
    use crate::presets::{DEEPSEEK_V4, DEEPSEEK_V32};
    for (model, len, blocks) in [(DEEPSEEK_V32, 131072, 7869), (DEEPSEEK_V4, 65536, 1500)] {
        let cfg = HiSparseConfig::new(model.top_k, 512 << 30);
        let mut input = LayoutInput::new(&model, &cfg, 0, len);
        input.num_gpu_blocks_override = Some(blocks);
        let kv = plan_layout(&input).unwrap();
        assert!(!kv.prefill_fits(len) && kv.capacity(len).host_max >= 1);
        let longest = kv.max_prefill_context();
        assert!(longest > 0 && longest < len);
        let mut c = Coordinator::new(kv, CoordinatorConfig::default()).unwrap();
        let mut id = 0;
        for tokens in [1, longest / 2, longest, longest + 1, len] {
            id += 1;
            let fits = c.layout().prefill_fits(tokens);
            assert_eq!(fits, tokens <= longest);
            match c.admit(id, &toks(tokens)) {
                Ok(()) => {
                    assert!(fits, "{} admitted {tokens} tokens", model.name);
                    c.finish(id).unwrap();
                }
                Err(CoordError::PrefillNeverFits {
                    needed, capacity, ..
                }) => {
                    assert!(!fits, "{} refused {tokens} tokens", model.name);
                    assert_eq!(needed, c.layout().prefill_gpu_blocks(tokens));
                    assert_eq!(capacity, u64::from(blocks) - 1);
                }
                Err(e) => panic!("{}: {tokens} tokens: {e}", model.name),
            }
        }
    }
}

/// `check_drained` says what keeps a coordinator from being empty — a request not finished, a
/// transfer no worker completed — and accepts one whose only blocks left are free ones the
/// prefix cache keeps.
#[test]
fn check_drained_names_what_is_left() {
    let mut c = coord(40, true, 1);
    c.check_drained().unwrap();
    c.admit(1, &toks(12)).unwrap();
    let what = |c: &Coordinator| c.check_drained().unwrap_err().what;
    assert_eq!(what(&c), "request not finished");
    let cmd = c.step().unwrap();
    c.finish(1).unwrap();
    assert_eq!(
        what(&c),
        "transfer issued but not completed by every worker"
    );
    let id = cmd.transfer_id.unwrap();
    c.report(0, &[id], &[id]).unwrap();
    c.check_drained().unwrap();
    let free = c.free();
    assert!(free.gpu_cached > 0 && free.host_cached > 0, "{free:?}");
    assert_eq!(
        (free.gpu_blocks, free.host_blocks),
        (free.gpu_capacity, free.host_capacity)
    );
}
