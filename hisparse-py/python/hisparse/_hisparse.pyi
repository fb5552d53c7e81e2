"""Type stubs of the compiled module ``hisparse._hisparse`` (re-exported by ``hisparse``)."""

from typing import Any, Optional, Sequence, TypedDict, final

__all__ = [
    "HiSparseError",
    "InvalidArgumentError",
    "OutOfDeviceMemoryError",
    "OutOfPinnedMemoryError",
    "NotFoundError",
    "UnsupportedError",
    "DeviceError",
    "Layout",
    "Coordinator",
    "Command",
    "Runtime",
    "plan_layout",
    "presets",
    "backends",
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
class OutOfDeviceMemoryError(HiSparseError): ...
class OutOfPinnedMemoryError(HiSparseError): ...
class NotFoundError(HiSparseError): ...
class UnsupportedError(HiSparseError): ...
class DeviceError(HiSparseError): ...

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

class _WorkerReport(TypedDict):
    worker: int
    enqueued: list[int]
    completed: list[int]

class _PoolUsage(TypedDict):
    gpu_used: int
    gpu_total: int
    host_used: int
    host_total: int

class _Counters(TypedDict):
    steps: int
    sampled_steps: int
    hot_hits: int
    hot_misses: int
    resident_reads: int
    h2d_bytes: int
    d2h_bytes: int
    remap_calls: int
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
) -> Layout:
    """Plans a layout. The model is a preset or ``model_json`` (the format of ``hisparse layout
    --print-model``); ``layers`` keeps the first layers only; sizes are bytes;
    ``num_gpu_blocks`` fixes the GPU pool's block count (null block included)."""

def presets() -> list[str]:
    """Names of the model presets."""

def backends() -> list[str]:
    """Names of the backends compiled into this build."""

@final
class Layout:
    """A planned KV-cache layout (immutable)."""

    @staticmethod
    def from_json(text: str) -> Layout:
        """A layout from ``Layout.to_json()`` or ``hisparse layout --json`` output."""
    def to_dict(self, capacity_contexts: Optional[Sequence[int]] = None) -> dict[str, Any]:
        """Exactly what ``hisparse layout --json`` prints for the same inputs."""
    def to_json(self, capacity_contexts: Optional[Sequence[int]] = None) -> str: ...
    def capacity(self, context_len: int) -> dict[str, Any]:
        """Requests that fit at ``context_len`` tokens, and the limiting tier."""
    def layer_offset(self, layer: int) -> tuple[int, int]:
        """``(bucket, offset)`` of sparse layer ``layer`` in the device pool: physical row ``r``
        of the flat attention view starts at byte ``offset + r * row_bytes``."""
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
    def index_groups(self) -> list[_IndexGroup]: ...

@final
class Command:
    """One step's command (plain data for ``Runtime.begin_step`` / ``end_step``)."""

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
    def preempted(self) -> list[int]: ...
    def to_dict(self) -> dict[str, Any]:
        """Every field of the command."""

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
    def step(self) -> Command: ...
    def report(self, worker: int, enqueued: Sequence[int], completed: Sequence[int]) -> None: ...
    def finish(self, id: int) -> None: ...
    def preempt(self, id: int) -> None: ...
    def num_tokens(self, id: int) -> Optional[int]: ...
    def num_computed(self, id: int) -> Optional[int]: ...
    def slot_of(self, id: int) -> Optional[int]: ...
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
        worker: int = 0,
        stats_every: int = 1,
        device_pool: Any = None,
        host_pool: Any = None,
        stream: Optional[int] = None,
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
    def pending_transfers(self) -> int: ...
    def begin_step(self, cmd: Command) -> None: ...
    def set_batch(self, state_rows: Sequence[int]) -> None: ...
    def resolve_index_group(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        num_tokens: Optional[int] = None,
        state_rows: Any = None,
    ) -> None:
        """``topk`` int32 ``[num_tokens, top_k]`` positions (-1 = none) → ``rows`` int32 physical
        rows of the flat device-pool view (-1 = none); every layer of the group swapped in."""
    def resolve_leader(
        self,
        group: int,
        topk: Any,
        rows: Any,
        counts: Any = None,
        *,
        num_tokens: Optional[int] = None,
        state_rows: Any = None,
    ) -> None: ...
    def apply_plan(self, layer: int) -> None: ...
    def end_step(self, cmd: Command) -> None: ...
    def poll(self) -> _WorkerReport: ...
    def poll_and_report(self, coordinator: Coordinator) -> _WorkerReport: ...
    def drain(self) -> _WorkerReport: ...
    def synchronize(self) -> None: ...
    def counters(self) -> _Counters: ...
    def resident_row(self, bucket: int, state_row: int) -> list[int]: ...
    def host_row(self, state_row: int) -> list[int]: ...
    def write_device_pool(self, offset: int, data: bytes) -> None: ...
    def read_device_pool(self, offset: int, nbytes: int) -> bytes: ...
    def read_host_pool(self, offset: int, nbytes: int) -> bytes: ...
