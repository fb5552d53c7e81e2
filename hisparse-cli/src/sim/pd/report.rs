//! What `simulate --pd nixl` reports: the imports' transfer, the bulk figures of the same run
//! and the verification, as text or JSON.

use serde::Serialize;

use super::protocol::BULK_REPEATS;
use crate::error::{CliError, CliResult};

/// One bulk figure of the run.
#[derive(Clone, Debug, Serialize)]
pub(super) struct BulkFigure {
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

/// What `simulate --pd nixl` reports.
#[derive(Debug, Default, Serialize)]
pub(super) struct PdReport {
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

    pub(super) fn add_write(
        &mut self,
        bytes: u64,
        seconds: f64,
        descriptors: u64,
        pack_seconds: f64,
    ) {
        self.writes += 1;
        self.transfer_bytes += bytes;
        self.transfer_seconds += seconds;
        self.descriptors += descriptors;
        self.pack_seconds += pack_seconds;
    }

    /// Prints the report; fails when any row mismatched or none was verified.
    pub(super) fn publish(&self, json: bool) -> CliResult<()> {
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
