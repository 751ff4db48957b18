"""Deferred host copies made current on first touch, by a torch function mode held between steps.

A TrainingStep in copy mode leaves the host copies of parameters and optimizer state out of date
between steps (their current values are on the device). Anything reading them through PyTorch --
an eager forward, ``p.clone()``, ``p[1:]``, ``p.numpy()``, ``copy.deepcopy(model)``,
``torch.save(model)`` (both go through ``Tensor.__deepcopy__`` / ``__reduce_ex__`` / ``.data``)
-- is a torch function call with that tensor among its arguments. :class:`SyncOnFirstTouch`, a
``TorchFunctionMode`` on the stack of the thread that ran the step, sees that call first and
synchronizes the residency before it runs: the reader gets current values, with no NaN mark.

Invariants:
  * The mode is on the stack only between a step and the next sync point, at the bottom of the
    stack (under modes the user entered, whose ``__exit__`` pops the top), and never while a step
    runs (:func:`suspend`): the step's compiled code must not trace it.
  * Under Dynamo tracing it is transparent (``func(*args)``), so a function compiled between
    steps traces as it would without it (Dynamo compiles it once more for the different mode stack).
  * Metadata reads (shape, dtype, ``data_ptr``, ``_version``, ``nbytes``...) do not synchronize: the
    runtime makes them on every graph call, Dynamo's guard builder makes them while compiling a
    function between steps, and a graph reading the device copies needs no host copy.
  * After synchronizing from inside its own handler the mode cannot leave the stack (PyTorch
    pushes it back after the call); it stays disarmed, costing a Python call per op, until the
    next :func:`suspend` or :func:`release` in that thread removes it.

What it cannot see: other threads (the mode stack is per thread), tensors that share the memory
without being the same object (a NumPy array or a view taken before the step), and C code.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode


class _Synchronizing(Protocol):
    def deferred_keys(self) -> Any: ...

    def synchronize(self) -> int: ...


def _metadata_functions() -> frozenset[Any]:
    getters = ("shape", "dtype", "device", "layout", "requires_grad", "is_leaf", "grad_fn", "_version", "ndim",
               "is_sparse", "is_quantized", "is_meta", "is_cuda", "is_cpu", "is_nested", "_backward_hooks",
               "_post_accumulate_grad_hooks", "grad", "names", "__class__", "nbytes", "itemsize", "is_mkldnn",
               "is_sparse_csr", "is_mps", "is_xpu")
    methods = ("numel", "element_size", "data_ptr", "dim", "size", "stride", "is_contiguous",
               "is_floating_point", "is_complex", "storage_offset", "__hash__", "requires_grad_",
               "register_hook", "get_device", "nelement", "ndimension")
    found: set[Any] = set()
    for name in getters:
        attribute = getattr(torch.Tensor, name, None)
        if attribute is not None and hasattr(attribute, "__get__"):
            found.add(attribute.__get__)
            if hasattr(attribute, "__set__"):
                found.add(attribute.__set__)
    found.update(getattr(torch.Tensor, name) for name in methods if hasattr(torch.Tensor, name))
    return frozenset(found)


#: Functions reading no values: they never synchronize.
METADATA_FUNCTIONS = _metadata_functions()


class SyncOnFirstTouch(TorchFunctionMode):
    """Synchronizes ``residency`` at the first torch function call taking one of its deferred
    tensors (as an argument, or inside a list / tuple argument), then disarms itself. Kept cheap:
    it runs for every torch call of the thread while on the stack (measured by the tests)."""

    def __init__(self, residency: _Synchronizing) -> None:
        super().__init__()
        self._residency = weakref.ref(residency)
        self._deferred = residency.deferred_keys()  # a live view, kept to save a call per op
        self.armed = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        # First, so that Dynamo tracing through the mode sees a constant and guards on nothing.
        if not torch.compiler.is_compiling() and self.armed:
            deferred = self._deferred
            if not deferred:
                self.armed = False
            elif (_touches(deferred, args) or (kwargs and _touches(deferred, kwargs.values()))) \
                    and func not in METADATA_FUNCTIONS:
                self.armed = False
                residency = self._residency()
                if residency is not None:
                    residency.synchronize()
        return func(*args, **kwargs)


def _touches(deferred: Any, values: Any) -> bool:
    for value in values:
        if id(value) in deferred:
            return True
        if type(value) in (list, tuple):
            for item in value:
                if id(item) in deferred:
                    return True
    return False


_modes: weakref.WeakKeyDictionary[Any, SyncOnFirstTouch] = weakref.WeakKeyDictionary()


def _mode_of(residency: _Synchronizing) -> SyncOnFirstTouch:
    mode = _modes.get(residency)
    if mode is None:
        mode = _modes[residency] = SyncOnFirstTouch(residency)
    return mode


def arm(residency: _Synchronizing) -> None:
    """After a step left host copies out of date: put the mode at the bottom of this thread's
    mode stack (if not there yet) and arm it."""
    mode = _mode_of(residency)
    if mode.armed and torch._C._len_torch_function_stack() and torch._C._get_function_stack_at(0) is mode:
        return  # armed at the bottom already (every replayed step after the first): no list built
    stack = torch.overrides._get_current_function_mode_stack()
    if not any(m is mode for m in stack):
        _set_stack([mode, *stack])
    mode.armed = True


def suspend(residency: _Synchronizing) -> None:
    """Before a step (its compiled code must not see the mode) or after a sync point: disarm the
    mode and take it off this thread's stack, where it is there."""
    mode = _modes.get(residency)
    if mode is None:
        return
    mode.armed = False
    stack = torch.overrides._get_current_function_mode_stack()
    if any(m is mode for m in stack):
        _set_stack([m for m in stack if m is not mode])


def is_armed(residency: _Synchronizing) -> bool:
    mode = _modes.get(residency)
    return mode is not None and mode.armed and any(
        m is mode for m in torch.overrides._get_current_function_mode_stack())


def _set_stack(modes: list[Any]) -> None:
    while torch._C._len_torch_function_stack():
        torch._C._pop_torch_function_stack()
    for mode in modes:
        torch._C._push_on_torch_function_stack(mode)
