"""Tests that need a GPU and PyTorch: how they find them, and how they say they did not.

Without PyTorch or a CUDA device a test is skipped, loudly (a warning names what is missing);
with `HISPARSE_REQUIRE_DEVICE=1` it fails instead."""

import os
import warnings

import pytest

import hisparse


def require_device() -> bool:
    return os.environ.get("HISPARSE_REQUIRE_DEVICE") == "1"


def missing(reason: str):
    """Skips the calling test, loudly — or fails it when a device is required."""
    message = f"NO CUDA DEVICE: {reason}; this test did not run"
    if require_device():
        pytest.fail(f"{message} (HISPARSE_REQUIRE_DEVICE=1)")
    warnings.warn(message)
    pytest.skip(message)


def torch_cuda():
    """PyTorch with a CUDA device and a hisparse build with the CUDA backend, or a skip."""
    try:
        import torch
    except ImportError:
        missing("PyTorch is not installed")
    if not torch.cuda.is_available():
        missing("torch.cuda.is_available() is False")
    if "cuda" not in hisparse.backends():
        missing("this hisparse build has no CUDA backend")
    return torch
