"""Shared fixtures: a clean Dynamo state per test, and helpers that compare with eager PyTorch."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch._dynamo

import torch_adreno  # noqa: F401  (registers the backend when not installed)


def pytest_configure(config):
    # Compiled graphs from earlier runs (PyTorch's AOTAutograd cache) must not decide this run's
    # results: each session starts with an empty cache of its own, unless one is given.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torch_adreno_tests_"))
    # Every memory plan a test compiles or captures is proven against what runs (issue 25).
    os.environ.setdefault("TORCH_ADRENO_VERIFY_MEMORY", "1")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Dynamo's recompile limit would otherwise silently send later tests to eager.
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items):
    """Tests marked unified_memory are skipped, with the reason, on a discrete device."""
    from torch_adreno.runtime import get_runtime

    marked = [i for i in items if i.get_closest_marker("unified_memory")]
    if not marked:
        return
    try:
        unified = get_runtime(None).profile.unified_memory
    except Exception:  # no device: the device tests report that themselves
        return
    if not unified:
        skip = pytest.mark.skip(reason="zero-copy without transfers needs a unified-memory device")
        for item in marked:
            item.add_marker(skip)
