"""The step's device metadata an engine's kernels read: the slot mapping (where each new token's
row goes in every write group's view), the batch table, and the per-layer views of the pool."""

import numpy as np
import pytest

import hisparse
import scenario


def test_the_slot_mapping_is_where_the_tables_put_each_token():
    f = scenario.first_step(requests=2)
    lay, rt, cmd = f.layout, f.rt, f.cmd
    slots = np.asarray(rt.slot_mapping())
    groups = rt.slot_mapping_groups()
    assert slots.shape == (len(groups), rt.max_batched_tokens) and slots.dtype == np.int32
    kinds = [g["kind"] for g in lay.to_dict()["groups"]]
    assert groups == sorted(groups)  # layout order
    assert [kinds[g] for g in groups] == ["indexer"] + ["resident"] * lay.num_buckets
    req, pos = scenario.step_tokens(cmd)
    t = rt.step_tokens
    assert t == len(pos) == sum(s["num_tokens"] for s in cmd.scheduled)
    slot_of = {s["id"]: s["slot"] for s in cmd.scheduled}
    for w, g in enumerate(groups):
        view = lay.layer_view(g, 0)
        for i in range(t):
            if kinds[g] == "resident":
                table = rt.resident_row(g - 2, slot_of[req[i]])
            else:
                table = f.coord.block_table_row(int(req[i]), g)
            page, at = divmod(int(pos[i]), view["rows_per_page"])
            want = table[page] * view["pages_per_block"] * view["rows_per_page"] + at
            assert slots[w, i] == want, (w, i)
        assert (slots[w, t:] == -1).all()
    rt.end_step(cmd)


def test_views_of_the_pool_are_the_flat_attention_rows():
    s = scenario.Shape()
    lay = scenario.layout(s)
    pool = hisparse.aligned_empty(lay.gpu_pool_bytes)
    views = lay.gpu_views()
    assert {v["group"] for v in views} == set(range(1, len(lay.to_dict()["groups"])))
    for layer in range(s.layers):
        bucket, offset = lay.layer_offset(layer)
        (v,) = [v for v in views if v["layer"] == layer and v["group"] == 2 + bucket]
        assert v["offset"] == offset and v["row_bytes"] == lay.row_bytes
        rows = hisparse.pool_rows(pool, v)
        r = 5 * lay.attention_block_stride + 3  # block 5, row 3
        rows[r] = np.arange(lay.row_bytes, dtype=np.uint8)
        at = offset + r * lay.row_bytes
        assert (pool[at : at + lay.row_bytes] == np.arange(lay.row_bytes)).all()
        paged = hisparse.pool_view(pool, v)
        assert paged.shape == (v["num_pages"], v["rows_per_page"], v["row_bytes"])
        assert (paged[r // v["rows_per_page"], r % v["rows_per_page"]] == rows[r]).all()
        assert hisparse.pool_pages(pool, v).shape == (v["num_pages"], v["rows_per_page"] * v["row_bytes"])
    indexer = lay.layer_view(1, 0)
    assert indexer["page_stride"] == lay.bytes_per_block
    with pytest.raises(hisparse.InvalidArgumentError, match="index its pages with pool_view"):
        hisparse.pool_rows(pool, indexer)
    assert hisparse.pool_view(pool, indexer).shape[0] == lay.num_gpu_blocks
    assert lay.layer_view(0, 0) is None  # the source group is on host
    with pytest.raises(hisparse.InvalidArgumentError, match="pool holds"):
        hisparse.pool_rows(pool[:100], lay.layer_view(2, 0))
    with pytest.raises(hisparse.InvalidArgumentError, match="1-D uint8"):
        hisparse.pool_rows(pool.view(np.int32), lay.layer_view(2, 0))


def test_split_rows_are_read_as_pages():
    lay = hisparse.plan_layout("deepseek-v4", layers=4, max_model_len=4096, gpu_mem=1 << 30, host_mem=1 << 30)
    split = [v for v in lay.gpu_views() if v["value_bytes"] != v["row_bytes"]]
    assert split, "DeepSeek V4's compressed layers have split rows"
    pool = np.zeros(split[0]["offset"] + split[0]["page_stride"] * 2, dtype=np.uint8)
    v = dict(split[0], num_pages=2)
    with pytest.raises(hisparse.InvalidArgumentError, match="split"):
        hisparse.pool_view(pool, v)
    assert hisparse.pool_pages(pool, v).shape == (2, v["rows_per_page"] * v["row_bytes"])


def test_the_batch_table_is_padded_and_checked():
    f = scenario.first_step(requests=2)
    rt, cmd = f.rt, f.cmd
    batch = np.asarray(rt.batch_buffer())
    assert batch.shape == (rt.max_step_tokens,)
    assert batch[: len(cmd.slots)].tolist() == cmd.slots
    rt.set_batch(cmd.slots[:1])
    assert batch.tolist() == [cmd.slots[0], -1]  # no stale row left behind
    assert rt.captured_token_rows == []
    rt.set_batch(cmd.slots[:1], pad_to=2)
    with pytest.raises(hisparse.InvalidArgumentError, match="pad"):
        rt.set_batch(cmd.slots, pad_to=1)
    with pytest.raises(hisparse.InvalidArgumentError, match="state row"):
        rt.set_batch([rt.state_rows])
    rt.end_step(cmd)


def test_a_batch_row_no_request_of_the_step_holds_is_refused():
    s = scenario.Shape(requests=2)
    lay = scenario.layout(s)
    coord = hisparse.Coordinator(lay, max_running=2)
    rt = hisparse.Runtime(lay, "cpu", state_rows=2, max_step_tokens=2)
    coord.admit(1, list(range(40)))
    cmd = coord.step()
    rt.begin_step(cmd)
    (held,) = cmd.slots
    with pytest.raises(hisparse.InvalidArgumentError, match=f"state row {1 - held}"):
        rt.set_batch([held, 1 - held])
    rt.end_step(cmd)


def test_a_command_runs_once_and_in_order():
    f = scenario.first_step()
    rt, coord, first = f.rt, f.coord, f.cmd
    rt.end_step(first)
    with pytest.raises(hisparse.InvalidArgumentError, match="step"):
        rt.begin_step(first)  # again
    second, third = coord.step(), coord.step()
    with pytest.raises(hisparse.InvalidArgumentError, match="step"):
        rt.begin_step(third)  # skips the second
    rt.begin_step(second)
    rt.end_step(second)


def test_a_prefill_remap_and_the_stream_argument_on_the_cpu_backend():
    f = scenario.first_step()
    rt, k = f.rt, f.shape.top_k
    topk = np.arange(k, dtype=np.int32).reshape(1, k)
    rows = np.full((1, k), -7, dtype=np.int32)
    rt.remap_prefill(0, topk, rows, stream=12345)  # no streams on the cpu backend: ignored
    assert (rows >= 0).all()
    again = np.full((1, k), -7, dtype=np.int32)
    rt.layer_call(0, topk, again, swap="prefill", stream=0)()
    np.testing.assert_array_equal(again, rows)
    assert rt.counters()["resolve_calls"] == 0
    rt.end_step(f.cmd, stream=None)
