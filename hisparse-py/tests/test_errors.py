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
