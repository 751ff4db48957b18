"""``fill_uninitialized_memory``: memory a compiled graph or a replayed step makes is filled before
its first write, so that a read of memory nothing wrote shows as NaN.

The CPU runtimes hand out fresh buffers zeroed and a reused slot holds earlier values, so such a
read is invisible without the option. Planted reads (a producer launched over half its output) are
NaN with it and plausible without it, in a compiled graph, in a replayed step and in the
torch-free runner; correct steps give the same bits either way (the reference models through
TrainingStep with replay on; the native runtime's run: test_native_step.py).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from helpers import capture_graphs
from helpers import cross_entropy_loss as _loss
from native_fixtures import partial_write_step

import torch_adreno
from torch_adreno.config import OPTIONS, Config
from torch_adreno.fusion import fuse
from torch_adreno.kernels import render_program
from torch_adreno.kernels.fills import FillRegion, fill_schedule
from torch_adreno.kernels.verify import verify_program
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import StorageKind, plan_memory
from torch_adreno.models import MODELS
from torch_adreno.replay.capture import INTERNAL, StepRecorder
from torch_adreno.replay.launch_list import Fill
from torch_adreno.replay.step import ReplayedStep, ReplayOptions
from torch_adreno.runner import StepRunner, UnsupportedStepFile, choose_device
from torch_adreno.runner import format as fmt

FILL = {"fill_uninitialized_memory": True}
COPY = {"zero_copy": False}


# -- the pattern and the option ------------------------------------------------------------------

def test_the_pattern_is_nan_for_every_float_dtype_and_out_of_range_for_every_integer_one() -> None:
    memory = torch.frombuffer(bytearray(fmt.FILL_PATTERN * 8), dtype=torch.uint8)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert torch.isnan(memory.view(dtype)).all(), dtype
    for dtype in (torch.int32, torch.int64):
        # Far past any dimension, and positive: an index check rejects it whether or not the op
        # wraps negative indices (where -1 would be the last element).
        assert (memory.view(dtype) >= 2**30).all(), dtype
    assert not ((memory == 0) | (memory == 1)).any()  # neither False nor True as a bool byte
    # An odd byte count ends in the pattern's first byte: the same bytes wherever a region ends.
    assert fmt.fill_commands(256, 7) == [(256, 6, fmt.FILL_PATTERN), (262, 1, fmt.FILL_PATTERN[:1])]
    assert fmt.fill_commands(0, 0) == []
    with pytest.raises(ValueError, match="even byte offset"):
        fmt.fill_commands(3, 4)


def test_the_option_defaults_off_and_reads_its_environment_variable() -> None:
    spec = OPTIONS["fill_uninitialized_memory"]
    assert spec.env == fmt.FILL_VARIABLE and spec.default is False
    assert Config.from_options(environ={}).fill_uninitialized_memory is False
    assert Config.from_options(environ={fmt.FILL_VARIABLE: "1"}).fill_uninitialized_memory is True
    assert Config.from_options(FILL, environ={fmt.FILL_VARIABLE: "0"}).fill_uninitialized_memory is True
    with pytest.raises(torch_adreno.OptionError, match=fmt.FILL_VARIABLE):
        Config.from_options(environ={fmt.FILL_VARIABLE: "maybe"})
    assert fmt.fill_requested({fmt.FILL_VARIABLE: "on"}) and not fmt.fill_requested({})
    with pytest.raises(ValueError, match="must be 1 or 0"):
        fmt.fill_requested({fmt.FILL_VARIABLE: "2"})


# -- a compiled graph ----------------------------------------------------------------------------

def _slot_reusing(x: torch.Tensor) -> torch.Tensor:
    """sigmoid(x) (buf0), its row sums, x times them (buf4: buf0's slot, buf0 read for the last time),
    column sums: without fusion a graph whose one arena slot holds two buffers in turn."""
    return ((x * x.sigmoid().sum(1, keepdim=True)).sum(0) / 64).tanh()


def _program(runtime):
    gm = capture_graphs(_slot_reusing, torch.randn(64, 64))[0]
    config = Config(fusion=False)
    fused = fuse(lower_graph(gm, config, "fill_0", 1), config)
    return render_program(fused, plan_memory(fused, runtime.profile), runtime.profile)


def _half_launched(program, kernel: str):
    """``program`` with launch ``kernel`` over the first half of its work-items: half of what it
    writes is never written (what a miscompiled launch geometry does)."""
    steps = [dataclasses.replace(s, global_size=(s.global_size[0] // 2,)) if kernel in s.name else s
             for s in program.steps]
    assert steps != program.steps
    return dataclasses.replace(program, steps=steps)


@pytest.fixture(scope="module")
def runtime():
    from torch_adreno.runtime import get_runtime

    return get_runtime(None)


@pytest.mark.device
def test_a_slot_is_filled_again_for_each_buffer_it_holds_within_a_call(runtime) -> None:
    program = _program(runtime)
    schedule = fill_schedule(program)
    plan = program.plan
    regions = [(index, region) for index, step in enumerate(schedule) for region in step]
    reused = [(i, r.buffer) for i, r in regions if plan.allocations[r.buffer].kind is StorageKind.ARENA
              and plan.allocations[r.buffer].arena == plan.allocations["buf0"].arena]
    # buf0 before the sigmoid that writes it, buf4 (same slot) before the product that writes it.
    assert [name for _, name in reused] == ["buf0", "buf4"] and reused[0][0] < reused[1][0]
    writer = {name: i for i, step in enumerate(program.steps) for name in step.writes}
    assert all(index == writer[region.buffer] for index, region in regions)
    assert FillRegion("buf4", 0, 64 * 64 * 4) in schedule[writer["buf4"]]
    verify_program(program, fills=True)  # no fill over a value still to be read


@pytest.mark.device
def test_a_partial_write_reads_nan_with_fills_and_stale_values_without(runtime) -> None:
    from torch_adreno.runtime import Executable, get_residency

    x = torch.randn(64, 64)
    program = _program(runtime)
    correct = [Executable(program, runtime, get_residency(runtime), fill_uninitialized_memory=fill)([x])[0]
               for fill in (False, True)]
    assert torch.equal(correct[0], correct[1])  # filling changes no bit of a correct graph
    torch.testing.assert_close(correct[0], _slot_reusing(x))
    broken = _half_launched(program, "pw_mul")  # rows 32-63 of buf4 never written
    stale = Executable(broken, runtime, get_residency(runtime))([x])[0]
    filled = Executable(broken, runtime, get_residency(runtime), fill_uninitialized_memory=True)([x])[0]
    # Without fills those rows are buf0's sigmoids from earlier in the call: plausible numbers.
    assert torch.isfinite(stale).all() and not torch.equal(stale, correct[0])
    assert torch.isnan(filled).all()


# -- a replayed step -----------------------------------------------------------------------------

@pytest.mark.device
def test_a_replay_fills_a_graph_slot_again_before_its_next_buffer(runtime) -> None:
    """The replay's arena holds the graph's slot as one identity; the recording's fills refill it
    before the product, so the half the product does not write is NaN, not the sigmoids."""
    from torch_adreno.runtime import get_residency

    compiled = torch.compile(_slot_reusing, backend="adreno", options={"fusion": False}, dynamic=False,
                             fullgraph=True)
    x = torch.randn(64, 64)
    compiled(x)
    recorder = StepRecorder(runtime, (x,))
    with recorder:
        out = compiled(x)
    product = next(i for i, op in enumerate(recorder.operations) if "pw_mul" in op.source.name)
    slot = recorder.operations[product].args[0]
    assert recorder.identities[slot].kind is INTERNAL and recorder.identities[slot].arena
    assert [f.before for f in recorder.fills if f.identity == slot] == [0, product]
    op = recorder.operations[product]
    recorder.operations[product] = dataclasses.replace(
        op, source=dataclasses.replace(op.source, global_size=(op.source.global_size[0] // 2,)))
    results = {}
    for fill in (False, True):
        replay = ReplayedStep(recorder, out, get_residency(runtime),
                              options=ReplayOptions(arena_kernels=False, fill_uninitialized_memory=fill))
        fills = [o for o in replay._operations.operations if isinstance(o, Fill)]
        assert len(fills) == (len(recorder.fills) if fill else 0)
        results[fill] = replay((x,))
    assert torch.isfinite(results[False]).all()
    assert torch.isnan(results[True]).all()


def _train(name: str, steps: int, options: dict | None):
    spec = MODELS[name]
    generator = torch.Generator().manual_seed(1)
    batches = [spec.batch(generator) for _ in range(steps)]
    torch.manual_seed(0)
    model = spec.make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     options=options)
    torch.manual_seed(0)
    losses = torch.stack([step(x, y) for x, y in batches])
    step.synchronize()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert step.replayed_steps == steps - 2
    assert any(not torch.equal(before[k], state[k]) for k in state), "no parameter changed"
    return losses, state, step


def _assert_every_internal_identity_is_filled_before_its_first_use(step) -> None:
    replay = step.replay
    recording, lifetimes = replay.recording, replay.memory.lifetimes
    filled_first = {f.identity for f in recording.fills if f.before == lifetimes[f.identity][0]}
    internal = {i.index for i in recording.identities if i.kind is INTERNAL and i.index in lifetimes}
    assert internal and internal <= filled_first, sorted(internal - filled_first)


@pytest.mark.device
@pytest.mark.parametrize(("name", "options"), [
    pytest.param("mlp", {}, id="mlp"), pytest.param("lenet", {}, id="lenet"),
    pytest.param("resnet_mini", {}, id="resnet_mini"), pytest.param("transformer", COPY, id="transformer-copy"),
    pytest.param("lenet", {**COPY, "replay_arena_kernels": True}, id="lenet-arena-kernels")])
def test_fills_change_no_bit_of_a_replayed_reference_model(name, options) -> None:
    """With memory of its own (copy) and unified (zero-copy: host outputs filled too), and with the
    kernels rebuilt to reach the arena at offsets (fills then land in a heap slab's region)."""
    steps = 5 if name in ("mlp", "lenet") else 3
    plain = _train(name, steps, options)
    filled = _train(name, steps, {**options, **FILL})
    launched = [o for o in filled[2].replay._operations.operations if isinstance(o, Fill)]
    assert launched and not any(isinstance(o, Fill) for o in plain[2].replay._operations.operations)
    _assert_every_internal_identity_is_filled_before_its_first_use(filled[2])
    assert torch.equal(plain[0], filled[0])
    for key in plain[1]:
        assert torch.equal(plain[1][key], filled[1][key]), key


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_mini", "lstm"])
@pytest.mark.parametrize("options", [{}, COPY], ids=["default", "copy"])
def test_fills_change_no_bit_of_the_other_reference_models(name, options) -> None:
    plain = _train(name, 4, options)
    filled = _train(name, 4, {**options, **FILL})
    assert torch.equal(plain[0], filled[0])
    for key in plain[1]:
        assert torch.equal(plain[1][key], filled[1][key]), key


@pytest.mark.device
def test_the_environment_variable_turns_fills_on_in_a_training_step(monkeypatch) -> None:
    monkeypatch.setenv(fmt.FILL_VARIABLE, "1")
    _, _, step = _train("mlp", 3, COPY)
    assert any(isinstance(o, Fill) for o in step.replay._operations.operations)


# -- the torch-free runner -----------------------------------------------------------------------

@pytest.mark.device
def test_the_runner_fills_where_the_file_says_and_refuses_a_file_listing_none() -> None:
    device = choose_device(None)
    x = np.arange(4, dtype=np.float32)
    plain = StepRunner(partial_write_step(), device, "hand-made", fill_uninitialized_memory=False)
    # c = [x0, x1, stale 2*x2, stale 2*x3], b = 2x + 1, w = 0.5: 11 + 16 + 0.5, then w + 1.
    assert [plain.step(x), plain.step(x)] == [27.5, 28.5]
    filled = StepRunner(partial_write_step(), device, "hand-made", fill_uninitialized_memory=True)
    assert np.isnan(filled.step(x))
    with pytest.raises(UnsupportedStepFile, match=r"lists no fills.*export the step again"):
        StepRunner(partial_write_step(fills=False), device, "hand-made", fill_uninitialized_memory=True)
    assert StepRunner(partial_write_step(fills=False), device, "hand-made", fill_uninitialized_memory=False).step(x) == 27.5


@pytest.mark.device
def test_an_exported_step_runs_bit_for_bit_with_its_fills(tmp_path) -> None:
    """The export lists the replay's fills; the runner with them gives the losses and state it gives
    without, and the prediction too."""
    import onnx

    _, _, step = _train("mlp", 3, COPY)
    path = tmp_path / "mlp.onnx"
    x, _ = MODELS["mlp"].batch(torch.Generator().manual_seed(5))
    step.export(path, predict=x)
    model = onnx.load(str(path))
    plan = json.loads({p.key: p.value for p in model.metadata_props}[fmt.PLAN_KEY])
    recording = step.replay.recording
    assert plan[fmt.FILLS_KEY][:len(recording.fills)] == [[f.before, f.identity, f.offset, f.nbytes]
                                                          for f in recording.fills]
    assert len(plan[fmt.FILLS_KEY]) > len(recording.fills)  # the prediction's, after the step's
    generator = torch.Generator().manual_seed(2)
    batches = [tuple(t.numpy() for t in MODELS["mlp"].batch(generator)) for _ in range(3)]
    runs = []
    for fill in (False, True):
        runner = StepRunner(model, choose_device(None), str(path), fill_uninitialized_memory=fill)
        runs.append(([runner.step(*b) for b in batches], runner.state(), runner.predict(x.numpy())))
    assert runs[0][0] == runs[1][0]
    assert all(np.array_equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])
    assert np.array_equal(runs[0][2], runs[1][2])
