"""A TrainingStep whose steps run on a remote device: a phone's GPU through ``torch-adreno-step
serve`` (over ``adb forward``), or any machine's, with PyTorch only on the desktop.

``TrainingStep(..., options={"device": "remote:HOST:PORT"})`` (or ``TORCH_ADRENO_DEVICE``):

- the remote device's properties become a compile target (``target.profiles.target_of_device``):
  the step is compiled and captured on a local OpenCL device, planned for the remote device's
  real limits;
- each capture is exported (the state's current values in it) and loaded on the remote device
  once; a later call with that batch geometry sends the batch and returns the loss, while the
  capture's guard holds (it reads only host objects: the same checks as a local replay);
- a changed scalar input (a schedule's learning rate, Adam's betas) is sent as a scalar;
- ``synchronize()`` (and ``state_dict()``) read the remote state into the host tensors;
- within ``torch_adreno.profile()``, each remote step's kernels are reported with the times the
  remote device's own profiling events measured (steps are loaded with profiling on: the remote
  runtime reads one event per operation after the step's wait).

Invariants: while a remote step holds the training state, the host copies (and the local
device's) are out of date until :meth:`RemoteTraining.pull`; a call the remote step cannot serve
(another batch geometry, a guard that fails) first brings the state home (:meth:`release`), drops
the local replays (their device memory is out of date), and runs locally, where it is captured and
shipped again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_adreno.errors import OptionError
from torch_adreno.remote import RemoteDevice, RemoteError, RemoteStep, device_profile, parse_remote
from torch_adreno.replay import guards
from torch_adreno.replay.capture import RecordedCopy
from torch_adreno.runtime.device import select_device
from torch_adreno.runtime.events import BUS, LaunchRecord
from torch_adreno.runtime.residency import Residency
from torch_adreno.targets.profiles import AdrenoTarget, target_of_device
from torch_adreno.training.geometries import Replays


def remote_spec(device: Any) -> tuple[str, int] | None:
    """``(host, port)`` of a ``remote:HOST:PORT`` device option, None for a local one."""
    return parse_remote(device) if isinstance(device, str) else None


def remote_target(device: RemoteDevice) -> AdrenoTarget:
    """The compile target a step for ``device`` is planned for: the limits its driver reports."""
    profile = device_profile(device.properties())
    return target_of_device(f"remote {profile.name} ({profile.driver}) at {device.address}".lower(), profile)


class RemoteTraining:
    """The remote side of one TrainingStep (see the module docstring)."""

    def __init__(self, spec: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        address = remote_spec(spec)
        assert address is not None
        self._address = address
        self.device = RemoteDevice(*address)
        self.target = remote_target(self.device)
        self._model, self._optimizer = model, optimizer
        self._step: RemoteStep | None = None
        self._signature: Hashable | None = None
        self._operations: list[Any] = []
        #: Per scalar input the remote step reads: its name there, its tensor, and the version sent.
        self._scalars: list[list[Any]] = []
        #: Steps the remote device ran, and captures shipped to it.
        self.steps_run = 0
        self.shipped = 0

    def local_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options the local capture compiles with: the present machine's default device,
        planned for the remote device (its target)."""
        if options.get("target"):
            raise OptionError("a remote device is its own compile target: leave the option target unset")
        local = select_device(None, use_environment=False)
        # (the local replay's kernels are never run, only exported: no rebuild for the arena)
        return {"replay_arena_kernels": False, **options, "device": local.label, "target": self.target}

    def serve(self, batch: tuple[Any, ...], signature: Hashable, replays: Replays) -> torch.Tensor | None:
        """The loss of a step run remotely, or None where the remote step cannot serve ``batch``."""
        if self._step is None or signature != self._signature or replays.guard_reason(signature, batch) is not None:
            return None
        for scalar in self._scalars:
            name, tensor, sent = scalar
            if tensor._version != sent:
                self._step.set_input(name, float(tensor))
                scalar[2] = tensor._version
        loss = self._step.step(*(_as_array(value, position) for position, value in enumerate(batch)))
        self.steps_run += 1
        if BUS.active:
            self._report_kernels()
        return torch.tensor(loss, dtype=torch.float32)

    @property
    def label(self) -> str:
        """The device's name in launch records: ``remote:HOST:PORT``."""
        return f"remote:{self._address[0]}:{self._address[1]}"

    @property
    def kernel_launches(self) -> int:
        """Kernels a step of the loaded remote step launches."""
        return sum(1 for op in self._operations if not isinstance(op, RecordedCopy))

    def _report_kernels(self) -> None:
        """The last remote step's kernels to the profile, each with its device time there. The remote
        operations are the shipped recording's, in order (one ONNX node each, named after its kernel)."""
        assert self._step is not None
        timed = self._step.profile(reset=True)["operations"]
        if len(timed) < len(self._operations):
            raise RemoteError(f"the remote step reported the times of {len(timed)} operations; the shipped step has "
                              f"{len(self._operations)}: was it loaded without profiling?")
        for op, remote in zip(self._operations, timed, strict=False):  # (a prediction's operations follow)
            name = f"{op.graph}.copy" if isinstance(op, RecordedCopy) else op.source.name
            if remote["name"] != name and not remote["name"].startswith(name + "#"):
                raise RemoteError(f"the remote step's operation {remote['name']!r} is not the shipped step's {name!r}: "
                                  "the server runs another step than this TrainingStep shipped")
            if not isinstance(op, RecordedCopy):
                runs = max(int(remote["runs"]), 1)
                BUS.launch(LaunchRecord(op.graph, op.source, None, self.label,
                                        float(remote["milliseconds"]) * 1e3 / runs))

    def ship(self, export: Callable[[str], Any], signature: Hashable, operations: Sequence[Any]) -> None:
        """Load the step just captured (exported by ``export``, with the state's current values) on
        the remote device, where it serves ``signature`` from the next call on; ``operations``: the
        capture's recorded operations (the remote step's, in order)."""
        self.close_step()
        if not self.device.connected:  # (a server's connection holds one step: closing it closed the connection)
            self.device = RemoteDevice(*self._address)
        with tempfile.TemporaryDirectory(prefix="torch_adreno_remote_") as folder:
            path = str(Path(folder) / "step.onnx")
            export(path)
            self._step = self.device.load_step(path, profile=True)
        self._signature, self._operations = signature, list(operations)
        self.shipped += 1
        inputs = {entry["name"] for entry in self._step.state_layout}
        names = _export_names(self._model, self._optimizer)
        self._scalars = [[names[id(t)], t, t._version] for t, place in guards.state_tensors(self._model, self._optimizer)
                         if place[0] == "group" and names.get(id(t)) in inputs]

    def pull(self, residency: Residency, replays: Replays) -> int:
        """The remote state into the host tensors (the local device's deferred values first, so
        that the host holds nothing newer); returns the bytes read. The remote step's own guard
        expects the versions this gives: it keeps serving."""
        if self._step is None:
            return 0
        residency.synchronize()
        state = self._step.read_state()
        tensors = {name: tensor for tensor_id, name in _export_names(self._model, self._optimizer).items()
                   for tensor in [_by_id(self._model, self._optimizer).get(tensor_id)] if tensor is not None}
        before = replays.watched_versions()
        with torch.no_grad():
            for name, array in state.items():
                target = tensors.get(name)
                if target is not None:
                    target.copy_(torch.from_numpy(np.require(array, requirements="W")).view(target.dtype).reshape(target.shape))
        replays.accept_own_writes(before, only=self._signature)
        return sum(np.asarray(a).nbytes for a in state.values())

    def release(self, residency: Residency, replays: Replays) -> None:
        """Before a call the remote step cannot serve: the state home, the remote step closed, and
        the local replays dropped (their device memory did not follow the remote steps)."""
        if self._step is None:
            return
        self.pull(residency, replays)
        self.close_step()
        replays.clear()

    def close_step(self) -> None:
        if self._step is not None:
            self._step.close()
        self._step, self._signature, self._scalars, self._operations = None, None, [], []

    def close(self) -> None:
        self.close_step()
        self.device.close()


def _export_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    from torch_adreno.export import state_names

    return state_names(model, optimizer)


def _by_id(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, torch.Tensor]:
    return {id(t): t for t, _ in guards.state_tensors(model, optimizer)}


def _as_array(value: Any, position: int) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype == torch.bfloat16:
        raise TypeError(f"batch argument {position} is bfloat16, which the step server takes as raw bits only: "
                        "pass float32 or float16 batches to a remote device")
    return value.detach().contiguous().numpy()
