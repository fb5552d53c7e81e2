//! The run's totals, from the ranks' last answers once every transfer drained.

use hisparse_core::coordinator::Coordinator;

use crate::sim::rank::RankStep;
use crate::sim::report::{RankReport, SimReport};

/// What the loop measured besides the ranks' counters.
pub(super) struct Measured {
    /// Per rank, device seconds of the steps that decoded.
    pub(super) rank_device_seconds: Vec<f64>,
    /// Seconds spent verifying, all ranks.
    pub(super) verify_seconds: f64,
    /// Adjacent-step top-k overlap: sum and count.
    pub(super) overlap: (f64, u64),
}

/// Fills `report`'s totals from the drained ranks' answers (`drained`, rank 0's counters
/// standing for the read path every rank takes alike) and what the loop measured.
pub(super) fn fill(
    report: &mut SimReport,
    drained: &[RankStep],
    coord: &Coordinator,
    measured: &Measured,
) {
    let nranks = drained.len();
    let decode = report.steps.len().max(1) as f64;
    let c = drained[0].counters;
    report.hot_hits = c.hot_hits;
    report.misses = c.hot_misses;
    report.resident_reads = c.resident_reads;
    report.hit_rate = c.hit_rate().unwrap_or(0.0);
    report.h2d_bytes = report.steps.iter().map(|s| s.h2d_bytes).sum();
    report.h2d_bytes_per_step = report.h2d_bytes as f64 / decode;
    report.d2h_bytes = drained.iter().map(|s| s.counters.d2h_bytes).sum();
    report.resolve_calls = c.resolve_calls;
    report.remap_calls = c.remap_calls;
    report.reclaimed_pages = c.reclaimed_pages;
    report.spilled_pages = c.spilled_pages;
    report.mirror_spans = c.mirror_spans;
    report.host_cow_pages = c.host_cow_pages;
    report.restored_pages = c.restored_pages;
    report.gpu_cow_blocks = c.gpu_cow_blocks;
    report.planning_us_per_step = report.steps.iter().map(|s| s.planning_us).sum::<f64>() / decode;
    report.device_us_per_step = report.steps.iter().map(|s| s.device_us).sum::<f64>() / decode;
    report.verify_us_per_step = measured.verify_seconds * 1e6 / decode;
    report.pages_staged = coord.pages_staged();
    report.prefill_rows_checked = drained.iter().map(|s| s.prefill_rows).sum();
    report.prefill_mismatched_rows = drained.iter().map(|s| s.prefill_mismatched).sum();
    report.verified_rows = drained.iter().map(|s| s.verified.rows).sum();
    report.mismatched_rows = drained.iter().map(|s| s.verified.mismatched).sum();
    report.indexer_rows_backed_up = drained
        .iter()
        .map(|s| s.counters.indexer_rows_backed_up)
        .sum();
    report.indexer_pages_restored = c.indexer_pages_restored;
    report.indexer_d2h_bytes = drained.iter().map(|s| s.counters.indexer_d2h_bytes).sum();
    report.indexer_h2d_bytes = drained.iter().map(|s| s.counters.indexer_h2d_bytes).sum();
    report.indexer_rows_verified = drained.iter().map(|s| s.indexer.rows).sum();
    report.indexer_mismatched_rows = drained.iter().map(|s| s.indexer.mismatched).sum();
    report.first_mismatch = drained.iter().enumerate().find_map(|(r, s)| {
        let first = s.verified.first_mismatch.as_ref();
        first.or(s.indexer.first_mismatch.as_ref()).map(|m| {
            if nranks > 1 {
                format!("rank {r}: {m}")
            } else {
                m.clone()
            }
        })
    });
    if nranks > 1 {
        report.ranks = drained
            .iter()
            .zip(&measured.rank_device_seconds)
            .map(|(s, &dev)| RankReport {
                verified_rows: s.verified.rows,
                mismatched_rows: s.verified.mismatched,
                device_us_per_step: dev * 1e6 / decode,
                d2h_bytes: s.counters.d2h_bytes,
            })
            .collect();
    }
    let (sum, n) = measured.overlap;
    report.overlap_measured = if n == 0 { 0.0 } else { sum / n as f64 };
}
