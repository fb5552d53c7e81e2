"""The engine's own scheduler drives the coordinator (`start`, `schedule`, `preempt`,
`rollback`, `build_offload_command`): every row read is verified, and every pool is empty once
the requests finished and the transfers drained (checked inside `scenario.run`)."""

import numpy as np
import pytest

import hisparse
import scenario


def test_an_own_fcfs_scheduler_reads_every_row_right():
    out = scenario.run(scenario.Shape(), lend_pools=True, own_scheduler=4096)
    c = out.counters
    assert out.verified > 3000
    assert c["reclaimed_pages"] > 0 and c["hot_misses"] > 0
    assert c["transfers_completed"] == c["transfers_enqueued"] > 0


def test_a_small_budget_and_a_tight_pool_make_it_preempt():
    out = scenario.run(scenario.Shape(requests=4, gpu_blocks=26), lend_pools=False, own_scheduler=64)
    assert out.preemptions > 0
    assert out.verified > 3000


def test_prepared_calls_under_an_own_scheduler():
    a = scenario.run(scenario.Shape(), lend_pools=True, own_scheduler=100)
    b = scenario.run(scenario.Shape(), lend_pools=True, own_scheduler=100, prepared=True)
    assert a.verified == b.verified
    for x, y in zip(a.rows, b.rows):
        np.testing.assert_array_equal(x, y)


@pytest.fixture()
def coord():
    s = scenario.Shape(requests=2, gpu_blocks=32)
    return hisparse.Coordinator(
        scenario.layout(s), max_running=2, enable_prefix_caching=False, reclaim_min_blocks=0
    )


def test_start_schedule_and_build(coord):
    coord.admit(1, list(range(50)))
    coord.admit(2, list(range(20)))
    first = coord.start(1, 16)
    assert first and first.outcome == "scheduled" and first.pool is None
    assert repr(first) == 'Alloc("scheduled")'
    assert coord.num_computed(1) == 16 and coord.num_running == 1 and coord.num_waiting == 1
    assert coord.start(2, 20)
    cmd = coord.build_offload_command()
    assert [(s["id"], s["first_token"], s["num_tokens"]) for s in cmd.scheduled] == [(1, 0, 16), (2, 0, 20)]
    assert cmd.step == 1
    # Step 2: the rest of request 1's prompt, request 2 waits for its sampled token.
    assert coord.schedule(1, 34)
    with pytest.raises(hisparse.InvalidArgumentError, match="request 1"):
        coord.schedule(1, 1)  # nothing left to compute
    cmd = coord.build_offload_command()
    assert [(s["id"], s["first_token"], s["num_tokens"]) for s in cmd.scheduled] == [(1, 16, 34)]
    coord.append_tokens(1, [5])
    assert coord.append_token_by_slot(coord.slot_of(2), 6) == 2
    assert coord.num_tokens(2) == 21
    with pytest.raises(hisparse.InvalidArgumentError, match="state row 7"):
        coord.append_token_by_slot(7, 1)
    assert coord.schedule(1, 1) and coord.schedule(2, 1)
    cmd = coord.build_offload_command()
    assert sorted(s["id"] for s in cmd.scheduled) == [1, 2]
    assert coord.page_state(1, 0) in ("dirty", "pending", "clean")
    assert coord.prefill_end(1) == 50 and coord.has_hot_region(1) is False
    coord.finish(1)
    coord.finish(2)
    assert coord.is_empty()


def test_a_pool_too_small_for_both_says_so(coord):
    coord.admit(1, list(range(100)))
    coord.admit(2, list(range(100)))
    assert coord.start(1, 100)
    short = coord.start(2, 100)
    assert not short and short.outcome in ("no_space", "wait")
    if short.outcome == "no_space":
        assert short.pool == "gpu" and "gpu" in repr(short)
    # Nothing was taken for it: it is still waiting, with nothing computed.
    assert coord.num_waiting == 1 and coord.num_computed(2) == 0
    cmd = coord.build_offload_command()
    coord.preempt(1)
    assert coord.num_running == 0 and coord.num_computed(1) == 0
    # Its blocks come back once the copies of its step are reported done.
    assert coord.start(2, 100).outcome == "wait"
    coord.report(0, [cmd.transfer_id], [cmd.transfer_id])
    assert coord.start(2, 100)


def test_rollback_gives_back_uncomputed_and_speculative_tokens():
    s = scenario.Shape()
    layout = hisparse.plan_layout(
        model_json=scenario.model_json(s), gpu_mem=0, host_mem=64 * s.layers * (s.row_bytes + 16) * s.block,
        max_model_len=256, device_buffer_size=64, num_gpu_blocks=64, max_query_len=3,
    )
    coord = hisparse.Coordinator(layout, max_running=1)
    coord.admit(1, list(range(20)))
    assert coord.start(1, 20)
    coord.build_offload_command()
    coord.append_tokens(1, [1, 2, 3])  # the sampled token and two drafts
    assert coord.schedule(1, 3)
    coord.build_offload_command()
    coord.rollback(1, 2)  # the verifier rejected both drafts
    assert (coord.num_tokens(1), coord.num_computed(1)) == (21, 21)
    with pytest.raises(hisparse.InvalidArgumentError, match="roll"):
        coord.rollback(1, 5)
    with pytest.raises(hisparse.InvalidArgumentError, match="num_tokens = -1"):
        coord.rollback(1, -1)


def test_an_import_is_reserved_written_and_started(coord):
    blocks = coord.reserve_import(7, list(range(40)), 32)
    assert len(blocks) == 2 and all(b > 0 for b in blocks)
    assert coord.import_blocks(7) == blocks
    with pytest.raises(hisparse.InvalidArgumentError, match="complete_import"):
        coord.start(7, 8)
    coord.complete_import(7)
    assert coord.import_blocks(7) is None
    assert coord.start(7, 8)
    assert coord.num_computed(7) == 40
    cmd = coord.build_offload_command()
    assert [(s["id"], s["first_token"], s["num_tokens"]) for s in cmd.scheduled] == [(7, 32, 8)]
    coord.finish(7)
    with pytest.raises(hisparse.InvalidArgumentError, match="between 1 and all but the last"):
        coord.reserve_import(8, [1, 2], 2)


def test_schedule_step_is_the_built_in_policy_without_the_command(coord):
    coord.admit(1, list(range(30)))
    summary = coord.schedule_step()
    assert summary == {"scheduled": 1, "tokens": 30, "preempted": 0, "waiting_on_reclaim": 0, "started": 1,
                       "refused": 0}
    cmd = coord.build_offload_command()
    assert cmd.scheduled[0]["num_tokens"] == 30
    usage = coord.pool_usage()
    assert usage["gpu_used"] + usage["gpu_free"] == usage["gpu_total"]
    coord.finish(1)


def test_worker_reports_are_objects_the_coordinator_takes():
    f = scenario.first_step()
    f.rt.end_step(f.cmd)
    rep = f.rt.drain()
    assert isinstance(rep, hisparse.WorkerReport)
    assert rep.worker == rep["worker"] == 0
    assert rep.enqueued == rep["enqueued"] == rep.completed == [f.cmd.transfer_id]
    assert rep == hisparse.WorkerReport(0, [f.cmd.transfer_id], [f.cmd.transfer_id])
    assert not rep.is_empty() and "WorkerReport(worker=0" in repr(rep)
    with pytest.raises(KeyError, match="worker"):
        rep["nothing"]
    with pytest.raises(hisparse.InvalidArgumentError, match="alone"):
        f.coord.report(rep, [], [])
    with pytest.raises(hisparse.InvalidArgumentError, match="enqueued and completed"):
        f.coord.report(0, [1])
    f.coord.report(rep)
    assert f.coord.durable_transfer == f.cmd.transfer_id
    f.coord.report(0, [], [])
    assert f.rt.poll().is_empty()


def test_check_drained_names_what_is_left():
    f = scenario.first_step()
    with pytest.raises(hisparse.InvalidArgumentError, match="request not finished"):
        f.coord.check_drained()
    f.rt.end_step(f.cmd)
    f.coord.finish(1)
    with pytest.raises(hisparse.InvalidArgumentError, match="not completed by every worker"):
        f.coord.check_drained()
    f.coord.report(f.rt.drain())
    f.coord.check_drained()
