"""The coordinator in the test process and two workers in processes of their own (spawn), each
with its own runtime: commands and reports cross the process boundary as wire bytes or pickles;
every row attention reads is verified in both workers, and every pool is empty at the end."""

import multiprocessing
import os
import pathlib
import pickle

import numpy as np
import pytest

import hisparse
import mp_worker
import scenario

SHAPE = dict(requests=3, prompt=96, decode=16)


def receive_report(conn, transport, layout):
    if transport == "bytes":
        return hisparse.WorkerReport.from_bytes(conn.recv_bytes(), layout)
    report = conn.recv()
    if isinstance(report, tuple):  # the worker failed
        raise AssertionError(report[1])
    return report


@pytest.mark.parametrize("transport", ["bytes", "pickle"])
def test_a_scheduler_and_two_worker_processes(transport):
    scheduler_and_two_workers(transport, "cpu")


def test_a_scheduler_and_two_cuda_worker_processes():
    """The same with each worker process on the GPU: its pools PyTorch CUDA tensors, its calls on
    its own current stream."""
    import device

    device.torch_cuda()
    scheduler_and_two_workers("bytes", "cuda")


def test_two_worker_processes_share_one_host_pool():
    """The node's one host pool: a shared-memory segment both workers lend as `host_pool`
    (layout planned with `shared_host_pool`); worker 0 writes it, worker 1 only reads it, and
    both read every row right."""
    scheduler_and_two_workers("bytes", "cpu", shared_pool=True)


def test_two_cuda_worker_processes_share_one_host_pool():
    """The same with each worker on the GPU: each registers the one segment with the driver."""
    import device

    device.torch_cuda()
    scheduler_and_two_workers("bytes", "cuda", shared_pool=True)


def scheduler_and_two_workers(transport, backend, shared_pool: bool = False):
    s = scenario.Shape(**SHAPE)
    layout = scenario.layout(s, shared_host_pool=shared_pool)
    coord = scenario.coordinator(s, layout, num_workers=2)
    for req in range(1, s.requests + 1):
        coord.admit(req, [1000 * req + t for t in range(s.prompt)])
    segment = None
    if shared_pool:
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=layout.host_pool_bytes)
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for rank in range(2):
        ours, theirs = ctx.Pipe()
        name = segment.name if segment is not None else None
        p = ctx.Process(target=mp_worker.main, args=(theirs, rank, transport, SHAPE, backend, name))
        p.start()
        pipes.append(ours)
        procs.append(p)
    try:
        steps = 0
        while not coord.is_empty():
            steps += 1
            assert steps < 10_000
            cmd = coord.step()
            for conn in pipes:
                if transport == "bytes":
                    conn.send_bytes(cmd.to_bytes())
                else:
                    conn.send(cmd)
            for rank, conn in enumerate(pipes):
                report = receive_report(conn, transport, layout)
                assert report.worker == rank
                coord.report(report)
            scenario.after_step(coord, coord.finish, s.prompt + s.decode)
        results = []
        for conn in pipes:
            if transport == "bytes":
                conn.send_bytes(b"stop")
            else:
                conn.send(None)
            coord.report(receive_report(conn, transport, layout))
            results.append(conn.recv())
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if segment is not None:
            segment.close()
            segment.unlink()
    for r in results:
        assert r[0] == "done", r[1]
    (_, verified_0, digest_0, counters_0), (_, verified_1, digest_1, counters_1) = results
    assert verified_0 == verified_1 > 1000
    assert digest_0 == digest_1, "the two workers read different rows"
    if shared_pool:
        # Only worker 0 writes the shared pool: its row mirrors are the node's host copies.
        writes = ("d2h_bytes", "mirror_spans")
        assert counters_0["mirror_spans"] > 0 and counters_1["mirror_spans"] == 0
        assert counters_1["d2h_bytes"] == 0
        counters_0 = {k: v for k, v in counters_0.items() if k not in writes}
        counters_1 = {k: v for k, v in counters_1.items() if k not in writes}
    assert counters_0 == counters_1
    assert counters_0["hot_misses"] > 0 and counters_0["reclaimed_pages"] > 0
    assert all(p.exitcode == 0 for p in procs)
    coord.check_drained()


@pytest.fixture()
def blobs():
    f = scenario.first_step()
    f.rt.end_step(f.cmd)
    return f, f.cmd.to_bytes(), f.rt.drain()


def test_commands_and_reports_round_trip(blobs):
    f, data, report = blobs
    assert data[:4] == b"HSCM"
    again = hisparse.Command.from_bytes(data, f.layout)
    assert again == f.cmd and again.to_dict() == f.cmd.to_dict()
    assert again.fingerprint == f.layout.fingerprint == f.cmd.fingerprint
    assert pickle.loads(pickle.dumps(f.cmd)) == f.cmd
    assert hisparse.WorkerReport.from_bytes(report.to_bytes(), f.layout) == report
    assert pickle.loads(pickle.dumps(report)) == report
    f.coord.report(pickle.loads(pickle.dumps(report)))


@pytest.mark.parametrize(
    "damage,says",
    [
        (lambda b: b[:-1], "cut short"),
        (lambda b: b[:10], "cut short"),
        (lambda b: b"", "empty"),
        (lambda b: b + b"x", "exactly one message"),
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "corrupted"),
        (lambda b: b"JUNK" + b[4:], "not a hisparse message"),
        (lambda b: b"HSWR" + b[4:], "WorkerReport"),
    ],
)
def test_a_damaged_command_is_a_wire_error(blobs, damage, says):
    f, data, _ = blobs
    bad = damage(data)
    with pytest.raises(hisparse.WireError, match=says) as e:
        hisparse.Command.from_bytes(bad, f.layout)
    assert isinstance(e.value, hisparse.InvalidArgumentError)
    assert e.value.kind == "invalid argument"
    with pytest.raises(hisparse.WireError, match=says):
        hisparse._hisparse._command_from_pickle(bad)


def test_a_command_of_another_layout_is_refused(blobs):
    f, data, report = blobs
    other = scenario.layout(scenario.Shape(gpu_blocks=33))
    assert other.fingerprint != f.layout.fingerprint
    with pytest.raises(hisparse.WireError, match="different layout"):
        hisparse.Command.from_bytes(data, other)
    with pytest.raises(hisparse.WireError, match="different layout"):
        hisparse.WorkerReport.from_bytes(report.to_bytes(), other)
    # A runtime or coordinator of another layout refuses the command or report itself.
    rt = hisparse.Runtime(other, "cpu", state_rows=1, max_step_tokens=1)
    with pytest.raises(hisparse.WireError, match="another layout"):
        rt.begin_step(f.cmd)
    coord = hisparse.Coordinator(other, max_running=1)
    with pytest.raises(hisparse.WireError, match="another layout"):
        coord.report(report)
    with pytest.raises(hisparse.InvalidArgumentError, match="without a layout"):
        hisparse.WorkerReport(0, [], []).to_bytes()
    assert hisparse.WorkerReport(0, [], [], layout=other).to_bytes()[:4] == b"HSWR"


def test_unpickling_checks_the_layouts_this_process_planned(blobs, tmp_path):
    """A fresh process that planned no layout, or another one, cannot take a pickled command."""
    import subprocess
    import sys

    f, _, _ = blobs
    blob = tmp_path / "cmd.pickle"
    blob.write_bytes(pickle.dumps(f.cmd))
    probe = (
        "import pickle, sys, hisparse, scenario\n"
        "if sys.argv[2] == 'other': scenario.layout(scenario.Shape(gpu_blocks=33))\n"
        "if sys.argv[2] == 'same': scenario.layout(scenario.Shape(requests=1, prompt=40))\n"
        "try:\n"
        "    print('decoded step', pickle.loads(open(sys.argv[1], 'rb').read()).step)\n"
        "except hisparse.InvalidArgumentError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    here = str(pathlib.Path(__file__).parent)
    said = {}
    for case in ("none", "other", "same"):
        out = subprocess.run([sys.executable, "-c", probe, str(blob), case], capture_output=True,
                             text=True, cwd=here, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [here, *filter(None, [os.environ.get("PYTHONPATH")])])})
        assert out.returncode == 0, out.stderr
        said[case] = out.stdout
    assert "no layout has been planned in this process" in said["none"]
    assert "WireError" in said["other"] and "has not planned" in said["other"]
    assert said["same"].strip() == f"decoded step {f.cmd.step}"
