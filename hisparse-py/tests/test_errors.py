"""Bad calls from Python are exceptions that name the problem; nothing crashes."""

import numpy as np
import pytest

import hisparse
import scenario


@pytest.fixture()
def setup():
    s = scenario.Shape()
    layout = scenario.layout(s)
    coord = hisparse.Coordinator(layout, max_running=s.requests)
    rt = hisparse.Runtime(layout, "cpu", state_rows=s.requests, max_step_tokens=s.requests)
    coord.admit(1, list(range(40)))
    return s, layout, coord, rt


def begin(coord, rt):
    cmd = coord.step()
    rt.begin_step(cmd)
    rt.set_batch(cmd.slots)
    return cmd


def test_per_layer_call_outside_a_step(setup):
    s, _, _, rt = setup
    topk = np.zeros((1, s.top_k), dtype=np.int32)
    with pytest.raises(hisparse.InvalidArgumentError, match="out of sequence"):
        rt.resolve_index_group(0, topk, np.empty_like(topk))


@pytest.mark.parametrize(
    "make,says",
    [
        (lambda k: (np.zeros((1, k), np.int64), np.zeros((1, k), np.int32)), "int32"),
        (lambda k: (np.zeros((1, k), np.int32), np.zeros((1, k), np.float32)), "int32"),
        (lambda k: (np.zeros((1, 2 * k), np.int32)[:, ::2], np.zeros((1, k), np.int32)), "contiguous"),
        (lambda k: (np.zeros((1, k + 1), np.int32), np.zeros((1, k + 1), np.int32)), "columns"),
        (lambda k: (np.zeros((1, k), np.int32), np.zeros(k - 1, np.int32)), "elements"),
        (lambda k: ([0] * k, np.zeros((1, k), np.int32)), "not an array"),
    ],
)
def test_bad_arrays(setup, make, says):
    s, _, coord, rt = setup
    begin(coord, rt)
    topk, rows = make(s.top_k)
    with pytest.raises(hisparse.InvalidArgumentError, match=says):
        rt.resolve_index_group(0, topk, rows)


def test_aliased_and_read_only_outputs(setup):
    s, _, coord, rt = setup
    begin(coord, rt)
    both = np.zeros((1, s.top_k), dtype=np.int32)
    with pytest.raises(hisparse.InvalidArgumentError, match="share memory"):
        rt.resolve_index_group(0, both, both)
    rows = np.zeros((1, s.top_k), dtype=np.int32)
    rows.flags.writeable = False
    with pytest.raises(hisparse.InvalidArgumentError, match="read-only"):
        rt.resolve_index_group(0, both, rows)


def test_outside_the_layout(setup):
    s, layout, coord, rt = setup
    begin(coord, rt)
    topk = np.zeros((1, s.top_k), dtype=np.int32)
    with pytest.raises(hisparse.InvalidArgumentError, match="index group 99"):
        rt.resolve_index_group(99, topk, np.empty_like(topk))
    with pytest.raises(hisparse.InvalidArgumentError, match="state row"):
        rt.set_batch([s.requests])
    with pytest.raises(hisparse.InvalidArgumentError):
        rt.resident_row(layout.num_buckets, 0)


def test_pools_too_small_or_misaligned():
    s = scenario.Shape()
    layout = scenario.layout(s)
    small = hisparse.aligned_empty(layout.gpu_pool_bytes - 16)
    with pytest.raises(hisparse.InvalidArgumentError, match="device pool"):
        hisparse.Runtime(layout, "cpu", state_rows=1, max_step_tokens=1, device_pool=small)
    host = hisparse.aligned_empty(layout.host_pool_bytes + 4096)[16 : 16 + layout.host_pool_bytes]
    with pytest.raises(hisparse.InvalidArgumentError, match="page-aligned"):
        hisparse.Runtime(layout, "cpu", state_rows=1, max_step_tokens=1, host_pool=host)


def test_backends_by_name():
    layout = scenario.layout(scenario.Shape())
    with pytest.raises(hisparse.InvalidArgumentError, match="unknown backend"):
        hisparse.Runtime(layout, "tpu", state_rows=1, max_step_tokens=1)
    assert "cpu" in hisparse.backends()
    for name in ("vulkan", "rocm"):
        if name not in hisparse.backends():
            with pytest.raises(hisparse.NotFoundError, match="not compiled"):
                hisparse.Runtime(layout, name, state_rows=1, max_step_tokens=1)


def test_coordinator_errors(setup):
    _, layout, coord, _ = setup
    with pytest.raises(hisparse.InvalidArgumentError, match="already exists"):
        coord.admit(1, [1, 2])
    with pytest.raises(hisparse.InvalidArgumentError, match="empty prompt"):
        coord.admit(2, [])
    with pytest.raises(hisparse.InvalidArgumentError, match="no request"):
        coord.finish(99)
    with pytest.raises(hisparse.InvalidArgumentError, match="max_model_len"):
        coord.admit(3, list(range(layout.max_model_len + 1)))
    with pytest.raises(hisparse.InvalidArgumentError, match="worker 5"):
        coord.report(5, [], [])
    with pytest.raises(hisparse.InvalidArgumentError):
        hisparse.Coordinator(layout, max_running=0)


def test_command_is_plain_data(setup):
    _, _, coord, rt = setup
    cmd = begin(coord, rt)
    d = cmd.to_dict()
    assert d["step"] == cmd.step == 1
    assert [s["id"] for s in d["scheduled"]] == [s["id"] for s in cmd.scheduled] == [1]
    assert cmd.slots == [s["slot"] for s in cmd.scheduled]
    assert "Command(step=1" in repr(cmd)
    rt.end_step(cmd)
    with pytest.raises(hisparse.InvalidArgumentError, match="out of sequence"):
        rt.end_step(cmd)


@pytest.mark.parametrize(
    "call,says",
    [
        (lambda: hisparse.plan_layout(host_mem=1 << 50, gpu_mem=-1), "gpu_mem = -1 is out of range; pass an integer from 0 to"),
        (lambda: hisparse.plan_layout(max_model_len=1 << 40), "max_model_len = 1099511627776 is out of range"),
        (lambda: hisparse.plan_layout(layers="4"), "layers has type str, not int"),
        (lambda: hisparse.plan_layout(top_k=2.5), "top_k has type float, not int"),
        (lambda: hisparse.plan_layout().capacity(-8), "context_len = -8"),
        (lambda: hisparse.plan_layout().to_dict([8192, -1]), r"capacity_contexts\[1\] = -1"),
        (lambda: hisparse.plan_layout().layer_offset(1 << 33), "layer = 8589934592"),
    ],
)
def test_bad_integers_name_the_argument(call, says):
    """Issue 27 item 12: no builtin OverflowError/TypeError without the argument's name."""
    with pytest.raises(hisparse.InvalidArgumentError, match=says) as e:
        call()
    assert e.value.kind == "invalid argument"


def test_bad_integers_of_the_coordinator_and_runtime(setup):
    s, layout, coord, rt = setup
    for call, says in [
        (lambda: hisparse.Coordinator(layout, max_running=-1), "max_running = -1"),
        (lambda: coord.admit(-5, [1]), "id = -5"),
        (lambda: coord.admit(5, [1, 2, -3]), r"prompt\[2\] = -3"),
        (lambda: coord.admit(5, 7), "prompt has type int, not a sequence of integers"),
        (lambda: coord.report(0, [-1], []), r"enqueued\[0\] = -1"),
        (lambda: coord.schedule(1, 1 << 32), "num_tokens = 4294967296"),
        (lambda: hisparse.Runtime(layout, "cpu", state_rows=-1, max_step_tokens=1), "state_rows = -1"),
        (lambda: hisparse.Runtime(layout, "cpu", state_rows=1, max_step_tokens=None), "max_step_tokens has type NoneType"),
        (lambda: rt.set_batch([0, 1 << 31]), r"state_rows\[1\] = 2147483648 is out of range; pass an integer from -2147483648 to 2147483647"),
        (lambda: rt.resident_row(0, -1), "state_row = -1"),
        (lambda: rt.resolve_index_group(-1, None, None), "group = -1"),
    ]:
        with pytest.raises(hisparse.InvalidArgumentError, match=says):
            call()


@pytest.mark.parametrize("read", ["read_host_pool", "read_device_pool"])
def test_reads_are_checked_before_anything_is_allocated(setup, read):
    """Issue 27 item 7: a terabyte read of a small pool is a typed error, not an abort."""
    _, layout, _, rt = setup
    f = getattr(rt, read)
    with pytest.raises(hisparse.InvalidArgumentError, match="nbytes 1099511627776 reaches past the"):
        f(0, 1 << 40)
    size = layout.host_pool_bytes if read == "read_host_pool" else layout.gpu_pool_bytes
    with pytest.raises(hisparse.InvalidArgumentError, match="reaches past"):
        f(size - 8, 16)
    with pytest.raises(hisparse.InvalidArgumentError, match="offset = -1"):
        f(-1, 16)
    assert len(f(size - 16, 16)) == 16
    assert f(0, 0) == b""


def test_a_write_past_the_device_pool_is_refused(setup):
    _, layout, _, rt = setup
    with pytest.raises(hisparse.InvalidArgumentError, match="reaches past"):
        rt.write_device_pool(layout.gpu_pool_bytes - 4, b"12345678")


def test_pools_that_share_memory_are_refused_at_construction():
    """Issue 27 item 11: the same array as both pools (or overlapping slices of one) is refused
    before the runtime is built, not at the first resolve."""
    layout = scenario.layout(scenario.Shape())
    size = max(layout.gpu_pool_bytes, layout.host_pool_bytes)
    both = hisparse.aligned_empty(size + 8192)
    for device_pool, host_pool in [
        (both, both),
        (both[4096 : 4096 + layout.gpu_pool_bytes], both[: layout.host_pool_bytes]),
    ]:
        with pytest.raises(hisparse.InvalidArgumentError, match="device_pool and host_pool share memory"):
            hisparse.Runtime(layout, "cpu", state_rows=1, max_step_tokens=1,
                             device_pool=device_pool, host_pool=host_pool)
