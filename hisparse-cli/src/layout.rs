//! `hisparse layout`: the KV-cache plan a user would otherwise discover at engine start-up.

use hisparse_core::layout::{
    CapacityLimit, GroupKind, KvCacheConfig, KvCacheGroup, LayoutError, LayoutReport,
    LayoutWarning, capacity_contexts,
};
use hisparse_core::model::{ModelSpec, OwnedModel, RegularKind};
use hisparse_runtime::plan::{self as door, ArgNames, LayoutRequest, ModelSource};
use serde_json::json;

use crate::args::{self, LayoutArgs};
use crate::error::{CliError, CliResult};
use crate::size::human;

/// The model of `--model <file>` (JSON, see `--print-model`) or else of `--preset`, through the
/// runtime's planning door ([`hisparse_runtime::plan::model`]): validated, a refusal naming the
/// flag.
pub fn model(preset_name: &str, file: Option<&std::path::Path>) -> CliResult<OwnedModel> {
    let Some(path) = file else {
        return door::model(ModelSource::Preset(preset_name), None, &FLAG_NAMES)
            .map_err(|e| CliError::usage(e.message));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("--model {}: cannot read it: {e}", path.display())))?;
    let flag = format!("--model {}", path.display());
    let names = ArgNames {
        model: &flag,
        ..FLAG_NAMES
    };
    door::model(ModelSource::Json(&text), None, &names).map_err(|e| CliError::usage(e.message))
}

/// The command-line flags behind a plan's inputs, so that a planning error names only flags the
/// command has and what the user can change.
#[derive(Clone, Copy, Debug)]
pub struct PlanFlags<'a> {
    /// What sets the GPU budget: `--gpu-mem`, or what the default budget grows with.
    pub gpu: &'a str,
    /// What sets the host budget: `--host-mem`, or what the default budget grows with.
    pub host: &'a str,
    /// What sets the longest request: `--max-model-len`, or `--context + --decode-steps`.
    pub length: &'a str,
    /// What to lower for a shorter one: `--max-model-len`, or `--context or --decode-steps`.
    pub shorten: &'a str,
    /// What sets the tokens per step: `--max-query-len`, or `--spec-tokens`.
    pub query: &'a str,
}

/// The flags every planning command spells the same way.
const FLAG_NAMES: ArgNames<'static> = ArgNames {
    preset: "--preset",
    model: "--model",
    layers: "--layers",
    gpu_mem: "--gpu-mem",
    host_mem: "--host-mem",
    max_model_len: "--max-model-len",
    shorten: "--max-model-len",
    device_buffer_size: "--device-buffer-size",
    max_query_len: "--max-query-len",
    top_k: "--top-k",
    num_gpu_blocks: "--num-gpu-blocks",
};

impl<'a> PlanFlags<'a> {
    /// The runtime's argument names with these flags.
    fn names(&self) -> ArgNames<'a> {
        ArgNames {
            gpu_mem: self.gpu,
            host_mem: self.host,
            max_model_len: self.length,
            shorten: self.shorten,
            max_query_len: self.query,
            ..FLAG_NAMES
        }
    }
}

/// `hisparse layout`'s flags.
pub const LAYOUT_FLAGS: PlanFlags<'static> = PlanFlags {
    gpu: "--gpu-mem",
    host: "--host-mem",
    length: "--max-model-len",
    shorten: "--max-model-len",
    query: "--max-query-len",
};

/// Turns a planning error into a one-line message naming the command-line flag to change
/// ([`hisparse_runtime::plan::layout_message`]).
pub fn layout_error(e: LayoutError, flags: &PlanFlags<'_>) -> CliError {
    CliError::usage(door::layout_message(&e, &flags.names()))
}

/// A layout request for `model`'s own settings with these budgets and the longest request
/// (the rest as every front end defaults it: [`LayoutRequest::new`]).
pub fn request(gpu_bytes: u64, host_bytes: u64, max_model_len: u32) -> LayoutRequest<'static> {
    LayoutRequest {
        gpu_mem: gpu_bytes,
        host_mem: host_bytes,
        max_model_len,
        // The model is given to `plan` directly, not by name.
        ..LayoutRequest::new(ModelSource::Preset(""))
    }
}

/// Plans `req`'s budgets and settings for `model`; errors name the flags in `flags`.
pub fn plan(
    model: &ModelSpec<'_>,
    req: &LayoutRequest<'_>,
    flags: &PlanFlags<'_>,
) -> CliResult<KvCacheConfig> {
    door::plan_model(model, req).map_err(|e| layout_error(e, flags))
}

/// `hisparse layout`.
pub fn run(a: &LayoutArgs) -> CliResult<()> {
    let owned = model(&a.preset, a.model.as_deref())?;
    if a.print_model {
        crate::emit(&serde_json::to_string_pretty(&owned).unwrap_or_default());
        return Ok(());
    }
    let model = owned.as_spec();
    let gpu = args::size("gpu-mem", &a.gpu_mem)?;
    let host = args::size("host-mem", &a.host_mem)?;
    let max_len: u32 = args::positive("max-model-len", &a.max_model_len)?;
    let dbs = a
        .device_buffer_size
        .as_deref()
        .map(|s| args::positive::<u32>("device-buffer-size", s))
        .transpose()?;
    let mql: u32 = args::whole_in("max-query-len", &a.max_query_len, 1, 32768)?;
    let tp: u32 = args::whole_in("tp", &a.tp, 1, 64)?;
    if a.shared_host_pool && tp == 1 {
        return Err(CliError::usage(
            "--shared-host-pool shares one host pool between ranks; give --tp 2 or more",
        ));
    }
    let req = LayoutRequest {
        device_buffer_size: dbs,
        max_query_len: mql,
        shared_host_pool: a.shared_host_pool,
        ..request(gpu, host, max_len)
    };
    let kv = plan(&model, &req, &LAYOUT_FLAGS)?;
    let report = LayoutReport::new(&kv, gpu, host, tp, &capacity_contexts(max_len));
    if a.json {
        crate::emit(&to_json(&report));
    } else {
        crate::emit(&to_text(&model, &report, &LAYOUT_FLAGS));
    }
    Ok(())
}

/// Compact layer list: `0-11`, `0-3,5,8-9`.
pub fn ranges(layers: impl IntoIterator<Item = u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    let flush = |run: Option<(u32, u32)>, out: &mut Vec<String>| {
        if let Some((a, b)) = run {
            out.push(if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            });
        }
    };
    for l in layers {
        run = match run {
            Some((a, b)) if l == b + 1 => Some((a, l)),
            r => {
                flush(r, &mut out);
                Some((l, l))
            }
        };
    }
    flush(run, &mut out);
    out.join(",")
}

/// Layer offsets of a group: `0, 41984, … 461824 (+41984 each)` when evenly spaced. Source
/// layers are shown at their array's offset in the host pool ([`KvCacheConfig::host_layout`]), in
/// human units.
fn offsets(kv: &KvCacheConfig, g: &KvCacheGroup) -> String {
    let source = g.kind == GroupKind::Source;
    let o: Vec<u64> = g
        .layers
        .iter()
        .map(|l| match source {
            true => kv.host_layout(l.layer).map(|h| h.base).unwrap_or(l.offset),
            false => l.offset,
        })
        .collect();
    let f = |v: u64| {
        if source && v > 0 {
            human(v)
        } else {
            v.to_string()
        }
    };
    match o.as_slice() {
        [] => String::new(),
        [a] => f(*a),
        [a, b, rest @ ..] => {
            let step = b - a;
            let even = o.windows(2).all(|w| w[1] - w[0] == step);
            if even && !rest.is_empty() {
                format!(
                    "{}, {}, … {} (+{} each)",
                    f(*a),
                    f(*b),
                    f(o[o.len() - 1]),
                    f(step)
                )
            } else {
                o.iter().map(|&v| f(v)).collect::<Vec<_>>().join(", ")
            }
        }
    }
}

fn limit_text(l: CapacityLimit) -> &'static str {
    match l {
        CapacityLimit::Gpu => "GPU pool",
        CapacityLimit::Host => "host pool",
        CapacityLimit::AllOnGpu => "none (all fits on GPU)",
    }
}

fn tokens(t: u32) -> String {
    if t.is_multiple_of(1024) {
        format!("{}K", t / 1024)
    } else {
        t.to_string()
    }
}

/// The label of a group in the text report: its kind, or for a regular group what its caches
/// hold.
fn kind_label(g: &KvCacheGroup) -> &'static str {
    match (g.kind, g.cache) {
        (GroupKind::Regular, Some(RegularKind::SlidingWindow)) => "window",
        (GroupKind::Regular, Some(RegularKind::CompressorState)) => "state",
        (kind, _) => kind.as_str(),
    }
}

/// A plan's warning as one line naming the command-line flags to change.
pub fn warning_text(w: &LayoutWarning, flags: &PlanFlags<'_>) -> String {
    match *w {
        LayoutWarning::MaxModelLenPrefillNeverFits {
            max_model_len,
            needed_blocks,
            gpu_blocks,
            max_prefill_context,
            bytes_per_block,
        } => format!(
            "warning: a {length} {max_model_len}-token prompt cannot be prefilled: exact prefill \
             holds its whole context on the GPU ({needed_blocks} blocks) but the pool has \
             {gpu_blocks}; prompts up to {max_prefill_context} tokens prefill, longer ones are \
             refused (PrefillNeverFits); raise {gpu} to at least {} or lower {shorten} to \
             {max_prefill_context}",
            human((needed_blocks + 1).saturating_mul(bytes_per_block)),
            length = flags.length,
            gpu = flags.gpu,
            shorten = flags.shorten,
        ),
        other => format!("warning: {other}"),
    }
}

/// The plan as text; warnings name the flags in `flags`.
pub fn to_text(model: &ModelSpec<'_>, report: &LayoutReport<'_>, flags: &PlanFlags<'_>) -> String {
    let kv = report.layout;
    let (gpu, host, node) = (
        report.gpu_mem_bytes,
        report.host_mem_bytes,
        report.host_memory,
    );
    let mut s = String::new();
    let sparse = model.num_sparse_layers();
    let source_page = kv.groups[0].layers.first().map_or(0, |l| l.page_bytes);
    let raw_page = u64::from(kv.block_size) * u64::from(kv.row_bytes);
    s += &format!(
        "model {}: {} KV-cache tensors ({} sparse, {} regular), block {} tokens = {} rows of {} B{}, page {} B{}, top-k {}\n",
        kv.model,
        model.layers.len(),
        sparse,
        model.layers.len() - sparse,
        kv.block_tokens,
        kv.block_size,
        kv.row_bytes,
        if kv.value_bytes != kv.row_bytes {
            format!(
                " (split: {} value + {} scale)",
                kv.value_bytes,
                kv.row_bytes - kv.value_bytes
            )
        } else {
            String::new()
        },
        source_page,
        if source_page != raw_page {
            format!(" (padded to a multiple of {} B)", kv.page_alignment)
        } else {
            String::new()
        },
        kv.config.top_k,
    );
    s += &format!(
        "GPU pool:  {} → {} blocks × bytes_per_block {} B = {} (attention block stride {} rows)\n",
        human(gpu),
        kv.num_gpu_blocks,
        kv.bytes_per_block,
        human(kv.gpu_pool_bytes()),
        kv.attention_block_stride
    );
    s += &format!(
        "host pool: {} budget → {} blocks × host_block_stride {} B = {} (layer-major, pinned{})\n",
        human(host),
        kv.host_num_blocks,
        kv.host_block_stride,
        human(kv.host_pool_bytes()),
        if kv.shared_host_pool {
            "; shared by the ranks of a node: stride and layer arrays aligned to 4096 B"
        } else {
            ""
        }
    );
    let indexer_cache = kv.indexer_host_pool_bytes();
    if indexer_cache > 0 {
        // The runtime pins it beside the host pool (each rank its own), inside the host budget.
        s += &format!(
            "indexer host cache: {} ({} blocks × {} B of indexer pages: the indexer keys' backups, pinned by each runtime beside the host pool; the host budget holds both)\n",
            human(indexer_cache),
            kv.host_num_blocks,
            kv.indexer_page_bytes(),
        );
    }
    if node.tp > 1 {
        s += &format!(
            "host memory, tp {}: {} per rank, {} per node ({})\n",
            node.tp,
            human(node.per_rank),
            human(node.per_node),
            if node.shared {
                "one shared pool that every rank maps".to_string()
            } else {
                format!(
                    "{} pools, one per rank; --shared-host-pool pins one",
                    node.pools
                )
            }
        );
    }
    s += &format!(
        "hot buffer: {} rows per request per hot group = {} blocks; {} hot groups → {} blocks = {} per request\n",
        kv.device_buffer_size,
        kv.hot_blocks_per_request,
        kv.num_buckets,
        kv.hot_blocks_per_request * kv.num_buckets,
        human(u64::from(kv.hot_blocks_per_request * kv.num_buckets) * kv.bytes_per_block)
    );
    s += "\ngroups (offsets: GPU groups = byte offset inside a block; source = layer array in the host pool):\n";
    s += &format!(
        "  {:>2}  {:<8} {:>6} {:>6}  {:>10}  {:>5} {:>6}  {:<46}  layers\n",
        "#", "kind", "bucket", "count", "page bytes", "block", "window", "offsets"
    );
    for (i, g) in kv.groups.iter().enumerate() {
        s += &format!(
            "  {:>2}  {:<8} {:>6} {:>6}  {:>10}  {:>5} {:>6}  {:<46}  {}\n",
            i,
            kind_label(g),
            g.bucket
                .map(|b| b.to_string())
                .unwrap_or_else(|| "-".into()),
            g.layers.len(),
            g.page_bytes,
            g.block_tokens,
            g.sliding_window
                .map(|w| w.to_string())
                .unwrap_or_else(|| "-".into()),
            offsets(kv, g),
            ranges(g.layers.iter().map(|l| l.layer)),
        );
    }
    let followers = kv
        .index_groups
        .iter()
        .filter(|g| g.layers.len() > 1)
        .count();
    s += &format!(
        "index groups: {} ({} with followers); leaders {}\n",
        kv.index_groups.len(),
        followers,
        ranges(kv.index_groups.iter().map(|g| g.leader)),
    );
    s += "\ncapacity (concurrent requests that fit; prefill: whether one request's prefill, which holds its whole context on the GPU, fits the pool):\n";
    s += &format!(
        "  {:>7}  {:>10}  {:>10}  {:>16}  {:>16}  {:>10}  {:>7}  limited by\n",
        "context",
        "all-on-GPU",
        "HiSparse",
        "GPU blk/req all",
        "GPU blk/req HS",
        "host fits",
        "prefill"
    );
    for c in &report.capacity {
        s += &format!(
            "  {:>7}  {:>10}  {:>10}  {:>16}  {:>16}  {:>10}  {:>7}  {}\n",
            tokens(c.context_len),
            c.all_on_gpu_max,
            c.hisparse_max,
            c.gpu_blocks_per_request.all_on_gpu,
            c.gpu_blocks_per_request.hisparse,
            c.host_max,
            if c.prefill_fits { "fits" } else { "NO" },
            limit_text(c.limit)
        );
    }
    s += &format!(
        "longest prompt whose prefill fits: {} tokens (max_model_len {})\n",
        report.max_prefill_context, kv.max_model_len
    );
    for w in &report.warnings {
        s += &warning_text(w, flags);
        s += "\n";
    }
    s
}

/// The plan as JSON ([`LayoutReport`]: every field of the planned layout, plus the budgets, pool
/// sizes, the host memory of the node's ranks and the capacity table), keys sorted.
pub fn to_json(report: &LayoutReport<'_>) -> String {
    serde_json::to_value(report)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|e| json!({ "error": e.to_string() }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compress_runs() {
        assert_eq!(ranges([0, 1, 2, 3, 5, 8, 9]), "0-3,5,8-9");
        assert_eq!(ranges([]), "");
        assert_eq!(ranges([7]), "7");
    }

    #[test]
    fn deepseek_v32_vector() {
        let m = model("deepseek-v3.2", None).unwrap();
        let kv = plan(
            &m.as_spec(),
            &request(80 << 30, 512 << 30, 131072),
            &LAYOUT_FLAGS,
        )
        .unwrap();
        assert_eq!(kv.bytes_per_block, 545792);
        assert_eq!(kv.host_block_stride, 2561024);
        let report = LayoutReport::new(&kv, 0, 0, 1, &[]);
        let j: serde_json::Value = serde_json::from_str(&to_json(&report)).unwrap();
        for key in [
            "bytes_per_block",
            "host_block_stride",
            "hot_blocks_per_request",
            "num_gpu_blocks",
            "host_num_blocks",
            "groups",
        ] {
            assert!(j.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn small_host_budget_names_the_flag() {
        let m = model("deepseek-v3.2", None).unwrap();
        let e = plan(
            &m.as_spec(),
            &request(80 << 30, 1 << 30, 131072),
            &LAYOUT_FLAGS,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--host-mem") && !e.contains('\n'), "{e}");
        let e = model("llama", None).unwrap_err().to_string();
        assert!(e.contains("deepseek-v3.2") && e.contains("--preset"), "{e}");
    }
}
