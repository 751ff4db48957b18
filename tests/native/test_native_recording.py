"""The native runtime's training step recorded once into the driver (a ``cl_khr_command_buffer``,
where the device offers one: Intel's CPU runtime here) and enqueued whole each run: the same losses
and state, bit for bit, as enqueueing it operation by operation (``--no-recording``); the path is
printed, switchable from the C API and the environment, and bench times both."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest
from native_fixtures import STEPS
from safetensors.numpy import load_file
from test_native_step import bits, native_losses, run_native, train

from torch_adreno.export.data_file import load_batches
from torch_adreno.remote import NativeStep

pytestmark = pytest.mark.device

VARIABLE = "TORCH_ADRENO_REPLAY_COMMAND_BUFFERS"


def _offers_command_buffers(platform: str) -> bool:
    return any(platform == p.name.strip() and any("cl_khr_command_buffer" in d.extensions.split() for d in p.get_devices())
               for p in cl.get_platforms())


def _path(done) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"^enqueue: (.*)$", done.stdout, re.MULTILINE)
    assert found, done.stdout
    return found.group(1)


@pytest.mark.parametrize("model", ["lenet", "mlp"])
def test_a_recorded_step_trains_bit_for_bit_as_one_enqueued_operation_by_operation(native, environment, platforms,
                                                                                   exported, tmp_path, model) -> None:
    step, data = exported(model)
    for device in platforms:
        for extra in ((), ("--fill-uninitialized-memory",)):
            recorded = train(native, environment, step, data, device, tmp_path / "recorded.safetensors", STEPS, *extra)
            looped = train(native, environment, step, data, device, tmp_path / "looped.safetensors", STEPS,
                           "--no-recording", *extra)
            if _offers_command_buffers(device):
                assert _path(recorded).startswith("command buffer (cl_khr_command_buffer "), recorded.stdout
            else:
                assert _path(recorded) == "operation by operation (the device offers no cl_khr_command_buffer)"
            assert _path(looped) == "operation by operation (tas_step_set_recording 0)"
            assert bits(native_losses(recorded)) == bits(native_losses(looped)), (device, extra)
            ours, theirs = load_file(str(tmp_path / "recorded.safetensors")), load_file(str(tmp_path / "looped.safetensors"))
            assert ours.keys() == theirs.keys()
            assert all(np.array_equal(ours[name], theirs[name]) for name in ours), (device, extra)


def test_the_variable_turns_recording_off_and_asking_for_it_where_none_can_is_an_error(native, environment, platforms,
                                                                                      exported, tmp_path) -> None:
    step, data = exported("mlp")
    out = tmp_path / "out.safetensors"
    device = platforms[0]
    off = train(native, dict(environment, **{VARIABLE: "0"}), step, data, device, out, 1)
    assert _path(off) == f"operation by operation ({VARIABLE}=0)"
    bad = train(native, dict(environment, **{VARIABLE: "sometimes"}), step, data, device, out, 1)
    assert bad.returncode == 2 and f"{VARIABLE} is 'sometimes': it takes auto, 1 or 0" in bad.stderr
    for platform in platforms:
        required = train(native, dict(environment, **{VARIABLE: "1"}), step, data, platform, out, 1)
        if _offers_command_buffers(platform):
            assert _path(required).startswith("command buffer (")
        else:
            assert required.returncode == 2, required.stdout
            assert f"{VARIABLE}=1, but {platform}" in required.stderr and "cannot record the step" in required.stderr


def test_bench_times_the_enqueue_recorded_and_operation_by_operation(native, environment, platforms, exported) -> None:
    recording = [p for p in platforms if _offers_command_buffers(p)]
    if not recording:
        pytest.skip("no device here offers cl_khr_command_buffer (Intel's CPU runtime does)")
    step, data = exported("lenet")
    done = run_native(native, environment, "bench", str(step), "--data", str(data), "--steps", "3", "--warmup", "1",
                      "--device", recording[0])
    assert done.returncode == 0, done.stderr
    lines = re.findall(r"^enqueue, unprofiled \(median of 3 steps\): ([\d.]+) ms per step, upload [\d.]+ ms, wait for "
                       r"the device [\d.]+ ms: (.*)$", done.stdout, re.MULTILINE)
    assert [path.split(" (")[0] for _, path in lines] == ["command buffer", "operation by operation"], done.stdout
    assert all(float(ms) > 0 for ms, _ in lines)


def test_the_c_api_switches_between_the_recording_and_the_loop(native, environment, platforms, exported,
                                                              monkeypatch) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)  # (the library loads the OpenCL loader the environment names)
    step, data = exported("mlp")
    batches = load_batches(data)
    rows = [(batches["batch_0"][i], batches["batch_1"][i]) for i in range(STEPS)]
    for device in platforms:
        runs = []
        for switch in ([True] * STEPS, [i % 2 == 0 for i in range(STEPS)]):
            with NativeStep(Path(native.library), step, device=device) as native_step:
                losses, paths = [], set()
                for recorded, row in zip(switch, rows, strict=True):
                    native_step.set_recording(recorded)
                    paths.add(native_step.enqueue_path.split(" (")[0])
                    losses.append(native_step.step(*row))
                runs.append(losses)
        assert bits(runs[0]) == bits(runs[1]), device
        expected = {"command buffer", "operation by operation"} if _offers_command_buffers(device) else {
            "operation by operation"}
        assert paths == expected, (device, paths)
