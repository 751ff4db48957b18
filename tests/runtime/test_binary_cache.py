"""The program-binary cache: a second process compiles nothing, bad entries are rebuilt, keys
separate what must be separate."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest
import torch
from test_kernels import compile_stages

import torch_adreno
from torch_adreno import ir
from torch_adreno.errors import OptionError
from torch_adreno.kernels import KernelSource, graph_stem, kernel_name, kernel_symbol
from torch_adreno.kernels.params import buffer_record
from torch_adreno.kernels.program import (
    HELPER_NAMING,
    HELPER_NAMING_MACROS,
    assemble,
    kernel_opening,
)
from torch_adreno.runtime import get_runtime
from torch_adreno.runtime.binary_cache import (
    ENV_DIR,
    ENV_ENABLE,
    MAGIC,
    build_stats,
    cache_directory,
    cache_enabled,
    forget_programs,
    get_program,
    program_key,
    reset_build_stats,
)
from torch_adreno.runtime.build import build_kernels

PACKAGE_ROOT = Path(torch_adreno.__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory of this test's own, the cache on (``auto`` leaves it off on PoCL),
    and no program built in this process yet."""
    directory = tmp_path / "programs"
    monkeypatch.setenv(ENV_DIR, str(directory))
    monkeypatch.setenv(ENV_ENABLE, "1")
    forget_programs()
    reset_build_stats()
    yield directory
    forget_programs()


def _source(tag: str) -> str:
    # The tag makes the program new to this process and to the cache (tests share neither).
    return (f"// {tag}\n__kernel void affine(__global float* x, const float a) {{\n"
            "    const size_t i = get_global_id(0);\n    x[i] = x[i] * a + 1.0f;\n}\n")


def _run_affine(program: cl.Program) -> np.ndarray:
    runtime = get_runtime()
    host = np.arange(64, dtype=np.float32)
    buf = cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    kernel = cl.Kernel(program, "affine")
    kernel.set_args(buf, np.float32(3.0))
    cl.enqueue_nd_range_kernel(runtime.queue, kernel, (64,), None)
    out = np.empty_like(host)
    cl.enqueue_copy(runtime.queue, out, buf).wait()
    return out


def _expected_affine() -> np.ndarray:
    return np.arange(64, dtype=np.float32) * 3.0 + 1.0


# Compiles an unrelated graph first (so the graphs get other numbers than in the parent process),
# then the parent's function; reports the build counters of the second and checks its result.
_CHILD = """
import json, torch, torch_adreno
from torch_adreno.runtime.binary_cache import build_stats, reset_build_stats
torch.compile(lambda x: x - 3.0, backend="adreno", dynamic=False)(torch.ones(5))
reset_build_stats()
f = torch.compile(lambda x: torch.relu(x) * 2.0 + x.sum(), backend="adreno", dynamic=False)
x = torch.linspace(-2.0, 2.0, 37)
torch.testing.assert_close(f(x), torch.relu(x) * 2.0 + x.sum())
s = build_stats()
print(json.dumps({"source": s.programs_from_source, "cache": s.programs_from_cache}))
"""


@pytest.mark.device
def test_second_process_compiles_nothing(cache):
    f = torch.compile(lambda x: torch.relu(x) * 2.0 + x.sum(), backend="adreno", dynamic=False)
    x = torch.linspace(-2.0, 2.0, 37)
    torch.testing.assert_close(f(x), torch.relu(x) * 2.0 + x.sum())
    assert build_stats().programs_from_source >= 1
    assert list(cache.glob("*.bin")), "a source build writes its binary"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["source"] == 0 and counts["cache"] >= 1, counts


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    binary = data[len(MAGIC) + 32:]
    if how == "flipped byte":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    elif how == "truncated":  # PoCL crashes on a truncated binary: the checksum must catch it
        path.write_bytes(data[: len(data) // 2])
    elif how == "wrong format":
        path.write_bytes(b"XXXXXXXX" + data[8:])
    elif how == "rejected by the driver":
        garbage = b"not a program binary" * 8
        path.write_bytes(MAGIC + hashlib.sha256(garbage).digest() + garbage)
    elif how == "another program":  # intact and loadable, but without the kernel asked for
        other = get_program(get_runtime().context, get_runtime().device,
                            "__kernel void other(__global float* x) { x[0] = 0.0f; }", ())
        forget_programs()
        payload = other.get_info(cl.program_info.BINARIES)[0]
        path.write_bytes(MAGIC + hashlib.sha256(payload).digest() + payload)
        assert payload != binary


@pytest.mark.device
@pytest.mark.parametrize("how", ["flipped byte", "truncated", "wrong format", "rejected by the driver",
                                 "another program"])
def test_bad_entry_is_replaced(cache, how):
    runtime = get_runtime()
    source = _source(f"bad entry: {how}")
    get_program(runtime.context, runtime.device, source, ["-cl-mad-enable"], ["affine"])
    (entry,) = cache.glob("*.bin")
    forget_programs()
    _corrupt(entry, how)
    reset_build_stats()
    program = get_program(runtime.context, runtime.device, source, ["-cl-mad-enable"], ["affine"])
    stats = build_stats()
    assert (stats.entries_rejected, stats.programs_from_source, stats.programs_from_cache) == (1, 1, 0)
    np.testing.assert_allclose(_run_affine(program), _expected_affine())
    # The rebuilt entry is good again.
    forget_programs()
    reset_build_stats()
    program = get_program(runtime.context, runtime.device, source, ["-cl-mad-enable"], ["affine"])
    assert (build_stats().programs_from_cache, build_stats().entries_rejected) == (1, 0)
    np.testing.assert_allclose(_run_affine(program), _expected_affine())


@pytest.mark.device
def test_key_separates_source_options_and_nothing_else():
    device = get_runtime().device
    base = program_key(_source("key"), ["-cl-mad-enable"], device)
    assert program_key(_source("key"), ["-cl-mad-enable"], device) == base
    assert program_key(_source("key"), ["-cl-fast-relaxed-math"], device) != base
    assert program_key(_source("key"), [], device) != base
    assert program_key(_source("key") + " ", ["-cl-mad-enable"], device) != base
    assert program_key(_source("other"), ["-cl-mad-enable"], device) != base


def _kernel(name: str, symbol: str, increment: float = 1.0) -> KernelSource:
    """A kernel adding ``increment`` to x[0] through a helper named after its symbol (as the GEMM's are)."""
    text = "\n".join([*HELPER_NAMING, f"inline float KERNEL_HELPER(_f)(float v) {{ return v + {increment}f; }}",
                      *kernel_opening(), "    const float t0 = x[0];", "    x[0] = KERNEL_HELPER(_f)(t0);", "}"])
    return KernelSource(name=name, symbol=symbol, kind="pointwise", text=text, build_options=(),
                        arguments=(buffer_record("x", "x", ir.DType.F32, written=True),), global_size=(1,),
                        local_size=(1,), origins=(), bytes_read=4, bytes_written=4, macros=HELPER_NAMING_MACROS)


@pytest.mark.device
def test_graph_numbers_do_not_change_the_program(cache):
    runtime = get_runtime()
    # (Two contents: kernels of one content would be one function, tests/frontend/test_compile_once.py.)
    first = build_kernels(runtime, [_kernel("forward_3_0_pw_add", "forward_0_pw_add"),
                                    _kernel("forward_3_1_pw_add", "forward_1_pw_add", 2.0)])
    second = build_kernels(runtime, [_kernel("forward_41_0_pw_add", "forward_0_pw_add"),
                                     _kernel("forward_41_1_pw_add", "forward_1_pw_add", 2.0)])
    assert set(second) == {"forward_41_0_pw_add", "forward_41_1_pw_add"} and len(first) == 2
    assert second["forward_41_1_pw_add"].function_name == "forward_1_pw_add"
    stats = build_stats()
    assert (stats.programs_from_source, stats.programs_reused) == (1, 1)
    # Each kernel calls its own helper (named through KERNEL_HELPER): x[0] + 1.
    buf = cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=np.array([2.0], np.float32))
    kernel = second["forward_41_0_pw_add"]
    kernel.set_arg(0, buf)
    cl.enqueue_nd_range_kernel(runtime.queue, kernel, (1,), (1,))
    out = np.empty(1, np.float32)
    cl.enqueue_copy(runtime.queue, out, buf).wait()
    assert out[0] == 3.0


def test_kernels_of_one_program_must_differ_in_symbol():
    # Two graphs' kernels differing only in their graph's number share a symbol: never one program.
    with pytest.raises(ValueError, match=r"share the symbol.*forward_0_pw_add"):
        assemble([_kernel("forward_3_0_pw_add", "forward_0_pw_add"), _kernel("forward_4_0_pw_add", "forward_0_pw_add")])


def test_a_symbol_drops_only_the_graph_number():
    assert graph_stem("forward_12") == "forward" and graph_stem("backward_0") == "backward"
    assert graph_stem("t1") == "t1" and graph_stem("g") == "g" and graph_stem("_3") == "_3"
    _, fused, _, _ = compile_stages(lambda x: torch.relu(x) * 2, torch.randn(4, 10))
    group = fused.groups[0]
    assert kernel_name("forward_12", 3, group) == "forward_12_3_pw_mul_relu"
    assert kernel_symbol("forward_12", 3, group) == "forward_3_pw_mul_relu"
    assert kernel_symbol("g", 3, group) == kernel_name("g", 3, group) == "g_3_pw_mul_relu"


def test_disabled_cache_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv(ENV_ENABLE, "0")
    assert not cache_enabled(get_runtime().device)
    runtime = get_runtime()
    for _ in range(2):
        forget_programs()
        program = get_program(runtime.context, runtime.device, _source("disabled"), [], ["affine"])
    np.testing.assert_allclose(_run_affine(program), _expected_affine())
    assert build_stats().programs_from_source == 2 and not cache.exists()


@pytest.mark.device
def test_unwritable_directory_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv(ENV_DIR, str(blocker / "programs"))
    monkeypatch.setenv(ENV_ENABLE, "1")
    forget_programs()
    reset_build_stats()
    runtime = get_runtime()
    program = get_program(runtime.context, runtime.device, _source("unwritable"), [], ["affine"])
    np.testing.assert_allclose(_run_affine(program), _expected_affine())
    assert (build_stats().programs_from_source, build_stats().write_failures) == (1, 1)
    forget_programs()


def test_directory_follows_the_environment(tmp_path):
    assert cache_directory({ENV_DIR: str(tmp_path)}) == tmp_path
    assert cache_directory({"TORCH_ADRENO_CACHE": str(tmp_path)}) == tmp_path / "programs"
    assert cache_directory({}) == Path.home() / ".cache" / "torch_adreno" / "programs"


@pytest.mark.device
def test_switch():
    device = get_runtime().device
    assert cache_enabled(device, {ENV_ENABLE: "1"}) and cache_enabled(device, {ENV_ENABLE: "On"})
    assert not cache_enabled(device, {ENV_ENABLE: "0"}) and not cache_enabled(device, {ENV_ENABLE: "off"})
    pocl = device.platform.name.strip() == "Portable Computing Language"
    assert cache_enabled(device, {}) == cache_enabled(device, {ENV_ENABLE: "auto"}) == (not pocl)
    with pytest.raises(OptionError, match=ENV_ENABLE):
        cache_enabled(device, {ENV_ENABLE: "sometimes"})


@pytest.mark.device
@pytest.mark.parametrize("model_name", ["lenet", "transformer"])
def test_a_training_step_compiled_under_other_graph_numbers_is_the_same_program(model_name, monkeypatch):
    """Otherwise the graph's program is a binary-cache miss whenever it gets another number (a
    second model compiled first, a recompile): the kernels' text names only their symbols, which
    carry no graph number (split-K's second launch included)."""
    import torch.nn.functional as F
    from helpers import record_programs

    from torch_adreno.models import MODELS

    programs = record_programs(monkeypatch)
    spec = MODELS[model_name]
    model = spec.make()
    x, y = spec.batch()
    for _ in range(2):  # compiled twice (Dynamo's cache cleared between): two regions, other graph numbers
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="adreno",
                                 options={"compile_cache": False}, dynamic=False)
        reset_build_stats()
        compiled(x, y).backward()
    assert len(programs) == 4
    first, second = programs[:2], programs[2:]
    for a, b in zip(first, second, strict=True):
        assert a.graph.name != b.graph.name
        assert [k.name for k in a.kernels] != [k.name for k in b.kernels]
        assert [k.symbol for k in a.kernels] == [k.symbol for k in b.kernels]
        assert all(k.source.startswith(f"// kernel {k.symbol}:") for k in b.kernels)
        assert assemble(a.kernels) == assemble(b.kernels), f"{b.graph.name}: its text depends on its graph number"
    stats = build_stats()
    assert stats.programs_from_source == 0 and stats.programs_reused >= 2, stats
