"""Does the backend refuse what eager refuses? OpInfo's error inputs and mixed-dtype operands.

Fake tensors run each op's meta function, which checks shapes but not everything eager's kernels
check (an int64 matrix times a float32 one computes in fake mode and fails in eager). For every
claimed op this module runs

* OpInfo's ``error_inputs`` (inputs eager must refuse), and
* *dtype cases* made from the op's first float32 samples: one tensor operand cast to int64 (for
  each operand, where the op has two or more), and every float32 operand cast to int64,

eagerly and compiled with ``backend="adreno"``. Where eager raises, the compiled call must raise
the same exception type, with eager's message in its own where eager's message is stable (the
same in two eager runs), and the error must not be an internal one of ours or Dynamo's (a
pyopencl error, a kernel that fails to build, a Dynamo internal error, or a non-AdrenoError the
backend raised that backend="aot_eager" does not): those are RuntimeErrors too, and would pass
for eager's RuntimeError. Nor does eager's error count when it was raised running a graph the
backend received and never compiled for the device. Where eager computes, the compiled call must
compute the same values on the device (a graph compiled for it) or raise one of our clear errors
(an AdrenoError saying the form is unsupported). A case where eager raises and the compiled call returns a value is a
*silent* result: the worst kind.

    python -m torch_adreno opinfo --error-inputs [--ops mm addmm] [--failures]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torch_adreno.errors import AdrenoError, KernelBuildError
from torch_adreno.runtime.index_check import DeviceIndexOutOfRange
from torch_adreno.tools.testing.opinfo import (
    RANDOM_OPINFOS,
    UNWRAPPED,
    _causes,
    _count_compiles,
    _dynamo_graphs,
    _opinfo_name,
    claimed_opinfos,
)

#: What became of a case (``ErrorOutcome.kind``).
SAME_ERROR = "same error"  # eager and ours raise the same exception type (and eager's stable message)
CLEAR_UNSUPPORTED = "clear unsupported"  # eager computes; ours refuses with a clear AdrenoError
SAME_RESULT = "same result"  # eager computes; ours computes the same
SILENT = "silent result"  # eager raises; ours returns a value
OTHER_ERROR = "other error"  # ours raises another exception type than eager, or drops its message
INTERNAL = "internal error"  # ours raises an internal error (whatever eager does): never agreement
#: Ours computes or raises, but no graph was compiled for the device: the values or the error are
#: not the device's (eager's kernels ran them).
NOT_ON_DEVICE = "not on device"
WRONG = "wrong result"  # both compute; values, dtypes or shapes differ
#: Dynamo (its tracer or fake-tensor propagation) raised another type than eager, before any graph
#: reached a backend, or backend="aot_eager" raises the same: reported apart, not ours.
DYNAMO_DIFFERS = "dynamo differs"
EAGER_AGREES = (SAME_ERROR, CLEAR_UNSUPPORTED, SAME_RESULT, DYNAMO_DIFFERS)

#: Cases where ours is known to disagree with eager, with the reason: (OpInfo name, case) -> reason.
#: (Index values out of range are checked on the device and raised as eager's type since
#: runtime/index_check.py: gather, scatter and scatter_add's error inputs agree.)
KNOWN_DISAGREEMENTS: dict[tuple[str, str], str] = {
    ("max_pool2d_with_indices_backward", "sample[0] float32 operands as int64"): (
        "eager's int64 max pooling forward exists and its backward raises NotImplementedError; ours refuses "
        "the int64 forward first, with UnsupportedOpError (a RuntimeError) naming it"),
    ("topk", "sample[0] float32 operands as int64"): (
        "the sample's values cast to int64 are mostly equal (-2 to 2): the values are eager's, the indices of "
        "equal values by position (stable), eager's as its unstable C++ selection leaves them"),
}

#: Entries whose results hold uninitialised memory (eager's is whatever the allocator returned):
#: only their shapes and dtypes are compared.
UNDEFINED_VALUES = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})

#: How many float32 samples per op the dtype cases are made from.
DTYPE_SAMPLES = 1


@dataclass
class ErrorOutcome:
    op: str
    case: str
    kind: str
    detail: str = ""

    @property
    def agrees(self) -> bool:
        return self.kind in EAGER_AGREES

    @property
    def known(self) -> bool:
        """A disagreement listed, with its reason, in :data:`KNOWN_DISAGREEMENTS`."""
        return not self.agrees and (self.op, self.case) in KNOWN_DISAGREEMENTS


def _effective_error(err: BaseException) -> type[BaseException]:
    """The exception type a user of ``backend="adreno"`` meets, seen through Dynamo's wrappers.

    Dynamo reports an exception from fake-tensor propagation as ``TorchRuntimeError`` whatever
    its type (under any backend), naming the original as ``got TypeName(...)`` in the message;
    a backend's exception that is not an AdrenoError arrives inside ``BackendCompilerFailed``.
    """
    if isinstance(err, torch._dynamo.exc.BackendCompilerFailed):
        return type(err.inner_exception)
    if isinstance(err, (torch._dynamo.exc.TorchRuntimeError, torch._dynamo.exc.Unsupported)):
        found = re.search(r"got (\w+)\(|(\w+) when making fake tensor call", str(err))
        builtin = getattr(__import__("builtins"), found.group(1) or found.group(2), None) if found else None
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return builtin
    return type(err)


def _before_backend(err: BaseException) -> bool:
    """Whether Dynamo raised ``err`` itself (tracing, fake-tensor propagation), not a backend."""
    return isinstance(err, torch._dynamo.exc.TorchDynamoException) and not isinstance(
        err, (torch._dynamo.exc.BackendCompilerFailed, AdrenoError))


def _in_backend(err: BaseException) -> bool:
    """Whether ``err`` was raised in the backend's own code (not the harness's call of the op)."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    return any("/torch_adreno/" in f.filename and not f.filename.endswith(("opinfo.py", "opinfo_errors.py"))
               for f in frames)


def _internal(err: BaseException, call: Callable[..., Any], inputs: Callable[[], list[torch.Tensor]]) -> str | None:
    """Why ``err`` (raised by the compiled call) is an internal error, ours or Dynamo's, which
    never counts as eager's error whatever its type; None if it is not one."""
    inner = err.inner_exception if isinstance(err, torch._dynamo.exc.BackendCompilerFailed) else err
    for cause in _causes(inner):
        if isinstance(cause, cl.Error):
            return f"pyopencl {type(cause).__name__}"
        if isinstance(cause, KernelBuildError):
            return "KernelBuildError: a generated kernel failed to build"
        if isinstance(cause, torch._dynamo.exc.InternalTorchDynamoError):
            return "Dynamo internal error"
    if isinstance(inner, (AdrenoError, DeviceIndexOutOfRange)):
        return None  # ours, raised on purpose (eager's type where eager raises)
    if isinstance(err, torch._dynamo.exc.BackendCompilerFailed):
        # Not an AdrenoError (those pass through Dynamo unwrapped): AOTAutograd's own trace
        # raising eager's check (aot_eager's compile fails alike), or a bug of ours.
        if not _aot_eager_raises(call, inputs(), type(inner), compiling=True):
            return f"the backend raised {type(inner).__name__} compiling (backend='aot_eager' compiles)"
        return None
    if _in_backend(inner):
        return f"{type(inner).__name__} raised in torch_adreno"
    return None


def _message(err: BaseException) -> str:
    return " ".join(str(err).split())


def _has_message(ours: BaseException, eager: str) -> bool:
    """Whether ``ours`` carries eager's message: as is, or quoted (Dynamo's fake-tensor errors
    name the original as ``got RuntimeError('...')``)."""
    text = _message(ours)
    return not eager or eager in text or repr(eager)[1:-1] in text or repr(eager).strip("'\"") in text


def _aot_eager_raises(call: Callable[..., Any], inputs: list[torch.Tensor], seen: type[BaseException],
                      compiling: bool = False) -> bool:
    """Whether ``backend="aot_eager"`` (Dynamo and AOTAutograd running eager's kernels) raises
    ``seen`` too: then the difference from eager comes before any backend, not from ours.
    ``compiling``: only an error raised while compiling counts (not eager's kernels at run time)."""
    torch._dynamo.reset()
    try:
        torch.compile(call, backend="aot_eager", fullgraph=True, dynamic=False)(*inputs)
    except Exception as err:
        if compiling and not isinstance(err, torch._dynamo.exc.TorchDynamoException):
            return False
        return _effective_error(err) is seen
    return False


def _cases(op: Any) -> Iterator[tuple[str, Any]]:
    """``(case name, sample)``: the op's error inputs, then its dtype cases."""
    if op.error_inputs_func is not None:
        for i, error_input in enumerate(op.error_inputs("cpu")):
            yield f"error_inputs[{i}]", error_input.sample_input
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
        if i >= DTYPE_SAMPLES:
            break
        flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
        floats = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor) and v.dtype == torch.float32]
        tensors = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor)]

        def cast(slots: Sequence[int], flat: list[Any] = flat, spec: Any = spec) -> Any:
            values = [v.round().to(torch.int64) if k in slots else v for k, v in enumerate(flat)]
            return _Sample(*tree_unflatten(values, spec))

        if len(tensors) >= 2:
            for k in floats:
                yield f"sample[{i}] operand {tensors.index(k)} as int64", cast([k])
        if floats:
            yield f"sample[{i}] float32 operands as int64", cast(floats)


def _has_tensor(value: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in tree_flatten(value)[0])


@dataclass
class _Sample:
    input: Any
    args: Any
    kwargs: Any


def run_case(op: Any, case: str, sample: Any, options: dict[str, Any] | None = None) -> ErrorOutcome:
    """One case, eager vs compiled with the backend ``options`` (see :data:`EAGER_AGREES` for the
    kinds that agree)."""
    name = _opinfo_name(op)
    function: Callable[..., Any] = UNWRAPPED.get(name, op.op)
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def call(*tensors: torch.Tensor) -> Any:
        values = list(flat)
        for slot, t in zip(slots, tensors, strict=True):
            values[slot] = t
        inp, args, kwargs = tree_unflatten(values, spec)
        return function(inp, *args, **kwargs)

    def inputs() -> list[torch.Tensor]:
        return [flat[k].detach().clone() for k in slots]

    try:
        expected: Any = call(*inputs())
        eager_error: type[BaseException] | None = None
    except Exception as err:
        eager_error, expected, eager_message = type(err), None, _message(err)
        try:
            call(*inputs())
        except Exception as again:  # a message that changes between runs (an address) is not compared
            eager_message = eager_message if _message(again) == eager_message else ""
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="adreno", options=options or {}, fullgraph=True, dynamic=False)
    captured = _dynamo_graphs()
    try:
        with _count_compiles() as compiles:
            ours = compiled(*inputs())
    except Exception as err:
        seen = _effective_error(err)
        message = _message(err)[:160]
        internal = _internal(err, call, inputs)
        eager_did = f"eager raises {eager_error.__name__}" if eager_error is not None else "eager computes"
        if internal is not None:
            return ErrorOutcome(name, case, INTERNAL, f"{eager_did}, ours an internal error ({internal}): {message}")
        if (_dynamo_graphs() > captured and not compiles[0]
                and not isinstance(err, (AdrenoError, DeviceIndexOutOfRange, torch._dynamo.exc.TorchDynamoException))):
            # Dynamo handed the backend a graph, and the error is neither Dynamo's, nor the
            # backend's compiling, nor a kernel's index check: it was raised running a graph that
            # was never compiled for the device (eager's kernels, for instance).
            return ErrorOutcome(name, case, NOT_ON_DEVICE, f"{eager_did}; ours raised {seen.__name__} running a graph "
                                                            f"not compiled for the device: {message}")
        if eager_error is not None:
            before_backend = _before_backend(err) or _aot_eager_raises(call, inputs(), seen)
            if issubclass(seen, eager_error) and _has_message(err, eager_message):
                return ErrorOutcome(name, case, SAME_ERROR, f"{eager_error.__name__}: {message}")
            if issubclass(seen, eager_error):
                # Eager's type without eager's message: Dynamo's own (its meta functions word
                # their checks differently), reported apart; ours must carry eager's message.
                return ErrorOutcome(name, case, DYNAMO_DIFFERS if before_backend else OTHER_ERROR,
                                    f"eager raises {eager_error.__name__}({eager_message[:100]!r}), ours the same "
                                    f"type without that message: {message}")
            kind = DYNAMO_DIFFERS if before_backend else OTHER_ERROR
            return ErrorOutcome(name, case, kind, f"eager raises {eager_error.__name__}, ours {seen.__name__}: {message}")
        if isinstance(err, AdrenoError):
            return ErrorOutcome(name, case, CLEAR_UNSUPPORTED, f"{type(err).__name__}: {message}")
        kind = DYNAMO_DIFFERS if _before_backend(err) or _aot_eager_raises(call, inputs(), seen) else OTHER_ERROR
        return ErrorOutcome(name, case, kind, f"eager computes, ours raises {seen.__name__}: {message}")
    if eager_error is not None:
        return ErrorOutcome(name, case, SILENT, f"eager raises {eager_error.__name__}, ours returned a value")
    if not compiles[0] and _has_tensor(expected):
        # The values are eager's own: the compiled call ran no graph on the device.
        return ErrorOutcome(name, case, NOT_ON_DEVICE, "eager computes; ours the same, but no graph was compiled "
                                                        "for the device")
    try:
        for a, b in zip(tree_flatten(ours)[0], tree_flatten(expected)[0], strict=True):
            if isinstance(b, torch.Tensor) and name in UNDEFINED_VALUES:
                assert (a.shape, a.dtype) == (b.shape, b.dtype), ((a.shape, a.dtype), (b.shape, b.dtype))
            elif isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
            else:
                assert a == b or (a != a and b != b), (a, b)
    except (AssertionError, ValueError) as err:
        return ErrorOutcome(name, case, WRONG, " ".join(str(err).split())[:200])
    return ErrorOutcome(name, case, SAME_RESULT)


def error_sweep(names: Sequence[str] | None = None, shard: tuple[int, int] = (0, 1),
                on_case: Callable[[ErrorOutcome], None] | None = None,
                options: dict[str, Any] | None = None) -> list[list[ErrorOutcome]]:
    """The error and dtype cases of every claimed op (or of ``names``), one list per OpInfo entry,
    compiled with the backend ``options``."""
    ops = [op for op in claimed_opinfos() if names is None or op.name in names or _opinfo_name(op) in names]
    ops = [op for op in ops if op.name not in RANDOM_OPINFOS][shard[0]::shard[1]]
    reports = []
    for op in ops:
        outcomes = []
        for case, sample in _cases(op):
            outcome = run_case(op, case, sample, options)
            outcomes.append(outcome)
            if on_case is not None:
                on_case(outcome)
        reports.append(outcomes)
    return reports


def format_error_reports(reports: Sequence[Sequence[ErrorOutcome]], failures: bool = False) -> str:
    """Counts per kind over all cases, and (``failures``) every case where ours and eager disagree."""
    flat = [o for r in reports for o in r]
    kinds = (SAME_ERROR, CLEAR_UNSUPPORTED, SAME_RESULT, DYNAMO_DIFFERS, SILENT, OTHER_ERROR, INTERNAL, NOT_ON_DEVICE,
             WRONG)
    lines = [f"{len(flat)} cases over {len(reports)} OpInfo entries: "
             + ", ".join(f"{kind} {sum(o.kind == kind for o in flat)}" for kind in kinds)
             + f"; of the disagreements {sum(o.known for o in flat)} known (KNOWN_DISAGREEMENTS), "
             + f"{sum(not o.agrees and not o.known for o in flat)} unexpected"]
    if failures:
        lines += [f"{o.op} {o.case}: {o.kind}: {o.detail}" + (" [known]" if o.known else "")
                  for o in flat if not o.agrees]
    return "\n".join(lines)
