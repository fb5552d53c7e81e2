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
//! 3. the prefill side writes the request's pages into those blocks, one NIXL write with a
//!    notification, and finishes the request once the write completed. `--pd-write pages`
//!    writes one descriptor per (layer, page) straight from its resident pages; `--pd-write
//!    packed` first gathers the pages on the prefill device into a staging buffer in the host
//!    pool's order (the backend's device copies) and writes one descriptor per layer and run of
//!    consecutive host blocks ([`hisparse_nixl::plan_packed_write`]); `--pd-write packed-host`
//!    copies them the same way into a pinned host staging buffer (the backend's device → host
//!    copies, one event waited for before the write is posted) and writes from host memory,
//!    with the same descriptors — GPU memory into another process's host memory has no
//!    zero-copy transport, host memory has one; `auto` is packed-host from GPU memory and page
//!    by page from host memory;
//! 4. the decode side, polling notifications between its decode steps (never waiting on them),
//!    matches the notification to its manifest, verifies every row of every imported page in its
//!    host pool against the synthetic rows, byte for byte, and completes the import
//!    (`Coordinator::complete_import`): the request starts with its pages durable on host and its
//!    tail page restored to the GPU, and decodes `--decode-steps` tokens, every row attention
//!    reads verified, while later requests are still being prefilled and written.
//!
//! Before the requests, the prefill side measures the transport's own figures in the same run:
//! plain NIXL writes of as many bytes into the decode host pool, best of three each: from host
//! memory, and, when the prefill pool is GPU memory, from a registered GPU buffer (the
//! transport of page-by-page and packed writes from it; packed-host writes go host → host);
//! each as one descriptor and as descriptors of [`BULK_DESCRIPTOR_BYTES`].

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

/// Bytes of one descriptor of the chunked bulk figure (2.5 MiB: the order of one layer's run of
/// a packed write).
#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
pub const BULK_DESCRIPTOR_BYTES: u64 = 5 << 19;

/// The most staging memory a packed write may take (one request's pages), before the device's
/// free memory is also checked.
#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
pub const STAGING_BUDGET_BYTES: u64 = 8 << 30;

/// Checks, before any staging memory is taken, that a packed write's `needed` bytes of
/// staging fit: at most [`STAGING_BUDGET_BYTES`] and half the memory the staging buffer comes
/// out of (`info`: the device's free memory for `packed`, the host's available memory for
/// `packed-host` and on a device whose memory is host memory; no limit when the backend cannot
/// tell). The error names the limit and what to change.
#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
pub fn check_staging(
    write: WriteLayout,
    needed: u64,
    info: Option<hisparse_core::MemoryInfo>,
) -> CliResult<()> {
    let on_host = write == WriteLayout::PackedHost;
    let free = info.map_or(u64::MAX, |m| {
        if m.unified || on_host {
            m.host_available
        } else {
            m.device_free
        }
    });
    hisparse_nixl::check_staging_budget(needed, STAGING_BUDGET_BYTES.min(free / 2)).map_err(|e| {
        CliError::usage(format!(
            "nixl: {e} (the {} staging of --pd-write {}; --pd-write pages writes without \
             staging; a shorter --context needs less)",
            if on_host { "pinned host" } else { "device" },
            write.name()
        ))
    })
}

/// How the prefill side writes a request (`--pd-write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "nixl", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "nixl", serde(rename_all = "kebab-case"))]
pub enum WriteLayout {
    /// One descriptor per (layer, page), straight from the prefill pool.
    Pages,
    /// Gathered on the prefill device into a device staging buffer in the host pool's order,
    /// then one descriptor per layer and run of consecutive host blocks.
    Packed,
    /// Gathered into a pinned host staging buffer laid out as [`WriteLayout::Packed`]'s (the
    /// backend's device → host copies), then written host → decode host pool with the same
    /// descriptors. GPU memory into another process's host memory has no zero-copy transport
    /// (UCX emulates those puts over TCP loopback); host → host memory has one.
    PackedHost,
}

impl WriteLayout {
    /// The layout `--pd-write` names for a prefill pool in GPU memory (`gpu_source`) or not.
    pub fn parse(flag: &str, gpu_source: bool) -> CliResult<Self> {
        match flag {
            "pages" => Ok(WriteLayout::Pages),
            "packed" => Ok(WriteLayout::Packed),
            "packed-host" => Ok(WriteLayout::PackedHost),
            "auto" if gpu_source => Ok(WriteLayout::PackedHost),
            "auto" => Ok(WriteLayout::Pages),
            other => Err(CliError::usage(format!(
                "--pd-write {other}: give packed-host, packed, pages or auto"
            ))),
        }
    }

    /// Its name in reports.
    #[cfg_attr(not(feature = "nixl"), allow(dead_code))]
    pub fn name(self) -> &'static str {
        match self {
            WriteLayout::Pages => "pages",
            WriteLayout::Packed => "packed",
            WriteLayout::PackedHost => "packed-host",
        }
    }

    /// The memory the NIXL writes read from, for a prefill pool in `source_memory` (`host` or
    /// `gpu`): the pool's, or its device staging buffer's (the same memory), or host memory
    /// for the pinned host staging buffer.
    #[cfg_attr(not(feature = "nixl"), allow(dead_code))]
    pub fn write_memory(self, source_memory: &str) -> &str {
        match self {
            WriteLayout::Pages | WriteLayout::Packed => source_memory,
            WriteLayout::PackedHost => "host",
        }
    }
}

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
    WriteLayout::parse(&a.pd_write, false)?;
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
        let write = WriteLayout::parse(&a.pd_write, kind != hisparse_runtime::BackendKind::Cpu)?;
        let report = nixl_sim::run(kind, &a.backend.device, s, prefill_kv, write)?;
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
        Arrival, DecodeOffer, DecodeSide, MemoryKind, PackedWrite, PoolGeometry, PrefillSide,
        Region, Transfer,
    };
    use hisparse_runtime::{
        AnyBuffer, AnyDevice, AnyHostBuffer, BackendKind, Runtime, RuntimeConfig, SharedHostPool,
        SharedSegment,
    };
    use serde::{Deserialize, Serialize};

    use super::super::engine::SimSetup;
    use super::super::forward::Forward;
    use super::super::rank::{DecodeRow, Rank};
    use super::super::tp::{recv, send};
    use super::{
        BULK_DESCRIPTOR_BYTES, ImportVerifier, PREFILL_SUBCOMMAND, PageManifest, WriteLayout,
        check_staging,
    };
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
        /// How requests are written.
        write: WriteLayout,
    }

    /// Where a bulk write reads from.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    enum BulkSource {
        /// Host memory of the prefill process.
        Host,
        /// Memory of the prefill side's device (GPU memory on a GPU backend).
        Device,
    }

    /// One bulk figure of the run.
    #[derive(Clone, Debug, Serialize)]
    pub struct BulkFigure {
        /// Memory written from: `host`, or `gpu` (a registered GPU buffer).
        pub source_memory: String,
        /// Descriptors of the write.
        pub descriptors: u64,
        /// Bytes of each descriptor (the last one may be shorter).
        pub descriptor_bytes: u64,
        /// Bytes written.
        pub bytes: u64,
        /// Best write's seconds, preparing to completion.
        pub seconds: f64,
        /// Throughput of the best write.
        pub gb_per_s: f64,
    }

    /// A message to the prefill process.
    #[derive(Serialize, Deserialize)]
    enum ToPrefill {
        /// A plain write of `bytes` from `source` in descriptors of `descriptor_bytes` (the
        /// transport's own figure).
        Bulk {
            bytes: u64,
            source: BulkSource,
            descriptor_bytes: u64,
        },
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
        /// A bulk write completed: (seconds, descriptors).
        BulkSent(f64, u64),
        /// A request's prompt is prefilled: (request, tokens).
        Prefilled(u64, u32),
        /// A request's write completed.
        Sent {
            /// Bytes written.
            bytes: u64,
            /// Seconds from preparing the write to its completion.
            seconds: f64,
            /// Descriptors of the write.
            descriptors: u64,
            /// Seconds of the packing copies before it (0 page by page).
            pack_seconds: f64,
        },
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
        /// How requests were written: `pages` (one descriptor per layer and page, from the
        /// pool), `packed` (gathered on the prefill device into a device staging buffer first)
        /// or `packed-host` (copied from the prefill device into a pinned host staging buffer
        /// first).
        pub write_layout: String,
        /// Memory the NIXL writes of the imports read from: `source_memory` for `pages` and
        /// `packed`, `host` for `packed-host` (its staging buffer).
        pub write_memory: String,
        /// NIXL writes (one per request).
        pub writes: u64,
        /// Descriptors per write (the mean over writes).
        pub descriptors_per_write: u64,
        /// Descriptors of all writes.
        pub descriptors: u64,
        /// Bytes imported.
        pub transfer_bytes: u64,
        /// Seconds of the imports' writes, posting to completion, summed.
        pub transfer_seconds: f64,
        /// Import throughput (the writes alone).
        pub transfer_gb_per_s: f64,
        /// Seconds of the packing copies, summed (0 page by page): device → device for
        /// `packed`, device → host (into the pinned staging buffer) for `packed-host`.
        pub pack_seconds: f64,
        /// Import throughput counting the packing: bytes over packing plus write seconds.
        pub transfer_with_pack_gb_per_s: f64,
        /// Bytes of the bulk writes.
        pub bulk_bytes: u64,
        /// Best host → host pool bulk write's seconds (one descriptor).
        pub bulk_seconds: f64,
        /// NIXL's own figure from host memory: one plain write of `bulk_bytes` from host memory
        /// into the decode host pool, one descriptor.
        pub bulk_gb_per_s: f64,
        /// Every bulk figure of the run (host memory; GPU memory when the prefill pool is on
        /// the GPU), one descriptor and chunked.
        pub bulk: Vec<BulkFigure>,
        /// The ceiling of the imports' own transport: the best bulk figure from the memory the
        /// imports' writes read from (`write_memory`: host → host pool for `packed-host`).
        pub same_transport_bulk_gb_per_s: f64,
        /// Which bulk figure that is.
        pub same_transport_bulk: String,
        /// `transfer_gb_per_s` over `same_transport_bulk_gb_per_s`.
        pub transfer_vs_same_transport: f64,
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
            let bulk: String = self
                .bulk
                .iter()
                .map(|f| {
                    format!(
                        "\nNIXL bulk (same run)    {:.3} GiB {} → decode host pool, {} \
                         descriptor{} of {} B: {:.2} GB/s (best of {BULK_REPEATS})",
                        gib(f.bytes),
                        f.source_memory,
                        f.descriptors,
                        if f.descriptors == 1 { "" } else { "s" },
                        f.descriptor_bytes,
                        f.gb_per_s
                    )
                })
                .collect();
            format!(
                "disaggregated {preset} on {backend}: prefill on {pdev} ({src} memory) → decode \
                 host pool on {dev}, over NIXL (UCX)\n\n\
                 imports                 {req} requests × {ctx} tokens = {pages} pages each, \
                 {layers} sparse layers; {writes} {layout} writes of {desc} descriptors from \
                 {wmem} memory\n\
                 transfer                {tb:.3} GiB in {ts:.3} s = {tg:.2} GB/s (posting to \
                 completion, summed over writes); with packing ({ps:.3} s) {tpg:.2} GB/s\
                 {bulk}\n\
                 same transport          {tr:.2} of the {same} figure ({sg:.2} GB/s)\n\
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
                layout = self.write_layout,
                wmem = self.write_memory,
                desc = self.descriptors_per_write,
                tb = gib(self.transfer_bytes),
                ts = self.transfer_seconds,
                tg = self.transfer_gb_per_s,
                ps = self.pack_seconds,
                tpg = self.transfer_with_pack_gb_per_s,
                tr = self.transfer_vs_same_transport,
                same = self.same_transport_bulk,
                sg = self.same_transport_bulk_gb_per_s,
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

        fn add_write(&mut self, bytes: u64, seconds: f64, descriptors: u64, pack_seconds: f64) {
            self.writes += 1;
            self.transfer_bytes += bytes;
            self.transfer_seconds += seconds;
            self.descriptors += descriptors;
            self.pack_seconds += pack_seconds;
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
        write: WriteLayout,
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
            write,
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
            write_layout: write.name().into(),
            ..PdReport::default()
        };
        report.write_memory = write.write_memory(&report.source_memory).into();

        // The transport's own figures, before any block is assigned (they overwrite the pool):
        // from host memory, and from the prefill device's memory when that is GPU memory (the
        // transport of pages and packed writes; host staging writes from host memory); one
        // descriptor, then descriptors of BULK_DESCRIPTOR_BYTES.
        let bulk = (per_request * u64::from(s.requests)).min(host_geometry.pool_bytes);
        let mut sources = vec![(BulkSource::Host, "host")];
        if report.source_memory == "gpu" {
            sources.push((BulkSource::Device, "gpu"));
        }
        for (source, memory) in sources {
            for descriptor_bytes in [bulk, BULK_DESCRIPTOR_BYTES.min(bulk)] {
                let (secs, descriptors) =
                    best_bulk(&mut prefill, &mut decode, bulk, source, descriptor_bytes)?;
                report.bulk.push(BulkFigure {
                    source_memory: memory.into(),
                    descriptors,
                    descriptor_bytes,
                    bytes: bulk,
                    seconds: secs,
                    gb_per_s: bulk as f64 / secs / 1e9,
                });
            }
        }
        report.bulk_bytes = bulk;
        report.bulk_seconds = report.bulk[0].seconds;
        report.bulk_gb_per_s = report.bulk[0].gb_per_s;
        if let Some(best) = report
            .bulk
            .iter()
            .filter(|f| f.source_memory == report.write_memory)
            .max_by(|a, b| a.gb_per_s.total_cmp(&b.gb_per_s))
        {
            report.same_transport_bulk_gb_per_s = best.gb_per_s;
            report.same_transport_bulk = format!(
                "{} → host pool, {} descriptor{}",
                best.source_memory,
                best.descriptors,
                if best.descriptors == 1 { "" } else { "s" }
            );
        }

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
                    FromPrefill::Sent {
                        bytes,
                        seconds,
                        descriptors,
                        pack_seconds,
                    } => {
                        sent += 1;
                        report.add_write(bytes, seconds, descriptors, pack_seconds);
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
                FromPrefill::Sent {
                    bytes,
                    seconds,
                    descriptors,
                    pack_seconds,
                } => {
                    sent += 1;
                    report.add_write(bytes, seconds, descriptors, pack_seconds);
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
        report.transfer_with_pack_gb_per_s =
            report.transfer_bytes as f64 / (report.transfer_seconds + report.pack_seconds) / 1e9;
        report.descriptors_per_write = report.descriptors / report.writes.max(1);
        if report.same_transport_bulk_gb_per_s > 0.0 {
            report.transfer_vs_same_transport =
                report.transfer_gb_per_s / report.same_transport_bulk_gb_per_s;
        }
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

    /// The best of [`BULK_REPEATS`] bulk writes of `bytes` from `source` in descriptors of
    /// `descriptor_bytes`, each announced to the decode side: (seconds, descriptors).
    fn best_bulk(
        prefill: &mut PrefillProcess,
        decode: &mut DecodeSide,
        bytes: u64,
        source: BulkSource,
        descriptor_bytes: u64,
    ) -> CliResult<(f64, u64)> {
        let (mut best, mut count) = (f64::INFINITY, 0);
        for _ in 0..BULK_REPEATS {
            prefill.send(&ToPrefill::Bulk {
                bytes,
                source,
                descriptor_bytes,
            })?;
            let (mut sent, mut landed) = (None, false);
            let since = Instant::now();
            while sent.is_none() || !landed {
                if let Some(m) = prefill.try_recv()? {
                    match m {
                        FromPrefill::BulkSent(secs, descriptors) => {
                            sent = Some(secs);
                            count = descriptors;
                        }
                        _ => return Err(CliError::failed("the prefill side answered out of turn")),
                    }
                }
                for a in decode.poll().map_err(nixl_err)? {
                    match a {
                        Arrival::Bulk { bytes: b } if b == bytes => landed = true,
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
        Ok((best, count))
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

    /// Polls `t` until it completed (its polls are what make it progress), at most [`SILENCE`].
    fn wait_for(side: &PrefillSide, t: &mut Transfer, what: &str) -> CliResult<()> {
        let since = Instant::now();
        while !side.poll(t).map_err(nixl_err)? {
            if since.elapsed() > SILENCE {
                return Err(CliError::failed(format!(
                    "{what} did not complete in {} s",
                    SILENCE.as_secs()
                )));
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// A packed write's staging buffer: on the prefill device, or pinned host memory.
    enum Staging {
        /// Device memory (`--pd-write packed`).
        Device(AnyBuffer),
        /// Pinned host memory (`--pd-write packed-host`).
        Host(AnyHostBuffer),
    }

    /// Fills `staging` with request `uid`'s pages as `plan` lays them out, on the runtime's
    /// copy stream, and returns once the copies completed: the seconds they took. Device
    /// staging waits for the stream; host staging records one event after the device → host
    /// copies and polls it (at most [`SILENCE`]).
    fn pack(
        rt: &Runtime<AnyDevice>,
        plan: &PackedWrite,
        staging: &mut Staging,
        uid: u64,
    ) -> CliResult<f64> {
        let what = "packing a request's pages";
        let packing = Instant::now();
        let (dev, pool, stream) = (rt.device(), &rt.pools().device, rt.copy_stream());
        match staging {
            Staging::Device(buf) => {
                for c in &plan.copies {
                    dev.copy_on_device(
                        stream,
                        pool,
                        c.src as usize,
                        buf,
                        c.dst as usize,
                        c.len as usize,
                    )
                    .map_err(|e| CliError::device(what, e))?;
                }
                dev.synchronize(stream)
                    .map_err(|e| CliError::device(what, e))?;
            }
            Staging::Host(buf) => {
                for c in &plan.copies {
                    dev.copy_to_host(
                        stream,
                        pool,
                        c.src as usize,
                        buf,
                        c.dst as usize,
                        c.len as usize,
                    )
                    .map_err(|e| CliError::device(what, e))?;
                }
                let copied = dev
                    .record_event(stream)
                    .map_err(|e| CliError::device(what, e))?;
                while !dev
                    .query_event(&copied)
                    .map_err(|e| CliError::device(what, e))?
                {
                    if packing.elapsed() > SILENCE {
                        return Err(CliError::failed(format!(
                            "the device → host staging copies of request {uid} did not complete \
                             in {} s",
                            SILENCE.as_secs()
                        )));
                    }
                    std::hint::spin_loop();
                }
            }
        }
        Ok(packing.elapsed().as_secs_f64())
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
        // Registered memory besides the pool, declared before `side` so that it is dropped
        // (freed) only after the side (its registrations) is: the bulk writes' host and device
        // sources, and the packed writes' staging buffer.
        let mut host_bulk: Vec<u64> = Vec::new();
        let mut device_bulk: Option<(AnyBuffer, Region)> = None;
        let mut staging: Option<(Staging, Region)> = None;
        let staging_needed = match h.write {
            WriteLayout::Packed | WriteLayout::PackedHost => {
                // The budget is checked before any staging memory is taken: the device's free
                // memory for device staging, the host's available memory for pinned host
                // staging (alloc_pinned then also checks the pinned share of RAM).
                let needed = hisparse_nixl::staging_bytes_for(&h.offer.geometry, s.context);
                check_staging(h.write, needed, rt.device().memory_info())?;
                needed
            }
            WriteLayout::Pages => 0,
        };
        // SAFETY: the GPU pool belongs to `rt`, which outlives `side` (dropped explicitly
        // before it below); a request's pages are not written, and its blocks not handed to
        // another request, until its write completed (one request at a time, the coordinator
        // not stepped while a write is in flight).
        let mut side = unsafe { PrefillSide::new(&name, local, geometry, h.offer.clone()) }
            .map_err(nixl_err)?;
        if staging_needed > 0 {
            let (buf, r) = if h.write == WriteLayout::PackedHost {
                let buf = rt
                    .device()
                    .alloc_pinned(staging_needed as usize)
                    .map_err(|e| CliError::device("allocating the host staging buffer", e))?;
                let r = region(
                    rt.device().pinned_address(&buf) as u64,
                    buf.byte_len(),
                    MemoryKind::Host,
                );
                (Staging::Host(buf), r)
            } else {
                let buf = rt
                    .device()
                    .alloc(staging_needed as usize)
                    .map_err(|e| CliError::device("allocating the staging buffer", e))?;
                let r = pool_region(&buf, ordinal)?;
                (Staging::Device(buf), r)
            };
            // SAFETY: `staging` outlives `side` (declared before it); the buffer is written only
            // by the packing copies of a request before its write is posted, and not again until
            // that write completed.
            unsafe { side.register(r) }.map_err(nixl_err)?;
            staging = Some((buf, r));
        }
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
                ToPrefill::Bulk {
                    bytes,
                    source,
                    descriptor_bytes,
                } => {
                    let src = match source {
                        BulkSource::Host => {
                            if host_bulk.is_empty() {
                                host_bulk = (0..bytes.div_ceil(8))
                                    .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                                    .collect();
                                let r = region(
                                    host_bulk.as_ptr() as u64,
                                    host_bulk.len() as u64 * 8,
                                    MemoryKind::Host,
                                );
                                // SAFETY: `host_bulk` is dropped after `side` and never written
                                // again (a later bulk write of more bytes is refused below).
                                unsafe { side.register(r) }.map_err(nixl_err)?;
                            }
                            region(
                                host_bulk.as_ptr() as u64,
                                host_bulk.len() as u64 * 8,
                                MemoryKind::Host,
                            )
                        }
                        BulkSource::Device => match &device_bulk {
                            Some((_, r)) => *r,
                            None => {
                                // Its bytes are the allocation's zeros: the figure measures the
                                // transport, nothing reads what it wrote.
                                let buf = rt.device().alloc(bytes as usize).map_err(|e| {
                                    CliError::device("allocating the bulk write's source", e)
                                })?;
                                let r = pool_region(&buf, ordinal)?;
                                // SAFETY: `device_bulk` is dropped after `side`; nothing writes
                                // the buffer while it is registered.
                                unsafe { side.register(r) }.map_err(nixl_err)?;
                                device_bulk = Some((buf, r));
                                r
                            }
                        },
                    };
                    if bytes > src.len {
                        return Err(CliError::failed("bulk writes of growing sizes"));
                    }
                    let mut t = side.bulk(&src, bytes, descriptor_bytes).map_err(nixl_err)?;
                    wait_for(&side, &mut t, "the bulk write")?;
                    let secs = t.elapsed().map_or(f64::INFINITY, |e| e.as_secs_f64());
                    send(output, &FromPrefill::BulkSent(secs, t.descriptors())).map_err(io)?;
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
            let (mut t, pack_seconds) = match &mut staging {
                None => (side.send(&manifest, &lists).map_err(nixl_err)?, 0.0),
                Some((buf, r)) => {
                    let plan = side
                        .plan_packed(&manifest, &lists, r.len)
                        .map_err(nixl_err)?;
                    let pack_seconds = pack(&rt, &plan, buf, uid)?;
                    (side.send_packed(r, &plan).map_err(nixl_err)?, pack_seconds)
                }
            };
            wait_for(&side, &mut t, &format!("the write of request {uid}"))?;
            let secs = t.elapsed().map_or(f64::INFINITY, |e| e.as_secs_f64());
            send(
                output,
                &FromPrefill::Sent {
                    bytes: t.bytes(),
                    seconds: secs,
                    descriptors: t.descriptors(),
                    pack_seconds,
                },
            )
            .map_err(io)?;
            coord
                .finish(uid)
                .map_err(|e| CliError::failed(e.to_string()))?;
        }
        match recv::<ToPrefill>(input, &mut line).map_err(rt_err("reading from the decode side"))? {
            ToPrefill::Done => {}
            _ => return Err(CliError::failed("the decode side spoke out of turn")),
        }
        drop(side);
        drop((host_bulk, device_bulk, staging));
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
    fn write_layouts_parse_and_auto_stages_through_host_only_from_gpu_memory() {
        assert_eq!(
            WriteLayout::parse("auto", true).unwrap(),
            WriteLayout::PackedHost
        );
        assert_eq!(
            WriteLayout::parse("auto", false).unwrap(),
            WriteLayout::Pages
        );
        for gpu in [false, true] {
            assert_eq!(
                WriteLayout::parse("pages", gpu).unwrap(),
                WriteLayout::Pages
            );
            assert_eq!(
                WriteLayout::parse("packed", gpu).unwrap(),
                WriteLayout::Packed
            );
            assert_eq!(
                WriteLayout::parse("packed-host", gpu).unwrap(),
                WriteLayout::PackedHost
            );
        }
        let e = WriteLayout::parse("bulk", true).unwrap_err().to_string();
        assert!(e.contains("packed-host, packed, pages or auto"), "{e}");
        assert_eq!(WriteLayout::Packed.name(), "packed");
        assert_eq!(WriteLayout::PackedHost.name(), "packed-host");
        // Packed host staging writes from host memory whatever the pool's memory is.
        assert_eq!(WriteLayout::PackedHost.write_memory("gpu"), "host");
        assert_eq!(WriteLayout::Packed.write_memory("gpu"), "gpu");
        assert_eq!(WriteLayout::Pages.write_memory("host"), "host");
    }

    #[test]
    fn staging_is_checked_against_the_memory_it_comes_out_of() {
        let info = |device_free: u64, host_available: u64, unified: bool| {
            Some(hisparse_core::MemoryInfo {
                device_free,
                host_available,
                unified,
            })
        };
        let gib = 1u64 << 30;
        // Plenty of host memory, little device memory: only host staging fits.
        let lean_gpu = info(gib, 64 * gib, false);
        check_staging(WriteLayout::PackedHost, gib, lean_gpu).unwrap();
        let e = check_staging(WriteLayout::Packed, gib, lean_gpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("staging") && e.contains("device"), "{e}");
        // And the other way round.
        let lean_host = info(64 * gib, gib, false);
        check_staging(WriteLayout::Packed, gib, lean_host).unwrap();
        let e = check_staging(WriteLayout::PackedHost, gib, lean_host)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pinned host") && e.contains("packed-host"),
            "{e}"
        );
        // Device memory that is host memory: both draw on the host's.
        let unified = info(64 * gib, gib, true);
        assert!(check_staging(WriteLayout::Packed, gib, unified).is_err());
        // The fixed cap holds even when the backend cannot tell its free memory.
        check_staging(WriteLayout::PackedHost, STAGING_BUDGET_BYTES, None).unwrap();
        assert!(check_staging(WriteLayout::PackedHost, STAGING_BUDGET_BYTES + 1, None).is_err());
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
