"""Shared fixtures: the `hisparse` command the layout tests compare with."""

import os
import pathlib
import shutil

import pytest


@pytest.fixture(scope="session")
def cli() -> str:
    """The `hisparse` binary: $HISPARSE_CLI, else the workspace's release or debug build, else
    the one on PATH. A missing binary fails the tests that compare with it (never a skip)."""
    env = os.environ.get("HISPARSE_CLI")
    if env:
        return env
    root = pathlib.Path(__file__).resolve().parents[2]
    for profile in ("release", "debug"):
        candidate = root / "target" / profile / "hisparse"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("hisparse")
    if found:
        return found
    pytest.fail(
        "no `hisparse` binary: build it (cargo build -p hisparse-cli) or set HISPARSE_CLI"
    )
