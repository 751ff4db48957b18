"""PyTorch's module database (``module_db``) through the backend, in training mode.

Each sample of a ``ModuleInfo`` builds the module twice from one seed (one stays eager, one is
compiled with ``backend="adreno"``, ``fullgraph=True``), runs the forward in training mode, the
backward of a weighted sum of the outputs (input and parameter gradients), one SGD step on both,
and a second forward after it (which reads the updated parameters and buffers from the device).
Outputs, gradients, parameters and buffers after the step, and the second forward's outputs, are
compared with eager's (float32 tolerance, or the float64 rule of :mod:`.opinfo`).

A sample that does not pass is run once more under ``aot_eager``, PyTorch's reference backend:
where that fails too, the limit is PyTorch's own (Dynamo or AOTAutograd) and the outcome says
so (``shared``). What counts against us is a wrong result or a crash that ``aot_eager`` does not
share; a refusal must be one of our clear errors.

    python -m torch_adreno modules                      # the whole sweep, counts per kind
    python -m torch_adreno modules --modules nn.Linear nn.MultiheadAttention --samples 4
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_adreno.tools.testing.opinfo import (
    CLEAR_ERROR,
    INTERNAL_ERROR,
    NO_GRAPH,
    NOT_TRACEABLE,
    PASS,
    TOLERANCES,
    WRONG_RESULT,
    _compare,
    _count_compiles,
    _dynamo_graphs,
    _failure,
    _not_compiled,
)

#: What became of a sample: the kinds of :mod:`.opinfo`, and ``shared`` where ``aot_eager``
#: fails the same sample (a limit of PyTorch's, not ours), ``invalid`` where eager itself fails.
SHARED, INVALID = "shared with aot_eager", "invalid in eager"
KINDS = (PASS, CLEAR_ERROR, NOT_TRACEABLE, WRONG_RESULT, INTERNAL_ERROR, NO_GRAPH, SHARED, INVALID)

#: Summary counts, as the report speaks of them.
COUNTED_AS = {PASS: "pass", CLEAR_ERROR: "refused", NOT_TRACEABLE: "refused", WRONG_RESULT: "wrong",
              INTERNAL_ERROR: "crash", NO_GRAPH: "crash", SHARED: "shared", INVALID: "invalid"}

LEARNING_RATE = 0.1


@dataclass
class ModuleOutcome:
    module: str
    index: int
    desc: str
    kind: str
    reason: str = ""
    #: aot_eager's own outcome, where the control ran (a sample that did not pass).
    control: str = ""

    @property
    def counted_as(self) -> str:
        return COUNTED_AS[self.kind]


def module_infos(names: Sequence[str] | None = None) -> list[Any]:
    """The ``module_db`` entries with float32 on the CPU (all, or those named)."""
    from torch.testing._internal.common_modules import module_db

    chosen = [m for m in module_db if torch.float32 in m.dtypes and (names is None or m.name in names)]
    if names is not None:
        missing = sorted(set(names) - {m.name for m in chosen})
        if missing:
            known = ", ".join(m.name for m in module_db)
            raise ValueError(f"no float32 module_db entry named {', '.join(missing)}; the entries are: {known}")
    return chosen


def samples(info: Any, limit: int | None = None) -> Iterator[tuple[int, Any]]:
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True, training=True)
    for index, sample in enumerate(inputs):
        if limit is not None and index >= limit:
            return
        yield index, sample


@dataclass
class _Run:
    """One run of a sample: outputs, gradients (inputs, then parameters), the state after one SGD
    step (parameters, then buffers), and the outputs of a second forward."""

    outputs: list[Any]
    grads: list[Any]
    state: list[Any]
    second: list[Any]


def _tensors_like(value: Any) -> Any:
    return tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) else t, value)


def _build(info: Any, sample: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    module = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    if info.is_lazy:  # parameters take their shapes from a first (eager) call
        args, kwargs = _tensors_like((sample.forward_input.args, sample.forward_input.kwargs))
        with torch.no_grad():
            module(*args, **kwargs)
    return module.train()


def _run(module: torch.nn.Module, call: Callable[..., Any], forward: tuple[Any, Any]) -> _Run:
    args, kwargs = _tensors_like(forward)
    inputs = [t for t in tree_flatten((args, kwargs))[0]
              if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    params: list[torch.Tensor] = [p for p in module.parameters() if p.requires_grad]
    out = call(*args, **kwargs)
    leaves = [o for o in tree_flatten(out)[0]]
    total = None
    for i, o in enumerate(leaves):
        if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point() and o.numel():
            w = torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape) * (i + 1)
            term = (o * w).sum()
            total = term if total is None else total + term
    grads: list[Any] = []
    if total is not None and (inputs or params):
        grads = list(torch.autograd.grad(total, inputs + params, allow_unused=True))
    with torch.no_grad():
        for p, g in zip(params, grads[len(inputs):], strict=True):
            if g is not None:
                p.sub_(LEARNING_RATE * g)
    state = [p.detach().clone() for p in module.parameters()] + [b.detach().clone() for b in module.buffers()]
    args2, kwargs2 = _tensors_like(forward)
    with torch.no_grad():
        second = [o.detach().clone() if isinstance(o, torch.Tensor) else o
                  for o in tree_flatten(call(*args2, **kwargs2))[0]]
    return _Run([o.detach().clone() if isinstance(o, torch.Tensor) else o for o in leaves], grads, state, second)


def _compare_runs(ours: _Run, eager: _Run, exact: _Run | None) -> None:
    """Raises AssertionError naming the first value that differs."""
    tolerance = TOLERANCES[torch.float32]
    parts = ("outputs", "grads", "state", "second")
    labels = ("output", "gradient", "state after the step", "second output")
    for what, part in zip(labels, parts, strict=True):
        a_list, b_list = getattr(ours, part), getattr(eager, part)
        x_list: list[Any] | None = getattr(exact, part) if exact is not None else None
        assert len(a_list) == len(b_list), f"{len(a_list)} {what}s, eager {len(b_list)}"
        for i, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
            if isinstance(b, torch.Tensor):
                assert isinstance(a, torch.Tensor), f"{what} {i}: eager has a tensor, ours {type(a).__name__}"
                reference = x_list[i] if x_list is not None else None
                _compare(a, b, functools.partial(_as_float64_reference, reference), f"{what} {i}", tolerance)
            elif b is None:
                assert a is None, f"{what} {i}: eager has none, ours has one"
            elif isinstance(b, float) and math.isnan(b):
                assert isinstance(a, float) and math.isnan(a), (what, i, a, b)
            else:
                assert a == b, (what, i, a, b)


def _as_float64_reference(reference: Any) -> Any:
    if reference is None:
        raise RuntimeError("no float64 run of this sample")
    return reference


def _float64_run(info: Any, sample: Any) -> _Run | None:
    """The sample in float64 (module and inputs), for the float64 rule; None where it cannot run."""
    try:
        module = _build(info, sample).double()
        forward = tree_map(lambda t: t.detach().double().requires_grad_(t.requires_grad)
                           if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t, _forward(sample))
        return _run(module, module, forward)
    except Exception:
        return None


def _forward(sample: Any) -> tuple[Any, Any]:
    return sample.forward_input.args, sample.forward_input.kwargs


def run_sample(info: Any, index: int, sample: Any, options: dict[str, Any] | None = None,
               control: bool = True) -> ModuleOutcome:
    """One sample compiled with the backend against eager; ``control`` runs ``aot_eager`` on a
    sample that did not pass, to tell PyTorch's limits from ours."""
    name, desc = info.name, sample.desc or ""
    torch._dynamo.reset()
    try:
        eager_module = _build(info, sample)
        eager = _run(eager_module, eager_module, _forward(sample))
    except Exception as err:
        return ModuleOutcome(name, index, desc, INVALID, f"eager raises {type(err).__name__}: {err}"[:200])
    outcome = _compiled_outcome(info, index, sample, eager, "adreno", options or {})
    if control and outcome.kind != PASS:
        reference = _compiled_outcome(info, index, sample, eager, "aot_eager", {})
        outcome.control = f"{reference.kind}: {reference.reason}"[:240]
        if reference.kind != PASS and outcome.kind != CLEAR_ERROR:
            outcome.kind = SHARED
    return outcome


def _compiled_outcome(info: Any, index: int, sample: Any, eager: _Run, backend: str,
                      options: dict[str, Any]) -> ModuleOutcome:
    name, desc = info.name, sample.desc or ""
    torch._dynamo.reset()
    module = _build(info, sample)
    compiled: Callable[..., Any] = (
        torch.compile(module, backend=backend, fullgraph=True, dynamic=False, options=options) if backend == "adreno"
        else torch.compile(module, backend=backend, fullgraph=True, dynamic=False))
    captured = _dynamo_graphs()
    try:
        with _count_compiles() as compiles:
            ours = _run(module, compiled, _forward(sample))
    except Exception as err:
        failure = _failure(name, index, err)
        return ModuleOutcome(name, index, desc, failure.kind, failure.reason)
    if backend == "adreno" and not compiles[0]:
        failure = _not_compiled(name, index, _dynamo_graphs() - captured)
        return ModuleOutcome(name, index, desc, failure.kind, failure.reason)
    try:
        try:
            _compare_runs(ours, eager, None)
        except AssertionError:
            _compare_runs(ours, eager, _float64_run(info, sample))
    except AssertionError as err:
        return ModuleOutcome(name, index, desc, WRONG_RESULT, "mismatch: " + " ".join(str(err).split())[:200])
    return ModuleOutcome(name, index, desc, PASS)


def sweep(names: Sequence[str] | None = None, limit: int | None = None, progress: bool = True,
          on_outcome: Callable[[ModuleOutcome], None] | None = None,
          options: dict[str, Any] | None = None) -> list[ModuleOutcome]:
    """Every sample of the module_db entries (or of ``names``; ``limit`` per entry), compiled with
    the backend ``options`` (the device among them)."""
    from tqdm import tqdm

    outcomes = []
    for info in tqdm(module_infos(names), desc="module_db sweep", unit="module", disable=not progress):
        for index, sample in samples(info, limit):
            outcome = run_sample(info, index, sample, options)
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    return outcomes


def summary(outcomes: Sequence[ModuleOutcome]) -> dict[str, int]:
    counts = {label: 0 for label in dict.fromkeys(COUNTED_AS.values())}
    for o in outcomes:
        counts[o.counted_as] += 1
    return counts


def format_outcomes(outcomes: Sequence[ModuleOutcome], failures: bool = False) -> str:
    by_module: dict[str, list[ModuleOutcome]] = {}
    for o in outcomes:
        by_module.setdefault(o.module, []).append(o)
    lines = [f"{'module':<32} {'pass':>5} {'refused':>7} {'wrong':>5} {'crash':>5} {'shared':>6}  first problem"]
    for module, items in by_module.items():
        c = summary(items)
        first = next((f"[{o.index}] {o.kind}: {o.reason}" for o in items if o.kind != PASS), "")
        lines.append(f"{module:<32} {c['pass']:>5} {c['refused']:>7} {c['wrong']:>5} {c['crash']:>5} "
                     f"{c['shared']:>6}  {first[:100]}")
    total = summary(outcomes)
    lines.append("total: " + ", ".join(f"{k} {v}" for k, v in total.items()) + f" over {len(by_module)} modules")
    if failures:
        lines += [f"{o.module}[{o.index}] {o.desc} {o.kind}: {o.reason}" + (f" (aot_eager: {o.control})"
                                                                             if o.control else "")
                  for o in outcomes if o.kind != PASS]
    return "\n".join(lines)
