//! The decode side's loop over the imports and the decode: each turn it takes what arrived
//! (verified, then handed to the coordinator), answers the prefill side (host blocks for a
//! prefilled request), and runs a decode step when there is a request to decode. It never
//! waits on a notification.

use std::time::{Duration, Instant};

use hisparse_core::coordinator::{CoordError, Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_nixl::{Arrival, DecodeSide};
use hisparse_runtime::AnyDevice;

use super::super::engine::SimSetup;
use super::super::rank::{DecodeRow, Rank, RankStep};
use super::decode::PrefillProcess;
use super::protocol::{FromPrefill, SILENCE, ToPrefill, nixl_err, prompt};
use super::report::PdReport;
use super::{ImportVerifier, PageManifest};
use crate::error::{CliError, CliResult};

fn coord_err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(e.to_string())
}

/// The decode host pool as the import verifier reads it: a second mapping of its segment.
pub(super) struct HostView<'a> {
    /// A CPU device over host memory.
    pub(super) dev: &'a AnyDevice,
    /// The pool, mapped.
    pub(super) pool: &'a <AnyDevice as hisparse_core::Device>::HostBuffer,
}

/// The decode coordinator and where each request is on its way.
pub(super) struct Imports {
    coord: Coordinator,
    verifier: ImportVerifier,
    /// Prefilled requests the host pool had no room for yet: (request, tokens).
    waiting: Vec<(u64, u32)>,
    /// Requests whose write the prefill side reported complete.
    sent: u32,
    imported: u32,
    finished: u32,
    /// Imported requests not finished yet.
    live: u32,
    cmd: OffloadCommand,
    idle_steps: u32,
}

impl Imports {
    pub(super) fn new(s: &SimSetup) -> CliResult<Self> {
        let coord = Coordinator::new(
            s.kv.clone(),
            CoordinatorConfig {
                max_running: s.requests,
                max_batched_tokens: s.max_batched_tokens,
                max_spill_pages_per_step: 64,
                num_workers: 1,
                ..CoordinatorConfig::default()
            },
        )
        .map_err(coord_err)?;
        Ok(Imports {
            coord,
            verifier: ImportVerifier::new(&s.kv)?,
            waiting: Vec::new(),
            sent: 0,
            imported: 0,
            finished: 0,
            live: 0,
            cmd: OffloadCommand::default(),
            idle_steps: 0,
        })
    }

    /// The import verifier's totals.
    pub(super) fn verified(&self) -> &super::super::verify::Verified {
        &self.verifier.verified
    }

    /// Whether every request finished.
    pub(super) fn all_finished(&self, s: &SimSetup) -> bool {
        self.finished == s.requests
    }

    /// Turns until every request finished; fails when nothing moved for [`SILENCE`].
    pub(super) fn run(
        &mut self,
        s: &SimSetup,
        prefill: &mut PrefillProcess,
        decode: &mut DecodeSide,
        rank: &mut Rank<AnyDevice>,
        view: &HostView<'_>,
        report: &mut PdReport,
    ) -> CliResult<()> {
        let mut last_news = Instant::now();
        while self.finished < s.requests {
            let mut news = self.arrivals(decode, view)?;
            news |= self.prefill_news(prefill, report)?;
            news |= self.assign_blocks(decode, prefill)?;
            if self.live > 0 {
                news = true;
                self.decode_turn(s, rank, report)?;
            }
            if news {
                last_news = Instant::now();
            } else if last_news.elapsed() > SILENCE {
                return Err(CliError::failed(format!(
                    "nothing moved for {} s: {} of {} requests written, {} imported, {} \
                     outstanding",
                    SILENCE.as_secs(),
                    self.sent,
                    s.requests,
                    self.imported,
                    decode.outstanding()
                )));
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// The imports whose notification arrived: in the blocks reserved for them, every row
    /// verified, then handed to the coordinator.
    fn arrivals(&mut self, decode: &mut DecodeSide, view: &HostView<'_>) -> CliResult<bool> {
        let mut news = false;
        for a in decode.poll().map_err(nixl_err)? {
            news = true;
            let Arrival::Import(m) = a else {
                return Err(CliError::failed("a bulk notification during the imports"));
            };
            if self.coord.import_blocks(m.request) != Some(&m.host_blocks[..]) {
                return Err(CliError::failed(format!(
                    "request {} arrived in blocks the coordinator did not reserve for it",
                    m.request
                )));
            }
            self.verifier.check(view.dev, view.pool, &m)?;
            self.coord.complete_import(m.request).map_err(coord_err)?;
            self.imported += 1;
            self.live += 1;
        }
        Ok(news)
    }

    /// What the prefill side said, if anything: a request prefilled, or a write completed.
    fn prefill_news(
        &mut self,
        prefill: &mut PrefillProcess,
        report: &mut PdReport,
    ) -> CliResult<bool> {
        let Some(msg) = prefill.try_recv()? else {
            return Ok(false);
        };
        match msg {
            FromPrefill::Prefilled(request, tokens) => self.waiting.push((request, tokens)),
            other => self.write_done(other, report)?,
        }
        Ok(true)
    }

    /// A write the prefill side reported complete.
    fn write_done(&mut self, msg: FromPrefill, report: &mut PdReport) -> CliResult<()> {
        match msg {
            FromPrefill::Sent {
                bytes,
                seconds,
                descriptors,
                pack_seconds,
            } => {
                self.sent += 1;
                report.add_write(bytes, seconds, descriptors, pack_seconds);
                Ok(())
            }
            _ => Err(CliError::failed("the prefill side answered out of turn")),
        }
    }

    /// Host blocks for prefilled requests, as the host pool has room: each manifest issued to
    /// the decode side's ledger and sent to the prefill side.
    fn assign_blocks(
        &mut self,
        decode: &mut DecodeSide,
        prefill: &mut PrefillProcess,
    ) -> CliResult<bool> {
        let mut news = false;
        while let Some(&(request, tokens)) = self.waiting.first() {
            let mut all = prompt(request, tokens);
            all.push(tokens); // the first sampled token: computed here, after the import
            match self.coord.reserve_import(request, &all, tokens) {
                Ok(host_blocks) => {
                    self.waiting.remove(0);
                    let manifest = PageManifest {
                        request,
                        tokens,
                        host_blocks,
                    };
                    decode.issue(manifest.clone()).map_err(nixl_err)?;
                    prefill.send(&ToPrefill::Manifest(manifest))?;
                    news = true;
                }
                Err(CoordError::Import { .. }) if self.live > 0 => break, // room comes back
                Err(e) => return Err(coord_err(e)),
            }
        }
        Ok(news)
    }

    /// One decode step, then every request whose tokens are computed gets its next token or
    /// finishes.
    fn decode_turn(
        &mut self,
        s: &SimSetup,
        rank: &mut Rank<AnyDevice>,
        report: &mut PdReport,
    ) -> CliResult<()> {
        let (scheduled, rows) = self.decode_step(s, rank)?;
        self.idle_steps = if scheduled { 0 } else { self.idle_steps + 1 };
        if self.idle_steps > 1000 {
            return Err(CliError::failed(
                "the decode side stalled: 1000 steps scheduled nothing; give it more --gpu-mem",
            ));
        }
        report.decode_tokens += u64::from(rows);
        let final_len = s.context + s.decode_steps;
        let running: Vec<_> = self.coord.running_ids().collect();
        for id in running {
            let (n, c) = (
                self.coord.num_tokens(id).unwrap_or(0),
                self.coord.num_computed(id).unwrap_or(0),
            );
            if n != c {
                continue;
            }
            if n >= final_len {
                self.coord.finish(id).map_err(coord_err)?;
                self.finished += 1;
                self.live -= 1;
            } else {
                self.coord.append_tokens(id, &[n]).map_err(coord_err)?;
            }
        }
        Ok(())
    }

    /// Plan, execute on the rank (the forward pass's writes, every decode row's reads through
    /// the runtime, verified), report the copies. Returns whether anything was scheduled and
    /// how many decode rows read.
    fn decode_step(&mut self, s: &SimSetup, rank: &mut Rank<AnyDevice>) -> CliResult<(bool, u32)> {
        let ratio = s.kv.sparse_compress_ratio.max(1);
        let cmd = &mut self.cmd;
        self.coord.schedule_step().map_err(coord_err)?;
        self.coord.build_offload_command_into(cmd);
        let decode: Vec<DecodeRow> = cmd
            .scheduled
            .iter()
            .filter(|sr| sr.first_token >= s.context && sr.num_tokens == 1)
            .map(|sr| DecodeRow {
                slot: sr.slot,
                uid: sr.id,
                seq_len: (sr.first_token + 1) / ratio,
                rejected: (0, 0),
            })
            .collect();
        rank.begin(cmd)?;
        let st = rank.finish(cmd, &decode)?;
        self.coord
            .report(0, &st.report.enqueued, &st.report.completed)
            .map_err(coord_err)?;
        Ok((!cmd.scheduled.is_empty(), decode.len() as u32))
    }

    /// After the loop: a write's completion may reach this side after its notification did.
    pub(super) fn await_writes(
        &mut self,
        s: &SimSetup,
        prefill: &mut PrefillProcess,
        report: &mut PdReport,
    ) -> CliResult<()> {
        while self.sent < s.requests {
            let msg = prefill.recv_within(SILENCE)?;
            self.write_done(msg, report)?;
        }
        Ok(())
    }

    /// The rank drained (`drained`): its last report, then every block must be back in its
    /// pool.
    pub(super) fn drain(&mut self, drained: &RankStep) -> CliResult<()> {
        let coord = &mut self.coord;
        coord
            .report(0, &drained.report.enqueued, &drained.report.completed)
            .map_err(coord_err)?;
        coord
            .check_invariants()
            .map_err(|v| CliError::failed(format!("coordinator invariant violated: {v}")))?;
        if coord.gpu_pool().num_held() != 0 || coord.host_pool().num_held() != 0 {
            return Err(CliError::failed(format!(
                "the decode side leaked blocks: {} GPU and {} host blocks still held after every \
                 request finished",
                coord.gpu_pool().num_held(),
                coord.host_pool().num_held()
            )));
        }
        Ok(())
    }
}
