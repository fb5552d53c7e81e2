//! Layout planning: `plan_layout(...)` → `Layout`, whose `to_dict()` is what `hisparse layout
//! --json` prints for the same inputs.

use hisparse_core::layout::{
    GroupKind, KvCacheConfig, LayerView, LayoutFingerprint, LayoutReport, capacity_contexts,
};
use hisparse_core::presets as model_presets;
use hisparse_runtime::plan::{ArgNames, LayoutRequest, ModelSource, plan};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{Int, IntList, take_args};
use crate::errors::{invalid, to_py};

/// A planned KV-cache layout (immutable).
#[pyclass(module = "hisparse", frozen, name = "Layout")]
pub struct Layout {
    pub(crate) kv: KvCacheConfig,
    /// `kv`'s fingerprint (what the wire bytes of its commands and reports carry).
    pub(crate) fingerprint: LayoutFingerprint,
    /// The GPU and host budgets it was planned from (reported as `gpu_mem_bytes`,
    /// `host_mem_bytes`, as the CLI does).
    gpu_mem: u64,
    host_mem: u64,
}

impl Layout {
    /// A layout of `kv`, remembered as planned in this process (see `wire`).
    fn new(kv: KvCacheConfig, gpu_mem: u64, host_mem: u64) -> Self {
        let fingerprint = kv.fingerprint();
        crate::wire::remember(fingerprint);
        Layout {
            kv,
            fingerprint,
            gpu_mem,
            host_mem,
        }
    }

    /// The layout as the CLI's JSON value ([`LayoutReport`] of one rank, as `hisparse layout`
    /// without `--tp` prints it): every field of the plan, the budgets, the pool sizes, the
    /// hot-buffer cost per request and the capacity table.
    fn json_value(&self, contexts: Option<Vec<u32>>) -> PyResult<serde_json::Value> {
        let kv = &self.kv;
        let contexts = contexts.unwrap_or_else(|| capacity_contexts(kv.max_model_len));
        let report = LayoutReport::new(kv, self.gpu_mem, self.host_mem, 1, &contexts);
        serde_json::to_value(&report).map_err(|e| invalid(e.to_string()))
    }
}

/// How this module spells each argument of a layout request, for the planner's messages.
const ARG_NAMES: ArgNames<'static> = ArgNames {
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

/// Plans a layout through the runtime's one door for every front end
/// (`hisparse_runtime::plan`), whose defaults an argument left out takes.
///
/// The model is a preset (`preset`, see `presets()`) or a model description as JSON
/// (`model_json`, the format `hisparse layout --print-model` writes); `layers` keeps only the
/// first `layers` layers. Sizes are bytes. `num_gpu_blocks` fixes the GPU pool's block count
/// (null block included) instead of deriving it from `gpu_mem`; `shared_host_pool` plans one
/// host pool for every tensor-parallel rank of a node.
#[pyfunction]
#[pyo3(signature = (
    preset = "deepseek-v3.2",
    *,
    model_json = None,
    layers = None,
    gpu_mem = None,
    host_mem = None,
    max_model_len = None,
    device_buffer_size = None,
    max_query_len = None,
    top_k = None,
    eager_host_mirror = true,
    num_gpu_blocks = None,
    shared_host_pool = false,
),
// The one door's defaults as Python shows them (a test checks they are what a call without
// them gets).
text_signature = "(preset='deepseek-v3.2', *, model_json=None, layers=None, gpu_mem=85899345920, host_mem=549755813888, max_model_len=131072, device_buffer_size=None, max_query_len=1, top_k=None, eager_host_mirror=True, num_gpu_blocks=None, shared_host_pool=False)"
)]
#[allow(clippy::too_many_arguments)]
pub fn plan_layout(
    preset: &str,
    model_json: Option<&str>,
    layers: Option<Int<usize>>,
    gpu_mem: Option<Int<u64>>,
    host_mem: Option<Int<u64>>,
    max_model_len: Option<Int<u32>>,
    device_buffer_size: Option<Int<u32>>,
    max_query_len: Option<Int<u32>>,
    top_k: Option<Int<u32>>,
    eager_host_mirror: bool,
    num_gpu_blocks: Option<Int<u32>>,
    shared_host_pool: bool,
) -> PyResult<Layout> {
    take_args!(
        layers,
        gpu_mem,
        host_mem,
        max_model_len,
        device_buffer_size,
        max_query_len,
        top_k,
        num_gpu_blocks
    );
    let source = match model_json {
        Some(text) => ModelSource::Json(text),
        None => ModelSource::Preset(preset),
    };
    let defaults = LayoutRequest::new(source);
    let req = LayoutRequest {
        layers,
        gpu_mem: gpu_mem.unwrap_or(defaults.gpu_mem),
        host_mem: host_mem.unwrap_or(defaults.host_mem),
        max_model_len: max_model_len.unwrap_or(defaults.max_model_len),
        device_buffer_size,
        max_query_len: max_query_len.unwrap_or(defaults.max_query_len),
        top_k,
        eager_host_mirror,
        num_gpu_blocks,
        shared_host_pool,
        ..defaults
    };
    let planned = plan(&req, &ARG_NAMES).map_err(to_py)?;
    Ok(Layout::new(planned.kv, req.gpu_mem, req.host_mem))
}

/// A layer view of `kv` as a dict (see `Layout.gpu_views`), with its group's kind.
fn view_dict<'py>(
    py: Python<'py>,
    kv: &KvCacheConfig,
    v: &LayerView,
) -> PyResult<Bound<'py, PyDict>> {
    let kind = kv.groups.get(v.group as usize).map(|g| match g.kind {
        GroupKind::Source => "source",
        GroupKind::Indexer => "indexer",
        GroupKind::Resident => "resident",
        GroupKind::Hot => "hot",
        GroupKind::Regular => "regular",
    });
    let d = PyDict::new(py);
    d.set_item("group", v.group)?;
    d.set_item("kind", kind)?;
    d.set_item("layer", v.layer)?;
    d.set_item("offset", v.offset)?;
    d.set_item("page_stride", v.page_stride)?;
    d.set_item("num_pages", v.num_pages)?;
    d.set_item("pages_per_block", v.pages_per_block)?;
    d.set_item("rows_per_page", v.rows_per_page)?;
    d.set_item("row_bytes", v.row_bytes)?;
    d.set_item("value_bytes", v.value_bytes)?;
    d.set_item("tokens_per_row", v.tokens_per_row)?;
    Ok(d)
}

/// Names of the model presets.
#[pyfunction]
pub fn presets() -> Vec<&'static str> {
    model_presets::PRESET_NAMES.to_vec()
}

#[pymethods]
impl Layout {
    /// A layout from JSON (`Layout.to_json()`, `hisparse layout --json`): the plan's fields are
    /// read and validated; extra keys (budgets, pool sizes, capacity) are ignored.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Layout> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let budget = |key: &str| value.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        let (gpu_mem, host_mem) = (budget("gpu_mem_bytes"), budget("host_mem_bytes"));
        let kv: KvCacheConfig =
            serde_json::from_value(value).map_err(|e| invalid(format!("not a layout: {e}")))?;
        kv.validate().map_err(to_py)?;
        Ok(Layout::new(kv, gpu_mem, host_mem))
    }

    /// The layout as a dict: exactly what `hisparse layout --json` prints for the same inputs
    /// (capacity at 8K, 32K, 128K up to `max_model_len`, and `max_model_len`; or at
    /// `capacity_contexts`).
    #[pyo3(signature = (capacity_contexts = None))]
    fn to_dict<'py>(
        &self,
        py: Python<'py>,
        capacity_contexts: Option<IntList<u32>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        take_args!(capacity_contexts);
        let text = self.json_value(capacity_contexts)?.to_string();
        py.import("json")?.call_method1("loads", (text,))
    }

    /// The layout as JSON text (the `to_dict()` content, indented as the CLI prints it).
    #[pyo3(signature = (capacity_contexts = None))]
    fn to_json(&self, capacity_contexts: Option<IntList<u32>>) -> PyResult<String> {
        take_args!(capacity_contexts);
        serde_json::to_string_pretty(&self.json_value(capacity_contexts)?)
            .map_err(|e| invalid(e.to_string()))
    }

    /// Requests that fit at `context_len` tokens, all-on-GPU vs HiSparse, and the limiting tier.
    fn capacity<'py>(&self, py: Python<'py>, context_len: Int<u32>) -> PyResult<Bound<'py, PyAny>> {
        take_args!(context_len);
        let text = serde_json::to_string(&self.kv.capacity(context_len))
            .map_err(|e| invalid(e.to_string()))?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// The layout's fingerprint: a 64-bit hash of everything that gives a command its meaning,
    /// carried by the wire bytes of its commands and reports.
    #[getter]
    fn fingerprint(&self) -> u64 {
        self.fingerprint.as_u64()
    }

    /// Model name.
    #[getter]
    fn model(&self) -> &str {
        &self.kv.model
    }
    /// Top-k per decode token and layer.
    #[getter]
    fn top_k(&self) -> u32 {
        self.kv.config.top_k
    }
    /// Rows per page of the source, resident and hot groups.
    #[getter]
    fn block_size(&self) -> u32 {
        self.kv.block_size
    }
    /// Bytes per sparse KV row.
    #[getter]
    fn row_bytes(&self) -> u32 {
        self.kv.row_bytes
    }
    /// Bytes of one GPU block.
    #[getter]
    fn bytes_per_block(&self) -> u64 {
        self.kv.bytes_per_block
    }
    /// Rows between consecutive GPU blocks in the flat attention view of the device pool.
    #[getter]
    fn attention_block_stride(&self) -> u32 {
        self.kv.attention_block_stride
    }
    /// GPU blocks, null block 0 included.
    #[getter]
    fn num_gpu_blocks(&self) -> u32 {
        self.kv.num_gpu_blocks
    }
    /// Host bytes of one host block (summed source page bytes).
    #[getter]
    fn host_block_stride(&self) -> u64 {
        self.kv.host_block_stride
    }
    /// Host blocks, null block 0 included.
    #[getter]
    fn host_num_blocks(&self) -> u32 {
        self.kv.host_num_blocks
    }
    /// Hot rows per request per hot group.
    #[getter]
    fn device_buffer_size(&self) -> u32 {
        self.kv.device_buffer_size
    }
    /// Hot blocks per request per hot group.
    #[getter]
    fn hot_blocks_per_request(&self) -> u32 {
        self.kv.hot_blocks_per_request
    }
    /// Longest request in tokens.
    #[getter]
    fn max_model_len(&self) -> u32 {
        self.kv.max_model_len
    }
    /// Pages of a `max_model_len` request (the width of the per-request tables).
    #[getter]
    fn max_pages_per_request(&self) -> u32 {
        self.kv.max_pages_per_request
    }
    /// Resident/hot bucket pairs.
    #[getter]
    fn num_buckets(&self) -> u32 {
        self.kv.num_buckets
    }
    /// Bytes of the device pool (`num_gpu_blocks × bytes_per_block`).
    #[getter]
    fn gpu_pool_bytes(&self) -> u64 {
        self.kv.gpu_pool_bytes()
    }
    /// Bytes of the pinned host pool (`host_num_blocks × host_block_stride`).
    #[getter]
    fn host_pool_bytes(&self) -> u64 {
        self.kv.host_pool_bytes()
    }
    /// Bytes of the indexer host cache the runtime pins beside the host pool (0 without an
    /// indexer); `host_mem` holds both.
    #[getter]
    fn indexer_host_cache_bytes(&self) -> u64 {
        self.kv.indexer_host_pool_bytes()
    }
    /// Host bytes of one host block: its stride and its indexer host cache pages (what
    /// `host_mem` needs per block).
    #[getter]
    fn host_bytes_per_block(&self) -> u64 {
        self.kv.host_bytes_per_block()
    }
    /// Index groups in model order: `{"leader", "layers", "bucket"}` each.
    #[getter]
    fn index_groups<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.kv
            .index_groups
            .iter()
            .map(|g| {
                let d = PyDict::new(py);
                d.set_item("leader", g.leader)?;
                d.set_item("layers", g.layers.clone())?;
                d.set_item("bucket", g.bucket)?;
                Ok(d)
            })
            .collect()
    }

    /// Where sparse layer `layer` lives in the device pool: `(bucket, offset)`, `offset` being
    /// the layer's byte offset inside every resident and hot block of its bucket. In the flat
    /// attention view, physical row `r` of the layer starts at byte `offset + r * row_bytes`.
    fn layer_offset(&self, layer: Int<u32>) -> PyResult<(u32, u64)> {
        take_args!(layer);
        let (bucket, gl) = self.kv.bucket_of(layer).map_err(to_py)?;
        Ok((bucket, gl.offset))
    }

    /// Where sparse layer `layer`'s rows live in the host pool: the byte offset of its
    /// `[host_num_blocks, block_size, row]` array (flat host row `g` at `offset + g * row_bytes`
    /// for contiguous rows).
    fn host_layer_offset(&self, layer: Int<u32>) -> PyResult<u64> {
        take_args!(layer);
        Ok(self.kv.host_layout(layer).map_err(to_py)?.base)
    }

    /// How each layer of every GPU group reads the device pool, in group order then layer
    /// order: `{"group", "kind", "layer", "offset", "page_stride", "num_pages",
    /// "pages_per_block", "rows_per_page", "row_bytes", "value_bytes", "tokens_per_row"}` each
    /// (`kind`: `"indexer"`, `"resident"`, `"hot"` or `"regular"`). The layer's view
    /// is `[num_pages, rows_per_page, row_bytes]` from byte `offset`, page `v` at `offset + v *
    /// page_stride`; a slot-mapping value or an attention row `r` is page `r // rows_per_page`,
    /// row `r % rows_per_page` (split rows: the page's values first, `value_bytes` each, then
    /// their scales). For resident and hot groups this is the flat attention view
    /// (`page_stride = rows_per_page * row_bytes`); for indexer and regular groups
    /// `page_stride = bytes_per_block`. `hisparse.pool_view(pool, view)` builds the array.
    fn gpu_views<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.kv
            .gpu_views()
            .iter()
            .map(|v| view_dict(py, &self.kv, v))
            .collect()
    }

    /// The view (as in `gpu_views()`) of the `index_in_group`-th layer of layout group
    /// `group`, or `None` for the source group or a group or layer outside the layout.
    fn layer_view<'py>(
        &self,
        py: Python<'py>,
        group: Int<usize>,
        index_in_group: Int<usize>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        take_args!(group, index_in_group);
        self.kv
            .layer_view(group, index_in_group)
            .map(|v| view_dict(py, &self.kv, &v))
            .transpose()
    }

    fn __repr__(&self) -> String {
        let kv = &self.kv;
        format!(
            "Layout(model={:?}, layers={}, bytes_per_block={}, num_gpu_blocks={}, host_block_stride={}, host_num_blocks={}, top_k={}, device_buffer_size={})",
            kv.model,
            kv.groups
                .get(KvCacheConfig::SOURCE_GROUP)
                .map_or(0, |g| g.layers.len()),
            kv.bytes_per_block,
            kv.num_gpu_blocks,
            kv.host_block_stride,
            kv.host_num_blocks,
            kv.config.top_k,
            kv.device_buffer_size
        )
    }
}
