"""HiSparse: a hierarchical KV cache for sparse-attention LLM inference.

The full KV cache lives in pinned host memory, the GPU keeps the pages that still fit, and each
decode step's top-k rows are swapped into small per-request GPU hot buffers. This package binds
what an engine drives once per step:

* :func:`plan_layout` → :class:`Layout` (``Layout.to_dict()`` is what ``hisparse layout --json``
  prints for the same inputs; ``Layout.gpu_views()`` how each layer reads the device pool, and
  :func:`pool_rows`, :func:`pool_view`, :func:`pool_pages` the arrays over a lent pool);
* :class:`Coordinator`: the engine's own scheduler asks it for each request's blocks
  (``start``, ``schedule`` → :class:`Alloc`), rolls back, preempts, finishes, and ends each step
  with ``build_offload_command()`` → :class:`Command`; ``step()`` is the built-in policy;
* :class:`Runtime`: executes each command on a backend chosen by name, on pools and streams the
  engine lends (PyTorch tensors and streams, numpy arrays), writes the step's device slot
  mapping, and runs the per-layer decode calls (prepared once: :class:`LayerCall`) on the
  caller's current stream — capturable into CUDA graphs; its device buffers are
  :class:`DeviceArray` views; ``poll()`` gives a :class:`WorkerReport`.

Errors are :class:`HiSparseError` subclasses with ``kind`` and ``message`` attributes. A
``Runtime`` is usable from any thread, one call at a time (:class:`ConcurrentUseError`
otherwise). The package README states the rules an engine keeps (steps, streams, graphs).
"""

from typing import TYPE_CHECKING

from ._hisparse import (
    Admission,
    Alloc,
    Command,
    ConcurrentUseError,
    Coordinator,
    DeviceArray,
    DeviceError,
    HiSparseError,
    InvalidArgumentError,
    LayerCall,
    Layout,
    NotFoundError,
    OutOfDeviceMemoryError,
    OutOfPinnedMemoryError,
    Runtime,
    UnsupportedError,
    WireError,
    WorkerReport,
    __version__,
    backends,
    plan_layout,
    presets,
    releases_in_flight,
    wait_for_releases,
)

from ._util import invalid
from .views import pool_pages, pool_rows, pool_view

if TYPE_CHECKING:
    import numpy

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: Alignment of a host pool (the page size the backends pin and map).
HOST_POOL_ALIGNMENT = 4096


def aligned_empty(nbytes: int, alignment: int = HOST_POOL_ALIGNMENT) -> "numpy.ndarray":
    """A zero-filled numpy ``uint8`` array of ``nbytes`` whose data starts at a multiple of
    ``alignment`` bytes: a host pool (or any buffer) to lend to a :class:`Runtime`."""
    import numpy as np

    if nbytes <= 0:
        raise invalid(f"nbytes = {nbytes}; pass a positive size")
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start : start + nbytes]


__all__ = [
    "Admission",
    "Alloc",
    "Command",
    "ConcurrentUseError",
    "Coordinator",
    "DeviceArray",
    "DeviceError",
    "GiB",
    "HOST_POOL_ALIGNMENT",
    "HiSparseError",
    "InvalidArgumentError",
    "KiB",
    "LayerCall",
    "Layout",
    "MiB",
    "NotFoundError",
    "OutOfDeviceMemoryError",
    "OutOfPinnedMemoryError",
    "Runtime",
    "UnsupportedError",
    "WireError",
    "WorkerReport",
    "__version__",
    "aligned_empty",
    "backends",
    "plan_layout",
    "pool_pages",
    "pool_rows",
    "pool_view",
    "presets",
    "releases_in_flight",
    "wait_for_releases",
]
