"""The runtime's resident remap with modes (decode context parallelism, a prefill workspace) and
the compressed slot mapping of the indexer caches, through the binding: each against the rule
it implements, over the tables the step wrote."""

import numpy as np
import pytest

import hisparse
import scenario


def remap_rule(lay, table, tok, dcp=None):
    """Where the resident remap sends token ``tok`` of a request whose resident row is
    ``table`` (with a context-parallel split ``dcp=(size, rank, interleave)``)."""
    if tok < 0:
        return -1
    if dcp is not None:
        size, rank, interleave = dcp
        run = tok // interleave
        if run % size != rank:
            return -1
        tok = (run // size) * interleave + tok % interleave
    page = tok // lay.block_size
    if page >= len(table) or table[page] < 0:
        return -1
    return table[page] * lay.attention_block_stride + tok % lay.block_size


def test_remap_modes_follow_the_split_and_the_workspace():
    f = scenario.first_step(requests=2)
    lay, rt, cmd = f.layout, f.rt, f.cmd
    k = lay.top_k
    slots = [s["slot"] for s in cmd.scheduled]
    state_rows = np.array(slots, dtype=np.int32)
    topk = np.stack([(np.arange(k, dtype=np.int32) * 3 - 2) % 40 - 1 for _ in slots]).astype(np.int32)
    tables = [rt.resident_row(0, s) for s in slots]
    dcp = (2, 1, 4)
    rows = np.zeros_like(topk)
    counts = np.zeros(len(slots), dtype=np.int32)
    rt.remap_modes(0, topk, rows, counts, state_rows=state_rows, dcp=dcp)
    want = np.array([[remap_rule(lay, t, int(x), dcp) for x in r] for t, r in zip(tables, topk)])
    assert (rows == want).all()
    assert (counts == (want >= 0).sum(axis=1)).all()
    assert (want >= 0).any() and (want < 0).any(), "the split keeps some tokens and drops others"
    # The second row is a prefill row of workspace request 0, starting at workspace row 100.
    request_of_row = np.array([-1, 0], dtype=np.int32)
    starts = np.array([100], dtype=np.int32)
    rt.remap_modes(0, topk, rows, state_rows=state_rows, workspace=(request_of_row, starts))
    assert (rows[0] == [remap_rule(lay, tables[0], int(x)) for x in topk[0]]).all()
    assert (rows[1] == np.where(topk[1] >= 0, 100 + topk[1], -1)).all()
    with pytest.raises(hisparse.InvalidArgumentError, match="request_of_row"):
        rt.remap_modes(0, topk, rows, state_rows=state_rows, workspace=(request_of_row[:1], starts))
    rt.end_step(cmd)


def test_the_compressed_slot_mapping_names_each_tokens_indexer_row_in_both_caches():
    f = scenario.first_step(requests=2)
    lay, rt, cmd, coord = f.layout, f.rt, f.cmd, f.coord
    req, pos = scenario.step_tokens(cmd)
    slot_of = {s["id"]: s["slot"] for s in cmd.scheduled}
    state_rows = np.array([slot_of[r] for r in req], dtype=np.int32)
    positions = pos.astype(np.int32)
    own = np.zeros_like(positions)
    # This model is uncompressed: one indexer row per token, a page of them per block.
    rows_per_page = lay.block_size
    for host, group in [(False, 1), (True, 0)]:
        out = np.full_like(positions, 7)
        rt.compressed_slot_mapping(positions, own, state_rows, out, host=host)
        tables = {r: coord.block_table_row(int(r), group) for r in set(req.tolist())}
        want = [
            tables[r][p // rows_per_page] * rows_per_page + p % rows_per_page
            for r, p in zip(req.tolist(), pos.tolist())
        ]
        assert out.tolist() == want, host
    # Padding (a negative own slot) writes no row.
    out = np.zeros_like(positions)
    rt.compressed_slot_mapping(positions, own - 1, state_rows, out)
    assert (out == -1).all()
    with pytest.raises(hisparse.InvalidArgumentError, match="out"):
        rt.compressed_slot_mapping(positions, own, state_rows, out[:1])
    rt.end_step(cmd)
