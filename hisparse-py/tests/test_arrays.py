"""Arrays reach the runtime through each exchange protocol: numpy's array interface, DLPack, and
the CUDA array interface (refused on the CPU backend, whose device data are host memory)."""

import numpy as np
import pytest

import hisparse
import scenario


class DlpackOnly:
    """Exposes an array through `__dlpack__` alone (as a PyTorch CPU tensor does)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class CudaLike:
    """Claims to be CUDA memory (as a PyTorch CUDA tensor's interface does)."""

    def __init__(self, array):
        self.__cuda_array_interface__ = {
            "shape": array.shape,
            "typestr": array.dtype.str,
            "data": (array.ctypes.data, False),
            "strides": None,
            "version": 3,
        }


def first_decode_call(wrap_topk, wrap_rows):
    """Runs the prefill, then one resolve of group 0 with the arrays wrapped as given."""
    f = scenario.first_step()
    k = f.shape.top_k
    topk = np.arange(k, dtype=np.int32).reshape(1, k)
    rows = np.full((1, k), -7, dtype=np.int32)
    f.rt.resolve_index_group(0, wrap_topk(topk), wrap_rows(rows))
    return rows


def test_dlpack_gives_what_the_array_interface_gives():
    plain = first_decode_call(lambda a: a, lambda a: a)
    assert (plain >= 0).all()
    via_dlpack = first_decode_call(DlpackOnly, DlpackOnly)
    np.testing.assert_array_equal(via_dlpack, plain)


def test_cuda_memory_is_refused_on_the_cpu_backend():
    with pytest.raises(hisparse.InvalidArgumentError, match="CUDA device 0 memory"):
        first_decode_call(CudaLike, lambda a: a)


def test_a_bad_interface_is_refused():
    class Broken:
        __array_interface__ = {"shape": (4,), "typestr": "<V4", "data": (0, False)}

    with pytest.raises(hisparse.InvalidArgumentError, match="element type"):
        first_decode_call(lambda a: Broken(), lambda a: a)
