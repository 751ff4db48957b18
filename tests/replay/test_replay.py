"""Whole-step capture and replay of TrainingStep: bit-identical to the compiled graphs, guarded.

Every test checks that replays actually ran (``profile().replayed_steps``), so a replay that
silently fell back to the full path would fail them.
"""

from __future__ import annotations

import copy
import itertools
import pickle

import pytest
import torch
import torch.nn.functional as F
from helpers import cross_entropy_loss as _loss
from helpers import eager_training_step as _eager_step

import torch_adreno
from torch_adreno.models import MODELS
from torch_adreno.replay.memory import plan_step_memory

pytestmark = pytest.mark.device

COPY = {"zero_copy": False}
MODES = [pytest.param({}, id="default"), pytest.param(COPY, id="copy")]



def _mlp(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(32, 5))


def _batches(n: int, batch: int = 16):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 12, generator=generator), torch.randint(0, 5, (batch,), generator=generator))
            for _ in range(n)]



def _train(make_model, make_opt, batches, replay: bool, options=None, seed: int = 0):
    model = make_model()
    opt = make_opt(model.parameters())
    step = torch_adreno.TrainingStep(model, _loss, opt, options=options, replay=replay)
    torch.manual_seed(seed)
    with torch_adreno.profile() as prof:
        losses = [step(x, y) for x, y in batches]
    step.synchronize()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return torch.stack(losses), state, prof, step


def _assert_bit_identical(a, b) -> None:
    assert torch.equal(a[0], b[0]), (a[0], b[0])
    assert a[1].keys() == b[1].keys()
    for key in a[1]:
        assert torch.equal(a[1][key], b[1][key]), key


@pytest.mark.parametrize("options", MODES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_replay_is_bit_identical_to_the_compiled_graphs(options, optimizer) -> None:
    def make_opt(params):
        if optimizer == "adam":
            return torch.optim.Adam(params, lr=0.01)
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)

    batches = _batches(8)
    full = _train(_mlp, make_opt, batches, replay=False, options=options)
    replayed = _train(_mlp, make_opt, batches, replay=True, options=options)
    assert [s.kind for s in replayed[2].steps] == ["full", "capture"] + ["replay"] * 6
    assert full[2].replayed_steps == 0
    _assert_bit_identical(full, replayed)


def _reference_model_losses(name: str, steps: int, replay: bool, options=None):
    spec = MODELS[name]
    generator = torch.Generator().manual_seed(1)
    batches = [spec.batch(generator) for _ in range(steps)]

    def make():
        torch.manual_seed(0)
        return spec.make()

    return _train(make, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches, replay, options)


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_reference_models_replay_bit_identically(name) -> None:
    full = _reference_model_losses(name, 5, replay=False)
    replayed = _reference_model_losses(name, 5, replay=True)
    assert replayed[2].replayed_steps == 3
    _assert_bit_identical(full, replayed)


@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet_mini", "transformer"])
def test_memory_reuse_changes_no_bit_of_a_replayed_reference_model(name) -> None:
    """Reuse decides where values live, never what is computed: the replayed steps with
    and without it give the same losses and parameters, bit for bit."""
    steps = 5 if name in ("mlp", "lenet") else 3
    reused = _reference_model_losses(name, steps, replay=True)
    alone = _reference_model_losses(name, steps, replay=True, options={"memory_reuse": False})
    assert reused[2].replayed_steps == alone[2].replayed_steps == steps - 2
    _assert_bit_identical(reused, alone)


@pytest.mark.slow
@pytest.mark.parametrize("options", MODES)
@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet_mini", "transformer"])
def test_reference_models_replay_bit_identically_over_50_steps(name, options) -> None:
    steps = 50 if name in ("mlp", "lenet") else 12
    full = _reference_model_losses(name, steps, replay=False, options=options)
    replayed = _reference_model_losses(name, steps, replay=True, options=options)
    assert replayed[2].replayed_steps == steps - 2
    _assert_bit_identical(full, replayed)


def test_dropout_masks_change_every_replay_and_match_the_compiled_graphs() -> None:
    (x, y), = _batches(1)
    batches = [(x, y)] * 6

    def make_opt(params):
        return torch.optim.SGD(params, lr=0.0)

    full = _train(lambda: _mlp(0.5), make_opt, batches, replay=False, seed=7)
    replayed = _train(lambda: _mlp(0.5), make_opt, batches, replay=True, seed=7)
    assert replayed[2].replayed_steps == 4
    assert torch.equal(full[0], replayed[0])
    # lr 0 and one batch: only the dropout masks differ from step to step.
    assert len(set(replayed[0].tolist())) == 6
    again = _train(lambda: _mlp(0.5), make_opt, batches, replay=True, seed=8)
    assert not torch.equal(again[0], replayed[0])


class _Lockstep:
    """A TrainingStep and eager PyTorch trained side by side on the same batches."""

    def __init__(self, options=None, lr=0.1, tensor_lr=False) -> None:
        self.model = _mlp()
        self.reference = copy.deepcopy(self.model)
        lr_value = torch.tensor(lr) if tensor_lr else lr
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr_value, momentum=0.9)
        self.reference_opt = torch.optim.SGD(self.reference.parameters(), lr=lr, momentum=0.9)
        self.step = torch_adreno.TrainingStep(self.model, _loss, self.opt, options=options)
        self.batches = iter(_batches(40))

    def run(self, n: int, batch=None) -> torch_adreno.profile:
        with torch_adreno.profile() as prof:
            for _ in range(n):
                x, y = batch if batch is not None else next(self.batches)
                loss = self.step(x, y)
                expected = _eager_step(self.reference, self.reference_opt, x, y)
                torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
        return prof

    def check_parameters(self) -> None:
        self.step.synchronize()
        for p, q in zip(self.model.parameters(), self.reference.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def _assert_guard_fell_back(prof, words: str) -> None:
    assert any(words in reason for reason in prof.replay_fallbacks), prof.replay_fallbacks
    assert prof.step_captures == 1, [s.kind for s in prof.steps]


@pytest.mark.parametrize("options", MODES)
def test_guard_new_hyperparameters(options) -> None:
    """A new momentum is an input of the replay, uploaded; a setting compiled into the step
    (``nesterov``) is a new capture."""
    run = _Lockstep(options)
    assert run.run(4).replayed_steps == 2
    for opt in (run.opt, run.reference_opt):
        opt.param_groups[0]["momentum"] = 0.5
    prof = run.run(4)
    assert prof.replayed_steps == 4 and not prof.replay_fallbacks, prof.replay_fallbacks
    run.check_parameters()
    for opt in (run.opt, run.reference_opt):
        opt.param_groups[0]["nesterov"] = True
    prof = run.run(4)
    _assert_guard_fell_back(prof, "hyperparameter 'nesterov' of group 0 changed")
    assert prof.replayed_steps == 3
    run.check_parameters()


@pytest.mark.parametrize("options", MODES)
def test_a_new_learning_rate_is_uploaded_not_captured_again(options) -> None:
    run = _Lockstep(options)
    assert run.run(4).replayed_steps == 2
    for lr in (0.02, 0.005, 0.04):
        for opt in (run.opt, run.reference_opt):
            opt.param_groups[0]["lr"] = lr
        prof = run.run(2)
        assert prof.replayed_steps == 2 and not prof.replay_fallbacks, prof.replay_fallbacks
        run.check_parameters()


@pytest.mark.parametrize("options", MODES)
def test_guard_tensor_learning_rate_set_by_a_scheduler(options) -> None:
    run = _Lockstep(options, tensor_lr=True)
    scheduler = torch.optim.lr_scheduler.StepLR(run.opt, step_size=1, gamma=0.5)
    reference_scheduler = torch.optim.lr_scheduler.StepLR(run.reference_opt, step_size=1, gamma=0.5)
    run.run(3)
    for _ in range(3):
        scheduler.step()
        reference_scheduler.step()
        prof = run.run(3)
        # The new rate is written into the tensor and uploaded by the replay: never stale, never captured again.
        assert prof.replayed_steps == 3 and not prof.replay_fallbacks, prof.replay_fallbacks
        run.check_parameters()


@pytest.mark.parametrize("options", MODES)
def test_guard_train_and_eval_mode(options) -> None:
    run = _Lockstep(options)
    run.run(3)
    run.model.eval()
    run.reference.eval()
    prof = run.run(3)
    _assert_guard_fell_back(prof, "train/eval mode of the model changed")
    run.model.train()
    run.reference.train()
    _assert_guard_fell_back(run.run(3), "train/eval mode")
    run.check_parameters()


def test_guard_batch_geometry() -> None:
    run = _Lockstep()
    run.run(3)
    _, y = next(run.batches)
    strided = torch.randn(12, 16).t()  # the same shape, other strides
    prof = run.run(1, (strided, y))
    assert prof.replayed_steps == 0 and not prof.step_captures
    # The strided step changed the parameters through the compiled graphs: the contiguous geometry's
    # replay expects the versions the step's own writes gave (the device holds those values) and
    # replays on, with the losses of eager (run() compares each).
    assert [s.kind for s in run.run(2).steps] == ["replay", "replay"]
    smaller = _batches(3, batch=8)
    with torch_adreno.profile() as prof:
        for xs, ys in smaller:
            loss = run.step(xs, ys)
            torch.testing.assert_close(loss, _eager_step(run.reference, run.reference_opt, xs, ys),
                                       rtol=1e-4, atol=1e-5)
    assert [s.kind for s in prof.steps] == ["full", "capture", "replay"]
    run.check_parameters()


def test_guard_grad_mode() -> None:
    run = _Lockstep()
    run.run(3)
    x, y = next(run.batches)
    with torch.no_grad(), pytest.raises(RuntimeError, match="does not require grad"):
        run.step(x, y)  # as the compiled graphs fail: no replay trains without grad mode


@pytest.mark.parametrize("options", MODES)
def test_guard_state_loaded_or_replaced(options) -> None:
    run = _Lockstep(options)
    run.run(3)
    snapshot = copy.deepcopy(run.reference.state_dict())
    optimizer_snapshot = copy.deepcopy(run.reference_opt.state_dict())
    run.run(2)
    run.model.load_state_dict(snapshot)
    run.reference.load_state_dict(snapshot)
    prof = run.run(3)
    _assert_guard_fell_back(prof, "was changed on the host")
    # Loading the optimizer's state gives it new state tensors: replays must not update the old ones.
    run.opt.load_state_dict(copy.deepcopy(optimizer_snapshot))  # each its own tensors
    run.reference_opt.load_state_dict(optimizer_snapshot)
    prof = run.run(3)
    _assert_guard_fell_back(prof, "was replaced")
    run.check_parameters()


def _guard_as_a_call_sees_it(run: _Lockstep):
    """The replay's guard, run with the groups as a call holds them (hyperparameters as inputs)."""
    (_, guard), = run.step._replays.values()

    def check(batch):
        with run.step._hyperparameters.applied():
            return guard(batch)

    return check


def test_guard_replaced_submodule() -> None:
    run = _Lockstep()
    run.run(3)
    guard = _guard_as_a_call_sees_it(run)
    x, y = next(run.batches)
    assert guard((x, y)) is None
    run.model[3] = torch.nn.Linear(32, 5)
    assert guard((x, y)) == "submodule 3 was replaced"


@pytest.mark.parametrize("options", MODES)
def test_guard_host_edit_through_torch(options) -> None:
    # In copy mode the edit first brings the host copy up to date (host_sync), then applies.
    run = _Lockstep(options)
    run.run(3)
    with torch.no_grad():
        run.model[0].weight.add_(1.0)
        run.reference[0].weight.add_(1.0)
    _assert_guard_fell_back(run.run(3), "0.weight was changed on the host")
    run.check_parameters()


def test_clipped_steps_replay_like_eager() -> None:
    run = _Lockstep(COPY)
    run.step = torch_adreno.TrainingStep(run.model, _loss, run.opt, options=COPY, max_grad_norm=0.05)
    with torch_adreno.profile() as prof:
        for x, y in _batches(5):
            loss = run.step(x, y)
            run.reference_opt.zero_grad(set_to_none=True)
            expected = _loss(run.reference, x, y)
            expected.backward()
            torch.nn.utils.clip_grad_norm_(run.reference.parameters(), 0.05)
            run.reference_opt.step()
            torch.testing.assert_close(loss, expected.detach(), rtol=1e-4, atol=1e-5)
    assert prof.replayed_steps == 3
    run.check_parameters()


def test_replays_keep_host_copies_right_at_every_sync_point() -> None:
    run = _Lockstep(COPY)
    run.run(4)
    run.check_parameters()  # synchronize after replays
    assert run.run(3).replayed_steps == 3  # and replays go on after it
    state = run.model.state_dict()  # a sync point through the hook
    for key, value in run.reference.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=1e-4, atol=1e-5)
    assert run.run(2).replayed_steps == 2
    # A torch read between sync points brings the host copies up to date (host_sync), also after replays.
    torch.testing.assert_close(run.model[0].weight.clone(), run.reference[0].weight, rtol=1e-4, atol=1e-5)
    assert run.run(2).replayed_steps == 2
    run.check_parameters()


def test_optimizer_step_hooks_are_not_replayed() -> None:
    run = _Lockstep()
    calls = []
    run.opt.register_step_post_hook(lambda *args: calls.append(1))
    prof = run.run(4)
    assert prof.replayed_steps == 0
    assert any("step hooks" in reason for reason in prof.replay_fallbacks)


def test_host_fallback_graphs_are_not_replayed() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(12, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, x, y):
        return F.cross_entropy(torch.special.i0(m(x)), y)  # i0: an op without a lowering

    step = torch_adreno.TrainingStep(model, loss_fn, opt, options={"fallback": "host"})
    with pytest.warns(UserWarning), torch_adreno.profile() as prof:
        for x, y in _batches(3):
            step(x, y)
    assert prof.replayed_steps == 0
    assert any("on the host" in reason for reason in prof.replay_fallbacks)


def test_profile_of_replayed_steps() -> None:
    run = _Lockstep()
    run.run(2)
    with torch_adreno.profile() as prof:
        for x, y in _batches(3):
            run.step(x, y)
    replay = run.step.replay
    assert prof.replayed_steps == 3
    assert prof.kernel_launches == 3 * replay.kernel_launches
    assert all(k.device_time_us is not None and k.device_time_us >= 0 for k in prof.kernels)
    assert prof.host_time_per_replayed_step_us is not None and prof.host_time_per_replayed_step_us > 0
    assert prof.transfer_bytes("d2h", "output", copied=None) == 3 * 4  # the loss, and nothing else


def test_step_memory_plan_shares_only_disjoint_lifetimes() -> None:
    run = _Lockstep()
    run.run(3)
    memory = run.step.replay.memory
    by_slot: dict[int, list[tuple[int, int]]] = {}
    for identity, slot in memory.slot_of.items():
        by_slot.setdefault(slot, []).append(memory.lifetimes[identity])
    for spans in by_slot.values():
        spans.sort()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans
    assert memory.planned_bytes < memory.unshared_bytes
    assert len(memory.slot_bytes) < len(memory.slot_of)


def test_plan_step_memory_packs_by_lifetime() -> None:
    from torch_adreno.replay.capture import INTERNAL, MemoryIdentity, RecordedLaunch, StepRecorder

    recorder = StepRecorder.__new__(StepRecorder)
    recorder.identities = [MemoryIdentity(i, INTERNAL, n, None, f"b{i}") for i, n in enumerate([400, 100, 300, 50])]
    launch = lambda *args: RecordedLaunch("g", None, None, args)  # noqa: E731
    # b0 dies at op 1 and b2 (born at op 2) takes its place; b3, the loss, lives to the end.
    recorder.operations = [launch(0, 1), launch(0, 1), launch(2, 1), launch(2, 3)]
    plan = plan_step_memory(recorder, keep_to_end={3})
    assert plan.slot_of[0] == plan.slot_of[2]
    assert plan.slot_of[1] == plan.slot_of[3]  # b1's last use (op 2) is before the loss is born
    assert plan.slot_of[0] != plan.slot_of[1]
    assert plan.planned_bytes == 400 + 100
    assert plan.lifetimes[3] == (3, 4)


def test_the_step_verifier_accepts_the_planned_layout_and_rejects_one_sharing_live_bytes() -> None:
    """The whole-step layout is proven against the recorded reads and writes."""
    from types import SimpleNamespace

    from torch_adreno.memory.verify import MemoryPlanError
    from torch_adreno.replay.capture import INTERNAL, MemoryIdentity, RecordedLaunch, StepRecorder
    from torch_adreno.replay.memory import ArenaLayout, verify_step_memory

    recorder = StepRecorder.__new__(StepRecorder)
    recorder.identities = [MemoryIdentity(i, INTERNAL, 256, None, f"b{i}") for i in range(3)]

    def launch(reads, writes):
        names = [f"p{i}" for i in (*reads, *writes)]
        source = SimpleNamespace(name=f"k{len(recorder.operations)}", params=tuple(names),
                                 reads=tuple(f"p{i}" for i in reads), writes=tuple(f"p{i}" for i in writes))
        return RecordedLaunch("g", None, source, (*reads, *writes))

    recorder.operations = []
    for reads, writes in [((), (0,)), ((0,), (1,)), ((1,), (2,))]:  # b0 -> b1 -> b2, b2 the loss
        recorder.operations.append(launch(reads, writes))
    plan = plan_step_memory(recorder, keep_to_end={2})
    verify_step_memory(recorder, ArenaLayout.of(recorder, plan, False, 256), {2})
    overlapping = ArenaLayout({0: 0, 1: 0, 2: 256}, 512, 256)  # b1 written over b0 while b0 is read
    with pytest.raises(MemoryPlanError, match=r"k1 writes 1 into the replay's arena .* over 0"):
        verify_step_memory(recorder, overlapping, {2})


def test_replay_can_be_turned_off_and_steps_pickle_their_models() -> None:
    run = _Lockstep()
    run.step = torch_adreno.TrainingStep(run.model, _loss, run.opt, replay=False)
    assert run.run(4).replayed_steps == 0
    pickle.dumps(run.model)


def test_two_steps_interleaved_keep_their_buffers_alive() -> None:
    """Two TrainingSteps on one device share the residency, whose table of transient entries churns
    between their calls: a replay's kernels must keep every buffer they point at alive (a released
    one crashed the process at the next enqueue)."""
    def deep() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(12):
            layers += [torch.nn.Linear(12, 12), torch.nn.Tanh()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(12, 5))

    runs = []
    for replay in (False, True):
        model = deep()
        reference = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        reference_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
        runs.append((torch_adreno.TrainingStep(model, _loss, opt, replay=replay), reference, reference_opt))
    with torch_adreno.profile() as prof:
        for x, y in _batches(6):
            for step, reference, reference_opt in runs:
                torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y),
                                           rtol=1e-4, atol=1e-5)
    assert prof.replayed_steps == 4


def test_batch_is_bound_in_place_on_unified_memory_and_uploaded_in_copy_mode() -> None:
    from torch_adreno.replay.batch import BatchMode

    batches = _batches(5)
    for options, mode in (({}, BatchMode.IN_PLACE), (COPY, BatchMode.UPLOADED)):
        _, _, prof, step = _train(_mlp, lambda p: torch.optim.SGD(p, lr=0.1), batches, replay=True,
                                       options=options)
        assert prof.replayed_steps == 3
        if not step.replay.runtime.profile.unified_memory:
            pytest.skip("a device with memory of its own stages the batch")
        assert step.replay.batch_mode == mode
        batch_bytes = sum(x.nbytes + y.nbytes for x, y in batches[2:])
        with torch_adreno.profile() as replayed:
            step(*batches[0])
        copied = replayed.transfer_bytes("h2d", "input", copied=True)
        shared = replayed.transfer_bytes("h2d", "input", copied=False)
        per_step = batch_bytes // 3
        assert (copied, shared) == ((0, per_step) if mode is BatchMode.IN_PLACE else (per_step, 0))
        step.close()


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-seeds", "dropout-seeds"])
def test_staged_batch_upload_is_bit_identical(monkeypatch, dropout) -> None:
    """Pinned staging is what a device with memory of its own uses; forced here on PoCL. The batch
    and the dropout seeds go up in one write from one pinned buffer."""
    from torch_adreno.replay import step as replay_module

    monkeypatch.setattr(replay_module, "step_batch_mode", lambda *_: replay_module.BatchMode.STAGED)
    batches = _batches(8)
    opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    full = _train(lambda: _mlp(dropout), opt, batches, replay=False, options=COPY, seed=3)
    staged = _train(lambda: _mlp(dropout), opt, batches, replay=True, options=COPY, seed=3)
    replay = staged[3].replay
    assert replay.batch_mode is replay_module.BatchMode.STAGED and replay.batch_input.staging_buffers == 1
    assert replay.batch_input.staged_seeds == (1 if dropout else 0)
    assert staged[3].replayed_steps == 6
    _assert_bit_identical(full, staged)


def _counting_copies(monkeypatch) -> list[int]:
    """Stage every staged batch ahead of its guard (no size threshold) on a pool that records the
    bytes of each copy it is given."""
    from concurrent.futures import ThreadPoolExecutor

    from torch_adreno.replay import batch as batch_module

    copies: list[int] = []
    pool = ThreadPoolExecutor(2)

    class Counting:
        def submit(self, fn, started, pieces):
            copies.extend(source.size for _, source in pieces)
            return pool.submit(fn, started, pieces)

    monkeypatch.setattr(batch_module, "PRESTAGE_BYTES", 0)
    monkeypatch.setattr(batch_module, "COPY_THREADS", 2)  # (the host's cores decide it otherwise)
    monkeypatch.setattr(batch_module, "_copy_pool", lambda: Counting())
    return copies


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-seeds", "dropout-seeds"])
def test_a_staged_batch_is_copied_while_the_guard_runs_and_stays_bit_identical(monkeypatch, dropout) -> None:
    from torch_adreno.replay import step as replay_module

    monkeypatch.setattr(replay_module, "step_batch_mode", lambda *_: replay_module.BatchMode.STAGED)
    copies = _counting_copies(monkeypatch)
    batches = _batches(8)
    opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    full = _train(lambda: _mlp(dropout), opt, batches, replay=False, options=COPY, seed=3)
    staged = _train(lambda: _mlp(dropout), opt, batches, replay=True, options=COPY, seed=3)
    assert staged[3].replayed_steps == 6
    # Each replayed step's two batch tensors, each copied in COPY_THREADS pieces by the workers.
    x_bytes, y_bytes = batches[0][0].numel() * 4, batches[0][1].numel() * 8
    assert sorted(set(copies)) == sorted({x_bytes // 2, y_bytes // 2}) and len(copies) == 6 * 4
    _assert_bit_identical(full, staged)


def test_a_prestaged_batch_is_being_copied_before_the_guard_starts(monkeypatch) -> None:
    """The workers need Python's lock to start copying, and the guard holds it while it runs:
    prestage returns only once every worker has started, so that the copies run beside the guard
    (else they began only after it)."""
    import time

    from torch_adreno.replay import batch as batch_module
    from torch_adreno.replay import guards
    from torch_adreno.replay import step as replay_module

    monkeypatch.setattr(replay_module, "step_batch_mode", lambda *_: replay_module.BatchMode.STAGED)
    _counting_copies(monkeypatch)
    copy_started: list[float] = []
    guard_started: list[float] = []
    copy_pieces, build_guard = batch_module._copy_pieces, guards.build_guard

    def recording_copy(started, pieces):
        copy_started.append(time.perf_counter())
        copy_pieces(started, pieces)

    def recording_guard(*args, **kwargs):
        guard = build_guard(*args, **kwargs)

        def timed(batch):
            guard_started.append(time.perf_counter())
            return guard(batch)
        return timed

    monkeypatch.setattr(batch_module, "_copy_pieces", recording_copy)
    monkeypatch.setattr(guards, "build_guard", recording_guard)
    *_, step = _train(_mlp, lambda p: torch.optim.SGD(p, lr=0.1), _batches(5), replay=True, options=COPY)
    assert step.replayed_steps == 3 and len(guard_started) == 3 and len(copy_started) == 3 * 2
    for replay_index, guard_at in enumerate(guard_started):
        assert all(at < guard_at for at in copy_started[2 * replay_index:2 * replay_index + 2])


def test_a_prestaged_batch_whose_guard_fails_runs_the_full_step(monkeypatch) -> None:
    from torch_adreno.replay import step as replay_module

    monkeypatch.setattr(replay_module, "step_batch_mode", lambda *_: replay_module.BatchMode.STAGED)
    copies = _counting_copies(monkeypatch)
    run = _Lockstep(COPY)
    assert run.run(4).replayed_steps == 2
    for opt in (run.opt, run.reference_opt):
        opt.param_groups[0]["nesterov"] = True  # compiled in: the guard fails
    prof = run.run(4)
    _assert_guard_fell_back(prof, "hyperparameter 'nesterov' of group 0 changed")
    assert prof.replayed_steps == 3 and len(copies) == (2 + 1 + 3) * 4  # the failed guard's batch was staged too
    run.check_parameters()


@pytest.mark.parametrize("options", MODES)
def test_fresh_batch_tensors_every_step_with_dropout_and_two_steps(options) -> None:
    """Each step gets new batch tensors (the allocator hands their addresses out again), random
    seeds are drawn, and two TrainingSteps interleave: bound in place, every step must read its
    own batch (a buffer over freed or reused memory would show as a different loss)."""
    def make(p: float):
        return _mlp(p)

    results = []
    for replay in (False, True):
        torch._dynamo.reset()
        models = [make(0.3), make(0.0)]
        steps = [torch_adreno.TrainingStep(m, _loss, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                           options=options, replay=replay) for m in models]
        torch.manual_seed(3)
        generator = torch.Generator().manual_seed(3)
        losses = []
        with torch_adreno.profile() as prof:
            for _ in range(12):
                for step in steps:
                    x, y = torch.randn(16, 12, generator=generator), torch.randint(0, 5, (16,), generator=generator)
                    losses.append(step(x.clone(), y.clone()))
        for step in steps:
            step.synchronize()
        results.append((torch.stack(losses), {str(i): p.detach().clone()
                                              for i, p in enumerate(p for m in models for p in m.parameters())}))
        assert prof.replayed_steps == (20 if replay else 0)
    _assert_bit_identical(results[0], results[1])


def test_guard_optimizer_step_hook_added_after_capture() -> None:
    run = _Lockstep()
    assert run.run(3).replayed_steps == 1  # replaying before the hook
    calls = []
    run.opt.register_step_post_hook(lambda *args: calls.append(1))
    prof = run.run(3)
    assert calls == [1, 1, 1]  # a replay would have skipped it
    assert prof.replayed_steps == 0
    assert any("step hook" in reason for reason in prof.replay_fallbacks), prof.replay_fallbacks
    run.check_parameters()


def test_guard_backward_hook_and_optimizer_state_replaced() -> None:
    run = _Lockstep()
    run.run(3)
    guard = _guard_as_a_call_sees_it(run)
    x, y = next(run.batches)
    assert guard((x, y)) is None
    handle = run.model[0].register_full_backward_hook(lambda *args: None)
    assert guard((x, y)) == "a hook of 0 was added or removed"
    handle.remove()
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    hooks[-1] = lambda *args: None
    try:
        assert guard((x, y)) == "a global module hook was added or removed"
    finally:
        del hooks[-1]
    assert guard((x, y)) is None
    param = run.model[0].weight
    # An entry replaced by one of the same keys and an equal value: only its identity tells.
    run.opt.state[param] = {k: v.clone() for k, v in run.opt.state[param].items()}
    assert guard((x, y)) is not None and "optimizer state" in guard((x, y))


def test_replayed_steps_leave_host_syncs_mode_in_place(monkeypatch) -> None:
    """A replay runs with torch functions disabled: host_sync's mode, armed after a step that left
    host copies out of date, is not taken off the stack and put back at every replayed step (each
    time a rebuild of the whole stack), and stays armed for the host's next read."""
    from torch_adreno.training import host_sync

    model = _mlp()
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     options=COPY)
    batches = _batches(6)
    for x, y in batches[:3]:  # compile, capture, first replay (arms the mode)
        step(x, y)
    assert step.replayed_steps == 1 and host_sync.is_armed(step._residency)
    rebuilds = []
    original = host_sync._set_stack
    monkeypatch.setattr(host_sync, "_set_stack", lambda modes: rebuilds.append(modes) or original(modes))
    for x, y in batches[3:]:
        step(x, y)
    assert step.replayed_steps == 4
    assert rebuilds == [] and host_sync.is_armed(step._residency)
    assert step._residency.has_deferred
    weight = model[0].weight.detach().clone()  # a host read: synchronizes first (the mode at work)
    assert not step._residency.has_deferred and torch.isfinite(weight).all()
    step.close()


def _train_unprofiled(batches, replay: bool):
    """As _train, without profile(): a profiled replay enqueues from Python (its events time each
    launch), so only an unprofiled one runs the list through the C loop."""
    model = _mlp()
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     replay=replay)
    losses = torch.stack([step(x, y) for x, y in batches])
    step.synchronize()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, step


def test_replay_through_the_c_loop_is_bit_identical_to_the_compiled_graphs() -> None:
    from torch_adreno.replay import launch_list

    if launch_list.native_loop() is None:
        pytest.fail(f"the C loop is not available here: {launch_list.native_loop_status()}")
    batches = _batches(6)
    full = _train_unprofiled(batches, replay=False)
    replayed = _train_unprofiled(batches, replay=True)
    assert replayed[2].replayed_steps == 4
    assert replayed[2].replay is not None and replayed[2].replay._operations.native
    _assert_bit_identical(full[:2], replayed[:2])
