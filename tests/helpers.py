"""Test helpers: capture ATen graphs without a device, compare compiled runs with eager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._functorch.aot_autograd import aot_function
from torch.fx import GraphModule

import torch_adreno
from torch_adreno.frontend import decomposition_table
from torch_adreno.kernels import KernelSource


class LaunchProfile(torch_adreno.profile):
    """A profile that also keeps the rendered kernel of every launch it saw (``launched``: the
    source that ran, with its image operands), for tests that check what the device was asked to
    do, not only that it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[KernelSource] = []

    def on_launch(self, record: Any) -> None:
        super().on_launch(record)
        self.launched.append(record.kernel)


def assert_ran_on_device(prof: torch_adreno.profile, graphs: Sequence[str] = ()) -> None:
    """The profile saw compiled graphs run and kernels launched, and no op ran on the host.

    ``host_fallback_ops == []`` alone holds when nothing reached the device at all (a backend
    handing back the FX graph runs every op eagerly and records nothing). ``graphs``: prefixes
    ("forward", "backward", "inference") each of which must name a graph that launched kernels.
    """
    assert prof.graph_runs, "no compiled graph ran on the device"
    assert prof.kernel_launches > 0, "the adreno backend launched no kernel"
    assert prof.host_fallback_ops == [], prof.host_fallback_ops
    launched = {k.graph for k in prof.kernels}
    for prefix in graphs:
        assert any(g.startswith(prefix) for g in launched), f"no {prefix} graph launched kernels: {sorted(launched)}"


def capture_graphs(fn: Callable[..., Any], *inputs: torch.Tensor) -> list[GraphModule]:
    """The ATen graphs (forward, then backward when inputs need grad) the backend would receive."""
    graphs: list[GraphModule] = []

    def keep(gm: GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm

    compiled = aot_function(fn, fw_compiler=keep, bw_compiler=keep, decompositions=decomposition_table())
    out = compiled(*inputs)
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        out.sum().backward()
    return graphs


def adreno_with(kernel_choices: Callable[[Any], Any] | None) -> Any:
    """The backend for ``torch.compile``: ``"adreno"``, or where ``kernel_choices`` is given (a
    function of the KernelChoices made for the device) the backend compiling with its result."""
    if kernel_choices is None:
        return "adreno"
    import functools

    from torch_adreno.frontend import adreno_backend

    return functools.partial(adreno_backend, kernel_choices=kernel_choices)


def run_compiled(fn: Callable[..., Any], inputs: Sequence[Any], options: dict[str, Any] | None = None,
                 grad: bool = True, kernel_choices: Callable[[Any], Any] | None = None,
                 ) -> tuple[Any, list[torch.Tensor | None], LaunchProfile]:
    """Forward (and backward of sum(out * weights)) through the adreno backend, with a profile
    (``kernel_choices``: :func:`adreno_with`'s)."""
    compiled = torch.compile(fn, backend=adreno_with(kernel_choices), options=options or {}, fullgraph=True,
                             dynamic=False)
    leaves = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x
              for x in inputs]
    with LaunchProfile() as prof:
        out = compiled(*leaves)
        grads = _backward(out, leaves) if grad else []
    return out, grads, prof


def run_eager(fn: Callable[..., Any], inputs: Sequence[Any], grad: bool = True) -> tuple[Any, list[torch.Tensor | None]]:
    leaves = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x
              for x in inputs]
    out = fn(*leaves)
    grads = _backward(out, leaves) if grad else []
    return out, grads


def _backward(out: Any, leaves: Sequence[Any]) -> list[torch.Tensor | None]:
    outs = out if isinstance(out, (tuple, list)) else [out]
    total = None
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad:
            # Weights make every output element's gradient distinct (catches transposed gradients).
            w = torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape) * (i + 1)
            term = (o * w).sum()
            total = term if total is None else total + term
    if total is None:
        return []
    total.backward()
    return [leaf.grad if isinstance(leaf, torch.Tensor) and leaf.requires_grad else None for leaf in leaves]


def assert_follows_float64(fn: Callable[..., Any], *inputs: Any, slack: float = 1e-3,
                           options: dict[str, Any] | None = None,
                           kernel_choices: Callable[[Any], Any] | None = None) -> LaunchProfile:
    """The float64 rule for 16-bit (or any chaotic) results: compiled forward and gradients at most
    twice as far from a float64 run as eager's in the inputs' own types, plus ``slack`` (each
    compared by its largest absolute difference); the backend really ran (kernels launched).
    ``kernel_choices``: as :func:`run_compiled` takes it."""
    out, grads, prof = run_compiled(fn, inputs, options, kernel_choices=kernel_choices)
    eager_out, eager_grads = run_eager(fn, inputs)
    exact_out, exact_grads = run_eager(fn, [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point()
                                            else x for x in inputs])
    results = [("output", out, eager_out, exact_out),
               *((f"gradient {i}", g, e, r) for i, (g, e, r) in enumerate(zip(grads, eager_grads, exact_grads,
                                                                                  strict=True)))]
    for what, ours, eager, exact in results:
        if exact is None:
            assert ours is None, what
            continue
        assert ours.dtype == eager.dtype, f"{what}: {ours.dtype}, eager {eager.dtype}"
        ours_off = float((ours.double() - exact).abs().max())
        eager_off = float((eager.double() - exact).abs().max())
        assert ours_off <= 2 * eager_off + slack, f"{what}: ours {ours_off:.3g} from float64, eager {eager_off:.3g}"
    assert_ran_on_device(prof)
    return prof


def assert_matches_eager(fn: Callable[..., Any], *inputs: Any, grad: bool = True, rtol: float = 1e-4,
                         atol: float = 1e-5, options: dict[str, Any] | None = None,
                         kernel_choices: Callable[[Any], Any] | None = None) -> LaunchProfile:
    """Compiled forward and gradients equal eager's; the backend really ran (kernels launched).
    ``kernel_choices``: compile with other kernel choices than the device's (:func:`adreno_with`)."""
    out, grads, prof = run_compiled(fn, inputs, options, grad, kernel_choices)
    ref_out, ref_grads = run_eager(fn, inputs, grad)
    torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
    for g, r in zip(grads, ref_grads, strict=True):
        if r is None:
            assert g is None
        else:
            torch.testing.assert_close(g, r, rtol=rtol, atol=atol)
    assert_ran_on_device(prof)
    return prof


def training_step_against_eager(compiled: Callable[..., Any], model: torch.nn.Module, reference: torch.nn.Module,
                                x: torch.Tensor, y: torch.Tensor, step: int, grads: bool = True) -> torch_adreno.profile:
    """Forward and backward of ``compiled`` (``model`` through the backend) and of the eager
    ``reference`` on ``(x, y)`` with cross-entropy: losses within 1e-4 relative, every op on the
    device and, with ``grads``, every parameter's gradient within rtol 1e-4 / atol 1e-5. Returns
    the profile of ours; gradients are left for the caller's optimizers."""
    import torch.nn.functional as F

    with torch_adreno.profile() as prof:
        model.zero_grad()
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
    reference.zero_grad()
    ref_loss = F.cross_entropy(reference(x), y)
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()), (step, loss.item(), ref_loss.item())
    assert_ran_on_device(prof)
    if grads:
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, n=name, s=step: f"gradient of {n} at step {s}: {m}")
    return prof


def small_classifier() -> torch.nn.Module:
    """The loop tests' model: 16 features, 4 classes, seeded."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def small_classifier_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """64 examples for :func:`small_classifier`, the same every call."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(64, 16, generator=generator), torch.randint(0, 4, (64,), generator=generator)


def cross_entropy_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss function the TrainingStep tests train with: ``loss_fn(model, *batch)``."""
    return torch.nn.functional.cross_entropy(model(x), y)


def eager_training_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                        y: torch.Tensor) -> torch.Tensor:
    """The step a TrainingStep is compared with, in eager PyTorch; returns the detached loss."""
    opt.zero_grad(set_to_none=True)
    loss = cross_entropy_loss(model, x, y)
    loss.backward()
    opt.step()
    return loss.detach()


def record_programs(monkeypatch: Any) -> list[Any]:
    """A list that receives every KernelProgram the backend compiles from now on in the test (with
    its graph and memory plan): ``frontend.pipeline.compile_program`` wrapped for the test's duration."""
    from torch_adreno.frontend import pipeline

    programs: list[Any] = []
    original = pipeline.compile_program

    def keep(*args: Any, **kwargs: Any) -> Any:
        programs.append(original(*args, **kwargs))
        return programs[-1]

    monkeypatch.setattr(pipeline, "compile_program", keep)
    return programs
