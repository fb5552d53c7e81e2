"""What a scheduler asks before it picks a batch — would a request fit now and why not, what
each tier has free, what a request needs — and a request refused while a step is scheduled,
which no longer stops the step for the others."""

import pytest

import hisparse
import scenario


def drive(coord, cmd):
    """The workers' part, instantly: every copy of the step completes."""
    if cmd.transfer_id is not None:
        coord.report(0, [cmd.transfer_id], [cmd.transfer_id])


def test_the_queries_answer_what_the_operations_then_do():
    s = scenario.Shape(requests=2, gpu_blocks=40)
    lay = scenario.layout(s)
    coord = hisparse.Coordinator(lay, max_running=2, max_batched_tokens=4096, reclaim_min_blocks=0)
    for req in (1, 2):
        coord.admit(req, [100 * req + t for t in range(96)])
    seen = set()
    for step in range(80):
        started = {}
        for req in (1, 2):
            if coord.num_tokens(req) is None:
                continue  # finished
            if coord.slot_of(req) is None:
                asked = coord.can_start(req, 64)
                got = coord.start(req, 64)
                assert asked.outcome == got.outcome and asked.pool == got.pool, (asked, got)
                if got:
                    started[req] = asked.tokens
                seen.add(("start", asked.outcome, asked.reclaims))
                continue
            todo = coord.num_tokens(req) - coord.num_computed(req)
            if not todo:
                continue
            need = coord.needs(req, todo)
            assert need["tokens"] == todo and need["context_tokens"] == coord.num_tokens(req)
            asked = coord.can_schedule(req, todo)
            got = coord.schedule(req, todo)
            assert asked.outcome == got.outcome and asked.pool == got.pool, (asked, got)
            assert asked.tokens == (todo if got else 0)
            seen.add(("schedule", asked.outcome, asked.reclaims))
            if got.outcome == "no_space":
                coord.preempt(req)  # the engine's choice: the request that is short
        cmd = coord.build_offload_command()
        for x in cmd.scheduled:  # a start schedules the first chunk its query said
            assert x["num_tokens"] == started.get(x["id"], x["num_tokens"])
        drive(coord, cmd)
        for req in coord.running_ids():
            if coord.num_computed(req) == coord.num_tokens(req):
                if coord.num_tokens(req) >= 130:
                    coord.finish(req)
                else:
                    coord.append_tokens(req, [1])
        free, usage = coord.free(), coord.pool_usage()
        assert free["rows"] == 2 - coord.num_running
        assert free["gpu_capacity"] == usage["gpu_total"] and free["host_capacity"] == usage["host_total"]
        assert free["hot_regions_free"] == free["gpu_blocks"] // free["hot_region_blocks"]
        if coord.is_empty():
            break
    assert coord.is_empty()
    assert ("schedule", "scheduled", False) in seen and ("start", "scheduled", False) in seen
    with pytest.raises(hisparse.InvalidArgumentError, match="request 99"):
        coord.can_start(99, 1)
    with pytest.raises(hisparse.InvalidArgumentError, match="num_tokens = -1"):
        coord.needs(1, -1)


def test_an_admission_reads_as_its_answer():
    s = scenario.Shape(requests=3, gpu_blocks=32)
    lay = scenario.layout(s)
    coord = hisparse.Coordinator(lay, max_running=3, max_batched_tokens=4096, reclaim_min_blocks=0)
    coord.admit(1, list(range(100)))
    coord.admit(2, list(range(1000, 1100)))
    first = coord.can_start(1, 4096)
    assert first and first.scheduled and first.tokens > 0 and first.pool is None
    assert coord.start(1, 4096)
    second = coord.can_start(2, 4096)
    assert not second and second.outcome in ("wait", "no_space") and second.tokens == 0
    assert repr(second).startswith("Admission(")


def test_a_request_refused_while_scheduling_does_not_stop_the_step():
    """Issue 27 item 5: a restart whose context outgrew the GPU pool is refused, reported in
    the command, and the others go on."""
    s = scenario.Shape(requests=2, prompt=80, decode=200, gpu_blocks=32)
    lay = scenario.layout(s)
    assert lay.to_dict()["max_prefill_context"] < 150
    coord = hisparse.Coordinator(lay, max_running=2, max_batched_tokens=4096, reclaim_min_blocks=0)
    coord.admit(1, list(range(80)))
    while coord.num_tokens(1) < 150:
        drive(coord, coord.step())
        if coord.num_computed(1) == coord.num_tokens(1):
            coord.append_tokens(1, [3])
    drive(coord, coord.step())
    coord.admit(2, list(range(1000, 1020)))
    coord.preempt(1)  # the engine's choice; its restart prefills 150 tokens, more than fit
    refused, ran = [], set()
    for _ in range(4):
        cmd = coord.step()
        refused += cmd.refused
        ran |= {x["id"] for x in cmd.scheduled}
        if cmd.refused:
            break
        drive(coord, cmd)
    assert [r["id"] for r in refused] == [1]
    (refused,) = refused
    assert refused["reason"] == "prefill_never_fits" and "shorten the prompt" in refused["message"]
    assert refused["needed"] > refused["capacity"]
    assert 2 in ran | {x["id"] for x in cmd.scheduled}, "the steps went on for the other request"
    assert coord.refusal(1) == {k: v for k, v in refused.items() if k != "id"}
    assert coord.refusal(2) is None
    with pytest.raises(hisparse.InvalidArgumentError, match="refused"):
        coord.schedule(1, 1)
    coord.finish(1)
    drive(coord, cmd)
    while not coord.is_empty():
        cmd = coord.step()
        drive(coord, cmd)
        if coord.num_computed(2) == coord.num_tokens(2):
            coord.finish(2)
    assert coord.schedule_step()["refused"] == 0
    drive(coord, coord.build_offload_command())
    coord.check_drained()
