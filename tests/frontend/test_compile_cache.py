"""The compile cache: compiled graphs kept in PyTorch's AOTAutograd cache (torch_adreno.frontend.compile_cache).

A hit must give the very same results as a compile, under the current region's names; anything
that changes the compiled program (options, input metadata, constants) must miss; what cannot be
cached must still compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import adreno_with
from torch._dynamo.utils import counters

import torch_adreno
from torch_adreno.frontend import compile_cache
from torch_adreno.frontend.compile_cache import CompiledGraph
from torch_adreno.kernels import KernelChoices

pytestmark = [pytest.mark.device,
              pytest.mark.skipif(not compile_cache.AVAILABLE, reason="this torch has no bundled AOTAutograd cache")]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_ADRENO_COMPILE_CACHE", raising=False)
    return tmp_path


def _aot_counts() -> dict[str, int]:
    return dict(counters["aot_autograd"])


def _delta(before: dict[str, int]) -> dict[str, int]:
    after = _aot_counts()
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("autograd_cache_hit", "autograd_cache_miss",
                                                             "autograd_cache_bypass")}


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, options: dict | None = None,
          kernel_choices=None):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    compiled = torch.compile(loss_fn, backend=adreno_with(kernel_choices), options=options or {}, dynamic=False)
    loss = compiled(x, y)
    loss.backward()
    return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]


def _model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    return model, torch.randn(8, 12), torch.randint(0, 5, (8,))


def test_hit_gives_the_compiled_results_under_the_new_regions_names(cache_dir: Path) -> None:
    model, x, y = _model_and_batch()
    before = _aot_counts()
    loss, grads = _step(model, x, y)
    assert _delta(before) == {"autograd_cache_hit": 0, "autograd_cache_miss": 1, "autograd_cache_bypass": 0}
    assert list((cache_dir / "aotautograd").iterdir()), "the entry was written"

    bound: list[str] = []
    original = CompiledGraph.bind

    def recording(graph: CompiledGraph):
        if graph.executable is None:
            name = graph.program.graph.name
            bound.append(name)
            for kernel in graph.program.kernels:
                # Renamed, text unchanged: the text names the symbol, which has no region number.
                assert kernel.name.startswith(f"{name}_") and kernel.source.startswith(f"// kernel {kernel.symbol}:")
                stem = name.rsplit("_", 1)[0]
                assert kernel.symbol == f"{stem}_{kernel.name.removeprefix(f'{name}_')}"
                assert kernel.name not in kernel.source
        return original(graph)

    before = _aot_counts()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CompiledGraph, "bind", recording)
        # Lowering must not run on a hit: make it fail loudly if it does.
        patch.setattr("torch_adreno.frontend.pipeline.lower_graph", lambda *a, **k: pytest.fail("lowered on a hit"))
        hit_loss, hit_grads = _step(model, x, y)
    assert _delta(before) == {"autograd_cache_hit": 1, "autograd_cache_miss": 0, "autograd_cache_bypass": 0}
    assert torch.equal(hit_loss, loss)
    for a, b in zip(hit_grads, grads, strict=True):
        assert torch.equal(a, b)
    # The loaded graphs carry the region compiled now, not the one that wrote the entry.
    regions = {name.rsplit("_", 1)[1] for name in bound}
    assert sorted(n.rsplit("_", 1)[0] for n in bound) == ["backward", "forward"] and len(regions) == 1
    expected = F.cross_entropy(model(x), y)
    assert torch.allclose(hit_loss, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change", ["option", "shape", "stride", "constant"])
def test_what_changes_the_program_misses(cache_dir: Path, change: str) -> None:
    def run(scale: float, options: dict, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.reset()
        return torch.compile(lambda x: torch.tanh(x) * scale, backend="adreno", options=options, dynamic=False)(x)

    x = torch.randn(6, 4)
    run(1.0, {}, x)
    # Positive control: the same compile again, with new values of the same geometry, hits.
    before = _aot_counts()
    run(1.0, {}, torch.randn(6, 4))
    assert _delta(before)["autograd_cache_hit"] == 1
    inputs, scale, options = {
        "option": (x, 1.0, {"fusion": False}),
        "shape": (torch.randn(7, 4), 1.0, {}),
        "stride": (torch.randn(4, 6).t(), 1.0, {}),
        "constant": (x, 2.0, {}),  # a Python float: a literal in the graph's code
    }[change]
    before = _aot_counts()
    out = run(scale, options, inputs)
    assert _delta(before)["autograd_cache_hit"] == 0
    torch.testing.assert_close(out, torch.tanh(inputs) * scale)


def test_tensors_read_by_the_graph_are_inputs_not_part_of_the_key(cache_dir: Path) -> None:
    x = torch.randn(6, 4)
    for scale in (1.0, 3.0):
        torch._dynamo.reset()
        weight = torch.full((4,), scale)
        before = _aot_counts()
        out = torch.compile(lambda x, w=weight: torch.tanh(x) * w, backend="adreno", dynamic=False)(x)
        torch.testing.assert_close(out, torch.tanh(x) * scale)
    assert _delta(before)["autograd_cache_hit"] == 1, "the second closure differs in value only: a hit"


def test_default_dtype_and_aliased_inputs_miss(cache_dir: Path) -> None:
    """A constant made under another default dtype, or inputs sharing memory, change the program."""
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * torch.ones(3)

    def update(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(2)
        return a + b

    for fn, first, second, context in [
        (scaled, (torch.ones(3),), (torch.ones(3),), lambda: _default_dtype(torch.float64)),
        (update, (torch.arange(4.0), torch.arange(4.0)), None, contextlib.nullcontext),
    ]:
        torch._dynamo.reset()
        torch.compile(fn, backend="adreno", dynamic=False)(*first)
        if second is None:
            base = torch.arange(4.0)
            second = (base[0:4], base[0:4])
        torch._dynamo.reset()
        before = _aot_counts()
        # What a compile without the cache does with these (unsupported ops) is not the question here.
        with context(), contextlib.suppress(Exception):
            torch.compile(fn, backend="adreno", dynamic=False)(*second)
        assert _delta(before)["autograd_cache_hit"] == 0, fn.__name__


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("dynamic", [False, True])
def test_retain_graph_without_memory_reuse(cache_dir: Path, dynamic: bool) -> None:
    """The backward is compiled with the forward when the cache is on; a second backward over the
    same graph is still allowed where our memory plan allows it (memory_reuse=False)."""
    model, x, y = _model_and_batch()
    before = _aot_counts()
    for _ in ("miss", "hit"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, t: F.cross_entropy(model(x), t), backend="adreno",
                                 options={"memory_reuse": False}, dynamic=dynamic)
        for batch in (x, x[:6]) if dynamic else (x,):
            model.zero_grad(set_to_none=True)
            loss = compiled(batch, y[: len(batch)])
            loss.backward(retain_graph=True)
            loss.backward()
            got = [p.grad.clone() for p in model.parameters()]
            model.zero_grad(set_to_none=True)
            expected = F.cross_entropy(model(batch), y[: len(batch)])
            expected.backward()
            torch.testing.assert_close(loss, expected.detach())
            for g, p in zip(got, model.parameters(), strict=True):  # two backwards: twice the gradient
                torch.testing.assert_close(g, 2 * p.grad, rtol=1e-4, atol=1e-5)
    assert _delta(before)["autograd_cache_hit"] >= 1


def test_host_fallback_graphs_compile_without_the_cache(cache_dir: Path) -> None:
    def second_smallest_twice(x: torch.Tensor) -> torch.Tensor:
        return torch.kthvalue(x, 2, 0).values * 2  # no lowering: runs on the host

    before = _aot_counts()
    for _ in range(2):
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = torch.compile(second_smallest_twice, backend="adreno", options={"fallback": "host"},
                                dynamic=False)(torch.arange(5.0, 0, -1))
        torch.testing.assert_close(out, torch.tensor(4.0))
    # Each compile looked the graph up (a miss) and declined to save it (a bypass).
    assert _delta(before) == {"autograd_cache_hit": 0, "autograd_cache_miss": 2, "autograd_cache_bypass": 2}


def test_debug_dir_and_the_option_turn_it_off(cache_dir: Path, tmp_path: Path) -> None:
    model, x, y = _model_and_batch()
    _step(model, x, y)
    for options in ({"debug_dir": str(tmp_path / "debug")}, {"compile_cache": False}):
        before = _aot_counts()
        _step(model, x, y, options)
        assert _delta(before) == {"autograd_cache_hit": 0, "autograd_cache_miss": 0, "autograd_cache_bypass": 0}
    assert list((tmp_path / "debug").rglob("*.cl")), "a debug compile writes its kernels"


_CHILD = textwrap.dedent("""
    import json, sys, time
    import torch, torch.nn.functional as F
    import torch_adreno
    from torch._dynamo.utils import counters
    from torch_adreno.models import MODELS

    spec = MODELS["lenet"]
    torch.manual_seed(0)
    model = spec.make()
    x, y = spec.batch(torch.Generator().manual_seed(0))
    compiled = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="adreno", dynamic=False)
    loss = compiled(x, y)
    loss.backward()
    print(json.dumps({"loss": loss.item(), "grad": [p.grad.double().sum().item() for p in model.parameters()],
                      "counters": dict(counters["aot_autograd"])}))
""")


def test_a_second_process_loads_what_the_first_compiled(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONPATH": path}
    env.pop("TORCH_ADRENO_COMPILE_CACHE", None)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["counters"].get("autograd_cache_miss") == 1
    assert runs[1]["counters"].get("autograd_cache_hit") == 1
    assert runs[1]["loss"] == runs[0]["loss"] and runs[1]["grad"] == runs[0]["grad"]


def _other_template(choices: KernelChoices) -> KernelChoices:
    return choices.with_gemm_template("direct" if choices.tiled else "tiled")


def _other_split(choices: KernelChoices) -> KernelChoices:
    fill = None if choices.split.fill_units else choices.tile_fill_units
    return dataclasses.replace(choices, split=dataclasses.replace(choices.split, fill_units=fill))


@pytest.mark.parametrize("change", [_other_template, _other_split])
def test_a_changed_kernel_choice_misses(cache_dir: Path, change) -> None:
    """The kernel choices made for the device (the GEMM template, the split-K policy, ...) are in
    the key: where a compile makes other ones (a test picking a template), the entry of the
    device's choices is not served. Positive controls: the device's choices, made again, hit; so
    does an unchanged choice handed to the backend as an override."""
    model, x, y = _model_and_batch()
    _step(model, x, y)
    before = _aot_counts()
    _step(model, x, y, kernel_choices=lambda choices: choices)
    assert _delta(before)["autograd_cache_hit"] == 1, "the same choices hit"
    before = _aot_counts()
    loss, _ = _step(model, x, y, kernel_choices=change)
    assert _delta(before) == {"autograd_cache_hit": 0, "autograd_cache_miss": 1, "autograd_cache_bypass": 0}
    torch.testing.assert_close(loss, F.cross_entropy(model(x), y))


def test_the_same_graph_from_another_source_line_misses(cache_dir: Path) -> None:
    """Kernels carry the source lines and module paths of their ops into profiles: a graph traced
    from other code must not be loaded under this code's names."""
    x = torch.randn(6, 4)
    before = _aot_counts()
    for fn in (lambda x: torch.tanh(x) * 2,
               lambda x: torch.tanh(x) * 2):  # the same graph code, from the next line
        torch._dynamo.reset()
        with torch_adreno.profile() as prof:
            torch.compile(fn, backend="adreno", dynamic=False)(x)
        lines = {line for k in prof.kernels for line in k.source_lines}
        assert lines and all(fn.__code__.co_filename in line for line in lines)
        assert any(f":{fn.__code__.co_firstlineno}:" in line for line in lines), lines
    assert _delta(before)["autograd_cache_hit"] == 0


def test_the_source_hash_covers_every_stage_of_the_package() -> None:
    # (It once hashed frontend/ alone: an edit of the fusion or kernel stages kept stale entries.)
    files = {p.relative_to(compile_cache.PACKAGE_ROOT).as_posix() for p in compile_cache.source_files()}
    assert {"frontend/compile_cache.py", "fusion/split_reductions.py", "kernels/gemm.cl",
            "lowering/conv.py", "memory/plan.py", "runtime/device.py", "training/step.py",
            "replay/step.py"} <= files
