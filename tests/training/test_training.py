"""Whole training loops on the device against eager PyTorch, step for step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import training_step_against_eager
from torch._dynamo.utils import same

import torch_adreno
from torch_adreno.models import MODELS

pytestmark = pytest.mark.device

STEPS = 20


def _optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05)
    return torch.optim.Adam(params, lr=1e-3)


# MLP + Adam cannot keep parameters within rtol=1e-4/atol=1e-5 of eager (measured): Adam divides
# each gradient element by its own running magnitude, so elements whose gradient is a cancellation
# near 1e-9 (where float32 reassociation changes it by percents) move by up to the learning rate;
# over 20 free-running steps the ~1e-7 drift this leaves also pushes fc2 pre-activations that sit
# within ~2e-5 of the ReLU kink to its other side (two of them, at step 19). Losses still agree to
# 1e-4 at every step. The optimizer is PyTorch's own code on the host; what the backend computes
# is the loss and the gradients, so for this configuration the test asserts, at every step, the
# gradients at the strict tolerance and the parameters after the optimizer step (on elements
# whose Adam denominator is not at that cancellation level), then re-synchronises the compiled model
# to eager.
FREE_RUNNING = {("mlp", "sgd"), ("lenet", "sgd"), ("lenet", "adam")}


@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_trains_like_eager(model_name, opt_name):
    spec = MODELS[model_name]
    model = spec.make()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="adreno")
    opt, ref_opt = _optimizer(opt_name, model.parameters()), _optimizer(opt_name, reference.parameters())
    free_running = (model_name, opt_name) in FREE_RUNNING
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        x, y = spec.batch(gen)
        training_step_against_eager(compiled, model, reference, x, y, step, grads=not free_running)
        opt.step()
        ref_opt.step()
        if not free_running:
            _assert_adam_step_matches(model, reference, ref_opt, step)
            _resync(model, opt, reference, ref_opt)
    if free_running:
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"parameter {n}: {m}")


def _assert_adam_step_matches(model, reference, ref_opt, step: int) -> None:
    """Parameters after one Adam step from the same state agree with eager's, except where Adam's
    denominator sqrt(v_hat) is below 1e-6: there the gradient is a float32 cancellation and its
    noise is amplified up to the learning rate (measured: at most 0.2% of the elements per step)."""
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        state = ref_opt.state[q]
        beta2 = ref_opt.param_groups[0]["betas"][1]
        denominator = (state["exp_avg_sq"] / (1 - beta2 ** state["step"])).sqrt()
        sensitive = denominator <= 1e-6
        assert sensitive.float().mean().item() <= 0.01, (name, step, sensitive.float().mean().item())
        torch.testing.assert_close(p.detach()[~sensitive], q.detach()[~sensitive], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"parameter {n} after step {step}: {m}")


def _resync(model, opt, reference, ref_opt) -> None:
    with torch.no_grad():
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            p.copy_(q)
    # A deep copy: load_state_dict keeps the given tensors (same dtype and device), so without it
    # both optimizers would update one set of moments, each step twice.
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))


def test_compiled_loss_function_trains_like_eager():
    """Cross-entropy compiled with the model: log_softmax and NLL run on the device too."""
    spec = MODELS["lenet"]
    model = spec.make()
    reference = copy.deepcopy(model)

    def loss_fn(m, x, y):
        return F.cross_entropy(m(x), y)

    step_fn = torch.compile(loss_fn, backend="adreno", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        x, y = spec.batch(gen)
        opt.zero_grad()
        with torch_adreno.profile() as prof:
            loss = step_fn(model, x, y)
            loss.backward()
        # log_softmax (decomposed: amax, exp, log) and NLL (gather) from the loss function's line.
        _assert_ran_on_the_device(prof, {"aten.amax.default", "aten.gather.default"},
                                  sources={"return F.cross_entropy(m(x), y)"})
        opt.step()
        ref_opt.zero_grad()
        ref_loss = loss_fn(reference, x, y)
        ref_loss.backward()
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_inference_under_no_grad():
    spec = MODELS["lenet"]
    model = spec.make().eval()
    x, _ = spec.batch(torch.Generator().manual_seed(3))
    with torch.no_grad(), torch_adreno.profile() as prof:
        out = torch.compile(model, backend="adreno", fullgraph=True)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    _assert_ran_on_the_device(prof, {"aten.convolution.default"})
    assert all(not k.graph.startswith("backward") for k in prof.kernels), "no backward under no_grad"


def _assert_ran_on_the_device(prof: torch_adreno.profile, ops: set[str], modules: set[str] = frozenset(),
                              sources: set[str] = frozenset()) -> None:
    """Kernels of ``ops`` (ATen names), of ``modules`` (top-level submodule names) and of source
    lines containing each of ``sources`` launched, and nothing ran on the host: the part a test is
    about was compiled, not left to eager by a graph break."""
    assert prof.host_fallback_ops == [] and prof.kernel_launches > 0
    lines = {line for k in prof.kernels for line in k.source_lines}
    assert all(any(text in line for line in lines) for text in sources), (sources, lines)
    launched_ops = {o for k in prof.kernels for o in k.aten_ops}
    launched_modules = {m.split(".")[0] for k in prof.kernels for m in k.modules}
    assert ops <= launched_ops, sorted(ops - launched_ops)
    assert modules <= launched_modules, (sorted(modules - launched_modules), sorted(launched_modules))


def _losses_after_backward(step_fn, models, x, y):
    """Each model's loss on (x, y), after its backward: the first through the backend (profiled),
    the others eagerly (float64 models on float64 inputs)."""
    with torch_adreno.profile() as prof:
        loss = step_fn(models[0], x, y)
        loss.backward()
    losses = [loss.item()]
    for m in models[1:]:
        double = next(m.parameters()).dtype == torch.float64
        eager_loss = F.cross_entropy(m(x.double() if double and x.is_floating_point() else x), y)
        eager_loss.backward()
        losses.append(eager_loss.item())
    return losses, prof


#: Steps of a model's bounded run, where fewer than :data:`STEPS` (its full run is ``slow``).
BOUNDED_STEPS = {"resnet_mini": 10}


@pytest.mark.parametrize("model_name", ["resnet_mini", "transformer"])
def test_bigger_reference_models_train_like_eager(model_name):
    _bigger_model_trains_like_eager(model_name, min(STEPS, BOUNDED_STEPS.get(model_name, STEPS)))


@pytest.mark.slow
def test_resnet_mini_trains_like_eager_over_all_steps():
    _bigger_model_trains_like_eager("resnet_mini", STEPS)


def _bigger_model_trains_like_eager(model_name: str, steps: int) -> None:
    """BatchNorm in training mode (running statistics written back), LayerNorm, attention, GELU,
    embedding and its scatter-add backward, all on the device.

    resnet_mini's final parameters and running statistics are held to Inductor's accuracy rule as
    PyTorch's own benchmarks apply it (``torch._dynamo.utils.same`` with a float64 run): close to
    eager at 1e-4, else an RMSE from float64 at most twice eager float32's. After 20 steps its
    state is chaotic: a ReLU input within float32 noise of zero lands on one side in one run and
    on the other in another, and moves a gradient by a whole element. Over ten initial seeds
    (measured), eager float32's RMSE from float64 over all parameters ranged 2.5e-7..4.0e-6 and
    ours 1.5e-6..4.5e-6 (means 2.8e-6 and 2.9e-6): whichever run avoided a flip looks ten times
    better. A max-abs rule (ours from eager within twice eager from float64, per tensor) fails
    3 of 8 seeds for that reason alone. What is not chaotic, every kernel's output on
    identical inputs against float64, tests/frontend/test_graph_accuracy.py holds to twice eager's error.
    Its losses, and everything of the transformer, are held to rtol=1e-4/atol=1e-5 against eager.
    The unmarked test runs resnet_mini for 10 steps (its three runs, float64 among them, cost 3 s
    a step on two cores; the rules are the same); its 20-step run is ``slow``.
    """
    spec = MODELS[model_name]
    model = spec.make()
    reference = copy.deepcopy(model)
    reference64 = copy.deepcopy(model).double() if model_name == "resnet_mini" else None
    step_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", fullgraph=True)
    # resnet_mini at lr=0.05 with momentum 0.9 is chaotic in float32: eager's own loss drifts 1.7e-3
    # from a float64 run by step 20 (ours: 2.5e-4), so eager is no 1e-4 reference there. At lr=0.01
    # both stay within 5e-6 of float64.
    lr, momentum = (0.01, 0.0) if model_name == "resnet_mini" else (0.05, 0.9)
    models = [m for m in (model, reference, reference64) if m is not None]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum) for m in models]
    gen = torch.Generator().manual_seed(4)
    for step in range(steps):
        x, y = spec.batch(gen)
        for opt in opts:
            opt.zero_grad()
        (loss, ref_loss, *_), prof = _losses_after_backward(step_fn, models, x, y)
        for opt in opts:
            opt.step()
        assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss), (step, loss, ref_loss)
        _assert_ran_on_the_device(prof, {"aten.convolution_backward.default"} if model_name == "resnet_mini" else
                                  {"aten.embedding.default",  # (its hand-written attention runs fused)
                                   "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"},
                                  {n for n, _ in model.named_children()})
    if reference64 is None:
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"parameter {n}: {m}")
    else:
        states = [(dict(m.named_parameters()) | dict(m.named_buffers())) for m in (model, reference, reference64)]
        for name, ours in states[0].items():
            eager, exact = states[1][name].detach(), states[2][name].detach()
            if ours.is_floating_point():
                assert same(eager, ours.detach(), fp64_ref=exact, tol=1e-4), (
                    name, (ours - eager).abs().max().item(), (eager.double() - exact).abs().max().item())
            else:
                assert torch.equal(ours, eager), name
    if reference64 is None:
        for (name, b), rb in zip(model.named_buffers(), reference.buffers(), strict=True):
            torch.testing.assert_close(b, rb, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"buffer {n}: {m}")


@pytest.mark.parametrize("model_name", ["mobilenet_mini", "lstm"])
def test_mobilenet_and_lstm_train_like_eager(model_name):
    """Depthwise convolutions with ReLU6 and an adaptive pool; a two-layer LSTM (RNN tracing is
    enabled by importing the backend, so the LSTM runs on the device, not eagerly on the host).

    mobilenet_mini is sensitive in float32 (depthwise convs feeding BatchNorm): eager's own loss
    drifts about 1e-4 relative from a float64 run within 15 steps at lr=0.01 (ten times that at
    lr=0.05), and ours drifts as far, on some devices at a step where eager happens to be nearly
    exact. The drift is chaotic step to step, so its losses
    are held, over the whole run, to 1e-4 of the float64 loss or to twice eager float32's own
    worst drift, where that is larger; the LSTM's to 1e-4 of eager float32 at every step.
    """
    lr = 0.01 if model_name == "mobilenet_mini" else 0.05
    spec = MODELS[model_name]
    model = spec.make()
    reference = copy.deepcopy(model)
    reference64 = copy.deepcopy(model).double() if model_name == "mobilenet_mini" else None
    step_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", fullgraph=True)
    models = [m for m in (model, reference, reference64) if m is not None]
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in models]
    gen = torch.Generator().manual_seed(5)
    drift: list[tuple[float, float]] = []  # (ours, eager) relative to the float64 loss, per step
    for step in range(STEPS):
        x, y = spec.batch(gen)
        for opt in opts:
            opt.zero_grad()
        (loss, ref_loss, *exact_loss), prof = _losses_after_backward(step_fn, models, x, y)
        if reference64 is None:
            assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss), (step, loss, ref_loss)
        else:
            exact = exact_loss[0]
            drift.append((abs(loss - exact) / abs(exact), abs(ref_loss - exact) / abs(exact)))
        for opt in opts:
            opt.step()
        # Without RNN tracing the LSTM would run eagerly while the embedding and head still launch
        # kernels: its gates (sigmoid, tanh) must be among the kernels, named after the module.
        _assert_ran_on_the_device(prof, {"aten.sigmoid.default", "aten.tanh.default"} if model_name == "lstm" else
                                  {"aten.convolution_backward.default"},
                                  {n for n, _ in model.named_children()})
    if drift:
        ours_worst, eager_worst = max(d[0] for d in drift), max(d[1] for d in drift)
        assert ours_worst <= max(1e-4, 2 * eager_worst), [f"{o:.1e}/{e:.1e}" for o, e in drift]


def test_partial_batch_and_new_sequence_length_recompile_boundedly():
    """A final partial batch and a changed sequence length: Dynamo retraces with symbolic shapes;
    the backend compiles one program per distinct concrete shape (bounded, see README)."""
    spec = MODELS["transformer"]
    model = spec.make()
    reference = copy.deepcopy(model)
    step_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", fullgraph=True)
    gen = torch.Generator().manual_seed(6)
    shapes = [(16, 64), (16, 64), (5, 64), (5, 64), (16, 32), (5, 64), (3, 17), (3, 17)]
    torch._dynamo.utils.counters.clear()
    programs: set[str] = set()  # the backend names each compiled program forward_<n>, <n> counting compiles
    for i, (batch, seq) in enumerate(shapes):
        x = torch.randint(0, 1000, (batch, seq), generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        with torch_adreno.profile() as prof:
            loss = step_fn(model, x, y)
            loss.backward()
        ran = {k.graph for k in prof.kernels if k.graph.startswith("forward")}
        assert len(ran) == 1, ran
        if (batch, seq) not in shapes[:i]:
            assert ran - programs, f"{(batch, seq)} is new: a program for it was compiled"
        elif shapes[i - 1] == (batch, seq):
            assert not ran - programs, f"{(batch, seq)} repeated: no compile"
        programs |= ran
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        assert abs(loss.item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()), (batch, seq)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    # Dynamo traces with static shapes, then with a symbolic batch, then (when the sequence length
    # changes too) with both symbolic: each of its graphs compiles its own program per shape, so a
    # shape seen under an earlier graph ((5, 64) here) may be compiled once more, never again after.
    traces = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert traces <= 3, dict(torch._dynamo.utils.counters["stats"])
    assert len(set(shapes)) <= len(programs) <= len(set(shapes)) + traces - 2, programs
