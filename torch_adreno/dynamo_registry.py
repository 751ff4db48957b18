"""``backend="adreno"`` known to Dynamo's backend registry, without importing Dynamo.

Installed, the package's ``torch_dynamo_backends`` entry point names the backend, and Dynamo's
registry finds it at its first lookup. A source checkout on ``PYTHONPATH`` has no entry point, so
``import torch_adreno`` adds the same entry to the registry (:func:`register_backend_name`). Dynamo
takes seconds to import, so this is done when its registry module is imported, right after it
runs, or at once where it already has; either way the entry is an
:class:`importlib.metadata.EntryPoint`, loaded at the first lookup of the name, exactly as an
installed one: the backend's module (:mod:`torch_adreno.frontend`, which installs
:mod:`torch_adreno.torch_patches` on import) is imported only by the first ``torch.compile`` that
names it.

Invariant: the registry ends up with one entry for the name, whichever of the entry point and this
module comes first (Dynamo's entry-point discovery overwrites ours with the same target; an
already loaded backend is left alone).

This module imports neither torch nor anything of torch_adreno beyond its config.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint

from torch_adreno.config import BACKEND_NAME

#: The registry module of Dynamo's backends, and where the backend function is.
REGISTRY_MODULE = "torch._dynamo.backends.registry"
BACKEND_TARGET = "torch_adreno.frontend:adreno_backend"
ENTRY_POINT_GROUP = "torch_dynamo_backends"


def add_backend_entry(registry: types.ModuleType) -> None:
    """Add ``backend="adreno"`` to Dynamo's ``registry`` module as an entry point to load at the
    first lookup, unless the name is there already (found as an installed entry point, or loaded)."""
    if BACKEND_NAME in registry._BACKENDS or BACKEND_NAME in registry._COMPILER_FNS:
        return
    registry._BACKENDS[BACKEND_NAME] = EntryPoint(name=BACKEND_NAME, value=BACKEND_TARGET, group=ENTRY_POINT_GROUP)


def register_backend_name() -> None:
    """Make ``backend="adreno"`` known to Dynamo: now if its registry is imported, else right
    after it is (see the module docstring)."""
    registry = sys.modules.get(REGISTRY_MODULE)
    if registry is not None:
        add_backend_entry(registry)
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(REGISTRY_MODULE, add_backend_entry))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once ``module_name`` has been imported (its code has run), then
    leaves ``sys.meta_path``. The module is found and loaded by the finders after this one, as
    without it; its ``__spec__`` and ``__loader__`` are theirs."""

    def __init__(self, module_name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.module_name = module_name
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _LoaderThen(spec.loader, self.then)
        return spec


class _LoaderThen(importlib.abc.Loader):
    """``loader``, followed by ``then(module)`` after the module's code has run."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[types.ModuleType], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps its own loader (for its source in tracebacks, reloads).
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then(module)


__all__ = ["BACKEND_TARGET", "REGISTRY_MODULE", "add_backend_entry", "register_backend_name"]
