"""Does the backend refuse what eager refuses? OpInfo's error inputs and mixed-dtype operands.

Fake tensors run each op's meta function, which checks shapes but not everything eager's kernels
check (an int64 matrix times a float32 one computes in fake mode and fails in eager). For every
claimed op this module runs

* OpInfo's ``error_inputs`` (inputs eager must refuse), and
* *dtype cases* made from the op's first float32 samples: one tensor operand cast to int64 (for
  each operand, where the op has two or more), and every float32 operand cast to int64,

eagerly and compiled with ``backend="adreno"``. Where eager raises, the compiled call must raise
the same exception type; where eager computes, the compiled call must compute the same values or
raise one of our clear errors (an AdrenoError saying the form is unsupported). A case where
eager raises and the compiled call returns a value is a *silent* result: the worst kind.

    python -m torch_adreno opinfo --error-inputs [--ops mm addmm] [--failures]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torch_adreno.errors import AdrenoError
from torch_adreno.opinfo import RANDOM_OPINFOS, UNWRAPPED, _opinfo_name, claimed_opinfos

#: What became of a case (``ErrorOutcome.kind``).
SAME_ERROR = "same error"  # eager and ours raise the same exception type
CLEAR_UNSUPPORTED = "clear unsupported"  # eager computes; ours refuses with a clear AdrenoError
SAME_RESULT = "same result"  # eager computes; ours computes the same
SILENT = "silent result"  # eager raises; ours returns a value
OTHER_ERROR = "other error"  # ours raises another exception type than eager
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


def _aot_eager_raises(call: Callable[..., Any], inputs: list[torch.Tensor], seen: type[BaseException]) -> bool:
    """Whether ``backend="aot_eager"`` (Dynamo and AOTAutograd running eager's kernels) raises
    ``seen`` too: then the difference from eager comes before any backend, not from ours."""
    torch._dynamo.reset()
    try:
        torch.compile(call, backend="aot_eager", fullgraph=True, dynamic=False)(*inputs)
    except Exception as err:
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


@dataclass
class _Sample:
    input: Any
    args: Any
    kwargs: Any


def run_case(op: Any, case: str, sample: Any) -> ErrorOutcome:
    """One case, eager vs compiled (see :data:`EAGER_AGREES` for the kinds that agree)."""
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
        eager_error, expected = type(err), None
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="adreno", fullgraph=True, dynamic=False)
    try:
        ours = compiled(*inputs())
    except Exception as err:
        seen = _effective_error(err)
        message = " ".join(str(err).split())[:160]
        if eager_error is not None:
            if issubclass(seen, eager_error):
                return ErrorOutcome(name, case, SAME_ERROR, f"{eager_error.__name__}: {message}")
            kind = DYNAMO_DIFFERS if _before_backend(err) or _aot_eager_raises(call, inputs(), seen) else OTHER_ERROR
            return ErrorOutcome(name, case, kind, f"eager raises {eager_error.__name__}, ours {seen.__name__}: {message}")
        if isinstance(err, AdrenoError):
            return ErrorOutcome(name, case, CLEAR_UNSUPPORTED, f"{type(err).__name__}: {message}")
        kind = DYNAMO_DIFFERS if _before_backend(err) or _aot_eager_raises(call, inputs(), seen) else OTHER_ERROR
        return ErrorOutcome(name, case, kind, f"eager computes, ours raises {seen.__name__}: {message}")
    if eager_error is not None:
        return ErrorOutcome(name, case, SILENT, f"eager raises {eager_error.__name__}, ours returned a value")
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
                on_case: Callable[[ErrorOutcome], None] | None = None) -> list[list[ErrorOutcome]]:
    """The error and dtype cases of every claimed op (or of ``names``), one list per OpInfo entry."""
    ops = [op for op in claimed_opinfos() if names is None or op.name in names or _opinfo_name(op) in names]
    ops = [op for op in ops if op.name not in RANDOM_OPINFOS][shard[0]::shard[1]]
    reports = []
    for op in ops:
        outcomes = []
        for case, sample in _cases(op):
            outcome = run_case(op, case, sample)
            outcomes.append(outcome)
            if on_case is not None:
                on_case(outcome)
        reports.append(outcomes)
    return reports


def format_error_reports(reports: Sequence[Sequence[ErrorOutcome]], failures: bool = False) -> str:
    """Counts per kind over all cases, and (``failures``) every case where ours and eager disagree."""
    flat = [o for r in reports for o in r]
    kinds = (SAME_ERROR, CLEAR_UNSUPPORTED, SAME_RESULT, DYNAMO_DIFFERS, SILENT, OTHER_ERROR, WRONG)
    lines = [f"{len(flat)} cases over {len(reports)} OpInfo entries: "
             + ", ".join(f"{kind} {sum(o.kind == kind for o in flat)}" for kind in kinds)
             + f"; of the disagreements {sum(o.known for o in flat)} known (KNOWN_DISAGREEMENTS), "
             + f"{sum(not o.agrees and not o.known for o in flat)} unexpected"]
    if failures:
        lines += [f"{o.op} {o.case}: {o.kind}: {o.detail}" + (" [known]" if o.known else "")
                  for o in flat if not o.agrees]
    return "\n".join(lines)
