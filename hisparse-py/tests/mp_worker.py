"""A worker process of the two-process test (`test_processes.py`), importable by the
`multiprocessing` spawn start method: its own layout plan, its own `Runtime` (on the CPU backend,
or on CUDA with PyTorch tensors and the process's own current stream), commands in and reports
out over a pipe — as wire bytes or as pickles."""

import hashlib
import os

import hisparse
import scenario


def receive(conn, transport: str, layout: hisparse.Layout):
    """The next command, or None when the scheduler says stop."""
    if transport == "bytes":
        blob = conn.recv_bytes()
        return None if blob == b"stop" else hisparse.Command.from_bytes(blob, layout)
    return conn.recv()  # a pickled Command (or None)


def send(conn, transport: str, report: hisparse.WorkerReport) -> None:
    if transport == "bytes":
        conn.send_bytes(report.to_bytes())
    else:
        conn.send(report)


def main(conn, rank: int, transport: str, shape: dict, backend: str = "cpu",
         shared_pool: "str | None" = None) -> None:
    """Executes every command it receives, reports after each, and at the end sends its final
    report and what it verified: `(rows verified, digest of every row it read, counters)`.
    With `shared_pool` (a `multiprocessing.shared_memory` name) its host pool is that memory,
    shared with the other worker; rank 0 writes it, the other only reads it."""
    segment = None
    try:
        s = scenario.Shape(**shape)
        # Planned here: what pickled commands are checked against.
        layout = scenario.layout(s, shared_host_pool=shared_pool is not None)
        host_pool = None
        if shared_pool is not None:
            from multiprocessing import shared_memory

            import numpy as np

            segment = shared_memory.SharedMemory(name=shared_pool)
            host_pool = np.ndarray((layout.host_pool_bytes,), dtype=np.uint8, buffer=segment.buf)
        ops = scenario.NumpyOps()
        if backend == "cuda":
            import torch

            ops = scenario.TorchOps(torch)
            # HISPARSE_WORKER_GPUS=N (N > 1): worker r on GPU r % N, its pools and its current
            # stream there and its runtime opened on that device (a machine with N GPUs).
            gpus = int(os.environ.get("HISPARSE_WORKER_GPUS", "1"))
            if gpus > 1:
                if torch.cuda.device_count() < gpus:
                    raise RuntimeError(f"HISPARSE_WORKER_GPUS={gpus} but {torch.cuda.device_count()} GPUs")
                torch.cuda.set_device(rank % gpus)
                ops.selector = str(rank % gpus)
        worker = scenario.Worker(s, layout, lend_pools=True, worker=rank, ops=ops,
                                 host_pool=host_pool, writes_host=shared_pool is None or rank == 0)
        while (cmd := receive(conn, transport, layout)) is not None:
            worker.execute(cmd)
            send(conn, transport, worker.rt.poll())
        send(conn, transport, worker.rt.drain())
        digest = hashlib.sha256(b"".join(r.tobytes() for r in worker.row_log)).hexdigest()
        conn.send(("done", worker.verified, digest, worker.rt.counters()))
        # The runtime lets go of the shared memory before the mapping closes.
        del worker, host_pool
        hisparse.wait_for_releases(60)
    except BaseException as e:  # the test process reports it
        conn.send(("failed", f"worker {rank}: {type(e).__name__}: {e}"))
        raise
    finally:
        if segment is not None:
            try:
                segment.close()
            except BufferError:  # a view still alive: the process exit unmaps it
                pass
