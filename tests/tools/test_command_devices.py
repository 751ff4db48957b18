"""``--device`` of every command reaches every kernel the command runs.

Each command runs with the smallest arguments that make it compile and run something, on a device
that is not the default one (``TORCH_ADRENO_DEVICE`` unset, so that a path reading the default
device instead of the command's choice runs there and is caught), named by its index and by its
name. Every kernel the command launched must have run on the device named: the launch records of
a ``torch_adreno.profile()`` around the command carry the device each kernel ran on. ``federated``
trains in client processes: each client reports the devices its kernels ran on, which the command
prints per round.
"""

from __future__ import annotations

import re

import pytest

import torch_adreno
from torch_adreno.cli import main
from torch_adreno.runtime.device import ENV_DEVICE, DeviceEntry, list_devices, select_device

pytestmark = pytest.mark.device


def _other_device(monkeypatch: pytest.MonkeyPatch) -> DeviceEntry:
    """A working device other than the default one, with the default rule in force."""
    monkeypatch.delenv(ENV_DEVICE, raising=False)
    default = select_device(None)
    others = [e for e in list_devices() if e.index != default.index and e.unusable is None]
    if not others:
        pytest.skip(f"no OpenCL device is available besides the default one ({default.label})")
    return others[0]


def _name_of(entry: DeviceEntry) -> str:
    """A name substring selecting ``entry``: its platform where no other device's label has it."""
    labels = [e.label.lower() for e in list_devices()]
    if sum(entry.platform.lower() in label for label in labels) == 1:
        return entry.platform
    return entry.label


#: Each command with the smallest arguments that compile and run kernels ({tmp}: a directory).
COMMANDS: dict[str, list[str]] = {
    "train": ["train", "--epochs", "2", "--batch-size", "16"],
    "export": ["export", "{tmp}/step.onnx", "--model", "mlp"],
    "finetune": ["finetune", "--steps", "6", "--lr", "0.05", "--seq", "8", "--batch", "2", "--rank", "2",
                 "--eval-batches", "0", "--out", "{tmp}/adapter"],
    "bench": ["bench", "--models", "mlp", "--steps", "1", "--variants", "unfused", "--out", "{tmp}/bench"],
    "project": ["project", "--model", "seed_mlp", "--target", "adreno740"],
    "modules": ["modules", "--modules", "nn.Linear", "--samples", "1"],
    "opinfo": ["opinfo", "--ops", "neg", "--samples", "1"],
    "zoo": ["zoo", "--models", "resnet", "--steps", "3"],
}


@pytest.mark.parametrize("how", ["index", "name"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_runs_its_kernels_on_the_device_named(command, how, monkeypatch, tmp_path, capsys):
    device = _other_device(monkeypatch)
    spec = str(device.index) if how == "index" else _name_of(device)
    argv = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
    with torch_adreno.profile() as prof:
        status = main([*argv, "--device", spec])
    captured = capsys.readouterr()
    assert status == 0, captured.out[-3000:] + captured.err[-3000:]
    assert prof.kernel_launches > 0, f"{command} launched no kernel"
    assert prof.devices == (device.label,), f"{command} --device {spec!r} ran kernels on {prof.devices}"


@pytest.mark.parametrize("how", ["index", "name"])
def test_federated_clients_train_on_the_device_named(how, monkeypatch, capsys):
    device = _other_device(monkeypatch)
    spec = str(device.index) if how == "index" else _name_of(device)
    status = main(["federated", "--clients", "1", "--rounds", "1", "--epochs", "1", "--device", spec])
    captured = capsys.readouterr()
    assert status == 0, captured.out[-3000:] + captured.err[-3000:]
    ran = re.findall(r"client 0: .*; ran on (.+)$", captured.out + captured.err, re.MULTILINE)
    assert ran == [device.label], captured.out[-3000:] + captured.err[-3000:]
