//! `simulate --pd nixl`: disaggregated prefill → decode on this machine, over NIXL.
//!
//! This process is the decode side: its coordinator and runtime (a [`Rank`](super::rank::Rank))
//! over a host pool it registers with a NIXL agent and publishes
//! ([`hisparse_nixl::DecodeOffer`]). It starts the prefill side as a second process of this
//! executable ([`PREFILL_SUBCOMMAND`]): a coordinator and runtime of its own that only prefill,
//! writing each request's synthetic KV rows into its GPU pool (on the CPU backend, host memory
//! standing in for it). Per request:
//!
//! 1. the prefill side prefills the prompt and says so;
//! 2. the decode coordinator reserves host blocks for the import, one per page
//!    (`Coordinator::reserve_import`), and the decode side sends them as the manifest;
//! 3. the prefill side writes every (layer, page) from its resident pages into those blocks, one
//!    NIXL write with a notification, and finishes the request once the write completed;
//! 4. the decode side, polling notifications between its decode steps (never waiting on them),
//!    matches the notification to its manifest, verifies every row of every imported page in its
//!    host pool against the synthetic rows, byte for byte, and completes the import
//!    (`Coordinator::complete_import`): the request starts with its pages durable on host and its
//!    tail page restored to the GPU, and decodes `--decode-steps` tokens, every row attention
//!    reads verified, while later requests are still being prefilled and written.
//!
//! Before the requests, the prefill side measures the transport's own figure in the same run: a
//! plain NIXL write of as many bytes, host memory to the decode host pool, one descriptor
//! (best of three).

use hisparse_core::layout::KvCacheConfig;
use hisparse_nixl::PageManifest;

use crate::args::SimulateArgs;
use crate::error::{CliError, CliResult};

use super::engine::SimSetup;
use super::kv;
use super::verify::Verified;

/// The hidden subcommand the prefill process runs.
pub const PREFILL_SUBCOMMAND: &str = "simulate-prefill";

/// The one transport `--pd` takes.
pub const TRANSPORT: &str = "nixl";

/// Checks `--pd` and what it does not combine with; `Ok(None)` when `--pd` is not given.
pub fn transport(a: &SimulateArgs, s: &SimSetup) -> CliResult<Option<&'static str>> {
    let Some(t) = a.pd.as_deref() else {
        return Ok(None);
    };
    if t != TRANSPORT {
        return Err(CliError::usage(format!(
            "--pd {t}: the transport of the disaggregated path is nixl; give --pd nixl"
        )));
    }
    for (set, flag) in [
        (s.tp > 1, "--tp"),
        (s.workers > 1, "--workers"),
        (s.shared_prefix > 0, "--shared-prefix"),
        (s.spec_tokens > 0, "--spec-tokens"),
        (a.plot.is_some(), "--plot"),
    ] {
        if set {
            return Err(CliError::usage(format!(
                "--pd nixl runs one prefill and one decode process; drop {flag}"
            )));
        }
    }
    Ok(Some(TRANSPORT))
}

/// Runs `simulate --pd nixl` on backend `kind` (both sides) and prints the report.
pub fn simulate_pd(
    kind: hisparse_runtime::BackendKind,
    a: &SimulateArgs,
    s: &SimSetup,
) -> CliResult<()> {
    if !crate::backend::compiled(kind) {
        return Err(CliError::NotCompiled(kind.name()));
    }
    #[cfg(feature = "nixl")]
    {
        // SAFETY: this process has started no thread yet.
        unsafe { hisparse_nixl::ffi::transport_log_to_stderr() };
        let prefill_kv = prefill_layout(a, s)?;
        let report = nixl_sim::run(kind, &a.backend.device, s, prefill_kv)?;
        report.publish(a.json)
    }
    #[cfg(not(feature = "nixl"))]
    {
        let _ = (a, s);
        Err(CliError::usage(
            "--pd nixl needs a hisparse built with the nixl feature: \
             cargo build --release -p hisparse-cli --features nixl",
        ))
    }
}

/// The prefill process: reads its instructions on stdin, answers on stdout.
pub fn prefill_main() -> CliResult<()> {
    #[cfg(feature = "nixl")]
    {
        // SAFETY: this process has started no thread yet.
        unsafe { hisparse_nixl::ffi::transport_log_to_stderr() };
        nixl_sim::prefill_main()
    }
    #[cfg(not(feature = "nixl"))]
    {
        Err(CliError::usage(format!(
            "{PREFILL_SUBCOMMAND} is started by `hisparse simulate --pd nixl` of a hisparse \
             built with the nixl feature"
        )))
    }
}

/// The prefill side's layout: the decode side's model and pages, with a GPU pool that holds a
/// request fully resident with room to spare, so its pages are all on the GPU when they are
/// written (the prefill side prefills one request at a time).
#[cfg(feature = "nixl")]
fn prefill_layout(
    a: &SimulateArgs,
    s: &SimSetup,
) -> CliResult<hisparse_core::layout::KvCacheConfig> {
    let m = super::model(
        &a.preset,
        a.model.as_deref(),
        crate::args::number("layers", &a.layers)?,
    )?;
    let kv = &s.kv;
    let per = kv.gpu_blocks_per_request(s.context);
    let blocks = per
        .all_on_gpu
        .saturating_add(per.hisparse)
        .saturating_mul(2)
        .saturating_add(2);
    let options = crate::layout::PlanOptions {
        device_buffer_size: Some(kv.device_buffer_size),
        max_query_len: kv.config.max_query_len,
        shared_host_pool: false,
    };
    let mut out = crate::layout::plan_unmapped(
        &m.as_spec(),
        blocks.saturating_mul(kv.bytes_per_block),
        kv.host_pool_bytes(),
        kv.max_model_len,
        options,
    )
    .map_err(|e| {
        CliError::usage(format!(
            "planning the prefill side's pool: {e}; lower --context or --requests"
        ))
    })?;
    out.config.eager_host_mirror = kv.config.eager_host_mirror;
    Ok(out)
}

/// The decode side's checks of imported pages: every row of every page of every sparse layer
/// read back from the host pool and compared with its synthetic source.
#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
pub struct ImportVerifier {
    layers: Vec<(u32, hisparse_core::ops::PageLayout)>,
    ratio: u32,
    page: Vec<u8>,
    /// The totals.
    pub verified: Verified,
}

#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
impl ImportVerifier {
    /// A verifier for the host pool of `kv`.
    pub fn new(kv: &KvCacheConfig) -> CliResult<Self> {
        let layers = kv.groups[KvCacheConfig::SOURCE_GROUP]
            .layers
            .iter()
            .map(|l| kv.host_layout(l.layer).map(|h| (l.layer, h)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CliError::failed(e.to_string()))?;
        Ok(ImportVerifier {
            layers,
            ratio: kv.sparse_compress_ratio.max(1),
            page: Vec::new(),
            verified: Verified::default(),
        })
    }

    /// Checks every row of every page of `m` in the host pool `host` of `dev`.
    pub fn check<D: hisparse_core::Device>(
        &mut self,
        dev: &D,
        host: &D::HostBuffer,
        m: &PageManifest,
    ) -> CliResult<()> {
        let rows = m.tokens / self.ratio;
        for &(layer, l) in &self.layers {
            let (bs, rb) = (l.block_size, l.row_bytes as usize);
            let page_len = bs as usize * rb;
            self.page.resize(page_len, 0);
            for (p, &block) in m.host_blocks.iter().enumerate() {
                let start = l.base + u64::from(block) * l.block_stride;
                dev.read_pinned(host, start as usize, &mut self.page)
                    .map_err(|e| CliError::device("reading the decode host pool", e))?;
                for r in 0..bs {
                    let pos = p as u32 * bs + r;
                    if pos >= rows {
                        break;
                    }
                    let seed = kv::row_seed(m.request, layer, pos);
                    let [(voff, vlen), (soff, slen)] = l.row_parts(block, r);
                    let part = |off: u64, len: u64| {
                        let at = (off - start) as usize;
                        &self.page[at..at + len as usize]
                    };
                    let ok = kv::matches(seed, 0, part(voff, vlen))
                        && (slen == 0 || kv::matches(seed, vlen as usize, part(soff, slen)));
                    self.verified.rows += 1;
                    if !ok {
                        self.verified.mismatched += 1;
                        if self.verified.first_mismatch.is_none() {
                            self.verified.first_mismatch = Some(format!(
                                "request {} layer {layer} token row {pos} in host block \
                                 {block}",
                                m.request
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(feature = "nixl")]
mod nixl_sim {
    use std::io::{BufRead, BufReader, BufWriter, Write};
    use std::process::{Child, ChildStdin, Command, Stdio};
    use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
    use std::time::{Duration, Instant};

    use hisparse_backend_cpu::CpuDevice;
    use hisparse_core::Device;
    use hisparse_core::coordinator::{CoordError, Coordinator, CoordinatorConfig, OffloadCommand};
    use hisparse_core::layout::KvCacheConfig;
    use hisparse_core::ops::BufferLen;
    use hisparse_nixl::{
        Arrival, DecodeOffer, DecodeSide, MemoryKind, PoolGeometry, PrefillSide, Region,
    };
    use hisparse_runtime::{
        AnyBuffer, AnyDevice, BackendKind, Runtime, RuntimeConfig, SharedHostPool, SharedSegment,
    };
    use serde::{Deserialize, Serialize};

    use super::super::engine::SimSetup;
    use super::super::forward::Forward;
    use super::super::rank::{DecodeRow, Rank};
    use super::super::tp::{recv, send};
    use super::{ImportVerifier, PREFILL_SUBCOMMAND, PageManifest};
    use crate::error::{CliError, CliResult};

    /// How long either side waits for the other before it calls the run stalled.
    const SILENCE: Duration = Duration::from_secs(120);

    /// Bulk writes of the transport's own figure (the best is reported).
    const BULK_REPEATS: u32 = 3;

    /// What the prefill process is told first.
    #[derive(Serialize, Deserialize)]
    struct Hello {
        backend: String,
        device: Option<String>,
        setup: SimSetup,
        /// The prefill side's own layout (the same pages, a larger GPU pool).
        prefill_kv: KvCacheConfig,
        offer: DecodeOffer,
    }

    /// A message to the prefill process.
    #[derive(Serialize, Deserialize)]
    enum ToPrefill {
        /// Write this many bytes in one plain write (the transport's own figure).
        Bulk(u64),
        /// Start prefilling the requests.
        Start,
        /// The host blocks of a prefilled request.
        Manifest(PageManifest),
        /// Every request is done: exit.
        Done,
    }

    /// A message from the prefill process.
    #[derive(Serialize, Deserialize)]
    enum FromPrefill {
        /// The agent is up: its name, the backend's and the device's.
        Ready(String, String, String),
        /// A bulk write completed after this many seconds.
        BulkSent(f64),
        /// A request's prompt is prefilled: (request, tokens).
        Prefilled(u64, u32),
        /// A request's write completed: (request, bytes, seconds from posting to completion).
        Sent(u64, u64, f64),
        /// The prefill side failed.
        Failed(String),
    }

    fn nixl_err(e: hisparse_nixl::PdError) -> CliError {
        CliError::failed(format!("nixl: {e}"))
    }

    fn rt_err(what: &str) -> impl Fn(String) -> CliError + '_ {
        move |e| CliError::failed(format!("{what}: {e}"))
    }

    /// What `simulate --pd nixl` reports.
    #[derive(Debug, Default, Serialize)]
    pub struct PdReport {
        /// Backend of both sides.
        pub backend: String,
        /// Decode side's device.
        pub device: String,
        /// Prefill side's device.
        pub prefill_device: String,
        /// Memory the prefill side writes from (`host` or `gpu`).
        pub source_memory: String,
        /// Model preset.
        pub preset: String,
        /// Sparse layers.
        pub sparse_layers: u32,
        /// Requests imported.
        pub requests: u32,
        /// Prompt tokens per request.
        pub context: u32,
        /// Tokens each request decodes after its import.
        pub decode_steps: u32,
        /// Pages written per request.
        pub pages_per_request: u32,
        /// NIXL writes (one per request).
        pub writes: u64,
        /// Descriptors per write (one per layer and page).
        pub descriptors_per_write: u64,
        /// Bytes imported.
        pub transfer_bytes: u64,
        /// Seconds of the imports' writes, posting to completion, summed.
        pub transfer_seconds: f64,
        /// Import throughput.
        pub transfer_gb_per_s: f64,
        /// Bytes of the bulk write.
        pub bulk_bytes: u64,
        /// Best bulk write's seconds.
        pub bulk_seconds: f64,
        /// NIXL's own figure: one plain host-to-host write of `bulk_bytes`.
        pub bulk_gb_per_s: f64,
        /// Rows of imported pages verified in the decode host pool (one per layer per token),
        /// before the import was completed.
        pub imported_rows_verified: u64,
        /// Rows attention read while the imported requests decoded, verified.
        pub decode_rows_verified: u64,
        /// Both.
        pub verified_rows: u64,
        /// Rows that differ from their source.
        pub mismatched_rows: u64,
        /// The first mismatch.
        pub first_mismatch: Option<String>,
        /// Whether every imported request decoded all its tokens.
        pub decoded: bool,
        /// Tokens decoded (over all requests).
        pub decode_tokens: u64,
        /// Hot-buffer hit rate of the decode.
        pub hit_rate: f64,
        /// Host-to-device bytes of the decode (swap-ins and restores).
        pub h2d_bytes: u64,
        /// Pages restored to the GPU (the imported requests' tail pages among them).
        pub restored_pages: u64,
        /// Wall time.
        pub wall_seconds: f64,
    }

    impl PdReport {
        fn to_text(&self) -> String {
            let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
            format!(
                "disaggregated {preset} on {backend}: prefill on {pdev} ({src} memory) → decode \
                 host pool on {dev}, over NIXL (UCX)\n\n\
                 imports                 {req} requests × {ctx} tokens = {pages} pages each, \
                 {layers} sparse layers; {writes} writes of {desc} descriptors\n\
                 transfer                {tb:.3} GiB in {ts:.3} s = {tg:.2} GB/s (posting to \
                 completion, summed over writes)\n\
                 NIXL bulk (same run)    {bb:.3} GiB host → decode host pool, one descriptor: \
                 {bg:.2} GB/s (best of {rep})\n\
                 verification            {iv} imported rows verified byte for byte in the \
                 decode host pool; {dv} rows read by decode attention; {m} mismatched\n\
                 decode after import     {decode}\n\
                 wall time               {wall:.2} s",
                preset = self.preset,
                backend = self.backend,
                pdev = self.prefill_device,
                src = self.source_memory,
                dev = self.device,
                req = self.requests,
                ctx = self.context,
                pages = self.pages_per_request,
                layers = self.sparse_layers,
                writes = self.writes,
                desc = self.descriptors_per_write,
                tb = gib(self.transfer_bytes),
                ts = self.transfer_seconds,
                tg = self.transfer_gb_per_s,
                bb = gib(self.bulk_bytes),
                bg = self.bulk_gb_per_s,
                rep = BULK_REPEATS,
                iv = self.imported_rows_verified,
                dv = self.decode_rows_verified,
                m = self.mismatched_rows,
                decode = if self.decoded {
                    format!(
                        "{} tokens per request ({} in all), pages restored: {}, hot hit \
                         rate {:.1}%, host→device {:.2} MiB",
                        self.decode_steps,
                        self.decode_tokens,
                        self.restored_pages,
                        self.hit_rate * 100.0,
                        self.h2d_bytes as f64 / f64::from(1u32 << 20)
                    )
                } else {
                    "not every request decoded".to_string()
                },
                wall = self.wall_seconds,
            )
        }

        /// Prints the report; fails when any row mismatched or none was verified.
        pub fn publish(&self, json: bool) -> CliResult<()> {
            if json {
                crate::emit(&serde_json::to_string_pretty(self).unwrap_or_default());
            } else {
                crate::emit(&self.to_text());
            }
            if self.mismatched_rows > 0 {
                return Err(CliError::failed(format!(
                    "{} of {} imported rows did not match their source (first: {})",
                    self.mismatched_rows,
                    self.verified_rows,
                    self.first_mismatch.as_deref().unwrap_or("?")
                )));
            }
            if self.verified_rows == 0 {
                return Err(CliError::failed("no imported row was verified"));
            }
            Ok(())
        }
    }

    /// The prefill process, seen from the decode side.
    struct PrefillProcess {
        child: Child,
        to: BufWriter<ChildStdin>,
        from: Receiver<Result<FromPrefill, String>>,
    }

    impl PrefillProcess {
        fn start(hello: &Hello) -> CliResult<Self> {
            let exe = std::env::current_exe().map_err(|e| {
                CliError::failed(format!(
                    "cannot find this executable to start the prefill side: {e}"
                ))
            })?;
            // UCX logs to standard output unless told otherwise: there it would break the
            // protocol on the child's standard output.
            let log = std::env::var_os(hisparse_nixl::ffi::UCX_LOG_FILE)
                .filter(|v| v != "stdout")
                .unwrap_or_else(|| "stderr".into());
            let mut child = Command::new(exe)
                .arg(PREFILL_SUBCOMMAND)
                .env(hisparse_nixl::ffi::UCX_LOG_FILE, log)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| CliError::failed(format!("cannot start the prefill side: {e}")))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(CliError::failed("no pipes to the prefill side"));
            };
            // A reader thread, so the decode loop only ever looks at what already arrived.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut r = BufReader::new(stdout);
                let mut line = String::new();
                loop {
                    let msg = recv::<FromPrefill>(&mut r, &mut line);
                    let last = msg.is_err();
                    if tx.send(msg).is_err() || last {
                        return;
                    }
                }
            });
            let mut p = PrefillProcess {
                child,
                to: BufWriter::new(stdin),
                from: rx,
            };
            p.send(hello)?;
            Ok(p)
        }

        fn send<T: Serialize>(&mut self, msg: &T) -> CliResult<()> {
            send(&mut self.to, msg)
                .map_err(|e| CliError::failed(format!("cannot send to the prefill side: {e}")))
        }

        fn failed(&mut self, e: String) -> CliError {
            let status = self.child.try_wait().ok().flatten();
            CliError::failed(format!(
                "the prefill side stopped answering ({e}{})",
                status
                    .map(|s| format!("; it exited with {s}"))
                    .unwrap_or_default()
            ))
        }

        /// A message if one arrived (never waits).
        fn try_recv(&mut self) -> CliResult<Option<FromPrefill>> {
            match self.from.try_recv() {
                Ok(Ok(FromPrefill::Failed(m))) => {
                    Err(CliError::failed(format!("prefill side: {m}")))
                }
                Ok(Ok(m)) => Ok(Some(m)),
                Ok(Err(e)) => Err(self.failed(e)),
                Err(TryRecvError::Empty) => Ok(None),
                Err(TryRecvError::Disconnected) => Err(self.failed("the pipe closed".into())),
            }
        }

        /// The next message, waiting at most [`SILENCE`].
        fn recv(&mut self) -> CliResult<FromPrefill> {
            match self.from.recv_timeout(SILENCE) {
                Ok(Ok(FromPrefill::Failed(m))) => {
                    Err(CliError::failed(format!("prefill side: {m}")))
                }
                Ok(Ok(m)) => Ok(m),
                Ok(Err(e)) => Err(self.failed(e)),
                Err(RecvTimeoutError::Timeout) => {
                    Err(self.failed(format!("nothing for {} s", SILENCE.as_secs())))
                }
                Err(RecvTimeoutError::Disconnected) => Err(self.failed("the pipe closed".into())),
            }
        }
    }

    impl Drop for PrefillProcess {
        fn drop(&mut self) {
            // A run that failed leaves no process behind.
            if self.child.try_wait().ok().flatten().is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }

    /// A region of `len` bytes at `address` of a pool (host memory or GPU `ordinal`).
    fn region(address: u64, len: u64, memory: MemoryKind) -> Region {
        Region {
            address,
            len,
            memory,
        }
    }

    /// The prompt of request `uid` (both sides use the same tokens).
    fn prompt(uid: u64, context: u32) -> Vec<u32> {
        (0..context)
            .map(|p| (uid as u32).wrapping_mul(1_000_003).wrapping_add(p))
            .collect()
    }

    fn coord_err(e: impl std::fmt::Display) -> CliError {
        CliError::failed(e.to_string())
    }

    /// The decode side: this process. Its host pool is a shared-memory segment mapped twice:
    /// once as the runtime's pinned host pool (registered with NIXL), once as a host view the
    /// import verifier reads.
    pub fn run(
        kind: BackendKind,
        device: &str,
        s: &SimSetup,
        prefill_kv: KvCacheConfig,
    ) -> CliResult<PdReport> {
        let wall = Instant::now();
        let kv = &s.kv;
        let ratio = kv.sparse_compress_ratio.max(1);
        let final_len = s.context + s.decode_steps;
        let pool_bytes = kv.host_pool_bytes() as usize;
        let segment_name = SharedSegment::unique_name("hisparse-pd-pool");
        let segment = SharedSegment::create(&segment_name, pool_bytes)
            .map_err(|e| CliError::failed(format!("creating the decode host pool: {e}")))?;
        let view = CpuDevice::new();
        let view_pool = view
            .host_pool_from_shared(
                SharedSegment::open(&segment_name, pool_bytes)
                    .map_err(|e| CliError::failed(format!("mapping the decode host pool: {e}")))?,
            )
            .map_err(|e| CliError::device("mapping the decode host pool", e))?;
        let dev = AnyDevice::open(kind, device)
            .map_err(|e| CliError::device("opening the decode device", e))?;
        let (backend, device_name) = (dev.backend().to_string(), dev.device_name().to_string());
        let host = dev
            .host_pool_from_shared(segment)
            .map_err(|e| CliError::device("using the decode host pool", e))?;
        let pool = region(
            dev.pinned_address(&host) as u64,
            host.byte_len(),
            MemoryKind::Host,
        );
        let mut rank = Rank::with_host_pool(dev, s, 0, host, true)?;
        let host_geometry = PoolGeometry::host(kv).map_err(nixl_err)?;
        let name = format!("hisparse-decode-{}", std::process::id());
        // SAFETY: the host pool belongs to `rank`'s runtime, which outlives `decode` (declared
        // after it, so dropped first); the prefill side writes only the blocks of manifests
        // issued below, which the coordinator reserved for those imports alone, and this side
        // reads them only after their notification arrived.
        let mut decode =
            unsafe { DecodeSide::new(&name, pool, host_geometry.clone()) }.map_err(nixl_err)?;
        let offer = decode.offer().map_err(nixl_err)?;
        let mut prefill = PrefillProcess::start(&Hello {
            backend: kind.name().to_string(),
            device: (!device.trim().is_empty()).then(|| device.to_string()),
            setup: s.clone(),
            prefill_kv,
            offer,
        })?;
        let (agent, _, prefill_device) = match prefill.recv()? {
            FromPrefill::Ready(a, b, d) => (a, b, d),
            _ => return Err(CliError::failed("the prefill side answered out of turn")),
        };
        decode.accept_from(&agent);

        let pages = host_geometry.pages_for(s.context);
        let per_request = host_geometry.request_bytes(pages);
        let mut report = PdReport {
            backend,
            device: device_name,
            prefill_device,
            source_memory: if kind == BackendKind::Cpu {
                "host"
            } else {
                "gpu"
            }
            .into(),
            preset: s.preset.clone(),
            sparse_layers: host_geometry.layers.len() as u32,
            requests: s.requests,
            context: s.context,
            decode_steps: s.decode_steps,
            pages_per_request: pages,
            descriptors_per_write: u64::from(pages) * host_geometry.layers.len() as u64,
            ..PdReport::default()
        };

        // The transport's own figure, before any block is assigned (it overwrites the pool).
        let bulk = (per_request * u64::from(s.requests)).min(host_geometry.pool_bytes);
        let mut best = f64::INFINITY;
        for _ in 0..BULK_REPEATS {
            prefill.send(&ToPrefill::Bulk(bulk))?;
            let (mut sent, mut landed) = (None, false);
            let since = Instant::now();
            while sent.is_none() || !landed {
                if let Some(m) = prefill.try_recv()? {
                    match m {
                        FromPrefill::BulkSent(secs) => sent = Some(secs),
                        _ => return Err(CliError::failed("the prefill side answered out of turn")),
                    }
                }
                for a in decode.poll().map_err(nixl_err)? {
                    match a {
                        Arrival::Bulk { bytes } if bytes == bulk => landed = true,
                        other => {
                            return Err(CliError::failed(format!(
                                "an arrival out of turn during the bulk write: {other:?}"
                            )));
                        }
                    }
                }
                if since.elapsed() > SILENCE {
                    return Err(CliError::failed("the bulk write never arrived"));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            best = best.min(sent.unwrap_or(f64::INFINITY));
        }
        report.bulk_bytes = bulk;
        report.bulk_seconds = best;
        report.bulk_gb_per_s = bulk as f64 / best / 1e9;

        // The imports and the decode. The loop never waits on a notification: each turn it
        // takes what arrived (verified, then handed to the coordinator), answers the prefill
        // side (host blocks for a prefilled request), and runs a decode step when there is a
        // request to decode.
        let mut coord = Coordinator::new(
            kv.clone(),
            CoordinatorConfig {
                max_running: s.requests,
                max_batched_tokens: s.max_batched_tokens,
                max_spill_pages_per_step: 64,
                num_workers: 1,
                ..CoordinatorConfig::default()
            },
        )
        .map_err(coord_err)?;
        let mut verifier = ImportVerifier::new(kv)?;
        // Prefilled requests the host pool had no room for yet: (request, tokens).
        let mut waiting: Vec<(u64, u32)> = Vec::new();
        let (mut sent, mut imported, mut finished, mut live) = (0u32, 0u32, 0u32, 0u32);
        let mut cmd = OffloadCommand::default();
        let mut last_news = Instant::now();
        let mut idle_steps = 0u32;
        prefill.send(&ToPrefill::Start)?;
        while finished < s.requests {
            let mut news = false;
            for a in decode.poll().map_err(nixl_err)? {
                news = true;
                let Arrival::Import(m) = a else {
                    return Err(CliError::failed("a bulk notification during the imports"));
                };
                if coord.import_blocks(m.request) != Some(&m.host_blocks[..]) {
                    return Err(CliError::failed(format!(
                        "request {} arrived in blocks the coordinator did not reserve for it",
                        m.request
                    )));
                }
                verifier.check(&view, &view_pool, &m)?;
                coord.complete_import(m.request).map_err(coord_err)?;
                imported += 1;
                live += 1;
            }
            if let Some(msg) = prefill.try_recv()? {
                news = true;
                match msg {
                    FromPrefill::Prefilled(request, tokens) => waiting.push((request, tokens)),
                    FromPrefill::Sent(_, bytes, secs) => {
                        sent += 1;
                        report.writes += 1;
                        report.transfer_bytes += bytes;
                        report.transfer_seconds += secs;
                    }
                    _ => return Err(CliError::failed("the prefill side answered out of turn")),
                }
            }
            // Host blocks for prefilled requests, as the host pool has room.
            while let Some(&(request, tokens)) = waiting.first() {
                let mut all = prompt(request, tokens);
                all.push(tokens); // the first sampled token: computed here, after the import
                match coord.reserve_import(request, &all, tokens) {
                    Ok(host_blocks) => {
                        waiting.remove(0);
                        let manifest = PageManifest {
                            request,
                            tokens,
                            host_blocks,
                        };
                        decode.issue(manifest.clone()).map_err(nixl_err)?;
                        prefill.send(&ToPrefill::Manifest(manifest))?;
                        news = true;
                    }
                    Err(CoordError::Import { .. }) if live > 0 => break, // room comes back
                    Err(e) => return Err(coord_err(e)),
                }
            }
            if live > 0 {
                news = true;
                let st = decode_step(&mut coord, &mut rank, &mut cmd, s, ratio)?;
                idle_steps = if st.0 { 0 } else { idle_steps + 1 };
                if idle_steps > 1000 {
                    return Err(CliError::failed(
                        "the decode side stalled: 1000 steps scheduled nothing; give it more \
                         --gpu-mem",
                    ));
                }
                report.decode_tokens += u64::from(st.1);
                // Sample or finish.
                let running: Vec<_> = coord.running_ids().collect();
                for id in running {
                    let (n, c) = (
                        coord.num_tokens(id).unwrap_or(0),
                        coord.num_computed(id).unwrap_or(0),
                    );
                    if n == c {
                        if n >= final_len {
                            coord.finish(id).map_err(coord_err)?;
                            finished += 1;
                            live -= 1;
                        } else {
                            coord.append_tokens(id, &[n]).map_err(coord_err)?;
                        }
                    }
                }
            }
            if news {
                last_news = Instant::now();
            } else if last_news.elapsed() > SILENCE {
                return Err(CliError::failed(format!(
                    "nothing moved for {} s: {sent} of {} requests written, {imported} \
                     imported, {} outstanding",
                    SILENCE.as_secs(),
                    s.requests,
                    decode.outstanding()
                )));
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        // A write's completion may reach this side after its notification did.
        while sent < s.requests {
            match prefill.recv()? {
                FromPrefill::Sent(_, bytes, secs) => {
                    sent += 1;
                    report.writes += 1;
                    report.transfer_bytes += bytes;
                    report.transfer_seconds += secs;
                }
                _ => return Err(CliError::failed("the prefill side answered out of turn")),
            }
        }
        prefill.send(&ToPrefill::Done)?;
        let status = prefill
            .child
            .wait()
            .map_err(|e| CliError::failed(format!("the prefill side: {e}")))?;
        if !status.success() {
            return Err(CliError::failed(format!(
                "the prefill side exited with {status}"
            )));
        }
        // Drain: every block back in its pool.
        let drained = rank.drain()?;
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
        let c = drained.counters;
        report.decoded = finished == s.requests && s.decode_steps > 0;
        report.hit_rate = c.hit_rate().unwrap_or(0.0);
        report.h2d_bytes = c.h2d_bytes;
        report.restored_pages = c.restored_pages;
        report.transfer_gb_per_s = report.transfer_bytes as f64 / report.transfer_seconds / 1e9;
        report.imported_rows_verified = verifier.verified.rows;
        report.decode_rows_verified = drained.verified.rows;
        report.verified_rows = verifier.verified.rows + drained.verified.rows;
        report.mismatched_rows = verifier.verified.mismatched + drained.verified.mismatched;
        report.first_mismatch = verifier
            .verified
            .first_mismatch
            .clone()
            .or(drained.verified.first_mismatch.clone());
        report.wall_seconds = wall.elapsed().as_secs_f64();
        drop(decode);
        drop(rank);
        Ok(report)
    }

    /// One decode step of the decode side: plan, execute on the rank (the forward pass's writes,
    /// every decode row's reads through the runtime, verified), report the copies. Returns
    /// whether anything was scheduled and how many decode rows read.
    fn decode_step(
        coord: &mut Coordinator,
        rank: &mut Rank<AnyDevice>,
        cmd: &mut OffloadCommand,
        s: &SimSetup,
        ratio: u32,
    ) -> CliResult<(bool, u32)> {
        coord.schedule_step().map_err(coord_err)?;
        coord.build_offload_command_into(cmd);
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
        coord
            .report(0, &st.report.enqueued, &st.report.completed)
            .map_err(coord_err)?;
        Ok((!cmd.scheduled.is_empty(), decode.len() as u32))
    }

    /// The prefill process.
    pub fn prefill_main() -> CliResult<()> {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        let stdout = std::io::stdout();
        let mut output = BufWriter::new(stdout.lock());
        let mut line = String::new();
        let hello: Hello = recv(&mut input, &mut line).map_err(|e| {
            CliError::failed(format!(
                "{PREFILL_SUBCOMMAND} is started by `hisparse simulate --pd nixl`, not by hand ({e})"
            ))
        })?;
        let result = serve(&hello, &mut input, &mut output);
        if let Err(e) = &result {
            let _ = send(&mut output, &FromPrefill::Failed(e.to_string()));
        }
        result
    }

    /// The prefill pool as a NIXL region: GPU memory on CUDA, host memory on the CPU backend.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn pool_region(pool: &AnyBuffer, ordinal: u32) -> CliResult<Region> {
        match pool {
            #[cfg(feature = "cpu")]
            AnyBuffer::Cpu(b) => Ok(region(b.address() as u64, b.byte_len(), MemoryKind::Host)),
            #[cfg(feature = "cuda")]
            AnyBuffer::Cuda(b) => Ok(region(
                b.device_address(),
                b.byte_len(),
                MemoryKind::Device { ordinal },
            )),
            #[allow(unreachable_patterns)]
            _ => Err(CliError::usage(
                "--pd nixl writes from the prefill pool through NIXL, which reaches host memory \
                 (--backend cpu) and CUDA memory (--backend cuda); give one of those",
            )),
        }
    }

    fn serve(h: &Hello, input: &mut impl BufRead, output: &mut impl Write) -> CliResult<()> {
        let io = |e: std::io::Error| CliError::failed(format!("writing to the decode side: {e}"));
        let kind: BackendKind = h
            .backend
            .parse()
            .map_err(|e: hisparse_runtime::UnknownBackend| CliError::usage(e.to_string()))?;
        let selector = h.device.clone().unwrap_or_default();
        let ordinal: u32 = selector.trim().parse().unwrap_or(0);
        let dev = AnyDevice::open(kind, &selector)
            .map_err(|e| CliError::device("opening the prefill device", e))?;
        let s = &h.setup;
        let kv = h.prefill_kv.clone();
        let mut rt = Runtime::new(dev, kv.clone(), RuntimeConfig::new(1, 1))
            .map_err(|e| CliError::failed(format!("setting up the prefill runtime: {e}")))?;
        let geometry = PoolGeometry::device(&kv).map_err(nixl_err)?;
        let local = pool_region(&rt.pools().device, ordinal)?;
        let name = format!("hisparse-prefill-{}", std::process::id());
        // The bulk write's source; declared before `side`, so it is dropped after it.
        let mut staging: Vec<u64> = Vec::new();
        // SAFETY: the GPU pool belongs to `rt`, which outlives `side` (dropped explicitly
        // before it below); a request's pages are not written, and its blocks not handed to
        // another request, until its write completed (one request at a time, the coordinator
        // not stepped while a write is in flight).
        let mut side = unsafe { PrefillSide::new(&name, local, geometry, h.offer.clone()) }
            .map_err(nixl_err)?;
        let (b, d) = (
            rt.device().backend().to_string(),
            rt.device().device_name().to_string(),
        );
        send(output, &FromPrefill::Ready(side.name().to_string(), b, d)).map_err(io)?;

        let mut line = String::new();
        // Bulk writes until the decode side starts the imports.
        loop {
            match recv::<ToPrefill>(input, &mut line)
                .map_err(rt_err("reading from the decode side"))?
            {
                ToPrefill::Bulk(bytes) => {
                    if staging.is_empty() {
                        staging = (0..bytes.div_ceil(8))
                            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                            .collect();
                        let src = region(
                            staging.as_ptr() as u64,
                            staging.len() as u64 * 8,
                            MemoryKind::Host,
                        );
                        // SAFETY: `staging` is dropped after `side` and never written again
                        // (a later bulk write of more bytes is refused below).
                        unsafe { side.register(src) }.map_err(nixl_err)?;
                    }
                    let src = region(
                        staging.as_ptr() as u64,
                        staging.len() as u64 * 8,
                        MemoryKind::Host,
                    );
                    if bytes > src.len {
                        return Err(CliError::failed("bulk writes of growing sizes"));
                    }
                    let mut t = side.bulk(&src, bytes).map_err(nixl_err)?;
                    let since = Instant::now();
                    while !side.poll(&mut t).map_err(nixl_err)? {
                        if since.elapsed() > SILENCE {
                            return Err(CliError::failed("the bulk write did not complete"));
                        }
                        std::hint::spin_loop();
                    }
                    let secs = t.elapsed().map_or(f64::INFINITY, |e| e.as_secs_f64());
                    send(output, &FromPrefill::BulkSent(secs)).map_err(io)?;
                }
                ToPrefill::Start => break,
                _ => return Err(CliError::failed("the decode side spoke out of turn")),
            }
        }

        let mut coord = Coordinator::new(
            kv.clone(),
            CoordinatorConfig {
                max_running: 1,
                max_batched_tokens: s.max_batched_tokens,
                max_spill_pages_per_step: 64,
                num_workers: 1,
                ..CoordinatorConfig::default()
            },
        )
        .map_err(|e| CliError::failed(e.to_string()))?;
        let mut forward = Forward::new(&kv, 0)?;
        let ratio = kv.sparse_compress_ratio.max(1);
        let nb = kv.num_buckets;
        let mut cmd = OffloadCommand::default();
        for uid in 1..=u64::from(s.requests) {
            coord
                .admit(uid, &prompt(uid, s.context))
                .map_err(|e| CliError::failed(e.to_string()))?;
            // Prefill, step by step: the forward pass writes the rows into the resident pages.
            let mut slot = None;
            let mut idle = 0u32;
            while coord.num_computed(uid).unwrap_or(0) < s.context {
                coord
                    .schedule_step()
                    .map_err(|e| CliError::failed(e.to_string()))?;
                coord.build_offload_command_into(&mut cmd);
                idle = if cmd.scheduled.is_empty() {
                    idle + 1
                } else {
                    0
                };
                if idle > 1000 {
                    return Err(CliError::failed(
                        "the prefill side stalled: 1000 steps scheduled nothing",
                    ));
                }
                rt.begin_step(&cmd)
                    .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
                for sr in &cmd.scheduled {
                    slot = Some(sr.slot);
                    let end = sr.first_token + sr.num_tokens;
                    let resident: Vec<Vec<i32>> = (0..nb)
                        .map(|b| {
                            rt.resident_row(b, sr.slot)
                                .map(<[i32]>::to_vec)
                                .unwrap_or_default()
                        })
                        .collect();
                    let (dev, pools) = rt.device_and_pools_mut();
                    forward.write(
                        dev,
                        &mut pools.device,
                        sr.id,
                        sr.first_token / ratio..end / ratio,
                        0..0,
                        |b, p| {
                            resident
                                .get(b as usize)
                                .and_then(|r| r.get(p as usize).copied())
                        },
                    )?;
                }
                rt.end_step(&cmd)
                    .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
                for stream in [rt.compute_stream(), rt.copy_stream()] {
                    rt.device()
                        .synchronize(stream)
                        .map_err(|e| CliError::device("synchronising", e))?;
                }
                rt.poll_and_report(&mut coord)
                    .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
            }
            let slot =
                slot.ok_or_else(|| CliError::failed("a prefilled request was never scheduled"))?;
            send(output, &FromPrefill::Prefilled(uid, s.context)).map_err(io)?;
            let manifest = match recv::<ToPrefill>(input, &mut line)
                .map_err(rt_err("reading from the decode side"))?
            {
                ToPrefill::Manifest(m) if m.request == uid => m,
                _ => return Err(CliError::failed("the decode side spoke out of turn")),
            };
            // The GPU block of every page, per bucket; all must be resident.
            let pages = manifest.pages() as usize;
            let mut sources: Vec<Vec<u32>> = Vec::with_capacity(nb as usize);
            for b in 0..nb {
                let row = rt.resident_row(b, slot).unwrap_or_default();
                let mut list = Vec::with_capacity(pages);
                for p in 0..pages {
                    match row.get(p).copied() {
                        Some(block) if block > 0 => list.push(block as u32),
                        _ => {
                            return Err(CliError::failed(format!(
                                "page {p} of request {uid} (bucket {b}) is not on the prefill \
                                 side's GPU: its pool is too small for a request; lower \
                                 --context"
                            )));
                        }
                    }
                }
                sources.push(list);
            }
            let lists: Vec<&[u32]> = sources.iter().map(|v| &v[..]).collect();
            let mut t = side.send(&manifest, &lists).map_err(nixl_err)?;
            let since = Instant::now();
            while !side.poll(&mut t).map_err(nixl_err)? {
                if since.elapsed() > SILENCE {
                    return Err(CliError::failed(format!(
                        "the write of request {uid} did not complete in {} s",
                        SILENCE.as_secs()
                    )));
                }
                std::hint::spin_loop();
            }
            let secs = t.elapsed().map_or(f64::INFINITY, |e| e.as_secs_f64());
            send(output, &FromPrefill::Sent(uid, t.bytes(), secs)).map_err(io)?;
            coord
                .finish(uid)
                .map_err(|e| CliError::failed(e.to_string()))?;
        }
        match recv::<ToPrefill>(input, &mut line).map_err(rt_err("reading from the decode side"))? {
            ToPrefill::Done => {}
            _ => return Err(CliError::failed("the decode side spoke out of turn")),
        }
        drop(side);
        drop(staging);
        rt.drain()
            .map_err(|e| CliError::failed(format!("prefill runtime: {e}")))?;
        Ok(())
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use hisparse_backend_cpu::CpuDevice;
    use hisparse_core::Device;
    use hisparse_core::config::HiSparseConfig;
    use hisparse_core::layout::{LayoutInput, plan_layout};
    use hisparse_core::presets;

    /// Writes the synthetic rows of `m`'s tokens into its host blocks, as a prefill side would.
    fn import(
        dev: &CpuDevice,
        host: &mut <CpuDevice as Device>::HostBuffer,
        kv: &KvCacheConfig,
        m: &PageManifest,
    ) {
        let layers = &kv.groups[KvCacheConfig::SOURCE_GROUP].layers;
        for l in layers {
            let h = kv.host_layout(l.layer).unwrap();
            for pos in 0..m.tokens {
                let (page, r) = (pos / h.block_size, pos % h.block_size);
                let seed = kv::row_seed(m.request, l.layer, pos);
                let [(voff, vlen), (soff, slen)] = h.row_parts(m.host_blocks[page as usize], r);
                let mut v = vec![0u8; vlen as usize];
                kv::fill(seed, 0, &mut v);
                dev.write_pinned(host, voff as usize, &v).unwrap();
                if slen > 0 {
                    let mut s = vec![0u8; slen as usize];
                    kv::fill(seed, vlen as usize, &mut s);
                    dev.write_pinned(host, soff as usize, &s).unwrap();
                }
            }
        }
    }

    #[test]
    fn imported_rows_are_verified_and_a_wrong_byte_or_block_is_caught() {
        let model = presets::DEEPSEEK_V32;
        let two = hisparse_core::model::ModelSpec {
            layers: &model.layers[..2],
            ..model
        };
        let config = HiSparseConfig::new(model.top_k, 40 * 2 * 64 * 656);
        let mut input = LayoutInput::new(&two, &config, 0, 1024);
        input.num_gpu_blocks_override = Some(200);
        let kv = plan_layout(&input).unwrap();
        let dev = CpuDevice::new();
        let mut host = dev.alloc_pinned(kv.host_pool_bytes() as usize).unwrap();
        let m = PageManifest {
            request: 3,
            tokens: 100,
            host_blocks: vec![5, 2],
        };
        import(&dev, &mut host, &kv, &m);
        let mut v = ImportVerifier::new(&kv).unwrap();
        v.check(&dev, &host, &m).unwrap();
        assert_eq!((v.verified.rows, v.verified.mismatched), (2 * 100, 0));
        // One flipped byte of the last row of the second page, in the second layer.
        let h = kv
            .host_layout(kv.groups[KvCacheConfig::SOURCE_GROUP].layers[1].layer)
            .unwrap();
        let [(off, _), _] = h.row_parts(2, 99 - 64);
        let mut b = [0u8; 1];
        dev.read_pinned(&host, off as usize + 7, &mut b).unwrap();
        dev.write_pinned(&mut host, off as usize + 7, &[b[0] ^ 1])
            .unwrap();
        let mut v = ImportVerifier::new(&kv).unwrap();
        v.check(&dev, &host, &m).unwrap();
        assert_eq!(v.verified.mismatched, 1);
        assert!(
            v.verified
                .first_mismatch
                .as_deref()
                .unwrap()
                .contains("token row 99")
        );
        // Pages read from the wrong blocks: every row differs.
        let swapped = PageManifest {
            host_blocks: vec![2, 5],
            ..m
        };
        let mut v = ImportVerifier::new(&kv).unwrap();
        v.check(&dev, &host, &swapped).unwrap();
        assert_eq!(v.verified.mismatched, v.verified.rows);
    }
}
