"""Repeated identical blocks compile once: kernels of equal content are one
function of their program, built once and tuned once, while every launch keeps its own name and
FX nodes (profiles attribute time per FX op) and computes what eager does."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch._dynamo
from helpers import capture_graphs, cross_entropy_loss, eager_training_step
from torch import nn

import torch_adreno
from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.fusion import fuse
from torch_adreno.kernels import render_program
from torch_adreno.kernels.params import buffer_record
from torch_adreno.kernels.program import (
    HELPER_NAMING,
    HELPER_NAMING_MACROS,
    KernelSource,
    assemble_program,
    kernel_opening,
)
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import plan_memory
from torch_adreno.replay import arena_kernels as replay_kernels
from torch_adreno.replay.arena_kernels import build_placed
from torch_adreno.runtime import get_runtime, tuning
from torch_adreno.runtime.binary_cache import ENV_ENABLE, build_stats, forget_programs, reset_build_stats
from torch_adreno.runtime.build import build_kernels
from torch_adreno.targets import REFERENCE_PROFILE


def _kernel(name: str, symbol: str, node: str, increment: float = 1.0) -> KernelSource:
    """``x[0] += increment`` through a helper named after the symbol, from FX node ``node``."""
    text = "\n".join([*HELPER_NAMING, f"inline float KERNEL_HELPER(_f)(float v) {{ return v + {increment}f; }}",
                      *kernel_opening(), "    x[0] = KERNEL_HELPER(_f)(x[0]);", "}"])
    return KernelSource(name=name, symbol=symbol, kind="pointwise", text=text, build_options=(),
                        arguments=(buffer_record("x", "x", ir.DType.F32, written=True),), global_size=(1,),
                        local_size=(1,), origins=(ir.Origin(node, "aten.add.Tensor"),), bytes_read=4,
                        bytes_written=4, description="adds", macros=HELPER_NAMING_MACROS)


def test_kernels_of_equal_content_are_one_function_naming_every_fx_node():
    kernels = [_kernel("g_7_0_pw_add", "g_0_pw_add", "add"), _kernel("g_7_1_pw_add", "g_1_pw_add", "add_1", 2.0),
               _kernel("g_7_2_pw_add", "g_2_pw_add", "add_2")]
    text = assemble_program(kernels)
    assert text.functions == {"g_7_0_pw_add": "g_0_pw_add", "g_7_1_pw_add": "g_1_pw_add",
                              "g_7_2_pw_add": "g_0_pw_add"}
    assert text.function_count == 2
    assert text.source.count("__kernel") == 2 and "g_2_pw_add" not in text.source.replace(
        "// kernel g_2_pw_add (run by g_0_pw_add below)", "")
    for node in ("add", "add_1", "add_2"):
        assert f"from FX node {node} (aten.add.Tensor)" in text.source
    # The build options are part of the content: another -D value is another function.
    other = dataclasses.replace(kernels[2], build_options=("-DFOO=2",))
    assert assemble_program([kernels[0], other]).function_count == 2
    with pytest.raises(ValueError, match="share the symbol"):
        assemble_program([kernels[0], dataclasses.replace(kernels[2], symbol="g_0_pw_add")])


class Block(nn.Module):
    """A pre-LN residual MLP block: what a transformer repeats, without attention."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))


def _stack(blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), *(Block(16) for _ in range(blocks)), nn.Linear(16, 5))


def _compile_and_check(blocks: int, backward: bool) -> tuple[dict[str, int], torch_adreno.profile]:
    """``blocks`` blocks compiled cold (no program built in this process before; the caller turns
    the binary cache off) and run forward (the training forward, saving what the backward reads)
    and, with ``backward``, backward: the build counters and the profile of the run. The loss
    (and the gradients) are eager's."""
    model, reference = _stack(blocks), _stack(blocks)
    x, y = torch.randn(6, 12, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 3, 4, 0])
    torch._dynamo.reset()
    forget_programs()
    reset_build_stats()
    compiled = torch.compile(model, backend="adreno", options={"compile_cache": False}, dynamic=False)
    with torch_adreno.profile() as prof:
        loss = nn.functional.cross_entropy(compiled(x), y)
        if backward:  # (AOTAutograd compiles the backward graph at the first backward)
            loss.backward()
    stats = build_stats()
    ref_loss = nn.functional.cross_entropy(reference(x), y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    if backward:
        ref_loss.backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, n=name: f"gradient of {n}: {m}")
    counts = {"requested": stats.kernels_requested, "unique": stats.kernels_unique,
              "from_source": stats.kernels_from_source, "programs": stats.programs_from_source}
    assert counts["from_source"] == counts["unique"], counts  # each distinct kernel compiled once
    return counts, prof


@pytest.mark.device
def test_a_forward_of_identical_blocks_builds_one_blocks_kernels(monkeypatch):
    monkeypatch.setenv(ENV_ENABLE, "0")  # every program compiled here, from source
    # The first and last blocks' kernels differ from the inner ones' (which read a block's output,
    # not the model's input, and feed a block, not the head): three blocks have them all.
    three, _ = _compile_and_check(3, backward=False)
    five, prof = _compile_and_check(5, backward=False)
    # Two more blocks: two blocks' more launches, not one more distinct kernel.
    assert five["requested"] - three["requested"] >= 2 * 3 and five["unique"] == three["unique"], (three, five)
    assert five["programs"] == three["programs"] == 1
    # Every launch still has a name of its own and the FX nodes it came from.
    names = [k.name for k in prof.kernels]
    assert len(names) == len(set(names)) == five["requested"]
    gemm_nodes = [k.fx_nodes for k in prof.kernels if any(op.startswith("aten.addmm") for op in k.aten_ops)]
    assert len(gemm_nodes) == 2 * 5 + 2 and len(set(gemm_nodes)) == len(gemm_nodes)


def _program_functions(blocks: int) -> tuple[int, int]:
    """Launches of the training forward and backward of ``blocks`` blocks as the stages render
    them, and the functions of their programs (nothing built)."""
    model = _stack(blocks)
    names = [n for n, _ in model.named_parameters()]

    def loss(x, *params):
        logits = torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,))
        return nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3, 4, 0]))

    params = [p.detach().requires_grad_() for p in model.parameters()]
    launches = functions = 0
    for index, gm in enumerate(capture_graphs(loss, torch.randn(6, 12), *params)):
        graph = lower_graph(gm, Config(), f"g{index}", None)
        fused = fuse(graph, Config())
        kernels = render_program(fused, plan_memory(fused, REFERENCE_PROFILE), REFERENCE_PROFILE).kernels
        launches += len(kernels)
        functions += assemble_program(kernels).function_count
    return launches, functions


def test_training_programs_of_identical_blocks_have_a_constant_number_of_functions():
    """Constant from four blocks on: the first and last blocks' kernels differ from the inner
    ones', and fusion groups the backward's kernels alike every second block (so the inner blocks
    have two patterns, each of them shared by every second block)."""
    launches_4, functions_4 = _program_functions(4)
    launches_6, functions_6 = _program_functions(6)
    assert launches_6 - launches_4 >= 2 * 10 and functions_6 == functions_4, (launches_4, functions_4, launches_6,
                                                                            functions_6)


@pytest.mark.device
def test_kernels_of_one_content_share_a_function_and_keep_their_own_arguments():
    runtime = get_runtime()
    reset_build_stats()
    built = build_kernels(runtime, [_kernel("g_5_0_pw_add", "g_0_pw_add", "add"),
                                    _kernel("g_5_1_pw_add", "g_1_pw_add", "add_1")])
    assert built["g_5_0_pw_add"].function_name == built["g_5_1_pw_add"].function_name == "g_0_pw_add"
    assert (build_stats().kernels_requested, build_stats().kernels_unique) == (2, 1)
    import numpy as np
    import pyopencl as cl

    buffers = [cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=np.array([v], np.float32)) for v in (1.0, 10.0)]
    for name, buffer in zip(built, buffers, strict=True):
        built[name].set_arg(0, buffer)
    for name in built:  # each kernel object launched with its own argument
        cl.enqueue_nd_range_kernel(runtime.queue, built[name], (1,), (1,))
    out = [np.empty(1, np.float32) for _ in buffers]
    for host, buffer in zip(out, buffers, strict=True):
        cl.enqueue_copy(runtime.queue, host, buffer)
    runtime.queue.finish()
    assert [float(o[0]) for o in out] == [2.0, 11.0]


@pytest.mark.device
def test_identical_kernels_of_a_graph_are_tuned_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_ADRENO_CACHE", str(tmp_path))  # no tuning cached yet

    def two_products(a, b, c, d):
        return a @ b, c @ d

    runtime = get_runtime()
    gm = capture_graphs(two_products, *(torch.randn(16, 16) for _ in range(4)))[0]
    graph = lower_graph(gm, Config(), "g", None)
    fused = fuse(graph, Config())
    program = render_program(fused, plan_memory(fused, runtime.profile), runtime.profile)
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    assert len(gemms) == 2 and gemms[0].content() == gemms[1].content()
    tuned: list[str] = []
    original = tuning._tune_one

    def counting(runtime, graph, key, candidates, built, advance):
        tuned.append(candidates[0].name)
        return original(runtime, graph, key, candidates, built, advance)

    monkeypatch.setattr(tuning, "_tune_one", counting)
    results = tuning.tune_kernels(runtime, graph, gemms, progress=False)
    assert tuned == [gemms[0].name]
    first, second = (results[k.name] for k in gemms)
    assert second.kernel == gemms[1].name and second.key == first.key
    assert second.chosen.name == gemms[1].name and second.chosen.origins == gemms[1].origins
    assert (second.chosen.build_options, second.chosen.local_size) == (first.chosen.build_options,
                                                                       first.chosen.local_size)


def _replayed_arena_functions(blocks: int, monkeypatch) -> tuple[int, int, int]:
    """``blocks`` blocks trained by a replayed ``TrainingStep`` (copy mode: parameters, optimizer
    state and the step's memory all in one heap slab, so every kernel is rebuilt for the arena),
    its losses eager's: the rebuilt launches, the distinct compiled kernels they replace, and the
    functions of the programs the replay built for them."""
    built: list[int] = []

    def counting(runtime, sources):  # the functions of each program the replay builds
        before = build_stats().kernels_unique
        kernels = build_kernels(runtime, sources)
        built.append(build_stats().kernels_unique - before)
        return kernels

    monkeypatch.setattr(replay_kernels, "build_kernels", counting)
    torch._dynamo.reset()
    model, reference = _stack(blocks), _stack(blocks)
    step = torch_adreno.TrainingStep(model, cross_entropy_loss,
                                     torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     options={"zero_copy": False, "compile_cache": False,
                                              "replay_arena_kernels": True})
    eager = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(6, 12, generator=generator), torch.randint(0, 5, (6,), generator=generator)
        torch.testing.assert_close(step(x, y), eager_training_step(reference, eager, x, y), rtol=1e-4, atol=1e-5)
    replay = step.replay
    assert step.replayed_steps == 2 and replay is not None and all(replay._bound.rewritten)
    compiled = {source.content() for _, source, _ in replay._launches}
    functions = {(kernel.program.int_ptr, kernel.function_name) for _, _, kernel in replay._launches}
    assert len(functions) == sum(built), (len(functions), built)  # each function built once
    launches = replay.kernel_launches
    step.close()  # (its deferred host copies made now, not by a later test's sync)
    return launches, len(compiled), len(functions)


@pytest.mark.device
def test_replayed_blocks_arena_kernels_are_as_many_functions_as_their_compiled_kernels(monkeypatch):
    """The replay's kernels take their operands' offsets as arguments: the kernels of repeated
    blocks rebuilt for the arena are one function each, as their compiled kernels are (43 launches,
    35 functions; with the offsets in the text, a function per launch)."""
    launches, compiled, functions = _replayed_arena_functions(3, monkeypatch)
    assert functions == compiled < launches, (launches, compiled, functions)


@pytest.mark.slow
@pytest.mark.device
def test_more_replayed_blocks_build_no_more_arena_functions(monkeypatch):
    """From four blocks on (the first, last and two alternating inner patterns: see
    :func:`test_training_programs_of_identical_blocks_have_a_constant_number_of_functions`) two
    more blocks add launches and not one function to the replay's programs."""
    four = _replayed_arena_functions(4, monkeypatch)
    six = _replayed_arena_functions(6, monkeypatch)
    assert six[0] - four[0] >= 2 * 8 and six[2] == four[2] == four[1], (four, six)


@pytest.mark.device
def test_placed_kernels_of_one_content_build_once_even_under_one_symbol():
    """:func:`build_placed`: a graph run twice in a step repeats its kernels under their symbols
    (one program holds a symbol once); a kernel of another content under a taken symbol goes into
    a second program; equal contents under other symbols join the first one's function."""
    first = _kernel("g_5_0_pw_add", "g_0_pw_add", "add")
    again = first  # the same graph's kernel, launched a second time
    other = _kernel("g_6_0_pw_add", "g_0_pw_add", "add", 2.0)  # another graph's, the same symbol
    block = _kernel("g_5_1_pw_add", "g_1_pw_add", "add_1")  # a repeated block's
    reset_build_stats()
    built = build_placed(get_runtime(), [first, again, other, block])
    assert [k.function_name for k in built] == ["g_0_pw_add", "g_0_pw_add", "g_0_pw_add", "g_0_pw_add"]
    programs = [k.program.int_ptr for k in built]
    assert programs[0] == programs[1] == programs[3] != programs[2]
    assert (build_stats().kernels_requested, build_stats().kernels_unique) == (3, 2)
