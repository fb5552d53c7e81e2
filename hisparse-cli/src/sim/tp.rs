//! `simulate --tp N`: N tensor-parallel ranks as worker processes, each with its own runtime
//! (on GPU `r` of a multi-GPU machine, all on one device otherwise), driven by the coordinator in
//! this process. With `--shared-host-pool` the node pins one host pool, a shared-memory segment
//! this process creates and every rank maps; rank 0 writes it (row mirrors, spills, host
//! copy-on-write), every rank reads it (swap-in gathers, restores). Without it each rank pins and
//! writes its own pool, as ranks do when nothing is shared.
//!
//! Each rank is a worker of the coordinator: a batch is durable when every rank has reported
//! it, the writer's report being the one that carries the copy. A step whose command has host
//! copy-on-write begins on rank 0 first, and the other ranks begin once rank 0's copies are done
//! (their restores read the copied pages). Every rank verifies every row it reads.
//!
//! The protocol is one JSON message per line over each worker's stdin and stdout
//! ([`super::worker`]): a [`Hello`], then [`ToRank`] messages answered by [`FromRank`] ones.

use std::io::{BufRead, Write};

use hisparse_core::Device;
use hisparse_core::coordinator::OffloadCommand;
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
use hisparse_runtime::AnyDevice;
use hisparse_runtime::{BackendKind, SharedHostPool, SharedSegment};
use serde::{Deserialize, Serialize};

use super::engine::{Ranks, SimSetup};
use super::rank::{DecodeRow, Rank, RankStep};
use super::worker::{Answer, WorkerProcess, recv, send, serve_worker};
use crate::error::{CliError, CliResult};

/// The hidden subcommand a worker process runs.
pub const RANK_SUBCOMMAND: &str = "simulate-rank";

/// What a worker is told first.
#[derive(Serialize, Deserialize)]
pub struct Hello {
    /// Its rank.
    pub rank: u32,
    /// The backend.
    pub backend: String,
    /// Device selector; `None` = device `rank` if it exists, else the first device.
    pub device: Option<String>,
    /// The shared host pool's segment name, or `None` for a pool of its own.
    pub shared_pool: Option<String>,
    /// Whether it writes the host pool.
    pub writes_host: bool,
    /// The simulation.
    pub setup: SimSetup,
}

/// A message to a worker.
#[derive(Serialize, Deserialize)]
pub enum ToRank {
    /// Run the before-forward part of this command.
    Begin(Box<OffloadCommand>),
    /// Run the rest of the begun command with these decode rows.
    Finish(Vec<DecodeRow>),
    /// Complete everything in flight, report, and exit.
    Drain,
}

/// A worker's answer.
#[derive(Serialize, Deserialize)]
pub enum FromRank {
    /// The device is open and the runtime built: backend and device names.
    Ready(String, String),
    /// `Begin` is done (its work completed).
    Begun,
    /// `Finish` or `Drain` is done.
    Step(Box<RankStep>),
    /// The worker failed; it exits.
    Failed(String),
}

impl Answer for FromRank {
    fn failure(&self) -> Option<&str> {
        match self {
            FromRank::Failed(m) => Some(m),
            _ => None,
        }
    }
}

/// The worker processes of a `--tp` run.
pub struct Processes {
    workers: Vec<WorkerProcess<FromRank>>,
    names: (String, String),
    /// The shared host pool: this process keeps the segment's name alive while the ranks run.
    _pool: Option<SharedSegment>,
}

impl Processes {
    /// Starts `s.tp` workers of this executable on backend `backend` (device `device`, or one
    /// per rank when empty) and waits until each has its runtime.
    pub fn start(backend: BackendKind, device: &str, s: &SimSetup) -> CliResult<Self> {
        let pool = if s.shared_host_pool {
            let name = SharedSegment::unique_name("hisparse-pool");
            Some(
                SharedSegment::create(&name, s.kv.host_pool_bytes() as usize)
                    .map_err(|e| CliError::failed(format!("creating the shared host pool: {e}")))?,
            )
        } else {
            None
        };
        let mut workers = Vec::with_capacity(s.tp as usize);
        for rank in 0..s.tp {
            let hello = Hello {
                rank,
                backend: backend.name().to_string(),
                device: (!device.trim().is_empty()).then(|| device.to_string()),
                shared_pool: pool.as_ref().map(|p| p.name().to_string()),
                writes_host: pool.is_none() || rank == 0,
                setup: s.clone(),
            };
            workers.push(WorkerProcess::start(
                RANK_SUBCOMMAND,
                format!("rank {rank}"),
                &[],
                &hello,
            )?);
        }
        let mut names = (String::new(), String::new());
        for (rank, w) in workers.iter_mut().enumerate() {
            match w.recv()? {
                FromRank::Ready(b, d) if rank == 0 => names = (b, d),
                FromRank::Ready(..) => {}
                _ => return Err(CliError::failed(format!("rank {rank}: unexpected answer"))),
            }
        }
        Ok(Processes {
            workers,
            names,
            _pool: pool,
        })
    }

    fn collect(&mut self) -> CliResult<Vec<RankStep>> {
        let mut out = Vec::with_capacity(self.workers.len());
        for (rank, w) in self.workers.iter_mut().enumerate() {
            match w.recv()? {
                FromRank::Step(s) => out.push(*s),
                _ => return Err(CliError::failed(format!("rank {rank}: unexpected answer"))),
            }
        }
        Ok(out)
    }
}

impl Ranks for Processes {
    fn names(&self) -> (String, String) {
        self.names.clone()
    }

    fn count(&self) -> usize {
        self.workers.len()
    }

    fn begin(&mut self, cmd: &OffloadCommand) -> CliResult<()> {
        let msg = ToRank::Begin(Box::new(cmd.clone()));
        // With one shared pool, rank 0's host copy-on-write must be done before the others'
        // restores read the pages it wrote.
        let barrier = self._pool.is_some() && !cmd.host_cow.is_empty();
        for rank in 0..self.workers.len() {
            self.workers[rank].send(&msg)?;
            if barrier && rank == 0 {
                self.expect_begun(0)?;
            }
        }
        for rank in usize::from(barrier)..self.workers.len() {
            self.expect_begun(rank)?;
        }
        Ok(())
    }

    fn finish(&mut self, _cmd: &OffloadCommand, decode: &[DecodeRow]) -> CliResult<Vec<RankStep>> {
        let msg = ToRank::Finish(decode.to_vec());
        for rank in 0..self.workers.len() {
            self.workers[rank].send(&msg)?;
        }
        self.collect()
    }

    fn drain(&mut self) -> CliResult<Vec<RankStep>> {
        for rank in 0..self.workers.len() {
            self.workers[rank].send(&ToRank::Drain)?;
        }
        let out = self.collect()?;
        for w in &mut self.workers {
            w.wait()?;
        }
        Ok(out)
    }
}

impl Processes {
    fn expect_begun(&mut self, rank: usize) -> CliResult<()> {
        match self.workers[rank].recv()? {
            FromRank::Begun => Ok(()),
            _ => Err(CliError::failed(format!("rank {rank}: unexpected answer"))),
        }
    }
}

/// The worker process: reads its [`Hello`] and then serves [`ToRank`] messages until `Drain`.
pub fn rank_main() -> CliResult<()> {
    serve_worker(
        &format!("{RANK_SUBCOMMAND} is started by `hisparse simulate --tp N`"),
        FromRank::Failed,
        |hello: Hello, input, output| serve_rank(&hello, input, output),
    )
}

/// Opens the rank's device and serves the coordinator's messages.
#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
fn serve_rank(h: &Hello, input: &mut impl BufRead, output: &mut impl Write) -> CliResult<()> {
    open_rank(h).and_then(|rank| serve(rank, input, output))
}

/// Without a backend compiled in there is no device to open.
#[cfg(not(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
)))]
fn serve_rank(h: &Hello, _: &mut impl BufRead, _: &mut impl Write) -> CliResult<()> {
    let kind: BackendKind = h
        .backend
        .parse()
        .map_err(|e: hisparse_runtime::UnknownBackend| CliError::usage(e.to_string()))?;
    Err(CliError::NotCompiled(kind.name()))
}

#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
/// Opens the rank's device and builds its runtime over its host pool.
fn open_rank(h: &Hello) -> CliResult<Rank<AnyDevice>> {
    let kind: BackendKind = h
        .backend
        .parse()
        .map_err(|e: hisparse_runtime::UnknownBackend| CliError::usage(e.to_string()))?;
    let dev = match &h.device {
        Some(sel) => AnyDevice::open(kind, sel),
        // Device `rank` where the machine has it (one GPU per rank), else the first one.
        None => AnyDevice::open(kind, &h.rank.to_string()).or_else(|_| AnyDevice::open(kind, "")),
    }
    .map_err(|e| CliError::device(&format!("rank {}: opening the device", h.rank), e))?;
    let s = &h.setup;
    match &h.shared_pool {
        None => {
            let host = dev
                .alloc_pinned(s.kv.host_pool_bytes() as usize)
                .map_err(|e| CliError::device("allocating the host pool", e))?;
            Rank::with_host_pool(dev, s, h.rank, host, true)
        }
        Some(name) => {
            let segment = SharedSegment::open(name, s.kv.host_pool_bytes() as usize)
                .map_err(|e| CliError::failed(format!("opening the shared host pool: {e}")))?;
            let host = dev
                .host_pool_from_shared(segment)
                .map_err(|e| CliError::device("using the shared host pool", e))?;
            Rank::with_host_pool(dev, s, h.rank, host, h.writes_host)
        }
    }
}

fn serve<D: Device>(
    mut rank: Rank<D>,
    input: &mut impl BufRead,
    output: &mut impl Write,
) -> CliResult<()> {
    let io = |e: std::io::Error| CliError::failed(format!("writing to the coordinator: {e}"));
    let (b, d) = rank.names();
    send(output, &FromRank::Ready(b, d)).map_err(io)?;
    let mut line = String::new();
    let mut cmd = OffloadCommand::default();
    loop {
        let msg: ToRank = recv(input, &mut line)
            .map_err(|e| CliError::failed(format!("reading from the coordinator: {e}")))?;
        match msg {
            ToRank::Begin(c) => {
                cmd = *c;
                rank.begin(&cmd)?;
                send(output, &FromRank::Begun).map_err(io)?;
            }
            ToRank::Finish(decode) => {
                let step = rank.finish(&cmd, &decode)?;
                send(output, &FromRank::Step(Box::new(step))).map_err(io)?;
            }
            ToRank::Drain => {
                let step = rank.drain()?;
                send(output, &FromRank::Step(Box::new(step))).map_err(io)?;
                return Ok(());
            }
        }
    }
}
