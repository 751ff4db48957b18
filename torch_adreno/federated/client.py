"""A Flower client that trains with the compiled, replayed :class:`~torch_adreno.TrainingStep`.

Per round (``fit``), the weights cross between NumPy and the device once each way: the global
weights are written into the model's host tensors (no transfer yet), the first step of the round
uploads them with the rest of the training state, every later step keeps them on the device (only
the batch goes up and the loss comes down), and ``step.synchronize()`` at the end downloads the
new weights for Flower. The first step of a round runs through the compiled graphs and captures
the step again (the new host values fail the replay's version guard); every further step replays.

Optimizer state, per round: ``optimizer_state="reset"`` (the default) zeroes it in place before
local training -- what FedAvg assumes: each round's local solver starts afresh from the global
weights, and Adam's moments of last round's local weights do not describe the new global ones.
``"keep"`` carries it into the next round. Either way the state tensors stay the same objects
(their values change), so the compiled optimizer step is never recompiled; with a copy-mode
device they cross once per round too (uploaded with the weights, downloaded at the sync).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.federated.data import Partition
from torch_adreno.training.optimizers import make_optimizer

OPTIMIZER_STATE_MODES = ("reset", "keep")

try:
    from flwr.client import NumPyClient
except ImportError as err:  # the optional dependency
    raise ImportError("torch_adreno.federated needs Flower: pip install 'torch-adreno[federated]' "
                      "(or pip install flwr)") from err


def weights_digest(arrays: list[np.ndarray]) -> str:
    """A SHA-256 over the arrays' shapes, dtypes and bytes: lets the server check what a client received."""
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(f"{a.shape}{a.dtype}".encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


class AdrenoClient(NumPyClient):
    """Trains ``model`` on one :class:`Partition` with a replayed ``TrainingStep`` (Adam) on the
    device that ``options`` selects. The weights Flower exchanges are the model's ``state_dict``
    tensors, in its order. ``fit`` returns the metrics ``loss`` (mean training loss of the round),
    ``accuracy`` (the locally trained model on the local held-out digits), ``step_time_ms``
    (median of the replayed steps), ``steps``, ``replayed_steps``, ``bytes_host_to_device``,
    ``bytes_device_to_host`` and ``bytes_shared`` (the round's device transfers, from
    ``torch_adreno.profile()``), ``devices`` (the device its kernels ran on, as
    ``python -m torch_adreno devices`` names it), ``received_digest`` (:func:`weights_digest` of the global
    weights) and ``client_index``."""

    def __init__(self, model: torch.nn.Module, partition: Partition, *, client_index: int = 0, epochs: int = 1,
                 batch_size: int = 32, lr: float = 2e-3, optimizer_state: str = "reset",
                 options: Mapping[str, Any] | None = None, seed: int = 0,
                 fail_at_round: int | None = None) -> None:
        """``fail_at_round``: fault injection for testing a federation's failure handling -- the
        process exits (status 3) halfway through local training in that round."""
        if optimizer_state not in OPTIMIZER_STATE_MODES:
            raise ValueError(f"optimizer_state must be one of {OPTIMIZER_STATE_MODES}, got {optimizer_state!r}")
        if batch_size > len(partition.y_train):
            raise ValueError(f"batch size {batch_size} is larger than this client's {len(partition.y_train)} "
                             "training digits: pass a smaller batch size or fewer clients")
        self.model = model
        self.partition = partition
        self.client_index = client_index
        self.epochs = epochs
        self.batch_size = batch_size
        self.optimizer_state = optimizer_state
        self.fail_at_round = fail_at_round
        self.optimizer = make_optimizer("adam", model.parameters(), lr=lr)
        self.step = torch_adreno.TrainingStep(model, _loss, self.optimizer, options)
        self._predict = torch.compile(model, backend="adreno", options=dict(options or {}), dynamic=False)
        self._generator = torch.Generator().manual_seed(seed * 1000 + client_index)

    # -- weights -----------------------------------------------------------------------------

    def _state_tensors(self) -> list[torch.Tensor]:
        return list(self.model.state_dict(keep_vars=True).values())

    def get_parameters(self, config: Mapping[str, Any]) -> list[np.ndarray]:
        """The model's state_dict tensors as NumPy arrays, after one download from the device."""
        self.step.synchronize()
        return [t.detach().numpy().copy() for t in self._state_tensors()]

    def set_parameters(self, arrays: list[np.ndarray]) -> None:
        """Write ``arrays`` into the model's host tensors; the next step uploads them (once)."""
        tensors = self._state_tensors()
        if len(arrays) != len(tensors):
            raise ValueError(f"received {len(arrays)} arrays for a model with {len(tensors)} state_dict tensors: "
                             "the server and this client train different models")
        names = list(self.model.state_dict(keep_vars=True))
        for name, tensor, array in zip(names, tensors, arrays, strict=True):
            if tuple(array.shape) != tuple(tensor.shape):
                raise ValueError(f"received shape {tuple(array.shape)} for {name} of shape {tuple(tensor.shape)}: "
                                 "the server and this client train different models")
        self.step.synchronize()  # the host copies current, so that writing them is no conflict
        with torch.no_grad():
            for tensor, array in zip(tensors, arrays, strict=True):
                tensor.copy_(torch.from_numpy(np.asarray(array)).to(tensor.dtype))

    def _reset_optimizer_state(self) -> None:
        with torch.no_grad():
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        value.zero_()

    # -- Flower's calls ----------------------------------------------------------------------

    def fit(self, parameters: list[np.ndarray], config: Mapping[str, Any]) -> tuple[list[np.ndarray], int, dict]:
        server_round = int(config.get("server_round", 0))
        epochs = int(config.get("local_epochs", self.epochs))
        x, y = self.partition.x_train, self.partition.y_train
        steps_per_epoch = len(y) // self.batch_size  # full batches only: one replay, static shapes
        losses: list[float] = []
        step_times: list[float] = []
        replayed_before = self.step.replayed_steps
        with torch_adreno.profile() as prof:
            self.set_parameters(parameters)
            if self.optimizer_state == "reset":
                self._reset_optimizer_state()
            for _ in range(epochs):
                order = torch.randperm(len(y), generator=self._generator)
                for s in range(steps_per_epoch):
                    if server_round == self.fail_at_round and len(losses) == (epochs * steps_per_epoch) // 2:
                        os._exit(3)  # the injected crash: no cleanup, as a killed process
                    idx = order[s * self.batch_size:(s + 1) * self.batch_size]
                    replays = self.step.replayed_steps
                    started = time.perf_counter()
                    loss = self.step(x[idx], y[idx])
                    if self.step.replayed_steps > replays:
                        step_times.append(time.perf_counter() - started)
                    losses.append(float(loss))
            accuracy, _ = self._accuracy_and_loss(self.partition.x_test, self.partition.y_test)
            weights = self.get_parameters({})
        metrics = {
            "client_index": self.client_index,
            "loss": statistics.fmean(losses) if losses else float("nan"),
            "accuracy": accuracy,
            "steps": len(losses),
            "replayed_steps": self.step.replayed_steps - replayed_before,
            "step_time_ms": statistics.median(step_times) * 1e3 if step_times else float("nan"),
            "bytes_host_to_device": prof.bytes_host_to_device,
            "bytes_device_to_host": prof.bytes_device_to_host,
            "bytes_shared": prof.bytes_shared,
            "received_digest": weights_digest(parameters),
            # (Flower's metrics are scalars: the devices' labels joined)
            "devices": " + ".join(prof.devices),
        }
        return weights, len(losses) * self.batch_size, metrics

    def evaluate(self, parameters: list[np.ndarray], config: Mapping[str, Any]) -> tuple[float, int, dict]:
        """Loss and accuracy of ``parameters`` on this client's held-out digits, on the device."""
        self.set_parameters(parameters)
        accuracy, loss = self._accuracy_and_loss(self.partition.x_test, self.partition.y_test)
        return loss, len(self.partition.y_test), {"accuracy": accuracy, "client_index": self.client_index}

    def _accuracy_and_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        if len(y) == 0:
            return float("nan"), float("nan")
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self._predict(x)  # one batch: the local test share is small
        finally:
            self.model.train()
        return float((logits.argmax(1) == y).float().mean()), float(F.cross_entropy(logits, y))


def exit_with_parent(poll_seconds: float = 1.0) -> None:
    """Exit this process when its parent dies (it is re-parented): a local federation's clients
    never outlive the command that started them, even when it was killed without cleanup."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(4)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
