"""Every change torch_adreno makes to PyTorch, in one place, each with the torch versions it was
written for and why. :func:`install` applies them once, when the backend's module
(:mod:`torch_adreno.frontend`) is imported: by Dynamo's first lookup of ``backend="adreno"`` (at
the first ``torch.compile`` naming it, before Dynamo compiles anything or checks its options), or
by the first use of the package's public surface (``torch_adreno.TrainingStep`` etc.). ``import
torch_adreno`` alone changes nothing: it must not import Dynamo, which most of these patch. Each
is a no-op on a torch where its target is not there.

1. **GradScaler's unscale bumps versions** (torch 2.11, 2.13): ``torch._amp_foreach_non_finite_
   check_and_unscale_`` divides gradients in place without bumping their version counters, which
   device copies trust (:mod:`torch_adreno.runtime.host_writes`).
2. **Every optimizer step bumps the versions of what it wrote** (2.11, 2.13): fused optimizer
   kernels write parameters without a bump; a global step post-hook
   (:func:`torch_adreno.runtime.host_writes.bump_after_step`).
3. **FX's "is tracing" flag per thread** (2.6-2.13, PyTorch issue 126024): one process-wide flag
   made a compiled model called in one thread fail while another thread compiled.
4. **Logging calls in our traces are no-ops** (2.6-2.13): Dynamo cannot trace ``logging.Logger``
   methods; with ``fullgraph=True`` (TrainingStep) a Hugging Face loss's ``logger.warning_once``
   was an error. Only in traces for this backend.
5. **Dynamo's "Profiler record function ... will be ignored" is not printed for our traces**
   (2.11, 2.13): every optimizer step traced logs it once per process, although nothing is lost
   (the profiler's context does nothing inside a graph); other backends' traces still log it.
6. **RNN tracing on** (``torch._dynamo.config.allow_rnn``, 2.6-2.13): off by default, a frame
   holding ``nn.LSTM``/``nn.GRU`` is skipped and runs eagerly on the host without a word.
7. **Options checked at ``torch.compile``** (2.6-2.13): torch hands a custom backend its
   ``options`` only at the first call, under Dynamo's frames; an unknown name was a 90-line
   traceback there. Dynamo's ``get_compiler_fn``, which ``torch.compile`` calls with the backend
   and its arguments, checks ours first (:func:`torch_adreno.frontend.backend_config`)
   and raises the :class:`~torch_adreno.errors.OptionError` from there.
8. **Our errors are Dynamo's ``ShortenTraceback``s** (2.6-2.13): Dynamo lets that family through
   a backend uncaught, where it wraps others in ``BackendCompilerFailed``; the error classes are
   defined before Dynamo is imported, and join the family here
   (:func:`torch_adreno.errors.join_dynamo_family`).
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_adreno.errors import AdrenoError, join_dynamo_family
from torch_adreno.runtime import host_writes

_log = logging.getLogger("torch_adreno")
_installed: list[Any] = []


def install(backend: Callable[..., Any], check_arguments: Callable[..., Any]) -> None:
    """Apply every patch of the module docstring (once); ``backend`` is this package's Dynamo
    backend function, which the traces it is told apart by; ``check_arguments(**kwargs)`` raises
    for arguments ``torch.compile`` would hand it that it does not take."""
    if _installed:
        return
    torch._amp_foreach_non_finite_check_and_unscale_ = host_writes.unscale_bumping_versions  # type: ignore[assignment]
    optimizer_module = importlib.import_module("torch.optim.optimizer")
    _installed.append(optimizer_module.register_optimizer_step_post_hook(host_writes.bump_after_step))
    _make_fx_tracing_flag_per_thread()
    tracing_for_us = functools.partial(_tracing_for, backend)
    _skip_logging_calls_in_traces(tracing_for_us)
    logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(_ProfilerNoteFilter(tracing_for_us))
    torch._dynamo.config.allow_rnn = True
    _check_arguments_at_compile(backend, check_arguments)
    join_dynamo_family()


# -- 3. FX's tracing flag ------------------------------------------------------------------------

_fx_traces_in_this_thread = threading.local()


def _make_fx_tracing_flag_per_thread() -> None:
    """The "FX is tracing" check additionally requires a trace in the calling thread, counted per
    thread around ``Tracer.trace`` (upstream made the flag thread-local later). Installed before
    a ``torch.compile`` wrapper for this backend captures the check (the backend's lookup installs
    it, before Dynamo wraps the model); a no-op where the flag is not a module global."""
    fx_trace = torch.fx._symbolic_trace
    if not isinstance(getattr(fx_trace, "_is_fx_tracing_flag", None), bool):
        return
    upstream_trace = fx_trace.Tracer.trace
    upstream_check = fx_trace.is_fx_symbolic_tracing

    @functools.wraps(upstream_trace)
    def trace(self: Any, *args: Any, **kwargs: Any) -> Any:
        _fx_traces_in_this_thread.depth = getattr(_fx_traces_in_this_thread, "depth", 0) + 1
        try:
            return upstream_trace(self, *args, **kwargs)
        finally:
            _fx_traces_in_this_thread.depth -= 1

    @functools.wraps(upstream_check)
    def is_fx_symbolic_tracing() -> bool:
        return upstream_check() and getattr(_fx_traces_in_this_thread, "depth", 0) > 0

    fx_trace.Tracer.trace = trace  # type: ignore[method-assign]
    fx_trace.is_fx_symbolic_tracing = is_fx_symbolic_tracing


# -- 4 and 5. Our traces --------------------------------------------------------------------------

def _tracing_for(backend: Callable[..., Any]) -> bool:
    """Whether Dynamo is tracing a frame now that it will hand to ``backend`` (through
    torch.compile's and Dynamo's wrappers)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        compiler: Any = InstructionTranslator.current_tx().output.compiler_fn
    except Exception:  # not tracing, or a Dynamo whose internals differ: Dynamo's own rule holds
        return False
    for _ in range(8):
        if compiler is backend:
            return True
        compiler = next((getattr(compiler, a) for a in ("_torchdynamo_orig_backend", "compiler_fn", "func", "__wrapped__")
                         if getattr(compiler, a, None) is not None), None)
        if compiler is None:
            return False
    return False


#: (logger name, method) of the logging calls skipped in our traces, each told about once.
_skipped_logging_calls: set[tuple[str, str]] = set()


class _IgnoredLoggingFunctions(set[Any]):
    """Dynamo's ``ignore_logging_functions`` set (the functions a trace treats as no-ops), holding
    what the user put there, and in traces for this backend also every ``logging.Logger`` method."""

    tracing_for_us: Callable[[], bool] = staticmethod(lambda: False)

    def __contains__(self, item: object) -> bool:
        if super().__contains__(item):
            return True
        logger = getattr(item, "__self__", None)
        if not isinstance(logger, logging.Logger) or not type(self).tracing_for_us():
            return False
        call = (logger.name, str(getattr(item, "__name__", item)))
        if call not in _skipped_logging_calls:
            _skipped_logging_calls.add(call)
            _log.info("torch_adreno: calls of %s on logger %r inside compiled code are skipped (Dynamo cannot trace "
                      "logging; the graph is not split for them)", call[1], call[0])
        return True


def _skip_logging_calls_in_traces(tracing_for_us: Callable[[], bool]) -> None:
    """Dynamo reads ``ignore_logging_functions`` (``ignore_logger_methods`` in older releases)
    only while tracing, and ``torch.compile`` passes no per-compile config, so the process-wide set
    is replaced by one holding the same functions (the user's additions keep working) that, only
    while Dynamo traces a frame for this backend, also contains every logger's methods."""
    config = torch._dynamo.config
    name = "ignore_logging_functions" if hasattr(config, "ignore_logging_functions") else "ignore_logger_methods"
    current = getattr(config, name, None)
    if isinstance(current, set) and not isinstance(current, _IgnoredLoggingFunctions):
        _IgnoredLoggingFunctions.tracing_for_us = staticmethod(tracing_for_us)
        setattr(config, name, _IgnoredLoggingFunctions(current))


class _ProfilerNoteFilter(logging.Filter):
    """Drops Dynamo's note that a profiler ``record_function`` is ignored, in our traces only."""

    def __init__(self, tracing_for_us: Callable[[], bool]) -> None:
        super().__init__()
        self._tracing_for_us = tracing_for_us

    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith("Profiler record function") and self._tracing_for_us())


# -- 7. Options checked at torch.compile --------------------------------------------------------


def _check_arguments_at_compile(backend: Callable[..., Any], check_arguments: Callable[..., Any]) -> None:
    eval_frame = importlib.import_module("torch._dynamo.eval_frame")
    original = getattr(eval_frame, "get_compiler_fn", None)
    if original is None:
        return

    @functools.wraps(original)
    def get_compiler_fn(compiler_fn: Any) -> Any:
        # torch.compile's wrapper of a named backend: the backend function and its keyword arguments.
        if getattr(compiler_fn, "compiler_fn", None) is backend:
            try:
                check_arguments(**getattr(compiler_fn, "kwargs", {}))
            except AdrenoError as err:
                raise err.with_traceback(None) from None  # (the user's torch.compile line is above)
        return original(compiler_fn)

    eval_frame.get_compiler_fn = get_compiler_fn  # type: ignore[attr-defined]
