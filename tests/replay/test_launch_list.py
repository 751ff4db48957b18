"""The launch list: the C loop enqueues exactly what the Python loop does, in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

from torch_adreno.replay import launch_list
from torch_adreno.replay.launch_list import Copy, Flush, Launch, LaunchError, LaunchList

pytestmark = pytest.mark.device

# Order-sensitive: x = 2x + 1 then a copy; a swapped pair gives different numbers.
_SOURCE = "__kernel void affine(__global float* x) { size_t i = get_global_id(0); x[i] = 2.0f * x[i] + 1.0f; }"


def _run(native: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    context = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(context)
    kernel = cl.Kernel(cl.Program(context, _SOURCE).build(), "affine")
    values = np.arange(64, dtype=np.float32)
    first = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=values)
    second = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
    kernel.set_arg(0, first)
    seen: list[str] = []
    listed = LaunchList(queue, [Launch(kernel, (64,), (16,)), Copy(first, second, 0, 64, 128), Flush(),
                                lambda q: seen.append("python"), Launch(kernel, (32,), None)], native=native)
    assert listed.native == (native and launch_list.native_loop() is not None)
    listed()
    listed()
    out_first, out_second = np.empty(64, np.float32), np.empty(64, np.float32)
    cl.enqueue_copy(queue, out_first, first)
    cl.enqueue_copy(queue, out_second, second)
    return out_first, out_second, seen


def test_native_loop_matches_python_loop() -> None:
    if launch_list.native_loop() is None:
        pytest.fail(f"the C loop is not available here: {launch_list.native_loop_status()}")
    native, python = _run(True), _run(False)
    assert np.array_equal(native[0], python[0]) and np.array_equal(native[1], python[1])
    assert native[2] == python[2] == ["python", "python"]
    expected = np.arange(64, dtype=np.float32)
    for _ in range(2):
        expected[:] = 2 * expected + 1
        copied = expected[:32].copy()
        expected[:32] = 2 * expected[:32] + 1
    assert np.array_equal(native[0], expected)
    assert np.array_equal(native[1][16:48], copied)


@pytest.mark.parametrize("native", [True, False], ids=["C-loop", "Python-loop"])
def test_refused_launch_names_the_kernel(native: bool) -> None:
    if native and launch_list.native_loop() is None:
        pytest.fail(f"the C loop is not available here: {launch_list.native_loop_status()}")
    context = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(context)
    program = cl.Program(context, _SOURCE).build()
    kernel = cl.Kernel(program, "affine")  # argument never bound
    with pytest.raises(LaunchError, match=r"operation 0 .*\(kernel affine\).*error -52 \(INVALID_KERNEL_ARGS\)"):
        LaunchList(queue, [Launch(kernel, (64,), None)], native=native)()
    # A kernel run by another's function (equal content, one function of the program): named by
    # its own name, the function after it.
    bound = cl.Kernel(program, "affine")
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, 256)  # (an argument holds no reference)
    bound.set_arg(0, buffer)
    listed = LaunchList(queue, [Launch(bound, (64,), None, "g_3_0_affine"), Launch(kernel, (64,), None, "g_3_12_affine")],
                        native=native)
    with pytest.raises(LaunchError, match=r"operation 1 of a launch list \(kernel g_3_12_affine \(program function "
                                          r"affine\)\): error -52"):
        listed()


def test_bad_launch_geometry_is_refused_at_construction() -> None:
    context = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(context)
    kernel = cl.Kernel(cl.Program(context, _SOURCE).build(), "affine")
    if launch_list.native_loop() is None:
        pytest.skip(launch_list.native_loop_status())
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        LaunchList(queue, [Launch(kernel, (1, 1, 1, 1), None)])


def test_switched_off_the_python_loop_runs_the_same_list_and_warns_once(tmp_path) -> None:
    """TORCH_ADRENO_NATIVE_LOOP=0 (read once per process, hence a subprocess): the same results,
    one RuntimeWarning naming the reason, and devices reports it."""
    script = tmp_path / "off.py"
    script.write_text(
        "import sys, warnings\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "import numpy as np\n"
        "from test_launch_list import _run\n"
        "from torch_adreno.replay import launch_list\n"
        "assert launch_list.native_loop() is None, launch_list.native_loop_status()\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    first, second, seen = _run(True)\n"
        "messages = [str(w.message) for w in caught if w.category is RuntimeWarning]\n"
        "assert len(messages) == 1 and 'TORCH_ADRENO_NATIVE_LOOP=0' in messages[0], messages\n"
        "np.save(sys.argv[1], np.concatenate([first, second]))\n"
        "print(launch_list.native_loop_status())\n")
    out = tmp_path / "off.npy"
    result = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TORCH_ADRENO_NATIVE_LOOP": "0"}, check=False)
    assert result.returncode == 0, result.stderr
    assert "off (TORCH_ADRENO_NATIVE_LOOP=0)" in result.stdout
    first, second, _ = _run(False)
    assert np.array_equal(np.load(out), np.concatenate([first, second]))


@pytest.mark.parametrize("native", [True, False], ids=["C-loop", "Python-loop"])
def test_fills_write_the_pattern_in_order_and_a_fill_past_the_buffer_is_refused(native: bool) -> None:
    from torch_adreno.replay.launch_list import Fill
    from torch_adreno.runner.format import FILL_PATTERN

    if native and launch_list.native_loop() is None:
        pytest.fail(f"the C loop is not available here: {launch_list.native_loop_status()}")
    context = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(context)
    kernel = cl.Kernel(cl.Program(context, _SOURCE).build(), "affine")
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(64, np.float32))
    kernel.set_arg(0, buffer)
    fills = Fill.of(buffer, 8, 13)  # 12 bytes of the pattern, then its first byte alone
    assert [(f.offset, f.nbytes, f.pattern) for f in fills] == [(8, 12, FILL_PATTERN), (20, 1, FILL_PATTERN[:1])]
    # The launch runs before the fills (2 * 0 + 1 everywhere), then the fills overwrite bytes 8-20.
    LaunchList(queue, [Launch(kernel, (64,), None), *fills], native=native)()
    out = np.empty(64 * 4, np.uint8)
    cl.enqueue_copy(queue, out, buffer)
    ones = np.full(64, 1.0, np.float32).view(np.uint8)
    assert bytes(out[8:21]) == (FILL_PATTERN * 7)[:13]
    assert np.array_equal(out[:8], ones[:8]) and np.array_equal(out[21:], ones[21:])
    with pytest.raises(LaunchError, match=r"operation 1 of a launch list \(fill\)"):
        LaunchList(queue, [Flush(), Fill(buffer, 256, 2)], native=native)()
    with pytest.raises(ValueError, match="multiples of its length"):
        Fill(buffer, 1, 2)
