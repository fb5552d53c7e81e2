"""The runtime's device tables as arrays an engine reads without a copy (numpy on the CPU
backend), always equal to what the runtime keeps, alive as long as a view of them is."""

import gc

import numpy as np
import pytest

import hisparse
import scenario


@pytest.fixture()
def stepped():
    f = scenario.first_step(requests=2)
    return f.layout, f.coord, f.rt, f.cmd


def test_tables_equal_the_runtime_rows_without_a_copy(stepped):
    layout, coord, rt, cmd = stepped
    for bucket in range(layout.num_buckets):
        table = np.asarray(rt.resident_table(bucket))
        assert table.dtype == np.int32 and table.shape == (2, layout.max_pages_per_request)
        assert not table.flags.writeable
        for slot in cmd.slots:
            assert table[slot].tolist() == rt.resident_row(bucket, slot)
        assert np.asarray(rt.resident_table(bucket)).ctypes.data == table.ctypes.data
        hot = np.asarray(rt.hot_table(bucket))
        assert hot.shape == (2, layout.hot_blocks_per_request)
    host = np.asarray(rt.host_table())
    for slot in cmd.slots:
        assert host[slot].tolist() == rt.host_row(slot)
    for sr in cmd.scheduled:
        assert np.asarray(rt.indexer_table())[sr["slot"]].tolist() == coord.block_table_row(sr["id"], 1)
    rt.end_step(cmd)


def test_a_view_outlives_its_runtime_name(stepped):
    _, _, rt, cmd = stepped
    rt.end_step(cmd)
    table = np.asarray(rt.host_table())
    before = table.copy()
    del rt, stepped
    gc.collect()
    np.testing.assert_array_equal(table, before)


def test_the_interfaces_say_where_the_memory_is(stepped):
    _, _, rt, cmd = stepped
    a = rt.host_table()
    assert a.device == "cpu" and a.dtype == "int32" and a.name == "host_table()"
    assert not hasattr(a, "__cuda_array_interface__")
    assert a.__array_interface__["data"][1] is True  # read-only
    assert "host_table()" in repr(a)
    rt.end_step(cmd)


def test_tables_outside_the_layout(stepped):
    layout, _, rt, cmd = stepped
    with pytest.raises(hisparse.InvalidArgumentError, match="buckets"):
        rt.resident_table(layout.num_buckets)
    with pytest.raises(hisparse.InvalidArgumentError, match="no regular groups"):
        rt.regular_table(0)
    with pytest.raises(hisparse.InvalidArgumentError, match="bucket = -1"):
        rt.hot_table(-1)
    rt.end_step(cmd)
