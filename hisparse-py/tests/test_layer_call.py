"""Prepared per-layer calls (`Runtime.layer_call`): the arrays are read once, each call does
only the runtime's work, and the rows are those of the one-shot calls."""

import gc
import weakref

import numpy as np
import pytest

import hisparse
import scenario


def test_prepared_calls_give_the_one_shot_rows():
    one_shot = scenario.run(scenario.Shape(), lend_pools=True)
    prepared = scenario.run(scenario.Shape(), lend_pools=True, prepared=True)
    assert prepared.verified == one_shot.verified > 0
    for a, b in zip(prepared.rows, one_shot.rows):
        np.testing.assert_array_equal(a, b)
    assert prepared.counters == one_shot.counters


@pytest.fixture()
def decode_step():
    f = scenario.first_step(requests=2)
    return f.shape, f.layout, f.rt, f.cmd


def test_a_prepared_call_checks_its_arrays_once_and_its_token_count_each_time(decode_step):
    s, layout, rt, cmd = decode_step
    topk = np.zeros((2, s.top_k), dtype=np.int32)
    rows = np.full((2, s.top_k), -7, dtype=np.int32)
    call = rt.layer_call(0, topk, rows)
    assert (call.group, call.swap, call.capacity) == (0, "index_group", 2)
    assert "LayerCall(group=0" in repr(call)
    with pytest.raises(hisparse.InvalidArgumentError, match="num_tokens = 3"):
        call(3)
    call(1)
    assert (rows[0] >= 0).all() and (rows[1] == -7).all()
    with pytest.raises(hisparse.InvalidArgumentError, match="int32"):
        rt.layer_call(0, topk.astype(np.int64), rows)
    with pytest.raises(hisparse.InvalidArgumentError, match="group = 9"):
        rt.layer_call(9, topk, rows)
    with pytest.raises(hisparse.InvalidArgumentError, match="swap"):
        rt.layer_call(0, topk, rows, swap="everything")
    with pytest.raises(hisparse.InvalidArgumentError, match="num_tokens = -1"):
        call(-1)
    rt.end_step(cmd)


def test_a_prepared_call_keeps_its_arrays_alive(decode_step):
    s, layout, rt, cmd = decode_step
    topk = np.zeros((1, s.top_k), dtype=np.int32)
    rows = np.empty((1, s.top_k), dtype=np.int32)
    alive = [weakref.ref(topk), weakref.ref(rows)]
    call = rt.layer_call(0, topk, rows, swap="leader")
    del topk, rows
    gc.collect()
    assert all(w() is not None for w in alive)
    call()
    assert call.swap == "leader"
    assert (alive[1]() >= 0).all()
    del call
    gc.collect()
    assert all(w() is None for w in alive)
    rt.end_step(cmd)
