//! Command-line arguments (clap derive).
//!
//! Values are taken as text and validated by the commands themselves, so every bad value gives
//! one line that says what to change (clap's own multi-line reports are folded in `main`).

use clap::{Args, Parser, Subcommand};

/// HiSparse: hierarchical sparse-attention KV cache — plan layouts, simulate decoding on a
/// backend, check a backend's conformance, and benchmark its operations.
#[derive(Debug, Parser)]
#[command(name = "hisparse", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Plan the KV cache: groups, block sizes, pool sizes and how many requests fit.
    Layout(LayoutArgs),
    /// Drive the real coordinator and device operations through prefill and decode, verifying
    /// every row attention reads.
    Simulate(Box<SimulateArgs>),
    /// Run the conformance suite against a backend.
    Conformance(ConformanceArgs),
    /// Measure device operations beside the bandwidth ceilings of the same device.
    Bench(BenchArgs),
    /// A rank of `simulate --tp N` (started by it; reads its instructions on stdin).
    #[command(name = "simulate-rank", hide = true)]
    SimulateRank,
    /// The prefill side of `simulate --pd nixl` (started by it; reads its instructions on stdin).
    #[command(name = "simulate-prefill", hide = true)]
    SimulatePrefill,
}

/// Backend selection shared by the device commands.
#[derive(Debug, Args, Clone)]
pub struct BackendArgs {
    /// Backend: cpu, cuda, vulkan or rocm (each must be compiled in as a Cargo feature).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Device selector: an ordinal for cuda/rocm; index or name substring for vulkan.
    #[arg(long, default_value = "")]
    pub device: String,
}

/// `hisparse layout`.
#[derive(Debug, Args)]
pub struct LayoutArgs {
    /// Model preset (deepseek-v3.2, glm-5, deepseek-v4).
    #[arg(long, default_value = "deepseek-v3.2")]
    pub preset: String,
    /// A model described in a JSON file instead of a preset (`--print-model` writes a template).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Print the model (the preset or `--model`) as JSON and exit: a template for `--model`.
    #[arg(long)]
    pub print_model: bool,
    /// GPU memory given to the KV cache (e.g. 80GiB).
    #[arg(long, allow_hyphen_values = true, default_value = "80GiB")]
    pub gpu_mem: String,
    /// Pinned host memory budget (e.g. 512GiB).
    #[arg(long, allow_hyphen_values = true, default_value = "512GiB")]
    pub host_mem: String,
    /// Longest request, in tokens.
    #[arg(long, allow_negative_numbers = true, default_value = "131072")]
    pub max_model_len: String,
    /// Hot rows per request per hot group (default (max_query_len + 1) × top_k).
    #[arg(long, allow_negative_numbers = true)]
    pub device_buffer_size: Option<String>,
    /// Tokens per decode step per request (1 + speculative tokens).
    #[arg(long, allow_negative_numbers = true, default_value = "1")]
    pub max_query_len: String,
    /// Tensor-parallel ranks of a node: the host memory they take, per rank and per node.
    #[arg(long, allow_negative_numbers = true, default_value = "1")]
    pub tp: String,
    /// With --tp: one pinned host pool in shared memory for every rank of the node (host stride
    /// and layer arrays aligned to 4096 B) instead of one per rank.
    #[arg(long)]
    pub shared_host_pool: bool,
    /// Emit JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `hisparse simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Backend and device.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Model preset (deepseek-v3.2, glm-5, deepseek-v4).
    #[arg(long, default_value = "deepseek-v3.2")]
    pub preset: String,
    /// A model described in a JSON file instead of a preset (see `hisparse layout --print-model`).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Keep only the first N layers of the preset (0 = all): a smaller model, same geometry.
    #[arg(long, allow_negative_numbers = true, default_value = "0")]
    pub layers: String,
    /// Concurrent requests.
    #[arg(long, allow_negative_numbers = true, default_value = "4")]
    pub requests: String,
    /// Prompt length of each request, in tokens.
    #[arg(long, allow_negative_numbers = true, default_value = "8192")]
    pub context: String,
    /// Decode steps after prefill.
    #[arg(long, allow_negative_numbers = true, default_value = "48")]
    pub decode_steps: String,
    /// GPU memory for the KV cache (default: small enough that pages are reclaimed).
    #[arg(long, allow_hyphen_values = true)]
    pub gpu_mem: Option<String>,
    /// Pinned host memory budget (default: what the requests need, with headroom).
    #[arg(long, allow_hyphen_values = true)]
    pub host_mem: Option<String>,
    /// Hot rows per request per hot group (default (1 + spec tokens + 1) × top_k).
    #[arg(long, allow_negative_numbers = true)]
    pub device_buffer_size: Option<String>,
    /// Speculative tokens per decode step: each step computes the sampled token and this many
    /// drafts; the drafts the verifier rejects are rolled back (0 = none).
    #[arg(long, allow_negative_numbers = true, default_value = "0")]
    pub spec_tokens: String,
    /// With --spec-tokens: the chance that each draft is accepted (the first rejection rejects
    /// the drafts after it too), 0..=1.
    #[arg(long, allow_negative_numbers = true, default_value = "0.7")]
    pub accept_rate: String,
    /// Seed of the synthetic workload.
    #[arg(long, allow_negative_numbers = true, default_value = "1")]
    pub seed: String,
    /// Target share of top-k entries kept between adjacent decode steps (0..=1).
    #[arg(long, allow_negative_numbers = true, default_value = "0.9")]
    pub overlap: String,
    /// Tokens computed per step (prefill chunks + decode tokens).
    #[arg(long, allow_negative_numbers = true, default_value = "2048")]
    pub chunk: String,
    /// Cut each decode step's per-layer calls into N micro-batch calls, each over whole
    /// requests with its own state rows, on a side stream the runtime orders end_step after
    /// (how an engine overlaps one micro-batch's swap-in with other work); 1 = one call per
    /// group.
    #[arg(long, allow_negative_numbers = true, default_value = "1")]
    pub micro_batches: String,
    /// Turn eager row mirroring off: sealed pages go to host as whole-page spills (page backups)
    /// instead of row mirrors as rows are written.
    #[arg(long)]
    pub no_eager_mirror: bool,
    /// Prompt tokens every request shares: turns prefix caching on and admits requests one after
    /// another, so later ones read the prefix from the host prefix cache (0 = none).
    #[arg(long, allow_negative_numbers = true, default_value = "0")]
    pub shared_prefix: String,
    /// Tensor-parallel workers reporting each copy batch; worker w reports completion w + 1 steps
    /// after the batch was issued.
    #[arg(long, allow_negative_numbers = true, default_value = "1")]
    pub workers: String,
    /// Tensor-parallel ranks: N worker processes, each with its own runtime (on GPU r of a
    /// multi-GPU machine, all on one device otherwise), every row verified in every rank.
    #[arg(long, allow_negative_numbers = true, default_value = "1")]
    pub tp: String,
    /// With --tp: one pinned host pool in shared memory for every rank of the node (rank 0
    /// writes it, every rank reads it) instead of one per rank.
    #[arg(long)]
    pub shared_host_pool: bool,
    /// Requests arrive with their prompt's KV imported: written into the host pool (as a
    /// prefill node would) before they start, then decoded, every row verified.
    #[arg(long)]
    pub import: bool,
    /// A shared prefix (--shared-prefix N, or half the context when not given) whose pages are
    /// on host only: a first request prefills it and finishes, the GPU copies of its pages are
    /// dropped, then the other requests hit the prefix on host and their prefill chunks read it
    /// staged on the GPU, every prefill row verified.
    #[arg(long)]
    pub prefix_on_host: bool,
    /// Disaggregated prefill -> decode over this transport (nixl): a prefill process writes each
    /// request's pages into this process's host pool, every imported row verified.
    #[arg(long)]
    pub pd: Option<String>,
    /// With --pd: how the prefill side writes a request: packed-host (its pages copied from
    /// the prefill device into a pinned host staging buffer in the host pool's order, then
    /// written from host memory, one descriptor per layer and run of consecutive host blocks),
    /// packed (the same gathering into a staging buffer on the prefill device, written from
    /// device memory), pages (one descriptor per layer and page, straight from its pool), or
    /// auto (packed-host from GPU memory, pages from host memory).
    #[arg(long, default_value = "auto")]
    pub pd_write: String,
    /// With --pd: the prefill side's device (the same selector as --device; default: the decode
    /// side's --device), so prefill and decode run on two GPUs of one machine.
    #[arg(long)]
    pub pd_prefill_device: Option<String>,
    /// Emit JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG of hit rate and transferred bytes per step to this file.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// `hisparse conformance`.
#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// Backend and device.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Run only cases whose name contains this text.
    pub filter: Option<String>,
}

/// `hisparse bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend and device.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Emit JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Measured repetitions per figure (the median is reported).
    #[arg(long, allow_negative_numbers = true, default_value = "10")]
    pub iters: String,
    /// Measure host pools of these sizes instead (comma-separated, e.g. `8GiB,32GiB,64GiB`):
    /// set-up and release of the backend's own pool, of an ordinary array lent to it and of a
    /// shared segment, beside the same run's memset of as many bytes.
    #[arg(long, value_name = "SIZES")]
    pub host_pool: Option<String>,
    /// With --host-pool: how a GPU driver registers a pool — `chunks` (in parallel, where the
    /// device reaches registered memory at its host address) or `whole` (one registration after
    /// a parallel touch).
    #[arg(long, value_name = "HOW", default_value = "chunks")]
    pub registration: String,
    /// With --host-pool: the pools' pages — `transparent` (2 MiB transparent huge pages where
    /// the kernel allows), `explicit` (the hugetlbfs pool), `explicit-if-free` or `off`.
    #[arg(long, value_name = "PAGES", default_value = "transparent")]
    pub huge_pages: String,
    /// With --host-pool: threads that set a pool up (default: one per CPU of the GPU's NUMA
    /// node, or of this process).
    #[arg(long, value_name = "N")]
    pub threads: Option<String>,
}

/// Refuses a command line in which a flag would do nothing — a choice for a mode not asked for,
/// a flag another replaces, a planning flag of a command that plans nothing — with one line
/// naming it and what to change. Only flags given on the command line count (defaults do
/// nothing by themselves); a value that does not parse is left to the command's own message.
pub fn refuse_idle_flags(m: &clap::ArgMatches) -> crate::error::CliResult<()> {
    use clap::parser::ValueSource;
    let Some((command, sub)) = m.subcommand() else {
        return Ok(());
    };
    let given = |id: &str| {
        sub.try_get_raw(id).is_ok_and(|v| v.is_some())
            && sub.value_source(id) == Some(ValueSource::CommandLine)
    };
    let value = |id: &str| {
        sub.try_get_one::<String>(id)
            .ok()
            .flatten()
            .map(|v| v.trim().to_string())
    };
    let flag = |id: &str| format!("--{}", id.replace('_', "-"));
    let mut idle: Vec<String> = Vec::new();
    if given("preset") && given("model") {
        idle.push(
            "--preset and --model both given: the model file replaces the preset; drop --preset"
                .into(),
        );
    }
    if given("device") && value("backend").as_deref() == Some("cpu") {
        idle.push(
            "--device chooses among a GPU backend's devices, and the cpu backend has one; drop --device or give --backend cuda, vulkan or rocm"
                .into(),
        );
    }
    match command {
        "simulate" => {
            if given("pd_write") && !given("pd") {
                idle.push(
                    "--pd-write says how the prefill side of --pd writes, and no --pd was given; give --pd nixl or drop --pd-write"
                        .into(),
                );
            }
            if given("pd_prefill_device") && !given("pd") {
                idle.push(
                    "--pd-prefill-device chooses the prefill side's device of --pd, and no --pd was given; give --pd nixl or drop --pd-prefill-device"
                        .into(),
                );
            }
            let drafts = value("spec_tokens").and_then(|v| v.parse::<u64>().ok());
            if given("accept_rate") && drafts == Some(0) {
                idle.push(
                    "--accept-rate is the chance that a draft of --spec-tokens is accepted, and there are no drafts; give --spec-tokens 1 or more, or drop --accept-rate"
                        .into(),
                );
            }
        }
        "layout" if given("print_model") => {
            let planning = [
                "gpu_mem",
                "host_mem",
                "max_model_len",
                "device_buffer_size",
                "max_query_len",
                "tp",
                "shared_host_pool",
                "json",
            ];
            if let Some(id) = planning.into_iter().find(|id| given(id)) {
                idle.push(format!(
                    "--print-model prints the model (as JSON) and plans nothing, so {} does nothing; drop {}",
                    flag(id),
                    flag(id)
                ));
            }
        }
        _ => {}
    }
    match idle.into_iter().next() {
        Some(line) => Err(crate::error::CliError::usage(line)),
        None => Ok(()),
    }
}

/// A whole-number type a flag takes, with its range for the messages.
pub trait Whole: std::str::FromStr + Copy + TryFrom<i128> + std::fmt::Display {
    /// The largest value.
    const MAX: Self;
}

impl Whole for u32 {
    const MAX: Self = u32::MAX;
}

impl Whole for u64 {
    const MAX: Self = u64::MAX;
}

impl Whole for usize {
    const MAX: Self = usize::MAX;
}

/// Parses a whole number given to `--flag`, at least `min` and at most `max`; the message of
/// a bad one gives the range (`--context 99999999999` is out of range, not "not a number").
pub fn whole_in<T: Whole + PartialOrd>(
    flag: &str,
    text: &str,
    min: T,
    max: T,
) -> crate::error::CliResult<T> {
    let range = || format!("give a whole number from {min} to {max}");
    let clean: String = text.trim().chars().filter(|&c| c != '_').collect();
    let v: i128 = clean.parse().map_err(|_| {
        let what = if clean.parse::<f64>().is_ok() {
            "is not a whole number"
        } else {
            "is not a number"
        };
        crate::error::CliError::usage(format!("--{flag} `{text}` {what}; {}", range()))
    })?;
    let v = T::try_from(v)
        .ok()
        .filter(|v| *v >= min && *v <= max)
        .ok_or_else(|| {
            crate::error::CliError::usage(format!("--{flag} {text} is out of range; {}", range()))
        })?;
    Ok(v)
}

/// Parses a whole number given to `--flag` (0 allowed).
pub fn number<T: Whole + PartialOrd + From<u8>>(
    flag: &str,
    text: &str,
) -> crate::error::CliResult<T> {
    whole_in(flag, text, T::from(0), T::MAX)
}

/// Parses a whole number given to `--flag` that must be at least 1.
pub fn positive<T: Whole + PartialOrd + From<u8>>(
    flag: &str,
    text: &str,
) -> crate::error::CliResult<T> {
    whole_in(flag, text, T::from(1), T::MAX)
}

/// Parses a decimal number given to `--flag` that must lie in `min..=max`.
pub fn decimal_in(flag: &str, text: &str, min: f64, max: f64) -> crate::error::CliResult<f64> {
    let v: f64 = text.trim().parse().map_err(|_| {
        crate::error::CliError::usage(format!(
            "--{flag} `{text}` is not a number; give one from {min} to {max}"
        ))
    })?;
    if !(min..=max).contains(&v) {
        return Err(crate::error::CliError::usage(format!(
            "--{flag} {text} is out of range; give a number from {min} to {max}"
        )));
    }
    Ok(v)
}

/// Parses a byte size given to `--flag`; zero and negative sizes are refused.
pub fn size(flag: &str, text: &str) -> crate::error::CliResult<u64> {
    if text.trim().starts_with('-') {
        return Err(crate::error::CliError::usage(format!(
            "--{flag} `{text}` is negative; give a size such as 80GiB"
        )));
    }
    let v = crate::size::parse_size(text)
        .map_err(|e| crate::error::CliError::usage(format!("--{flag}: {e}")))?;
    if v == 0 {
        return Err(crate::error::CliError::usage(format!(
            "--{flag} must be greater than 0; give a size such as 80GiB"
        )));
    }
    Ok(v)
}

/// Parses the backend name of `--backend`.
pub fn backend(text: &str) -> crate::error::CliResult<crate::backend::BackendKind> {
    text.parse()
        .map_err(|e: hisparse_runtime::UnknownBackend| crate::error::CliError::Usage(e.to_string()))
}
