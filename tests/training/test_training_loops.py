"""Training loops as people write them, against eager.

* Every optimizer x implementation x memory mode x loop kind trains like eager, and its
  parameters change (a fused step once wrote parameters without bumping their versions, and a
  copy-mode loop kept uploading the first values: the loss stayed flat).
* Every way the host writes a parameter between compiled calls is seen.
* A learning-rate schedule stepped every step keeps a TrainingStep replaying (float and tensor
  learning rates): a new value is a scalar upload, not a new capture.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import cross_entropy_loss, small_classifier, small_classifier_batch
from torch import nn

import torch_adreno

pytestmark = pytest.mark.device

OPTIMIZERS = {"SGD": (torch.optim.SGD, {"momentum": 0.9}), "Adam": (torch.optim.Adam, {}),
              "AdamW": (torch.optim.AdamW, {"weight_decay": 0.1})}
IMPLEMENTATIONS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
STEPS = 5


_model, _batch, _loss = small_classifier, small_classifier_batch, cross_entropy_loss


def _eager_run(optimizer: str, implementation: str, steps: int = STEPS) -> tuple[list[float], nn.Module]:
    cls, kwargs = OPTIMIZERS[optimizer]
    model = _model()
    opt = cls(model.parameters(), lr=1e-2, **kwargs, **IMPLEMENTATIONS[implementation])
    x, y = _batch()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("loop", ["compile", "TrainingStep"])
@pytest.mark.parametrize("zero_copy", [None, False], ids=["zero_copy=auto", "zero_copy=False"])
@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_optimizers_train_like_eager(optimizer: str, implementation: str, zero_copy: bool | None, loop: str) -> None:
    cls, kwargs = OPTIMIZERS[optimizer]
    model = _model()
    initial = [p.detach().clone() for p in model.parameters()]
    opt = cls(model.parameters(), lr=1e-2, **kwargs, **IMPLEMENTATIONS[implementation])
    options = {} if zero_copy is None else {"zero_copy": zero_copy}
    x, y = _batch()
    losses = []
    if loop == "compile":
        compiled = torch.compile(model, backend="adreno", options=options)
        with torch_adreno.profile() as prof:
            for _ in range(STEPS):
                opt.zero_grad()
                loss = _loss(compiled, x, y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        assert prof.kernel_launches > 0
    else:
        with torch_adreno.TrainingStep(model, _loss, opt, options=options) as step:
            losses = [float(step(x, y)) for _ in range(STEPS)]
            assert step.replayed_steps == STEPS - 2
    expected_losses, reference = _eager_run(optimizer, implementation)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected_losses), rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0] - 1e-3, f"the loss did not fall: {losses}"
    for ours, theirs, before in zip(model.parameters(), reference.parameters(), initial, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        assert not torch.equal(ours, before), "a parameter did not change"


def _user_sgd(params: list[torch.Tensor], lr: float) -> None:
    """A user's own optimizer, as older tutorials write it (through ``.data``)."""
    for p in params:
        p.data.add_(p.grad, alpha=-lr)


class _DataOptimizer(torch.optim.Optimizer):
    """A user's own torch.optim.Optimizer whose step writes through ``.data``."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-group["lr"])


HOST_WRITES = {
    "no_grad in-place": lambda m, ref: [p.mul_(0.5) for p in m.parameters()],
    "copy_": lambda m, ref: [p.copy_(q) for p, q in zip(m.parameters(), ref.parameters(), strict=True)],
    "load_state_dict": lambda m, ref: m.load_state_dict(ref.state_dict()),
    ".data assignment": lambda m, ref: [setattr(p, "data", q.detach().clone())
                                        for p, q in zip(m.parameters(), ref.parameters(), strict=True)],
    "foreach op": lambda m, ref: torch._foreach_mul_(list(m.parameters()), 0.25),
    ".data in-place, then mark_changed": lambda m, ref: (
        [p.data.mul_(0.5) for p in m.parameters()], torch_adreno.mark_changed(*m.parameters())),
}


@pytest.mark.parametrize("zero_copy", [None, False], ids=["zero_copy=auto", "zero_copy=False"])
@pytest.mark.parametrize("write", sorted(HOST_WRITES))
def test_host_writes_between_compiled_calls_are_seen(write: str, zero_copy: bool | None) -> None:
    model = _model()
    other = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    options = {} if zero_copy is None else {"zero_copy": zero_copy}
    compiled = torch.compile(model, backend="adreno", options=options)
    x, _ = _batch()
    with torch.no_grad():
        compiled(x)  # parameters on the device
        HOST_WRITES[write](model, other)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("zero_copy", [None, False], ids=["zero_copy=auto", "zero_copy=False"])
@pytest.mark.parametrize("step_kind", ["own optimizer class", "own loop"])
def test_a_users_own_optimizer_trains(step_kind: str, zero_copy: bool | None) -> None:
    """Through ``.data`` (no version bump): a torch.optim.Optimizer subclass is seen by the step
    hook; a plain loop says so with mark_changed."""
    model, reference = _model(), _model()
    options = {} if zero_copy is None else {"zero_copy": zero_copy}
    compiled = torch.compile(model, backend="adreno", options=options)
    opt = _DataOptimizer(model.parameters(), 0.1) if step_kind == "own optimizer class" else None
    x, y = _batch()
    losses, expected = [], []
    for _ in range(4):
        for net, out in ((compiled, losses), (reference, expected)):
            params = list((model if net is compiled else reference).parameters())
            for p in params:
                p.grad = None
            loss = _loss(net, x, y)
            loss.backward()
            if net is compiled and opt is not None:
                opt.step()
            else:
                _user_sgd(params, 0.1)
                if net is compiled:
                    torch_adreno.mark_changed(*params)
            out.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


def _scheduled_run(step_fn, opt, sched, steps: int) -> list[float]:
    x, y = _batch()
    losses = []
    for _ in range(steps):
        losses.append(float(step_fn(x, y)))
        sched.step()
    return losses


@pytest.mark.parametrize("lr_kind", ["float", "tensor"])
def test_a_cosine_schedule_every_step_keeps_the_step_replaying(lr_kind: str) -> None:
    steps = 20

    def make(model: nn.Module, dtype: torch.dtype = torch.float32):
        lr = torch.tensor(1e-2, dtype=dtype) if lr_kind == "tensor" else 1e-2
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)

    model = _model()
    opt, sched = make(model)
    with torch_adreno.profile() as prof, torch_adreno.TrainingStep(model, _loss, opt) as step:
        ours = _scheduled_run(step, opt, sched, steps)
    assert prof.replayed_steps >= 16, (prof.replayed_steps, step.unreplayable_reasons)
    assert isinstance(opt.param_groups[0]["lr"], float if lr_kind == "float" else torch.Tensor)

    def eager(dtype: torch.dtype) -> list[float]:
        net = _model().to(dtype)
        e_opt, e_sched = make(net, dtype)
        x, y = _batch()
        out = []
        for _ in range(steps):
            e_opt.zero_grad()
            loss = _loss(net, x.to(dtype), y)
            loss.backward()
            e_opt.step()
            e_sched.step()
            out.append(loss.item())
        return out

    eager32, exact = torch.tensor(eager(torch.float32), dtype=torch.float64), torch.tensor(eager(torch.float64))
    ours_off = float((torch.tensor(ours, dtype=torch.float64) - exact).abs().max())
    eager_off = float((eager32 - exact).abs().max())
    assert ours_off <= 2 * eager_off + 1e-6, (ours_off, eager_off)
    assert ours[-1] < ours[0]


def test_a_learning_rate_a_loop_assigns_is_read_as_an_input() -> None:
    """Warmup by hand (``group["lr"] = value`` each step) replays, and the values take effect."""
    model, reference = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.0)
    x, y = _batch()
    with torch_adreno.TrainingStep(model, _loss, opt) as step:
        for i in range(8):
            lr = 0.05 * (i + 1) / 8
            opt.param_groups[0]["lr"] = lr
            ref_opt.param_groups[0]["lr"] = lr
            ours = float(step(x, y))
            ref_opt.zero_grad()
            loss = _loss(reference, x, y)
            loss.backward()
            ref_opt.step()
            assert abs(ours - loss.item()) <= 1e-4 * abs(loss.item()) + 1e-5, (i, ours, loss.item())
        assert step.replayed_steps == 6
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_checkpoints_and_close_give_the_optimizer_back_as_it_was_made() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    given = copy.deepcopy({k: v for k, v in opt.param_groups[0].items() if k != "params"})
    x, y = _batch()
    with torch_adreno.TrainingStep(model, _loss, opt) as step:
        step(x, y)
        # Between calls the groups hold what was given; during a call the learning rate is an input.
        assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == given
        with step._hyperparameters.applied():
            assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
        assert opt.param_groups[0]["lr"] == 1e-3
        saved = opt.state_dict()["param_groups"][0]
        assert {k: saved[k] for k in given} == given
    assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == given


IN_PLACE_ON_OUTPUTS = {
    "slice assignment": lambda out: out.__setitem__((slice(None), 0), 0.0),
    "mul_": lambda out: out.mul_(2.0),
    "add_": lambda out: out.add_(1.0),
    "index assignment": lambda out: out.__setitem__(torch.tensor([0, 2]), 5.0),
    "mul_ of a view": lambda out: out.view(-1).mul_(3.0),
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("zero_copy", [None, False], ids=["zero_copy=auto", "zero_copy=False"])
@pytest.mark.parametrize("edit", sorted(IN_PLACE_ON_OUTPUTS))
def test_in_place_writes_to_outputs_behave_as_in_eager(edit: str, zero_copy: bool | None, grad: bool) -> None:
    model = nn.Linear(4, 3)
    compiled = torch.compile(model, backend="adreno", options={} if zero_copy is None else {"zero_copy": zero_copy})
    x = torch.randn(5, 4)
    results = []
    for net in (compiled, model):
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grad):
            out = net(x)
            IN_PLACE_ON_OUTPUTS[edit](out)
        if grad:
            (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
        results.append((out.detach().clone(), None if not grad else model.weight.grad.clone()))
    (ours, ours_grad), (eager, eager_grad) = results
    torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)
    if grad:
        torch.testing.assert_close(ours_grad, eager_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("zero_copy", [None, False], ids=["zero_copy=auto", "zero_copy=False"])
def test_a_compiled_loss_scaled_in_place(zero_copy: bool | None) -> None:
    """As the Hugging Face Trainer does with gradient accumulation (``loss /= steps``)."""
    model = _model()
    reference = copy.deepcopy(model)
    compiled = torch.compile(lambda x, y: _loss(model, x, y), backend="adreno",
                             options={} if zero_copy is None else {"zero_copy": zero_copy})
    x, y = _batch()
    loss = compiled(x, y)
    loss /= 4
    loss.backward()
    expected = _loss(reference, x, y)
    expected /= 4
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


class _TinyLM(nn.Module):
    """A causal LM: embeddings, one pre-norm transformer block, a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.positions = nn.Embedding(64, 32), nn.Embedding(64, 32)
        self.block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(32, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        hidden = self.tokens(ids) + self.positions(torch.arange(length))
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        return self.head(self.block(hidden, src_mask=mask, is_causal=True))


def _lm_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)


def test_varying_lengths_in_buckets_replay_and_follow_eager() -> None:
    """Six sequence lengths cycling over 36 steps, padded to three buckets: each bucket compiles and
    captures once, then replays; the losses are those of the unpadded batches in eager."""
    lengths = [12, 16, 20, 24, 28, 32]
    buckets = torch_adreno.Buckets((16, 24, 32), pad={0: 0, 1: -100})
    model, reference = _TinyLM(), _TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    ours, eager = [], []
    with torch_adreno.profile() as prof, torch_adreno.TrainingStep(model, _lm_loss, opt) as step:
        for index in range(36):
            ids = torch.randint(0, 64, (4, lengths[index % len(lengths)]), generator=generator)
            ours.append(float(step(*buckets((ids, ids)))))
            ref_opt.zero_grad()
            loss = _lm_loss(reference, ids, ids)
            loss.backward()
            ref_opt.step()
            eager.append(loss.item())
    assert prof.replayed_steps >= 27, (prof.replayed_steps, step.unreplayable_reasons, prof.replay_fallbacks)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=2e-4, atol=2e-5)


def test_buckets_pad_to_the_smallest_length_that_holds_the_batch() -> None:
    buckets = torch_adreno.Buckets((8, 4), pad={"ids": 0, "labels": -100})
    batch = {"ids": torch.ones(2, 3, dtype=torch.long), "labels": torch.ones(2, 3, dtype=torch.long),
             "weight": torch.ones(2)}
    padded = buckets(batch)
    assert padded["ids"].shape == (2, 4) and padded["ids"][:, 3].eq(0).all()
    assert padded["labels"][:, 3].eq(-100).all() and padded["weight"] is batch["weight"]
    assert buckets(batch)["ids"][:, :3].eq(1).all()
    with pytest.raises(ValueError, match="longer than the largest bucket, 8"):
        buckets({"ids": torch.ones(1, 9), "labels": torch.ones(1, 9)})
    with pytest.raises(ValueError, match="differ in length"):
        buckets({"ids": torch.ones(1, 3), "labels": torch.ones(1, 5)})
    with pytest.raises(KeyError, match="no 'labels'"):
        buckets({"ids": torch.ones(1, 3)})
    assert buckets.length_for(4) == 4 and buckets.length_for(5) == 8


def test_a_step_captured_with_one_tensor_passed_twice_is_not_replayed_for_two() -> None:
    """Dynamo compiles ``step(ids, ids)`` with one input; a replay of it must not serve
    ``step(ids, labels)`` (it would read the ids as labels)."""
    model, reference = _TinyLM(), _TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (2, 8), generator=generator)
    labels = ids.clone()
    labels[:, 4:] = -100
    with torch_adreno.profile() as prof, torch_adreno.TrainingStep(model, _lm_loss, opt) as step:
        for batch in ((ids, ids), (ids, ids), (ids, ids), (ids, labels), (ids, labels), (ids, labels)):
            ours = float(step(*batch))
            ref_opt.zero_grad()
            loss = _lm_loss(reference, *batch)
            loss.backward()
            ref_opt.step()
            assert abs(ours - loss.item()) <= 1e-4 * abs(loss.item()) + 1e-5, (ours, loss.item())
    assert any("share memory" in reason for reason in prof.replay_fallbacks), prof.replay_fallbacks


@pytest.mark.parametrize("zero_copy", [None, False], ids=["zero_copy=auto", "zero_copy=False"])
@pytest.mark.parametrize("accumulate", [2, 3])
def test_gradient_accumulation_replays_and_follows_eager(accumulate: int, zero_copy: bool | None) -> None:
    model, reference = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)
    ref_sched = torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, T_max=8)
    generator = torch.Generator().manual_seed(2)
    calls = accumulate * 8
    batches = [(torch.randn(16, 16, generator=generator), torch.randint(0, 4, (16,), generator=generator))
               for _ in range(calls)]
    ours, eager, stepped = [], [], []
    options = {} if zero_copy is None else {"zero_copy": zero_copy}
    with torch_adreno.profile() as prof, torch_adreno.TrainingStep(model, _loss, opt, options=options,
                                                                   accumulate=accumulate, max_grad_norm=1.0) as step:
        for index, (x, y) in enumerate(batches):
            ours.append(float(step(x, y)))
            stepped.append(step.stepped_optimizer)
            if step.stepped_optimizer:
                sched.step()
            loss = _loss(reference, x, y)
            (loss / accumulate).backward()
            eager.append(loss.item())
            if (index + 1) % accumulate == 0:
                torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
                ref_opt.step()
                ref_opt.zero_grad()
                ref_sched.step()
    assert stepped == [(i + 1) % accumulate == 0 for i in range(calls)]
    # Each phase (first, middle, last) compiles, then captures, then replays.
    phases = 2 if accumulate == 2 else 3
    assert prof.replayed_steps >= calls - 2 * phases - 2, (prof.replayed_steps, prof.replay_fallbacks)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_accumulate_is_checked() -> None:
    model = _model()
    with pytest.raises(ValueError, match="accumulate must be a positive integer"):
        torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1), accumulate=0)


def test_slow_calls_say_what_they_do(caplog: pytest.LogCaptureFixture) -> None:
    """A new geometry's first call compiles and its second captures: both say so, with their cost."""
    model = _model()
    x, y = _batch()
    with caplog.at_level("INFO", logger="torch_adreno"), \
            torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1)) as step:
        for _ in range(3):
            step(x, y)
    lines = [r.getMessage() for r in caplog.records if r.name == "torch_adreno"]
    assert any(line.startswith("TrainingStep: compiling the step for batch [64, 16], [64]") for line in lines), lines
    assert any(line.startswith("TrainingStep: compiling took") and "OpenCL program" in line for line in lines), lines
    assert any(line.startswith("TrainingStep: capturing took") for line in lines), lines
    assert sum("took" in line for line in lines) == 2  # the replayed third call is not reported
