"""A TrainingStep on a remote device (``options={"device": "remote:HOST:PORT"}``): compiled and
captured here, planned for the remote device, each capture shipped once to a step server on
loopback, which runs the steps: losses and state bit-identical to the same step replayed here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from native_fixtures import gpt2_lora_parts
from test_remote import Server, start_server, stop

import torch_adreno
from torch_adreno.errors import OptionError
from torch_adreno.models.reference import MODELS
from torch_adreno.remote import RemoteDevice
from torch_adreno.runtime.device import select_device
from torch_adreno.targets.profiles import AdrenoTarget
from torch_adreno.training.remote import remote_target

pytestmark = pytest.mark.device


@pytest.fixture(scope="module")
def server(native, environment, platforms, tmp_path_factory) -> Iterator[Server]:
    """A server on the device this process's default choice (the capture device) is."""
    folder = tmp_path_factory.mktemp("training-server")
    local = select_device(None, use_environment=False)
    running = start_server(native, environment, folder, "--device", local.platform.strip(), "--cache-dir",
                           str(folder / "cache"))
    try:
        yield running
        stop(running)
    finally:
        running.process.kill()


def _target_of(server: Server) -> AdrenoTarget:
    """The compile target a remote TrainingStep plans for on ``server``'s device."""
    device = RemoteDevice("127.0.0.1", server.port)
    try:
        return remote_target(device)
    finally:
        device.close()


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _parts(name: str, batches: int) -> tuple[torch.nn.Module, Any, torch.optim.Optimizer, list[tuple]]:
    """A reference model (SGD with momentum) or the tiny GPT-2 LoRA, its loss, optimizer and batches."""
    if name == "gpt2_lora":
        return gpt2_lora_parts(batches)
    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.make()
    generator = torch.Generator().manual_seed(1)
    return (model, _loss, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            [spec.batch(generator) for _ in range(batches)])


def _train(name: str, options: dict, steps: int, schedule: bool = False) -> tuple[list[int], dict, int]:
    """Bit patterns of the losses, the state after, and the steps run remotely (remote device) or
    replayed (local)."""
    torch._dynamo.reset()
    model, loss_fn, opt, batches = _parts(name, 4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps) if schedule else None
    losses = []
    with torch_adreno.TrainingStep(model, loss_fn, opt, options=options) as step:
        for index in range(steps):
            losses.append(step(*batches[index % len(batches)]))
            if sched is not None:
                sched.step()
        remote = step.remote
        replayed = step.replayed_steps if remote is None else remote.steps_run
        assert remote is None or remote.shipped == 1
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bits = [int(loss.view(torch.int32)) for loss in losses]
    return bits, state, replayed


@pytest.mark.parametrize(("name", "steps"), [
    ("mlp", 30), ("lenet", 30), ("transformer", 10), ("resnet_mini", 10), ("gpt2_lora", 30),
    pytest.param("transformer", 30, marks=pytest.mark.slow), pytest.param("resnet_mini", 30, marks=pytest.mark.slow)])
def test_remote_steps_are_the_local_replays_bit_for_bit(server, name: str, steps: int) -> None:
    """Losses and state_dict() as the same step replayed here: 30 steps (the batches in turn),
    10 in CI for the two larger models (their 30-step runs are ``slow``)."""
    remote = f"remote:127.0.0.1:{server.port}"
    ours, state, replayed = _train(name, {"device": remote}, steps)
    assert replayed == steps - 2, replayed  # (the first two calls: compiled, then captured and shipped)
    # The same step replayed here, planned for the same target (the remote device's).
    local = select_device(None, use_environment=False)
    target = _target_of(server)
    expected, expected_state, _ = _train(name, {"device": local.label, "target": target, "replay_arena_kernels": False},
                                         steps)
    assert ours == expected
    for key, value in expected_state.items():
        assert torch.equal(state[key], value), key


def test_a_schedule_on_a_remote_device_keeps_replaying(server) -> None:
    remote = f"remote:127.0.0.1:{server.port}"
    ours, _, replayed = _train("mlp", {"device": remote}, 16, schedule=True)
    assert replayed >= 13, replayed
    local = select_device(None, use_environment=False)
    target = _target_of(server)
    expected, _, _ = _train("mlp", {"device": local.label, "target": target, "replay_arena_kernels": False}, 16,
                            schedule=True)
    assert ours == expected


def test_a_compiled_model_on_a_remote_device_is_refused_with_the_way() -> None:
    compiled = torch.compile(torch.nn.Linear(2, 2), backend="adreno", options={"device": "remote:127.0.0.1:9"})
    with pytest.raises(OptionError, match="only a TrainingStep runs there"):
        compiled(torch.randn(1, 2))


def test_another_batch_geometry_brings_the_state_home_and_ships_again(server) -> None:
    """A partial last batch: the remote state comes back to the host, the step runs and is captured
    here for the new geometry and shipped again; the losses are the local replay's throughout."""
    spec = MODELS["mlp"]

    def run(options: dict) -> tuple[list[int], int]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = spec.make()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        generator = torch.Generator().manual_seed(1)
        x, y = spec.batch(generator)
        sizes = [128, 128, 128, 128, 64, 64, 64, 128, 128]
        with torch_adreno.TrainingStep(model, _loss, opt, options=options) as step:
            losses = [step(x[:n], y[:n]) for n in sizes]
            shipped = step.remote.shipped if step.remote is not None else 0
        return [int(loss.view(torch.int32)) for loss in losses], shipped

    ours, shipped = run({"device": f"remote:127.0.0.1:{server.port}"})
    local = select_device(None, use_environment=False)
    expected, _ = run({"device": local.label, "target": _target_of(server), "replay_arena_kernels": False})
    assert ours == expected
    assert shipped == 3  # 128, then 64, then 128 again


def test_the_benchmark_suite_runs_on_a_remote_device(server, tmp_path) -> None:
    """``bench --remote``: each configuration as a TrainingStep replayed on the step server's device,
    the same JSON lines as a local run (step times; the device named by its properties)."""
    import json

    from torch_adreno.cli import main

    out = tmp_path / "suite"
    assert main(["bench", "--remote", f"127.0.0.1:{server.port}", "--models", "mlp", "--variants", "unfused",
                 "fused+reuse", "--steps", "3", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "suite.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in records] == ["unfused", "fused+reuse"]
    assert all(r["remote"] == f"127.0.0.1:{server.port}" and r["median_ms"] > 0 and r["options"]["training_step"]
               and r["options"]["device"] == f"remote:127.0.0.1:{server.port}"
               for r in records)


def test_a_profile_shows_the_remote_kernels_with_their_device_times(server) -> None:
    """Within ``profile()``, a remote step's kernels are the local replay's, each timed on the
    remote device (its own profiling events), and the step counts its launches."""
    spec = MODELS["lenet"]
    x, y = spec.batch(torch.Generator().manual_seed(1))

    def profiled(device: str) -> torch_adreno.profile:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = spec.make()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        options = {"device": device} if device.startswith("remote:") else {
            "device": device, "target": _target_of(server), "replay_arena_kernels": False}
        with torch_adreno.TrainingStep(model, _loss, opt, options=options) as step:
            step(x, y), step(x, y), step(x, y)
            with torch_adreno.profile() as prof:
                step(x, y)
        return prof

    remote = profiled(f"remote:127.0.0.1:{server.port}")
    local = profiled(select_device(None, use_environment=False).label)
    assert [s.kind for s in remote.steps] == ["replay"] and remote.replayed_steps == 1
    # (the kernels' names number their graphs, which Dynamo counts per process)
    assert [k.fx_nodes for k in remote.kernels] == [k.fx_nodes for k in local.kernels] and remote.kernel_launches > 5
    assert remote.steps[0].launches == remote.kernel_launches
    assert all(k.device_time_us is not None and k.device_time_us > 0 for k in remote.kernels)
    assert remote.device_time_us > 0 and "conv" in remote.table(group_by="kernel")
    # Each kernel names where it ran: the remote device, and the local device for the local replay.
    assert remote.devices == (f"remote:127.0.0.1:{server.port}",)
    assert local.devices == (select_device(None, use_environment=False).label,)
    with pytest.raises(ValueError, match="a roofline is of one device of this machine"):
        remote.device_peaks()


def test_project_calibrates_by_the_kernels_measured_on_a_remote_device(server, capsys) -> None:
    """``project --remote``: the fractions come from a step profiled on the remote device now; a
    device of no Adreno profile needs its peaks, and peaks below what the kernels reached are refused."""
    from torch_adreno.cli import main

    where = f"127.0.0.1:{server.port}"
    arguments = ["project", "--remote", where, "--model", "seed_mlp", "--target", "adreno740"]
    assert main(arguments) == 2
    assert "--remote-peaks" in capsys.readouterr().err
    assert main([*arguments, "--remote-peaks", "0.001", "0.001"]) == 2
    assert "faster than those peaks allow" in capsys.readouterr().err
    assert main([*arguments, "--remote-peaks", "150", "20"]) == 0
    out = capsys.readouterr().out
    assert f"at {where}" in out and "one replayed step of seed_mlp profiled now" in out
    measured = re.search(r"seed_mlp \(.*?calibration '(\w+)': (.*)", out)
    assert measured is not None and "gemm" in measured.group(2), out
    # (every kind's fraction measured there, none 0: the stored calibration's figures are not these)
    assert all(0 < float(f) <= 1 for f in re.findall(r" (\d\.\d{3})", measured.group(2)))
