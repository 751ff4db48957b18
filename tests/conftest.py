"""Shared fixtures: a clean Dynamo state per test, and helpers that compare with eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import torch_adreno  # noqa: F401  (registers the backend when not installed)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Dynamo's recompile limit would otherwise silently send later tests to eager.
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
