"""Type stubs of the compiled module ``hisparse._hisparse`` (re-exported by ``hisparse``)."""

from typing import Any, Literal, Optional, Sequence, Tuple, TypedDict, Union, final

__all__ = [
    "HiSparseError",
    "InvalidArgumentError",
    "ConcurrentUseError",
    "WireError",
    "OutOfDeviceMemoryError",
    "OutOfPinnedMemoryError",
    "NotFoundError",
    "UnsupportedError",
    "DeviceError",
    "Layout",
    "Coordinator",
    "Command",
    "Alloc",
    "Admission",
    "WorkerReport",
    "Runtime",
    "LayerCall",
    "DeviceArray",
    "plan_layout",
    "presets",
    "backends",
    "releases_in_flight",
    "wait_for_releases",
    "_command_from_pickle",
    "_report_from_pickle",
    "__version__",
]

__version__: str

class HiSparseError(Exception):
    """Base class of every HiSparse error."""

    kind: str
    """The error kind: "invalid argument", "out of device memory", "out of pinned memory",
    "not found", "unsupported", "compilation", "device lost" or "other"."""
    message: str
    """What went wrong and what to change."""

class InvalidArgumentError(HiSparseError): ...

class WireError(InvalidArgumentError):
    """Bytes that are not a message this process can take: cut short, corrupted, not a
    hisparse message, of another kind or format version, or planned for another layout."""

class ConcurrentUseError(InvalidArgumentError):
    """A call into a ``Runtime`` (or a prepared call) while a call on another thread is still
    running in it: use each from one thread at a time."""

class OutOfDeviceMemoryError(HiSparseError): ...
class OutOfPinnedMemoryError(HiSparseError): ...
class NotFoundError(HiSparseError): ...
class UnsupportedError(HiSparseError): ...
class DeviceError(HiSparseError): ...

class _LayerView(TypedDict):
    group: int
    kind: Literal["indexer", "resident", "hot", "regular"]
    layer: int
    offset: int
    page_stride: int
    num_pages: int
    pages_per_block: int
    rows_per_page: int
    row_bytes: int
    value_bytes: int
    tokens_per_row: int

class _IndexGroup(TypedDict):
    leader: int
    layers: list[int]
    bucket: int

class _ScheduledRequest(TypedDict):
    id: int
    slot: int
    first_token: int
    num_tokens: int
    fully_resident: bool

class _PoolUsage(TypedDict):
    gpu_used: int
    gpu_free: int
    gpu_total: int
    host_used: int
    host_free: int
    host_total: int

class _StepSummary(TypedDict):
    scheduled: int
    tokens: int
    preempted: int
    waiting_on_reclaim: int
    started: int
    refused: int

class _TierFree(TypedDict):
    gpu_blocks: int
    gpu_capacity: int
    gpu_cached: int
    host_blocks: int
    host_capacity: int
    host_cached: int
    hot_region_blocks: int
    hot_regions_free: int
    hot_regions_held: int
    rows: int

class _Needs(TypedDict):
    tokens: int
    gpu_blocks: int
    hot_region_blocks: int
    host_blocks: int
    context_tokens: int
    context_gpu_blocks: int
    context_prefill_gpu_blocks: int
    context_host_blocks: int

class _Counters(TypedDict):
    steps: int
    sampled_steps: int
    hot_hits: int
    hot_misses: int
    resident_reads: int
    h2d_bytes: int
    d2h_bytes: int
    remap_calls: int
    prefill_remap_calls: int
    resolve_calls: int
    follower_gathers: int
    table_writes: int
    hot_resets: int
    reclaimed_pages: int
    restored_pages: int
    host_cow_pages: int
    gpu_cow_blocks: int
    mirror_spans: int
    spilled_pages: int
    transfers_enqueued: int
    transfers_completed: int
    indexer_rows_backed_up: int
    indexer_pages_restored: int
    indexer_d2h_bytes: int
    indexer_h2d_bytes: int
    hit_rate: Optional[float]

def plan_layout(
    preset: str = "deepseek-v3.2",
    *,
    model_json: Optional[str] = None,
    layers: Optional[int] = None,
    gpu_mem: int = 80 << 30,
    host_mem: int = 512 << 30,
    max_model_len: int = 131072,
    device_buffer_size: Optional[int] = None,
    max_query_len: int = 1,
    top_k: Optional[int] = None,
    eager_host_mirror: bool = True,
    num_gpu_blocks: Optional[int] = None,
    shared_host_pool: bool = False,
) -> Layout:
    """Plans a layout. The model is a preset or ``model_json`` (the format of ``hisparse layout
    --print-model``); ``layers`` keeps the first layers only; sizes are bytes;
    ``num_gpu_blocks`` fixes the GPU pool's block count (null block included);
    ``shared_host_pool`` plans one host pool for every tensor-parallel rank of a node."""

def presets() -> list[str]:
    """Names of the model presets."""

def backends() -> list[str]:
    """Names of the backends compiled into this build."""

def releases_in_flight() -> int:
    """Host pools of this process still being released on a thread of their own."""

def wait_for_releases(timeout: Optional[float] = None) -> bool:
    """Waits (without the GIL) until every release has finished; whether they all did."""

def _command_from_pickle(data: bytes) -> Command:
    """Unpickles a ``Command``, checking it against the layouts this process planned."""

def _report_from_pickle(data: bytes) -> WorkerReport:
    """Unpickles a ``WorkerReport``, checking it against the layouts this process planned."""

@final
class Layout:
    """A planned KV-cache layout (immutable)."""

    @staticmethod
    def from_json(text: str) -> Layout:
        """A layout from ``Layout.to_json()`` or ``hisparse layout --json`` output."""
    def to_dict(self, capacity_contexts: Optional[Sequence[int]] = None) -> dict[str, Any]:
        """Exactly what ``hisparse layout --json`` prints for the same inputs."""
    def to_json(self, capacity_contexts: Optional[Sequence[int]] = None) -> str: ...
    @property
    def fingerprint(self) -> int:
        """A 64-bit hash of everything that gives a command its meaning (the wire bytes of
        its commands and reports carry it)."""
    def capacity(self, context_len: int) -> dict[str, Any]:
        """Requests that fit at ``context_len`` tokens, and the limiting tier."""
    def layer_offset(self, layer: int) -> tuple[int, int]:
        """``(bucket, offset)`` of sparse layer ``layer`` in the device pool: physical row ``r``
        of the flat attention view starts at byte ``offset + r * row_bytes``."""
    def gpu_views(self) -> list[_LayerView]:
        """How each layer of every GPU group reads the device pool: ``[num_pages,
        rows_per_page, row_bytes]`` from byte ``offset``, page ``v`` at ``offset + v *
        page_stride``; row ``r`` is page ``r // rows_per_page``, row ``r % rows_per_page``."""
    def layer_view(self, group: int, index_in_group: int) -> Optional[_LayerView]: ...
    def host_layer_offset(self, layer: int) -> int:
        """Byte offset of the layer's row array in the host pool (flat host row ``g`` at
        ``offset + g * row_bytes``)."""
    @property
    def model(self) -> str: ...
    @property
    def top_k(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def row_bytes(self) -> int: ...
    @property
    def bytes_per_block(self) -> int: ...
    @property
    def attention_block_stride(self) -> int: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def host_block_stride(self) -> int: ...
    @property
    def host_num_blocks(self) -> int: ...
    @property
    def device_buffer_size(self) -> int: ...
    @property
    def hot_blocks_per_request(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_pages_per_request(self) -> int: ...
    @property
    def num_buckets(self) -> int: ...
    @property
    def gpu_pool_bytes(self) -> int: ...
    @property
    def host_pool_bytes(self) -> int: ...
    @property
    def indexer_host_cache_bytes(self) -> int: ...
    @property
    def host_bytes_per_block(self) -> int: ...
    @property
    def index_groups(self) -> list[_IndexGroup]: ...

@final
class Command:
    """One step's command (plain data for ``Runtime.begin_step`` / ``end_step``). Crosses
    processes as ``to_bytes()`` / ``Command.from_bytes(blob, layout)`` or pickled (unpickling
    checks the blob against the layouts the receiving process planned)."""

    def to_bytes(self) -> bytes: ...
    @staticmethod
    def from_bytes(data: bytes, layout: Layout) -> Command:
        """Decodes and checks ``data``; a blob cut short, corrupted, foreign or of another
        layout is a ``WireError``."""
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...
    @property
    def fingerprint(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...

    @property
    def step(self) -> int: ...
    @property
    def transfer_id(self) -> Optional[int]: ...
    @property
    def fully_resident(self) -> bool: ...
    @property
    def scheduled(self) -> list[_ScheduledRequest]: ...
    @property
    def slots(self) -> list[int]:
        """State rows of the scheduled requests (the batch for ``Runtime.set_batch``)."""
    @property
    def refused(self) -> list[dict[str, Any]]:
        """Requests refused in this step: ``{"id", "reason", "message", ...}`` each (fail and
        finish them; the step went on for the others)."""
    @property
    def preempted(self) -> list[int]: ...
    def to_dict(self) -> dict[str, Any]:
        """Every field of the command."""

@final
class Alloc:
    """What giving a request the blocks of this step came to (``Coordinator.start``,
    ``Coordinator.schedule``); true only when scheduled."""

    @property
    def outcome(self) -> Literal["scheduled", "wait", "no_space"]:
        """``"scheduled"``: the tokens are part of this step; ``"wait"``: memory is short but a
        release is in flight, try next step; ``"no_space"``: memory is short and nothing is in
        flight, preempt someone or wait for a finish."""
    @property
    def pool(self) -> Optional[Literal["gpu", "host"]]:
        """The pool that is short, for ``"no_space"``."""
    @property
    def scheduled(self) -> bool: ...
    def __bool__(self) -> bool: ...

@final
class WorkerReport:
    """A worker's report: the transfer batches its runtime enqueued and completed since the last
    one (``Runtime.poll()``), for ``Coordinator.report``. Also reads as a dict."""

    def __new__(
        cls, worker: int, enqueued: Sequence[int], completed: Sequence[int], *, layout: Optional[Layout] = None
    ) -> WorkerReport: ...
    def to_bytes(self) -> bytes: ...
    @staticmethod
    def from_bytes(data: bytes, layout: Layout) -> WorkerReport: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...
    @property
    def worker(self) -> int: ...
    @property
    def enqueued(self) -> list[int]: ...
    @property
    def completed(self) -> list[int]: ...
    def is_empty(self) -> bool: ...
    def __getitem__(self, key: Literal["worker", "enqueued", "completed"], /) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Admission:
    """What ``Coordinator.can_start`` / ``can_schedule`` found: the operation's answer now,
    changing nothing. True only when it would schedule."""

    @property
    def outcome(self) -> Literal["scheduled", "wait", "no_space"]: ...
    @property
    def pool(self) -> Optional[Literal["gpu", "host"]]: ...
    @property
    def scheduled(self) -> bool: ...
    @property
    def tokens(self) -> int:
        """Tokens it would schedule (a start's first chunk; 0 unless scheduled)."""
    @property
    def reclaims(self) -> bool:
        """Whether it would reclaim resident pages first."""
    def __bool__(self) -> bool: ...

@final
class Coordinator:
    """The scheduler side of HiSparse for one model instance."""

    def __new__(
        cls,
        layout: Layout,
        *,
        max_running: int = 256,
        max_batched_tokens: int = 512,
        max_spill_pages_per_step: int = 64,
        num_workers: int = 1,
        enable_prefix_caching: bool = True,
        reclaim_min_blocks: int = 64,
    ) -> Coordinator: ...
    def admit(self, id: int, prompt: Sequence[int]) -> None: ...
    def append_tokens(self, id: int, tokens: Sequence[int]) -> None: ...
    def append_token_by_slot(self, slot: int, token: int) -> int:
        """Appends one token to the request in state row ``slot``; returns its id."""
    def step(self) -> Command:
        """The built-in policy: plans the next step and returns its command."""
    def schedule_step(self) -> _StepSummary:
        """The built-in policy for one step, without ending it (``build_offload_command``)."""
    def start(self, id: int, max_tokens: int) -> Alloc:
        """Starts waiting request ``id`` with a first chunk of at most ``max_tokens`` tokens
        (fewer when the free GPU pool holds less); nothing changes unless scheduled."""
    def can_start(self, id: int, max_tokens: int) -> Admission:
        """What ``start(id, max_tokens)`` would answer now (the same error, or an
        ``Admission``), changing nothing."""
    def can_schedule(self, id: int, num_tokens: int) -> Admission:
        """What ``schedule(id, num_tokens)`` would answer now, changing nothing."""
    def free(self) -> _TierFree:
        """What each tier has free now."""
    def needs(self, id: int, num_tokens: int) -> _Needs:
        """What request ``id`` needs for its next tokens and for its whole context."""
    def refusal(self, id: int) -> Optional[dict[str, Any]]:
        """Why ``id`` was refused while a step was scheduled (``{"reason", "message", ...}``),
        or ``None``."""
    def schedule(self, id: int, num_tokens: int) -> Alloc:
        """Schedules ``num_tokens`` more tokens of running request ``id`` (all or none)."""
    def build_offload_command(self) -> Command:
        """Ends the step and returns its command."""
    def rollback(self, id: int, num_tokens: int) -> None:
        """Removes the last ``num_tokens`` tokens of running request ``id`` (rejected
        speculative tokens, and any not yet computed)."""
    def reclaim_resident_blocks(self, shortfall: int) -> int: ...
    def reserve_import(self, id: int, tokens: Sequence[int], imported: int) -> list[int]:
        """Admits ``id`` whose first ``imported`` tokens' KV another party writes into the
        returned host blocks (one per page, in order)."""
    def import_blocks(self, id: int) -> Optional[list[int]]: ...
    def complete_import(self, id: int) -> None: ...
    def report(
        self,
        worker: Union[WorkerReport, int],
        enqueued: Optional[Sequence[int]] = None,
        completed: Optional[Sequence[int]] = None,
    ) -> None:
        """Records a worker's progress: a ``WorkerReport``, or its three parts."""
    def finish(self, id: int) -> None: ...
    def preempt(self, id: int) -> None: ...
    def num_tokens(self, id: int) -> Optional[int]: ...
    def num_computed(self, id: int) -> Optional[int]: ...
    def slot_of(self, id: int) -> Optional[int]: ...
    def ready_prefix_pages(self, id: int) -> Optional[int]: ...
    def page_state(
        self, id: int, page: int
    ) -> Optional[Literal["dirty", "pending", "pending_release", "clean", "unpinned", "reclaimed"]]: ...
    def has_hot_region(self, id: int) -> Optional[bool]: ...
    def host_only_pages(self, id: int) -> Optional[int]: ...
    def prefill_end(self, id: int) -> Optional[int]: ...
    @property
    def durable_transfer(self) -> int: ...
    def is_empty(self) -> bool: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    def running_ids(self) -> list[int]: ...
    def pool_usage(self) -> _PoolUsage: ...
    def resident_row(self, id: int, bucket: int) -> list[int]: ...
    def host_row(self, id: int) -> list[int]: ...
    def hot_row(self, id: int, bucket: int) -> list[int]: ...
    def block_table_row(self, id: int, group: int) -> list[int]: ...
    def check_invariants(self) -> None: ...
    def check_drained(self) -> None:
        """Raises unless every request finished and every transfer completed left nothing
        held (what a run checks at its end)."""

@final
class Runtime:
    """The engine runtime: executes each step's command on a backend, on pools and a stream it
    owns or that the engine lends.

    Arrays (``topk``, ``rows``, ``counts``, ``state_rows``, pools) are anything with
    ``__cuda_array_interface__`` (PyTorch CUDA tensors), ``__array_interface__`` (numpy) or
    ``__dlpack__``; C-contiguous; int32 for the per-layer arrays. On ``"cuda"`` they are device
    tensors and the work runs on the runtime's compute stream (the engine's, when ``stream``
    is given), in order with the engine's kernels; on ``"cpu"`` they are host arrays and each
    call completes before it returns. Lent memory must not be touched by the engine while the
    runtime's work on it may be in flight, except in stream order."""

    def __new__(
        cls,
        layout: Layout,
        backend: str = "cpu",
        device: str = "",
        *,
        state_rows: int,
        max_step_tokens: int,
        max_batched_tokens: Optional[int] = None,
        worker: int = 0,
        stats_every: int = 1,
        device_pool: Any = None,
        host_pool: Any = None,
        stream: Optional[int] = None,
        writes_host: bool = True,
    ) -> Runtime: ...
    @property
    def backend(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def state_rows(self) -> int: ...
    @property
    def max_step_tokens(self) -> int: ...
    @property
    def lends_pools(self) -> bool: ...
    @property
    def host_pool_setup(self) -> Optional[str]: ...
    @property
    def pending_transfers(self) -> int: ...
    @property
    def max_batched_tokens(self) -> int: ...
    def begin_step(self, cmd: Command, *, stream: Optional[int] = None) -> None:
        """Before the forward pass (tables, resets, copy-on-write, restores, the slot mapping),
        on ``stream`` (default: the caller's current stream). Not inside a graph capture."""
    def set_batch(
        self, state_rows: Sequence[int], *, pad_to: Optional[int] = None, stream: Optional[int] = None
    ) -> None:
        """Writes the batch table (token row → state row, -1 = padding), padded with -1 to
        ``pad_to`` (a captured graph's token rows). Not inside a graph capture."""
    def resolve_index_group(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        num_tokens: Optional[int] = None,
        state_rows: Any = None,
        stream: Optional[int] = None,
    ) -> None:
        """``topk`` int32 ``[num_tokens, top_k]`` positions (-1 = none) → ``rows`` int32 physical
        rows of the flat device-pool view (-1 = none); every layer of the group swapped in. On
        ``stream`` (default: the caller's current stream); recorded by a graph capture."""
    def resolve_leader(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        num_tokens: Optional[int] = None,
        state_rows: Any = None,
        stream: Optional[int] = None,
    ) -> None: ...
    def remap_prefill(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        num_tokens: Optional[int] = None,
        state_rows: Any = None,
        stream: Optional[int] = None,
    ) -> None:
        """A prefill chunk's read: the top-k remapped through the resident tables."""
    def remap_modes(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        num_tokens: Optional[int] = None,
        state_rows: Any = None,
        dcp: Optional[Tuple[int, int, int]] = None,
        workspace: Optional[Tuple[Any, Any]] = None,
        stream: Optional[int] = None,
    ) -> None:
        """The resident remap with modes: ``dcp=(size, rank, interleave)`` (decode context
        parallelism: tokens of other ranks map to -1), ``workspace=(request_of_row, starts)``
        (prefill rows read from a gathered workspace: entry ``tok`` of prefill request ``p``
        maps to ``starts[p] + tok``)."""
    def compressed_slot_mapping(
        self,
        positions: Any,
        slot_mapping: Any,
        state_rows: Any,
        out: Any,
        *,
        host: bool = False,
        stream: Optional[int] = None,
    ) -> None:
        """Each token's indexer row (``block * rows_per_page + row``, -1 for none) in the
        device pool's indexer blocks, or with ``host=True`` in the indexer host cache."""
    def layer_call(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        state_rows: Any = None,
        swap: Literal["index_group", "leader", "prefill"] = "index_group",
        stream: Optional[int] = None,
    ) -> LayerCall:
        """A prepared per-layer call: the arrays are read, checked and lent once; each call of
        the returned object does only the runtime's work. ``state_rows`` (int32 ``[T]``, read
        at each call on the device; -1 or a row beyond the runtime's is padding) replaces the
        batch ``set_batch`` gives: a micro-batch (the README's *Micro-batches*)."""
    def apply_plan(self, layer: int, *, stream: Optional[int] = None) -> None: ...
    def end_step(self, cmd: Command, *, stream: Optional[int] = None) -> None:
        """After the forward pass: mirrors, spills and indexer backups on the copy stream,
        ordered after ``stream``. Not inside a graph capture."""
    def poll(self) -> WorkerReport: ...
    def poll_and_report(self, coordinator: Coordinator) -> WorkerReport: ...
    def drain(self) -> WorkerReport: ...
    def synchronize(self, *, stream: Optional[int] = None) -> None:
        """Blocks until the work on ``stream`` (default: the caller's current stream) is done."""
    def counters(self) -> _Counters: ...
    def resident_row(self, bucket: int, state_row: int) -> list[int]: ...
    def host_row(self, state_row: int) -> list[int]: ...
    def resident_table(self, bucket: int) -> DeviceArray:
        """int32 ``[state_rows, max_pages_per_request]``: page → resident GPU block (0 = read
        from host)."""
    def hot_table(self, bucket: int) -> DeviceArray:
        """int32 ``[state_rows, hot_blocks_per_request]``: each request's hot blocks (-1 =
        none)."""
    def host_table(self) -> DeviceArray:
        """int32 ``[state_rows, max_pages_per_request]``: page → host block (-1 = none)."""
    def indexer_table(self) -> DeviceArray:
        """int32 ``[state_rows, max_pages_per_request]``: page → indexer GPU block (0 = none)."""
    def regular_table(self, group: int) -> DeviceArray:
        """int32 ``[state_rows, width]`` of regular layout group ``group`` (0 = none)."""
    def slot_mapping(self) -> DeviceArray:
        """int32 ``[write groups, max_batched_tokens]``: each token of the open step's row in
        each write group's view (-1: none); rewritten by every ``begin_step``."""
    def slot_mapping_groups(self) -> list[int]:
        """The layout group of each slot-mapping row."""
    @property
    def step_tokens(self) -> int:
        """Tokens of the open (or last) step: the valid prefix of each slot-mapping row."""
    def batch_buffer(self) -> DeviceArray:
        """int32 ``[max_step_tokens]``: the batch table ``set_batch`` writes."""
    @property
    def captured_token_rows(self) -> list[int]: ...
    def write_device_pool(self, offset: int, data: bytes) -> None: ...
    def read_device_pool(self, offset: int, nbytes: int) -> bytes: ...
    def read_host_pool(self, offset: int, nbytes: int) -> bytes: ...

@final
class LayerCall:
    """A prepared per-layer call (``Runtime.layer_call``). Holds its arrays and its runtime
    alive; usable from one thread at a time."""

    def __call__(self, num_tokens: Optional[int] = None) -> None:
        """Runs the call over the first ``num_tokens`` token rows (all by default)."""
    @property
    def group(self) -> int: ...
    @property
    def swap(self) -> Literal["index_group", "leader", "prefill"]: ...
    @property
    def capacity(self) -> int:
        """Token rows the arrays hold."""

@final
class DeviceArray:
    """A read-only int32 view of one of the runtime's device buffers, holding the runtime alive.
    ``numpy.asarray(a)`` (CPU backend) or ``torch.as_tensor(a, device="cuda")`` (CUDA) views it
    without a copy; its address is fixed for the runtime's life."""

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """Host memory only (``AttributeError`` otherwise)."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA memory only (``AttributeError`` otherwise)."""
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> Literal["int32"]: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def device(self) -> Literal["cpu", "cuda", "rocm"]: ...
