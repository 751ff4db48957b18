"""What crosses between host and device in a training step, counted by the profile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.runtime import get_runtime

pytestmark = pytest.mark.device


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("zero_copy", [False, pytest.param(True, marks=pytest.mark.unified_memory)])
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_step_moves_only_batch_parameters_outputs_and_gradients(model_name, zero_copy):
    """Copies: exactly batch + output gradient + changed parameters up, output + gradients down.
    Zero-copy: the same bytes, used in place (nothing copied)."""
    spec = MODELS[model_name]
    model = spec.make()
    compiled = torch.compile(model, backend="adreno", options={"zero_copy": zero_copy})
    # Sharing host memory avoids copies only where memory is unified (on a discrete GPU it is a
    # transfer the driver makes, and counted as one).
    copied = not (zero_copy and get_runtime(None).profile.unified_memory)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    params = list(model.parameters())
    for _ in range(3):
        x, y = spec.batch(gen)
        with torch_adreno.profile() as prof:
            opt.zero_grad()
            out = compiled(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
        assert prof.host_fallback_ops == []
        assert prof.transfer_bytes("d2h", "saved_activation", copied=None) == 0
        assert prof.transfer_bytes("h2d", "saved_activation", copied=None) == 0
        # Up: the batch, the gradient of the output, and the parameters the optimizer changed
        # (all of them, each step; nothing when unchanged, see below).
        assert prof.transfer_bytes("h2d", "input", copied) == _nbytes([x, out])
        assert prof.transfer_bytes("h2d", "parameter", copied) == _nbytes(params)
        # Down: the output and one gradient per parameter; no saved activation.
        assert prof.transfer_bytes("d2h", "output", copied) == _nbytes([out, *params])
        assert prof.transfer_bytes("d2h", None, copied) == _nbytes([out, *params])
        if not copied:
            assert prof.bytes_host_to_device == prof.bytes_device_to_host == 0


def test_unchanged_parameters_are_not_uploaded_again():
    spec = MODELS["mlp"]
    model = spec.make()
    compiled = torch.compile(model, backend="adreno", options={"zero_copy": False})
    x, _ = spec.batch(torch.Generator().manual_seed(0))
    with torch.no_grad():
        compiled(x)
        with torch_adreno.profile() as prof:
            compiled(x)
    assert prof.transfer_bytes("h2d", "parameter") == 0
    with torch.no_grad():
        model.fc1.bias.add_(1.0)  # an in-place change bumps the version counter
        with torch_adreno.profile() as prof:
            out = compiled(x)
    assert prof.transfer_bytes("h2d", "parameter") == _nbytes([model.fc1.bias])
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)


def test_saved_activations_stay_on_device_as_device_tensors():
    spec = MODELS["lenet"]
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    seen: list[type] = []

    def pack(t):
        seen.append(type(t))
        return t

    compiled = torch.compile(model, backend="adreno")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(x)
    assert torch_adreno.DeviceTensor in seen
    with torch_adreno.profile() as prof:
        F.cross_entropy(out, y).backward()
    assert prof.transfer_bytes("d2h", "saved_activation") == 0


def test_device_tensor_used_on_host_is_materialised_and_counted():
    spec = MODELS["mlp"]
    model = spec.make()
    x, _ = spec.batch(torch.Generator().manual_seed(0))
    saved: list[torch.Tensor] = []

    def pack(t):
        if isinstance(t, torch_adreno.DeviceTensor):
            saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.compile(model, backend="adreno")(x)
    assert saved
    with torch_adreno.profile() as prof:
        host = saved[0] * 1.0  # saved activations are device buffers, never shared host memory
    assert type(host) is torch.Tensor
    assert prof.transfer_bytes("d2h", "saved_activation") == _nbytes([saved[0]])
    torch.testing.assert_close(host, saved[0].to_host())
