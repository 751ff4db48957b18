"""Train each model of the zoo (:mod:`torch_adreno.tools.testing.zoo`) with a ``TrainingStep`` against
eager PyTorch, and classify what does not pass.

One run: the model is built once from seed 0 and copied (same initial weights for both), ``steps``
batches are drawn from one seeded generator, and both train on them with the entry's optimizer:
eager PyTorch (forward, backward, ``optimizer.step()``, ``zero_grad``), and
``torch_adreno.TrainingStep`` with its defaults (replay on: from the third step on, the recorded
launch list). The losses of every step and the parameters after the last are compared, relative:
a loss by ``|ours - eager| / |eager|``, a parameter tensor by ``||ours - eager||`` over its scale
(norms over the tensor, so that single near-zero elements do not dominate; the scale is its norm,
at least that of the model's RMS parameter value: :func:`_scales`); a model passes where both
maxima are within :data:`RELATIVE_TOLERANCE` -- or, where not, ours is at most twice as far as
eager float32 from a float64 run of the same training (:data:`FLOAT64_ERROR_MULTIPLIER`; the
reason then says so) -- and every step after the second was replayed.

What does not pass is classified (:data:`STATUSES`), with a reason naming what failed:

- *refused*: one of our clear errors (an ``AdrenoError``: the op or node it names);
- *aot_eager fails too*: the same training under ``torch.compile(backend="aot_eager")``,
  PyTorch's reference backend, fails (or differs from eager) as well: a limit of PyTorch's or of
  transformers', not ours;
- *graph break*: Dynamo cannot capture the loss as one graph (``aot_eager`` fails with
  ``fullgraph=True`` and runs without it), which a ``TrainingStep`` needs;
- *not replayed*: every step ran, but the step was not captured for replay (the reason the
  step gave);
- *ill-conditioned*: ours fails the float64 rule, but eager float32 is itself farther than the
  tolerance from the float64 run: the float32 training is chaotic (gradients through batch norms
  of near-equal samples), and ours follows the float64 losses as closely as eager float32 does
  for as long as eager float32 does (a wrong forward or a wrong first update shows there). The
  comparison cannot judge beyond that;
- *wrong result*: ours differs from eager by more than the tolerance where ``aot_eager`` does not;
- *internal error*: anything else ours raised (a bug).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torch_adreno.tools.testing.opinfo import CLEAR_ERROR, NOT_TRACEABLE, _failure
from torch_adreno.tools.testing.zoo import ZooModel, zoo_loss, zoo_models
from torch_adreno.training.step import TrainingStep

#: Losses and parameters of ours within this relative difference of eager's pass.
RELATIVE_TOLERANCE = 1e-3
#: Steps each model trains by default.
DEFAULT_STEPS = 6
#: Where ours is farther than that from eager, both are measured against a float64 run of the same
#: training: ours passes if it is at most this many times as far from it as eager float32 (plus
#: the tolerance). Training through a batch norm of two samples is ill-conditioned enough that two
#: float32 summation orders part within a few steps while both stay near the exact result.
FLOAT64_ERROR_MULTIPLIER = 2.0
#: TrainingStep calls before the replay: the first compiles, the second captures.
WARMUP_STEPS = 2

PASS, REFUSED, SHARED, GRAPH_BREAK = "pass", "refused", "aot_eager fails too", "graph break"
NOT_REPLAYED, ILL_CONDITIONED = "not replayed", "ill-conditioned"
WRONG, INTERNAL = "wrong result", "internal error"
STATUSES = (PASS, REFUSED, SHARED, GRAPH_BREAK, NOT_REPLAYED, ILL_CONDITIONED, WRONG, INTERNAL)


@dataclass
class ZooResult:
    """One model's run: its size, how far ours was from eager, and its status with the reason."""

    model: str
    family: str
    params: int
    steps: int
    replayed: int = 0
    #: Replayed steps checked against the compiled graphs (option ``verify_replay``).
    verified: int = 0
    loss_rel: float | None = None
    params_rel: float | None = None
    seconds: float = 0.0
    status: str = PASS
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASS


@dataclass
class _Training:
    """What one way of training produced: the loss of every step and the parameters after them."""

    losses: list[float]
    params: dict[str, torch.Tensor]


def _optimizer(entry: ZooModel, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if entry.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _eager(entry: ZooModel, model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]],
           loss_fn: Callable[..., torch.Tensor]) -> _Training:
    """``loss_fn`` trained eagerly (``loss_fn`` may be compiled: the control's runs)."""
    opt = _optimizer(entry, model)
    losses = []
    for batch in batches:
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return _Training(losses, _parameters(model))


def _scales(eager: _Training) -> dict[str, float]:
    """What each parameter tensor's difference is measured against: its own norm, or the norm a
    tensor of its size would have at the model's RMS parameter value, whichever is larger. (A
    bias that starts at zero and whose gradient is rounding noise -- a key bias, which the
    softmax cancels -- holds noise of ~1e-7 after a few AdamW steps; its own norm would compare
    noise with noise.)"""
    total = sum(float(p.square().sum()) for p in eager.params.values())
    count = sum(p.numel() for p in eager.params.values())
    rms = math.sqrt(total / max(count, 1))
    return {name: max(float(torch.linalg.vector_norm(p)), rms * math.sqrt(p.numel()))
            for name, p in eager.params.items()}


def relative_differences(ours: _Training, eager: _Training) -> tuple[float, float]:
    """The largest relative difference of a step's loss and of a parameter tensor (module docstring)."""
    loss_rel = max((abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) else math.inf
                    for a, b in zip(ours.losses, eager.losses, strict=True)), default=0.0)
    return loss_rel, max(_parameter_differences(ours, eager).values(), default=0.0)


def _parameter_differences(ours: _Training, eager: _Training) -> dict[str, float]:
    """Each parameter tensor's relative difference (infinite where ours is not finite)."""
    differences = {}
    for name, scale in _scales(eager).items():
        difference = float(torch.linalg.vector_norm(ours.params[name] - eager.params[name]))
        differences[name] = difference / scale if math.isfinite(difference) and scale > 0 else (
            difference if math.isfinite(difference) else math.inf)
    return differences


class _Reference:
    """Eager float32's training, and (made when first asked) a float64 run of the same training, to
    judge another run of it by (module docstring)."""

    def __init__(self, entry: ZooModel, initial: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]]) -> None:
        self._entry, self._initial, self._batches = entry, initial, batches
        self.eager = _eager(entry, copy.deepcopy(initial), batches, zoo_loss(entry))
        self._exact: _Training | None = None

    @property
    def exact(self) -> _Training:
        if self._exact is None:
            batches = [tuple(t.double() if t.is_floating_point() else t for t in batch) for batch in self._batches]
            self._exact = _eager(self._entry, copy.deepcopy(self._initial).double(), batches, zoo_loss(self._entry))
        return self._exact

    def judge(self, run: _Training) -> tuple[str, str]:
        """:data:`PASS` (within the tolerance of eager; or by the float64 rule, which the reason
        then states), :data:`ILL_CONDITIONED` or :data:`WRONG`, with the reason (module docstring)."""
        if max(relative_differences(run, self.eager)) <= RELATIVE_TOLERANCE:
            return PASS, ""
        ours, eager = _float64_errors(run, self.exact), _float64_errors(self.eager, self.exact)
        excess = {key: ours[key] - FLOAT64_ERROR_MULTIPLIER * eager[key] for key in ours}
        worst = max(excess, key=excess.__getitem__)
        if excess[worst] <= RELATIVE_TOLERANCE:
            return PASS, (f"float64 rule: from float64, ours {max(ours.values()):.1e}, eager float32 "
                          f"{max(eager.values()):.1e}")
        said = f"from float64 ({worst}): ours {ours[worst]:.1e}, eager float32 {eager[worst]:.1e}"
        strays = max(eager, key=eager.__getitem__)
        if eager[strays] > RELATIVE_TOLERANCE:
            # Eager float32 itself strays from the exact training: until its loss does, ours must follow.
            losses = [key for key in eager if key.endswith(" loss")]
            steady = next((i for i, key in enumerate(losses) if eager[key] > RELATIVE_TOLERANCE), len(losses))
            if steady > 0 and all(excess[key] <= RELATIVE_TOLERANCE for key in losses[:steady]):
                return ILL_CONDITIONED, (f"eager float32 is itself {eager[strays]:.1e} from float64 ({strays}); ours "
                                         f"follows the float64 losses as closely through step {steady}; {said}")
        return WRONG, f"{_worst(run, self.eager)}; {said}"


def _control(entry: ZooModel, initial: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]],
             reference: _Reference) -> tuple[str | None, str]:
    """The same training with the loss compiled by ``aot_eager``: None where it passes (the failure
    is ours), else :data:`GRAPH_BREAK` or :data:`SHARED` with what happened."""
    loss_fn = zoo_loss(entry)

    def trained(fullgraph: bool) -> _Training:
        torch._dynamo.reset()
        model = copy.deepcopy(initial)
        compiled = torch.compile(lambda *batch: loss_fn(model, *batch), backend="aot_eager", fullgraph=fullgraph,
                                 dynamic=False)
        return _eager(entry, model, batches, lambda _model, *batch: compiled(*batch))

    try:
        control = trained(fullgraph=True)
    except Exception as err:
        said = _said(err)
        try:
            control = trained(fullgraph=False)
        except Exception as again:
            return SHARED, f"aot_eager raises too: {_said(again)}"
        verdict, why = reference.judge(control)
        if verdict == PASS:
            return GRAPH_BREAK, f"one graph is needed: {said}"
        return SHARED, f"aot_eager with graph breaks: {verdict} ({why}); with fullgraph: {said}"
    verdict, why = reference.judge(control)
    if verdict != PASS:
        return SHARED, f"aot_eager: {verdict} too ({why})"
    return None, ""


def _said(err: BaseException) -> str:
    """What ``err`` says in one line: Dynamo's headline (its explanation and hints left out) and the
    user code's line it stopped at, where it names one."""
    text = str(err)
    headline = " ".join(text.split("Explanation:")[0].split())[:200]
    frames = text.split("from user code:")[-1].split('File "')[1:] if "from user code:" in text else []
    where = ""
    if frames:
        path, _, rest = frames[-1].partition('"')
        line = rest.partition(", line ")[2].partition(",")[0]
        where = f" (at {path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}:{line})"
    return f"{type(err).__name__}: {headline}{where}"


def run_model(entry: ZooModel, steps: int = DEFAULT_STEPS, options: Mapping[str, Any] | None = None,
              control: bool = True) -> ZooResult:
    """Train ``entry`` ``steps`` steps eagerly and with a ``TrainingStep`` (backend ``options``)
    and compare (module docstring). ``control``: run ``aot_eager`` on a model that does not pass,
    to tell PyTorch's limits and graph breaks from ours."""
    torch.manual_seed(0)
    initial = entry.build()
    generator = torch.Generator().manual_seed(1)
    batches = [entry.batch(generator) for _ in range(steps)]
    loss_fn = zoo_loss(entry)
    result = ZooResult(entry.name, entry.family, sum(p.numel() for p in initial.parameters()), steps)
    reference = _Reference(entry, initial, batches)

    torch._dynamo.reset()
    model = copy.deepcopy(initial)
    started = time.perf_counter()
    step: TrainingStep | None = None
    try:
        step = TrainingStep(model, loss_fn, _optimizer(entry, model), options)
        losses = [float(step(*batch)) for batch in batches]
        step.close()  # the host's parameters current
    except Exception as err:
        result.seconds = time.perf_counter() - started
        outcome = _failure(entry.name, 0, err)
        result.reason = outcome.reason
        result.status = REFUSED if outcome.kind == CLEAR_ERROR else INTERNAL
        if step is not None:
            result.replayed = step.replayed_steps
        if control and outcome.kind != CLEAR_ERROR:
            shared, why = _control(entry, initial, batches, reference)
            if shared == GRAPH_BREAK:  # (ours stopped at the same place, under the adreno backend)
                result.status, result.reason = shared, why
            elif shared is not None:
                result.status, result.reason = shared, f"{why} (ours: {outcome.reason})"
            elif outcome.kind == NOT_TRACEABLE:
                result.reason = f"Dynamo refuses under the adreno backend only: {outcome.reason}"
        return result
    result.seconds = time.perf_counter() - started
    result.replayed, result.verified = step.replayed_steps, step.replays_verified
    ours = _Training(losses, _parameters(model))
    result.loss_rel, result.params_rel = relative_differences(ours, reference.eager)
    result.status, result.reason = reference.judge(ours)
    if result.status == WRONG and control:
        shared, why = _control(entry, initial, batches, reference)
        if shared is not None:
            result.status, result.reason = shared, f"{why} (ours: {result.reason})"
    if result.status != PASS:
        return result
    if result.replayed < steps - WARMUP_STEPS:
        result.status = NOT_REPLAYED
        result.reason = "; ".join(sorted(set(step.unreplayable_reasons))) or (
            f"{result.replayed} of {steps} steps replayed, no reason given")
    return result


def _float64_errors(run: _Training, exact: _Training) -> dict[str, float]:
    """How far ``run`` is from the float64 run, relative: per step's loss and per parameter tensor
    (each over the float64 run's scale, as :func:`relative_differences` measures)."""
    errors = {f"step {i + 1} loss": abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) else math.inf
              for i, (a, b) in enumerate(zip(run.losses, exact.losses, strict=True))}
    errors.update(_parameter_differences(_Training(run.losses, {k: v.double() for k, v in run.params.items()}),
                                         exact))
    return errors


def _worst(ours: _Training, eager: _Training) -> str:
    """Where ours is farthest from eager: the first step whose loss is off, and the parameter
    tensor farthest off (relative)."""
    parts = []
    for index, (a, b) in enumerate(zip(ours.losses, eager.losses, strict=True)):
        if not abs(a - b) <= RELATIVE_TOLERANCE * abs(b):
            parts.append(f"step {index + 1} loss {a:.6g}, eager {b:.6g}")
            break
    differences = _parameter_differences(ours, eager)
    name = max(differences, key=differences.__getitem__, default="")
    if name:
        parts.append(f"parameter {name} off by {differences[name]:.1e} (relative)")
    return "; ".join(parts)


def run_zoo(names: Sequence[str] | None = None, steps: int = DEFAULT_STEPS, options: Mapping[str, Any] | None = None,
            on_result: Callable[[ZooResult], None] | None = None, progress: bool = True) -> list[ZooResult]:
    """:func:`run_model` for every entry named (all for None), in table order."""
    from tqdm import tqdm

    results = []
    for entry in tqdm(zoo_models(None if names is None else list(names)), desc="model zoo", unit="model",
                      disable=not progress):
        result = run_model(entry, steps, options)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def format_results(results: Sequence[ZooResult]) -> str:
    """The table: model, family, parameters, steps replayed, largest relative difference of the
    losses and of the parameters, seconds (ours: compile, capture and the steps), status and reason."""
    def rel(value: float | None) -> str:
        return "-" if value is None else f"{value:.1e}"

    lines = [f"{'model':<14} {'family':<10} {'params':>8} {'replayed':>8} {'loss rel':>8} {'param rel':>9} "
             f"{'time s':>7}  status"]
    for r in results:
        status = r.status + (f": {r.reason}" if r.reason else "")
        lines.append(f"{r.model:<14} {r.family:<10} {r.params:>8,} {f'{r.replayed}/{r.steps}':>8} "
                     f"{rel(r.loss_rel):>8} {rel(r.params_rel):>9} {r.seconds:>7.1f}  {status}")
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    lines.append(f"{counts[PASS]} of {len(results)} models pass (relative tolerance {RELATIVE_TOLERANCE:g}); "
                 + ", ".join(f"{s} {n}" for s, n in counts.items() if n and s != PASS))
    return "\n".join(lines)
