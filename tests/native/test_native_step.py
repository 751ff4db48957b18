"""The native step runtime (native/, ``torch-adreno-step``): an exported step trained without Python
gives the torch-free Python runner's losses bit for bit and its state, on the same device; its
program cache is hit on a second run; bad files end in one clear error, never a crash (also under
AddressSanitizer and UBSan, and for fuzzed files); it cross-builds for 64-bit ARM."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from native_fixtures import (
    SANITIZER_OPTIONS,
    STEPS,
    build_once,
    damage_message,
    damaged_copies,
    gpt2_lora_parts,
    partial_write_step,
    view_and_copy_step,
)
from onnx import helper
from safetensors.numpy import load_file, save_file

import torch_adreno
from torch_adreno.cli.native import NativeBuild
from torch_adreno.export.data_file import FORMAT, load_batches, save_batches
from torch_adreno.models import MODELS, LeNet
from torch_adreno.runner import StepRunner, choose_device, integrity
from torch_adreno.runner import format as fmt

pytestmark = pytest.mark.device


def python_runner(step: Path, data: Path, device: str, rows: list[int]) -> tuple[list[float], dict[str, np.ndarray]]:
    """The torch-free Python runner's losses on the given rows of the data file, and its state after."""
    runner = StepRunner.load(step, choose_device(device))
    batches = load_batches(data)
    names = [spec["input"] for spec in runner.batch_inputs]
    losses = [runner.step(*(batches[name][row] for name in names)) for row in rows]
    return losses, runner.state()


def run_native(build: NativeBuild, environment: dict[str, str], *args: str, sanitized: bool = False,
               timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = dict(environment, **SANITIZER_OPTIONS) if sanitized else environment
    return subprocess.run([str(build.executable), *args], capture_output=True, text=True, env=env, timeout=timeout)


def native_losses(done: subprocess.CompletedProcess[str]) -> list[float]:
    assert done.returncode == 0, done.stderr[-3000:]
    return [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+) time", done.stdout, re.MULTILINE)]


def bits(losses: list[float]) -> list[int]:
    """The float32 bit patterns (the native runtime prints %.9g: exact for a float32)."""
    return [int(np.float32(loss).view(np.uint32)) for loss in losses]


def train(build: NativeBuild, environment: dict[str, str], step: Path, data: Path, device: str, out: Path,
          steps: int = STEPS, *extra: str, sanitized: bool = False) -> subprocess.CompletedProcess[str]:
    return run_native(build, environment, "train", str(step), "--data", str(data), "--steps", str(steps), "--out",
                      str(out), "--device", device, *extra, sanitized=sanitized)


# -- the same losses and state as the Python runner ---------------------------------------------------

@pytest.mark.parametrize("model", ["mlp", "digits"])
def test_native_losses_and_state_are_the_python_runners_bit_for_bit(native, environment, platforms, exported,
                                                                     tmp_path, model) -> None:
    step, data = exported(model)
    steps = 30  # (the data file's batches in turn)
    for device in platforms:
        out = tmp_path / f"{device}.safetensors"
        done = train(native, environment, step, data, device, out, steps, "--no-cache")
        ours, state = python_runner(step, data, device, [i % STEPS for i in range(steps)])
        assert bits(native_losses(done)) == bits(ours), device
        assert f"on {device}" in done.stdout
        written = load_file(str(out))
        assert written.keys() == state.keys()
        for name, value in state.items():
            assert written[name].dtype == value.dtype and np.array_equal(written[name], value), name
    # The state loads into PyTorch, as tensors and into the module and optimizer.
    from safetensors.torch import load_file as load_torch

    assert all(torch.equal(t, torch.from_numpy(state[name])) for name, t in load_torch(str(out)).items())
    module = MODELS["mlp"].make() if model == "mlp" else LeNet()
    optimizer = torch.optim.SGD(module.parameters(), lr=torch.tensor(0.0), momentum=0.9)
    loaded = torch_adreno.export.load_state(module, out, optimizer)
    assert "lr" in loaded and any(name.endswith("momentum_buffer") for name in loaded)
    for name, parameter in module.named_parameters():
        assert torch.equal(parameter.detach(), torch.from_numpy(state[name])), name
    first = next(iter(module.named_parameters()))[0]
    assert torch.equal(optimizer.state[module.get_parameter(first)]["momentum_buffer"],
                       torch.from_numpy(state[f"optimizer.{first}.momentum_buffer"]))


def _reference_parts(model: str, batches: int) -> tuple[torch.nn.Module, Any, torch.optim.Optimizer, list]:
    """A reference model of torch_adreno.models as `python -m torch_adreno export` trains it (SGD,
    momentum 0.9, a tensor learning rate), and its batches."""
    if model == "gpt2_lora":
        return gpt2_lora_parts(batches)
    torch.manual_seed(0)
    spec = MODELS[model]
    module = spec.make()
    generator = torch.Generator().manual_seed(3)
    optimizer = torch.optim.SGD(module.parameters(), lr=torch.tensor(0.05), momentum=0.9)
    return module, lambda m, x, y: F.cross_entropy(m(x), y), optimizer, [spec.batch(generator) for _ in range(batches)]


def _replayed_export(folder: Path, model: str, device: str | None, steps: int) -> tuple[Path, Path, list[float], Path]:
    """The model's step captured (two calls) on ``device`` and exported, its next ``steps``
    batches saved as a data file and trained by the in-PyTorch replay; the replay's losses and its
    state exported after them (the file's initializers)."""
    module, loss_fn, optimizer, batches = _reference_parts(model, steps + 2)
    path, data, after = folder / f"{model}.onnx", folder / f"{model}.safetensors", folder / f"{model}.after.onnx"
    with torch_adreno.TrainingStep(module, loss_fn, optimizer, {"device": device} if device else None) as step:
        step(*batches[0])
        step(*batches[1])
        step.export(path)
        save_batches(data, [tuple(t.numpy() for t in b) for b in batches[2:]])
        replayed_before = step.replayed_steps
        losses = [step(*b).item() for b in batches[2:]]
        assert step.replayed_steps - replayed_before == steps  # every step the in-PyTorch replay
        step.export(after)
    return path, data, losses, after


@pytest.mark.parametrize(("model", "steps"), [
    ("resnet_mini", 10), ("gpt2_lora", 30), pytest.param("resnet_mini", 30, marks=pytest.mark.slow)])
def test_resnet_mini_and_a_gpt2_lora_train_as_the_replay_and_the_python_runner(
        native, environment, platforms, tmp_path, model, steps) -> None:
    """The models beyond the MLP and LeNet, in CI on both CPU runtimes: every step bit for bit with
    the replay and the Python runner, the state after them the replay's and loading into PyTorch.
    CI's resnet_mini runs 10 steps (each a new batch, its BatchNorm statistics carried across), its
    30-step run is ``slow``."""
    from safetensors.torch import load_file as load_torch

    for device in platforms:
        folder = tmp_path / device.replace(" ", "_")
        folder.mkdir()
        step, data, replayed, after = _replayed_export(folder, model, device, steps)
        out = folder / "native.safetensors"
        done = train(native, environment, step, data, device, out, steps, "--no-cache")
        ours, _ = python_runner(step, data, device, list(range(steps)))
        assert bits(native_losses(done)) == bits(ours) == bits(replayed), device
        written = load_torch(str(out))
        state = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
                 for t in onnx.load(str(after)).graph.initializer}
        assert written.keys() == state.keys(), device
        for name, value in state.items():
            assert written[name].dtype == value.dtype and torch.equal(written[name], value), (device, name)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lenet", "resnet_mini", "transformer", "lstm", "mobilenet_mini", "gpt2_lora"])
def test_every_reference_model_trains_bit_for_bit(native, environment, platforms, exported, tmp_path, model) -> None:
    step, data = (_replayed_export(tmp_path, model, None, STEPS)[:2] if model == "gpt2_lora"
                  else exported(model))
    for device in platforms:
        out = tmp_path / f"{device}.safetensors"
        done = train(native, environment, step, data, device, out, 4, "--cache-dir", str(tmp_path / "cache"))
        ours, state = python_runner(step, data, device, [0, 1, 2, 3])
        assert bits(native_losses(done)) == bits(ours), device
        written = load_file(str(out))
        assert all(np.array_equal(written[name], value) for name, value in state.items()), device


def test_state_in_and_lr_are_inputs_the_run_sets(native, environment, platforms, exported, tmp_path) -> None:
    step, data = exported("mlp")
    device = platforms[0]
    first, second = tmp_path / "first.safetensors", tmp_path / "second.safetensors"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    native_first = native_losses(train(native, environment, step, data, device, first, 3, *cache))
    resumed = train(native, environment, step, data, device, second, 3, "--state", str(first), *cache)
    ours, state = python_runner(step, data, device, [0, 1, 2, 0, 1, 2])
    assert bits(native_first + native_losses(resumed)) == bits(ours)
    assert all(np.array_equal(load_file(str(second))[name], value) for name, value in state.items())
    # --lr 0: the step's tensor learning rate is an input; with it 0, no parameter moves.
    frozen = tmp_path / "frozen.safetensors"
    native_losses(train(native, environment, step, data, device, frozen, 2, "--lr", "0", *cache))
    initial = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(step)).graph.initializer}
    trained = load_file(str(frozen))
    assert float(trained["lr"]) == 0.0
    assert np.array_equal(trained["fc1.weight"], initial["fc1.weight"])


def test_the_program_cache_is_hit_on_the_second_run(native, environment, platforms, exported, tmp_path) -> None:
    step, data = exported("mlp")
    cache = tmp_path / "programs"
    runs = [train(native, environment, step, data, platforms[0], tmp_path / f"{i}.safetensors", 2, "--cache-dir",
                  str(cache)) for i in range(2)]
    counts = [tuple(map(int, re.search(r"programs: (\d+) built, (\d+) from the cache", run.stdout).groups()))  # type: ignore[union-attr]
              for run in runs]
    programs = len(list(cache.glob("*.clbin")))
    assert programs > 0 and counts == [(programs, 0), (0, programs)]
    assert native_losses(runs[0]) == native_losses(runs[1])


def test_bench_times_every_operation(native, environment, platforms, exported) -> None:
    step, data = exported("mlp")
    done = run_native(native, environment, "bench", str(step), "--data", str(data), "--steps", "3", "--warmup", "1",
                      "--device", platforms[0], "--no-cache")
    assert done.returncode == 0, done.stderr
    kernels = [n.name for n in onnx.load(str(step), load_external_data=False).graph.node
               if n.domain == fmt.DOMAIN][:int(re.search(r"(\d+) operations", done.stdout).group(1))]  # type: ignore[union-attr]
    rows = {m.group(1): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^(\S+)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+%$", done.stdout, re.MULTILINE)}
    assert set(rows) == set(kernels) and all(runs == 3 for runs, _ in rows.values())
    total = float(re.search(r"^total\s+([\d.]+)", done.stdout, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert total > 0 and total == pytest.approx(sum(t for _, t in rows.values()), abs=0.01)


def test_an_index_out_of_range_is_reported_as_the_python_runner_reports_it(native, environment, platforms,
                                                                          exported, tmp_path) -> None:
    step, data = exported("mlp")
    batches = load_batches(data)
    batches["batch_1"][0, 5] = 99  # a class label past the 10 classes
    bad = tmp_path / "bad.safetensors"
    save_file(batches, str(bad))
    done = train(native, environment, step, bad, platforms[0], tmp_path / "out.safetensors", 1, "--no-cache")
    assert done.returncode == 1
    assert re.search(r"error: kernel \S+ read index 99 out of range", done.stderr), done.stderr


def test_the_c_api_trains_and_predicts_as_the_python_runner(native, environment, platforms, exported) -> None:
    """examples/api_tour.c, linked with the shared library: two steps and a prediction on zeros."""
    step, _ = exported("mlp")
    done = subprocess.run([str(native.api_tour), str(step), platforms[0], "2"], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    runner = StepRunner.load(step, choose_device(platforms[0]))
    zeros = [np.zeros(spec["shape"], spec["dtype"]) for spec in runner.batch_inputs]
    losses = [runner.step(*zeros) for _ in range(2)]
    logits = runner.predict(zeros[0]).reshape(-1)
    printed = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert bits([float(x) for x in re.findall(r"^loss (\S+)", done.stdout, re.MULTILINE)]) == bits(losses)
    assert bits([float(x) for x in printed["logits"].split()]) == bits(list(logits))
    assert printed["state:"].split() == list(runner.state())


def test_export_writes_the_data_file_layout(exported) -> None:
    step, data = exported("mlp")
    batches = load_batches(data)
    inputs = {i.name: i for i in onnx.load(str(step), load_external_data=False).graph.input}
    assert sorted(batches) == ["batch_0", "batch_1"]
    for name, array in batches.items():
        shape = [d.dim_value for d in inputs[name].type.tensor_type.shape.dim]
        assert list(array.shape) == [STEPS, *shape]
    from safetensors import safe_open

    with safe_open(str(data), framework="numpy") as file:
        assert file.metadata() == {"format": FORMAT, "steps": str(STEPS)}


def test_batch_views_copies_and_state_updates_run_as_in_the_python_runner(native, environment, platforms,
                                                                         tmp_path) -> None:
    step, data = tmp_path / "view.onnx", tmp_path / "view.safetensors"
    onnx.save(view_and_copy_step(), str(step))
    batches = np.arange(36, dtype=np.float32).reshape(3, 4, 3) - 7  # (whole numbers: every sum is exact)
    save_batches(data, [(batch,) for batch in batches])
    expected = [2 * batches[i, 1:3].sum() + 0.5 + i for i in range(3)]
    for device in platforms:
        out = tmp_path / "state.safetensors"
        done = train(native, environment, step, data, device, out, 3, "--no-cache")
        ours, state = python_runner(step, data, device, [0, 1, 2])
        assert native_losses(done) == ours == expected, device
        assert float(load_file(str(out))["w"][0]) == float(state["w"][0]) == 3.5


def test_fills_make_an_unwritten_read_nan_and_change_no_bit_of_a_trained_step(native, environment, platforms,
                                                                             exported, tmp_path) -> None:
    """``--fill-uninitialized-memory`` (or its environment variable): the hand-made step whose last
    kernel reads two elements nothing wrote gives NaN, and the stale values' loss without it; the
    exported MLP trains to the Python runner's losses and state bit for bit with it."""
    planted, planted_data, unlisted = tmp_path / "partial.onnx", tmp_path / "partial.safetensors", tmp_path / "old.onnx"
    onnx.save(partial_write_step(), str(planted))
    onnx.save(partial_write_step(fills=False), str(unlisted))
    save_batches(planted_data, [(np.arange(4, dtype=np.float32),)])
    step, data = exported("mlp")
    for device in platforms:
        out = tmp_path / "state.safetensors"
        assert native_losses(train(native, environment, planted, planted_data, device, out, 2, "--no-cache")) == [27.5, 28.5]
        filled = train(native, environment, planted, planted_data, device, out, 2, "--no-cache", "--fill-uninitialized-memory",
                       "--continue-on-nonfinite")
        assert all(np.isnan(native_losses(filled))) and len(native_losses(filled)) == 2, device
        by_variable = train(native, dict(environment, **{fmt.FILL_VARIABLE: "1"}), planted, planted_data, device, out, 1,
                            "--no-cache", "--continue-on-nonfinite")
        assert np.isnan(native_losses(by_variable)).all(), device
        refused = train(native, environment, unlisted, planted_data, device, out, 1, "--no-cache", "--fill-uninitialized-memory")
        assert refused.returncode == 2 and "lists no fills" in refused.stderr, refused.stderr
        done = train(native, environment, step, data, device, out, STEPS, "--no-cache", "--fill-uninitialized-memory")
        ours, state = python_runner(step, data, device, list(range(STEPS)))
        assert bits(native_losses(done)) == bits(ours), device
        written = load_file(str(out))
        assert all(np.array_equal(written[name], value) for name, value in state.items()), device


# -- bad input: one clear error, never a crash (under the sanitizers) -------------------------------

def _edited(step: Path, folder: Path, edit) -> Path:
    model = onnx.load(str(step))
    edit(model)
    path = folder / f"edited_{len(list(folder.glob('edited_*.onnx')))}.onnx"
    onnx.save(integrity.seal(model), str(path))  # (an edit, not damage: the refusal is the edit's)
    return path


def _with_props(model: onnx.ModelProto, **props: str) -> None:
    current = {p.key: p.value for p in model.metadata_props}
    helper.set_model_props(model, {**current, **props})


def _kernel(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.domain == fmt.DOMAIN and n.op_type != fmt.COPY_OP)


def _bad_steps(step: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    truncated = folder / "truncated.onnx"
    truncated.write_bytes(step.read_bytes()[: step.stat().st_size * 3 // 5])
    text = folder / "text.onnx"
    text.write_text("this is not a model\n")

    def other_producer(m):
        m.producer_name = "pytorch"

    unsealed, unreadable = folder / "unsealed.onnx", folder / "unreadable.onnx"
    for path, record in ((unsealed, None), (unreadable, "{not json")):
        model = onnx.load(str(step))
        kept = [p for p in model.metadata_props if p.key != integrity.INTEGRITY_KEY]
        helper.set_model_props(model, {**{p.key: p.value for p in kept},
                                       **({integrity.INTEGRITY_KEY: record} if record else {})})
        onnx.save(model, str(path))

    def unknown_attribute(m):
        _kernel(m).attribute.append(helper.make_attribute("tiling", [8, 8]))

    def too_wide(m):
        local = next(a for a in _kernel(m).attribute if a.name == "local_size")
        local.ints[:] = [1 << 20, *list(local.ints[1:])]

    def imaginary_extension(m):
        extensions = next(a for a in _kernel(m).attribute if a.name == "extensions")
        extensions.strings[:] = [b"cl_vendor_imaginary"]

    def huge_slot(m):
        plan = json.loads({p.key: p.value for p in m.metadata_props}[fmt.PLAN_KEY])
        plan["slots"][0] = 1 << 50
        _with_props(m, **{fmt.PLAN_KEY: json.dumps(plan)})

    def fill_outside_its_slot(m):
        plan = json.loads({p.key: p.value for p in m.metadata_props}[fmt.PLAN_KEY])
        plan[fmt.FILLS_KEY][0][3] = 1 << 40
        _with_props(m, **{fmt.PLAN_KEY: json.dumps(plan)})

    return {
        "truncated": (truncated, r"is not a valid ONNX model \(.*\): truncated or corrupted\? export it again"),
        "not onnx": (text, r"is not a valid ONNX model"),
        "format": (_edited(step, folder, lambda m: _with_props(m, **{fmt.FORMAT_KEY: "99"})),
                   r"has step format 99; this runner reads format 4"),
        "producer": (_edited(step, folder, other_producer), r"was made by pytorch, not by torch_adreno's export"),
        "plan": (_edited(step, folder, lambda m: _with_props(m, **{fmt.PLAN_KEY: "{\"slots\": 3}"})),
                 r"step plan of .* is malformed: slots is not a list"),
        "standard op": (_edited(step, folder, lambda m: m.graph.node.append(helper.make_node("Relu", ["loss"], ["r"]))),
                        r"is a standard Relu between kernels"),
        "attribute": (_edited(step, folder, unknown_attribute), r"attributes this runner does not know: tiling"),
        "work-group": (_edited(step, folder, too_wide), r"cannot run this step: kernel \S+ needs work-groups of"),
        "extension": (_edited(step, folder, imaginary_extension), r"needs the OpenCL extension cl_vendor_imaginary"),
        "fill": (_edited(step, folder, fill_outside_its_slot),
                 r"step plan of .* is malformed: fill 0 is not inside the slot of an internal identity"),
        "allocation": (_edited(step, folder, huge_slot),
                       r"cannot run this step: a buffer of 1125899906842624 bytes \(device allocations: at most"),
        **{f"damaged {part}": (path, damage_message(path, what))
           for part, (path, what) in damaged_copies(step, folder).items()},
        "no record": (unsealed, r"damaged file: \S+ has no integrity record"),
        "record": (unreadable, r"damaged file: \S+: its integrity record \(metadata torch_adreno.integrity\) is unreadable"),
    }


def _bad_data(data: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    good = data.read_bytes()
    (header_length,) = struct.unpack("<Q", good[:8])
    header, body = good[8:8 + header_length], good[8 + header_length:]
    files = {
        "huge header": (struct.pack("<Q", 1 << 40) + good[8:], r"not a valid safetensors file: a header length over"),
        "header not json": (struct.pack("<Q", 8) + b"{not json" + body, r"not a valid safetensors file: a header that"),
        "offsets": (good[:8] + header.replace(b'"data_offsets":[0,', b'"data_offsets":[4,') + body,
                    r"not a valid safetensors file: data_offsets that do not match|overlap or leave gaps"),
        "truncated": (good[: len(good) - 100], r"not a valid safetensors file"),
    }
    arrays = load_batches(data)
    paths = {}
    for name, (content, message) in files.items():
        path = folder / f"{name.replace(' ', '_')}.safetensors"
        path.write_bytes(content)
        paths[name] = (path, message)
    missing, wrong = folder / "missing.safetensors", folder / "wrong.safetensors"
    save_file({"batch_0": arrays["batch_0"]}, str(missing))
    save_file({"batch_0": arrays["batch_0"][:, :, :100].copy(), "batch_1": arrays["batch_1"]}, str(wrong))
    paths["missing tensor"] = (missing, r"has no array for every batch input \(it has batch_0\); the step takes "
                                        r"batch_0 float32\[\d+, 784\]")
    paths["wrong shape"] = (wrong, r"array batch_0 is batch_0 float32\[\d+, \d+, 100\]; for batch_0 float32\[\d+, 784\] "
                                   r"it holds batches stacked over steps")
    archive = folder / "stacked.npz"
    np.savez(archive, **arrays)
    whole = archive.read_bytes()
    npz = {"npz truncated": (whole[: len(whole) // 2], r"not a valid \.npz archive: no end of central directory"),
           "npz crc": (whole[:100] + bytes([whole[100] ^ 1]) + whole[101:], r"damaged file: .* fails its CRC-32"),
           "npz no zip": (b"PK\x03\x04" + bytes(64), r"not a valid \.npz archive"),
           "not data": (b"col1,col2\n1,2\n", r"is neither a safetensors file nor an \.npz archive")}
    for name, (content, message) in npz.items():
        path = folder / f"{name.replace(' ', '_')}.npz"
        path.write_bytes(content)
        paths[name] = (path, message)
    compressed = folder / "compressed.npz"
    np.savez_compressed(compressed, **arrays)
    paths["npz compressed"] = (compressed, r"array batch_\d is compressed \(numpy\.savez_compressed\)")
    return paths


def test_bad_files_end_in_one_clear_error_under_the_sanitizers(sanitized, environment, platforms, exported,
                                                               tmp_path) -> None:
    step, data = exported("mlp")
    device = platforms[0]
    cases = [("step " + name, path, data, message) for name, (path, message) in _bad_steps(step, tmp_path).items()]
    cases += [("data " + name, step, path, message) for name, (path, message) in _bad_data(data, tmp_path).items()]
    for case, step_file, data_file, message in cases:
        done = train(sanitized, environment, step_file, data_file, device, tmp_path / "out.safetensors", 1,
                     "--cache-dir", str(tmp_path / "cache"), sanitized=True)
        assert done.returncode == 2, f"{case}: exit {done.returncode}\n{done.stderr[-3000:]}"
        assert done.stderr.startswith("error: ") and re.search(message, done.stderr), f"{case}: {done.stderr}"
        assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, case


def test_the_sanitized_build_trains_the_mlp_bit_for_bit(sanitized, environment, platforms, exported,
                                                       tmp_path) -> None:
    step, data = exported("mlp")
    ours, _ = python_runner(step, data, platforms[0], [0, 1, 2])
    for fill in ((), ("--fill-uninitialized-memory",)):
        done = train(sanitized, environment, step, data, platforms[0], tmp_path / "out.safetensors", 3, "--cache-dir",
                     str(tmp_path / "cache"), *fill, sanitized=True)
        assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr[-3000:]
        assert bits(native_losses(done)) == bits(ours), fill


def test_fuzzed_step_and_safetensors_files_never_crash_the_readers(sanitized, exported, tmp_path) -> None:
    """The readers' fuzz driver under AddressSanitizer (leaks included) and UBSan: thousands of
    mutants of a real step file (its tensors cut short: the reader keeps no tensor data), of a
    safetensors file and of an .npz archive; each is read or refused."""
    assert sanitized.fuzz_driver is not None
    step, _data = exported("mlp")
    model = onnx.load(str(step))
    for tensor in model.graph.initializer:
        tensor.raw_data = tensor.raw_data[:8]
    seeds = {"onnx": (tmp_path / "seed.onnx", 5000), "safetensors": (tmp_path / "seed.safetensors", 20000),
             "npz": (tmp_path / "seed.npz", 20000)}
    onnx.save(model, str(seeds["onnx"][0]))
    save_file({"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.arange(2, dtype=np.int64),
               "flag": np.array([True, False]), "lr": np.array(0.5, np.float32)}, str(seeds["safetensors"][0]))
    np.savez(seeds["npz"][0], x=np.arange(6, dtype=np.float32).reshape(2, 3), y=np.arange(2, dtype=np.int64),
             flag=np.array([True, False]), lr=np.array(0.5, np.float32))
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1", UBSAN_OPTIONS="halt_on_error=1")
    for reader, (seed, count) in seeds.items():
        done = subprocess.run([str(sanitized.fuzz_driver), reader, str(seed), str(count), "48"], capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0, f"{reader}: {done.stderr[-4000:]}"
        accepted, refused = map(int, re.search(r"(\d+) accepted, (\d+) refused, no crash", done.stdout).groups())  # type: ignore[union-attr]
        assert accepted + refused == count and refused > count // 10, done.stdout


# -- the aarch64 cross build ----------------------------------------------------------------------------

def test_the_runtime_cross_builds_for_64_bit_arm(tmp_path_factory) -> None:
    built = build_once(tmp_path_factory, "native-aarch64", target="linux-aarch64")
    for path in (built.executable, built.library):
        header = path.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and struct.unpack("<H", header[18:20])[0] == 183, path  # EM_AARCH64
