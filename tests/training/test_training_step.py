"""TrainingStep: training state stays on the device; host copies are right at the sync points.

Run in copy mode (zero_copy=False: how a GPU with its own memory runs), where deferring matters.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import cross_entropy_loss as _loss
from helpers import eager_training_step as _eager_step

import torch_adreno
from torch_adreno.training.gradients import GradientOnDevice

pytestmark = pytest.mark.device

COPY = {"zero_copy": False}



def _setup(optimizer: str = "sgd"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    reference = copy.deepcopy(model)

    def make(params):
        if optimizer == "adam":
            return torch.optim.Adam(params, lr=0.01)
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    return model, make(model.parameters()), reference, make(reference.parameters())



def _batches(n: int):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 12, generator=generator), torch.randint(0, 5, (16,), generator=generator))
            for _ in range(n)]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_steps_match_eager_and_only_the_batch_and_loss_cross(optimizer: str) -> None:
    model, opt, reference, reference_opt = _setup(optimizer)
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    for i, (x, y) in enumerate(_batches(6)):
        with torch_adreno.profile() as prof:
            loss = step(x, y)
        expected = _eager_step(reference, reference_opt, x, y)
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
        assert all(isinstance(p.grad, GradientOnDevice) for p in model.parameters())  # cleared, marked
        if i >= 2:  # after warm-up: the batch up, the loss down, nothing else
            minimum = x.numel() * x.element_size() + y.numel() * y.element_size() + loss.element_size()
            copied = prof.bytes_host_to_device + prof.bytes_device_to_host
            assert copied <= 1.05 * minimum, (copied, minimum)
    # Out of date on the host until a sync point or the first read (seen here bypassing the read
    # trap), and visibly so.
    with torch._C.DisableTorchFunction():
        assert torch.isnan(model[0].weight.detach().reshape(-1)[0])
    state = model.state_dict()  # a sync point
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5)
    optimizer_state = opt.state_dict()["state"]
    for index, p in enumerate(reference.parameters()):
        for key, value in reference_opt.state[p].items():
            torch.testing.assert_close(optimizer_state[index][key], value, rtol=1e-4, atol=1e-5)
    step.close()


def test_synchronize_then_eager_use_and_more_steps() -> None:
    model, opt, reference, reference_opt = _setup()
    batches = _batches(4)
    with torch_adreno.TrainingStep(model, _loss, opt, options=COPY) as step:
        for x, y in batches[:2]:
            step(x, y)
            _eager_step(reference, reference_opt, x, y)
        assert step.synchronize() > 0
        x, y = batches[2]
        with torch.no_grad():  # eager evaluation between steps, after a sync point
            torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
        for x, y in batches[2:]:
            torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
    # Leaving the block synchronized: the host copies are current.
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="closed"):
        step(*batches[0])


def test_host_edits_between_steps_apply_to_current_values() -> None:
    """An in-place edit through PyTorch between steps first makes the host copies current (the
    read trap), so it edits the current values and the next step starts from them, as in eager."""
    model, opt, reference, reference_opt = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    for x, y in _batches(2):
        step(x, y)
        _eager_step(reference, reference_opt, x, y)
        for m, o in ((model, opt), (reference, reference_opt)):
            with torch.no_grad():
                m[2].bias.add_(1.0)
                o.state[m[0].weight]["momentum_buffer"].mul_(2.0)
    x, y = _batches(3)[2]
    torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
    step.close()
    _assert_models_match(model, reference)


def test_host_changes_the_read_trap_cannot_see_are_refused() -> None:
    """Edits that bypass torch functions (C code, another thread; here: torch function handling
    disabled) change an out-of-date copy: refused at the next step or sync point, by name."""
    model, opt, _, _ = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    x, y = _batches(1)[0]
    step(x, y)
    step(x, y)
    with torch.no_grad(), torch._C.DisableTorchFunction():
        model[2].bias.add_(1.0)
        opt.state[model[0].weight]["momentum_buffer"].mul_(2.0)
    # Named as the user knows them, not as graph inputs (primals_1 of forward_0).
    with pytest.raises(RuntimeError, match=r"^2\.bias was changed on the host"):
        step(x, y)
    # The next sync point reports it too, after restoring the device's values over the change made
    # to an out-of-date copy; training then goes on from them.
    with pytest.raises(RuntimeError, match=r"\(2\.bias, state\['momentum_buffer'\] of 0\.weight\).*discarded"):
        step.synchronize()
    assert not torch.isnan(model[2].bias).any()
    step(x, y)
    step.close()
    assert not any(torch.isnan(p).any() for p in model.parameters())


def test_misuse_is_refused_with_a_reason() -> None:
    model, opt, _, _ = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    x, y = _batches(1)[0]
    _loss(model, x, y).backward()
    with pytest.raises(ValueError, match="zero_grad"):
        step(x, y)
    opt.zero_grad(set_to_none=True)
    step(x, y)
    # A refused step leaves what the last one left: out-of-date host copies still made current on
    # first read, gradients still marked.
    with pytest.raises(ValueError, match="do not require gradients"):
        step(x.clone().requires_grad_(), y)
    assert isinstance(model[0].weight.grad, GradientOnDevice)
    assert not torch.isnan(copy.deepcopy(model)[0].weight).any()
    step.close()


def test_no_growth_over_many_steps() -> None:
    """Deferred entries and the gradients' device copies are replaced, not accumulated."""
    from torch_adreno.runtime import get_residency, get_runtime

    model, opt, _, _ = _setup()
    residency = get_residency(get_runtime(), False)
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    batches = _batches(2)
    sizes = []
    for i in range(30):
        step(*batches[i % 2])
        if i in (5, 29):
            sizes.append((len(residency), residency.resident_bytes(), residency.deferred_tensors,
                          get_runtime().pool.allocated_bytes))
    assert sizes[0] == sizes[1], sizes
    step.close()
    assert residency.deferred_tensors == 0


@pytest.mark.parametrize("options", [COPY, {}], ids=["copies", "default"])
def test_batchnorm_statistics_are_deferred_and_synchronized(options) -> None:
    """The forward's own in-place updates (running statistics) follow the same sync points."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    with torch_adreno.TrainingStep(model, _loss, opt, options=options) as step:
        for _ in range(4):
            x, y = torch.randn(8, 3, 8, 8, generator=generator), torch.randint(0, 5, (8,), generator=generator)
            torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
        state = model.state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5)


def test_checkpoints_copies_and_loading_between_steps(tmp_path) -> None:
    model, opt, reference, reference_opt = _setup()
    batches = _batches(3)
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    step(*batches[0])
    _eager_step(reference, reference_opt, *batches[0])
    # A submodule's state_dict is a sync point too; whole-model pickles and deep copies work.
    torch.testing.assert_close(model[0].state_dict()["weight"], reference[0].weight.detach(), rtol=1e-4, atol=1e-5)
    torch.save(model, tmp_path / "model.pt")
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin[2].bias.detach(), reference[2].bias.detach(), rtol=1e-4, atol=1e-5)
    # Loading a checkpoint between steps: the next step starts from the loaded values.
    saved, saved_opt = copy.deepcopy(reference.state_dict()), copy.deepcopy(reference_opt.state_dict())
    step(*batches[1])
    model.load_state_dict(saved)
    opt.load_state_dict(saved_opt)
    torch.testing.assert_close(step(*batches[2]), _eager_step(reference, reference_opt, *batches[2]),
                               rtol=1e-4, atol=1e-5)
    step.close()


def test_what_a_step_cannot_keep_on_the_device_is_refused() -> None:
    model, _, _, _ = _setup()
    with pytest.raises(ValueError, match=r"not in it: 2\.bias"):
        torch_adreno.TrainingStep(model, _loss, torch.optim.SGD([model[0].weight, model[0].bias, model[2].weight],
                                                                lr=0.1), options=COPY)
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1), options=COPY)
    handle = model[0].weight.register_hook(lambda grad: grad)
    with pytest.raises(ValueError, match="hooks"):
        step(*_batches(1)[0])
    handle.remove()
    step.close()


def test_compiled_evaluation_between_steps_sees_and_keeps_current_values() -> None:
    """A copy-mode graph updating a deferred tensor (BatchNorm statistics in train mode) writes it
    back as usual: no false conflict at the next step or sync point."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 5))
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    evaluate = torch.compile(model, backend="adreno", options=COPY, dynamic=False)
    with torch_adreno.TrainingStep(model, _loss, opt, options=COPY) as step:
        for x, y in _batches(3):
            torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
            with torch.no_grad():
                torch.testing.assert_close(evaluate(x), reference(x), rtol=1e-4, atol=1e-5)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-4, atol=1e-5)


def test_inputs_updated_in_place_by_the_loss() -> None:
    """A batch the loss updates in place is uploaded and deferred in the same call: the NaN mark
    must not reach the device before the upload read the values."""
    model, opt, reference, reference_opt = _setup()

    def scaled_loss(m, x, y):
        return F.cross_entropy(m(x.mul_(0.5)), y)

    step = torch_adreno.TrainingStep(model, scaled_loss, opt, options=COPY)
    x, y = _batches(1)[0]
    ours, theirs = x.clone(), x.clone()  # the same tensors every step, halved each time
    for _ in range(4):
        loss = step(ours, y)
        reference_opt.zero_grad(set_to_none=True)
        expected = scaled_loss(reference, theirs, y)
        expected.backward()
        reference_opt.step()
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-4, atol=1e-5)
    step.close()
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("options", [COPY, {}], ids=["copies", "default"])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")], ids=["l2", "inf"])
def test_gradient_clipping_matches_eager_clip_between_backward_and_step(options, norm_type) -> None:
    """Gradients far above the norm (a large learning-rate-free loss scale) are clipped on the
    device as clip_grad_norm_ clips them between backward and step; only the batch and the loss
    cross in copy mode."""
    model, opt, reference, reference_opt = _setup("adam")
    step = torch_adreno.TrainingStep(model, lambda m, x, y: 50.0 * _loss(m, x, y), opt, options=options,
                                     max_grad_norm=0.5, norm_type=norm_type)
    for i, (x, y) in enumerate(_batches(4)):
        with torch_adreno.profile() as prof:
            loss = step(x, y)
        reference_opt.zero_grad(set_to_none=True)
        expected = 50.0 * _loss(reference, x, y)
        expected.backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5, norm_type)
        assert norm > 5.0  # the clip did something
        reference_opt.step()
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-4, atol=1e-4)
        assert any("training/gradients.py" in line for k in prof.kernels for line in k.source_lines)
        if options is COPY and i >= 2:
            minimum = x.numel() * x.element_size() + y.numel() * y.element_size() + loss.element_size()
            assert prof.bytes_host_to_device + prof.bytes_device_to_host <= 1.05 * minimum
    step.close()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)


def test_reading_gradients_after_a_step_says_where_they_went() -> None:
    model, opt, _, _ = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    x, y = _batches(1)[0]
    step(x, y)
    with pytest.raises(RuntimeError, match="max_grad_norm"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # silently 0 if .grad were None
    with pytest.raises(RuntimeError, match="TrainingStep"):
        model[0].weight.grad.norm()
    assert copy.deepcopy(model)[0].weight.grad is None
    assert model[0].weight.grad.shape == model[0].weight.shape  # metadata is fine
    opt.zero_grad(set_to_none=False)  # zeroing a marker does nothing
    assert isinstance(model[0].weight.grad, GradientOnDevice)
    step(x, y)
    opt.zero_grad()  # removes the markers, as it removes gradients
    assert all(p.grad is None for p in model.parameters())
    step(x, y)  # and the next step puts them back
    assert isinstance(model[0].weight.grad, GradientOnDevice)
    step.close()


def test_changing_batch_shapes_are_named_as_the_cause_of_a_recompile_limit() -> None:
    """Each new batch shape compiles the loss anew; at Dynamo's limit the error names the shapes
    seen and the fix, not optimizers or learning rates."""
    model, opt, _, _ = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    generator = torch.Generator().manual_seed(0)
    with torch._dynamo.config.patch(recompile_limit=2), \
            pytest.raises(RuntimeError, match=r"3 different shapes \(\(\[4, 12\], \[4\]\), .*drop_last=True") as info:
        for n in (4, 5, 6):
            step(torch.randn(n, 12, generator=generator), torch.randint(0, 5, (n,), generator=generator))
    assert "lr" not in str(info.value)
    step.close()


def test_recompile_limit_messages_follow_what_changed() -> None:
    from torch_adreno.training.state import batch_shapes, recompile_limit_message

    one = [batch_shapes((torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)))]
    changed = ["'nesterov' of parameter group 0: False -> True"]
    assert "'nesterov' of parameter group 0: False -> True" in recompile_limit_message("optimizer step", one, changed)
    assert "TORCH_LOGS=recompiles" in recompile_limit_message("optimizer step", one)
    assert "TORCH_LOGS=recompiles" in recompile_limit_message("loss", one)
    many = one + [batch_shapes((torch.zeros(n, 3), 1.0)) for n in range(5, 10)]
    message = recompile_limit_message("loss", many)
    assert "6 different shapes (([4, 3], [4]), ([5, 3], float)" in message and ", ...)" in message


def _assert_models_match(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        with torch._C.DisableTorchFunction():  # the values as stored, not made current by reading
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_the_first_read_of_an_out_of_date_host_copy_synchronizes(tmp_path) -> None:
    """Copy mode: every usual way of reading, copying or saving a model between steps gets the
    current values (no NaN mark, no stale elements past the first), each a sync point of its own."""
    import io

    from torch_adreno.training import host_sync

    model, opt, reference, reference_opt = _setup("adam")
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    residency = step._residency
    x, y = _batches(1)[0]
    reads = {
        "deepcopy": lambda: copy.deepcopy(model),
        "torch.save": lambda: torch.save(model, io.BytesIO()),
        "clone": lambda: model[0].weight.clone(),
        "slice past element 0": lambda: model[2].weight[1:, 2:],
        "numpy": lambda: model[0].bias.detach().numpy(),
        "eager forward": lambda: model(x),
        "list op": lambda: torch._foreach_norm(list(model.parameters())),
        "optimizer state": lambda: opt.state[model[0].weight]["exp_avg"].sum(),
    }
    for what, read in reads.items():
        step(x, y)
        _eager_step(reference, reference_opt, x, y)
        assert residency.deferred_tensors and host_sync.is_armed(residency), what
        weight = model[0].weight
        weight.shape, weight.data_ptr(), weight.is_contiguous(), weight.nbytes, weight.itemsize  # metadata: no sync
        assert residency.deferred_tensors, what
        with torch_adreno.profile() as prof:
            read()
        assert residency.deferred_tensors == 0 and prof.bytes_device_to_host > 0, what
        assert not host_sync.is_armed(residency), what
        _assert_models_match(model, reference)
    # What was read is right too.
    step(x, y)
    _eager_step(reference, reference_opt, x, y)
    twin = copy.deepcopy(model)
    _assert_models_match(twin, reference)
    torch.save(model, tmp_path / "model.pt")
    step(x, y)
    _eager_step(reference, reference_opt, x, y)
    torch.testing.assert_close(model[2].weight[1:, 2:], reference[2].weight[1:, 2:], rtol=1e-4, atol=1e-5)
    _assert_models_match(torch.load(tmp_path / "model.pt", weights_only=False), twin)
    step.close()
    assert not any(m is not None and type(m).__name__ == "SyncOnFirstTouch"
                   for m in torch.overrides._get_current_function_mode_stack())


def test_read_trap_stays_out_of_steps_user_modes_and_compiled_code() -> None:
    """The mode goes under the user's own modes (their exit pops theirs), is off the stack while a
    step runs (no Dynamo trace of it, no recompiles of the step), and a graph compiled between steps
    reads the device copies without synchronizing."""
    from torch.overrides import TorchFunctionMode

    from torch_adreno.training import host_sync

    class Counting(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    model, opt, reference, reference_opt = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    residency = step._residency
    evaluate = torch.compile(model, backend="adreno", options=COPY, dynamic=False)
    batches = _batches(4)
    for x, y in batches[:2]:
        torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(evaluate(x), reference(x), rtol=1e-4, atol=1e-5)
        assert residency.deferred_tensors and host_sync.is_armed(residency)  # read on the device: no sync
    opt.zero_grad()  # reads and clears .grad only: no synchronization
    assert residency.deferred_tensors and host_sync.is_armed(residency)
    user = Counting()
    with user:
        x, y = batches[2]
        step(x, y)
        _eager_step(reference, reference_opt, x, y)
        stack = torch.overrides._get_current_function_mode_stack()
        assert stack[-1] is user and host_sync.is_armed(residency)
        calls = Counting.calls
        twin = copy.deepcopy(model)
        assert Counting.calls > calls and residency.deferred_tensors == 0
    assert torch.overrides._get_current_function_mode_stack() == [] or not host_sync.is_armed(residency)
    _assert_models_match(twin, reference)
    x, y = batches[3]
    torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
    step.close()
    _assert_models_match(model, reference)


def test_zero_copy_graphs_between_copy_mode_steps_read_current_values() -> None:
    """A graph sharing host memory (zero-copy, PoCL's default) reads the host copies themselves:
    those a copy-mode step deferred are made current before it runs, every time."""
    from torch_adreno.runtime import get_runtime

    if not get_runtime().profile.unified_memory:
        pytest.skip("zero-copy needs unified memory")
    model, opt, reference, reference_opt = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    evaluate = torch.compile(model, backend="adreno", options={"zero_copy": True}, dynamic=False)
    for x, y in _batches(3):
        step(x, y)
        _eager_step(reference, reference_opt, x, y)
        with torch.no_grad(), torch._C.DisableTorchFunction():  # only the graph call can synchronize
            torch.testing.assert_close(evaluate(x), reference(x), rtol=1e-4, atol=1e-5)
        assert step._residency.deferred_tensors == 0
    step.close()


def test_the_read_trap_follows_the_thread_that_stepped() -> None:
    """The mode stack is per thread: a step run in a worker thread arms the trap there, and leaves
    the main thread's stack as it was."""
    import threading

    from torch_adreno.training import host_sync

    model, opt, reference, reference_opt = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    x, y = _batches(1)[0]
    seen: dict[str, object] = {}

    def worker() -> None:
        try:
            step(x, y)
            seen["armed"] = host_sync.is_armed(step._residency)
            seen["twin"] = copy.deepcopy(model)
            seen["deferred after read"] = step._residency.deferred_tensors
        except BaseException as err:  # reported by the assertions below
            seen["error"] = err

    before = torch.overrides._get_current_function_mode_stack()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert "error" not in seen, seen.get("error")
    _eager_step(reference, reference_opt, x, y)
    assert seen["armed"] and seen["deferred after read"] == 0
    assert torch.overrides._get_current_function_mode_stack() == before
    _assert_models_match(seen["twin"], reference)
    step(x, y)  # and back in this thread
    _eager_step(reference, reference_opt, x, y)
    twin = copy.deepcopy(model)
    _assert_models_match(twin, reference)
    step.close()


@pytest.mark.parametrize("norm_type", [0.5, 1.0, 2.0, 3.0, float("inf")])
def test_the_clip_function_is_clip_grad_norm(norm_type: float) -> None:
    """The arithmetic compiled into the step, run eagerly, against torch's clip_grad_norm_."""
    from torch_adreno.training.gradients import clip_function

    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(7, 5, generator=generator) * 4, torch.randn(3, generator=generator)]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    ours = [g.clone() for g in grads]
    clip_function(0.7, norm_type)(ours)
    torch.nn.utils.clip_grad_norm_(params, 0.7, norm_type)
    for mine, p in zip(ours, params, strict=True):
        torch.testing.assert_close(mine, p.grad, rtol=1e-5, atol=1e-6)


def test_bad_clipping_arguments_are_refused() -> None:
    model, opt, _, _ = _setup()
    for bad in ({"max_grad_norm": 0.0}, {"max_grad_norm": -1.0}, {"max_grad_norm": float("inf")},
                {"max_grad_norm": float("nan")}):
        with pytest.raises(ValueError, match="max_grad_norm must be a positive finite number"):
            torch_adreno.TrainingStep(model, _loss, opt, options=COPY, **bad)
    with pytest.raises(ValueError, match="norm_type must be positive"):
        torch_adreno.TrainingStep(model, _loss, opt, options=COPY, max_grad_norm=1.0, norm_type=0)
