//! Layout planning as every front end asks for it: a model (a preset name or a model description
//! in JSON, optionally its first layers), the GPU and host budgets, the longest request and the
//! HiSparse settings, planned into a [`KvCacheConfig`] — one door for the CLI, the Python module
//! and the C library, each of which only names its own arguments ([`ArgNames`]) so that a refusal
//! says which argument to change in the caller's own spelling.

use hisparse_core::config::{ConfigError, HiSparseConfig};
use hisparse_core::layout::{KvCacheConfig, LayoutError, LayoutInput, plan_layout};
use hisparse_core::model::{ModelSpec, OwnedModel};
use hisparse_core::presets;
use hisparse_core::{Error, ErrorKind};

/// Where the model comes from.
#[derive(Clone, Copy, Debug)]
pub enum ModelSource<'a> {
    /// A preset by name ([`hisparse_core::presets::PRESET_NAMES`]).
    Preset(&'a str),
    /// A model description as JSON (the format `hisparse layout --print-model` writes).
    Json(&'a str),
}

/// A layout request (see the module docs). [`LayoutRequest::new`] gives the defaults every front
/// end shares.
#[derive(Clone, Copy, Debug)]
pub struct LayoutRequest<'a> {
    /// The model.
    pub model: ModelSource<'a>,
    /// Keep only the model's first `layers` layers (`None`: all).
    pub layers: Option<usize>,
    /// GPU bytes for the KV pool.
    pub gpu_mem: u64,
    /// Pinned host bytes for the host pool.
    pub host_mem: u64,
    /// Longest request in tokens.
    pub max_model_len: u32,
    /// Hot rows per request per hot group (`None`: `(max_query_len + 1) × top_k`).
    pub device_buffer_size: Option<u32>,
    /// Tokens per decode step per request (1 + speculative tokens).
    pub max_query_len: u32,
    /// Top-k instead of the model's.
    pub top_k: Option<u32>,
    /// Mirror rows to host as they are written.
    pub eager_host_mirror: bool,
    /// Exactly this many GPU blocks (null block included) instead of `gpu_mem / bytes_per_block`.
    pub num_gpu_blocks: Option<u32>,
    /// One host pool for every tensor-parallel rank of a node.
    pub shared_host_pool: bool,
}

impl<'a> LayoutRequest<'a> {
    /// DeepSeek V3.2-sized defaults for `model`: 80 GiB of GPU memory, 512 GiB of host memory,
    /// 128K-token requests, the default hot buffer, one token per step, eager mirroring.
    pub fn new(model: ModelSource<'a>) -> Self {
        LayoutRequest {
            model,
            layers: None,
            gpu_mem: 80 << 30,
            host_mem: 512 << 30,
            max_model_len: 131072,
            device_buffer_size: None,
            max_query_len: 1,
            top_k: None,
            eager_host_mirror: true,
            num_gpu_blocks: None,
            shared_host_pool: false,
        }
    }
}

/// How a front end spells each argument of a [`LayoutRequest`], for its messages.
#[derive(Clone, Copy, Debug)]
pub struct ArgNames<'a> {
    /// The preset argument.
    pub preset: &'a str,
    /// The model-description argument.
    pub model: &'a str,
    /// The layer-count argument.
    pub layers: &'a str,
    /// What sets the GPU budget.
    pub gpu_mem: &'a str,
    /// What sets the host budget.
    pub host_mem: &'a str,
    /// What sets the longest request.
    pub max_model_len: &'a str,
    /// What to lower for a shorter longest request (often `max_model_len` itself).
    pub shorten: &'a str,
    /// The hot-buffer argument.
    pub device_buffer_size: &'a str,
    /// What sets the tokens per step.
    pub max_query_len: &'a str,
    /// The top-k argument.
    pub top_k: &'a str,
    /// The GPU block-count argument.
    pub num_gpu_blocks: &'a str,
}

/// A planned layout and the model it was planned for.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The model (its first `layers` layers when the request asked for fewer).
    pub model: OwnedModel,
    /// The plan.
    pub kv: KvCacheConfig,
}

/// Why a layout request was refused: a message naming the argument to change, in the caller's
/// spelling. Its kind is [`ErrorKind::InvalidArgument`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    /// The message.
    pub message: String,
}

impl core::fmt::Display for PlanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlanError {}

impl Error for PlanError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidArgument
    }
}

fn refuse(message: String) -> PlanError {
    PlanError { message }
}

/// The model of `source`, validated, cut to its first `layers` layers.
pub fn model(
    source: ModelSource<'_>,
    layers: Option<usize>,
    names: &ArgNames<'_>,
) -> Result<OwnedModel, PlanError> {
    let owned: OwnedModel = match source {
        ModelSource::Json(text) => serde_json::from_str(text).map_err(|e| {
            refuse(format!(
                "{} is not a model description ({e}); `hisparse layout --print-model` writes a template",
                names.model
            ))
        })?,
        ModelSource::Preset(name) => presets::preset(name)
            .map_err(|e| {
                refuse(format!(
                    "unknown preset `{name}`; use {} with one of: {}",
                    names.preset,
                    e.valid.join(", ")
                ))
            })?
            .into(),
    };
    let what = match source {
        ModelSource::Json(_) => names.model,
        ModelSource::Preset(_) => names.preset,
    };
    owned
        .as_spec()
        .validate()
        .map_err(|e| refuse(format!("{what}: {e}")))?;
    match layers {
        None => Ok(owned),
        Some(n) if n >= 1 && n <= owned.layers.len() => {
            let spec = owned.as_spec();
            Ok(ModelSpec {
                layers: &spec.layers[..n],
                ..spec
            }
            .into())
        }
        Some(n) => Err(refuse(format!(
            "{} = {n}, but the model has {} layers; pass 1 to {}",
            names.layers,
            owned.layers.len(),
            owned.layers.len()
        ))),
    }
}

/// Plans `req`; a refusal names the argument to change ([`layout_message`]).
pub fn plan(req: &LayoutRequest<'_>, names: &ArgNames<'_>) -> Result<Planned, PlanError> {
    let model = model(req.model, req.layers, names)?;
    let kv = plan_model(&model.as_spec(), req).map_err(|e| refuse(layout_message(&e, names)))?;
    Ok(Planned { model, kv })
}

/// Plans `req`'s settings for `model` (ignoring `req.model` and `req.layers`), with the planner's
/// own error.
pub fn plan_model(
    model: &ModelSpec<'_>,
    req: &LayoutRequest<'_>,
) -> Result<KvCacheConfig, LayoutError> {
    let mut cfg = HiSparseConfig::new(req.top_k.unwrap_or(model.top_k), req.host_mem);
    cfg.device_buffer_size = req.device_buffer_size;
    cfg.max_query_len = req.max_query_len;
    cfg.eager_host_mirror = req.eager_host_mirror;
    let mut input = LayoutInput::new(model, &cfg, req.gpu_mem, req.max_model_len);
    input.num_gpu_blocks_override = req.num_gpu_blocks;
    input.shared_host_pool = req.shared_host_pool;
    plan_layout(&input)
}

/// A planning error as one line naming the argument (in `names`' spelling) to change.
pub fn layout_message(e: &LayoutError, names: &ArgNames<'_>) -> String {
    let ArgNames {
        gpu_mem: gpu,
        host_mem: host,
        max_model_len: length,
        shorten,
        max_query_len: query,
        device_buffer_size: buffer,
        ..
    } = *names;
    match *e {
        LayoutError::HostBudgetTooSmall {
            budget,
            host_block_stride,
            indexer_page_bytes,
            blocks,
            needed,
            needed_bytes,
        } => format!(
            "{host} {} holds {blocks} host blocks of {host_block_stride} B{}, but the longest \
             request ({length}) needs {needed} (its pages + null block + copy-on-write tail); \
             raise {host} to at least {} or lower {shorten}",
            human_bytes(budget),
            if indexer_page_bytes > 0 {
                format!(" (and {indexer_page_bytes} B of indexer keys each)")
            } else {
                String::new()
            },
            human_bytes(needed_bytes),
        ),
        LayoutError::GpuPoolTooSmall {
            blocks,
            needed,
            bytes_per_block,
        } => format!(
            "{gpu} gives {blocks} GPU blocks of {bytes_per_block} B, but the longest request \
             ({length}) needs {needed} even with HiSparse; raise {gpu} to at least {} or lower \
             {shorten}",
            human_bytes(needed.saturating_mul(bytes_per_block)),
        ),
        LayoutError::PoolTooLarge { pool, blocks, max } => {
            let flag = if pool == "host" { host } else { gpu };
            format!(
                "the {pool} pool would have {blocks} blocks, more than the {max} that i32 block \
                 ids and rows address; lower {flag}"
            )
        }
        LayoutError::Overflow { field } => {
            format!("the plan's `{field}` overflows; lower {gpu}, {host} or {shorten}")
        }
        LayoutError::Config(ConfigError::DeviceBufferTooSmall { value, min }) => format!(
            "{buffer} {value} is below top_k × max_query_len = {min}; raise it to at least {min}"
        ),
        LayoutError::Config(ConfigError::DeviceBufferTooLarge { value, max }) => {
            format!("{buffer} {value} exceeds {max} (LRU slots are 16-bit); lower it")
        }
        LayoutError::Config(ConfigError::DefaultDeviceBufferTooLarge {
            top_k,
            max_query_len,
            value,
            max,
        }) => format!(
            "the default hot buffer (1 + {max_query_len} tokens per step) × top-k {top_k} = {value} rows exceeds {max} (LRU slots are 16-bit); lower {query} or give {buffer} from {} to {max}",
            u64::from(top_k) * u64::from(max_query_len)
        ),
        LayoutError::Config(ConfigError::TopKTooLarge {
            top_k,
            max_query_len,
            max,
        }) => format!(
            "{max_query_len} tokens per step × top-k {top_k} exceed the largest hot buffer ({max} rows); lower {query}"
        ),
        LayoutError::ZeroMaxModelLen => format!("{length} must be at least 1 token"),
        ref other => other.to_string(),
    }
}

/// Bytes for people: `80.00 GiB`, `512.00 KiB`, `656 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: ArgNames<'static> = ArgNames {
        preset: "preset",
        model: "model_json",
        layers: "layers",
        gpu_mem: "gpu_mem",
        host_mem: "host_mem",
        max_model_len: "max_model_len",
        shorten: "max_model_len",
        device_buffer_size: "device_buffer_size",
        max_query_len: "max_query_len",
        top_k: "top_k",
        num_gpu_blocks: "num_gpu_blocks",
    };

    #[test]
    fn presets_plan_with_the_shared_defaults() {
        let p = plan(
            &LayoutRequest::new(ModelSource::Preset("deepseek-v3.2")),
            &NAMES,
        )
        .unwrap();
        assert_eq!(
            (p.kv.bytes_per_block, p.kv.host_block_stride),
            (545792, 2561024)
        );
        assert_eq!(p.model.layers.len(), 61);
    }

    #[test]
    fn refusals_name_the_callers_argument() {
        let mut req = LayoutRequest::new(ModelSource::Preset("deepseek-v3.2"));
        req.host_mem = 1 << 20;
        let e = plan(&req, &NAMES).unwrap_err();
        assert!(e.message.starts_with("host_mem 1.00 MiB holds"), "{e}");
        assert!(e.message.contains("or lower max_model_len"), "{e}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = plan(
            &LayoutRequest {
                layers: Some(99),
                ..LayoutRequest::new(ModelSource::Preset("glm-5"))
            },
            &NAMES,
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("layers = 99, but the model has 78"),
            "{e}"
        );
        let e = plan(&LayoutRequest::new(ModelSource::Preset("nope")), &NAMES).unwrap_err();
        assert!(
            e.message.contains("use preset with one of: deepseek-v3.2"),
            "{e}"
        );
        let e = plan(&LayoutRequest::new(ModelSource::Json("{")), &NAMES).unwrap_err();
        assert!(
            e.message
                .starts_with("model_json is not a model description"),
            "{e}"
        );
    }

    #[test]
    fn a_model_cut_to_its_first_layers() {
        let req = LayoutRequest {
            layers: Some(4),
            num_gpu_blocks: Some(700),
            host_mem: 200 * 4 * 64 * 656,
            max_model_len: 8192 + 64,
            ..LayoutRequest::new(ModelSource::Preset("deepseek-v3.2"))
        };
        let p = plan(&req, &NAMES).unwrap();
        assert_eq!(p.model.layers.len(), 4);
        assert_eq!(p.kv.index_groups.len(), 4);
        assert_eq!(p.kv.num_gpu_blocks, 700);
    }
}
