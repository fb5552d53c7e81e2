"""Arrays over a layer's rows in the device pool an engine lends (``Runtime(device_pool=...)``),
built from the layout's view of the layer (``Layout.gpu_views()``, ``Layout.layer_view()``).

A view reads the pool as ``[num_pages, rows_per_page, row_bytes]`` bytes from byte ``offset``,
page ``v`` at ``offset + v * page_stride``; a slot-mapping value or an attention row ``r`` is
page ``r // rows_per_page``, row ``r % rows_per_page``. Every function returns a ``uint8`` view
of the pool itself (a numpy array for a numpy pool, a tensor for a PyTorch tensor), never a
copy: writes land in the pool. Reinterpret the last dimension as the model's element type
(``.view(torch.float16)``, ``.view(numpy.float16)``) as needed.
"""

from typing import Any, Mapping

from ._util import invalid

View = Mapping[str, int]


def _strided(pool: Any, view: View, shape: tuple, strides: tuple) -> Any:
    """``pool`` (a 1-D uint8 array or tensor) seen with ``shape`` and byte ``strides`` from
    ``view["offset"]``, after checking that every byte lies inside it."""
    if getattr(pool, "ndim", None) != 1 or str(getattr(pool, "dtype", "")).split(".")[-1] != "uint8":
        raise invalid("pool must be a 1-D uint8 array or tensor (the device pool as lent to the runtime)")
    offset = view["offset"]
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1 if all(shape) else offset
    size = pool.numel() if hasattr(pool, "numel") else pool.size
    if last > size:
        raise invalid(
            f"the view reaches byte {last} but the pool holds {size}; pass the pool the layout was planned for"
        )
    if hasattr(pool, "as_strided"):  # a PyTorch tensor
        if not pool.is_contiguous():
            raise invalid("pool must be contiguous")
        return pool.as_strided(shape, strides, pool.storage_offset() + offset)
    import numpy as np

    if not pool.flags.c_contiguous:
        raise invalid("pool must be contiguous")
    return np.lib.stride_tricks.as_strided(pool[offset:], shape=shape, strides=strides)


def _contiguous_rows(view: View, what: str) -> None:
    if view["value_bytes"] != view["row_bytes"]:
        raise invalid(
            f"{what}: this layer's rows are split (each page holds its rows' values, then their "
            "scales); read its pages with pool_pages"
        )


def pool_view(pool: Any, view: View) -> Any:
    """The layer's rows as ``[num_pages, rows_per_page, row_bytes]`` (contiguous rows only)."""
    _contiguous_rows(view, "pool_view")
    rb = view["row_bytes"]
    shape = (view["num_pages"], view["rows_per_page"], rb)
    return _strided(pool, view, shape, (view["page_stride"], rb, 1))


def pool_rows(pool: Any, view: View) -> Any:
    """The layer's rows as ``[num_pages * rows_per_page, row_bytes]``, row ``r`` at index ``r``:
    what a forward pass writes through the slot mapping with one ``index_copy_`` (numpy:
    ``rows[slots[valid]] = kv[valid]``) and what attention reads through the resolved rows.
    Needs pages that follow each other without a gap (resident and hot groups: the flat
    attention view); indexer and regular groups use ``pool_view``."""
    _contiguous_rows(view, "pool_rows")
    rb, rpp = view["row_bytes"], view["rows_per_page"]
    if view["page_stride"] != rpp * rb:
        raise invalid(
            f"pool_rows: this layer's pages are {view['page_stride']} bytes apart, not "
            f"{rpp * rb} (rows_per_page * row_bytes); index its pages with pool_view"
        )
    return _strided(pool, view, (view["num_pages"] * rpp, rb), (rb, 1))


def pool_pages(pool: Any, view: View) -> Any:
    """The layer's pages as ``[num_pages, rows_per_page * row_bytes]`` bytes, for any row form
    (split rows: the page's values, ``value_bytes`` each, then their scales)."""
    shape = (view["num_pages"], view["rows_per_page"] * view["row_bytes"])
    return _strided(pool, view, shape, (view["page_stride"], 1))
