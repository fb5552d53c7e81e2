"""A runtime is usable from any thread, one call at a time (issue 27 item 8); a call into it
while another call is running in it is a typed error, never a panic or a hang."""

import threading

import numpy as np
import pytest

import hisparse
import scenario


def on_a_new_thread(f):
    """Runs `f` on a thread of its own and re-raises what it raised."""
    failure = []

    def body():
        try:
            f()
        except BaseException as e:  # handed to the calling thread
            failure.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if failure:
        raise failure[0]


def test_every_step_on_another_thread_gives_the_same_rows():
    home = scenario.run(scenario.Shape(), lend_pools=True)
    away = scenario.run(scenario.Shape(), lend_pools=True, runner=on_a_new_thread)
    assert away.verified == home.verified > 0
    for a, b in zip(away.rows, home.rows):
        np.testing.assert_array_equal(a, b)
    assert away.counters == home.counters


def test_a_runtime_built_on_one_thread_is_used_on_another():
    layout = scenario.layout(scenario.Shape())
    built = []
    on_a_new_thread(lambda: built.append(hisparse.Runtime(layout, "cpu", state_rows=2, max_step_tokens=2)))
    rt = built[0]
    assert rt.counters()["steps"] == 0
    assert np.asarray(rt.host_table()).shape == (2, layout.max_pages_per_request)
    del built, rt  # dropped on this thread


class Reentrant:
    """An array whose interface calls back into the runtime while the runtime reads it (as
    another thread's call would arrive while a call is running)."""

    def __init__(self, rt, array):
        self.rt, self.array, self.seen = rt, array, None

    @property
    def __array_interface__(self):
        try:
            self.rt.counters()
        except hisparse.HiSparseError as e:
            self.seen = e
        return self.array.__array_interface__


def test_a_call_while_a_call_is_running_is_a_typed_error():
    f = scenario.first_step()
    rt, k = f.rt, f.shape.top_k
    topk = Reentrant(rt, np.zeros((1, k), dtype=np.int32))
    rt.resolve_index_group(0, topk, np.empty((1, k), dtype=np.int32))
    assert isinstance(topk.seen, hisparse.ConcurrentUseError), topk.seen
    assert isinstance(topk.seen, hisparse.InvalidArgumentError)
    assert "one thread at a time" in topk.seen.message
    # The runtime is usable again once the call returned.
    assert rt.counters()["resolve_calls"] + rt.counters()["remap_calls"] >= 0
    rt.end_step(f.cmd)


def test_threads_racing_for_one_runtime_get_typed_errors_or_results():
    layout = scenario.layout(scenario.Shape())
    rt = hisparse.Runtime(layout, "cpu", state_rows=2, max_step_tokens=2)
    outcomes = []

    def hammer():
        for _ in range(200):
            try:
                rt.drain()
                rt.synchronize()
                outcomes.append("ok")
            except hisparse.ConcurrentUseError:
                outcomes.append("busy")

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 800 and "ok" in outcomes
    assert set(outcomes) <= {"ok", "busy"}


def test_a_coordinator_built_on_one_thread_is_used_on_another():
    layout = scenario.layout(scenario.Shape())
    coord = hisparse.Coordinator(layout, max_running=2)
    coord.admit(1, list(range(40)))
    commands = []
    on_a_new_thread(lambda: commands.append(coord.step()))
    assert [s["id"] for s in commands[0].scheduled] == [1]
    coord.finish(1)


def test_a_large_pool_is_released_on_a_thread_of_its_own():
    """Dropping a runtime whose own host pool is 64 MiB or more returns before the pool is
    unmapped; `wait_for_releases` waits for it (without the GIL) and says whether it finished."""
    lay = hisparse.plan_layout("deepseek-v3.2", layers=1, gpu_mem=1 << 30, host_mem=96 << 20,
                               max_model_len=4096, num_gpu_blocks=256)
    assert lay.host_pool_bytes >= 64 << 20
    rt = hisparse.Runtime(lay, "cpu", state_rows=1, max_step_tokens=1)
    del rt
    assert hisparse.wait_for_releases(60)
    assert hisparse.releases_in_flight() == 0
    assert hisparse.wait_for_releases(0) and hisparse.wait_for_releases()
    for bad in (-1.0, float("nan")):
        with pytest.raises(hisparse.InvalidArgumentError, match="timeout"):
            hisparse.wait_for_releases(bad)
