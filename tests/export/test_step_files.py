"""Step and data files as both runners take them (the Python runner, ``python -m torch_adreno.runner``,
and the native runtime, ``torch-adreno-step``): a damaged step file is refused naming the damaged
part; a loss that is not finite stops a run; safetensors and .npz data give the same batches in
both, and other files are refused naming the formats; ``native build`` and ``native env`` leave a
shell that runs the binary, with each OpenCL runtime found once."""

from __future__ import annotations

import ast
import ctypes.util
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from native_fixtures import ROOT, damage_message, damaged_copies
from safetensors.numpy import save_file

from torch_adreno.cli import main as cli_main
from torch_adreno.export.data_file import load_batches
from torch_adreno.runner import DamagedStepFile, StepRunner, choose_device
from torch_adreno.runner.__main__ import main as runner_main
from torch_adreno.runner.data import Batches

pytestmark = pytest.mark.device

STEPS = 3


def native_train(native, environment, step: Path, data: Path, device: str, out: Path, *extra: str,
                 steps: int = STEPS, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    caching = ["--cache-dir", str(cache)] if cache else ["--no-cache"]
    return subprocess.run([str(native.executable), "train", str(step), "--data", str(data), "--steps", str(steps),
                           "--out", str(out), "--device", device, *caching, *extra],
                          capture_output=True, text=True, env=environment, timeout=600)


def python_train(capsys, step: Path, data: Path, device: str, out: Path, *extra: str,
                 steps: int = STEPS) -> tuple[int, str, str]:
    capsys.readouterr()  # (what came before: an export's log lines)
    code = runner_main([str(step), "--data", str(data), "--steps", str(steps), "--device", device, "--out", str(out),
                        *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def losses(stdout: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", stdout, re.MULTILINE)]


def bits(values: list[float]) -> list[int]:
    return [int(np.float32(v).view(np.uint32)) for v in values]


# -- integrity ------------------------------------------------------------------------------------------

def test_a_damaged_step_file_is_refused_by_both_runners_naming_the_part(native, environment, platforms, exported,
                                                                       tmp_path, capsys) -> None:
    """20 flipped bytes of a parameter's data and 200 of a kernel's source: without the integrity
    check the first trains on garbage (exit 0) and the second fails as a kernel build."""
    step, data = exported("digits")
    device = platforms[0]
    for part, (damaged, what) in damaged_copies(step, tmp_path).items():
        pattern = damage_message(damaged, what)
        out = tmp_path / f"{part}.safetensors"
        done = native_train(native, environment, damaged, data, device, out)
        assert done.returncode == 2 and re.match("error: " + pattern, done.stderr), (part, done.stderr[-2000:])
        assert "loss" not in done.stdout and not out.exists(), part
        code, stdout, stderr = python_train(capsys, damaged, data, device, tmp_path / f"{part}.npz")
        assert code == 2 and re.match("error: " + pattern, stderr), (part, stderr)
        assert "loss" not in stdout, part
        with pytest.raises(DamagedStepFile, match=pattern):
            StepRunner.load(damaged, choose_device(device))


def test_a_state_written_as_onnx_is_sealed_again_and_trains_on(native, environment, platforms, exported,
                                                              tmp_path) -> None:
    step, data = exported("mlp")
    device = platforms[0]
    runner = StepRunner.load(step, choose_device(device))
    batches = load_batches(data)
    names = [s["input"] for s in runner.batch_inputs]
    runner.step(*(batches[n][0] for n in names))
    trained = tmp_path / "trained.onnx"
    runner.save_state(trained)
    again = StepRunner.load(trained, choose_device(device))  # verifies the new record
    assert all(np.array_equal(again.state()[k], v) for k, v in runner.state().items())
    done = native_train(native, environment, trained, data, device, tmp_path / "out.safetensors")
    assert done.returncode == 0, done.stderr[-2000:]
    model = onnx.load(str(trained))
    model.graph.initializer[0].raw_data = bytes(len(model.graph.initializer[0].raw_data))
    onnx.save(model, str(tmp_path / "zeroed.onnx"))
    with pytest.raises(DamagedStepFile, match=f"the data of initializer {model.graph.initializer[0].name}"):
        StepRunner.load(tmp_path / "zeroed.onnx", choose_device(device))


# -- a loss that is not finite ---------------------------------------------------------------------------

def test_a_nonfinite_loss_stops_both_runners_naming_the_step(native, environment, platforms, exported, tmp_path,
                                                            capsys) -> None:
    step, data = exported("mlp")
    device = platforms[0]
    batches = load_batches(data)
    x = batches["batch_0"].copy()
    x[1].flat[0] = np.nan  # step 2's batch
    poisoned = tmp_path / "nan.npz"
    np.savez(poisoned, batch_0=x, batch_1=batches["batch_1"])
    message = r"error: step 2: the loss is nan, not finite: .* \(--continue-on-nonfinite trains on\)"
    out = tmp_path / "state.safetensors"
    done = native_train(native, environment, step, poisoned, device, out)
    assert done.returncode == 1 and re.search(message, done.stderr), done.stderr[-2000:]
    assert len(losses(done.stdout)) == 2 and not out.exists()
    code, stdout, stderr = python_train(capsys, step, poisoned, device, tmp_path / "state.npz")
    assert code == 1 and re.search(message, stderr) and len(losses(stdout)) == 2, stderr
    assert not (tmp_path / "state.npz").exists()
    done = native_train(native, environment, step, poisoned, device, out, "--continue-on-nonfinite")
    assert done.returncode == 0 and len(losses(done.stdout)) == STEPS and out.exists(), done.stderr[-2000:]
    code, stdout, _ = python_train(capsys, step, poisoned, device, tmp_path / "state.npz", "--continue-on-nonfinite")
    assert code == 0 and len(losses(stdout)) == STEPS and np.isnan(losses(stdout)[1])


# -- data files --------------------------------------------------------------------------------------------

def test_the_examples_order_is_a_fresh_permutation_each_epoch() -> None:
    examples = Batches([np.arange(10), np.arange(10) * 2], stacked=False, batch_size=3, seed=5)
    assert examples.per_epoch == 3
    iterator = iter(examples)
    epochs = [np.concatenate([next(iterator)[0] for _ in range(3)]) for _ in range(2)]
    assert all(len(set(e)) == 9 for e in epochs) and not np.array_equal(epochs[0], epochs[1])
    x, y = next(iter(Batches([np.arange(10), np.arange(10) * 2], stacked=False, batch_size=3, seed=5)))
    assert np.array_equal(y, x * 2) and np.array_equal(x, epochs[0][:3])


def test_both_runners_take_the_same_batches_from_safetensors_and_npz(native, environment, platforms, exported,
                                                                     tmp_path, capsys) -> None:
    step, data = exported("digits")
    device = platforms[0]
    stacked = load_batches(data)
    np.savez(tmp_path / "stacked.npz", **stacked)
    x = stacked["batch_0"].reshape(-1, *stacked["batch_0"].shape[2:])
    y = stacked["batch_1"].reshape(-1)
    np.savez(tmp_path / "examples.npz", x=x, y=y)
    save_file({"x": x, "y": y}, str(tmp_path / "examples.safetensors"))
    runs = {}
    for name, seed in ((data, "0"), (data, "7"), (tmp_path / "stacked.npz", "0"), (tmp_path / "examples.npz", "0"),
                       (tmp_path / "examples.npz", "7"), (tmp_path / "examples.safetensors", "0")):
        done = native_train(native, environment, step, name, device, tmp_path / "out.safetensors", "--seed", seed,
                            cache=tmp_path / "cache")
        assert done.returncode == 0, (name, done.stderr[-2000:])
        code, stdout, stderr = python_train(capsys, step, name, device, tmp_path / "out.npz", "--seed", seed)
        assert code == 0, (name, stderr)
        assert len(losses(stdout)) == STEPS and bits(losses(done.stdout)) == bits(losses(stdout)), (name, seed)
        runs[name.name, seed] = bits(losses(stdout))
    assert runs["stacked.npz", "0"] == runs[data.name, "0"] == runs[data.name, "7"]  # (stacked: no order to seed)
    assert runs["examples.npz", "0"] == runs["examples.safetensors", "0"] != runs["examples.npz", "7"]
    assert runs["examples.npz", "0"] != runs["stacked.npz", "0"]  # (shuffled, not the stacked order)


def test_data_files_the_runners_cannot_read_are_refused_naming_why(native, environment, platforms, exported,
                                                                   tmp_path, capsys) -> None:
    step, data = exported("mlp")
    device = platforms[0]
    batches = load_batches(data)
    text = tmp_path / "data.txt"
    text.write_text("x,y\n1,2\n")
    float64 = tmp_path / "float64.npz"
    np.savez(float64, batch_0=batches["batch_0"].astype(np.float64), batch_1=batches["batch_1"])
    mixed = tmp_path / "mixed.npz"
    np.savez(mixed, batch_0=batches["batch_0"], batch_1=batches["batch_1"].reshape(-1))
    crc = tmp_path / "crc.npz"
    np.savez(crc, batch_0=batches["batch_0"], batch_1=batches["batch_1"])
    with zipfile.ZipFile(crc) as archive:
        info = archive.getinfo("batch_1.npy")
    damaged = bytearray(crc.read_bytes())
    damaged[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF
    crc.write_bytes(bytes(damaged))
    compressed = tmp_path / "compressed.npz"
    np.savez_compressed(compressed, **batches)
    both = {text: r"is neither a safetensors file nor an \.npz archive; the runners read data as safetensors .* or "
                  r"\.npz \(numpy\.savez\)",
            float64: r"array batch_0 (is float64|has dtype '<f8')",
            mixed: r"some arrays stack batches over steps and others hold examples",
            crc: r"damaged file: \S+crc.npz: .*(CRC-32|batch_1)"}
    for path, message in both.items():
        done = native_train(native, environment, step, path, device, tmp_path / "out.safetensors")
        assert done.returncode == 2 and re.search(message, done.stderr), (path.name, done.stderr[-2000:])
        code, _, stderr = python_train(capsys, step, path, device, tmp_path / "out.npz")
        assert code == 2 and re.search(message, stderr), (path.name, stderr)
    done = native_train(native, environment, step, compressed, device, tmp_path / "out.safetensors")
    assert done.returncode == 2 and "compressed (numpy.savez_compressed)" in done.stderr, done.stderr[-2000:]
    code, _, stderr = python_train(capsys, step, compressed, device, tmp_path / "out.npz")
    assert code == 0, stderr  # (the Python runner reads every .npz numpy does)


# -- building and running the binary ----------------------------------------------------------------------

def test_native_build_shows_its_progress_and_ends_with_the_line_that_runs_it(native, capsys) -> None:
    capsys.readouterr()
    assert cli_main(["native", "build", "--build-dir", str(native.build_dir)]) == 0
    captured = capsys.readouterr()
    assert f"configuring (host, {native.build_dir})" in captured.err
    assert re.search(r"^\[ *\d+%\] Built target torch-adreno-step$", captured.err, re.MULTILINE), captured.err
    last = captured.out.strip().splitlines()[-1]
    assert re.fullmatch(r'eval "\$\(\S+ -m torch_adreno native env --build-dir ' + re.escape(shlex.quote(
        str(native.build_dir))) + r'\)"', last), last


def test_native_env_puts_the_binary_on_path_and_python_finds_each_runtime_once(native, platforms) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_VENDORS", "PYOPENCL_HOME",
                                                            "TORCH_ADRENO_OPENCL_LIBRARY", "OCL_ICD_FILENAMES")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    script = (f'eval "$({shlex.quote(sys.executable)} -m torch_adreno native env --build-dir '
              f'{shlex.quote(str(native.build_dir))})" && command -v torch-adreno-step && torch-adreno-step devices && '
              f'{shlex.quote(sys.executable)} -c "import torch_adreno, pyopencl as cl; '
              'print([p.name.strip() for p in cl.get_platforms()])"')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == str(native.executable)
    listed = ast.literal_eval(lines[-1])
    assert len(listed) == len(set(listed)) and set(platforms) <= set(listed), listed
    native_listed = [line for line in lines[1:-1] if re.match(r"\[\d+\] ", line)]
    assert len(native_listed) == len(listed) and all(any(p in line for line in native_listed) for p in platforms)


def test_the_binarys_opencl_load_errors_name_native_env(native, tmp_path) -> None:
    fix = 'eval "$(python -m torch_adreno native env)"'
    env = dict(os.environ, TORCH_ADRENO_OPENCL_LIBRARY=str(tmp_path / "libOpenCL.so"))
    done = subprocess.run([str(native.executable), "devices"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "cannot load the OpenCL library" in done.stderr and fix in done.stderr, done.stderr
    if ctypes.util.find_library("OpenCL") is None:  # (else a system library is found: nothing to report)
        env.pop("TORCH_ADRENO_OPENCL_LIBRARY")
        done = subprocess.run([str(native.executable), "devices"], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 2 and "no OpenCL library found" in done.stderr and fix in done.stderr, done.stderr
