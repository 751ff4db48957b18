"""The public surface: registration, options, device selection, errors and the host fallback."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import torch_adreno
from torch_adreno.config import OPTIONS, Config
from torch_adreno.errors import SymbolicShapeError
from torch_adreno.frontend import tracing
from torch_adreno.runtime.device import ENV_DEVICE, list_devices, select_device


def test_backend_is_registered():
    assert "adreno" in torch._dynamo.list_backends()


@pytest.mark.installed
def test_backend_found_without_importing_the_package():
    code = ("import torch, sys; m = torch.nn.Linear(3, 2); x = torch.randn(4, 3);"
            "out = torch.compile(m, backend='adreno')(x);"
            "assert 'torch_adreno' in sys.modules; torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-5)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown adreno backend option.*'colour'") as info:
        Config.from_options({"colour": "blue"})
    for name in OPTIONS:
        assert repr(name) in str(info.value)


def test_unknown_option_through_torch_compile_is_a_value_error():
    with pytest.raises(ValueError, match="valid options"):
        torch.compile(torch.nn.Linear(2, 2), backend="adreno", options={"speed": "fast"})


def test_bad_option_value():
    with pytest.raises(ValueError, match="'error', 'host'"):
        Config.from_options({"fallback": "gpu"})
    with pytest.raises(ValueError, match="device") as caught:
        Config.from_options({"device": 1.5})
    assert str(caught.value).startswith("option 'device': must be an int index") and str(caught.value).count(
        "device'") == 1, "the option's name once, not repeated"


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_device_name_is_refused_not_read_as_the_default(empty):
    with pytest.raises(torch_adreno.OptionError, match=r"option 'device': must name a device.*empty string"):
        Config.from_options({"device": empty})
    with pytest.raises(torch_adreno.OptionError, match=f"environment variable {ENV_DEVICE}: must name a device"):
        Config.from_options({}, environ={ENV_DEVICE: " "})
    with pytest.raises(torch_adreno.DeviceNotFoundError, match="empty device name"):
        select_device(empty)
    # An empty environment variable is an unset one, as usual for environment variables.
    assert Config.from_options({}, environ={ENV_DEVICE: ""}).device is None


def _fake_devices(*names):
    """Device entries as list_devices gives them, for names of our choosing (no driver needed)."""
    from types import SimpleNamespace

    import pyopencl as cl

    import torch_adreno.runtime.device as device
    from torch_adreno.runtime.device import DeviceEntry, Probe

    entries = []
    for i, name in enumerate(names):
        handle = -1 - i  # no real device has it: its probe is recorded as built
        device._probes[handle] = Probe(preferred_multiple=8)
        fake = SimpleNamespace(name=name, type=cl.device_type.CPU, int_ptr=handle)
        entries.append(DeviceEntry(i, "Portable Computing Language", fake))
    return entries


def test_a_device_name_matching_several_devices_is_refused_with_the_matches(monkeypatch):
    import torch_adreno.runtime.device as device

    monkeypatch.setattr(device, "list_devices", lambda: _fake_devices("pthread-Xeon", "cuda-Hopper", "Other GPU"))
    with pytest.raises(torch_adreno.DeviceNotFoundError,
                       match=r"'Portable' matches 3 OpenCL devices:\n  \[0\] Portable Computing Language: "
                             r"pthread-Xeon\n  \[1\] .*cuda-Hopper\n  \[2\] .*Other GPU\nPass the index"):
        select_device("Portable")
    monkeypatch.setenv(ENV_DEVICE, "Portable")
    with pytest.raises(device.AmbiguousDeviceError, match="matches 3"):
        select_device(None)
    assert select_device("cuda").index == 1
    assert select_device(" Hopper ").index == 1


def test_a_full_device_name_wins_over_names_containing_it(monkeypatch):
    import torch_adreno.runtime.device as device

    monkeypatch.setattr(device, "list_devices", lambda: _fake_devices("GPU", "GPU Pro"))
    assert select_device("gpu").index == 0
    assert select_device("gpu pro").index == 1
    with pytest.raises(device.AmbiguousDeviceError, match="'GP' matches 2"):
        select_device("GP")


def test_environment_variables(monkeypatch):
    assert Config.from_options({}, environ={ENV_DEVICE: "0"}).device == 0
    assert Config.from_options({}, environ={"TORCH_ADRENO_FALLBACK": "host"}).fallback == "host"
    assert Config.from_options({"device": "pocl"}, environ={ENV_DEVICE: "0"}).device == "pocl"
    with pytest.raises(ValueError, match="TORCH_ADRENO_FALLBACK"):
        Config.from_options({}, environ={"TORCH_ADRENO_FALLBACK": "maybe"})


@pytest.mark.device
def test_device_selection_by_index_and_name(monkeypatch):
    entries = list_devices()
    assert entries, "the test extra installs PoCL, a CPU OpenCL device"
    assert select_device(0).index == 0
    name = entries[-1].device.name.strip()
    assert select_device(name[:10].lower()).device.name.strip() == name
    monkeypatch.setenv(ENV_DEVICE, str(entries[-1].index))
    assert select_device(None).index == entries[-1].index


@pytest.mark.device
def test_unknown_device_lists_available_ones():
    with pytest.raises(torch_adreno.DeviceNotFoundError, match=r"Available devices:\n  \[0\]"):
        select_device("no-such-device-anywhere")
    with pytest.raises(torch_adreno.DeviceNotFoundError):
        select_device(999)


@pytest.mark.device
def test_unknown_device_through_torch_compile():
    compiled = torch.compile(torch.nn.Linear(2, 2), backend="adreno", options={"device": "no-such-device"})
    with pytest.raises(torch_adreno.DeviceNotFoundError, match="no OpenCL device matches"):
        compiled(torch.randn(1, 2))


def _uses_unsupported_op(x):
    return torch.kthvalue(x, 2, 0).values * 2  # the line the error must point at


@pytest.mark.device
def test_unsupported_op_error_names_op_node_and_source_line():
    compiled = torch.compile(_uses_unsupported_op, backend="adreno")
    with pytest.raises(torch_adreno.UnsupportedOpError) as info:
        compiled(torch.randn(5))
    message = str(info.value)
    assert "aten.kthvalue.default" in message
    assert "FX node 'kthvalue'" in message
    assert "test_backend.py" in message and "the line the error must point at" in message
    assert "options={'fallback': 'host'}" in message


@pytest.mark.device
def test_host_fallback_runs_warns_once_and_is_counted():
    from torch_adreno.lowering import _warned_host_ops

    _warned_host_ops.discard("aten.kthvalue.default")
    x = torch.randn(6, 3, requires_grad=True)
    compiled = torch.compile(_uses_unsupported_op, backend="adreno", options={"fallback": "host"})
    with pytest.warns(UserWarning, match=r"aten\.kthvalue\.default runs on the host"), torch_adreno.profile() as prof:
        out = compiled(x)
        out.sum().backward()
    reference = x.detach().clone().requires_grad_()
    expected = _uses_unsupported_op(reference)
    expected.sum().backward()
    torch.testing.assert_close(out, expected.detach())
    torch.testing.assert_close(x.grad, reference.grad)
    assert "aten.kthvalue.default" in prof.host_fallback_ops
    assert prof.transfer_bytes("d2h", "host_fallback") > 0
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(_uses_unsupported_op, backend="adreno", options={"fallback": "host"})(torch.randn(6, 3))
    assert not [w for w in caught if "aten.kthvalue" in str(w.message)], "the fallback warning repeats"


def test_mode_argument_is_rejected_at_torch_compile():
    with pytest.raises(ValueError, match="options="):
        torch.compile(torch.nn.Linear(2, 2), backend="adreno", mode="max-autotune")


@pytest.mark.device
def test_compiling_a_training_step_does_not_import_inductor():
    """AOTAutograd's CSE pass would import Inductor's lowering modules (~0.7 s of a process's first
    compile); the backend turns it off. A fresh process, since other tests import Inductor."""
    code = (
        "import sys, torch, torch.nn.functional as F, torch_adreno\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))\n"
        "f = torch.compile(lambda x, y: F.cross_entropy(m(x), y), backend='adreno')\n"
        "f(torch.randn(4, 8), torch.tensor([0, 1, 2, 0])).backward()\n"
        "assert m[0].weight.grad is not None\n"
        "assert 'torch._inductor.lowering' not in sys.modules, 'Inductor was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.device
def test_symbolic_sizes_seen_only_while_tracing_are_compiled_per_concrete_shape(monkeypatch):
    """AOTAutograd may trace symbolic sizes that neither Dynamo's inputs nor its metadata show
    (torch 2.11, an optimizer step recompiled after another model's): the graph is then compiled
    per concrete shape at its first calls, as a graph Dynamo traced with symbolic shapes is."""
    real = tracing.trace_and_compile
    traced: list[list[tuple[int, ...]]] = []

    def symbolic_the_first_time(config, gm, example_inputs, kernel_choices=None):
        traced.append([tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)])
        if len(traced) == 1:
            raise SymbolicShapeError("graph input arg0_1 has a symbolic shape (s18,)")
        return real(config, gm, example_inputs, kernel_choices=kernel_choices)

    monkeypatch.setattr(tracing, "trace_and_compile", symbolic_the_first_time)
    f = torch.compile(lambda x: torch.tanh(x) * 2.0, backend="adreno", dynamic=False)
    for _ in range(2):
        x = torch.randn(7)
        torch.testing.assert_close(f(x), torch.tanh(x) * 2.0)
    assert traced == [[(7,)], [(7,)]]  # the trace that failed, then one compile at the first call


def test_a_misspelt_option_is_named_with_the_nearest_valid_one():
    with pytest.raises(ValueError, match=r"'zero_cpy' \(did you mean 'zero_copy'\?\)") as info:
        torch_adreno.Config.from_options({"zero_cpy": False})
    assert len(str(info.value)) < 800 and "memory_reuse" in str(info.value)
