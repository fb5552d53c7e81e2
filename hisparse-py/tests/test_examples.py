"""The examples run as documented on the CPU backend (their CUDA runs are in test_cuda.py)."""

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def run(name, *args):
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_engine_loop_on_the_cpu_backend():
    out = run("engine_loop.py", "--backend", "cpu")
    assert "rows verified" in out and " 0 rows verified" not in out
    assert " 0 preemptions" not in out, "the example's pool no longer makes the engine preempt"


def test_engine_loop_in_micro_batches_on_the_cpu_backend():
    """The same engine with each group's call cut into micro-batch calls over their own state
    rows: every row verified, and the same hits and misses as one call per group."""
    whole = run("engine_loop.py", "--backend", "cpu")
    for n in ("2", "3"):
        out = run("engine_loop.py", "--backend", "cpu", "--micro-batches", n)
        assert "rows verified" in out and " 0 rows verified" not in out
        assert out == whole, (n, out, whole)
