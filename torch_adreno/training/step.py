"""A whole training step compiled for the device, with training state kept there between steps.

    step = torch_adreno.TrainingStep(model, loss_fn, optimizer)    # loss_fn(model, *batch) -> loss
    for x, y in loader:
        loss = step(x, y)          # forward, backward, optimizer step; gradients cleared after it
    step.synchronize()             # host copies of parameters and optimizer state current again

What it adds over compiling the loss and ``optimizer.step`` separately, on a device with memory of
its own (on unified-memory devices -- phones, PoCL -- nothing is copied either way): per step,
only the batch goes up and the loss comes down. Gradients never leave the device (the optimizer
graph reads them there; ``max_grad_norm=`` clips them there, between backward and step, see
:mod:`torch_adreno.training.gradients`); after the step each ``.grad`` is a marker whose every use
raises an error saying so. The new parameters and optimizer state are not written back to the host
after every step.

Host copies of parameters and optimizer state are brought up to date -- the sync points:
``step.synchronize()``; ``model.state_dict()`` and ``optimizer.state_dict()`` (hooks installed
here, so checkpoints are right); ``step.close()`` (or leaving ``with step:``); and in copy mode,
the first torch call reading an out-of-date host copy in the thread that ran the step (eager
forward, ``clone``, slices, ``numpy()``, ``copy.deepcopy`` / ``torch.save`` of the model, an
in-place edit), by the torch function mode of :mod:`torch_adreno.training.host_sync`. What that
mode cannot see -- other threads, NumPy arrays or views taken before the step, C code -- reads
host copies marked out of date by a NaN in their first element (floating point only: integer
state such as ``num_batches_tracked`` carries no mark); a change made there to an out-of-date
copy is an error at the next step or sync point, naming the tensor (``2.bias``,
``state['exp_avg'] of 0.weight``), and is discarded for the device's values.

A loss with a graph break runs in pieces, the code between them on the host, and is not replayed
(:mod:`torch_adreno.training.pieces`). What it requires, checked with a clear error: every parameter that
requires grad is in the optimizer, without gradient hooks; the optimizer step
runs on the device (if Dynamo would fall back to eager code -- a recompile limit hit, say -- the
step raises instead, naming the cause it sees: batches of changing shapes, or the optimizer's).
Graphs compiled with zero-copy sharing (the default on unified-memory devices) read host memory
itself; those of one residency reading a host copy another deferred synchronize it first.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from torch_adreno.config import Config
from torch_adreno.memory.footprint import DeviceFootprint, MemoryLimits
from torch_adreno.replay import guards
from torch_adreno.replay.capture import StepRecorder
from torch_adreno.replay.captured import CapturedStep
from torch_adreno.replay.driver_recording import driver_recording
from torch_adreno.replay.step import ReplayedStep, ReplayOptions
from torch_adreno.runtime import get_residency, get_runtime
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.events import BUS, StepRecord
from torch_adreno.runtime.residency import StepContext
from torch_adreno.targets.profiles import profile_for
from torch_adreno.training import host_sync
from torch_adreno.training.accumulation import GradientAccumulation
from torch_adreno.training.compiled_step import CompiledStep
from torch_adreno.training.full_path import FullPath
from torch_adreno.training.geometries import check_can_train
from torch_adreno.training.gradients import GradientMarkers, check_norm_type
from torch_adreno.training.hyperparameters import StepHyperparameters
from torch_adreno.training.memory_limits import StepMemory
from torch_adreno.training.progress import reported, slow_work
from torch_adreno.training.remote import RemoteTraining, remote_spec
from torch_adreno.training.state import name_of
from torch_adreno.training.step_replays import StepReplays


class _SyncHook:
    """A state_dict / load_state_dict pre-hook that synchronizes the step first. Holds the step
    weakly, and pickles / deep-copies as a hook that does nothing (``torch.save(model)``,
    ``copy.deepcopy(model)`` while a step is open)."""

    def __init__(self, step: TrainingStep) -> None:
        self._step = weakref.ref(step)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        step = self._step()
        if step is not None:
            step.synchronize()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_no_op, ())


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def _sync_hooks(model: torch.nn.Module, optimizer: torch.optim.Optimizer, hook: _SyncHook) -> list[Any]:
    """``hook`` as the state_dict pre-hook of every module and the optimizer, and as their
    load_state_dict pre-hook (the handles, to remove them)."""
    return [*(module.register_state_dict_pre_hook(hook) for module in model.modules()),
            model.register_load_state_dict_pre_hook(hook), optimizer.register_state_dict_pre_hook(hook),
            optimizer.register_load_state_dict_pre_hook(hook)]


def replay_options_for(config: Config, runtime: DeviceRuntime, limits: MemoryLimits) -> ReplayOptions:
    """How a TrainingStep's replays are built on ``runtime`` (held to ``limits``), from its options."""
    rebuild = config.replay_arena_kernels
    if rebuild == "auto":  # a GPU's (the target's, where one is given)
        rebuild = profile_for(runtime.profile, config.target).is_gpu
    return ReplayOptions(bool(rebuild), config.replay_merge_copies, config.verify_memory, limits,
                         fill_uninitialized_memory=config.fill_uninitialized_memory,
                         recording=driver_recording(runtime.device, config.replay_command_buffers, runtime.entry.label),
                         overlap=config.replay_overlap)


class TrainingStep:
    """``step(*batch)`` runs ``loss_fn(model, *batch)``, its backward and ``optimizer.step()`` on the
    device, clears the gradients and returns the loss (detached). See the module docstring for
    when host copies of the training state are current and what a step requires."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                 optimizer: torch.optim.Optimizer, options: Mapping[str, Any] | None = None, *,
                 max_grad_norm: float | None = None, norm_type: float = 2.0, replay: bool = True,
                 grad_scaler: torch.amp.GradScaler | None = None, accumulate: int = 1) -> None:
        """``max_grad_norm``/``norm_type``: clip the gradients' norm on the device, between backward
        and optimizer step (as ``clip_grad_norm_``). ``replay``: from the second step with a batch
        geometry on, run the step as the launch list recorded from the step before (see
        :mod:`torch_adreno.replay.step`), not through Dynamo, AOTAutograd and autograd, while the
        guards of :mod:`torch_adreno.replay.guards` hold. ``grad_scaler``: a ``GradScaler("cpu")`` for
        float16 autocast, applied on the device (:mod:`torch_adreno.training.scaler`). ``accumulate``: calls per optimizer step; the gradients of ``accumulate`` micro-batches,
        each loss scaled by ``1/accumulate``, are summed on the device and the optimizer steps on
        every ``accumulate``-th call (:mod:`torch_adreno.training.accumulation`);
        :attr:`stepped_optimizer` says whether the last call did."""
        config = Config.from_options(options)
        # A remote device: compiled and captured here, planned for it; its captures run there.
        self._remote = RemoteTraining(str(config.device), model, optimizer) if remote_spec(config.device) else None
        if self._remote is not None:
            options = self._remote.local_options(dict(options or {}))
            config = Config.from_options(options)
        check_norm_type(norm_type)
        check_can_train(model, optimizer)
        #: The backend options every compile of this step uses (a remote device's: those of its local
        #: capture); what compiles on the step's behalf (an exported prediction) compiles with them.
        self.options: Mapping[str, Any] = MappingProxyType(dict(options or {}))
        self.model = model
        self.optimizer = optimizer
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        if accumulate != 1 and grad_scaler is not None and grad_scaler.is_enabled():
            raise ValueError("TrainingStep: accumulate > 1 with a GradScaler is not supported yet; accumulate "
                             "in float32 or bfloat16 autocast (no scaler), or step every call")
        self._accumulation = GradientAccumulation(accumulate, self._params, dict(options or {}))
        self._compiled = CompiledStep(model, loss_fn, optimizer, self._params, dict(options or {}), self._accumulation,
                                      max_grad_norm, norm_type, grad_scaler)
        #: Whether the last call ran the optimizer step (every call, unless accumulating).
        self.stepped_optimizer = False
        self._gradients = GradientMarkers(self._params)
        self._residency = get_residency(get_runtime(config.device), config.zero_copy)
        self._memory = StepMemory(profile_for(self._residency.runtime.profile, config.target))
        #: The largest allocation and global memory this step is held to (the target's, else the device's).
        self.memory_limits = self._memory.limits
        replay_options = replay_options_for(config, self._residency.runtime, self.memory_limits)
        self._step_context = StepContext(self._memory.heap_group, config.heap_copies)
        # Hyperparameters as step inputs, during each call.
        self._hyperparameters = StepHyperparameters(optimizer, self._compiled.rule)
        # (removed on close: the sync hooks and the settings)
        self._hooks = [*_sync_hooks(model, optimizer, _SyncHook(self)), self._hyperparameters]
        self._closed = False
        self._residency.add_namer(self._name_of)
        self._full = FullPath(self._compiled, self._residency, self._step_context, self._gradients,
                              self._hyperparameters, self._memory, model, optimizer, self._params, self._name_of)
        self._replaying = StepReplays(model, optimizer, self._residency, self._memory.heap_group, replay_options,
                                      self._gradients, self._compiled.unreplayable_reason if replay else None,
                                      config.verify_replay)
        self._replays = self._replaying.kept
        self._replay_enabled = replay and self._compiled.unreplayable_reason is None

    @property
    def replayed_steps(self) -> int:
        """Calls that ran as a replay (no Dynamo, AOTAutograd or autograd)."""
        return self._replaying.replayed_steps

    @property
    def captures(self) -> int:
        """Calls that captured a replay (one per batch geometry, more where a guard failed)."""
        return self._replaying.captures

    @property
    def remote(self) -> RemoteTraining | None:
        """The remote device this step runs on (None: this machine's)."""
        return self._remote

    @property
    def replay(self) -> ReplayedStep | None:
        """The replay of the batch geometry captured last (None before any was captured)."""
        return self._replays.latest

    @property
    def device_footprint(self) -> DeviceFootprint | None:
        """The device memory of the replay captured last against :attr:`memory_limits` (None before a
        capture; one that does not fit is refused, a :class:`~torch_adreno.errors.DeviceMemoryError`)."""
        replay = self._replays.latest
        return None if replay is None else replay.footprint

    @property
    def replays_verified(self) -> int:
        """Replayed steps checked against the compiled graphs so far (option ``verify_replay``)."""
        return self._replaying.verified

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps a GradScaler skipped (a gradient overflowed), read current from the device."""
        return self._compiled.skipped_steps

    @property
    def unreplayable_reasons(self) -> tuple[str, ...]:
        """Why the batch geometries that cannot be replayed cannot (one reason each, in the order
        they were met; empty while every captured step replays)."""
        return self._replays.reasons

    def _name_of(self, tensor: torch.Tensor) -> str | None:
        return self._compiled.name_of(tensor) or name_of(tensor, self.model, self.optimizer)

    def __call__(self, *batch: Any) -> torch.Tensor:
        started = time.perf_counter()
        if self._closed:
            raise RuntimeError("this TrainingStep was closed; make a new one to train further")
        with self._hyperparameters:  # (hyperparameters as inputs during the call)
            loss = self._call(batch, started)
        self.stepped_optimizer = self._accumulation.steps_optimizer
        self._accumulation.advance()
        return loss

    def _signature(self, batch: tuple[Any, ...]) -> Hashable | None:
        """The key of a call's replay: the batch's geometry and the accumulation phase."""
        signature = guards.batch_signature(batch)
        return None if signature is None else (signature, self._accumulation.phase)

    def _call(self, batch: tuple[Any, ...], started: float) -> torch.Tensor:
        reason = None
        if self._remote is not None:
            remote_loss = self._remote.serve(batch, self._signature(batch), self._replays)
            if remote_loss is not None:
                self._replaying.replayed_steps += 1
                BUS.step(StepRecord("replay", time.perf_counter() - started, self._remote.kernel_launches, None, None))
                return remote_loss
            self._remote.release(self._residency, self._replays)
        if self._replays:
            # With host_sync's mode armed on the stack, every tensor access of the checks would go
            # through its Python __torch_function__ (~1.2 us each, against ~0.07): a replay runs with
            # torch functions off instead of taking the mode off the stack and putting it back.
            with torch._C.DisableTorchFunction():
                replay, loss, reason = self._replaying.run(batch, self._signature(batch), started)
            if replay is not None and loss is not None:
                loss = self._replaying.checked(replay, batch, loss, lambda: self._run_compiled(batch))
                after = time.perf_counter() - replay.loss_read_at
                replay.last_phases["after"] = after
                replay.last_host_seconds += after
                if BUS.active:
                    BUS.step(StepRecord("replay", replay.last_host_seconds, replay.kernel_launches, None, replay.footprint,
                                        replay.enqueue_path))
                return loss
        signature = self._signature(batch) if self._replay_enabled else None
        self._full.check(batch)  # (host_sync's mode off the stack: Dynamo would trace it)
        capture = signature is not None and self._replays.should_capture(signature)
        recorder = StepRecorder(self._residency.runtime, batch, tuple(self._params)) if capture else None
        versions = self._replays.watched_versions()
        work = slow_work(signature is None or self._replays.is_warm(signature), recorder is not None)
        kind = "full"
        with reported(work, signature) if work is not None else contextlib.nullcontext():
            loss = self._full.run(batch, recorder)
            self._replays.accept_own_writes(versions)
            if self._compiled.pieces_reason is not None and signature is not None:
                self._replays.refuse(signature, self._compiled.pieces_reason)
                recorder = None
            if recorder is not None and signature is not None:
                refused = self._replaying.capture(signature, recorder, loss, batch)
                kind, reason = ("capture", reason) if refused is None else (kind, refused)
                if kind == "capture" and self._remote is not None and (captured := self._replays.latest) is not None:
                    self._remote.ship(self.export, signature, captured.recording.operations)
        if kind == "full" and signature is not None and self._replays.unreplayable(signature) is not None:
            reason = self._replays.unreplayable(signature)
        if signature is not None:
            self._replays.warm(signature)
        BUS.step(StepRecord(kind, time.perf_counter() - started, 0, reason, self.device_footprint if kind == "capture" else None))
        return loss

    def _run_compiled(self, batch: tuple[Any, ...]) -> torch.Tensor:
        """The step through the compiled graphs, not recorded (a replay is checked against it)."""
        self._full.check(batch)
        versions = self._replays.watched_versions()
        loss = self._full.run(batch, None)
        self._replays.accept_own_writes(versions)
        return loss

    def captured_step(self, predict: torch.Tensor | None = None) -> CapturedStep:
        """The step captured last, frozen for :func:`torch_adreno.export.export_step`: synchronized
        first, with a copy of the state's current values, named as an export names them
        (``state_dict`` names, ``optimizer.<parameter>.<key>``, ``lr``); with ``predict`` (an input
        of the model), also the model's eval-mode forward on it (as batch argument 0). An
        :class:`~torch_adreno.export.ExportError` before a capture."""
        from torch_adreno.export import ExportError, state_names
        from torch_adreno.training.forward_capture import record_forward

        replay = self._replays.latest
        if replay is None:
            reasons = "; ".join(sorted(set(self.unreplayable_reasons)))
            raise ExportError("no step captured: call the TrainingStep at least twice with batches of one geometry "
                              "first (the second call captures it)" + (f"; not captured: {reasons}" if reasons else ""))
        with self._hyperparameters:  # (hyperparameter inputs named as a call's groups hold them)
            self.synchronize()
            forward = None if predict is None else record_forward(self.model, self.options, self._residency.runtime,
                                                                  predict)
            return replay.captured(state_names(self.model, self.optimizer), forward)

    def export(self, path: str | Path, predict: torch.Tensor | None = None) -> Any:
        """Write the captured step (call the step twice with one batch geometry first) to ``path`` as
        one ONNX model: batch and state in, loss and updated state out; with ``predict`` (an input of
        the model), also the model's eval-mode output on batch argument 0 (see :mod:`torch_adreno.export`).
        Returns the ``onnx.ModelProto``. The same as ``export_step(step.captured_step(predict), path)``."""
        from torch_adreno.export import export_step

        return export_step(self.captured_step(predict), path)

    def synchronize(self) -> int:
        """Bring the host copies of parameters and optimizer state up to date; returns the bytes copied."""
        try:
            if self._remote is not None:
                return self._remote.pull(self._residency, self._replays)
            return self._residency.synchronize()
        finally:
            host_sync.suspend(self._residency)

    def close(self) -> None:
        """Synchronize and remove the hooks; the step cannot be called afterwards."""
        if not self._closed:
            self._closed = True
            for hook in self._hooks:
                hook.remove()
            self.synchronize()
            self._compiled.finish()
            if self._remote is not None:
                self._remote.close()

    def __enter__(self) -> TrainingStep:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        try:
            self.close()
        except RuntimeError:
            if exc is None:  # never hide the exception that ended the block
                raise
