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

/// How the prefill side writes a request (`--pd-write`): the library's layouts.
pub use hisparse_nixl::WriteLayout;

/// The layout `--pd-write` names for a prefill pool in GPU memory (`gpu_source`) or not
/// (`auto`: the fastest from that memory, [`WriteLayout::fastest_for`]).
pub fn write_layout(flag: &str, gpu_source: bool) -> CliResult<WriteLayout> {
    match flag {
        "pages" => Ok(WriteLayout::Pages),
        "packed" => Ok(WriteLayout::Packed),
        "packed-host" => Ok(WriteLayout::PackedHost),
        "auto" => Ok(WriteLayout::fastest_for(gpu_source)),
        other => Err(CliError::usage(format!(
            "--pd-write {other}: give packed-host, packed, pages or auto"
        ))),
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
    write_layout(&a.pd_write, false)?;
    let one_pair = "runs one prefill and one decode process";
    for (set, flag, why) in [
        (s.tp > 1, "--tp", one_pair),
        (s.workers > 1, "--workers", one_pair),
        (s.import, "--import", "imports every request already"),
        (s.prefix_on_host, "--prefix-on-host", "shares no prefix"),
        (s.shared_prefix > 0, "--shared-prefix", "shares no prefix"),
        (s.spec_tokens > 0, "--spec-tokens", one_pair),
        (a.plot.is_some(), "--plot", one_pair),
    ] {
        if set {
            return Err(CliError::usage(format!("--pd nixl {why}; drop {flag}")));
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
        let write = write_layout(&a.pd_write, kind != hisparse_runtime::BackendKind::Cpu)?;
        let report = decode::run(
            kind,
            &a.backend.device,
            a.pd_prefill_device.as_deref(),
            s,
            prefill_kv,
            write,
        )?;
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
        prefill::prefill_main()
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
    let req = hisparse_runtime::plan::LayoutRequest {
        device_buffer_size: Some(kv.device_buffer_size),
        max_query_len: kv.config.max_query_len,
        ..crate::layout::request(
            blocks.saturating_mul(kv.bytes_per_block),
            kv.host_pool_bytes(),
            kv.max_model_len,
        )
    };
    let mut out = hisparse_runtime::plan::plan_model(&m.as_spec(), &req).map_err(|e| {
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
mod decode;
#[cfg(feature = "nixl")]
mod imports;
#[cfg(feature = "nixl")]
mod prefill;
#[cfg(feature = "nixl")]
mod protocol;
#[cfg(feature = "nixl")]
mod report;

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use hisparse_core::Device;
    use hisparse_core::config::HiSparseConfig;
    use hisparse_core::layout::{LayoutInput, plan_layout};
    use hisparse_core::presets;
    use hisparse_runtime::{AnyDevice, BackendKind};

    /// Writes the synthetic rows of `m`'s tokens into its host blocks, as a prefill side would.
    fn import(
        dev: &AnyDevice,
        host: &mut <AnyDevice as Device>::HostBuffer,
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
        assert_eq!(write_layout("auto", true).unwrap(), WriteLayout::PackedHost);
        assert_eq!(write_layout("auto", false).unwrap(), WriteLayout::Pages);
        for gpu in [false, true] {
            assert_eq!(write_layout("pages", gpu).unwrap(), WriteLayout::Pages);
            assert_eq!(write_layout("packed", gpu).unwrap(), WriteLayout::Packed);
            assert_eq!(
                write_layout("packed-host", gpu).unwrap(),
                WriteLayout::PackedHost
            );
        }
        let e = write_layout("bulk", true).unwrap_err().to_string();
        assert!(e.contains("packed-host, packed, pages or auto"), "{e}");
        assert_eq!(WriteLayout::Packed.name(), "packed");
        assert_eq!(WriteLayout::PackedHost.name(), "packed-host");
        // Packed host staging writes from host memory whatever the pool's memory is.
        assert_eq!(WriteLayout::PackedHost.write_memory("gpu"), "host");
        assert_eq!(WriteLayout::Packed.write_memory("gpu"), "gpu");
        assert_eq!(WriteLayout::Pages.write_memory("host"), "host");
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
        let dev = AnyDevice::open(BackendKind::Cpu, "").unwrap();
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
