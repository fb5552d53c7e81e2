//! What a simulation reports: totals, per-step series, text and JSON.

use serde::Serialize;

use crate::size::human;

/// Per step of the run that decoded something (requests whose prompt is done, beside others'
/// prefill chunks).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepStats {
    /// Hot hits / (hits + misses) this step; `None` when nothing was read from host (every read
    /// row was resident).
    pub hit_rate: Option<f64>,
    /// Bytes copied host → device this step (swap-in gathers and restores, all layers).
    pub h2d_bytes: u64,
    /// Top-k entries served from the hot buffer.
    pub hot_hits: u64,
    /// Top-k entries swapped in.
    pub misses: u64,
    /// Whether the step took the fully-resident (remap) path.
    pub fully_resident: bool,
    /// Planning time (coordinator) in µs.
    pub planning_us: f64,
    /// Device-operation time in µs.
    pub device_us: f64,
    /// The decode step each request decoding in this step is at (1 = its first after the
    /// prompt), one entry per request: what the plot's x axis counts.
    #[serde(skip)]
    pub decode_steps: Vec<u32>,
}

/// One rank of a `--tp` run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RankReport {
    /// Rows this rank verified byte for byte.
    pub verified_rows: u64,
    /// Rows that did not match on this rank.
    pub mismatched_rows: u64,
    /// Mean device-operation time per decode step on this rank, µs.
    pub device_us_per_step: f64,
    /// Bytes this rank copied device → host (only the writer of a shared host pool copies).
    pub d2h_bytes: u64,
}

/// The whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimReport {
    /// Backend name.
    pub backend: String,
    /// Device name.
    pub device: String,
    /// Model preset.
    pub preset: String,
    /// Sparse layers simulated.
    pub sparse_layers: u32,
    /// Index groups (resolve calls per step).
    pub index_groups: u32,
    /// Concurrent requests.
    pub requests: u32,
    /// Prompt tokens per request.
    pub context: u32,
    /// Decode steps.
    pub decode_steps: u32,
    /// Workload seed.
    pub seed: u64,
    /// Workers reporting copy batches.
    pub workers: u32,
    /// Tensor-parallel ranks (worker processes; 1 = this process).
    pub tp: u32,
    /// Whether the ranks shared one host pool.
    pub shared_host_pool: bool,
    /// Target adjacent-step top-k overlap.
    pub overlap_target: f64,
    /// Measured adjacent-step top-k overlap (mean over index groups, requests, steps).
    pub overlap_measured: f64,
    /// GPU pool bytes used by the simulation.
    pub gpu_pool_bytes: u64,
    /// GPU bytes an all-resident cache would need for the same requests at their final length.
    pub all_resident_gpu_bytes: u64,
    /// Pinned host pool bytes (one pool).
    pub host_pool_bytes: u64,
    /// Pinned bytes of one rank's indexer host cache (every rank pins its own).
    pub indexer_host_cache_bytes: u64,
    /// Pinned host memory of the node: one pool, or one per rank without a shared pool, and
    /// every rank's indexer host cache.
    pub host_memory_bytes: u64,
    /// Hot rows per request per hot group.
    pub device_buffer_size: u32,
    /// Overall hot hit rate over decode steps: hits / (hits + misses).
    pub hit_rate: f64,
    /// Mean host → device bytes per decode step.
    pub h2d_bytes_per_step: f64,
    /// Hot regions given to requests over the run (a request reading some page from host, or
    /// liable to, gets one).
    pub hot_regions_allocated: u64,
    /// Requests that arrived with their prompt's KV imported (`--import`).
    pub imported_requests: u64,
    /// Total host → device bytes (decode steps).
    pub h2d_bytes: u64,
    /// Total device → host bytes (mirrors and backups, whole run).
    pub d2h_bytes: u64,
    /// Resident pages reclaimed (GPU blocks returned while their host copy is durable).
    pub reclaimed_pages: u64,
    /// Pages written back by spill transfers.
    pub spilled_pages: u64,
    /// Row-mirror spans executed.
    pub mirror_spans: u64,
    /// Prompt tokens served from the host prefix cache instead of being computed.
    pub prefix_hit_tokens: u64,
    /// Host copy-on-write page copies executed.
    pub host_cow_pages: u64,
    /// Host → device page restores executed (per bucket: copy-on-write tails, imported tails,
    /// staged prefill context).
    pub restored_pages: u64,
    /// Pages the coordinator staged host → device for prefill chunks whose context lived only
    /// on host ([`hisparse_core::coordinator::Coordinator::pages_staged`]).
    pub pages_staged: u64,
    /// With `--prefix-on-host`: GPU blocks of the shared prefix's cached copies dropped before
    /// the requests hitting it arrived.
    pub gpu_copies_dropped: u64,
    /// Rows prefill chunks read (each chunk's last token's top-k over its whole earlier context,
    /// remapped through the resident tables), verified byte for byte; part of `verified_rows`.
    pub prefill_rows_checked: u64,
    /// Prefill rows that did not match (or read -1 for a row that exists); part of
    /// `mismatched_rows`.
    pub prefill_mismatched_rows: u64,
    /// Indexer rows backed up device → host (each in every indexer layer) into the indexer
    /// host cache, in the steps' transfer batches (0 for a model without an indexer).
    #[serde(default)]
    pub indexer_rows_backed_up: u64,
    /// Indexer pages restored host → device (imported requests, prefix hits whose indexer
    /// blocks were no longer cached).
    #[serde(default)]
    pub indexer_pages_restored: u64,
    /// Bytes copied into (device → host) and out of (host → device) the indexer host caches,
    /// summed over ranks (each keeps its own).
    #[serde(default)]
    pub indexer_d2h_bytes: u64,
    /// See `indexer_d2h_bytes`.
    #[serde(default)]
    pub indexer_h2d_bytes: u64,
    /// Indexer rows (one per layer per row) checked byte for byte: every backed-up row in the
    /// indexer host cache once its batch completed, and the keys of every context a request
    /// did not compute (a prefix hit, an import) on the GPU before its first forward.
    #[serde(default)]
    pub indexer_rows_verified: u64,
    /// Indexer rows that did not match.
    #[serde(default)]
    pub indexer_mismatched_rows: u64,
    /// GPU copy-on-write block copies executed.
    pub gpu_cow_blocks: u64,
    /// Steps where allocation had to wait for in-flight reclamation.
    pub waits: u64,
    /// Requests preempted.
    pub preemptions: u64,
    /// Speculative tokens per decode step (0 = none).
    pub spec_tokens: u32,
    /// Micro-batch calls per index group per decode step (1: one call over the batch).
    #[serde(default)]
    pub micro_batches: u32,
    /// Draft tokens computed.
    pub draft_tokens: u64,
    /// Drafts the (simulated) verifier accepted.
    pub accepted_tokens: u64,
    /// Rejected drafts rolled back ([`hisparse_core::coordinator::Coordinator::rollback`]).
    pub rolled_back_tokens: u64,
    /// Decode steps on the fully-resident (remap) path.
    pub fully_resident_steps: u32,
    /// Resolve calls.
    pub resolve_calls: u64,
    /// Remap calls.
    pub remap_calls: u64,
    /// Hot hits (decode).
    pub hot_hits: u64,
    /// Swap-in misses (decode).
    pub misses: u64,
    /// Entries read from resident pages (decode).
    pub resident_reads: u64,
    /// Mean coordinator time per decode step, µs.
    pub planning_us_per_step: f64,
    /// Mean device-operation time per decode step, µs: the runtime's before-forward work, the
    /// per-layer resolves and the after-forward copies up to a synchronisation of both streams
    /// (not the simulated forward pass's writes, not verification).
    pub device_us_per_step: f64,
    /// Mean time per decode step spent verifying reads (downloads and byte comparisons), µs.
    pub verify_us_per_step: f64,
    /// Rows verified byte for byte.
    pub verified_rows: u64,
    /// Rows that did not match.
    pub mismatched_rows: u64,
    /// The first mismatch, described.
    pub first_mismatch: Option<String>,
    /// Wall-clock seconds of the run.
    pub wall_seconds: f64,
    /// Per rank, with `--tp` (empty otherwise).
    pub ranks: Vec<RankReport>,
    /// Per decode step.
    pub steps: Vec<StepStats>,
}

impl SimReport {
    /// The report as text.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        s += &format!(
            "simulated {} on {} ({}): {} requests × {} tokens, {} decode steps, {} sparse layers in {} index groups, seed {}\n\n",
            self.preset,
            self.backend,
            self.device,
            self.requests,
            self.context,
            self.decode_steps,
            self.sparse_layers,
            self.index_groups,
            self.seed
        );
        s += &format!(
            "hot hit rate            {} ({} hits, {} misses; {} entries from resident pages)\n",
            pct(self.hit_rate),
            self.hot_hits,
            self.misses,
            self.resident_reads
        );
        s += &format!(
            "top-k overlap           {} measured between adjacent steps (target {})\n",
            pct(self.overlap_measured),
            pct(self.overlap_target)
        );
        s += &format!(
            "host→device per step    {} (total {}); device→host total {}\n",
            human(self.h2d_bytes_per_step as u64),
            human(self.h2d_bytes),
            human(self.d2h_bytes)
        );
        s += &format!(
            "pages reclaimed         {}   spilled {}   mirror spans {}   waits {}   preemptions {}\n",
            self.reclaimed_pages,
            self.spilled_pages,
            self.mirror_spans,
            self.waits,
            self.preemptions
        );
        s += &format!(
            "hot regions allocated   {}{}\n",
            self.hot_regions_allocated,
            if self.imported_requests > 0 {
                format!("   requests imported {}", self.imported_requests)
            } else {
                String::new()
            }
        );
        if self.prefix_hit_tokens + self.host_cow_pages + self.restored_pages + self.gpu_cow_blocks
            > 0
        {
            s += &format!(
                "prefix cache            {} prompt tokens reused; copy-on-write {} host pages, {} GPU blocks; {} pages restored\n",
                self.prefix_hit_tokens,
                self.host_cow_pages,
                self.gpu_cow_blocks,
                self.restored_pages
            );
        }
        if self.spec_tokens > 0 {
            s += &format!(
                "speculative decoding    {} drafts per step: {} drafted, {} accepted ({}), {} rejected and rolled back\n",
                self.spec_tokens,
                self.draft_tokens,
                self.accepted_tokens,
                pct(self.accepted_tokens as f64 / self.draft_tokens.max(1) as f64),
                self.rolled_back_tokens
            );
        }
        s += &format!(
            "paths                   {} resolve calls, {} remap calls ({} fully-resident steps){}\n",
            self.resolve_calls,
            self.remap_calls,
            self.fully_resident_steps,
            if self.micro_batches > 1 {
                format!(
                    "; each decode step's calls in up to {} micro-batches",
                    self.micro_batches
                )
            } else {
                String::new()
            }
        );
        s += &format!(
            "time per decode step    planning {:.1} µs, device ops {:.1} µs, verification {:.1} µs\n",
            self.planning_us_per_step, self.device_us_per_step, self.verify_us_per_step
        );
        s += &format!(
            "GPU memory              {} pool vs {} for an all-resident cache ({}); host pool {}\n",
            human(self.gpu_pool_bytes),
            human(self.all_resident_gpu_bytes),
            pct(self.gpu_pool_bytes as f64 / self.all_resident_gpu_bytes.max(1) as f64),
            human(self.host_pool_bytes)
        );
        if self.tp > 1 {
            s += &format!(
                "tensor parallel         {} ranks, {}; node host memory {}\n",
                self.tp,
                if self.shared_host_pool {
                    "one shared host pool"
                } else {
                    "one host pool per rank"
                },
                human(self.host_memory_bytes)
            );
            for (r, k) in self.ranks.iter().enumerate() {
                s += &format!(
                    "  rank {r}                {} rows verified, {} mismatched, device ops {:.1} µs/step, device→host {}\n",
                    k.verified_rows,
                    k.mismatched_rows,
                    k.device_us_per_step,
                    human(k.d2h_bytes)
                );
            }
        }
        s += &format!(
            "verification            {} rows verified byte for byte, {} mismatched ({} prefill rows, {} mismatched)\n",
            self.verified_rows,
            self.mismatched_rows,
            self.prefill_rows_checked,
            self.prefill_mismatched_rows
        );
        if self.indexer_rows_verified + self.indexer_rows_backed_up > 0 {
            s += &format!(
                "indexer keys            {} tokens' rows backed up in every indexer layer ({}), {} pages restored ({}); {} layer rows verified byte for byte, {} mismatched\n",
                self.indexer_rows_backed_up,
                human(self.indexer_d2h_bytes),
                self.indexer_pages_restored,
                human(self.indexer_h2d_bytes),
                self.indexer_rows_verified,
                self.indexer_mismatched_rows
            );
        }
        if self.pages_staged > 0 {
            s += &format!(
                "prefill staging         {} pages restored host → device for prefill chunks{}\n",
                self.pages_staged,
                if self.gpu_copies_dropped > 0 {
                    format!(
                        " ({} GPU blocks of the shared prefix dropped first)",
                        self.gpu_copies_dropped
                    )
                } else {
                    String::new()
                }
            );
        }
        if let Some(m) = &self.first_mismatch {
            s += &format!("first mismatch          {m}\n");
        }
        s += &format!("wall time               {:.2} s\n", self.wall_seconds);
        s
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}
