//! Layout planning: `hs_layout_plan` → an `HsLayout` handle and its figures.

use std::ffi::c_char;

use hisparse_core::layout::KvCacheConfig;
use hisparse_runtime::plan::{ArgNames, LayoutRequest, ModelSource, plan};

use crate::error::{Failure, HsStatus, deref, free_handle, guard, handle, invalid, output, string};

/// A planned KV-cache layout (opaque). Free with `hs_layout_free`.
pub struct HsLayout {
    pub(crate) kv: KvCacheConfig,
}

/// What to plan. Start from `hs_layout_options_default` (the defaults every front end shares).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HsLayoutOptions {
    /// A preset name (`deepseek-v3.2`, `glm-5`, `deepseek-v4`); ignored when `model_json` is
    /// set. NULL = `deepseek-v3.2`.
    pub preset: *const c_char,
    /// A model description as JSON (what `hisparse layout --print-model` writes), or NULL.
    pub model_json: *const c_char,
    /// Keep only the first `layers` layers (0 = all).
    pub layers: u32,
    /// GPU bytes for the KV pool.
    pub gpu_mem: u64,
    /// Pinned host bytes for the host pool.
    pub host_mem: u64,
    /// Longest request in tokens.
    pub max_model_len: u32,
    /// Hot rows per request per hot group (0 = the default, `(max_query_len + 1) * top_k`).
    pub device_buffer_size: u32,
    /// Tokens per request per step (1 + speculative tokens).
    pub max_query_len: u32,
    /// Top-k (0 = the model's).
    pub top_k: u32,
    /// Use exactly this many GPU blocks, null block included (0 = derive from `gpu_mem`).
    pub num_gpu_blocks: u32,
    /// Mirror rows to host as they are written (else sealed pages are spilled whole).
    pub eager_host_mirror: bool,
    /// One host pool for every tensor-parallel rank of a node (its arrays aligned for sharing).
    pub shared_host_pool: bool,
}

/// How the C API spells each layout argument, for the planner's messages.
const NAMES: ArgNames<'static> = ArgNames {
    preset: "options.preset",
    model: "options.model_json",
    layers: "options.layers",
    gpu_mem: "options.gpu_mem",
    host_mem: "options.host_mem",
    max_model_len: "options.max_model_len",
    shorten: "options.max_model_len",
    device_buffer_size: "options.device_buffer_size",
    max_query_len: "options.max_query_len",
    top_k: "options.top_k",
    num_gpu_blocks: "options.num_gpu_blocks",
};

/// A layout's figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsLayoutInfo {
    /// Top-k per decode token and layer.
    pub top_k: u32,
    /// Rows per page of the source, resident and hot groups.
    pub block_size: u32,
    /// Bytes per sparse KV row.
    pub row_bytes: u32,
    /// Sparse layers (each in one index group and one bucket).
    pub num_sparse_layers: u32,
    /// Index groups (one resolve call each per step).
    pub num_index_groups: u32,
    /// Resident/hot bucket pairs.
    pub num_buckets: u32,
    /// Bytes of one GPU block.
    pub bytes_per_block: u64,
    /// Rows between consecutive GPU blocks in the flat attention view.
    pub attention_block_stride: u32,
    /// GPU blocks, null block 0 included.
    pub num_gpu_blocks: u32,
    /// Host bytes of one host block.
    pub host_block_stride: u64,
    /// Host blocks, null block 0 included.
    pub host_num_blocks: u32,
    /// Hot rows per request per hot group.
    pub device_buffer_size: u32,
    /// Hot blocks per request per hot group.
    pub hot_blocks_per_request: u32,
    /// Longest request in tokens.
    pub max_model_len: u32,
    /// Pages of a `max_model_len` request (the width of the per-request tables).
    pub max_pages_per_request: u32,
    /// Bytes of the device pool.
    pub gpu_pool_bytes: u64,
    /// Bytes of the pinned host pool.
    pub host_pool_bytes: u64,
    /// Bytes of the indexer host cache the runtime pins beside the host pool (0 without an
    /// indexer); the host budget holds both.
    pub indexer_host_cache_bytes: u64,
    /// Host bytes of one host block: its stride and its indexer host cache pages (what a
    /// host budget needs per block).
    pub host_bytes_per_block: u64,
    /// Layout groups (`hs_layout_group`): source, indexer, resident and hot buckets, regular.
    pub num_groups: u32,
}

/// One index group.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsIndexGroupInfo {
    /// The leader layer (owns the indexer).
    pub leader: u32,
    /// Layers in the group, leader included.
    pub num_layers: u32,
    /// The bucket (resident/hot group pair) its layers live in.
    pub bucket: u32,
}

/// Fills `options` with the defaults every front end shares: DeepSeek V3.2, 80 GiB GPU, 512 GiB
/// host, 131072 tokens, the default hot buffer, max_query_len 1, eager mirroring.
///
/// # Safety
///
/// `options` is NULL or points to writable memory for an `HsLayoutOptions`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_options_default(options: *mut HsLayoutOptions) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let options = unsafe { output(options, "options") }?;
        let d = LayoutRequest::new(ModelSource::Preset(DEFAULT_PRESET));
        options.set(HsLayoutOptions {
            preset: std::ptr::null(),
            model_json: std::ptr::null(),
            layers: d.layers.map_or(0, |n| n as u32),
            gpu_mem: d.gpu_mem,
            host_mem: d.host_mem,
            max_model_len: d.max_model_len,
            device_buffer_size: d.device_buffer_size.unwrap_or(0),
            max_query_len: d.max_query_len,
            top_k: d.top_k.unwrap_or(0),
            num_gpu_blocks: d.num_gpu_blocks.unwrap_or(0),
            eager_host_mirror: d.eager_host_mirror,
            shared_host_pool: d.shared_host_pool,
        });
        Ok(())
    })
}

/// The preset a NULL `HsLayoutOptions::preset` names.
const DEFAULT_PRESET: &str = "deepseek-v3.2";

/// Plans a layout; `*out` receives a handle to free with `hs_layout_free`.
///
/// # Safety
///
/// `options` points to a valid `HsLayoutOptions` whose strings are NULL or NUL-terminated;
/// `out` points to writable memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_plan(
    options: *const HsLayoutOptions,
    out: *mut *mut HsLayout,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (o, out) = unsafe { (deref(options, "options")?, output(out, "out")?) };
        // SAFETY: forwarded contract (the option strings).
        let model = unsafe {
            match o.model_json.is_null() {
                true => ModelSource::Preset(string(o.preset, "options.preset", DEFAULT_PRESET)?),
                false => ModelSource::Json(string(o.model_json, "options.model_json", "")?),
            }
        };
        let kv = plan(&request(o, model), &NAMES)?.kv;
        out.set(handle(HsLayout { kv }));
        Ok(())
    })
}

/// The runtime's layout request of `o` (0 = the default for the optional numbers).
fn request<'a>(o: &HsLayoutOptions, model: ModelSource<'a>) -> LayoutRequest<'a> {
    let some = |v: u32| (v != 0).then_some(v);
    LayoutRequest {
        model,
        layers: some(o.layers).map(|n| n as usize),
        gpu_mem: o.gpu_mem,
        host_mem: o.host_mem,
        max_model_len: o.max_model_len,
        device_buffer_size: some(o.device_buffer_size),
        max_query_len: o.max_query_len,
        top_k: some(o.top_k),
        eager_host_mirror: o.eager_host_mirror,
        num_gpu_blocks: some(o.num_gpu_blocks),
        shared_host_pool: o.shared_host_pool,
    }
}

/// Frees a layout (NULL is ignored). Coordinators and runtimes built from it keep their own
/// copy.
///
/// # Safety
///
/// `layout` is NULL or a handle from `hs_layout_plan` not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_free(layout: *mut HsLayout) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(layout) }
}

/// Runs a query of the layout and stores its answer in `*out` (named `what`).
///
/// # Safety
///
/// `layout` is a live handle; `out` points to writable memory for a `T`.
pub(crate) unsafe fn answer<T>(
    layout: *const HsLayout,
    out: *mut T,
    what: &str,
    query: impl FnOnce(&KvCacheConfig) -> Result<T, Failure>,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (layout, out) = unsafe { (deref(layout, "layout")?, output(out, what)?) };
        out.set(query(&layout.kv)?);
        Ok(())
    })
}

/// The layout's figures.
///
/// # Safety
///
/// `layout` is a live handle; `out` points to writable memory for an `HsLayoutInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_info(
    layout: *const HsLayout,
    out: *mut HsLayoutInfo,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(layout, out, "out", |kv| {
            Ok(HsLayoutInfo {
                top_k: kv.config.top_k,
                block_size: kv.block_size,
                row_bytes: kv.row_bytes,
                num_sparse_layers: kv.groups[KvCacheConfig::SOURCE_GROUP].layers.len() as u32,
                num_index_groups: kv.index_groups.len() as u32,
                num_buckets: kv.num_buckets,
                bytes_per_block: kv.bytes_per_block,
                attention_block_stride: kv.attention_block_stride,
                num_gpu_blocks: kv.num_gpu_blocks,
                host_block_stride: kv.host_block_stride,
                host_num_blocks: kv.host_num_blocks,
                device_buffer_size: kv.device_buffer_size,
                hot_blocks_per_request: kv.hot_blocks_per_request,
                max_model_len: kv.max_model_len,
                max_pages_per_request: kv.max_pages_per_request,
                gpu_pool_bytes: kv.gpu_pool_bytes(),
                host_pool_bytes: kv.host_pool_bytes(),
                indexer_host_cache_bytes: kv.indexer_host_pool_bytes(),
                host_bytes_per_block: kv.host_bytes_per_block(),
                num_groups: kv.groups.len() as u32,
            })
        })
    }
}

/// Refuses `index` unless it is one of the layout's `count` `what`s (groups, buckets, …),
/// naming how many there are.
pub(crate) fn in_layout(index: usize, count: usize, what: &str) -> Result<(), Failure> {
    if index < count {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what} {index} is not part of the layout ({count} {what}s)"
        )))
    }
}

/// Index group `group`'s leader, size and bucket.
///
/// # Safety
///
/// `layout` is a live handle; `out` points to writable memory for an `HsIndexGroupInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_index_group(
    layout: *const HsLayout,
    group: usize,
    out: *mut HsIndexGroupInfo,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(layout, out, "out", |kv| {
            in_layout(group, kv.index_groups.len(), "index group")?;
            let g = &kv.index_groups[group];
            Ok(HsIndexGroupInfo {
                leader: g.leader,
                num_layers: g.layers.len() as u32,
                bucket: g.bucket,
            })
        })
    }
}

/// Where sparse layer `layer` lives in the device pool: its bucket and its byte offset inside
/// every resident and hot block of that bucket. In the flat attention view, physical row `r`
/// of the layer starts at byte `offset + r * row_bytes`.
///
/// # Safety
///
/// `layout` is a live handle; `bucket` and `offset` point to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_layer_offset(
    layout: *const HsLayout,
    layer: u32,
    bucket: *mut u32,
    offset: *mut u64,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (kv, bucket, offset) = unsafe {
            (
                &deref(layout, "layout")?.kv,
                output(bucket, "bucket")?,
                output(offset, "offset")?,
            )
        };
        let (b, gl) = kv.bucket_of(layer)?;
        bucket.set(b);
        offset.set(gl.offset);
        Ok(())
    })
}

/// The byte offset of sparse layer `layer`'s `[host_num_blocks, block_size, row]` array in the
/// host pool (flat host row `g` at `offset + g * row_bytes` for contiguous rows).
///
/// # Safety
///
/// `layout` is a live handle; `offset` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_host_layer_offset(
    layout: *const HsLayout,
    layer: u32,
    offset: *mut u64,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(layout, offset, "offset", |kv| {
            Ok(kv.host_layout(layer)?.base)
        })
    }
}

/// Layer `index` (`0 .. num_layers`, the leader first) of index group `group`.
///
/// # Safety
///
/// `layout` is a live handle; `layer` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_layout_index_group_layer(
    layout: *const HsLayout,
    group: usize,
    index: usize,
    layer: *mut u32,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer(layout, layer, "layer", |kv| {
            kv.index_groups
                .get(group)
                .and_then(|g| g.layers.get(index))
                .copied()
                .ok_or_else(|| {
                    invalid(format!(
                        "index group {group} has no layer {index} (see hs_layout_index_group)"
                    ))
                })
        })
    }
}
